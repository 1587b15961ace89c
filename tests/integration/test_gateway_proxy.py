"""The gateway on a real socket in front of the synthetic upstream: passthrough, headers, errors,
disconnects, no-slot answers and drains. Everything runs in the test's event loop, so the upstream's
record of when a connection closed and the client's clock are the same clock."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bench.synthetic_upstream import Shape, SyntheticUpstream
from controller.gateway import control
from controller.gateway.auth import hash_admin_token
from controller.gateway.config import GatewayConfig
from controller.gateway.embedded import RunningGateway, serve_in_loop
from controller.gateway.keystore import KeyStore
from controller.gateway.slot import NoSlotPolicy

ADMIN = "integration-admin-token"
pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def upstream() -> AsyncIterator[SyntheticUpstream]:
    up = SyntheticUpstream(Shape(ttft_s=0.02, chunks=8, interval_s=0.005), model="served-name")
    await up.start()
    yield up
    await up.stop()


@pytest.fixture
def store(tmp_path: Path) -> KeyStore:
    return KeyStore(tmp_path / "keys.db")


@pytest.fixture
def key(store: KeyStore) -> str:
    return store.create("tests")[1]


class Tee:
    def __init__(self) -> None:
        self.received: dict[str, bytearray] = {}

    def __call__(self, rid: bytes, chunk: bytes) -> None:
        self.received.setdefault(rid.decode(), bytearray()).extend(chunk)


def config(store: KeyStore, upstream: SyntheticUpstream | None, **kw: Any) -> GatewayConfig:
    return GatewayConfig(
        keys_db=store.path,
        port=0,
        upstream_url=upstream.url if upstream else None,
        served_model=upstream.model if upstream else None,
        admin_token_sha256=hash_admin_token(ADMIN),
        key_refresh_s=0.2,
        **kw,
    )


@pytest.fixture
async def tee() -> Tee:
    return Tee()


@pytest.fixture
async def gateway(
    store: KeyStore, upstream: SyntheticUpstream, tee: Tee, key: str
) -> AsyncIterator[RunningGateway]:
    async with serve_in_loop(config(store, upstream), tee=tee) as gw:
        yield gw


def h(key: str, **extra: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", **extra}


async def test_streams_are_byte_identical(
    gateway: RunningGateway, upstream: SyntheticUpstream, key: str, tee: Tee
) -> None:
    async with aiohttp.ClientSession() as s:
        for route, pad, chunks in [
            ("chat/completions", 0, 8),
            ("completions", 3000, 5),
            ("chat/completions", 70000, 3),
        ]:
            # The client asks for the usage the gateway asks for anyway, so nothing is removed
            # (test_gateway_usage_proxy.py covers a client that asks for less).
            body = {"model": upstream.model, "stream": True, "max_tokens": chunks, "synthetic": {"pad": pad},
                    "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
            async with s.post(f"{gateway.url}/v1/{route}", json=body, headers=h(key)) as r:
                assert r.status == 200
                assert r.headers["Content-Type"].startswith("text/event-stream")
                got = await r.read()
                rid = r.headers["X-Request-Id"]
            sent = bytes(upstream.requests[-1].sent)
            assert got == sent, f"{route} pad={pad}: client bytes differ from upstream bytes"
            assert bytes(tee.received[rid]) == sent
            assert got.endswith(b"data: [DONE]\n\n") and got.count(b"data: ") == chunks + 3  # + usage event


async def test_non_streaming_is_identical_and_keeps_content_length(
    gateway: RunningGateway, upstream: SyntheticUpstream, key: str
) -> None:
    url = f"{gateway.url}/v1/chat/completions"
    async with aiohttp.ClientSession() as s, s.post(url, json={"model": upstream.model}, headers=h(key)) as r:
        got = await r.read()
        assert r.status == 200 and int(r.headers["Content-Length"]) == len(got)
    assert got == bytes(upstream.requests[-1].sent)


async def test_headers_auth_not_forwarded_request_id_and_model_alias(
    gateway: RunningGateway, upstream: SyntheticUpstream, key: str
) -> None:
    async with aiohttp.ClientSession() as s:
        # The recipe's aliases come with the upstream; any other name is a 404 (test_gateway_models).
        await control.set_upstream(gateway.url, ADMIN, upstream.url, "served-name", drain_deadline_s=0,
                                   aliases=["alias"], session=s)
        async with s.post(
            f"{gateway.url}/v1/completions",
            json={"model": "alias", "prompt": "hi"},
            headers=h(key, **{"X-Request-Id": "client-id-1", "X-Custom": "kept"}),
        ) as r:
            await r.read()
            assert r.headers["X-Request-Id"] == "client-id-1"
        seen = upstream.requests[-1]
        assert "authorization" not in seen.headers
        assert seen.headers["x-request-id"] == "client-id-1" and seen.headers["x-custom"] == "kept"
        assert json.loads(seen.body) == {"model": "served-name", "prompt": "hi"}
        # Without a client id the gateway makes one, the same upstream and back.
        async with s.get(f"{gateway.url}/v1/models", headers=h(key)) as r:
            assert r.status == 200
            rid = r.headers["X-Request-Id"]
        assert upstream.requests[-1].headers["x-request-id"] == rid and len(rid) >= 16
        # A body that is not JSON is forwarded untouched (no aliasing, no 400).
        async with s.post(
            f"{gateway.url}/v1/completions",
            data=b"model=alias",
            headers=h(key, **{"Content-Type": "text/plain"}),
        ) as r:
            await r.read()
        assert upstream.requests[-1].body == b"model=alias"
        # The upstream's own errors pass through.
        async with s.get(f"{gateway.url}/v1/nothing-here", headers=h(key)) as r:
            assert r.status == 404


async def test_connect_failure_is_503_with_retry_after_and_reason(store: KeyStore, key: str) -> None:
    """Nothing listens where the engine was (it died; the controller is taking it out of the slot):
    the client is told to come back, like for "no engine" — not 502."""
    sock_owner = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = sock_owner.sockets[0].getsockname()[1]
    sock_owner.close()
    await sock_owner.wait_closed()  # a port nobody listens on
    cfg = GatewayConfig(keys_db=store.path, port=0, upstream_url=f"http://127.0.0.1:{port}")
    async with serve_in_loop(cfg) as gw, aiohttp.ClientSession() as s:
        r = await s.post(f"{gw.url}/v1/chat/completions", json={}, headers=h(key))
        assert r.status == 503 and int(r.headers["Retry-After"]) >= 1
        assert "cannot connect to upstream" in (await r.json())["error"]["message"]


async def test_the_engine_key_goes_upstream_instead_of_the_clients(
    gateway: RunningGateway, upstream: SyntheticUpstream, key: str
) -> None:
    """The engine's own door: the gateway sends the engine's per-launch key upstream, never
    the client's key, and never shows the engine key back."""
    async with aiohttp.ClientSession() as s:
        await control.set_upstream(gateway.url, ADMIN, upstream.url, "served-name", drain_deadline_s=0,
                                   upstream_key="eng_secret-1", session=s)
        async with s.post(f"{gateway.url}/v1/completions", json={"prompt": "hi"}, headers=h(key)) as r:
            assert r.status == 200
        assert upstream.requests[-1].headers["authorization"] == "Bearer eng_secret-1"
        view = await control.get_upstream(gateway.url, ADMIN, session=s)
        assert "eng_secret-1" not in json.dumps(view)
        # A relaunch on the same URL with a new key is a real switch: the new key is used at once.
        await control.set_upstream(gateway.url, ADMIN, upstream.url, "served-name", drain_deadline_s=0,
                                   upstream_key="eng_secret-2", session=s)
        async with s.post(f"{gateway.url}/v1/completions", json={"prompt": "hi"}, headers=h(key)) as r:
            assert r.status == 200
        assert upstream.requests[-1].headers["authorization"] == "Bearer eng_secret-2"


