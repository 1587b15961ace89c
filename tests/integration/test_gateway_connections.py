"""The gateway's connection handling on a real socket, each case on asyncio's loop and on uvloop (the
gateway runs on uvloop, whose transports behave differently on a closed connection): a lost
connection cancels every request on it (pipelined ones too), request trailers are dropped and
bounded, the body has a deadline and a key's concurrency counts from the head, paths are routed as
forwarded, and the controller and scrapers get through a full per-address connection cap."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any
from unittest.mock import patch

import aiohttp
import pytest
import uvloop
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from bench.synthetic_upstream import Shape, SyntheticUpstream
from controller.gateway import control
from controller.gateway.auth import hash_admin_token
from controller.gateway.config import GatewayConfig
from controller.gateway.embedded import RunningGateway, serve_in_loop
from controller.gateway.hold.queue import HoldPlan
from controller.gateway.keystore import KeyStore
from controller.gateway.usage.store import UsageStore

ADMIN = "connections-admin-token"
pytestmark = pytest.mark.timeout(120)

Case = Callable[[Path], Coroutine[Any, Any, None]]


def both_loops(case: Case) -> Callable[[str, Path], None]:
    """Run ``case(tmp_path)`` once on asyncio's loop and once on uvloop."""

    @pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
    def test(loop: str, tmp_path: Path) -> None:
        (uvloop.run if loop == "uvloop" else asyncio.run)(case(tmp_path))

    test.__name__ = test.__qualname__ = case.__name__
    test.__doc__ = case.__doc__
    return test


def config(tmp_path: Path, upstream: SyntheticUpstream | None = None, **kw: Any) -> GatewayConfig:
    return GatewayConfig(
        keys_db=tmp_path / "keys.db",
        port=0,
        upstream_url=upstream.url if upstream else None,
        served_model=upstream.model if upstream else None,
        admin_token_sha256=hash_admin_token(ADMIN),
        key_refresh_s=0.2,
        **kw,
    )


def port_of(gw: RunningGateway) -> int:
    return int(gw.url.rsplit(":", 1)[1])


async def read_until_closed(reader: asyncio.StreamReader, budget_s: float = 10.0) -> bytes:
    """Everything the server sends until it closes (bounded, so a held socket fails the test)."""
    out = b""
    with contextlib.suppress(ConnectionError, TimeoutError):
        async with asyncio.timeout(budget_s):
            while chunk := await reader.read(65536):
                out += chunk
    return out


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One Content-Length response: (status, body)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    lines = head.lower().split(b"\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in lines if line.startswith(b"content-length:"))
    return int(head.split(b" ", 2)[1]), await asyncio.wait_for(reader.readexactly(length), 10)


def status_of(raw: bytes) -> int:
    return int(raw.split(b" ", 2)[1]) if raw.startswith(b"HTTP/1.1 ") else 0


def message_of(raw: bytes) -> str:
    return str(json.loads(raw.split(b"\r\n\r\n", 1)[1])["error"]["message"])


async def until(predicate: Callable[[], bool], what: str, budget_s: float = 10.0) -> None:
    """Wait (bounded) for something the server does asynchronously; fail saying what never came."""
    for _ in range(int(budget_s / 0.01)):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"not within {budget_s:g} s: {what}")


def post(path: bytes, key: str, body: bytes, extra: bytes = b"") -> bytes:
    return (
        b"POST %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n%s\r\n%s"
    ) % (path, key.encode(), len(body), extra, body)


# -- issue 12: a lost connection cancels every request on it -----------------------------------


