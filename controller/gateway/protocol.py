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

The answers are written by the protocol (the ASGI app never sees these requests) as the same JSON
error object the app sends, with ``Connection: close``.

Two things for speed, since on a loaded host a loopback ``write`` costs more than the proxy's Python:

- ``HeadCoalescer``: uvicorn writes a response's head on ``http.response.start`` and the body on the
  next ``send``: two syscalls (and two TCP segments) for every non-streaming answer. The head is held
  until the first body write or the end of the current loop iteration, whichever comes first, so a
  response that is ready goes out in one write and a stream's head is still sent at once.
- a disconnect hook: ``scope[DISCONNECT_HOOK]`` is a one-slot list; the app may put a callable in
  it, called when the client's connection is lost before the response completed. It replaces a
  watcher task per request that waited on ``receive()`` for ``http.disconnect``.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from collections.abc import Callable
from http import HTTPStatus
from typing import Any, ClassVar, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from controller.gateway.asgi import error_body

log = logging.getLogger(__name__)

# A one-slot list in each request's scope: the app may put a callable there, called when the client
# goes away before the response completed (see the module doc).
DISCONNECT_HOOK = "appliance.disconnect_hook"
DisconnectHook = list[Callable[[], None] | None]

# After answering a request the protocol refuses (408, 431), the connection stays half-open this long,
# reading and dropping what the client still sends: closing with unread data makes the kernel send a
# reset, which can destroy the answer before the client reads it (nginx's "lingering close").
_LINGER_S = 2.0

# File descriptors kept out of the client budget: the listening socket, logs, the key store
# (SQLite opens the file, its -wal and -shm: 3 per read), DNS, the admin client.
_FD_RESERVE = 64


def connection_budget(configured: int) -> int:
    """The most client connections this process can hold and still proxy every one of them: each
    may pair with an upstream connection, and ``_FD_RESERVE`` descriptors stay for the rest."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return configured
    return min(configured, max(8, (soft - _FD_RESERVE) // 2))


_ERROR_TYPES = {
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
    ) -> None:
        self.max_header_bytes = max_header_bytes
        self.header_timeout_s = header_timeout_s
        self.max_per_client = max_per_client
        self.max_total = max_total
        self.total = 0
        self.by_client: dict[str, int] = {}
        self.refused: dict[int, int] = {}  # status → count (tests, logs)

    def admit(self, client: str) -> bytes | None:
        """Count a new connection; the refusal to write instead if it is over a cap."""
        if self.total >= self.max_total:
            return self._refuse(503, f"the gateway holds its maximum of {self.max_total} connections")
        held = self.by_client.get(client, 0)
        if held >= self.max_per_client:
            return self._refuse(429, f"too many open connections from {client} (limit {self.max_per_client})")
        self.total += 1
        self.by_client[client] = held + 1
        return None

    def release(self, client: str) -> None:
        self.total -= 1
        left = self.by_client[client] - 1
        if left:
            self.by_client[client] = left
        else:
            del self.by_client[client]

    def _refuse(self, status: int, message: str) -> bytes:
        self.refused[status] = self.refused.get(status, 0) + 1
        return raw_response(status, message, b"retry-after: 1\r\n")


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with ``ConnectionGuard``'s limits (``guarded_protocol`` binds one)."""

    guard: ClassVar[ConnectionGuard]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._client_key: str | None = None  # set while counted in the guard
        self._awaiting_headers = True  # a request has begun (or may begin) and its headers are incomplete
        self._header_bytes = 0
        self._header_timer: asyncio.TimerHandle | None = None
        self._refused = False

    # -- connection ----------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        client = self.client[0] if self.client else "unknown"
        refusal = self.guard.admit(client)
        if refusal is not None:
            self._refused = True
            transport.write(refusal)
            transport.close()
            return
        self._client_key = client
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        if self._client_key is not None:
            self.guard.release(self._client_key)
            self._client_key = None
        cycle = self.cycle
        super().connection_lost(exc)
        if cycle is not None and not cycle.response_complete:
            hook = cast("DisconnectHook | None", cycle.scope.get(DISCONNECT_HOOK))
            if hook is not None and hook[0] is not None:
                hook[0]()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # answered and closing: nothing more is parsed
        if self._awaiting_headers:
            self._header_bytes += len(data)
        super().data_received(data)
        if self._refused or self.transport.is_closing():
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
        if not self._refused:
            self._awaiting_headers = True

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
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and cycle.scope is self.scope:
            cycle.transport = HeadCoalescer(self.transport, self.loop, cycle)  # type: ignore[assignment]

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if not self._refused:
            super().on_message_complete()

    # -- helpers -------------------------------------------------------------------------------

    def _in_request(self) -> bool:
        return (self.cycle is not None and not self.cycle.response_complete) or bool(self.pipeline)

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
        self.guard.refused[status] = self.guard.refused.get(status, 0) + 1
        if self.transport.is_closing():
            return
        if self._in_request():
            # Never write into a response that is still being sent on this connection.
            self.transport.close()
            return
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
        self._transport.write(self._take_head() + data)

    def flush(self) -> None:
        if self._cycle.transport is self:
            self._release()
            head = self._take_head()
            if head:
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