async def _raw_request(
    port: int, key: str, body: dict[str, Any]
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    data = json.dumps(body).encode()
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
        + key.encode()
        + b"\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(data)
        + data
    )
    await writer.drain()
    return reader, writer


@pytest.mark.parametrize("when", ["waiting_for_first_token", "mid_stream"])
async def test_client_disconnect_closes_upstream_while_the_upstream_is_silent(
    gateway: RunningGateway, upstream: SyntheticUpstream, key: str, when: str
) -> None:
    """The upstream is silent for ten minutes (before its first token, or between two events) when
    the client leaves: its connection must close in that silence, so the gateway noticed the client
    itself instead of at its next write. Structural, not a stopwatch: the upstream never got to
    send the next event (it measured 1-2 ms on a quiet host; the closing time is printed)."""
    port = int(gateway.url.rsplit(":", 1)[1])
    silence_ms = 600_000
    body = {
        "model": upstream.model,
        "stream": True,
        "max_tokens": 10000,
        "synthetic": {"ttft_ms": silence_ms if when == "waiting_for_first_token" else 0,
                      "interval_ms": silence_ms},
    }
    n_before = len(upstream.requests)
    reader, writer = await _raw_request(port, key, body)
    if when == "mid_stream":
        got = b""
        while b"data: " not in got:  # the first event has passed through (bounded: 5 s a read)
            got += await asyncio.wait_for(reader.read(65536), 5)
    else:
        for _ in range(500):  # wait until the upstream has the request (bounded: 5 s)
            if len(upstream.requests) > n_before:
                break
            await asyncio.sleep(0.01)
        else:
            raise AssertionError("the request never reached the upstream")
    req = upstream.requests[-1]
    assert req.closed_at is None and not req.completed
    events_before = bytes(req.sent).count(b"data: ")
    closed = time.monotonic()
    writer.transport.abort()
    for _ in range(1000):  # bounded: 10 s, far inside the upstream's silence
        if req.closed_at is not None:
            break
        await asyncio.sleep(0.01)
    assert req.closed_at is not None, "upstream connection still open 10 s after the client left"
    print(f"disconnect seen upstream after {(req.closed_at - closed) * 1000:.2f} ms ({when})")
    assert not req.completed
    assert bytes(req.sent).count(b"data: ") == events_before  # closed in the silence
    if when == "waiting_for_first_token":
        assert req.first_byte_sent is None
    else:
        assert events_before == 1


