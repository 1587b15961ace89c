"""The gateway's upstream client (``controller/gateway/upstream_client.py``) against real loopback
sockets: each test's server is a few lines of asyncio that answer exactly the bytes under test."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import subprocess
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator, MutableMapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import uvloop

from controller.gateway.app import GatewayApp
from controller.gateway.config import GatewayConfig
from controller.gateway.keystore import KeyStore
from controller.gateway.upstream_client import (
    BrokenResponse,
    ConnectRefused,
    ConnectTimeout,
    Origin,
    ReadTimeout,
    RefusedRequest,
    StaleConnection,
    UpstreamConnection,
    UpstreamPool,
    may_retry,
)


def both_loops(case: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[str], None]:
    """A test run once on asyncio's loop and once on uvloop: the gateway runs on uvloop, whose
    transports differ (they are not ``asyncio.Transport`` subclasses)."""

    @pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
    def test(loop: str) -> None:
        (uvloop.run if loop == "uvloop" else asyncio.run)(case())

    test.__name__ = test.__qualname__ = case.__name__
    test.__doc__ = case.__doc__
    return test



R = asyncio.StreamReader
W = asyncio.StreamWriter


class Server:
    def __init__(self) -> None:
        self.connections = 0
        self.requests: list[bytes] = []
        self.eof_seen = asyncio.Event()
        self.url = ""


@asynccontextmanager
async def serve(handler: Callable[[Server, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
                ) -> AsyncIterator[Server]:
    state = Server()

    async def on_connect(reader: R, writer: W) -> None:
        state.connections += 1
        try:
            await handler(state, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    state.url = f"http://127.0.0.1:{port}"
    try:
        yield state
    finally:
        server.close()


async def read_request(state: Server, reader: asyncio.StreamReader) -> bytes | None:
    """One request (head + Content-Length body); None at EOF."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        state.eof_seen.set()
        return None
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    body = await reader.readexactly(length) if length else b""
    state.requests.append(head + body)
    return head + body


def ok(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s" % (
        len(body), extra, body)


async def keep_answering(state: Server, reader: R, writer: W) -> None:
    while (req := await read_request(state, reader)) is not None:
        writer.write(ok(b'{"n":%d}' % len(state.requests)))
        await writer.drain()
        del req


def pool(clock: Callable[[], float] | None = None, **kw: float) -> UpstreamPool:
    a: dict[str, float] = {"connect_timeout_s": 2.0, "idle_timeout_s": 5.0, "keepalive_s": 4.0, "limit": 16}
    a.update(kw)
    return UpstreamPool(
        a["connect_timeout_s"], a["idle_timeout_s"], a["keepalive_s"], int(a["limit"]), clock=clock
    )


class FakeClock:
    """A clock the test moves: what the idle timeout measures silence with."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@both_loops
async def test_the_request_is_written_as_given_and_keep_alive_reuses_one_connection() -> None:
    async with serve(keep_answering) as srv:
        p = pool()
        origin = p.origin(srv.url + "/prefix/")
        headers = [(b"content-type", b"application/json"), (b"x-request-id", b"abc")]
        for i in (1, 2, 3):
            resp = await p.request(origin, b"POST", b"/v1/chat?x=1", headers, b'{"a":1}')
            assert resp.status == 200
            assert (b"Content-Type", b"application/json") in resp.headers
            assert resp.content_type == b"application/json"
            assert await resp.read_all() == b'{"n":%d}' % i
            resp.release()
            assert p.idle_count == 1
        get = await p.request(origin, b"GET", b"/v1/models", [], b"")
        assert await get.read_all() == b'{"n":4}'
        get.release()
        await p.close()
    assert srv.connections == 1
    host = srv.url.split("://")[1].encode()
    assert srv.requests[0] == (
        b"POST /prefix/v1/chat?x=1 HTTP/1.1\r\nHost: " + host + b"\r\ncontent-type: application/json\r\n"
        b"x-request-id: abc\r\nContent-Length: 7\r\n\r\n{\"a\":1}"
    )
    assert srv.requests[3] == b"GET /prefix/v1/models HTTP/1.1\r\nHost: " + host + b"\r\n\r\n"


@both_loops
async def test_chunked_and_close_delimited_bodies_come_back_whole() -> None:
    async def chunked(state: Server, reader: R, writer: W) -> None:
        await read_request(state, reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")
        for event in (b"data: 1\n\n", b"data: 2\n\n", b"data: [DONE]\n\n"):
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            await writer.drain()
            await asyncio.sleep(0.01)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        await read_request(state, reader)  # keep the connection until the client closes it

    async with serve(chunked) as srv:
        p = pool()
        resp = await p.request(p.origin(srv.url), b"POST", b"/", [], b"{}")
        assert resp.content_type.startswith(b"text/event-stream")
        got = []
        assert not resp.at_end
        while chunk := await resp.read():
            got.append(chunk)
        assert resp.at_end
        assert b"".join(got) == b"data: 1\n\ndata: 2\n\ndata: [DONE]\n\n"
        assert len(got) >= 2  # handed over as they came, not buffered to the end
        resp.release()
        assert p.idle_count == 1
        await p.close()

    async def close_delimited(state: Server, reader: R, writer: W) -> None:
        await read_request(state, reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\nuntil the end")
        await writer.drain()

    async with serve(close_delimited) as srv:
        p = pool()
        resp = await p.request(p.origin(srv.url), b"GET", b"/", [], b"")
        assert await resp.read_all() == b"until the end"
        resp.release()
        assert p.idle_count == 0  # Connection: close is not pooled
        await p.close()


@both_loops
async def test_an_answer_that_asks_to_close_or_is_http_1_0_is_never_pooled() -> None:
    """`Connection: close` on an HTTP/1.1 answer, or an HTTP/1.0 answer even with `Connection:
    keep-alive`: both framed by Content-Length, and the upstream keeps the socket open — the client
    must not keep the connection for another request either way (RFC 9112 §9.3; the client speaks
    HTTP/1.1 and reuses only HTTP/1.1 connections). A mutant that took either condition alone pooled one."""
    heads = [b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok",
             b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok"]

    for answer in heads:
        async def keeps_open(state: Server, reader: R, writer: W, answer: bytes = answer) -> None:
            while await read_request(state, reader) is not None:
                writer.write(answer)
                await writer.drain()

        async with serve(keeps_open) as srv:
            p = pool()
            for _ in range(2):
                resp = await p.request(p.origin(srv.url), b"GET", b"/", [], b"")
                assert (resp.status, await resp.read_all()) == (200, b"ok")
                resp.release()
                assert p.idle_count == 0, answer
            await p.close()
        assert srv.connections == 2, answer  # a new connection for the second request


def _self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 (IP SAN) and its key, made by the openssl CLI."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key


@asynccontextmanager
async def serve_tls(cert: Path, key: Path) -> AsyncIterator[str]:
    """An HTTPS upstream answering every request with ok(b"tls")."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    state = Server()

    async def on_connect(reader: R, writer: W) -> None:
        try:
            while await read_request(state, reader) is not None:
                writer.write(ok(b"tls"))
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0, ssl=ctx)
    try:
        yield f"https://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()


