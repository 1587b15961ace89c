"""A GPU fault under a real engine process: the supervisor over the real ProcessRuntime and the small
fake engine (tests/integration/test_process_runtime.py), the real GPU health link (its card read from
the H200 recording through the NVML seam), a kernel Xid line naming the engine's real pid, then the
engine killed. The death is diagnosed as a GPU fault naming the card and the event, is not relaunched,
and the next apply is refused on that card until the operator says it was reset.

Kernel records are handed to the link at its declared seam (`on_record`): writing a fake Xid into
this machine's real /dev/kmsg would reach every other controller following it. Waits are liveness
bounds, never thresholds.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from appliance.observe.gpu_health import ReplayQueries
from appliance.observe.kmsg import parse_record
from controller.metrics import ControllerMetrics
from controller.runtime.process import ProcessRuntime
from controller.store import Store
from controller.supervisor.driver import Driver, DriverConfig, SystemClock
from controller.supervisor.gpu_health_watch import GpuHealthLink, LaunchView
from controller.supervisor.machine import Policy, State
from controller.supervisor.signals import Apply
from controller.watch.gpu_health import HealthReader
from tests.integration.test_process_runtime import LIVENESS_S, fake_spec, ready_pids, wait_for_log
from tests.integration.test_supervision import AlwaysReady
from tests.unit.supervisor_helpers import FakePreflight, RecordingGateway
from tests.unit.test_gpu_health import h200_recording

pytestmark = pytest.mark.timeout(180)


async def _until(predicate: Callable[[], bool], what: str) -> None:
    async with asyncio.timeout(LIVENESS_S):
        while not predicate():
            await asyncio.sleep(0.01)
    assert predicate(), what


async def test_an_xid_79_under_a_real_engine_is_a_gpu_fault_and_not_relaunched(tmp_path: Path) -> None:
    rt = ProcessRuntime(tmp_path / "runs", orphan_grace_s=1.0, kill_wait_s=5.0)
    spec = fake_spec(env={"FAKE_ENGINE": "1", "CUDA_VISIBLE_DEVICES": "0"})
    store = Store(tmp_path / "launches.sqlite3")
    metrics = ControllerMetrics()
    link = GpuHealthLink(HealthReader(tmp_path, nvml=ReplayQueries(h200_recording())), metrics=metrics)
    driver = Driver(
        runtimes={"process": rt}, store=store, preflight=FakePreflight(spec), prober=AlwaysReady(),
        gateway=RecordingGateway(), clock=SystemClock(), policy=Policy(backoff_initial_s=3600),
        config=DriverConfig(probe_interval_s=0, oom_settle_s=0.2, exit_watch_s=LIVENESS_S),
        gpu_events=link.gpu_events, metrics=metrics,
    )

    def pids(launch_id: str) -> frozenset[int]:
        launch = driver.machine.launch
        handle = launch.handle if launch is not None and launch.launch_id == launch_id else None
        return frozenset(rt.engine_pids(handle)) if handle is not None else frozenset()

    link.view = LaunchView(launch=lambda: driver.machine.launch, pids=pids, note=driver.note)
    link.on_cards(link.reader.sample())
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

        # The driver's words for a card that fell off the bus under this engine (the recorded H200
        # sits at PCI 0000:00:06), with the engine's real pid, as newer drivers print it.
        record = parse_record(f"3,5001,123456789,-;NVRM: Xid (PCI:0000:00:06): 79, pid={main}, "
                              "name=python3, GPU has fallen off the bus.")
        assert record is not None
        link.on_record(record)
        assert [e.xid for e in link.gpu_events(launch.launch_id)] == [79]
        os.kill(main, signal.SIGKILL)
        await _until(lambda: driver.machine.state is State.FAILED, "the exit was classified, not retried")
        await driver.settle()
        diagnosis = driver.status()["last_diagnosis"]
        assert diagnosis["code"] == "gpu_fault" and not diagnosis["retryable"]
        assert "GPU 0: Xid 79" in diagnosis["summary"] and "drain the node" in diagnosis["hint"]
        kinds = [e.kind for e in store.events() if e.launch_id == launch.launch_id]
        assert "gpu-event" in kinds

        # The card is refused until the operator says it was reset.
        link.on_cards(link.reader.sample())
        assert [f.check for f in link.findings(frozenset({0}))] == ["fatal-event"]
        assert link.acknowledge_reset(0) == 1
        link.on_cards(link.reader.sample())
        assert link.findings(frozenset({0})) == []
    finally:
        await driver.shutdown()
        for handle in rt.adopt():
            rt.stop(handle, grace_s=5.0)
        store.close()
