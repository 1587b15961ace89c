"""HTTP/1.1 connections: uvicorn's httptools protocol plus the limits a client meets before it has
shown a key (the gateway listens on 0.0.0.0).

uvicorn has none of them for httptools, so they live in a small subclass of its protocol:

- header size: llhttp sets no limit and uvicorn's ``h11_max_incomplete_event_size`` applies to the
  h11 protocol only (2–3× the CPU per request). Bytes are counted while a request's headers are
  incomplete, and the parsed request line + headers are measured when they end: over
  ``max_header_bytes`` → 431 and close. Memory held is at most one socket read past the limit.
- time to send headers: uvicorn arms ``timeout_keep_alive`` only after a response, so a connection
  that never completes a request was held forever. A timer runs from connecting (or from data after
  a response) until the headers end: past ``header_timeout_s`` → 408 and close. Idle keep-alive
  between requests stays uvicorn's timer.
- connections per client address and in all: counted at accept, before any byte is read. Over the
  cap → 429 (per client) / 503 (in all) and close. uvicorn's ``limit_concurrency`` is not used: it
  answers only once a request's headers arrived, so idle sockets still held file descriptors, and
  the descriptors the key store needs to be re-read are what ran out (see ``connection_budget``).
- the control listener: the controller's admin calls and scrapes have an address of their own
  (``GatewayConfig.control_listen``, 127.0.0.1), told apart by the address a connection was accepted
  on (``ConnectionGuard.listener_of``). Its connections are never counted against the client caps
  (they have their own, ``max_control_connections``: 503 over it), and carry only ``/admin/…``,
  ``/metrics`` and ``/healthz`` (anything else: 404 and close); while it exists, ``/admin/…`` on the
  client listener is 404 and close too. The controller calls the gateway from 127.0.0.1, and so does
  a reverse proxy on the host for every client it forwards: ~250 held requests through such a proxy
  filled the per-address cap and every ``PUT /admin/upstream`` got 429. A reserve of extra loopback
  connections on the one listener did not hold either: any loopback client could take the reserve
  by sending ``GET /healthz`` on it, or by sending nothing at all.
- request trailers (a chunked body's trailer section): never merged into the request's headers
  (uvicorn appends them to the header list the app reads, so a trailer could replace the
  ``Authorization`` the request was admitted with, and reach the upstream as a header). Their bytes
  count against ``max_header_bytes``: over → 431 and close.
- a lost connection: uvicorn marks only its newest request cycle disconnected, so a pipelined request
  that was running when the client left ran to its end. Every unfinished cycle of the connection is
  marked disconnected and its disconnect hook called (below), and the queued ones never start.

The answers are written by the protocol (the ASGI app never sees these requests) as the same JSON
error object the app sends, with ``Connection: close``.

Two things for speed, since on a loaded host a loopback ``write`` costs more than the proxy's Python:

- ``HeadCoalescer``: uvicorn writes a response's head on ``http.response.start`` and the body on the
  next ``send``: two syscalls (and two TCP segments) for every non-streaming answer. The head is held
  until the first body write or the end of the current loop iteration, whichever comes first, so a
  response that is ready goes out in one write and a stream's head is still sent at once.
- a disconnect hook: ``scope[DISCONNECT_HOOK]`` is a one-slot list; the app may put a callable in
  it, called when the client's connection is lost before the response completed. It replaces a
  watcher task per request that waited on ``receive()`` for ``http.disconnect``. A connection lost
  before the app put one there leaves ``CLIENT_GONE`` in the slot, so a late app still sees it.
"""

from __future__ import annotations

import asyncio
import enum
import ipaddress
import logging
import resource
from collections.abc import Callable, Mapping
from http import HTTPStatus
from typing import Any, ClassVar, cast

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from controller.gateway.asgi import error_body

log = logging.getLogger(__name__)

