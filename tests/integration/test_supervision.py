"""The supervisor over real processes: a death is known at once — from the runtime's own
notice, not the next poll — and the engine leaves the gateway before anything else happens; each
launch's engine gets a secret key through its environment only.

The driver runs against the real ProcessRuntime and the small fake engine; the gateway and prober
are recording fakes. No wall-clock thresholds: the driver's poll never runs after the engine is
ready, so only the exit watch can have noticed the death; waits are liveness bounds.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from appliance.engine_secret import KEY_FILE_NAME, key_from_config
from appliance.recipe.engine_key import ENGINE_KEY_ENV
from appliance.recipe.launch_spec import LaunchSpec
from controller.runtime.process import ProcessRuntime
from controller.store import Store
from controller.supervisor.driver import Driver, DriverConfig, SystemClock
from controller.supervisor.machine import Policy, State
from controller.supervisor.signals import Apply
from tests.integration.test_process_runtime import LIVENESS_S, fake_spec, ready_pids, wait_for_log
from tests.unit.supervisor_helpers import FakePreflight, RecordingGateway

pytestmark = pytest.mark.timeout(180)


class AlwaysReady:
    """Readiness is not what these tests are about: the engine is ready once it runs."""

    def __init__(self) -> None:
        self.keys: list[str | None] = []

    async def health(self, spec: LaunchSpec) -> str | None:
        return None

    async def completion(self, spec: LaunchSpec, api_key: str | None = None) -> str | None:
        self.keys.append(api_key)
        return None


async def _until(predicate: Callable[[], bool], what: str) -> None:
    async with asyncio.timeout(LIVENESS_S):
        while not predicate():
            await asyncio.sleep(0.01)
    assert predicate(), what


async def test_a_killed_engine_leaves_the_gateway_before_the_next_poll(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    rt = ProcessRuntime(runs, orphan_grace_s=1.0, kill_wait_s=5.0)
    env_dump = tmp_path / "engine-env.json"
    spec = fake_spec("--dump-env", str(env_dump))
    store = Store(tmp_path / "launches.sqlite3")
    gateway, prober = RecordingGateway(), AlwaysReady()
    driver = Driver(
        runtimes={"process": rt}, store=store, preflight=FakePreflight(spec), prober=prober,
        gateway=gateway, clock=SystemClock(), policy=Policy(backoff_initial_s=3600),
        config=DriverConfig(probe_interval_s=0, oom_settle_s=0, exit_watch_s=LIVENESS_S),
    )
    try:
        assert driver.submit(Apply("fake-engine")) is None
        async with asyncio.timeout(LIVENESS_S):
            while driver.machine.state is not State.READY:
                await driver.step()
                await driver.settle()
                await asyncio.sleep(0.02)
        launch = driver.machine.launch
        assert launch is not None and launch.handle is not None
        main, _ = ready_pids(wait_for_log(rt, launch.handle, r"READY"))
        await _until(lambda: ("point_to", "http://127.0.0.1:1") in gateway.calls, "the gateway has it")

        # The engine's own door: one key, in its 0600 key file only (never the environment,
        # which vLLM 0.26.0 hashes into its compile key), known to probe and gateway.
        assert ENGINE_KEY_ENV not in json.loads(env_dump.read_text())
        key_file = runs / launch.launch_id / KEY_FILE_NAME
        assert key_file.stat().st_mode & 0o777 == 0o600
        key = key_from_config(key_file.read_text())
        assert key is not None
        assert key.startswith("eng_") and prober.keys[-1] == key and gateway.keys[-1] == key
        assert key not in " ".join(psutil.Process(int(launch.handle.ref)).cmdline())
        assert key not in " ".join(psutil.Process(main).cmdline())
        for path in (runs / launch.launch_id).iterdir():
            if path.name != KEY_FILE_NAME:
                assert key not in path.read_text(errors="replace"), path
        assert key not in json.dumps(driver.status())

        calls_before = len(gateway.calls)
        os.kill(main, signal.SIGKILL)
        # No step() from here on: only the exit watch can notice.
        await _until(lambda: len(gateway.calls) > calls_before, "the gateway was told about the death")
        assert gateway.calls[calls_before][0] == "clear"  # first word after the death: no upstream
        await _until(lambda: driver.machine.state is State.BACKOFF, "the exit was classified")
        await driver.settle()
        status = driver.status()
        assert status["state"] == "backoff"
        assert status["last_diagnosis"]["code"] == "killed_by_signal"
        kinds = [e.kind for e in store.events() if e.launch_id == launch.launch_id]
        assert kinds.index("exit-seen") < kinds.index("exited")
        with sqlite3.connect(tmp_path / "launches.sqlite3") as db:  # nor in any record
            dump = "\n".join(str(row) for table in ("launches", "events")
                             for row in db.execute(f"SELECT * FROM {table}"))
        assert key not in dump
    finally:
        await driver.shutdown()
        for handle in rt.adopt():
            rt.stop(handle, grace_s=5.0)
        store.close()


async def test_an_exited_state_is_what_status_says_while_the_exit_is_classified(tmp_path: Path) -> None:
    """Between the death and its classification (the OOM settle), status says `exited`, not ready."""
    runs = tmp_path / "runs"
    rt = ProcessRuntime(runs, orphan_grace_s=1.0, kill_wait_s=5.0)
    store = Store(tmp_path / "launches.sqlite3")
    gateway = RecordingGateway()
    driver = Driver(
        runtimes={"process": rt}, store=store, preflight=FakePreflight(fake_spec()), prober=AlwaysReady(),
        gateway=gateway, clock=SystemClock(), policy=Policy(backoff_initial_s=3600),
        # A settle longer than the test: the classification never comes while we look.
        config=DriverConfig(probe_interval_s=0, oom_settle_s=3600, exit_watch_s=LIVENESS_S),
    )
    try:
        driver.submit(Apply("fake-engine"))
        async with asyncio.timeout(LIVENESS_S):
            while driver.machine.state is not State.READY:
                await driver.step()
                await driver.settle()
                await asyncio.sleep(0.02)
        launch = driver.machine.launch
        assert launch is not None and launch.handle is not None
        main, _ = ready_pids(wait_for_log(rt, launch.handle, r"READY"))
        os.kill(main, signal.SIGKILL)
        await _until(lambda: driver.machine.state is State.EXITED, "the death was noticed")
        status = driver.status()
        assert status["state"] == "exited"
        assert status["launch"]["exit"] == {"exit_code": 137, "signal": 9, "oom_killed": None}
        assert gateway.upstream is None
    finally:
        await driver.shutdown()
        for handle in rt.adopt():
            rt.stop(handle, grace_s=5.0)
        store.close()