@both_loops
async def test_a_lost_connection_cancels_its_pipelined_request(tmp_path: Path) -> None:
    """Three requests pipelined on one connection; the client leaves after the first answer. The
    second (a long stream) must be cancelled and its upstream connection closed; the third never
    starts. Before: uvicorn marked only its newest cycle (the third) disconnected, so the second ran
    to its end (on uvloop its writes raised RuntimeError at proxy.py's send)."""
    key = KeyStore(tmp_path / "keys.db").create("tests")[1]
    up = SyntheticUpstream(Shape(ttft_s=0.0, chunks=1, interval_s=0.0), model="m")
    await up.start()
    try:
        async with serve_in_loop(config(tmp_path, up)) as gw:
            reader, writer = await asyncio.open_connection("127.0.0.1", port_of(gw))
            one = json.dumps({"model": "m", "max_tokens": 1}).encode()
            # Long enough never to finish within the test (100000 events, 10 ms apart).
            long = json.dumps(
                {"model": "m", "stream": True, "max_tokens": 100_000, "synthetic": {"interval_ms": 10}}
            ).encode()
            path = b"/v1/chat/completions"
            writer.write(post(path, key, one) + post(path, key, long) + post(path, key, one))
            status, _ = await read_response(reader)
            assert status == 200
            await until(lambda: len(up.requests) >= 2, "the second request reached the upstream")
            second = up.requests[1]
            assert second.stream and not second.completed
            # Leave once the client has an event of the stream: the gateway metered it on the way (so
            # what it cost is known whatever the machine's speed), and the stream is still running.
            got = bytearray()

            async def streaming() -> None:
                while b"data:" not in got:
                    chunk = await reader.read(65536)
                    assert chunk, "the gateway closed the connection before the stream began"
                    got.extend(chunk)

            await asyncio.wait_for(streaming(), 10)
            writer.transport.abort()
            await until(
                lambda: second.closed_at is not None,
                "the upstream connection of the pipelined request closed after the client left",
            )
            assert not second.completed
            await until(
                lambda: ("/v1/chat/completions", "499") in {k[:2] for k in gw.app.metrics._req_children},
                "the cancelled request counted as 499",
            )
            assert len(up.requests) == 2, "the third pipelined request must never start"
            # ... and it is billed: both requests that reached the engine are recorded for the key, the
            # cancelled one as an error with what it had cost (the usage is written in a `finally`).
            rows: list[Any] = []
            for _ in range(100):
                await gw.app.accounting.flush()
                rows = UsageStore(tmp_path / "usage.sqlite3").query()
                if sum(r.requests for r in rows) >= 2:
                    break
                await asyncio.sleep(0.05)
            assert sum(r.requests for r in rows) == 2 and sum(r.errors for r in rows) == 1, rows
            # the synthetic engine counts a prompt as its body's length / 4: the first request's alone
            # is ~7 tokens, so the cancelled stream's prompt (at least its own body's) was charged too
            assert sum(r.prompt_tokens for r in rows) >= len(long) // 4 + 1, rows
    finally:
        await up.stop()


# -- issue 13: trailers are dropped and bounded -------------------------------------------------


def chunked(path: bytes, key: str, body: bytes, trailers: bytes) -> bytes:
    return (
        b"POST %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n%s\r\n"
    ) % (path, key.encode(), len(body), body, trailers)


@both_loops
async def test_trailers_never_become_headers(tmp_path: Path) -> None:
    """A valid key in a trailer does not replace a bad one in the head (before: 200), and a trailer
    is never forwarded upstream as a header."""
    store = KeyStore(tmp_path / "keys.db")
    key = store.create("tests")[1]
    up = SyntheticUpstream(Shape(ttft_s=0.0, chunks=1, interval_s=0.0), model="m")
    await up.start()
    try:
        async with serve_in_loop(config(tmp_path, up)) as gw:
            body = json.dumps({"model": "m", "max_tokens": 1}).encode()
            reader, writer = await asyncio.open_connection("127.0.0.1", port_of(gw))
            trailer = b"Authorization: Bearer %s\r\n" % key.encode()
            writer.write(chunked(b"/v1/chat/completions", "sk-app-not-a-key", body, trailer))
            status, _ = await read_response(reader)
            writer.close()
            assert status == 401
            assert up.requests == []

            reader, writer = await asyncio.open_connection("127.0.0.1", port_of(gw))
            writer.write(chunked(b"/v1/chat/completions", key, body, b"X-Smuggled: yes\r\n"))
            status, _ = await read_response(reader)
            writer.close()
            assert status == 200
            assert "x-smuggled" not in up.requests[-1].headers
    finally:
        await up.stop()