# A one-slot list in each request's scope: the app may put a callable there, called when the client
# goes away before the response completed (see the module doc).
DISCONNECT_HOOK = "appliance.disconnect_hook"
DisconnectHook = list[Callable[[], None] | None]
# ``scope[TRANSPORT_CLOSING]()``: is the client's connection closing? (``client_closed``)
TRANSPORT_CLOSING = "appliance.transport_closing"


def CLIENT_GONE() -> None:  # a sentinel, compared by identity
    """Left in a request's disconnect hook slot when its connection was lost before the app put a
    callable there."""


def client_closed(scope: Mapping[str, Any]) -> bool:
    """Has the client's connection of this request closed? uvloop raises ``RuntimeError`` on a
    write to a transport it closed (a reset) in the loop iteration before ``connection_lost`` runs;
    the app asks this to tell that from a bug."""
    probe = scope.get(TRANSPORT_CLOSING)
    return probe is not None and bool(probe())


# Paths the control listener serves (see the module doc).
_OBSERVER_PATHS = frozenset({b"/metrics", b"/healthz"})
_ADMIN_PREFIX = b"/admin/"


def is_admin_path(raw_path: bytes) -> bool:
    return raw_path == b"/admin" or raw_path.startswith(_ADMIN_PREFIX)


def is_control_path(raw_path: bytes) -> bool:
    return raw_path in _OBSERVER_PATHS or is_admin_path(raw_path)


class Listener(enum.Enum):
    CLIENT = "client"  # clients: the caps per address and in all
    CONTROL = "control"  # the controller and scrapers: its own cap, control and observer paths only


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])  # an IPv6 scope id is not part of it
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped  # a dual-stack socket reports IPv4 peers as ::ffff:a.b.c.d
    return address

# After answering a request the protocol refuses (408, 431), the connection stays half-open this long,
# reading and dropping what the client still sends: closing with unread data makes the kernel send a
# reset, which can destroy the answer before the client reads it (nginx's "lingering close").
_LINGER_S = 2.0

# File descriptors kept out of the client budget: the listening socket, logs, the key store
# (SQLite opens the file, its -wal and -shm: 3 per read), DNS, the admin client.
_FD_RESERVE = 64