async def test_no_slot_503_then_queue_then_switch_with_drain(store: KeyStore, key: str) -> None:
    a = SyntheticUpstream(Shape(0.01, 20, 0.02), model="a")
    b = SyntheticUpstream(Shape(0.01, 2, 0.001), model="b")
    await a.start()
    await b.start()
    try:
        async with serve_in_loop(config(store, None, retry_after_s=3)) as gw, aiohttp.ClientSession() as s:
            # No slot, reject policy: 503 + Retry-After at once, never a hang.
            t = time.monotonic()
            async with s.post(f"{gw.url}/v1/chat/completions", json={}, headers=h(key)) as r:
                assert r.status == 503 and r.headers["Retry-After"] == "3"
            assert time.monotonic() - t < 2.0
            await control.set_upstream(gw.url, ADMIN, a.url, "a", session=s)

            async def stream() -> tuple[int, bytes]:
                async with s.post(
                    f"{gw.url}/v1/chat/completions", json={"stream": True}, headers=h(key)
                ) as r:
                    return r.status, await r.read()

            running = [asyncio.create_task(stream()) for _ in range(3)]
            await asyncio.sleep(0.1)  # they are streaming from a (20 chunks × 20 ms)
            switch = await control.set_upstream(gw.url, ADMIN, b.url, "b", drain_deadline_s=10, session=s)
            assert switch.drained and switch.aborted == 0 and switch.upstream is not None
            assert switch.upstream["url"] == b.url
            done = await asyncio.wait_for(asyncio.gather(*running), 10)
            for status, body in done:  # the old streams finished whole
                assert status == 200 and body.endswith(b"data: [DONE]\n\n")
            status, _ = await stream()
            assert status == 200 and b.requests and len(a.requests) == 3
    finally:
        await a.stop()
        await b.stop()


