"""The gateway's upstream client (``controller/gateway/upstream_client.py``) against real loopback
sockets: each test's server is a few lines of asyncio that answer exactly the bytes under test."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any

import pytest
import uvloop

from controller.gateway.upstream_client import (
    BrokenResponse,
    ConnectRefused,
    Origin,
    ReadTimeout,
    StaleConnection,
    UpstreamPool,
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


def pool(**kw: float) -> UpstreamPool:
    a: dict[str, float] = {"connect_timeout_s": 2.0, "idle_timeout_s": 5.0, "keepalive_s": 4.0, "limit": 16}
    a.update(kw)
    return UpstreamPool(a["connect_timeout_s"], a["idle_timeout_s"], a["keepalive_s"], int(a["limit"]))


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
        await p.close()


@both_loops
async def test_silence_is_a_read_timeout_before_the_head_and_mid_body() -> None:
    async def silent(state: Server, reader: R, writer: W) -> None:
        await read_request(state, reader)
        await asyncio.sleep(5)

    async with serve(silent) as srv:
        p = pool(idle_timeout_s=0.2)
        with pytest.raises(ReadTimeout):
            await p.request(p.origin(srv.url), b"GET", b"/", [], b"")
        await p.close()

    async def trickle_then_stall(state: Server, reader: R, writer: W) -> None:
        await read_request(state, reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n")
        for _ in range(5):  # data keeps coming more often than the timeout: no timeout yet
            await asyncio.sleep(0.1)
            writer.write(b"x")
            await writer.drain()
        await asyncio.sleep(5)

    async with serve(trickle_then_stall) as srv:
        p = pool(idle_timeout_s=0.3)
        resp = await p.request(p.origin(srv.url), b"GET", b"/", [], b"")
        got = b""
        with pytest.raises(ReadTimeout):
            while chunk := await resp.read():
                got += chunk
        assert got == b"xxxxx"
        resp.close()
        await p.close()


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
