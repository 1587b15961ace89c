"""The gateway's upstream HTTP/1.1 client: pooled keep-alive connections, the request written in one
``write``, the answer parsed by httptools (llhttp: the parser uvicorn serves the gateway's own clients
with), and the body handed over as it arrives. Nothing else is on the path.

Why not aiohttp here (it stays the client of the controller's admin calls, ``control.py``): the
gateway forwards every request of every client, and on the measured host aiohttp's client was where
most of the gateway's CPU per request went (``bench/README.md``: cProfile, 64 concurrent streams). Per
request it builds a ``ClientRequest`` and a ``ClientResponse``, a ``URL``, two multidicts of headers,
a task that writes the body, timer handles; per chunk its ``StreamReader`` wakes the reader through
``readany``/``_read_nowait`` and flow control. The proxy needs none of that: its request headers are
already bytes (uvicorn's), the response goes back byte for byte. What this module keeps from a client
library is what a proxy needs, and each piece is tested (``tests/unit/test_upstream_client.py``,
against real sockets):

- a pool per origin (scheme, host, port), most recently used first, idle connections dropped after
  ``keepalive_s`` (before vLLM's own 5 s: reusing a connection the server is closing fails), at most
  ``limit`` connections in use;
- connect timeout; idle read timeout (no byte for ``idle_timeout_s``, which also bounds the wait for
  the first token); a connection is pooled again only when its answer was read to the end and both
  sides keep it alive;
- a failure says what happened (``UpstreamFailure`` and its kinds, which are the gateway's metric
  labels). ``StaleConnection`` is a pooled connection the upstream closed before sending a byte of
  the answer. That is *not* proof that the request was never processed: the upstream may have read
  it, started work (a generation, billed to the key) and died or closed before answering. So a
  stale connection is retried on a fresh one only where a repeat is harmless (``may_retry``):
  idempotent methods (RFC 9110 §9.2.2: GET, HEAD, OPTIONS, TRACE, PUT, DELETE). A POST is retried
  only when the operator turned ``GatewayConfig.retry_stale_non_idempotent`` on (off by default;
  nginx stopped resending non-idempotent requests in 1.9.13 for the same reason), and every retry
  is counted (``appliance_gateway_upstream_retries_total``). The case that is provably safe, a
  pooled connection already seen closing before the write, never gets that far: ``_take_idle``
  skips it and the request goes out on another connection (not a retry: nothing was written);
- what is written is checked first (``field_check``): a header name that is not a token, or a value
  with CR, LF or NUL (the admin-set engine key included), is refused (``UnsafeField``) before a
  connection is even taken;
- the answer is read as RFC 9112 says, with llhttp's leniencies closed where they would change the
  meaning: 1xx interim answers (100, 103, ...) are skipped and the head starts again, the final
  answer is the one the request gets (a 101 is refused: the gateway never asks for an upgrade);
  trailer fields are never merged into the head's fields (RFC 9110 §6.5.2); a Transfer-Encoding
  other than one plain ``chunked`` is refused (llhttp takes ``gzip, chunked`` as chunked and
  ``gzip`` as read-to-close, which would pass coded bytes without their label); trailing
  whitespace of a value is not part of it; only an HTTP/1.1 answer keeps its connection alive (as
  h11: HTTP/1.0 keep-alive is not trusted). ``tests/unit/test_upstream_conformance.py`` holds the
  client to h11 on generated and hand-picked byte streams, and lists where it is stricter;
- bytes nobody asked for are never read as an answer: any byte after the end of the answer (an
  over-long body, a second answer) or on an idle pooled connection makes the connection unusable
  and it is closed, so they cannot become the next request's answer;
- bodies framed by Content-Length, by chunks (de-chunked here; uvicorn re-frames for the client, as
  with aiohttp) or by the end of the connection;
- back-pressure: reading from the upstream pauses while more than ``_HIGH_WATER`` bytes wait for a
  client that reads slowly;
- ``write_eof``: the half-close that tells vLLM the client is gone while the gateway still reads what
  the engine already sent (``proxy._last_usage``); ``request``'s ``on_cancel`` hook gets the
  connection when the caller is cancelled while the head is still awaited (the client left during
  the prefill), so that the caller can do the same before the connection is closed.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import ClassVar, cast
from urllib.parse import urlsplit

import httptools

from controller.gateway.field_check import UnsafeField, check_origin_part, check_request

Headers = list[tuple[bytes, bytes]]

# Bytes of answer held for a slow client before the upstream connection stops being read.
_HIGH_WATER = 1 << 20
_LOW_WATER = _HIGH_WATER // 4


class UpstreamFailure(Exception):
    """The exchange with the upstream failed; ``kind`` is the gateway's metric label."""

    kind: ClassVar[str] = "disconnect"


