"""Is the engine's port free? Asked before every launch, and answered with who holds it.

A vLLM server orphaned by a killed shim kept port 8000; every relaunch then died with
`Address already in use` while the orphan answered the new launch's readiness probes. A launch now
proves the port free first, and says which process holds it when the kernel lets us know.
"""

from __future__ import annotations

import contextlib
import errno
import socket
from collections.abc import Callable

import psutil

from controller.runtime.base import EngineRuntimeError


class PortInUse(EngineRuntimeError):
    """The engine's port is taken: a relaunch cannot succeed until its holder is gone."""

    def __init__(self, host: str, port: int, holder: str | None) -> None:
        who = f"by {holder}" if holder else "by a process this user cannot see (another user's)"
        super().__init__(
            f"port {host}:{port} is already in use {who}: the engine would fail with "
            "'Address already in use'. Stop that process (by PID), or give the recipe another "
            "engine.port"
        )
        self.host = host
        self.port = port
        self.holder = holder


def port_is_free(host: str, port: int) -> bool:
    """Bind it the way the engine's server does (SO_REUSEADDR, so TIME_WAIT does not count)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host or "0.0.0.0", port))
        except OSError as exc:
            # Only "in use" is this check's business; a privileged port or an address that is not
            # local fails the engine with its own clear error.
            return exc.errno != errno.EADDRINUSE
    return True


def port_holder(port: int) -> str | None:
    """'pid N (cmdline)' of a process listening on `port`, when visible to this user."""
    try:
        conns = psutil.net_connections(kind="inet")
    except (psutil.AccessDenied, OSError):
        return None
    for conn in conns:
        if conn.status != psutil.CONN_LISTEN or not conn.laddr or conn.laddr.port != port:
            continue
        if conn.pid is None:
            continue
        cmdline = ""
        with contextlib.suppress(psutil.Error):
            cmdline = " ".join(psutil.Process(conn.pid).cmdline())[:160]
        return f"pid {conn.pid} ({cmdline})" if cmdline else f"pid {conn.pid}"
    return None


# The runtimes' seam for the check (host, port) -> None or PortInUse: unit tests with a fake daemon
# hand in their own, so they never ask the host about a port a running appliance may hold (8000).
PortCheck = Callable[[str, int], None]


def ensure_port_free(host: str, port: int) -> None:
    if not port_is_free(host, port):
        raise PortInUse(host, port, port_holder(port))
