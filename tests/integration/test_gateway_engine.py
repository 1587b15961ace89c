"""The gateway in front of the REAL CPU vLLM engine (smollm2, installed by `appliance engine setup`).

Proves against the engine what the synthetic tests prove against a fake: the client receives
byte for byte what the engine sent (the gateway's tee records what it received upstream), outputs
through the gateway equal direct outputs at temperature 0, and a client leaving mid-stream makes
the engine abort the generation. Skips with the reason when the engine env or model is absent.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from controller.gateway.config import GatewayConfig
from controller.gateway.embedded import RunningGateway, serve_in_loop
from controller.gateway.keystore import KeyStore
from controller.settings import paths

pytestmark = [pytest.mark.engine, pytest.mark.slow, pytest.mark.timeout(900)]

MODEL_DIR = paths().models / "smollm2-135m-instruct"
SERVED = "smollm2"
READY_BUDGET_S = 600  # cold start is ~90 s alone; the machine is shared


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    python = paths().engine_python
    if not python.exists():
        pytest.skip(f"engine env absent ({python}); run `appliance engine setup`")
    if not (MODEL_DIR / "config.json").exists():
        pytest.skip(f"model absent ({MODEL_DIR}); run `appliance engine setup`")
    port = _free_port()
    log_path = tmp_path_factory.mktemp("engine") / "engine.log"
    log = log_path.open("wb")
    proc = subprocess.Popen(
        [
            str(python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(MODEL_DIR),
            "--served-model-name",
            SERVED,
            "--max-model-len",
            "2048",
            "--dtype",
            "bfloat16",
            # The gateway is the subject, not compilation: eager skips a cold torch.compile into
            # vLLM's default cache (235 s of this module's setup on the CI machine).
            "--enforce-eager",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + READY_BUDGET_S
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"engine exited with {proc.returncode}: {log_path.read_text()[-3000:]}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    pass
                import urllib.request

                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            time.sleep(1)
        else:
            pytest.fail(f"engine not ready in {READY_BUDGET_S} s: {log_path.read_text()[-3000:]}")
        yield url
    finally:
        # The engine forks an EngineCore child into its session: stop the group we started, by id.
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        except ProcessLookupError:
            pass
        log.close()


class Tee:
    def __init__(self) -> None:
        self.received: dict[str, bytearray] = {}

    def __call__(self, rid: bytes, chunk: bytes) -> None:
        self.received.setdefault(rid.decode(), bytearray()).extend(chunk)


@pytest.fixture
async def gateway(engine: str, tmp_path: Path) -> AsyncIterator[tuple[RunningGateway, Tee, str]]:
    store = KeyStore(tmp_path / "keys.db")
    _, key = store.create("engine-test")
    tee = Tee()
    cfg = GatewayConfig(keys_db=store.path, port=0, upstream_url=engine, served_model=SERVED)
    async with serve_in_loop(cfg, tee=tee) as gw:
        yield gw, tee, key


PROMPT = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]


def _content(sse: bytes) -> str:
    text = []
    for line in sse.split(b"\n"):
        if line.startswith(b"data: ") and line != b"data: [DONE]":
            for choice in json.loads(line[6:])["choices"]:
                text.append(choice["delta"].get("content") or "")
    return "".join(text)


async def test_stream_byte_identical_and_equal_to_direct(
    gateway: tuple[RunningGateway, Tee, str], engine: str
) -> None:
    gw, tee, key = gateway
    body: dict[str, Any] = {
        "model": SERVED,  # the gateway answers 404 for a name it does not serve
        "messages": PROMPT,
        "stream": True,
        "temperature": 0,
        "max_tokens": 32,
        "seed": 0,
        # What the gateway asks the engine for anyway (for usage): then nothing is removed.
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    async with aiohttp.ClientSession() as s:
        async with s.post(
            gw.url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
        ) as r:
            assert r.status == 200, await r.text()
            via_gateway = await r.read()
            rid = r.headers["X-Request-Id"]
        async with s.post(engine + "/v1/chat/completions", json={**body, "model": SERVED}) as r:
            assert r.status == 200
            direct = await r.read()
        # A client that asks for no usage gets none, though the engine sent it to the gateway.
        plain_body = {k: v for k, v in body.items() if k != "stream_options"}
        async with s.post(
            gw.url + "/v1/chat/completions", json=plain_body, headers={"Authorization": f"Bearer {key}"}
        ) as r:
            plain = await r.read()
            plain_rid = r.headers["X-Request-Id"]
    assert via_gateway == bytes(tee.received[rid]), "client bytes differ from the bytes the engine sent"
    assert via_gateway.endswith(b"data: [DONE]\n\n")
    assert _content(via_gateway) == _content(direct) and "Paris" in _content(direct)
    engine_sent = _events(bytes(tee.received[plain_rid]))
    assert all("usage" in e for e in engine_sent if e is not None)
    assert _events(plain) == [
        None if e is None else {k: v for k, v in e.items() if k != "usage"}
        for e in engine_sent if e is None or e["choices"]
    ]
    assert b'"usage"' not in plain and _content(plain) == _content(direct)


def _events(sse: bytes) -> list[dict[str, Any] | None]:
    """The stream's events as JSON (None for [DONE]), member order kept."""
    out: list[dict[str, Any] | None] = []
    for event in sse.split(b"\n\n"):
        if event.startswith(b"data: "):
            out.append(None if event == b"data: [DONE]" else json.loads(event[6:]))
    return out


