"""Planned switches that clients do not notice: the real gateway on a real socket holds new requests
while the supervisor's driver restarts the engine, and releases them to the new one; a switch that
fails answers them with its reason; a hold nobody renews (the controller died) ends in a 503, never a
hang; a full hold queue answers 503 at once. The engine is the synthetic upstream behind a fake
runtime and the driver's time a fake clock (the real CPU engine: test_hold_engine.py). Assertions are
counts of failed requests and the words clients get, never timings.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from bench.synthetic_upstream import Shape, SyntheticUpstream
from controller.gateway.auth import hash_admin_token
from controller.gateway.config import GatewayConfig
from controller.gateway.control import ControlGateway, set_upstream
from controller.gateway.embedded import serve_in_loop
from controller.gateway.hold.queue import HoldPlan, Outcome
from controller.gateway.keystore import KeyStore
from controller.store import Store
from controller.supervisor.driver import Driver, DriverConfig
from controller.supervisor.machine import State
from controller.supervisor.signals import Apply, Restart
from tests.unit.supervisor_helpers import FakeClock, FakePreflight, FakeProber, FakeRuntime, make_spec

ADMIN = "hold-admin-token"
pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def engine() -> AsyncIterator[SyntheticUpstream]:
    up = SyntheticUpstream(Shape(ttft_s=0.01, chunks=3, interval_s=0.001), model="smollm2")
    await up.start()
    yield up
    await up.stop()


def _config(tmp_path: Path, **kw: object) -> tuple[GatewayConfig, str]:
    keys = KeyStore(tmp_path / "keys.db")
    key = keys.create("tests")[1]
    cfg = GatewayConfig(keys_db=keys.path, port=0, admin_token_sha256=hash_admin_token(ADMIN),
                        key_refresh_s=0.2, graceful_shutdown_s=1.0, hold_tick_s=0.1)
    return dataclasses.replace(cfg, **kw), key  # type: ignore[arg-type]


async def _request(session: aiohttp.ClientSession, url: str, key: str, stream: bool) -> tuple[int, str]:
    body = {"model": "smollm2", "max_tokens": 3, "stream": stream}
    async with session.post(f"{url}/v1/completions", json=body,
                            headers={"Authorization": f"Bearer {key}"}) as r:
        return r.status, (await r.read()).decode()


class Switch:
    """The driver behind the real gateway, stepped by hand on a fake clock."""

    def __init__(self, tmp_path: Path, gateway_url: str, engine: SyntheticUpstream) -> None:
        self.clock = FakeClock()
        self.runtime = FakeRuntime(self.clock)
        self.runtime.on_start = lambda e: setattr(e, "healthy", True)
        self.preflight = FakePreflight(make_spec(port=engine.port))
        self.store = Store(tmp_path / "launches.sqlite3")
        self.driver = Driver(
            runtimes={"process": self.runtime}, store=self.store, preflight=self.preflight,
            prober=FakeProber(self.runtime), gateway=ControlGateway(gateway_url, ADMIN), clock=self.clock,
            config=DriverConfig(poll_interval_s=5, probe_interval_s=5, health_interval_s=5,
                                gateway_check_interval_s=10),
        )

    async def step(self, seconds: float = 5.0) -> None:
        await self.driver.step()
        await self.driver.settle()
        self.clock.t += seconds

    async def until(self, state: State, steps: int = 12) -> None:
        for _ in range(steps):
            if self.driver.machine.state is state:
                return
            await self.step()
        assert self.driver.machine.state is state


async def _held(app_hold_waiting: object, n: int) -> None:
    for _ in range(500):
        if callable(app_hold_waiting) and app_hold_waiting() >= n:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{n} requests were never held")


async def test_a_restart_is_held_across_and_no_request_fails(
    tmp_path: Path, engine: SyntheticUpstream
) -> None:
    cfg, key = _config(tmp_path)
    async with serve_in_loop(cfg) as gw, aiohttp.ClientSession() as s:
        sw = Switch(tmp_path, gw.url, engine)
        sw.driver.submit(Apply("test-recipe"))
        await sw.until(State.READY)
        await sw.step()
        assert (await _request(s, gw.url, key, False))[0] == 200

        sw.runtime.on_start = None  # the new engine takes a while
        assert sw.driver.submit(Restart()) is None
        await sw.until(State.STARTING)
        assert gw.app.hold.holding()
        held = [asyncio.create_task(_request(s, gw.url, key, stream))
                for stream in (False, True, False, True)]
        await _held(lambda: gw.app.hold.waiting, 4)
        await asyncio.sleep(0.3)  # a few comment lines for the streaming ones
        sw.runtime.current().healthy = True
        await sw.until(State.READY)
        answers = await asyncio.gather(*held)

    failed = [a for a in answers if a[0] != 200]
    assert failed == []
    for _status, text in answers[1::2]:  # the streaming ones: told why they wait, then the stream
        assert text.startswith(": waiting for the engine (restart)"), text[:200]
        assert "data: [DONE]" in text
    kinds = [e.kind for e in sw.store.events()]
    assert "switch-path" in kinds and "drained" in kinds
    assert gw.app.hold.outcomes[Outcome.RELEASED] == 4
    await sw.driver.shutdown()


async def test_a_switch_that_fails_answers_held_requests_with_its_reason(
    tmp_path: Path, engine: SyntheticUpstream
) -> None:
    cfg, key = _config(tmp_path)
    async with serve_in_loop(cfg) as gw, aiohttp.ClientSession() as s:
        sw = Switch(tmp_path, gw.url, engine)
        sw.driver.submit(Apply("test-recipe"))
        await sw.until(State.READY)
        await sw.step()
        sw.runtime.on_start = None
        sw.driver.submit(Restart())
        await sw.until(State.STARTING)
        held = [asyncio.create_task(_request(s, gw.url, key, stream)) for stream in (False, True)]
        await _held(lambda: gw.app.hold.waiting, 2)
        # The new engine dies, not for a retry: the switch has failed for good.
        sw.preflight.refuse = "not enough memory for this recipe beside the host's other work"
        sw.runtime.current().die(exit_code=1)
        await sw.until(State.BACKOFF)
        for _ in range(20):
            if sw.driver.machine.state is State.FAILED:
                break
            await sw.step(30)
        assert sw.driver.machine.state is State.FAILED
        (plain_status, plain), (stream_status, stream) = await asyncio.gather(*held)
    assert plain_status == 503
    reason = json.loads(plain)["error"]["message"]
    assert "not enough memory for this recipe" in reason
    assert stream_status == 200 and stream.startswith(": waiting for the engine")
    assert '"code": 503' in stream and "not enough memory for this recipe" in stream
    await sw.driver.shutdown()


async def test_a_hold_nobody_renews_ends_in_503_and_a_full_queue_refuses_at_once(
    tmp_path: Path, engine: SyntheticUpstream
) -> None:
    cfg, key = _config(tmp_path, hold_max=2)
    async with serve_in_loop(cfg) as gw, aiohttp.ClientSession() as s:
        await set_upstream(gw.url, ADMIN, engine.url, "smollm2")
        # The controller begins a hold, then dies: nobody renews it and nobody points the slot again.
        await set_upstream(gw.url, ADMIN, None, None, drain_deadline_s=0.0,
                           hold=HoldPlan("restart", wait_s=1.0, expected_ready_s=30.0))
        held = [asyncio.create_task(_request(s, gw.url, key, False)) for _ in range(2)]
        await _held(lambda: gw.app.hold.waiting, 2)
        status, text = await _request(s, gw.url, key, False)  # the queue is full
        assert status == 503 and "queue is full (2 requests)" in text
        answers = await asyncio.gather(*held)
        assert [a[0] for a in answers] == [503, 503]
        assert "no engine became ready within 1 s" in answers[0][1]
        assert not gw.app.hold.holding()
        status, text = await _request(s, gw.url, key, False)  # no hold any more: 503 at once
        assert status == 503
