"""A bounded soak of the real gateway process (the `appliance gateway` command): mixed streaming,
non-streaming and abandoned requests, then count the gateway's sockets to the upstream with psutil.
A leak shows up as connections beyond the pool's working set, or as CLOSE_WAIT sockets nobody reads."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import socket
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import psutil
import pytest

from bench.synthetic_upstream import Shape, SyntheticUpstream
from controller.gateway.keystore import KeyStore

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

REQUESTS = 600
CONCURRENCY = 16


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
async def upstream() -> AsyncIterator[SyntheticUpstream]:
    up = SyntheticUpstream(Shape(ttft_s=0.005, chunks=12, interval_s=0.002))
    await up.start()
    yield up
    await up.stop()


def upstream_sockets(proc: psutil.Process, port: int) -> Counter[str]:
    return Counter(c.status for c in proc.net_connections(kind="tcp") if c.raddr and c.raddr.port == port)


async def test_soak_leaks_no_upstream_connections(tmp_path: Path, upstream: SyntheticUpstream) -> None:
    store = KeyStore(tmp_path / "keys.db")
    _, key = store.create("soak")
    port = free_port()
    log = (tmp_path / "gateway.log").open("wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "controller.cli.main",
            "gateway",
            "--upstream",
            upstream.url,
            "--listen",
            f"127.0.0.1:{port}",
            "--control-listen",  # any free port: the default (port + 1) may be taken here
            "127.0.0.1:0",
            "--keys",
            str(store.path),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "APPLIANCE_HOME": str(tmp_path)},
    )
    base = f"http://127.0.0.1:{port}"
    headers = {"Authorization": f"Bearer {key}"}
    try:
        async with aiohttp.ClientSession() as s:
            for _ in range(200):  # start-up, bounded (20 s)
                try:
                    async with s.get(base + "/healthz") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientConnectionError:
                    pass
                await asyncio.sleep(0.1)
            gw = psutil.Process(proc.pid)
            rss_start = gw.memory_info().rss
            rng = random.Random(7)
            outcomes: Counter[str] = Counter()
            queue = list(range(REQUESTS))

            async def worker() -> None:
                while queue:
                    queue.pop()
                    kind = rng.choice(["stream", "stream", "plain", "abandon"])
                    body = {"stream": kind != "plain"}
                    if kind == "abandon":
                        # Leave mid-stream: the gateway must close its upstream request too.
                        async with (
                            aiohttp.ClientSession() as own,
                            own.post(base + "/v1/chat/completions", json=body, headers=headers) as r,
                        ):
                            await r.content.readany()
                        outcomes["abandon"] += 1
                        continue
                    async with s.post(base + "/v1/chat/completions", json=body, headers=headers) as r:
                        data = await r.read()
                        outcomes[f"{kind}:{r.status}"] += 1
                        if kind == "stream":
                            assert data.endswith(b"data: [DONE]\n\n")

            await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(CONCURRENCY))), 240)
            during = upstream_sockets(gw, upstream.port)
            assert outcomes["stream:200"] + outcomes["plain:200"] + outcomes["abandon"] == REQUESTS, outcomes
            # The pool never needs more connections than requests in flight.
            assert sum(during.values()) <= CONCURRENCY, during
            await asyncio.sleep(1.0)
            assert upstream_sockets(gw, upstream.port)["CLOSE_WAIT"] == 0
            # Idle pooled connections are dropped after the keep-alive (4 s): nothing is left over.
            for _ in range(100):
                if not upstream_sockets(gw, upstream.port) and upstream.open_connections == 0:
                    break
                await asyncio.sleep(0.1)
            left = upstream_sockets(gw, upstream.port)
            assert not left and upstream.open_connections == 0, (left, upstream.open_connections)
            rss_end = gw.memory_info().rss
            print(
                f"soak: {dict(outcomes)}; RSS {rss_start / 2**20:.1f} → {rss_end / 2**20:.1f} MiB; "
                f"upstream connections opened {upstream.total_connections}"
            )
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()