class ConnectRefused(UpstreamFailure):
    """Nothing accepts connections there (the engine is down): ``os_error`` says what the OS said."""

    kind = "connect"

    def __init__(self, os_error: OSError) -> None:
        super().__init__(str(os_error))
        self.os_error = os_error


class ConnectTimeout(UpstreamFailure):
    kind = "connect_timeout"


class StaleConnection(UpstreamFailure):
    """A pooled connection closed by the upstream before a byte of the answer came back."""

    kind = "disconnect"


class ReadTimeout(UpstreamFailure):
    kind = "read_timeout"


class BrokenResponse(UpstreamFailure):
    """The connection closed, or the answer could not be parsed, before the answer was complete."""

    kind = "broken_stream"


class RefusedRequest(UpstreamFailure):
    """The request itself could not be written as it is (``field_check``); nothing was sent."""

    kind = "refused_request"


# RFC 9110 §9.2.2: a repeat has the same effect as one request, so resending after a stale
# connection cannot duplicate work the upstream may already have started.
IDEMPOTENT_METHODS = frozenset({b"GET", b"HEAD", b"OPTIONS", b"TRACE", b"PUT", b"DELETE"})


def may_retry(method: bytes, retry_non_idempotent: bool) -> bool:
    """Whether a request that met a ``StaleConnection`` may be sent again on a fresh connection
    (see the module doc: the stale connection does not prove the upstream never got it)."""
    return retry_non_idempotent or method in IDEMPOTENT_METHODS


class _Stop(Exception):
    """Raised in a parser callback to stop llhttp at once; the state says why."""


@dataclass(frozen=True, slots=True)
class Origin:
    """Where an upstream URL points: what a pooled connection is keyed by."""

    host: str
    port: int
    tls: bool
    host_header: bytes
    prefix: bytes  # the URL's path, without a trailing slash: prepended to every request's target

    @classmethod
    def parse(cls, url: str) -> Origin:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        tls = parts.scheme == "https"
        port = parts.port or (443 if tls else 80)
        host_header = parts.netloc.rsplit("@", 1)[-1].encode("idna")
        prefix = parts.path.rstrip("/").encode("latin-1")
        try:  # written into every request: checked once here
            check_origin_part("the Host header", host_header)
            check_origin_part("the URL path", prefix)
        except UnsafeField as exc:
            raise ValueError(f"unusable upstream URL: {exc}") from None
        return cls(host=parts.hostname, port=port, tls=tls, host_header=host_header, prefix=prefix)