@both_loops
async def test_a_body_of_tiny_chunks_reaches_uvicorn_once_per_read(tmp_path: Path) -> None:
    """Red team h31: uvicorn appends each body piece to the request's body with ``bytes +=`` (a copy
    of all it holds): a read of 1-byte chunks was a quadratic copy on the event loop (~100 ms per
    256 KiB read). The pieces of one read now reach uvicorn joined; before, once per chunk (4000
    here). The body still arrives whole, byte for byte."""
    store = KeyStore(tmp_path / "keys.db")
    key = store.create("tests")[1]
    up = SyntheticUpstream(Shape(ttft_s=0.0, chunks=1, interval_s=0.0), model="m")
    await up.start()
    calls: list[int] = []
    uvicorn_on_body = HttpToolsProtocol.on_body

    def counting(self: HttpToolsProtocol, body: bytes) -> None:
        calls.append(len(body))
        uvicorn_on_body(self, body)

    try:
        with patch.object(HttpToolsProtocol, "on_body", counting):
            async with serve_in_loop(config(tmp_path, up)) as gw:
                body = json.dumps({"model": "m", "max_tokens": 1, "pad": "x" * 3960}).encode()
                pieces = b"".join(b"1\r\n%c\r\n" % byte for byte in body)
                reader, writer = await asyncio.open_connection("127.0.0.1", port_of(gw))
                head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
                        b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                        % key.encode())
                writer.write(head + pieces + b"0\r\n\r\n")
                status, _ = await read_response(reader)
                writer.close()
        assert status == 200
        assert up.requests[-1].body == body
        assert sum(calls) == len(body) and len(calls) < 50, len(calls)  # one per read, not per chunk
    finally:
        await up.stop()


@both_loops
async def test_trailers_count_against_the_header_limit(tmp_path: Path) -> None:
    """Trailer bytes past ``max_header_bytes`` get 431 and a closed connection, whether they come as
    many lines with the body (counted as parsed) or as one line that never ends (counted as it
    arrives). Before: 67 MB of trailer lines passed both limits and were forwarded as headers."""
    key = KeyStore(tmp_path / "keys.db").create("tests")[1]
    up = SyntheticUpstream(Shape(ttft_s=0.0, chunks=1, interval_s=0.0), model="m")
    await up.start()
    try:
        async with serve_in_loop(config(tmp_path, up, max_header_bytes=4096)) as gw:
            body = json.dumps({"model": "m", "max_tokens": 1}).encode()
            many = b"".join(b"X-T%d: %s\r\n" % (i, b"v" * 100) for i in range(100))  # ~11 KB
            reader, writer = await asyncio.open_connection("127.0.0.1", port_of(gw))
            writer.write(chunked(b"/v1/chat/completions", key, body, many))
            raw = await read_until_closed(reader)
            writer.close()
            assert status_of(raw) == 431 and "trailers larger than 4096" in message_of(raw)

            reader, writer = await asyncio.open_connection("127.0.0.1", port_of(gw))
            head = chunked(b"/v1/chat/completions", key, body, b"")[:-2]  # up to the last chunk
            writer.write(head + b"X-Endless: ")
            with contextlib.suppress(ConnectionError):
                for _ in range(64):  # 4 MiB offered, in reads of their own
                    await asyncio.sleep(0)
                    writer.write(b"e" * 65536)
                    await writer.drain()
            raw = await read_until_closed(reader)
            writer.close()
            assert status_of(raw) == 431
            assert up.requests == [], "no request with oversized trailers reaches the upstream"
            assert gw.guard.refused[431] == 2
    finally:
        await up.stop()


# -- issue 16: a body deadline; a key's concurrency counts from the head ------------------------


@both_loops
async def test_a_trickled_body_gets_408_and_holds_the_keys_slot_meanwhile(tmp_path: Path) -> None:
    """A key limited to 1 concurrent request: while one request's body is still on its way, a second
    request of the key is refused at once (429; before: the lease was taken only after the body, so
    any number of connections could trickle bodies); the trickled body then runs out its deadline:
    408, connection closed; the key's slot is free again."""
    store = KeyStore(tmp_path / "keys.db")
    record, key = store.create("one-at-a-time", max_concurrent=1)
    up = SyntheticUpstream(Shape(ttft_s=0.0, chunks=1, interval_s=0.0), model="m")
    await up.start()
    try:
        async with serve_in_loop(config(tmp_path, up, body_timeout_s=1.0)) as gw:
            limiter = gw.app.proxy.limiter
            slow_r, slow_w = await asyncio.open_connection("127.0.0.1", port_of(gw))
            full = json.dumps({"model": "m", "max_tokens": 1}).encode()
            slow_w.write(post(b"/v1/chat/completions", key, full)[:-5])  # all but 5 bytes of the body
            await until(
                lambda: limiter.in_flight(record.id) == 1, "the trickling request holds the key's lease"
            )

            reader, writer = await asyncio.open_connection("127.0.0.1", port_of(gw))
            writer.write(post(b"/v1/chat/completions", key, full))
            raw = await read_until_closed(reader)
            writer.close()
            assert status_of(raw) == 429 and "concurrent" in message_of(raw)

            raw = await read_until_closed(slow_r)  # returns once the gateway closed the connection
            slow_w.close()
            assert status_of(raw) == 408 and "body not received within 1 s" in message_of(raw)
            assert b"connection: close" in raw.lower()
            await until(lambda: limiter.in_flight(record.id) == 0, "the lease released after the 408")
            assert up.requests == []
    finally:
        await up.stop()


