"""A gateway process that restarts under a running controller forgets its slot (it keeps it in
memory only) and answers 503 to every client. The supervisor's driver must notice through the real
admin surface and send the upstream again. Real gateway on a real socket, restarted on the same
port; the engine is the synthetic upstream behind a fake runtime; the driver's time is a fake clock.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from bench.synthetic_upstream import Shape, SyntheticUpstream
from controller.gateway.auth import hash_admin_token
from controller.gateway.config import GatewayConfig
from controller.gateway.control import ControlGateway, GatewayUpstream
from controller.gateway.embedded import serve_in_loop
from controller.gateway.keystore import KeyStore
from controller.store import Store
from controller.supervisor.driver import Driver, DriverConfig
from controller.supervisor.gateway_link import GatewayError
from controller.supervisor.machine import State
from controller.supervisor.signals import Apply
from tests.unit.supervisor_helpers import FakeClock, FakePreflight, FakeProber, FakeRuntime, make_spec

ADMIN = "restart-admin-token"
pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def engine() -> AsyncIterator[SyntheticUpstream]:
    up = SyntheticUpstream(Shape(ttft_s=0.01, chunks=2, interval_s=0.001), model="smollm2")
    await up.start()
    yield up
    await up.stop()


async def _status(session: aiohttp.ClientSession, gateway_url: str, key: str) -> int:
    body = {"model": "smollm2", "max_tokens": 2}
    headers = {"Authorization": f"Bearer {key}"}
    async with session.post(f"{gateway_url}/v1/completions", json=body, headers=headers) as r:
        await r.read()
        return r.status


async def test_a_restarted_gateway_is_given_the_ready_engine_again(
    tmp_path: Path, engine: SyntheticUpstream
) -> None:
    keys = KeyStore(tmp_path / "keys.db")
    key = keys.create("tests")[1]
    cfg = GatewayConfig(keys_db=keys.path, port=0, admin_token_sha256=hash_admin_token(ADMIN),
                        key_refresh_s=0.2, graceful_shutdown_s=1.0)
    clock = FakeClock()
    runtime = FakeRuntime(clock)
    runtime.on_start = lambda e: setattr(e, "healthy", True)
    store = Store(tmp_path / "launches.sqlite3")
    spec = make_spec(port=engine.port)
    async with serve_in_loop(cfg) as gw1, aiohttp.ClientSession() as s:
        port = int(gw1.url.rsplit(":", 1)[1])
        link = ControlGateway(gw1.url, ADMIN)
        driver = Driver(
            runtimes={"process": runtime}, store=store, preflight=FakePreflight(spec),
            prober=FakeProber(runtime), gateway=link, clock=clock,
            config=DriverConfig(poll_interval_s=5, probe_interval_s=5, health_interval_s=5,
                                gateway_check_interval_s=10),
        )

        async def step(seconds: float = 5.0) -> None:
            await driver.step()
            await driver.settle()
            clock.t += seconds

        driver.submit(Apply("test-recipe"))
        for _ in range(10):
            await step()
            if driver.machine.state is State.READY:
                break
        assert driver.machine.state is State.READY
        await step()
        assert await link.current() == GatewayUpstream(engine.url, "smollm2")
        assert await _status(s, gw1.url, key) == 200

    # The gateway is down, then back on the same port with an empty slot: 503 to clients.
    with pytest.raises(GatewayError):
        await link.current()
    async with serve_in_loop(dataclasses.replace(cfg, port=port)) as gw2, aiohttp.ClientSession() as s:
        assert gw2.url == gw1.url
        assert await link.current() is None
        assert await _status(s, gw2.url, key) == 503
        for _ in range(4):  # within one check interval (10 s of the driver's clock)
            await step()
            if await link.current() is not None:
                break
        assert await link.current() == GatewayUpstream(engine.url, "smollm2")
        assert await _status(s, gw2.url, key) == 200
    kinds = [e.kind for e in store.events()]
    assert "gateway-upstream-restored" in kinds
    await driver.shutdown()
