"""Running the gateway: uvicorn with uvloop and httptools (guarded: ``protocol.py``), no access log,
no added headers."""

from __future__ import annotations

import logging

import uvicorn

from controller.gateway.app import GatewayApp
from controller.gateway.config import GatewayConfig
from controller.gateway.protocol import ConnectionGuard, connection_budget, guarded_protocol
from controller.gateway.proxy import Tee

log = logging.getLogger(__name__)


def connection_guard(config: GatewayConfig) -> ConnectionGuard:
    budget = connection_budget(config.max_connections, config.control_reserve_connections)
    if budget < config.max_connections:
        log.warning(
            "the file descriptor limit allows %d client connections (configured %d): raise "
            "`ulimit -n` to hold more",
            budget,
            config.max_connections,
        )
    return ConnectionGuard(
        max_header_bytes=config.max_header_bytes,
        header_timeout_s=config.header_timeout_s,
        max_per_client=config.max_connections_per_client,
        max_total=budget,
        control_reserve=config.control_reserve_connections,
    )


def uvicorn_config(app: GatewayApp, config: GatewayConfig) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        loop="uvloop",
        http=guarded_protocol(connection_guard(config)),
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
        # Idle time between requests on a keep-alive connection; the time to send a request's
        # headers is the protocol's header timeout.
        timeout_keep_alive=config.keepalive_timeout_s,
        # SIGTERM: stop accepting, let streams finish for this long, then close.
        timeout_graceful_shutdown=int(config.graceful_shutdown_s),
    )


def build_server(
    config: GatewayConfig, tee: Tee | None = None, own_process: bool = False
) -> tuple[uvicorn.Server, GatewayApp]:
    """A server not yet started (tests ``await server.serve()`` in their own loop); ``own_process``
    when it is the process's only job (its collector is then tuned for it: ``gc_pauses``)."""
    app = GatewayApp(config, tee=tee, own_process=own_process)
    return uvicorn.Server(uvicorn_config(app, config)), app


def run(config: GatewayConfig) -> None:
    """Serve until SIGINT/SIGTERM (blocking)."""
    server, _ = build_server(config, own_process=True)
    server.run()