class UpstreamConnection(asyncio.Protocol):
    """One connection to an origin; while a request runs, also its answer (``status``, ``headers``,
    ``read``). Made and handed out by ``UpstreamPool.request``."""

    def __init__(self, pool: UpstreamPool, origin: Origin, loop: asyncio.AbstractEventLoop) -> None:
        self._pool = pool
        self.origin = origin
        self._loop = loop
        self._clock = pool.clock or loop.time
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.reused = False  # taken from the pool at least once
        self._idle_handle: asyncio.TimerHandle | None = None
        self._holds_slot = False
        # A request was written and its answer not yet handed back (release/close): only then are
        # bytes from the upstream an answer.
        self._in_use = False
        self._begin(head_only=False)

    # --- per request state -------------------------------------------------------------------
    def _begin(self, head_only: bool) -> None:
        self.status = 0
        self.headers: Headers = []
        self.content_type = b""
        self._head_only = head_only
        self._framed = False  # Content-Length or chunked: the end is known without a close
        self._got_bytes = False
        self._in_head = False  # between a message's start line and the end of its header section
        self._interim = False  # the message being parsed is a 1xx
        self._chunked_seen = False
        self._head_done = False
        self._keep_alive = False
        self._complete = False
        self._error: UpstreamFailure | None = None
        self._chunks: list[bytes] = []
        self._buffered = 0
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        self._last_data = 0.0
        self._timer: asyncio.TimerHandle | None = None

    # --- asyncio.Protocol --------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TCP transport is not an ``asyncio.Transport`` subclass; it has the same methods.
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if not self._in_use or self._complete:
            # Nobody asked: on an idle pooled connection, or after the end of the answer (a body
            # longer than its Content-Length, a second answer), these bytes would be read as the
            # next request's answer. The connection is done; an answer already read stays whole.
            self._keep_alive = False
            self._close_transport()
            return
        self._got_bytes = True
        self._last_data = self._clock()
        try:
            self._parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade, _Stop) as exc:
            # _Stop: a callback said why (``_fail``) or saw bytes after the answer. Otherwise llhttp
            # refused the bytes; after a complete answer they are trailing bytes, not the answer's.
            if self._complete:
                self._keep_alive = False
            else:
                self._fail(BrokenResponse(f"upstream sent an answer that is not HTTP/1.1: {exc}"))
            self._close_transport()

    def eof_received(self) -> bool | None:
        return None  # the transport closes; connection_lost settles the request

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._pool._forget_idle(self)
        if self._head_done and not self._complete and not self._framed and self._error is None:
            self._finish()  # a body delimited by the end of the connection (HTTP/1.0 style)
        elif not self._complete:
            reason = f": {exc}" if exc is not None else ""
            if self.reused and not self._got_bytes:
                self._fail(StaleConnection(f"the upstream closed a pooled connection{reason}"))
            else:
                self._fail(BrokenResponse(f"the upstream closed the connection mid-answer{reason}"))

    # --- httptools callbacks -----------------------------------------------------------------
    def on_message_begin(self) -> None:
        if self._complete:
            raise _Stop("a second answer to one request")  # data_received: the connection is done
        # A new message: after a 1xx the final answer's head starts from nothing (no 103 field
        # may end up among the 200's).
        self.headers = []
        self.content_type = b""
        self._framed = False
        self._chunked_seen = False
        self._in_head = True

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self._in_head:
            return  # a trailer field: never one of the head's (RFC 9110 §6.5.2), not forwarded
        if value[-1:] in (b" ", b"\t"):
            value = value.rstrip(b" \t")  # trailing whitespace is not part of the value (llhttp keeps it)
        lower = name.lower()
        if lower == b"content-type":
            self.content_type = value.lower()
        elif lower == b"content-length":
            self._framed = True
        elif lower == b"transfer-encoding":
            # llhttp reads "gzip, chunked" as chunked and "gzip" (or "chunked, gzip") as read-until-
            # close: the gateway would pass coded bytes on without their coding. One plain
            # "chunked" is all an upstream of ours sends; anything else is refused, as h11 does.
            if self._chunked_seen or value.lower() != b"chunked":
                self._fail(BrokenResponse("upstream sent a Transfer-Encoding other than one 'chunked'"))
                raise _Stop("transfer-encoding")
            self._chunked_seen = self._framed = True
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self._in_head = False
        status = self._parser.get_status_code()
        if status == 101:
            # The gateway never asks for an upgrade; what follows would not be HTTP at all.
            self._fail(BrokenResponse("upstream switched protocols (101) though none was asked for"))
            raise _Stop("101")
        if 100 <= status < 200:
            self._interim = True  # informational: the final answer follows (RFC 9110 §15.2)
            return
        self.status = status
        # Asked here, as uvicorn does: once the message is complete llhttp has reset its flags.
        # HTTP/1.0 keep-alive is not trusted (as h11): only an HTTP/1.1 answer keeps the connection.
        self._keep_alive = self._parser.should_keep_alive() and self._parser.get_http_version() == "1.1"
        self._head_done = True
        if self._head_only or status in (204, 304):
            self._framed = True
            self._finish()
        else:
            self._wake()

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > _HIGH_WATER and not self._paused and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False  # the end of a 1xx; the parser goes on with the next message
            return
        self._finish()

    # --- the request -------------------------------------------------------------------------
    def _send(
        self, method: bytes, target: bytes, headers: Headers, body: bytes, idle_timeout_s: float
    ) -> None:
        assert self._transport is not None
        self._begin(head_only=method == b"HEAD")
        self._in_use = True
        origin = self.origin
        parts = [method, b" ", origin.prefix, target, b" HTTP/1.1\r\nHost: ", origin.host_header, b"\r\n"]
        for name, value in headers:
            parts += (name, b": ", value, b"\r\n")
        if body or method in (b"POST", b"PUT", b"PATCH"):
            parts.append(b"Content-Length: %d\r\n" % len(body))
        parts += (b"\r\n", body)
        self._last_data = self._clock()
        self._timeout_s = idle_timeout_s
        self._timer = self._loop.call_later(idle_timeout_s, self._check_idle)
        self._transport.write(b"".join(parts))

    async def head(self) -> None:
        """Wait for the answer's status and headers (``UpstreamPool.request`` does; an ``on_cancel``
        hook may wait again after a half-close). Raises the connection's failure if it came first."""
        while not self._head_done and self._error is None:
            await self._wait()
        if self._error is not None and not self._head_done:
            raise self._error

    async def read(self) -> bytes:
        """What arrived since the last read (several upstream chunks joined); b"" at the end."""
        while not self._chunks:
            if self._complete:
                return b""
            if self._error is not None:
                raise self._error
            await self._wait()
        chunks = self._chunks
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self._chunks = []
        self._buffered = 0
        if self._paused and self._transport is not None:
            self._paused = False
            self._transport.resume_reading()
        return data

    @property
    def at_end(self) -> bool:
        """The answer is complete and every byte of it was read: the next ``read`` returns b""."""
        return self._complete and not self._chunks

    async def read_all(self) -> bytes:
        parts = []
        while chunk := await self.read():
            parts.append(chunk)
        return b"".join(parts)

    def release(self) -> None:
        """The answer was read to the end: keep the connection for the next request if both sides
        may; otherwise close it."""
        if self._complete and not self._chunks and self._error is None and not self.closed \
                and not self._head_only and self._keep_alive:
            self._stop_timer()
            self._pool._put_back(self)
        else:
            self.close()

    def close(self) -> None:
        """Drop the connection (an answer not read to the end is never pooled: closing it is also
        what tells vLLM to abort the generation)."""
        self._in_use = False
        self._stop_timer()
        self._close_transport()
        self._pool._done(self)

    def write_eof(self) -> bool:
        """Half-close: the upstream reads the end of its input (vLLM: the client is gone) and may
        still send. False when the transport cannot."""
        t = self._transport
        if t is None or t.is_closing() or not t.can_write_eof():
            return False
        t.write_eof()
        return True

    # --- internals ---------------------------------------------------------------------------
    async def _wait(self) -> None:
        waiter = self._loop.create_future()
        self._waiter = waiter
        try:
            await waiter
        finally:
            self._waiter = None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _finish(self) -> None:
        self._complete = True
        self._stop_timer()
        self._wake()

    def _fail(self, error: UpstreamFailure) -> None:
        if self._error is None and not self._complete:
            self._error = error
        self._stop_timer()
        self._wake()

    def _check_idle(self) -> None:
        # One timer per timeout period, not one per chunk: when it fires early (data came since it
        # was armed, or reading is paused for a slow client) it is armed again from the last byte.
        self._timer = None
        if self._complete or self._error is not None:
            return
        now = self._clock()
        due = self._last_data + self._timeout_s
        if self._paused or due > now:
            if self._paused:
                self._last_data = now
                due = now + self._timeout_s
            self._timer = self._loop.call_later(due - now, self._check_idle)
            return
        self._fail(ReadTimeout(f"the upstream sent nothing for {self._timeout_s:g} s"))
        self._close_transport()

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _close_transport(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()


CancelHook = Callable[[UpstreamConnection], Awaitable[None]]


class UpstreamPool:
    """Connections to upstreams, pooled per origin (see the module doc)."""

    def __init__(
        self,
        connect_timeout_s: float,
        idle_timeout_s: float,
        keepalive_s: float,
        limit: int,
        clock: Callable[[], float] | None = None,
    ) -> None:
        # ``clock``: what the idle read timeout measures silence with (the loop's clock unless a
        # test drives it: the timer then fires on the loop's time and re-checks against this one).
        self.clock = clock
        self.connect_timeout_s = connect_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.keepalive_s = keepalive_s
        self._slots = asyncio.Semaphore(limit)
        self._idle: dict[Origin, list[UpstreamConnection]] = {}
        self._origins: dict[str, Origin] = {}
        self._tls: ssl.SSLContext | None = None
        self._closed = False

    def origin(self, url: str) -> Origin:
        """``Origin.parse``, cached: the proxy calls this on every request with the same few URLs."""
        found = self._origins.get(url)
        if found is None:
            if len(self._origins) > 64:
                self._origins.clear()
            found = self._origins[url] = Origin.parse(url)
        return found

    @property
    def idle_count(self) -> int:
        return sum(len(conns) for conns in self._idle.values())

    async def request(
        self,
        origin: Origin,
        method: bytes,
        target: bytes,
        headers: Headers,
        body: bytes,
        on_cancel: CancelHook | None = None,
    ) -> UpstreamConnection:
        """Send a request and wait for the answer's status and headers. The caller reads the body
        and then calls ``release`` (read to the end) or ``close``; a failure here leaves nothing to
        clean up. ``RefusedRequest``: the request cannot be written as it is (nothing was sent).
        ``on_cancel``: awaited with the connection when the caller is cancelled after the request
        was written and before its head arrived (the connection is closed after it, never pooled),
        so that what the upstream still sends can be read; the hook bounds its own time."""
        try:
            check_request(method, target, headers)
        except UnsafeField as exc:
            raise RefusedRequest(str(exc)) from None
        await self._slots.acquire()
        conn: UpstreamConnection | None = None
        sent = False
        try:  # from here on the slot is ours: released by close/release, or below
            conn = self._take_idle(origin)
            if conn is None:
                conn = await self._connect(origin)
            conn._holds_slot = True
            conn._send(method, target, headers, body, self.idle_timeout_s)
            sent = True
            await conn.head()
        except BaseException as exc:
            if conn is not None:
                try:
                    if sent and on_cancel is not None and isinstance(exc, asyncio.CancelledError):
                        await on_cancel(conn)
                finally:
                    conn.close()
            else:
                self._slots.release()
            if isinstance(exc, StaleConnection):
                self._drop_idle(origin)  # the upstream restarted: its other idle connections are dead too
            raise
        return conn

    async def close(self) -> None:
        self._closed = True
        for conns in self._idle.values():
            for conn in conns:
                conn._close_transport()
        self._idle.clear()

    async def _connect(self, origin: Origin) -> UpstreamConnection:
        loop = asyncio.get_running_loop()
        tls: ssl.SSLContext | None = None
        if origin.tls:
            if self._tls is None:
                self._tls = ssl.create_default_context()
            tls = self._tls
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, conn = await loop.create_connection(
                    lambda: UpstreamConnection(self, origin, loop),
                    origin.host,
                    origin.port,
                    ssl=tls,
                    server_hostname=origin.host if tls is not None else None,
                )
        except TimeoutError:
            raise ConnectTimeout(
                f"connecting to {origin.host}:{origin.port} timed out after {self.connect_timeout_s:g} s"
            ) from None
        except OSError as exc:
            raise ConnectRefused(exc) from None
        return conn

    def _take_idle(self, origin: Origin) -> UpstreamConnection | None:
        conns = self._idle.get(origin)
        while conns:
            conn = conns.pop()  # most recently used: the least likely to be closing
            if conn._idle_handle is not None:
                conn._idle_handle.cancel()
                conn._idle_handle = None
            if not conn.closed and conn._transport is not None and not conn._transport.is_closing():
                conn.reused = True
                return conn
        return None

    def _put_back(self, conn: UpstreamConnection) -> None:
        conn._in_use = False
        self._done(conn)
        if self._closed:
            conn._close_transport()
            return
        self._idle.setdefault(conn.origin, []).append(conn)
        conn._idle_handle = conn._loop.call_later(self.keepalive_s, self._expire, conn)

    def _expire(self, conn: UpstreamConnection) -> None:
        conn._idle_handle = None
        self._forget_idle(conn)
        conn._close_transport()

    def _forget_idle(self, conn: UpstreamConnection) -> None:
        conns = self._idle.get(conn.origin)
        if conns and conn in conns:
            conns.remove(conn)
            if conn._idle_handle is not None:
                conn._idle_handle.cancel()
                conn._idle_handle = None

    def _drop_idle(self, origin: Origin) -> None:
        for conn in self._idle.pop(origin, []):
            if conn._idle_handle is not None:
                conn._idle_handle.cancel()
            conn._close_transport()

    def _done(self, conn: UpstreamConnection) -> None:
        if conn._holds_slot:
            conn._holds_slot = False
            self._slots.release()
