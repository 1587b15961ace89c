"""What an anonymous or hostile client meets on a real socket: header size (431), time to send headers
(408), connections per client and in all (429/503), JSON bodies that nest too deep (400, not a 500),
large bodies inspected off the event loop, and a key store that stays readable (and a revoke that
takes effect) while idle sockets press against a low file limit."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bench.synthetic_upstream import Shape, SyntheticUpstream
from controller.gateway import jsonbody, protocol
from controller.gateway.config import GatewayConfig
from controller.gateway.embedded import serve_in_loop
from controller.gateway.keystore import KeyStore

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def store(tmp_path: Path) -> KeyStore:
    return KeyStore(tmp_path / "keys.db")


@pytest.fixture
def key(store: KeyStore) -> str:
    return store.create("tests")[1]


def config(store: KeyStore, **kw: Any) -> GatewayConfig:
    return GatewayConfig(keys_db=store.path, port=0, key_refresh_s=0.2, **kw)


def hostport(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


async def read_until_closed(reader: asyncio.StreamReader, budget_s: float = 10.0) -> bytes:
    """Everything the server sends until it closes (bounded, so a held socket fails the test)."""
    out = b""
    with contextlib.suppress(ConnectionError):
        async with asyncio.timeout(budget_s):
            while chunk := await reader.read(65536):
                out += chunk
    return out


def status_of(raw: bytes) -> int:
    return int(raw.split(b" ", 2)[1]) if raw.startswith(b"HTTP/1.1 ") else 0


def body_of(raw: bytes) -> Any:
    return json.loads(raw.split(b"\r\n\r\n", 1)[1])


async def test_oversized_headers_get_431_and_the_connection_closes(store: KeyStore) -> None:
    async with serve_in_loop(config(store, max_header_bytes=4096)) as gw:
        host, port = hostport(gw.url)
        # Complete headers over the limit (they end within one read).
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 10_000 + b"\r\n\r\n")
        raw = await read_until_closed(reader)
        writer.close()
        assert status_of(raw) == 431 and "headers larger than 4096" in body_of(raw)["error"]["message"]
        # Headers that never end: 2 MiB offered, refused after the limit instead of buffered.
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: ")
        with contextlib.suppress(ConnectionError):
            for _ in range(32):
                writer.write(b"b" * 65536)
                await writer.drain()
        raw = await read_until_closed(reader)
        writer.close()
        assert status_of(raw) == 431
        assert gw.guard.refused[431] == 2


async def test_headers_must_arrive_in_time_and_idle_sockets_are_not_held(store: KeyStore) -> None:
    async with serve_in_loop(config(store, header_timeout_s=0.3, keepalive_timeout_s=1)) as gw:
        host, port = hostport(gw.url)
        # Connect and say nothing: before, held forever.
        reader, writer = await asyncio.open_connection(host, port)
        raw = await read_until_closed(reader)
        writer.close()
        assert status_of(raw) == 408
        # Half a request, then silence.
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n")
        raw = await read_until_closed(reader)
        writer.close()
        assert status_of(raw) == 408
        # A keep-alive connection after a response, kept busy with bytes that begin no request.
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        head = await reader.readuntil(b"\r\n\r\n")
        assert status_of(head) == 200
        writer.write(b"\r\n")
        await read_until_closed(reader)  # returns only once the server closed
        writer.close()


async def test_connections_per_client_are_capped(store: KeyStore) -> None:
    cfg = config(store, max_connections_per_client=3)
    async with serve_in_loop(cfg) as gw:
        host, port = hostport(gw.url)
        held = [await asyncio.open_connection(host, port) for _ in range(3)]
        reader, writer = await asyncio.open_connection(host, port)
        raw = await read_until_closed(reader)
        writer.close()
        assert status_of(raw) == 429 and b"retry-after: 1" in raw.lower()
        # One of the three goes away: a new connection is served again.
        held.pop()[1].close()
        for _ in range(100):
            if gw.guard.total < 3:
                break
            await asyncio.sleep(0.01)
        async with aiohttp.ClientSession() as s, s.get(f"{gw.url}/v1/models") as r:
            assert r.status == 401
            assert r.headers["Connection"] == "close"  # anonymous: no keep-alive to hold
        for _, w in held:
            w.close()


async def test_connections_in_all_are_capped(store: KeyStore) -> None:
    async with serve_in_loop(config(store, max_connections=2)) as gw:
        host, port = hostport(gw.url)
        held = [await asyncio.open_connection(host, port) for _ in range(2)]
        reader, writer = await asyncio.open_connection(host, port)
        raw = await read_until_closed(reader)
        writer.close()
        assert status_of(raw) == 503
        for _, w in held:
            w.close()


def test_connection_budget_follows_the_file_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resource, "getrlimit", lambda _which: (200, 4096))
    assert protocol.connection_budget(4096) == (200 - 64) // 2
    assert protocol.connection_budget(10) == 10
    # The control listener's connections never open an upstream one: one descriptor each.
    assert protocol.connection_budget(4096, control_connections=32) == (200 - 64 - 32) // 2
    unlimited = (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
    monkeypatch.setattr(resource, "getrlimit", lambda _which: unlimited)
    assert protocol.connection_budget(4096) == 4096


@pytest.fixture
async def upstream() -> AsyncIterator[SyntheticUpstream]:
    up = SyntheticUpstream(Shape(ttft_s=0.0, chunks=1, interval_s=0.0), model="served-name")
    await up.start()
    yield up
    await up.stop()


async def test_deep_nesting_is_a_json_400(store: KeyStore, key: str, upstream: SyntheticUpstream) -> None:
    cfg = config(store, upstream_url=upstream.url, served_model=upstream.model)
    body = b'{"model":"x","messages":' + b"[" * 50_000 + b"]" * 50_000 + b"}"
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    async with serve_in_loop(cfg) as gw, aiohttp.ClientSession() as s:
        async with s.post(f"{gw.url}/v1/chat/completions", data=body, headers=headers) as r:
            # Before: a plain-text 500 and a RecursionError traceback in the log.
            assert r.status == 400 and r.content_type == "application/json"
            assert "deeper than 128" in (await r.json())["error"]["message"]
        assert upstream.requests == []


async def test_large_bodies_are_inspected_off_the_event_loop(
    store: KeyStore, key: str, upstream: SyntheticUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The body is parsed once, where the model is read (``jsonbody.read_model``): that parse is the
    # one a large body must not do on the event loop.
    threads: list[str] = []
    real = jsonbody.read_model

    def recording(body: bytes, depth: int) -> jsonbody.ModelRef:
        threads.append(threading.current_thread().name)
        return real(body, depth)

    monkeypatch.setattr("controller.gateway.proxy.read_model", recording)
    cfg = config(store, upstream_url=upstream.url, served_model=upstream.model, inline_json_bytes=1024)
    big = {"messages": [{"role": "user", "content": "x" * 100 + str(i)} for i in range(5000)],
           "model": upstream.model}
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    async with serve_in_loop(cfg) as gw, aiohttp.ClientSession() as s:
        async with s.post(f"{gw.url}/v1/chat/completions", data=json.dumps(big), headers=headers) as r:
            assert r.status == 200
        async with s.post(f"{gw.url}/v1/chat/completions", json={"model": upstream.model},
                          headers=headers) as r:
            assert r.status == 200
    assert threads[0].startswith("gateway-body")  # the large one, in the body pool
    assert threads[1] == threading.main_thread().name  # the small one, inline
    sent = json.loads(upstream.requests[0].body)
    assert sent == {**big, "model": "served-name"}


# ------------------------------------------------------------------ low file limit, real process


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def low_fd_gateway(store: KeyStore) -> Iterator[str]:
    """``appliance gateway`` in its own process under a 160-descriptor soft limit."""
    port = _free_port()

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (160, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    store.snapshot(create=True)  # the file exists before the gateway starts (reads never create it)
    proc = subprocess.Popen(
        [sys.executable, "-m", "controller.cli.main", "gateway", "--listen", f"127.0.0.1:{port}",
         "--control-listen", "127.0.0.1:0", "--keys", str(store.path), "--header-timeout", "1",
         "--max-connections-per-client", "1000"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        preexec_fn=limit,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


async def test_idle_sockets_under_a_low_file_limit_do_not_stop_a_revoke(
    store: KeyStore, low_fd_gateway: str
) -> None:
    record, key = store.create("victim")
    headers = {"Authorization": f"Bearer {key}"}
    url = low_fd_gateway + "/v1/models"
    async with aiohttp.ClientSession() as s:
        for _ in range(300):  # wait for the process to listen
            with contextlib.suppress(aiohttp.ClientError):
                async with s.get(url, headers=headers) as r:
                    assert r.status == 503  # a valid key, no engine yet
                    break
            await asyncio.sleep(0.05)
        host, port = hostport(low_fd_gateway)
        # More idle sockets than the process has descriptors for.
        idle = []
        for _ in range(200):
            with contextlib.suppress(OSError):
                idle.append(await asyncio.open_connection(host, port))
        store.revoke(record.id)
        # The key store keeps being read (descriptors were kept for it), the idle sockets are cut
        # off after the header timeout, and the revoke takes effect. Before: EMFILE everywhere, the
        # store could not be reopened, and the revoked key went on working.
        answer = ""
        for _ in range(200):  # bounded: ~20 s
            with contextlib.suppress(aiohttp.ClientError):
                async with s.get(url, headers=headers) as r:
                    if r.status == 401:
                        answer = (await r.json())["error"]["message"]
                        break
            await asyncio.sleep(0.1)
        assert "revoked" in answer
        for _, w in idle:
            w.close()


async def test_the_gateway_process_keeps_its_start_up_heap_out_of_collection(low_fd_gateway: str) -> None:
    """Its own process freezes the start-up heap (``gc_pauses``: no full-heap pauses under load); a
    gateway inside a test process leaves that process's collector alone."""
    url = low_fd_gateway + "/metrics"
    async with aiohttp.ClientSession() as s:
        text = ""
        for _ in range(300):  # wait for the process to listen
            with contextlib.suppress(aiohttp.ClientError):
                async with s.get(url) as r:
                    text = await r.text()
                    break
            await asyncio.sleep(0.05)
    frozen = next(float(x.split()[-1]) for x in text.splitlines()
                  if x.startswith("appliance_gateway_gc_frozen_objects "))
    assert frozen > 10_000  # uvicorn, aiohttp, prometheus_client … (~90,000 measured)
    assert 'appliance_gateway_gc_pause_seconds_count{generation="2"}' in text
