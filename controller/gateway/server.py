"""Running the gateway: uvicorn with uvloop and httptools, no access log, no added headers."""

from __future__ import annotations

import uvicorn

from controller.gateway.app import GatewayApp
from controller.gateway.config import GatewayConfig
from controller.gateway.proxy import Tee


def uvicorn_config(app: GatewayApp, config: GatewayConfig) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        loop="uvloop",
        http="httptools",
        ws="none",
        lifespan="on",
        # An access log line per request costs more than the whole proxy hop; metrics count instead.
        access_log=False,
        log_level=config.log_level,
        # The upstream's Server/Date headers pass through; do not add a second pair.
        server_header=False,
        date_header=False,
        # No X-Forwarded-* rewriting middleware: the gateway is the edge, and it costs per request.
        proxy_headers=False,
        backlog=2048,
        # SIGTERM: stop accepting, let streams finish for this long, then close.
        timeout_graceful_shutdown=int(config.graceful_shutdown_s),
    )


def build_server(config: GatewayConfig, tee: Tee | None = None) -> tuple[uvicorn.Server, GatewayApp]:
    """A server not yet started (tests ``await server.serve()`` in their own loop)."""
    app = GatewayApp(config, tee=tee)
    return uvicorn.Server(uvicorn_config(app, config)), app


def run(config: GatewayConfig) -> None:
    """Serve until SIGINT/SIGTERM (blocking)."""
    server, _ = build_server(config)
    server.run()