def connection_budget(configured: int, control_connections: int = 0) -> int:
    """The most client connections this process can hold and still proxy every one of them: each
    may pair with an upstream connection, and ``_FD_RESERVE`` descriptors stay for the rest, plus
    one for each control listener connection (they never open an upstream connection)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return configured
    return min(configured, max(8, (soft - _FD_RESERVE - control_connections) // 2))


_ERROR_TYPES = {
    404: "not_found",
    408: "invalid_request_error",
    431: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable",
}


def raw_response(status: int, message: str, extra: bytes = b"") -> bytes:
    """A complete HTTP/1.1 error response that closes the connection."""
    body = error_body(message, _ERROR_TYPES[status], status)
    head = (
        b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
        b"connection: close\r\n%s\r\n"
    ) % (status, HTTPStatus(status).phrase.encode(), len(body), extra)
    return head + body


class ConnectionGuard:
    """The limits and the connection counts, shared by every connection of one server."""

    def __init__(
        self,
        max_header_bytes: int,
        header_timeout_s: float,
        max_per_client: int,
        max_total: int,
        max_control: int = 32,
    ) -> None:
        self.max_header_bytes = max_header_bytes
        self.header_timeout_s = header_timeout_s
        self.max_per_client = max_per_client
        self.max_total = max_total
        self.max_control = max_control
        # The control listener's bound (host, port)s, set once bound; none: there is no control
        # listener, and the client listener serves the admin surface too (a gateway run without one).
        self.control_endpoints: list[tuple[str, int]] = []
        self.total = 0
        self.control_open = 0
        self.by_client: dict[str, int] = {}
        self.refused: dict[int, int] = {}  # status → count (tests, logs)

    def listener_of(self, sockname: object) -> Listener:
        """Which listener accepted a connection whose local address is ``sockname``. Two listening
        sockets of one process cannot overlap (the second bind fails), so the local port plus the
        control address (or its wildcard) name exactly one of them."""
        if not self.control_endpoints or not isinstance(sockname, tuple | list) or len(sockname) < 2:
            return Listener.CLIENT
        local = _ip(str(sockname[0]))
        for host, port in self.control_endpoints:
            if sockname[1] != port:
                continue
            bound = _ip(host)
            if bound is not None and (bound.is_unspecified or bound == local):
                return Listener.CONTROL
        return Listener.CLIENT

    def over_cap(self, client: str) -> tuple[int, str] | None:
        """The status and message of the cap a new connection from ``client`` is over, if any."""
        if self.total >= self.max_total:
            return 503, f"the gateway holds its maximum of {self.max_total} connections"
        if self.by_client.get(client, 0) >= self.max_per_client:
            return 429, f"too many open connections from {client} (limit {self.max_per_client})"
        return None

    def admit(self, client: str, listener: Listener = Listener.CLIENT) -> bytes | None:
        """Count a new connection; the refusal to write instead if it is over its listener's cap."""
        if listener is Listener.CONTROL:
            if self.control_open >= self.max_control:
                return self._refuse(
                    503, f"the control listener holds its maximum of {self.max_control} connections"
                )
            self.control_open += 1
            return None
        over = self.over_cap(client)
        if over is not None:
            return self._refuse(*over)
        self.total += 1
        self.by_client[client] = self.by_client.get(client, 0) + 1
        return None

    def release(self, client: str, listener: Listener = Listener.CLIENT) -> None:
        if listener is Listener.CONTROL:
            self.control_open -= 1
            return
        self.total -= 1
        left = self.by_client[client] - 1
        if left:
            self.by_client[client] = left
        else:
            del self.by_client[client]

    def count_refusal(self, status: int) -> None:
        self.refused[status] = self.refused.get(status, 0) + 1

    def _refuse(self, status: int, message: str) -> bytes:
        self.count_refusal(status)
        return raw_response(status, message, b"retry-after: 1\r\n")


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with ``ConnectionGuard``'s limits (``guarded_protocol`` binds one)."""

    guard: ClassVar[ConnectionGuard]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._client_key: str | None = None  # set while counted in the guard
        self._listener = Listener.CLIENT
        self._awaiting_headers = True  # a request has begun (or may begin) and its headers are incomplete
        self._header_bytes = 0
        self._header_timer: asyncio.TimerHandle | None = None
        self._refused = False
        # Every request cycle of this connection whose response may not be complete: the running one
        # and the pipelined ones queued behind it (uvicorn's ``self.cycle`` is only the newest).
        self._cycles: list[Any] = []
        self._detached = False
        # A chunked body's trailer section: its parsed size, and the raw bytes of reads that carried
        # no body byte since the last one (a single trailer line is buffered whole by httptools
        # before ``on_header`` sees it, so its size is counted as it arrives).
        self._in_body = False
        self._messages = 0
        self._body_events = 0
        self._trailer_bytes = 0
        self._nonbody_bytes = 0
        # Body bytes parsed from the current read, handed to uvicorn once per read (``_hand_over_body``).
        self._body_parts: list[bytes] = []

    # -- connection ----------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        client = self.client[0] if self.client else "unknown"
        listener = self.guard.listener_of(transport.get_extra_info("sockname"))
        refusal = self.guard.admit(client, listener)
        if refusal is not None:
            self._refused = True
            transport.write(refusal)
            transport.close()
            return
        self._client_key = client
        self._listener = listener
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        if self._client_key is not None:
            self.guard.release(self._client_key, self._listener)
            self._client_key = None
        self._detach_cycles()
        super().connection_lost(exc)

    def eof_received(self) -> None:
        # uvicorn closes the connection at the client's EOF (nothing more can be answered on it):
        # its requests are gone now, not one loop iteration later at ``connection_lost``.
        self._detach_cycles()
        super().eof_received()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # answered and closing: nothing more is parsed
        if self._awaiting_headers:
            self._header_bytes += len(data)
        in_body = self._in_body
        messages = self._messages
        body_events = self._body_events
        super().data_received(data)
        self._hand_over_body()
        if self._refused or self.transport.is_closing():
            return
        if in_body and self._in_body and self._messages == messages and self._body_events == body_events:
            # A read inside one request's chunked body that carried no body byte: chunk framing or
            # its trailer section (legitimate framing is reset by the next body byte).
            self._nonbody_bytes += len(data)
            if self._nonbody_bytes > self.guard.max_header_bytes:
                self._refuse(431, f"request trailers larger than {self.guard.max_header_bytes} bytes")
                return
        if self._awaiting_headers and self._header_bytes > self.guard.max_header_bytes:
            self._refuse(431, f"request headers larger than {self.guard.max_header_bytes} bytes")
        elif (
            self._header_timer is None
            and self.timeout_keep_alive_task is None
            and (self._awaiting_headers or not self._in_request())
        ):
            # Part of a request's headers, or bytes between requests (which cancelled uvicorn's
            # keep-alive timer): either way the connection must not be held without a deadline.
            self._arm_header_timer()

    # -- parser callbacks ----------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.scope[DISCONNECT_HOOK] = [None]  # type: ignore[literal-required]
        self.scope[TRANSPORT_CLOSING] = self.transport.is_closing  # type: ignore[literal-required]
        self._messages += 1
        self._in_body = False
        self._trailer_bytes = 0
        self._nonbody_bytes = 0
        if not self._refused:
            self._awaiting_headers = True

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._awaiting_headers:
            super().on_header(name, value)
            return
        # A trailer: dropped, never appended to the headers the app read (see the module doc).
        self._trailer_bytes += len(name) + len(value) + 4
        if self._trailer_bytes > self.guard.max_header_bytes and not self._refused:
            self._refuse(431, f"request trailers larger than {self.guard.max_header_bytes} bytes")

    def on_headers_complete(self) -> None:
        if self._refused:
            return
        self._awaiting_headers = False
        self._header_bytes = 0
        self._cancel_header_timer()
        # Exact size of what was parsed (a request whose headers ended inside one large read).
        size = len(self.url)
        for name, value in self.headers:
            size += len(name) + len(value) + 4
        if size > self.guard.max_header_bytes:
            self._refuse(431, f"request headers larger than {self.guard.max_header_bytes} bytes")
            return
        misrouted = self._misrouted(httptools.parse_url(self.url).path)
        if misrouted is not None:
            self._refuse(404, misrouted)
            return
        super().on_headers_complete()
        self._in_body = True
        self._nonbody_bytes = 0
        cycle = self.cycle
        if cycle is not None and cycle.scope is self.scope:
            self._cycles = [c for c in self._cycles if not c.response_complete]
            self._cycles.append(cycle)
            cycle.transport = HeadCoalescer(self.transport, self.loop, cycle)  # type: ignore[assignment]

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            self._body_events += 1
            self._nonbody_bytes = 0
            # Not passed on one by one: uvicorn appends each piece to the request's body with
            # ``bytes +=`` (a copy of all it holds), so a read of 1-byte chunks (`1\r\nx\r\n` × 40 000
            # in 256 KiB) cost a quadratic copy and held the event loop ~100 ms per read.
            self._body_parts.append(body)

    def on_message_complete(self) -> None:
        self._in_body = False
        if not self._refused:
            self._hand_over_body()  # this message's bytes, before its end (and before the next one)
            super().on_message_complete()

    def _hand_over_body(self) -> None:
        """The body bytes parsed since the last call, to uvicorn's cycle in one piece."""
        parts = self._body_parts
        if parts:
            self._body_parts = []
            if not self._refused:
                super().on_body(parts[0] if len(parts) == 1 else b"".join(parts))

    # -- helpers -------------------------------------------------------------------------------

    def _misrouted(self, path: bytes) -> str | None:
        """Why this listener does not serve ``path`` (404 and close), or None (see the module doc)."""
        if self._listener is Listener.CONTROL:
            if not is_control_path(path):
                return "the control listener serves only /admin/, /metrics and /healthz"
        elif self.guard.control_endpoints and is_admin_path(path):
            return "the admin surface is served on the gateway's control listener only"
        return None

    def _in_request(self) -> bool:
        return (self.cycle is not None and not self.cycle.response_complete) or bool(self.pipeline)

    def _detach_cycles(self) -> None:
        """The client is gone (or is being refused): every unfinished request of this connection is
        told at once: ``receive`` answers ``http.disconnect``, ``send`` writes nothing, the disconnect
        hook runs (the proxy cancels the request), and queued pipelined requests never start."""
        if self._detached:
            return
        self._detached = True
        self.pipeline.clear()
        cycles = self._cycles
        if self.cycle is not None and self.cycle not in cycles:
            cycles.append(self.cycle)
        for cycle in cycles:
            if cycle.response_complete:
                continue
            cycle.disconnected = True
            cycle.message_event.set()
            hook = cast("DisconnectHook | None", cycle.scope.get(DISCONNECT_HOOK))
            if hook is not None:
                callback, hook[0] = hook[0], CLIENT_GONE
                if callback is not None and callback is not CLIENT_GONE:
                    callback()
        self._cycles = []

    def _arm_header_timer(self) -> None:
        self._header_timer = self.loop.call_later(self.guard.header_timeout_s, self._header_timeout)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timeout(self) -> None:
        self._header_timer = None
        if self._refused or self.transport.is_closing():
            return
        if self._in_request():
            return  # a response is running; pipelined bytes after it wait for it
        self._refuse(408, f"request headers not received within {self.guard.header_timeout_s:g} s")

    def _refuse(self, status: int, message: str) -> None:
        self._refused = True
        self._cancel_header_timer()
        self.guard.count_refusal(status)
        if self.transport.is_closing():
            return
        if self._in_request():
            started = any(c.response_started for c in (*self._cycles, self.cycle) if c is not None)
            self._detach_cycles()
            if started:
                # Never write into a response that is already being sent on this connection.
                self.transport.close()
                return
            # The request is still being read (its trailers are too large): it is detached above,
            # so nothing the app sends reaches the wire, and the refusal is the answer.
        self.transport.write(raw_response(status, message))
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self.loop.call_later(_LINGER_S, self.transport.close)
        else:
            self.transport.close()