# -- issue 6: routed as forwarded ---------------------------------------------------------------


@both_loops
async def test_paths_that_could_route_differently_upstream_are_refused(tmp_path: Path) -> None:
    """``/v1/%63hat/completions`` was labelled and metered as chat completions and forwarded with the
    raw escape; ``/v1/models/../x`` went up as is (a normalising server reads /v1/x). Both: 400,
    nothing forwarded. A plain path and a query string with escapes still pass."""
    key = KeyStore(tmp_path / "keys.db").create("tests")[1]
    up = SyntheticUpstream(Shape(ttft_s=0.0, chunks=1, interval_s=0.0), model="m")
    await up.start()
    try:
        async with serve_in_loop(config(tmp_path, up)) as gw:
            body = json.dumps({"model": "m", "max_tokens": 1}).encode()
            for path, why in [
                (b"/v1/%63hat/completions", "percent-encoded"),
                (b"/v1/chat%2Fcompletions", "percent-encoded"),
                (b"/v1/models/../x", "dot segments"),
                (b"/v1/./chat/completions", "dot segments"),
                (b"/admin/%75pstream", "percent-encoded"),
            ]:
                reader, writer = await asyncio.open_connection("127.0.0.1", port_of(gw))
                writer.write(post(path, key, body))
                status, answer = await read_response(reader)
                writer.close()
                assert status == 400, path
                assert why in json.loads(answer)["error"]["message"], path
            assert up.requests == []
            reader, writer = await asyncio.open_connection("127.0.0.1", port_of(gw))
            writer.write(post(b"/v1/chat/completions?x=%20y", key, body))
            status, _ = await read_response(reader)
            writer.close()
            assert status == 200 and up.requests[-1].path == "/v1/chat/completions?x=%20y"
    finally:
        await up.stop()


# -- issue 9: the control channel is never refused by a client cap ------------------------------


def control_config(tmp_path: Path, **kw: Any) -> GatewayConfig:
    """A gateway with a control listener on 127.0.0.1 (any free port) and a small client cap."""
    return config(tmp_path, control_listen=("127.0.0.1", 0), max_connections_per_client=2,
                  header_timeout_s=60.0, **kw)


async def raw_exchange(url: str, request: bytes) -> bytes:
    """Send ``request`` on a fresh connection to ``url``; everything the server answers until it closes."""
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(request)
    raw = await read_until_closed(reader)
    writer.close()
    return raw


@both_loops
async def test_the_controller_and_scrapers_get_through_on_the_control_listener(tmp_path: Path) -> None:
    """The red team's probe: every connection 127.0.0.1 may hold on the client listener is taken,
    some holding without a head, the others sending ``GET /healthz`` every 0.2 s, and more are
    tried (refused at accept). The controller's admin calls (``PUT /admin/upstream``,
    ``PUT /admin/hold``) and a ``/metrics`` scrape on the control listener succeed. Before: a
    reserve of loopback connections on the one listener, which those clients held, and
    ``PUT /admin/upstream`` got 429."""
    KeyStore(tmp_path / "keys.db").create("tests")
    async with serve_in_loop(control_config(tmp_path)) as gw:
        assert gw.control_url is not None and gw.control_url != gw.url
        silent = await asyncio.open_connection("127.0.0.1", port_of(gw))  # no head, ever
        chatty = await asyncio.open_connection("127.0.0.1", port_of(gw))
        await until(lambda: gw.guard.by_client.get("127.0.0.1") == 2, "the cap from 127.0.0.1 is full")
        stop = asyncio.Event()

        async def poll_healthz() -> int:
            reader, writer = chatty
            polls = 0
            while not stop.is_set():
                writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                status, _ = await read_response(reader)
                assert status == 200
                polls += 1
                await asyncio.sleep(0.2)
            return polls

        poller = asyncio.create_task(poll_healthz())
        over = [await asyncio.open_connection("127.0.0.1", port_of(gw)) for _ in range(3)]
        for reader, writer in over:
            raw = await read_until_closed(reader)
            writer.close()
            assert status_of(raw) == 429 and "too many open connections from 127.0.0.1" in message_of(raw)

        control_url = gw.control_url
        plan = HoldPlan("warm restart", 30.0, 10.0)
        switched = await control.set_upstream(control_url, ADMIN, None, None, drain_deadline_s=0.0, hold=plan)
        assert switched.upstream is None
        renewed = await control.renew_hold(control_url, ADMIN, plan)
        assert renewed["hold"]["reason"] == "warm restart"
        await control.set_upstream(control_url, ADMIN, "http://127.0.0.1:9", "m", drain_deadline_s=0.0)
        async with aiohttp.ClientSession() as s, s.get(f"{control_url}/metrics") as r:
            assert r.status == 200
            assert "appliance_gateway" in await r.text()
        stop.set()
        assert await poller > 0
        assert gw.guard.by_client.get("127.0.0.1") == 2  # the control calls never counted as clients
        for _, w in (silent, chatty):
            w.close()
        await until(lambda: gw.guard.control_open == 0, "the control connections released")
        await until(lambda: gw.guard.total == 0, "the client connections released")


