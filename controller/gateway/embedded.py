"""Run a gateway inside the current event loop (tests, and tools that need one briefly).

Production runs the gateway as its own process (``appliance gateway``); this serves the same app
on a real socket with the same uvicorn settings, so a test exercises the real HTTP path.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from controller.gateway.app import GatewayApp
from controller.gateway.config import GatewayConfig
from controller.gateway.protocol import ConnectionGuard
from controller.gateway.proxy import Tee
from controller.gateway.server import build_server


@dataclass(frozen=True)
class RunningGateway:
    url: str  # the client listener
    app: GatewayApp
    guard: ConnectionGuard  # the connection limits and counts of this server
    control_url: str | None = None  # the control listener, if configured


@asynccontextmanager
async def serve_in_loop(config: GatewayConfig, tee: Tee | None = None) -> AsyncIterator[RunningGateway]:
    """Serve ``config`` (port 0 picks a free port) until the block exits."""
    server, app = build_server(config, tee)
    task = asyncio.create_task(server.serve())
    try:
        for _ in range(500):  # bounded: 5 s
            if server.started or task.done():
                break
            await asyncio.sleep(0.01)
        if not server.started:
            if task.done():
                task.result()  # raise the start-up error
            raise RuntimeError("gateway did not start within 5 s")
        port = server.servers[0].sockets[0].getsockname()[1]
        control_url = None
        if server.control_sockets:
            host, control_port = server.control_sockets[0].getsockname()[:2]
            control_url = f"http://{host}:{control_port}"
        yield RunningGateway(
            url=f"http://{config.host}:{port}", app=app, guard=server.guard, control_url=control_url
        )
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, timeout=config.graceful_shutdown_s + 5)