async def test_non_streaming_equal_to_direct(gateway: tuple[RunningGateway, Tee, str], engine: str) -> None:
    gw, _, key = gateway
    body = {"model": SERVED, "messages": PROMPT, "temperature": 0, "max_tokens": 32}
    async with aiohttp.ClientSession() as s:
        async with s.post(
            gw.url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
        ) as r:
            assert r.status == 200
            via = await r.json()
        async with s.post(engine + "/v1/chat/completions", json=body) as r:
            direct = await r.json()
        async with s.get(gw.url + "/v1/models", headers={"Authorization": f"Bearer {key}"}) as r:
            assert [m["id"] for m in (await r.json())["data"]] == [SERVED]
    assert via["choices"][0]["message"]["content"] == direct["choices"][0]["message"]["content"]


async def _running(s: aiohttp.ClientSession, engine: str) -> float:
    async with s.get(engine + "/metrics") as r:
        for line in (await r.text()).splitlines():
            if line.startswith("vllm:num_requests_running"):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError("engine /metrics has no vllm:num_requests_running")


async def test_client_disconnect_aborts_engine_generation(
    gateway: tuple[RunningGateway, Tee, str], engine: str
) -> None:
    gw, _, key = gateway
    body = {
        "model": SERVED,
        "stream": True,
        "max_tokens": 1800,
        "temperature": 0.8,
        "ignore_eos": True,
        "messages": [{"role": "user", "content": "Write a very long story."}],
    }
    async with aiohttp.ClientSession() as s:
        client = aiohttp.ClientSession()
        r = await client.post(
            gw.url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
        )
        assert r.status == 200
        await r.content.readany()
        assert await _running(s, engine) >= 1
        r.close()
        await client.close()  # the client is gone mid-stream
        for _ in range(100):  # bounded: 10 s, far less than the 1800-token generation
            if await _running(s, engine) == 0:
                break
            await asyncio.sleep(0.1)
        assert await _running(s, engine) == 0, "engine kept generating after the client left"


async def _engine_gauge_and_tokens(s: aiohttp.ClientSession, engine: str) -> dict[str, float]:
    wanted = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:prompt_tokens_total",
              "vllm:generation_tokens_total")
    out: dict[str, float] = {}
    async with s.get(engine + "/metrics") as r:
        for line in (await r.text()).splitlines():
            name = line.split("{", 1)[0]
            if name in wanted:
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    assert set(out) == set(wanted), f"engine /metrics lacks {set(wanted) - set(out)}"
    return out