async def test_drain_deadline_aborts_and_nothing_hangs(store: KeyStore, key: str) -> None:
    slow = SyntheticUpstream(Shape(0.01, 1000, 0.02), model="slow")  # a 20 s stream
    await slow.start()
    try:
        async with serve_in_loop(config(store, slow)) as gw, aiohttp.ClientSession() as s:

            async def stream() -> bytes:
                async with s.post(
                    f"{gw.url}/v1/chat/completions", json={"stream": True}, headers=h(key)
                ) as r:
                    try:
                        return await r.read()
                    except aiohttp.ClientPayloadError:
                        return b"<cut>"

            running = [asyncio.create_task(stream()) for _ in range(2)]
            await asyncio.sleep(0.2)
            switch = await control.set_upstream(gw.url, ADMIN, None, None, drain_deadline_s=0.3, session=s)
            assert not switch.drained and switch.aborted == 2 and switch.remaining == 0
            results = await asyncio.wait_for(asyncio.gather(*running), 5)  # no hanging request
            assert results == [b"<cut>", b"<cut>"]
            for _ in range(100):
                if slow.open_connections == 0:
                    break
                await asyncio.sleep(0.01)
            assert slow.open_connections == 0  # aborted upstream requests were closed, not pooled
            async with s.post(f"{gw.url}/v1/chat/completions", json={}, headers=h(key)) as r:
                assert r.status == 503 and "Retry-After" in r.headers
    finally:
        await slow.stop()


async def test_queue_policy_waits_for_the_slot(
    store: KeyStore, key: str, upstream: SyntheticUpstream
) -> None:
    cfg = config(store, None, no_slot_policy=NoSlotPolicy.QUEUE, queue_max=4, queue_timeout_s=5.0)
    async with serve_in_loop(cfg) as gw, aiohttp.ClientSession() as s:

        async def ask() -> int:
            async with s.post(f"{gw.url}/v1/chat/completions", json={}, headers=h(key)) as r:
                await r.read()
                return r.status

        waiting = [asyncio.create_task(ask()) for _ in range(3)]
        await asyncio.sleep(0.2)
        assert not any(t.done() for t in waiting)
        assert (await control.get_upstream(gw.url, ADMIN, session=s))["queue_waiting"] == 3
        await control.set_upstream(gw.url, ADMIN, upstream.url, None, session=s)
        assert await asyncio.wait_for(asyncio.gather(*waiting), 5) == [200, 200, 200]


async def test_limits_and_revoke_without_restart(store: KeyStore, upstream: SyntheticUpstream) -> None:
    record, key = store.create("limited", max_concurrent=1)
    async with serve_in_loop(config(store, upstream)) as gw, aiohttp.ClientSession() as s:
        body = {"stream": True, "max_tokens": 50, "synthetic": {"interval_ms": 10}}
        async with s.post(f"{gw.url}/v1/chat/completions", json=body, headers=h(key)) as first:
            await first.content.readany()
            async with s.post(f"{gw.url}/v1/chat/completions", json=body, headers=h(key)) as second:
                assert second.status == 429 and second.headers["Retry-After"] == "1"
            await first.read()
        store.revoke(record.id)
        deadline = time.monotonic() + 5
        status = 200
        while time.monotonic() < deadline:  # the cache re-reads the store within key_refresh_s
            async with s.get(f"{gw.url}/v1/models", headers=h(key)) as r:
                status = r.status
            if status == 401:
                break
            await asyncio.sleep(0.05)
        assert status == 401
        async with s.get(f"{gw.url}/metrics") as r:
            text = await r.text()
        # Refused before its body (and so its model) was read: no engine took it.
        assert f'key_id="{record.id}",model="unknown",route="/v1/chat/completions",status="429"' in text
        assert key not in text


async def test_control_client_drain_and_errors(
    store: KeyStore, key: str, upstream: SyntheticUpstream
) -> None:
    async with serve_in_loop(config(store, upstream)) as gw, aiohttp.ClientSession() as s:
        body = {"stream": True, "max_tokens": 20, "synthetic": {"interval_ms": 10}}
        r = await s.post(f"{gw.url}/v1/chat/completions", json=body, headers=h(key))
        reading = asyncio.create_task(r.read())
        result = await control.drain(gw.url, ADMIN, deadline_s=10, session=s)
        assert result.drained and result.remaining == 0 and result.aborted == 0
        assert (await reading).endswith(b"data: [DONE]\n\n")  # drain waited for the stream, did not cut it
        with pytest.raises(control.GatewayControlError) as err:
            await control.drain(gw.url, "wrong-token", deadline_s=1, session=s)
        assert err.value.status == 401
    with pytest.raises(control.GatewayControlError) as err:
        await control.get_upstream(gw.url, ADMIN)  # the gateway is gone
    assert err.value.status is None