class HeadCoalescer:
    """What one response's cycle writes to until its head has left: the head is held back to share a
    write with the first body bytes, then the cycle is handed the real transport again, so that a
    stream's chunks go straight to it (no extra call, no allocation per chunk)."""

    __slots__ = ("_cycle", "_head", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop, cycle: Any) -> None:
        self._transport = transport
        self._loop = loop
        self._cycle = cycle
        self._head: bytes | None = None

    def write(self, data: bytes) -> None:
        if self._head is None:
            self._head = data  # the first write: the head (or a 100 Continue)
            # Bounds the hold: the head leaves in this loop iteration at the latest.
            self._loop.call_soon(self.flush)
            return
        self._release()
        head = self._take_head()
        if not self._transport.is_closing():  # uvloop raises on a write to a closed transport
            self._transport.write(head + data)

    def flush(self) -> None:
        if self._cycle.transport is self:
            self._release()
            head = self._take_head()
            # The scheduled flush may run after the connection closed (uvloop raises on a write then).
            if head and not self._transport.is_closing():
                self._transport.write(head)

    def _take_head(self) -> bytes:
        head, self._head = self._head or b"", None
        return head

    def _release(self) -> None:
        self._cycle.transport = self._transport

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()


def guarded_protocol(guard: ConnectionGuard) -> type[GuardedHttpToolsProtocol]:
    """The protocol class uvicorn should instantiate, bound to ``guard`` (one per server)."""
    return type("BoundGuardedHttpToolsProtocol", (GuardedHttpToolsProtocol,), {"guard": guard})
