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
        "model": "any-alias",
        "messages": PROMPT,
        "stream": True,
        "temperature": 0,
        "max_tokens": 32,
        "seed": 0,
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
    assert via_gateway == bytes(tee.received[rid]), "client bytes differ from the bytes the engine sent"
    assert via_gateway.endswith(b"data: [DONE]\n\n")
    assert _content(via_gateway) == _content(direct) and "Paris" in _content(direct)


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