async def _engine_idle(s: aiohttp.ClientSession, engine: str) -> dict[str, float]:
    for _ in range(200):  # bounded: 20 s
        m = await _engine_gauge_and_tokens(s, engine)
        if m["vllm:num_requests_running"] == 0 and m["vllm:num_requests_waiting"] == 0:
            return m
        await asyncio.sleep(0.1)
    raise AssertionError("engine still busy after 20 s")


async def test_usage_per_key_equals_the_engines_token_counters(engine: str, tmp_path: Path) -> None:
    """A mixed load of two keys (non-streamed, streamed with and without usage asked, completions,
    streams the client abandons mid-generation): the per-key usage the gateway stored, summed, is the
    engine's own prompt and generation token counters' increase over the same interval."""
    from controller.gateway.usage.store import UsageStore

    store = KeyStore(tmp_path / "keys.db")
    rec_a, key_a = store.create("a")
    rec_b, key_b = store.create("b")
    cfg = GatewayConfig(keys_db=store.path, port=0, upstream_url=engine, served_model=SERVED,
                        usage_flush_s=0.2)
    cut_after = 4  # events read before a client leaves

    async def plain(s: aiohttp.ClientSession, key: str, max_tokens: int) -> None:
        body = {"model": SERVED, "messages": PROMPT, "max_tokens": max_tokens}
        async with s.post(gw.url + "/v1/chat/completions", json=body,
                          headers={"Authorization": f"Bearer {key}"}) as r:
            assert r.status == 200
            await r.read()

    async def stream(s: aiohttp.ClientSession, key: str, route: str, extra: dict[str, Any]) -> None:
        body = {"model": SERVED, "stream": True, "max_tokens": 24, **extra}
        async with s.post(gw.url + route, json=body, headers={"Authorization": f"Bearer {key}"}) as r:
            assert r.status == 200
            assert (await r.read()).endswith(b"data: [DONE]\n\n")

    async def abandoned(key: str) -> None:
        body = {"model": SERVED, "stream": True, "max_tokens": 1500, "ignore_eos": True,
                "temperature": 0.8, "messages": [{"role": "user", "content": "Write a very long story."}]}
        client = aiohttp.ClientSession()
        try:
            r = await client.post(gw.url + "/v1/chat/completions", json=body,
                                  headers={"Authorization": f"Bearer {key}"})
            assert r.status == 200
            seen = 0
            while seen < cut_after:
                seen += (await r.content.readany()).count(b"data: ")
            r.close()  # gone mid-generation
        finally:
            await client.close()

    async with serve_in_loop(cfg) as gw, aiohttp.ClientSession() as s:
        before = await _engine_idle(s, engine)
        await asyncio.gather(
            plain(s, key_a, 8),
            plain(s, key_a, 20),
            stream(s, key_b, "/v1/chat/completions", {"messages": PROMPT}),
            stream(s, key_b, "/v1/chat/completions",
                   {"messages": PROMPT, "stream_options": {"include_usage": True}}),
            stream(s, key_a, "/v1/completions", {"prompt": "The capital of France is"}),
            abandoned(key_a),
            abandoned(key_b),
        )
        after = await _engine_idle(s, engine)
        await gw.app.accounting.flush()
    rows = {r.key_id: r for r in UsageStore(tmp_path / "usage.sqlite3").query()}
    assert set(rows) == {rec_a.id, rec_b.id}
    assert (rows[rec_a.id].requests, rows[rec_a.id].errors) == (4, 1)  # the abandoned stream: 499
    assert (rows[rec_b.id].requests, rows[rec_b.id].errors) == (3, 1)
    engine_prompt = after["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"]
    engine_generation = after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
    assert engine_generation > 2 * cut_after  # the abandoned streams did generate
    assert sum(r.prompt_tokens for r in rows.values()) == engine_prompt
    assert sum(r.completion_tokens for r in rows.values()) == engine_generation