async def test_body_limit_and_malformed_json_over_a_real_socket(
    store: KeyStore, key: str, upstream: SyntheticUpstream
) -> None:
    async with (
        serve_in_loop(config(store, upstream, max_body_bytes=1000)) as gw,
        aiohttp.ClientSession() as s,
    ):
        n_before = len(upstream.requests)
        big = b'{"prompt": "' + b"x" * 5000 + b'"}'
        r = await s.post(
            f"{gw.url}/v1/completions", data=big, headers=h(key, **{"Content-Type": "application/json"})
        )
        assert r.status == 413 and "X-Request-Id" in r.headers

        async def chunked() -> AsyncIterator[bytes]:  # no Content-Length: counted as it streams in
            for _ in range(10):
                yield b" " * 500

        r = await s.post(f"{gw.url}/v1/completions", data=chunked(), headers=h(key))
        assert r.status == 413
        r = await s.post(
            f"{gw.url}/v1/chat/completions",
            data=b'{"model": ',
            headers=h(key, **{"Content-Type": "application/json"}),
        )
        assert r.status == 400 and "malformed JSON" in (await r.json())["error"]["message"]
        assert len(upstream.requests) == n_before  # none of them reached the engine
        async with s.get(f"{gw.url}/v1/models", headers=h(key)) as ok:  # the gateway is still fine
            assert ok.status == 200


async def test_two_engines_behind_one_gateway(store: KeyStore, key: str, upstream: SyntheticUpstream) -> None:
    """Two upstreams on free ports behind one gateway on a real socket, as the controller will set
    them (``control`` with ``engine``): each model goes to its engine, streams stay byte for byte, an
    engine that dies answers 503 with its diagnosis while the other keeps serving, and once removed
    its name is a 404."""
    other = SyntheticUpstream(Shape(ttft_s=0.01, chunks=4, interval_s=0.005), model="other-name")
    await other.start()
    try:
        async with serve_in_loop(config(store, None)) as gw, aiohttp.ClientSession() as s:
            await control.set_upstream(gw.url, ADMIN, upstream.url, upstream.model, engine="one", session=s)
            await control.set_upstream(gw.url, ADMIN, other.url, other.model, aliases=["other"], engine="two",
                                       session=s)
            await control.remove_engine(gw.url, ADMIN, "default", 0, session=s)

            async def ask(model: str, stream: bool = True) -> tuple[int, bytes]:
                # Asking for the usage the gateway asks for anyway: nothing is removed from the stream.
                body = {"model": model, "stream": stream, "max_tokens": 3,
                        "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
                async with s.post(f"{gw.url}/v1/chat/completions", json=body, headers=h(key)) as r:
                    return r.status, await r.read()

            for model, engine in [(upstream.model, upstream), ("other", other), (other.model, other)]:
                status, got = await ask(model)
                assert status == 200 and got == bytes(engine.requests[-1].sent)
                assert json.loads(engine.requests[-1].body)["model"] == engine.model  # an alias rewritten
            assert (len(upstream.requests), len(other.requests)) == (1, 2)
            async with s.get(f"{gw.url}/v1/models", headers=h(key)) as r:
                assert [c["id"] for c in (await r.json())["data"]] == [upstream.model, other.model, "other"]

            diagnosis = "the engine exited with code 137 (killed)"
            await control.set_upstream(gw.url, ADMIN, None, None, detail=diagnosis, engine="two", session=s)
            status, got = await ask("other", stream=False)
            assert status == 503 and json.loads(got)["error"]["message"] == diagnosis
            assert (await ask(upstream.model))[0] == 200
            view = await control.get_upstream(gw.url, ADMIN, session=s)
            assert view["engines"]["two"]["upstream"] is None and view["engines"]["one"]["upstream"]

            await control.remove_engine(gw.url, ADMIN, "two", 0, session=s)
            status, got = await ask("other", stream=False)
            assert status == 404 and json.loads(got)["error"]["code"] == "model_not_found"
            assert (await ask(upstream.model))[0] == 200
    finally:
        await other.stop()