@both_loops
async def test_an_https_upstream_is_spoken_to_over_tls_and_its_certificate_is_checked() -> None:
    """An https origin: TLS with the host's name checked against the certificate. A certificate the
    context trusts answers; the default context (the system's CAs) refuses a self-signed one as a
    connect failure saying why — never plain HTTP to a TLS port, never an unchecked peer."""
    with tempfile.TemporaryDirectory() as tmp:
        cert, key = _self_signed(Path(tmp))
        async with serve_tls(cert, key) as url:
            p = pool()
            with pytest.raises(ConnectRefused, match=r"CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
                await p.request(p.origin(url), b"GET", b"/", [], b"")
            await p.close()
            trusting = pool()
            trusting._tls = ssl.create_default_context(cafile=str(cert))  # what an operator's CA would be
            resp = await trusting.request(trusting.origin(url), b"GET", b"/", [], b"")
            assert (resp.status, await resp.read_all()) == (200, b"tls")
            resp.release()
            await trusting.close()


@both_loops
async def test_closing_an_answer_twice_frees_its_slot_once() -> None:
    """The pool's connection limit: a connection closed twice gives its slot back once, or the limit
    grows by one each time (a mutant that left the slot marked held did)."""
    async with serve(keep_answering) as srv:
        p = pool(limit=1)
        origin = p.origin(srv.url)
        first = await p.request(origin, b"GET", b"/", [], b"")
        first.close()
        first.close()
        held = await p.request(origin, b"GET", b"/", [], b"")
        waiting = asyncio.create_task(p.request(origin, b"GET", b"/", [], b""))
        await asyncio.sleep(0.05)
        assert not waiting.done()  # the one slot is held: the limit is still 1
        held.close()
        resp = await asyncio.wait_for(waiting, 2.0)
        resp.close()
        await p.close()


@both_loops
async def test_the_head_stays_read_after_the_body_fails() -> None:
    """An answer whose body is cut after its head: reading the body fails, but the head that came
    is still the answer's (an ``on_cancel`` hook may wait for the head again after a half-close)."""
    async def cut(state: Server, reader: R, writer: W) -> None:
        await read_request(state, reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
        await writer.drain()

    async with serve(cut) as srv:
        p = pool()
        resp = await p.request(p.origin(srv.url), b"GET", b"/", [], b"")
        with pytest.raises(BrokenResponse):
            await resp.read_all()
        await resp.head()  # no raise: the head had come
        assert resp.status == 200
        resp.close()
        await p.close()


@both_loops
async def test_a_transfer_coding_other_than_chunked_is_refused_saying_so() -> None:
    # (the last: "chunked" twice, as two field lines — the second one is refused)
    for coding in (b"gzip", b"gzip, chunked", b"chunked, gzip", b"chunked\r\nTransfer-Encoding: chunked"):
        async def coded(state: Server, reader: R, writer: W, coding: bytes = coding) -> None:
            await read_request(state, reader)
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: %s\r\n\r\n5\r\nhello\r\n0\r\n\r\n" % coding)
            await writer.drain()

        async with serve(coded) as srv:
            p = pool()
            with pytest.raises(BrokenResponse,
                               match=r"^upstream sent a Transfer-Encoding other than one 'chunked'$"):
                await p.request(p.origin(srv.url), b"GET", b"/", [], b"")
            assert p.idle_count == 0
            await p.close()


@both_loops
async def test_a_fresh_connection_closed_without_an_answer_is_broken_not_stale() -> None:
    """Only a connection taken from the pool can be stale (closed by the upstream while idle); a fresh
    one the upstream closes after reading the request is a broken answer — it had the request — so a
    POST is never retried on it (a mutant that marked every connection reused made it stale)."""
    async def read_then_close(state: Server, reader: R, writer: W) -> None:
        await read_request(state, reader)

    async with serve(read_then_close) as srv:
        p = pool()
        with pytest.raises(BrokenResponse, match="closed the connection mid-answer"):
            await p.request(p.origin(srv.url), b"POST", b"/v1/completions", [], b"{}")
        await p.close()
    assert srv.connections == 1 and len(srv.requests) == 1  # sent once, never again


@both_loops
async def test_a_pooled_connection_whose_transport_is_closing_is_not_taken_again() -> None:
    """A pooled connection whose transport is already closing (its `connection_lost` not delivered
    yet) is never handed out: a POST on it would be lost as a stale connection, which a POST is not
    retried after. The next request gets a fresh connection and its answer."""
    async with serve(keep_answering) as srv:
        p = pool()
        origin = p.origin(srv.url)
        first = await p.request(origin, b"GET", b"/", [], b"")
        await first.read_all()
        first.release()
        assert p.idle_count == 1
        idle = p._idle[origin][0]
        assert idle._transport is not None
        idle._transport.close()  # closing now; connection_lost comes on a later turn of the loop
        resp = await p.request(origin, b"POST", b"/", [], b"{}")
        assert (resp.status, await resp.read_all()) == (200, b'{"n":2}')
        resp.release()
        await p.close()
    assert srv.connections == 2


@both_loops
async def test_a_stale_connection_says_so_in_words() -> None:
    """A pooled connection the upstream closed cleanly (EOF, no error from the OS): the words an
    operator reads in the gateway's log are exactly these, with no reason appended."""
    async def once_then_eof(state: Server, reader: R, writer: W) -> None:
        await read_request(state, reader)
        writer.write(ok(b"first"))
        await writer.drain()
        await read_request(state, reader)  # the next request arrives: end the connection, no answer

    async with serve(once_then_eof) as srv:
        p = pool()
        origin = p.origin(srv.url)
        resp = await p.request(origin, b"GET", b"/", [], b"")
        assert await resp.read_all() == b"first"
        resp.release()
        with pytest.raises(StaleConnection, match=r"^the upstream closed a pooled connection$"):
            await p.request(origin, b"GET", b"/", [], b"")
        await p.close()


@contextlib.contextmanager
def _silent_listener() -> Iterator[int]:
    """A port whose SYNs go unanswered: a listener with a zero backlog whose accept queue is filled
    (Linux drops further SYNs then), so a connect neither succeeds nor is refused — it times out."""
    server = socket.socket()
    fillers: list[socket.socket] = []
    try:
        server.bind(("127.0.0.1", 0))
        server.listen(0)
        port = server.getsockname()[1]
        for _ in range(4):
            c = socket.socket()
            c.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                c.connect(("127.0.0.1", port))
            fillers.append(c)
        probe = socket.socket()
        probe.settimeout(0.2)
        try:
            probe.connect(("127.0.0.1", port))
            pytest.skip("this kernel answered a SYN to a full accept queue: no silent port to test with")
        except TimeoutError:
            pass
        finally:
            probe.close()
        yield port
    finally:
        for c in fillers:
            c.close()
        server.close()


def test_a_connect_that_never_completes_times_out_saying_where_and_after_how_long() -> None:
    with _silent_listener() as port:
        async def case() -> None:
            p = pool(connect_timeout_s=0.3)
            words = rf"^connecting to 127\.0\.0\.1:{port} timed out after 0\.3 s$"
            with pytest.raises(ConnectTimeout, match=words):
                await p.request(p.origin(f"http://127.0.0.1:{port}"), b"GET", b"/", [], b"")
            await p.close()

        asyncio.run(case())
        uvloop.run(case())


@both_loops
async def test_head_and_204_need_no_body() -> None:
    async def answer(state: Server, reader: R, writer: W) -> None:
        while (req := await read_request(state, reader)) is not None:
            if req.startswith(b"HEAD "):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1234\r\n\r\n")
            else:
                writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")

    async with serve(answer) as srv:
        p = pool(idle_timeout_s=2.0)
        head = await p.request(p.origin(srv.url), b"HEAD", b"/", [], b"")
        assert (head.status, await head.read_all()) == (200, b"")
        head.release()
        assert p.idle_count == 0  # after a HEAD the parser's view of the stream is not trusted
        empty = await p.request(p.origin(srv.url), b"DELETE", b"/", [], b"")
        assert (empty.status, await empty.read_all()) == (204, b"")
        await p.close()


@both_loops
async def test_a_pooled_connection_closed_by_the_upstream_is_stale_and_the_pool_forgets_its_peers() -> None:
    async def once_then_close(state: Server, reader: R, writer: W) -> None:
        await read_request(state, reader)
        writer.write(ok(b"first"))
        await writer.drain()
        await read_request(state, reader)  # the next request arrives: close without answering
        writer.transport.abort()

    async with serve(once_then_close) as srv:
        p = pool()
        origin = p.origin(srv.url)
        resp = await p.request(origin, b"GET", b"/", [], b"")
        assert await resp.read_all() == b"first"
        resp.release()
        with pytest.raises(StaleConnection):
            await p.request(origin, b"GET", b"/", [], b"")
        assert p.idle_count == 0
        fresh = await p.request(origin, b"GET", b"/", [], b"")  # a new connection answers again
        assert await fresh.read_all() == b"first"
        fresh.release()
        await p.close()
    assert srv.connections == 2


@both_loops
async def test_a_pooled_connection_closed_after_part_of_an_answer_is_broken_not_stale() -> None:
    # Bytes of the answer came back: the upstream had the request, so this is not the stale case
    # (which a retry may repeat) but a broken answer.
    async def once_then_cut(state: Server, reader: R, writer: W) -> None:
        await read_request(state, reader)
        writer.write(ok(b"first"))
        await writer.drain()
        await read_request(state, reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-")  # part of the head, then the connection goes
        await writer.drain()
        writer.transport.abort()

    async with serve(once_then_cut) as srv:
        p = pool()
        origin = p.origin(srv.url)
        resp = await p.request(origin, b"GET", b"/", [], b"")
        assert await resp.read_all() == b"first"
        resp.release()
        with pytest.raises(BrokenResponse, match="mid-answer"):
            await p.request(origin, b"GET", b"/", [], b"")
        await p.close()
    assert srv.connections == 1


@both_loops
async def test_a_stale_connection_drops_its_idle_peers_that_are_still_open() -> None:
    """The upstream restarted: every idle connection to it is dead, though the peers' closes may not
    have arrived yet. Here they never do (the server keeps them open): only the drop removes them."""
    async def answer_then_close_on_the_next(state: Server, reader: R, writer: W) -> None:
        await read_request(state, reader)
        writer.write(ok(b"x"))
        await writer.drain()
        if await read_request(state, reader) is not None:
            writer.transport.abort()

    async with serve(answer_then_close_on_the_next) as srv:
        p = pool()
        origin = p.origin(srv.url)
        first, second = await asyncio.gather(*(p.request(origin, b"GET", b"/", [], b"") for _ in "ab"))
        for resp in (first, second):
            assert await resp.read_all() == b"x"
            resp.release()
        assert p.idle_count == 2
        with pytest.raises(StaleConnection):
            await p.request(origin, b"GET", b"/", [], b"")
        assert p.idle_count == 0
        await p.close()
    assert srv.connections == 2


@both_loops
async def test_an_idle_connection_the_upstream_closes_leaves_the_pool() -> None:
    async def answer_then_hang_up(state: Server, reader: R, writer: W) -> None:
        await read_request(state, reader)
        writer.write(ok(b"x"))
        await writer.drain()

    async with serve(answer_then_hang_up) as srv:
        p = pool()
        resp = await p.request(p.origin(srv.url), b"GET", b"/", [], b"")
        await resp.read_all()
        resp.release()
        for _ in range(100):
            if p.idle_count == 0:
                break
            await asyncio.sleep(0.01)
        assert p.idle_count == 0
        await p.close()


@both_loops
async def test_idle_connections_expire_after_keepalive() -> None:
    async with serve(keep_answering) as srv:
        p = pool(keepalive_s=0.05)
        resp = await p.request(p.origin(srv.url), b"GET", b"/", [], b"")
        await resp.read_all()
        resp.release()
        assert p.idle_count == 1
        await asyncio.wait_for(srv.eof_seen.wait(), 2.0)  # the pool closed it, the server saw the end
        assert p.idle_count == 0
        await p.close()


@both_loops
async def test_nothing_listening_is_connect_refused() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connections are refused
        p = pool()
        with pytest.raises(ConnectRefused) as info:
            await p.request(p.origin(f"http://127.0.0.1:{port}"), b"GET", b"/", [], b"")
        assert isinstance(info.value.os_error, OSError)
        assert str(info.value) == str(info.value.os_error)  # what the OS said is the message
        await p.close()


@both_loops
async def test_silence_is_a_read_timeout_before_the_head_and_mid_body() -> None:
    async def silent(state: Server, reader: R, writer: W) -> None:
        await read_request(state, reader)
        await asyncio.sleep(5)

    async with serve(silent) as srv:
        p = pool(idle_timeout_s=0.2)
        with pytest.raises(ReadTimeout) as info:
            await p.request(p.origin(srv.url), b"GET", b"/", [], b"")
        assert str(info.value) == "the upstream sent nothing for 0.2 s"
        await p.close()

    # Mid-body: the clock the timeout measures silence with is the test's, so "a byte comes more often
    # than the timeout" holds however the machine schedules the two sides (the loop's timer only
    # decides when the check runs; the check compares the test's clock).
    sends: asyncio.Queue[bytes] = asyncio.Queue()

    async def trickle_on_demand(state: Server, reader: R, writer: W) -> None:
        await read_request(state, reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n")
        while data := await sends.get():
            writer.write(data)
            await writer.drain()
        await asyncio.sleep(30)

    clock = FakeClock()
    async with serve(trickle_on_demand) as srv:
        p = pool(idle_timeout_s=0.3, clock=clock)
        resp = await p.request(p.origin(srv.url), b"GET", b"/", [], b"")
        got = b""
        for _ in range(10):  # 1 s of the client's time in all, more than three timeouts
            clock.now += 0.1  # under the timeout since the last byte
            await sends.put(b"x")
            got += await resp.read()
        assert got == b"x" * 10
        clock.now += 0.31  # silence past the timeout: the next check (on the loop's timer) fails
        with pytest.raises(ReadTimeout):
            await resp.read()
        resp.close()
        await sends.put(b"")
        await p.close()


@both_loops
async def test_the_idle_check_fails_at_the_deadline_and_otherwise_rearms_for_what_is_left() -> None:
    """``_check_idle`` called by hand on the test's clock (the loop's timer, 30 s away, never fires
    here): before the deadline it re-arms for the rest, at the deadline exactly it fails, while
    reading is paused for a slow client it re-arms from now, after the end of the answer it does
    nothing (the connection stays poolable)."""
    release = asyncio.Event()

    async def head_then_wait(state: Server, reader: R, writer: W) -> None:
        while await read_request(state, reader) is not None:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n")
            await writer.drain()
            await release.wait()
            release.clear()
            writer.write(b"ok")
            await writer.drain()

    clock = FakeClock()
    loop = asyncio.get_running_loop()
    async with serve(head_then_wait) as srv:
        p = pool(idle_timeout_s=30.0, clock=clock)
        origin = p.origin(srv.url)
        resp = await p.request(origin, b"GET", b"/", [], b"")
        start = clock.now  # the head's bytes came at this instant
        clock.now = start + 10.0
        resp._check_idle()
        timer = resp._timer
        # (1e-6: uvloop's time is whole milliseconds, and `when` is that time + 20.0 in floating point —
        # 6352.235 + 20.0 is 6372.235000000001)
        assert timer is not None and 19.0 < timer.when() - loop.time() <= 20.0 + 1e-6  # 30 − 10 s left
        # Paused for a slow client: silence does not count; the next check is a whole period away.
        resp._paused = True
        clock.now = start + 100.0
        resp._check_idle()
        timer = resp._timer
        assert timer is not None and 29.0 < timer.when() - loop.time() <= 30.0 + 1e-6
        assert resp._last_data == start + 100.0
        resp._paused = False
        clock.now = start + 130.0  # exactly the deadline from the pause's restart
        resp._check_idle()
        with pytest.raises(ReadTimeout):
            await resp.read()
        resp.close()

        # After a complete answer a late check changes nothing: the connection is pooled and reused.
        resp = await p.request(origin, b"GET", b"/", [], b"")
        release.set()
        assert await resp.read_all() == b"ok"
        clock.now += 1000.0
        resp._check_idle()
        resp.release()
        again = await p.request(origin, b"GET", b"/", [], b"")
        assert again.reused
        release.set()
        assert await again.read_all() == b"ok"
        again.release()
        await p.close()
    assert srv.connections == 2


@both_loops
async def test_a_rearmed_idle_check_runs_again_on_the_loops_timer() -> None:
    # The check re-armed for what is left of the timeout must itself run (and fail at the deadline):
    # the request's own first check is stopped, so only the re-armed one can end the wait.
    async def head_then_silence(state: Server, reader: R, writer: W) -> None:
        await read_request(state, reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(5)  # then closes: a lost re-arm shows as a broken answer, not a hang

    clock = FakeClock()
    async with serve(head_then_silence) as srv:
        p = pool(idle_timeout_s=0.2, clock=clock)
        resp = await p.request(p.origin(srv.url), b"GET", b"/", [], b"")
        start = clock.now
        resp._stop_timer()
        clock.now = start + 0.1
        resp._check_idle()  # re-armed for the 0.1 s left
        assert resp._timer is not None
        clock.now = start + 0.25  # past the deadline when the re-armed check runs
        with pytest.raises(ReadTimeout):
            await resp.read()
        resp.close()
        await p.close()


@both_loops
async def test_a_connection_the_upstream_closed_after_its_answer_is_not_pooled() -> None:
    async def answer_then_close(state: Server, reader: R, writer: W) -> None:
        await read_request(state, reader)
        writer.write(ok(b"done"))  # keep-alive by default (HTTP/1.1), but the connection goes
        await writer.drain()

    async with serve(answer_then_close) as srv:
        p = pool()
        resp = await p.request(p.origin(srv.url), b"GET", b"/", [], b"")
        assert await resp.read_all() == b"done"
        for _ in range(500):  # bounded: the close reaches the client within a few loop turns
            if resp.closed:
                break
            await asyncio.sleep(0.01)
        assert resp.closed, "the upstream's close was never seen"
        resp.release()
        assert p.idle_count == 0
        await p.close()


@both_loops
async def test_a_small_answer_never_pauses_reading() -> None:
    async def small(state: Server, reader: R, writer: W) -> None:
        await read_request(state, reader)
        writer.write(ok(b"x" * 100))
        await writer.drain()

    async with serve(small) as srv:
        p = pool()
        resp = await p.request(p.origin(srv.url), b"GET", b"/", [], b"")
        assert not resp._paused  # far below the high-water mark: reading goes on
        assert await resp.read_all() == b"x" * 100
        resp.release()
        await p.close()


@both_loops
async def test_a_body_is_framed_whatever_the_method() -> None:
    # A GET with a body still says how long it is: unframed, its bytes would be read as a next request.
    async with serve(keep_answering) as srv:
        p = pool()
        resp = await p.request(p.origin(srv.url), b"GET", b"/", [], b"abc")
        assert await resp.read_all() == b'{"n":1}'
        resp.release()
        await p.close()
    (request,) = srv.requests
    assert b"\r\nContent-Length: 3\r\n" in request and request.endswith(b"\r\n\r\nabc")


@both_loops
async def test_a_cut_answer_is_broken_and_garbage_is_not_http() -> None:
    async def cut(state: Server, reader: R, writer: W) -> None:
        await read_request(state, reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789")
        await writer.drain()
        writer.transport.abort()

    async with serve(cut) as srv:
        p = pool()
        resp = await p.request(p.origin(srv.url), b"GET", b"/", [], b"")
        assert await resp.read() == b"0123456789"
        with pytest.raises(BrokenResponse):
            await resp.read()
        resp.release()  # not read to the end: closed, not pooled
        assert p.idle_count == 0
        await p.close()

    async def garbage(state: Server, reader: R, writer: W) -> None:
        await read_request(state, reader)
        writer.write(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(1)

    async with serve(garbage) as srv:
        p = pool()
        with pytest.raises(BrokenResponse, match="not HTTP"):
            await p.request(p.origin(srv.url), b"GET", b"/", [], b"")
        await p.close()


@both_loops
async def test_closing_an_unread_answer_closes_the_connection_and_half_close_still_reads() -> None:
    async def endless(state: Server, reader: R, writer: W) -> None:
        await read_request(state, reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        await writer.drain()
        await read_request(state, reader)  # returns at EOF: the client half-closed or closed
        writer.write(b"4\r\nlast\r\n0\r\n\r\n")  # what the engine still sends after the client left
        await writer.drain()

    async with serve(endless) as srv:
        p = pool()
        resp = await p.request(p.origin(srv.url), b"POST", b"/", [], b"{}")
        assert await resp.read() == b"first"
        assert resp.write_eof()
        await asyncio.wait_for(srv.eof_seen.wait(), 2.0)
        assert await resp.read_all() == b"last"
        resp.close()
        assert resp.write_eof() is False  # closed: nothing to half-close
        await p.close()

    async with serve(endless) as srv:
        p = pool()
        resp = await p.request(p.origin(srv.url), b"POST", b"/", [], b"{}")
        assert await resp.read() == b"first"
        resp.close()  # the client went away: the upstream sees the end at once
        await asyncio.wait_for(srv.eof_seen.wait(), 2.0)
        assert p.idle_count == 0
        await p.close()


@both_loops
async def test_a_request_cancelled_before_its_head_hands_the_connection_to_its_hook() -> None:
    """Cancelled while the head is awaited (the client left during the prefill): the ``on_cancel``
    hook gets the connection, may half-close it and read the answer the upstream sends only then;
    afterwards the connection is closed, never pooled, and its slot is free again. Before there was
    no hook: the connection was closed unread."""
    async def answers_at_eof(state: Server, reader: R, writer: W) -> None:
        await read_request(state, reader)
        await read_request(state, reader)  # returns at EOF: the gateway half-closed
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: 4\r\n\r\nlast")
        await writer.drain()

    got: list[tuple[int, bytes, bytes]] = []

    async def hook(conn: UpstreamConnection) -> None:
        task = asyncio.current_task()
        assert task is not None
        task.uncancel()
        assert conn.write_eof()
        await asyncio.wait_for(conn.head(), 2.0)
        got.append((conn.status, conn.content_type, await conn.read_all()))

    async with serve(answers_at_eof) as srv:
        p = pool(limit=1)
        origin = p.origin(srv.url)
        request = asyncio.create_task(p.request(origin, b"POST", b"/", [], b"{}", on_cancel=hook))
        for _ in range(200):
            if srv.requests:
                break
            await asyncio.sleep(0.01)
        assert srv.requests and not request.done()
        request.cancel()
        with pytest.raises(asyncio.CancelledError):
            await request
        assert got == [(200, b"text/event-stream", b"last")]
        assert p.idle_count == 0
        # The slot came back: with a limit of 1, another request gets a connection.
        srv_requests = len(srv.requests)
        nxt = asyncio.create_task(p.request(origin, b"POST", b"/", [], b"{}"))
        for _ in range(200):
            if len(srv.requests) > srv_requests:
                break
            await asyncio.sleep(0.01)
        assert len(srv.requests) > srv_requests
        nxt.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await nxt
        await p.close()

    # Cancelled before anything was written (waiting for a slot): the hook is not called.
    async with serve(answers_at_eof) as srv:
        p = pool(limit=1)
        origin = p.origin(srv.url)
        first = asyncio.create_task(p.request(origin, b"POST", b"/", [], b"{}"))
        for _ in range(200):
            if srv.requests:
                break
            await asyncio.sleep(0.01)
        calls: list[UpstreamConnection] = []

        async def record(conn: UpstreamConnection) -> None:
            calls.append(conn)

        waiting = asyncio.create_task(p.request(origin, b"POST", b"/", [], b"{}", on_cancel=record))
        await asyncio.sleep(0.05)
        waiting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiting
        assert calls == []
        first.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await first
        await p.close()


@both_loops
async def test_a_slow_reader_pauses_the_upstream_and_loses_nothing() -> None:
    size = 6 << 20
    payload = bytes(range(256)) * (size // 256)

    async def big(state: Server, reader: R, writer: W) -> None:
        await read_request(state, reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
        writer.write(payload)
        await writer.drain()
        await read_request(state, reader)

    async with serve(big) as srv:
        p = pool()
        resp = await p.request(p.origin(srv.url), b"GET", b"/", [], b"")
        for _ in range(200):  # not reading: the client's buffer fills to the high-water mark, then stops
            if resp._paused:
                break
            await asyncio.sleep(0.01)
        assert resp._paused
        assert resp._buffered < 4 << 20
        assert await resp.read_all() == payload
        resp.release()
        assert p.idle_count == 1
        await p.close()


@both_loops
async def test_reading_pauses_again_after_every_resume() -> None:
    """Each read that drains the buffer resumes the upstream; the next time the buffer passes the
    high-water mark it must pause again, or a slow client's answer is buffered whole (a mutant that
    left ``_paused`` set at the resume never paused a second time: 10 MiB buffered)."""
    size = 12 << 20
    payload = bytes(range(256)) * (size // 256)

    async def big(state: Server, reader: R, writer: W) -> None:
        await read_request(state, reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
        writer.write(payload)
        await writer.drain()
        await read_request(state, reader)

    async def settled(resp: UpstreamConnection) -> int:
        """The buffered size once it stops growing (paused, or everything arrived)."""
        last = -1
        for _ in range(300):
            await asyncio.sleep(0.01)
            if resp._buffered == last:
                break
            last = resp._buffered
        return resp._buffered

    async with serve(big) as srv:
        p = pool()
        resp = await p.request(p.origin(srv.url), b"GET", b"/", [], b"")
        got = bytearray()
        for _ in range(3):  # pause → read (resume) → pause again, three times
            assert await settled(resp) < 4 << 20
            assert resp._paused
            got += await resp.read()
        got += await resp.read_all()
        assert bytes(got) == payload
        resp.release()
        await p.close()


@both_loops
async def test_a_read_returns_every_chunk_buffered_since_the_last() -> None:
    """Two body chunks arrive before the client reads: one read returns both, in order."""
    async def two_parts(state: Server, reader: R, writer: W) -> None:
        await read_request(state, reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhello")
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(b"world")
        await writer.drain()
        await read_request(state, reader)

    async with serve(two_parts) as srv:
        p = pool()
        resp = await p.request(p.origin(srv.url), b"GET", b"/", [], b"")
        for _ in range(300):
            if resp._complete:
                break
            await asyncio.sleep(0.01)
        assert resp._complete and len(resp._chunks) == 2  # both parts buffered, nothing read yet
        assert await resp.read() == b"helloworld"
        assert await resp.read() == b""
        resp.release()
        await p.close()


@both_loops
async def test_the_limit_makes_requests_wait_for_a_connection() -> None:
    async with serve(keep_answering) as srv:
        p = pool(limit=1)
        origin = p.origin(srv.url)
        first = await p.request(origin, b"GET", b"/", [], b"")
        second = asyncio.create_task(p.request(origin, b"GET", b"/", [], b""))
        await asyncio.sleep(0.05)
        assert not second.done()
        await first.read_all()
        first.release()
        resp = await asyncio.wait_for(second, 2.0)
        await resp.read_all()
        resp.release()
        await p.close()
    assert srv.connections == 1


def test_origins() -> None:
    o = Origin.parse("https://engine.local/base/")
    assert (o.host, o.port, o.tls, o.prefix) == ("engine.local", 443, True, b"/base")
    assert o.host_header == b"engine.local"
    o = Origin.parse("http://127.0.0.1:8000")
    assert (o.port, o.tls, o.host_header, o.prefix) == (8000, False, b"127.0.0.1:8000", b"")
    with pytest.raises(ValueError, match="not an http"):
        Origin.parse("ftp://x")
    # Default ports by scheme; userinfo is never part of the Host header (RFC 9110 §7.2).
    assert Origin.parse("http://engine.local").port == 80
    o = Origin.parse("http://user:secret@engine.local:8000/v1/")
    assert (o.host, o.port, o.host_header, o.prefix) == ("engine.local", 8000, b"engine.local:8000", b"/v1")
    # A Host the client would refuse to write is refused here, once, naming it.
    with pytest.raises(ValueError, match=r"^unusable upstream URL: refused to send the Host header: "):
        Origin.parse("http://exa mple:80/")


@both_loops
async def test_an_answer_released_after_the_pool_closed_is_not_pooled() -> None:
    """The pool is closed while an answer is still being read (the gateway shutting down): releasing
    that answer afterwards closes its connection instead of putting it back into a closed pool."""
    async with serve(keep_answering) as srv:
        p = pool()
        resp = await p.request(p.origin(srv.url), b"GET", b"/", [], b"")
        await p.close()
        await resp.read_all()
        resp.release()
        assert p.idle_count == 0
        assert resp._transport is not None and resp._transport.is_closing()  # closed, not kept


# --- Regressions of the red team's probes (issue: the upstream client held to RFC 9110/9112) ----------


@both_loops
async def test_a_1xx_is_skipped_and_the_next_request_gets_its_own_answer() -> None:
    """Before: `100 <= status < 200` finished the answer. A 103 then, 0.2 s later, the 200: request A
    got 103 with no body and the connection went back to the pool, so request B's answer began with
    A's body. Both in one read: the 103's fields merged into the 200's."""
    gap = asyncio.Event()

    async def early_hints(state: Server, reader: R, writer: W) -> None:
        while (req := await read_request(state, reader)) is not None:
            n = len(state.requests)
            writer.write(b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n")
            if n == 1:  # the final answer in a later read
                await writer.drain()
                await gap.wait()
            writer.write(ok(b"answer %d" % n))
            await writer.drain()
            del req

    async with serve(early_hints) as srv:
        p = pool()
        origin = p.origin(srv.url)
        a = asyncio.create_task(p.request(origin, b"POST", b"/", [], b"{}"))
        for _ in range(100):  # the 103 alone has arrived: A must still wait for the final answer
            if len(srv.requests) == 1:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        assert not a.done()
        gap.set()
        resp = await a
        assert resp.status == 200
        assert [k for k, _ in resp.headers] == [b"Content-Type", b"Content-Length"]
        assert await resp.read_all() == b"answer 1"
        resp.release()
        b = await p.request(origin, b"POST", b"/", [], b"{}")  # the same connection, one read
        assert (b.status, await b.read_all()) == (200, b"answer 2")
        assert all(k != b"Link" for k, _ in b.headers)
        b.release()
        await p.close()
    assert srv.connections == 1


@both_loops
async def test_several_1xx_then_204_and_a_101_is_refused_and_never_pooled() -> None:
    async def interim_then(final: bytes) -> Callable[[Server, R, W], Awaitable[None]]:
        async def answer(state: Server, reader: R, writer: W) -> None:
            while await read_request(state, reader) is not None:
                writer.write(b"HTTP/1.1 100 Continue\r\n\r\n"
                             b"HTTP/1.1 102 Processing\r\nX-A: 1\r\n\r\n" + final)
                await writer.drain()
        return answer

    async with serve(await interim_then(b"HTTP/1.1 204 No Content\r\nX-B: 2\r\n\r\n")) as srv:
        p = pool()
        resp = await p.request(p.origin(srv.url), b"DELETE", b"/", [], b"")
        assert (resp.status, resp.headers, await resp.read_all()) == (204, [(b"X-B", b"2")], b"")
        resp.release()
        assert p.idle_count == 1
        await p.close()

    upgrade = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n\x00\x00"
    async with serve(await interim_then(upgrade)) as srv:
        p = pool()
        # The words an operator reads in the gateway's log and the 502's body.
        with pytest.raises(BrokenResponse,
                           match=r"^upstream switched protocols \(101\) though none was asked for$"):
            await p.request(p.origin(srv.url), b"GET", b"/", [], b"")
        assert p.idle_count == 0
        await asyncio.wait_for(srv.eof_seen.wait(), 2.0)  # the client closed it
        await p.close()


@both_loops
async def test_trailers_are_not_headers_even_when_they_arrive_with_the_head() -> None:
    """Before: the whole chunked answer in one read put the trailer `X-T` among the headers the
    proxy forwards (RFC 9110 §6.5.2 forbids merging them)."""

    async def with_trailer(state: Server, reader: R, writer: W) -> None:
        while await read_request(state, reader) is not None:
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-T\r\n\r\n"
                         b"5;ext=1\r\nhello\r\n0\r\nX-T: secret-ish\r\n\r\n")
            await writer.drain()

    async with serve(with_trailer) as srv:
        p = pool()
        for _ in range(2):
            resp = await p.request(p.origin(srv.url), b"GET", b"/", [], b"")
            await asyncio.sleep(0.01)
            assert [k for k, _ in resp.headers] == [b"Transfer-Encoding", b"Trailer"]
            assert await resp.read_all() == b"hello"
            resp.release()
        await p.close()
    assert srv.connections == 1


@pytest.mark.parametrize(("headers", "field"), [
    ([(b"authorization", b"Bearer k\r\nX-Injected: 1")], "the value of header b'authorization'"),
    ([(b"authorization", b"Bearer k\nX: 1")], "the value of header b'authorization'"),
    ([(b"x-a", b"a\x00b")], "the value of header b'x-a'"),
    ([(b"x a", b"1")], "header name b'x a'"),
    ([(b"x:a", b"1")], "header name b'x:a'"),
    ([(b"x-a\r\nx-b", b"1")], "header name b'x-a\\\\r\\\\nx-b'"),
    ([(b"", b"1")], "header name b''"),
])
def test_unsafe_header_fields_are_refused_before_a_byte_is_written(
    headers: list[tuple[bytes, bytes]], field: str
) -> None:
    """Before: names and values were written raw (the admin-set engine key, a recipe's --api-key):
    a CR/LF split the request in two on the engine's socket."""

    async def case() -> None:
        async with serve(keep_answering) as srv:
            p = pool()
            with pytest.raises(RefusedRequest, match=field) as info:
                await p.request(p.origin(srv.url), b"POST", b"/", [(b"x-ok", b"1"), *headers], b"{}")
            assert "Bearer k" not in str(info.value)  # the value (a key) is never in the message
            assert p.idle_count == 0
            await p.close()
        assert srv.connections == 0  # refused before connecting: nothing written

    for run in (asyncio.run, uvloop.run):
        run(case())


def test_unsafe_method_target_or_upstream_url_is_refused() -> None:
    async def case() -> None:
        p = pool()
        origin = p.origin("http://127.0.0.1:9")
        with pytest.raises(RefusedRequest, match="method"):
            await p.request(origin, b"GET /x HTTP/1.1\r\n", b"/", [], b"")
        with pytest.raises(RefusedRequest, match="target"):
            await p.request(origin, b"GET", b"/a b", [], b"")
        await p.close()

    asyncio.run(case())
    with pytest.raises(ValueError, match="unusable upstream URL"):
        Origin.parse("http://127.0.0.1:9/base path/")


@both_loops
async def test_bytes_on_an_idle_pooled_connection_close_it_and_never_answer_the_next_request() -> None:
    async def unsolicited(state: Server, reader: R, writer: W) -> None:
        await read_request(state, reader)
        writer.write(ok(b"first"))
        await writer.drain()
        await asyncio.sleep(0.05)  # the client has pooled the connection by now (or not: same end)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nnot yours")
        await writer.drain()
        await read_request(state, reader)  # the client's close

    async with serve(unsolicited) as srv:
        p = pool()
        resp = await p.request(p.origin(srv.url), b"GET", b"/", [], b"")
        assert await resp.read_all() == b"first"
        resp.release()
        await asyncio.wait_for(srv.eof_seen.wait(), 2.0)  # the client closed it on the stray bytes
        assert p.idle_count == 0
        fresh = await p.request(p.origin(srv.url), b"GET", b"/", [], b"")
        assert await fresh.read_all() == b"first"
        fresh.release()
        await p.close()
    assert srv.connections == 2


@both_loops
async def test_a_body_longer_than_its_length_leaves_the_connection_unpooled() -> None:
    async def too_long(state: Server, reader: R, writer: W) -> None:
        while await read_request(state, reader) is not None:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi"
                         b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nextra")
            await writer.drain()

    async with serve(too_long) as srv:
        p = pool()
        for _ in range(2):
            resp = await p.request(p.origin(srv.url), b"GET", b"/", [], b"")
            assert await resp.read_all() == b"hi"
            resp.release()
            assert p.idle_count == 0
        await p.close()
    assert srv.connections == 2


@both_loops
async def test_an_empty_body_is_framed_as_content_length_0_for_methods_that_carry_content() -> None:
    """POST, PUT and PATCH define a meaning for enclosed content: with an empty body the request
    still says `Content-Length: 0` (RFC 9110 §8.6's SHOULD); GET, DELETE and HEAD say nothing."""
    async with serve(keep_answering) as srv:
        p = pool()
        origin = p.origin(srv.url)
        for method in (b"POST", b"PUT", b"PATCH", b"GET", b"DELETE"):
            resp = await p.request(origin, method, b"/", [], b"")
            await resp.read_all()
            resp.release()
        await p.close()
    framed = [req.split(b" ", 1)[0] for req in srv.requests if b"\r\nContent-Length: 0\r\n" in req]
    assert framed == [b"POST", b"PUT", b"PATCH"]


def test_only_idempotent_methods_may_be_retried_unless_the_setting_says_so() -> None:
    for method in (b"GET", b"HEAD", b"OPTIONS", b"PUT", b"DELETE"):
        assert may_retry(method, retry_non_idempotent=False)
    for method in (b"POST", b"PATCH"):
        assert not may_retry(method, retry_non_idempotent=False)
        assert may_retry(method, retry_non_idempotent=True)


# --- Through the gateway's proxy (ASGI app driven directly, real upstream sockets) --------------------


@asynccontextmanager
async def gateway(
    url: str, upstream_key: str | None = None, **config: Any
) -> AsyncIterator[tuple[GatewayApp, str]]:
    with tempfile.TemporaryDirectory() as home:
        app = GatewayApp(GatewayConfig(keys_db=Path(home) / "keys.db", **config))
        app.keys.load(create=True)
        _, key = KeyStore(Path(home) / "keys.db").create("test")
        await app.startup()
        app.slot.set(url, None, upstream_key=upstream_key)
        try:
            yield app, key
        finally:
            await app.shutdown()


async def asgi_call(
    app: GatewayApp, method: str, path: str, headers: list[tuple[bytes, bytes]], body: bytes = b""
) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    sent: dict[str, Any] = {"status": 0, "headers": [], "body": b""}
    done = asyncio.Event()
    pending = [body]

    async def receive() -> dict[str, Any]:
        if pending:
            return {"type": "http.request", "body": pending.pop(), "more_body": False}
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            sent["status"], sent["headers"] = message["status"], list(message["headers"])
        else:
            sent["body"] += message.get("body", b"")
            if not message.get("more_body", False):
                done.set()

    scope = {"type": "http", "method": method, "path": path, "raw_path": path.encode(),
             "query_string": b"", "headers": headers}
    await asyncio.wait_for(app(scope, receive, send), timeout=5)
    return sent["status"], sent["headers"], sent["body"]


@both_loops
async def test_headers_named_in_connection_are_dropped_both_ways() -> None:
    """Before: only the fixed lists applied; `Connection: x-hop` did not make `x-hop` hop-by-hop
    (RFC 9110 §7.6.1), so it crossed the gateway in both directions."""

    async def answer(state: Server, reader: R, writer: W) -> None:
        while await read_request(state, reader) is not None:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Connection: X-Up-Hop, keep-alive\r\n"
                         b"X-Up-Hop: internal\r\nX-Up-Kept: 1\r\nContent-Length: 2\r\n\r\n{}")
            await writer.drain()

    async with serve(answer) as srv, gateway(srv.url) as (app, key):
        status, headers, body = await asgi_call(app, "GET", "/v1/completions", [
            (b"authorization", f"Bearer {key}".encode()),
            (b"connection", b"x-hop, Upgrade"), (b"connection", b"X-Second"),
            (b"x-hop", b"1"), (b"x-second", b"2"), (b"x-kept", b"3"),
        ])
        assert status == 200, body
        names = {k.lower() for k, _ in headers}
        assert b"x-up-hop" not in names and b"connection" not in names and b"x-up-kept" in names
    sent = srv.requests[0].lower()
    assert b"x-kept: 3" in sent
    assert b"x-hop" not in sent and b"x-second" not in sent and b"connection" not in sent


def stale_after_first() -> Callable[[Server, R, W], Awaitable[None]]:
    """The first connection answers once, then takes the next request and closes without a byte
    (the request reached the engine; it may have started on it). Later connections answer."""

    async def handler(state: Server, reader: R, writer: W) -> None:
        first_connection = state.connections == 1
        while await read_request(state, reader) is not None:
            if first_connection and len(state.requests) > 1:
                writer.transport.abort()
                return
            writer.write(ok(b'{"n":%d}' % len(state.requests)))
            await writer.drain()

    return handler


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
@pytest.mark.parametrize(("method", "setting", "sent_again"), [
    ("POST", False, False),  # the issue: a POST was sent twice (a second generation billed)
    ("GET", False, True),
    ("POST", True, True),
])
def test_a_stale_pooled_connection_is_retried_only_where_a_repeat_is_harmless(
    loop: str, method: str, setting: bool, sent_again: bool
) -> None:
    """Before: any method met a stale pooled connection with one retry on a fresh connection."""

    async def case() -> None:
        async with serve(stale_after_first()) as srv, \
                gateway(srv.url, retry_stale_non_idempotent=setting) as (app, key):
            h = [(b"authorization", f"Bearer {key}".encode()), (b"content-type", b"application/json")]
            body = b"{}" if method == "POST" else b""
            assert (await asgi_call(app, method, "/v1/completions", h, body))[0] == 200
            status, _, answer = await asgi_call(app, method, "/v1/completions", h, body)
            retries = app.metrics.upstream_retries
            counted = {v: retries.labels(v)._value.get() for v in ("yes", "no")}
        if sent_again:
            assert status == 200 and answer == b'{"n":3}'
            assert len(srv.requests) == 3
            assert counted == ({"yes": 0, "no": 1} if method == "POST" else {"yes": 1, "no": 0})
        else:
            assert status == 502 and b"closed the connection before answering" in answer
            assert len(srv.requests) == 2  # the engine got it once
            assert counted == {"yes": 0, "no": 0}

    (uvloop.run if loop == "uvloop" else asyncio.run)(case())


@both_loops
async def test_an_engine_key_with_a_line_break_is_a_502_and_nothing_reaches_the_engine() -> None:
    async with serve(keep_answering) as srv, gateway(srv.url, upstream_key="k\r\nX-Evil: 1") as (app, key):
        status, _, body = await asgi_call(
            app, "GET", "/v1/models", [(b"authorization", f"Bearer {key}".encode())])
        assert status == 502 and b"authorization" in body and b"X-Evil" not in body
        assert app.metrics.upstream_errors.labels("refused_request")._value.get() == 1
    assert srv.connections == 0


@both_loops
async def test_a_final_answer_without_content_type_after_a_1xx_has_none_of_the_1xxs() -> None:
    """The head starts from nothing at each message: a 103 that carries a Content-Type must not
    lend it (nor a None) to a final answer that has none (`content_type` is `b""` then)."""

    async def typed_interim(state: Server, reader: R, writer: W) -> None:
        while await read_request(state, reader) is not None:
            writer.write(b"HTTP/1.1 103 Early Hints\r\nContent-Type: text/html\r\n\r\n"
                         b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi")
            await writer.drain()

    async with serve(typed_interim) as srv:
        p = pool()
        resp = await p.request(p.origin(srv.url), b"GET", b"/", [], b"")
        assert (resp.status, resp.content_type, resp.headers) == (200, b"", [(b"Content-Length", b"2")])
        assert await resp.read_all() == b"hi"
        resp.release()
        await p.close()


@both_loops
async def test_only_trailing_spaces_and_tabs_are_cut_from_a_field_value() -> None:
    """RFC 9110 §5.5: trailing whitespace (SP/HTAB, which llhttp keeps) is not part of the value;
    the value's own last characters are, even ones that are not letters of "SP" or "HTAB"."""

    async def padded(state: Server, reader: R, writer: W) -> None:
        while await read_request(state, reader) is not None:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plainX \t\r\nX-V: keepXX  \r\n"
                         b"Content-Length: 0\r\n\r\n")
            await writer.drain()

    async with serve(padded) as srv:
        p = pool()
        resp = await p.request(p.origin(srv.url), b"GET", b"/", [], b"")
        assert resp.headers == [(b"Content-Type", b"text/plainX"), (b"X-V", b"keepXX"),
                                (b"Content-Length", b"0")]
        assert resp.content_type == b"text/plainx"
        resp.release()
        await p.close()


@both_loops
async def test_vertical_tab_and_form_feed_are_not_optional_whitespace() -> None:
    """RFC 9110 §5.5: OWS is SP/HTAB only, so a value's trailing VT/FF is not cut with its trailing
    spaces. llhttp refuses both in a value on the wire today, so the callback is driven directly:
    its own rule must not depend on which parser feeds it."""
    p = pool()
    conn = UpstreamConnection(p, p.origin("http://127.0.0.1:9"), asyncio.get_running_loop())
    conn.on_message_begin()
    conn.on_header(b"X-V", b"a\x0b\x0c \t")
    conn.on_header(b"Content-Type", b"text/plain\x0c ")
    assert conn.headers == [(b"X-V", b"a\x0b\x0c"), (b"Content-Type", b"text/plain\x0c")]
    assert conn.content_type == b"text/plain\x0c"


@both_loops
async def test_bytes_on_a_fresh_connection_before_the_request_close_it_and_are_never_an_answer() -> None:
    """An upstream that speaks first: what it sends before a request is written answers nothing.
    The connection is made and left unused until those bytes have arrived; the client must close
    it (the server sees EOF), never keep them as the answer of the request written next."""
    sent = asyncio.Event()

    async def speaks_first(state: Server, reader: R, writer: W) -> None:
        if state.connections == 1:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nnot yours")
            await writer.drain()
            sent.set()
        await keep_answering(state, reader, writer)

    async with serve(speaks_first) as srv:
        p = pool()
        origin = p.origin(srv.url)
        conn = await p._connect(origin)  # what `request` does first, without the write after it
        await asyncio.wait_for(sent.wait(), 2.0)
        await asyncio.wait_for(srv.eof_seen.wait(), 2.0)  # the client closed it on the early bytes
        assert conn._transport is not None and conn._transport.is_closing()
        assert srv.requests == []
        resp = await p.request(origin, b"GET", b"/", [], b"")  # a new connection, its own answer
        assert (resp.status, await resp.read_all()) == (200, b'{"n":1}')
        resp.release()
        await p.close()
    assert srv.connections == 2