@both_loops
async def test_the_control_listener_serves_only_control_paths(tmp_path: Path) -> None:
    """On the control listener a client request (a valid key, a real upstream) is 404 and the
    connection closes, nothing reaches the upstream; /healthz and /metrics answer. On the client
    listener /admin/ is 404 while /metrics and /healthz still answer (compat)."""
    key = KeyStore(tmp_path / "keys.db").create("tests")[1]
    up = SyntheticUpstream(Shape(ttft_s=0.0, chunks=1, interval_s=0.0), model="m")
    await up.start()
    try:
        async with serve_in_loop(control_config(tmp_path)) as gw:
            assert gw.control_url is not None
            await control.set_upstream(gw.control_url, ADMIN, up.url, "m", drain_deadline_s=0.0)
            body = json.dumps({"model": "m", "max_tokens": 1}).encode()
            for request in (
                post(b"/v1/chat/completions", key, body),
                b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n" % key.encode(),
                b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
            ):
                raw = await raw_exchange(gw.control_url, request)
                assert status_of(raw) == 404, raw
                assert "control listener serves only" in message_of(raw)
                assert b"connection: close" in raw.lower()
            assert up.requests == []
            async with aiohttp.ClientSession() as s:
                for url in (gw.control_url, gw.url):
                    async with s.get(f"{url}/healthz") as r:
                        assert r.status == 200 and (await r.json())["ready"] is True
                    async with s.get(f"{url}/metrics") as r:
                        assert r.status == 200
            raw = await raw_exchange(
                gw.url,
                b"GET /admin/upstream HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n"
                % ADMIN.encode(),
            )
            assert status_of(raw) == 404 and "control listener only" in message_of(raw)
            with pytest.raises(control.GatewayControlError) as refused:
                await control.get_upstream(gw.url, ADMIN)
            assert refused.value.status == 404
            # The client listener still proxies.
            reader, writer = await asyncio.open_connection("127.0.0.1", port_of(gw))
            writer.write(post(b"/v1/chat/completions", key, body))
            status, _ = await read_response(reader)
            writer.close()
            assert status == 200 and len(up.requests) == 1
    finally:
        await up.stop()


@both_loops
async def test_the_control_listener_has_its_own_cap(tmp_path: Path) -> None:
    """Connections on the control listener count against ``max_control_connections`` only: over
    it, 503 at accept; the client listener's caps are untouched and still admit clients."""
    KeyStore(tmp_path / "keys.db").create("tests")
    async with serve_in_loop(control_config(tmp_path, max_control_connections=1)) as gw:
        assert gw.control_url is not None
        host, port = gw.control_url.split("://", 1)[1].rsplit(":", 1)
        held = await asyncio.open_connection(host, int(port))
        await until(lambda: gw.guard.control_open == 1, "the control listener's one connection")
        raw = await raw_exchange(gw.control_url, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status_of(raw) == 503 and "control listener holds its maximum of 1" in message_of(raw)
        assert gw.guard.total == 0 and gw.guard.by_client == {}
        async with aiohttp.ClientSession() as s, s.get(f"{gw.url}/healthz") as r:
            assert r.status == 200
        held[1].close()
        await until(lambda: gw.guard.control_open == 0, "the control connection released")
