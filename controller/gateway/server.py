"""Running the gateway: uvicorn with uvloop and httptools (guarded: ``protocol.py``), no access log,
no added headers, on the client listener and, when configured, the control listener (one server,
one app, both sockets: ``GatewayServer``)."""

from __future__ import annotations

import logging
import socket
import sys

import uvicorn

from controller.gateway.app import GatewayApp
from controller.gateway.config import GatewayConfig
from controller.gateway.protocol import ConnectionGuard, connection_budget, guarded_protocol
from controller.gateway.proxy import Tee

log = logging.getLogger(__name__)

_BACKLOG = 2048
# uvicorn's exit status when it cannot start (``uvicorn.server.STARTUP_FAILURE``, not exported).
_STARTUP_FAILURE = 3


def connection_guard(config: GatewayConfig) -> ConnectionGuard:
    control = config.max_control_connections if config.control_listen is not None else 0
    budget = connection_budget(config.max_connections, control)
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
        max_control=config.max_control_connections,
    )


def uvicorn_config(app: GatewayApp, config: GatewayConfig, guard: ConnectionGuard) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        loop="uvloop",
        http=guarded_protocol(guard),
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
        backlog=_BACKLOG,
        # Idle time between requests on a keep-alive connection; the time to send a request's
        # headers is the protocol's header timeout.
        timeout_keep_alive=config.keepalive_timeout_s,
        # SIGTERM: stop accepting, let streams finish for this long, then close.
        timeout_graceful_shutdown=int(config.graceful_shutdown_s),
    )


def listen_sockets(host: str, port: int) -> list[socket.socket]:
    """Listening sockets for ``host:port``, one per address the name resolves to (as asyncio's
    ``create_server`` binds them: ``localhost`` is 127.0.0.1 and ::1)."""
    sockets: list[socket.socket] = []
    seen: set[tuple[int, object]] = set()
    try:
        for family, _, _, _, address in socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        ):
            if (family, address) in seen:
                continue
            seen.add((family, address))
            sock = socket.create_server(address[:2], family=family, backlog=_BACKLOG)
            sock.setblocking(False)
            sockets.append(sock)
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


class GatewayServer(uvicorn.Server):
    """uvicorn's server on the gateway's listeners: the client one, then the control one (its bound
    addresses told to the guard, so a connection is known by the address it was accepted on)."""

    def __init__(self, config: uvicorn.Config, gateway: GatewayConfig, guard: ConnectionGuard) -> None:
        super().__init__(config)
        self.gateway = gateway
        self.guard = guard
        self.control_sockets: list[socket.socket] = []

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        if sockets is None:
            try:
                sockets = self._listen()
            except OSError as exc:  # before the app started: nothing to shut down
                log.error("the gateway cannot listen: %s", exc)
                sys.exit(_STARTUP_FAILURE)
        await super().startup(sockets)

    def _listen(self) -> list[socket.socket]:
        client = listen_sockets(self.gateway.host, self.gateway.port)
        for sock in client:
            log.info("gateway: clients on %s", _where(sock))
        if self.gateway.control_listen is None:
            return client
        try:
            control = listen_sockets(*self.gateway.control_listen)
        except OSError:
            for sock in client:
                sock.close()
            raise
        self.control_sockets = control
        self.guard.control_endpoints = [_endpoint(sock) for sock in control]
        for sock in control:
            log.info("gateway: control (/admin/, /metrics, /healthz) on %s", _where(sock))
        return client + control


def _endpoint(sock: socket.socket) -> tuple[str, int]:
    name = sock.getsockname()
    return str(name[0]), int(name[1])


def _where(sock: socket.socket) -> str:
    host, port = _endpoint(sock)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def build_server(
    config: GatewayConfig, tee: Tee | None = None, own_process: bool = False
) -> tuple[GatewayServer, GatewayApp]:
    """A server not yet started (tests ``await server.serve()`` in their own loop); ``own_process``
    when it is the process's only job (its collector is then tuned for it: ``gc_pauses``)."""
    app = GatewayApp(config, tee=tee, own_process=own_process)
    guard = connection_guard(config)
    return GatewayServer(uvicorn_config(app, config, guard), config, guard), app


def run(config: GatewayConfig) -> None:
    """Serve until SIGINT/SIGTERM (blocking)."""
    server, _ = build_server(config, own_process=True)
    server.run()
