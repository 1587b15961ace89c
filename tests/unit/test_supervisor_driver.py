"""The async driver with a fake runtime, a fake clock, a fake prober and a fake preflight.

Fakes sit only at the declared seams (Runtime, Clock, Prober, GatewayLink, preflight); the store
is the real SQLite store in a temporary directory, the log parser and the diagnosis are the real
pure modules. A 40-minute start runs in milliseconds because time is the fake clock's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from appliance.diagnosis.scan import oom_events_in_text
from appliance.diagnosis.signatures import DiagnosisCode
from appliance.observe.kmsg import OomEvent
from appliance.recipe.launch_spec import LaunchSpec
from controller.runtime.base import EngineHandle, EngineRuntimeError, ExitInfo, Provenance
from controller.store import Store
from controller.supervisor.compile_cache import launch_factors
from controller.supervisor.driver import Driver, DriverConfig
from controller.supervisor.gateway_link import GatewayUpstream
from controller.supervisor.host_seams import BesideFn, SpecForRecipe
from controller.supervisor.machine import Policy, State
from controller.supervisor.signals import Apply, PreflightFailed, PreflightOk, Reject, Stop
from tests.unit.supervisor_helpers import (
    FakeClock,
    FakeEngine,
    FakePreflight,
    FakeProber,
    FakeRuntime,
    RecordingGateway,
    make_spec,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


@dataclass
class Rig:
    clock: FakeClock
    runtime: FakeRuntime
    store: Store
    preflight: FakePreflight
    gateway: RecordingGateway
    driver: Driver
    ooms: dict[str, list[OomEvent]]

    async def step(self, seconds: float = 10.0) -> None:
        await self.driver.step()
        await self.driver.settle()
        self.clock.t += seconds

    async def run_until(self, predicate: Callable[[], bool], limit_s: float, each: float = 10.0) -> float:
        start = self.clock.t
        while not predicate():
            state = self.driver.machine.state
            assert self.clock.t - start <= limit_s, f"not reached in {limit_s} s; state {state}"
            await self.step(each)
        return self.clock.t - start


def make_rig(tmp_path: Path, spec: LaunchSpec | None = None, policy: Policy | None = None,
             warm_restart: bool = False, spec_for_recipe: SpecForRecipe | None = None,
             beside: BesideFn | None = None, scrape_targets: Path | None = None) -> Rig:
    """`spec_for_recipe`, `beside`: the host's seams of those names (controller/supervisor/host_seams.py)."""
    clock = FakeClock()
    runtime = FakeRuntime(clock)
    store = Store(tmp_path / "launches.sqlite3")
    preflight = FakePreflight(spec or make_spec(), warm_restart)
    gateway = RecordingGateway()
    ooms: dict[str, list[OomEvent]] = {}
    driver = Driver(
        runtimes={"process": runtime}, store=store, preflight=preflight, prober=FakeProber(runtime),
        gateway=gateway, clock=clock, policy=policy or Policy(),
        # The exit-watch thread is tested on its own (real time); here the poll alone sees exits.
        config=DriverConfig(poll_interval_s=10, probe_interval_s=10, health_interval_s=10, oom_settle_s=0.5,
                            watch_exits=False),
        oom_events=lambda launch_id: ooms.get(launch_id, []), spec_for_recipe=spec_for_recipe,
        beside=beside, scrape_targets=scrape_targets,
    )
    return Rig(clock, runtime, store, preflight, gateway, driver, ooms)


async def test_a_40_minute_start_is_followed_through_its_phases_to_ready(tmp_path: Path) -> None:
    rig = make_rig(tmp_path, make_spec(budget=2700, stall=600))
    assert rig.driver.submit(Apply("test-recipe")) is None
    await rig.step(1)
    engine = rig.runtime.current()
    script = {
        30: "INFO Loading weights took 12.50 seconds\n",
        200: "INFO torch.compile takes 88.24 s in total\n",
        300: "INFO Available KV cache memory: 16.99 GiB\n",
        # Graph capture round 2 logs nothing for ~17 min (DOMAIN §4): only the CPU shows the work.
        400: "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 38%|███ | 19/51 [00:10<00:20]\r",
        2390: "INFO Application startup complete.\n",
    }
    elapsed = 0
    while rig.driver.machine.state is not State.READY:
        assert elapsed <= 2700
        if elapsed in script:
            engine.log += script[elapsed]
        engine.cpu += 8.0
        engine.healthy = elapsed >= 2400
        await rig.step(10)
        elapsed += 10
    assert 2400 <= elapsed <= 2420
    assert len(rig.runtime.started) == 1 and rig.runtime.stopped == []
    rec = rig.store.get_launch("L1")
    assert rec is not None and rec.status == "ready"
    assert rec.ready_s is not None and 2390 <= rec.ready_s <= 2420
    names = [p.name for p in rec.phases]
    assert names[:3] == ["weights_loaded", "compile_finished", "kv_cache"]
    assert "graph_capture" in names and "api_up" in names
    assert ("point_to", "http://127.0.0.1:18000") in rig.gateway.calls
    status = rig.driver.status()
    assert status["state"] == "ready" and status["launch"]["ready_s"] is not None


async def test_a_stall_is_diagnosed_recorded_and_relaunched_after_10_s(tmp_path: Path) -> None:
    rig = make_rig(tmp_path, make_spec(budget=2700, stall=120))
    rig.driver.submit(Apply("test-recipe"))
    await rig.step(1)
    engine = rig.runtime.current()
    engine.log = "INFO Loading weights took 0.82 seconds\n"
    engine.cpu = 3.0
    await rig.run_until(lambda: rig.driver.machine.state is State.BACKOFF, limit_s=200)
    assert rig.runtime.stopped == ["L1"]
    rec = rig.store.get_launch("L1")
    assert rec is not None and rec.status == "failed"
    assert rec.diagnosis is not None and rec.diagnosis["code"] == "stalled"
    assert "weights loaded" in rec.diagnosis["summary"]
    assert rec.log_tail is not None and "Loading weights" in rec.log_tail
    assert rig.driver.status()["last_diagnosis"]["code"] == "stalled"
    backoffs = [e for e in rig.store.events() if e.kind == "backoff"]
    assert [e.data["delay_s"] for e in backoffs] == [10]
    await rig.run_until(lambda: len(rig.runtime.started) == 2, limit_s=20, each=5)


async def test_a_crash_loop_backs_off_10s_doubling_then_fails_with_the_diagnosis(tmp_path: Path) -> None:
    rig = make_rig(tmp_path, policy=Policy(max_failures=5))

    def crash(engine: FakeEngine) -> None:
        engine.log = "INFO Loading weights took 0.82 seconds\nKilled\n"
        engine.die(signal=9)

    rig.runtime.on_start = crash
    rig.driver.submit(Apply("test-recipe"))
    await rig.run_until(lambda: rig.driver.machine.state is State.FAILED, limit_s=600, each=1)
    starts = [t for _, t in rig.runtime.started]
    assert len(starts) == 5
    gaps = [round(b - a) for a, b in itertools.pairwise(starts)]
    # Each gap = the backoff delay + the one-step detection and OOM settle time.
    assert [g - gaps[0] + 10 for g in gaps] == [10, 20, 40, 80]
    launches = rig.store.list_launches()
    assert len(launches) == 5 and all(s.diagnosis_code == "killed_by_signal" for s in launches)
    assert all(s.exit_signal == 9 for s in launches)
    status = rig.driver.status()
    assert status["state"] == "failed" and status["last_diagnosis"]["code"] == "killed_by_signal"
    assert ("clear", 10.0) in rig.gateway.calls


async def test_failure_count_resets_only_after_ready_and_stable(tmp_path: Path) -> None:
    rig = make_rig(tmp_path, policy=Policy(stable_window_s=600, max_failures=10))
    rig.runtime.on_start = lambda e: setattr(e, "healthy", True)
    rig.driver.submit(Apply("test-recipe"))
    await rig.run_until(lambda: rig.driver.machine.state is State.READY, limit_s=60)
    rig.runtime.current().die(signal=9)
    await rig.run_until(
        lambda: rig.driver.machine.state is State.READY and len(rig.runtime.started) == 2, 120
    )
    assert rig.driver.machine.failures == 1
    # Ready, but crashes 5 minutes later: not stable, the next delay doubles.
    for _ in range(30):
        await rig.step(10)
    rig.runtime.current().die(signal=9)
    await rig.run_until(lambda: rig.driver.machine.state is State.BACKOFF, 30)
    assert rig.driver.machine.failures == 2
    backoff_until = rig.driver.machine.backoff_until
    assert backoff_until is not None and backoff_until - rig.clock.t >= 10
    await rig.run_until(lambda: rig.driver.machine.state is State.READY, 120)
    # Stable for the window: reset; the next crash backs off 10 s again.
    for _ in range(61):
        await rig.step(10)
    assert rig.driver.machine.failures == 0
    rig.runtime.current().die(signal=9)
    await rig.run_until(lambda: rig.driver.machine.state is State.BACKOFF, 30)
    assert rig.driver.machine.failures == 1


async def test_a_restarted_controller_adopts_the_running_engine_not_restarts_it(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    spec = make_spec()
    handle = EngineHandle(launch_id="Lrunning", runtime="process", ref="777", recipe="test-recipe",
                          spec_hash=spec.spec_hash, started_at=rig.clock.t - 3600)
    rig.runtime.engines["Lrunning"] = FakeEngine(handle, log="INFO Application startup complete.\n",
                                                 healthy=True)
    rig.store.create_launch("Lrunning", spec, "normal", Provenance(), rig.clock.t - 3600)
    rig.store.set_handle("Lrunning", handle, rig.clock.t - 3600)
    rig.store.mark_ready("Lrunning", rig.clock.t - 3500, 100.0)

    await rig.driver.adopt()
    assert rig.driver.machine.state is State.STARTING
    await rig.step()
    assert rig.driver.machine.state is State.READY
    assert rig.runtime.started == [] and rig.runtime.stopped == []
    assert rig.preflight.calls == 0
    assert ("point_to", "http://127.0.0.1:18000") in rig.gateway.calls
    rec = rig.store.get_launch("Lrunning")
    assert rec is not None and any(e.kind == "adopted" for e in rec.events)
    # The replayed log rebuilt the phase picture without recording the phases twice.
    assert rig.driver.status()["launch"]["phase"] == "api_up" and rec.phases == []
    # Its ready time is the one recorded at its real start, not "now minus its start".
    assert rig.driver.status()["launch"]["ready_s"] == 100.0 and rec.ready_s == 100.0


async def test_a_kernel_oom_kill_is_the_diagnosis_and_stops_the_retries(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    lines = (FIXTURES / "kmsg" / "global_oom_5.15_cgroup2_tp4_graph.txt").read_text().splitlines()
    events = oom_events_in_text(lines)
    assert events
    rig.driver.submit(Apply("test-recipe"))
    await rig.step(1)
    engine = rig.runtime.current()
    engine.log = "INFO Available KV cache memory: 16.99 GiB\n"
    await rig.step(5)
    rig.ooms["L1"] = events
    engine.die(signal=9)
    await rig.run_until(lambda: rig.driver.machine.state in (State.FAILED, State.BACKOFF), 60, each=1)
    rec = rig.store.get_launch("L1")
    assert rec is not None and rec.diagnosis is not None
    assert rec.diagnosis["code"] == "global_oom"
    assert rig.driver.machine.state is State.FAILED  # DOMAIN §3: a global OOM repeats; no blind retry


async def test_a_killed_shim_is_diagnosed_from_the_runtimes_note_not_unknown(tmp_path: Path) -> None:
    # Issue 23: after `kill -9` of the process runtime's shim the record said "unknown ... nothing to
    # act on", though the runtime had written the cause.
    rig = make_rig(tmp_path, policy=Policy(max_failures=1))
    rig.driver.submit(Apply("test-recipe"))
    await rig.step(1)
    engine = rig.runtime.current()
    engine.reason = f"the engine's shim (pid {engine.handle.ref}) was killed (killed by signal 9 (SIGKILL))"
    engine.running = False
    engine.ended.set()
    await rig.run_until(lambda: rig.driver.machine.state is State.FAILED, limit_s=120, each=1)
    rec = rig.store.get_launch("L1")
    assert rec is not None and rec.diagnosis is not None
    assert rec.diagnosis["code"] == DiagnosisCode.SHIM_KILLED.value
    assert "was killed" in rec.diagnosis["summary"]
    assert rig.driver.status()["last_diagnosis"]["code"] == "shim_killed"


async def test_a_runtime_that_cannot_run_the_engine_is_diagnosed_in_its_own_words(tmp_path: Path) -> None:
    # A remote runtime (kubernetes) ends a launch with no exit code: the pod never ran. Its reason
    # reaches the stored diagnosis, so the operator reads the scheduler's sentence, not "unknown".
    rig = make_rig(tmp_path, policy=Policy(max_failures=1))
    why = "Unschedulable: 0/3 nodes are available: 3 Insufficient amd.com/gpu."

    def unschedulable(engine: FakeEngine) -> None:
        engine.reason = why
        engine.running = False
        engine.ended.set()

    rig.runtime.on_start = unschedulable
    rig.driver.submit(Apply("test-recipe"))
    await rig.run_until(lambda: rig.driver.machine.state is State.FAILED, limit_s=120, each=1)
    rec = rig.store.get_launch("L1")
    assert rec is not None and rec.diagnosis is not None
    assert rec.diagnosis["code"] == "runtime_cannot_run"
    assert "Insufficient amd.com/gpu" in json.dumps(rec.diagnosis)


async def test_warm_cache_restart_records_a_cold_and_a_warm_start(tmp_path: Path) -> None:
    rig = make_rig(tmp_path, warm_restart=True)

    def boot(engine: FakeEngine) -> None:
        if engine.handle.launch_id == "L1":
            engine.log = "INFO saved AOT compiled function to /c/torch_aot_compile/abc/rank_0_0/model\n"
        else:
            engine.log = "INFO Directly load AOT compilation from path /c/aot/abc/rank_0_0/model\n"
        engine.healthy = True

    rig.runtime.on_start = boot
    rig.driver.submit(Apply("test-recipe"))
    await rig.run_until(lambda: rig.driver.machine.state is State.READY, 120)
    cold, warm = rig.store.get_launch("L1"), rig.store.get_launch("L2")
    assert cold is not None and warm is not None
    assert (cold.kind, cold.cache, cold.status) == ("cold-warmup", "miss", "stopped")
    assert (warm.kind, warm.cache, warm.status) == ("warm", "hit", "ready")
    assert cold.ready_s is not None and warm.ready_s is not None
    assert [c for c in rig.gateway.calls if c[0] == "point_to"] == [("point_to", "http://127.0.0.1:18000")]
    assert rig.runtime.stopped == ["L1"]


async def test_a_second_apply_during_the_start_is_rejected(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    assert rig.driver.submit(Apply("test-recipe")) is None
    rejected = rig.driver.submit(Apply("test-recipe"))
    assert isinstance(rejected, Reject)
    await rig.driver.settle()
    assert rig.preflight.calls == 1


async def test_preflight_refusal_is_reported_and_nothing_starts(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    rig.preflight.refuse = "needs 35.2 GiB, host has 27.3 GiB RAM + swap"
    rig.driver.submit(Apply("test-recipe"))
    await rig.step()
    assert rig.driver.machine.state is State.FAILED and rig.runtime.started == []
    assert "35.2 GiB" in rig.driver.status()["last_diagnosis"]["summary"]


async def test_state_and_phase_changes_reach_subscribers(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    rig.runtime.on_start = lambda e: setattr(e, "log", "INFO Loading weights took 0.82 seconds\n")
    async with rig.driver.subscribe() as queue:
        rig.driver.submit(Apply("test-recipe"))
        await rig.step()
        await rig.step()
        seen = []
        while not queue.empty():
            seen.append(queue.get_nowait())
    states = [e["state"] for e in seen if e["type"] == "state"]
    assert states[:2] == ["preflight", "starting"]
    assert any(e["type"] == "phase" and e["phase"] == "weights_loaded" for e in seen)


@pytest.fixture(autouse=True)
def _fast(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing here may wait for real time."""
    import asyncio

    real_sleep = asyncio.sleep

    async def no_real_sleep(delay: float, *args: object) -> None:
        assert delay <= 0.01, f"a test slept {delay} s of real time"
        await real_sleep(0)

    monkeypatch.setattr(asyncio, "sleep", no_real_sleep)


async def test_fresh_cache_is_emptied_only_when_the_new_engine_starts(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    rig.runtime.on_start = lambda e: setattr(e, "healthy", True)
    rig.driver.submit(Apply("test-recipe"))
    await rig.run_until(lambda: rig.driver.machine.state is State.READY, 60)
    root = tmp_path / "cache" / "test-recipe-0123"
    (root / "inductor").mkdir(parents=True)
    (root / "inductor" / "graph").write_text("compiled")
    seen_at_start: list[bool] = []

    def record_then_heal(e: FakeEngine) -> None:
        seen_at_start.append(root.exists())
        e.healthy = True

    rig.runtime.on_start = record_then_heal
    real = rig.preflight.__call__

    async def fresh(token: int, name: str, fresh_cache: bool) -> PreflightOk | PreflightFailed:
        ok = await real(token, name, fresh_cache)
        assert isinstance(ok, PreflightOk)
        return dataclasses.replace(ok, empty_cache_first=str(root))

    seen_at_stop: list[bool] = []
    real_stop = rig.runtime.stop

    def stop(handle: EngineHandle, grace_s: float) -> ExitInfo:
        seen_at_stop.append(root.exists())
        return real_stop(handle, grace_s)

    rig.runtime.stop = stop  # type: ignore[method-assign]
    rig.driver.preflight = fresh
    rig.driver.submit(Apply("test-recipe", fresh_cache=True))
    await rig.run_until(lambda: rig.driver.machine.state is State.READY, 60)
    # Still there while the old engine was stopped; gone when the new one started.
    assert seen_at_stop == [True] and seen_at_start == [False] and not root.exists()
    assert any(e.kind == "cache-emptied" for e in rig.store.events())


# --- seams: metrics, diagnosis codes, the gateway's slot --------------------------------------------


# Each rig's driver has its own ControllerMetrics (a fresh registry): the gauges are that driver's.
def _ready_gauge(rig: Rig, recipe: str = "test-recipe") -> float | None:
    return rig.driver.metrics.value("appliance_engine_ready", {"recipe": recipe})


def _launch_start(rig: Rig, recipe: str = "test-recipe") -> float | None:
    return rig.driver.metrics.value("appliance_engine_launch_start_timestamp_seconds", {"recipe": recipe})


def _state_gauge(rig: Rig, state: str) -> float | None:
    return rig.driver.metrics.value("appliance_engine_state", {"state": state})


async def test_the_ready_gauge_falls_to_0_when_the_engine_exits_or_is_stopped(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    rig.runtime.on_start = lambda e: setattr(e, "healthy", True)
    rig.driver.submit(Apply("test-recipe"))
    await rig.run_until(lambda: rig.driver.machine.state is State.READY, 60)
    assert _ready_gauge(rig) == 1 and _state_gauge(rig, "ready") == 1
    assert _launch_start(rig) is not None
    # The engine dies: not ready any more, and no start is in progress whose budget could run out
    # (ApplianceEngineNotReadyPastBudget must not fire for an engine that is gone).
    rig.runtime.current().die(signal=9)
    await rig.run_until(lambda: rig.driver.machine.state is State.BACKOFF, 30)
    assert _ready_gauge(rig) == 0 and _state_gauge(rig, "backoff") == 1 and _state_gauge(rig, "ready") == 0
    assert _launch_start(rig) is None
    await rig.run_until(lambda: rig.driver.machine.state is State.READY, 60)
    assert _ready_gauge(rig) == 1 and _launch_start(rig) is not None
    # An operator stop: drained, stopped, idle — 0 again.
    rig.driver.submit(Stop())
    await rig.run_until(lambda: rig.driver.machine.state is State.IDLE, 60)
    assert _ready_gauge(rig) == 0 and _launch_start(rig) is None and _state_gauge(rig, "idle") == 1


async def test_an_adopted_engine_is_marked_ready_once_it_answers(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    spec = make_spec()
    handle = EngineHandle(launch_id="Ladopted", runtime="process", ref="778", recipe="test-recipe",
                          spec_hash=spec.spec_hash, started_at=rig.clock.t - 600)
    rig.runtime.engines["Ladopted"] = FakeEngine(handle, log="INFO Application startup complete.\n",
                                                 healthy=True)
    rig.store.create_launch("Ladopted", spec, "normal", Provenance(), rig.clock.t - 600)
    rig.store.set_handle("Ladopted", handle, rig.clock.t - 600)
    await rig.driver.adopt()
    assert rig.driver.machine.state is State.STARTING and _ready_gauge(rig) == 0
    await rig.step()
    assert rig.driver.machine.state is State.READY
    assert _ready_gauge(rig) == 1 and _state_gauge(rig, "ready") == 1
    rig.runtime.engines["Ladopted"].die(signal=9)
    await rig.run_until(lambda: rig.driver.machine.state is not State.READY, 30)
    assert _ready_gauge(rig) == 0


async def test_a_spent_ready_budget_is_diagnosed_with_the_diagnosis_modules_code(tmp_path: Path) -> None:
    # The machine decides "budget spent"; the driver re-diagnoses over the evidence with the same rules.
    # Both must spell it as appliance.diagnosis.signatures does, or the re-diagnosis is skipped (it was
    # keyed on the machine's own string).
    rig = make_rig(tmp_path, make_spec(budget=100, stall=600))
    rig.driver.submit(Apply("test-recipe"))
    await rig.step(1)
    engine = rig.runtime.current()
    engine.log = "INFO Loading weights took 0.82 seconds\n"

    def busy() -> bool:
        engine.cpu += 10.0  # working, just slow: not a stall
        return rig.driver.machine.state is State.FAILED

    await rig.run_until(busy, limit_s=200)
    rec = rig.store.get_launch("L1")
    assert rec is not None and rec.status == "failed" and rec.diagnosis is not None
    assert rec.diagnosis["code"] == DiagnosisCode.READY_BUDGET_EXCEEDED.value
    assert "weights loaded" in rec.diagnosis["summary"]  # the diagnosis module's phrasing, not the machine's
    assert rig.driver.machine.last_failure is not None
    assert rig.driver.machine.last_failure.code == DiagnosisCode.READY_BUDGET_EXCEEDED
    assert any(e.kind == DiagnosisCode.READY_BUDGET_EXCEEDED.value for e in rig.store.events())


async def test_a_start_waiting_on_the_runtime_says_so_and_ends_in_its_words(tmp_path: Path) -> None:
    # Kubernetes inside its unschedulable grace: running (still starting) with the scheduler's words.
    # The status line shows them while no log phase exists; if the budget runs out first, the stored
    # diagnosis is the runtime's sentence, not a bare "budget spent".
    rig = make_rig(tmp_path, make_spec(budget=100, stall=600), policy=Policy(max_failures=1))
    waiting = ("Unschedulable: 0/3 nodes are available: 3 Insufficient amd.com/gpu. "
               "(pending 20 s of a 300 s grace for the cluster to make room)")
    rig.runtime.on_start = lambda e: setattr(e, "reason", waiting)
    rig.driver.submit(Apply("test-recipe"))

    def launch() -> dict[str, Any]:
        status: dict[str, Any] = rig.driver.status()["launch"] or {}
        return status

    await rig.run_until(lambda: launch().get("runtime_note") is not None, limit_s=30, each=5)
    assert launch()["describe"] == launch()["runtime_note"] == waiting
    assert rig.driver.machine.state is State.STARTING
    engine = rig.runtime.current()

    def counted_busy() -> bool:
        engine.cpu += 10.0  # the kubernetes runtime counts a pod without a container as busy
        return rig.driver.machine.state is State.FAILED

    await rig.run_until(counted_busy, limit_s=200)
    rec = rig.store.get_launch("L1")
    assert rec is not None and rec.status == "failed" and rec.diagnosis is not None
    assert rec.diagnosis["code"] == DiagnosisCode.RUNTIME_CANNOT_RUN.value
    assert "Insufficient amd.com/gpu" in rec.diagnosis["summary"]


async def test_a_spent_budget_is_not_blamed_on_the_runtime_for_the_stop_it_was_asked_for(
    tmp_path: Path,
) -> None:
    # The kubernetes runtime's stop of a running pod answers `reason="stopped"` with no exit code.
    # That is the controller's own doing: the diagnosis stays "budget spent", not "could not run".
    rig = make_rig(tmp_path, make_spec(budget=100, stall=600), policy=Policy(max_failures=1))
    real_stop = rig.runtime.stop

    def stop_like_kubernetes(handle: EngineHandle, grace_s: float) -> ExitInfo:
        real_stop(handle, grace_s)
        return ExitInfo(running=False, reason="stopped")

    rig.runtime.stop = stop_like_kubernetes  # type: ignore[method-assign]
    rig.driver.submit(Apply("test-recipe"))
    await rig.step(1)
    engine = rig.runtime.current()

    def busy() -> bool:
        engine.cpu += 10.0
        return rig.driver.machine.state is State.FAILED

    await rig.run_until(busy, limit_s=200)
    rec = rig.store.get_launch("L1")
    assert rec is not None and rec.diagnosis is not None
    assert rec.diagnosis["code"] == DiagnosisCode.READY_BUDGET_EXCEEDED.value


async def test_a_runtime_that_stops_answering_for_a_while_does_not_end_supervision(tmp_path: Path) -> None:
    # A Docker daemon restarting (or an API server's 5xx) made read_logs raise inside the poll, and
    # the exception ended the supervisor's loop: the controller kept answering HTTP, watching nothing.
    rig = make_rig(tmp_path, make_spec(budget=600, stall=300))
    rig.driver.submit(Apply("test-recipe"))
    await rig.step(1)
    engine = rig.runtime.current()
    real_read = rig.runtime.read_logs
    outage = {"polls": 3}

    def flaky_read(handle: EngineHandle, offset: int) -> tuple[str, int]:
        if outage["polls"] > 0:
            outage["polls"] -= 1
            raise EngineRuntimeError("docker: the daemon did not answer: connection refused")
        return real_read(handle, offset)

    rig.runtime.read_logs = flaky_read  # type: ignore[method-assign]
    for _ in range(3):
        await rig.step(5)  # raises nothing
    engine.log = "INFO Application startup complete.\n"
    engine.healthy = True
    await rig.run_until(lambda: rig.driver.machine.state is State.READY, limit_s=60, each=5)
    notes = [e for e in rig.store.events() if e.kind == "runtime-unanswered"]
    assert len(notes) == 1 and "connection refused" in notes[0].message  # said once, not per poll

    # And a bug in one look is logged, and the loop goes on to the next poll.
    calls = {"n": 0}

    async def broken_step() -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise ValueError("a bug")
        stop.set()

    stop = asyncio.Event()
    rig.driver.step = broken_step  # type: ignore[method-assign]
    rig.driver.config = dataclasses.replace(rig.driver.config, poll_interval_s=0.01)
    await asyncio.wait_for(rig.driver.run(stop), timeout=30)
    assert calls["n"] == 2


async def test_a_restarted_gateway_gets_the_upstream_again(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    rig.runtime.on_start = lambda e: setattr(e, "healthy", True)
    rig.driver.submit(Apply("test-recipe"))
    await rig.run_until(lambda: rig.driver.machine.state is State.READY, 60)
    await rig.step()
    url = "http://127.0.0.1:18000"
    assert rig.gateway.upstream == GatewayUpstream(url, "smollm2")
    # A gateway that already routes to the engine is asked, not told again.
    for _ in range(6):
        await rig.step(10)
    assert rig.gateway.checks >= 5
    assert [c for c in rig.gateway.calls if c[0] == "point_to"] == [("point_to", url)]
    # The gateway process restarts: it has no slot (clients get 503) until the next check re-sends it.
    rig.gateway.restart()
    waited = await rig.run_until(lambda: rig.gateway.upstream is not None, limit_s=20, each=5)
    assert waited <= 15
    assert rig.gateway.upstream == GatewayUpstream(url, "smollm2")
    restored = [e for e in rig.store.events() if e.kind == "gateway-upstream-restored"]
    assert len(restored) == 1 and restored[0].data is not None and restored[0].data["found"] is None


async def test_the_recipes_aliases_go_to_the_gateway_and_are_re_sent_when_lost(tmp_path: Path) -> None:
    """Finding 8: the launch's aliases travel with its upstream (the gateway accepts only those and the
    served name), and a gateway that lost them (restarted, or older) is told again."""
    spec = make_spec().model_copy(update={"served_model_aliases": ("smol",)})
    rig = make_rig(tmp_path, spec)
    rig.runtime.on_start = lambda e: setattr(e, "healthy", True)
    rig.driver.submit(Apply("test-recipe"))
    await rig.run_until(lambda: rig.driver.machine.state is State.READY, 60)
    await rig.step()
    url = "http://127.0.0.1:18000"
    assert rig.gateway.upstream == GatewayUpstream(url, "smollm2", frozenset({"smol"}))
    rig.gateway.upstream = GatewayUpstream(url, "smollm2")  # the same engine, its aliases lost
    await rig.run_until(lambda: rig.gateway.upstream is not None and bool(rig.gateway.upstream.aliases),
                        limit_s=20, each=5)
    assert rig.gateway.upstream == GatewayUpstream(url, "smollm2", frozenset({"smol"}))


async def test_an_unreachable_gateway_is_reported_once_and_pointed_when_it_is_back(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    rig.runtime.on_start = lambda e: setattr(e, "healthy", True)
    rig.driver.submit(Apply("test-recipe"))
    await rig.run_until(lambda: rig.driver.machine.state is State.READY, 60)
    rig.gateway.down = True
    rig.gateway.restart()
    for _ in range(6):
        await rig.step(10)
    assert rig.driver.machine.state is State.READY  # the engine is still supervised
    assert len([e for e in rig.store.events() if e.kind == "gateway-error"]) == 1
    rig.gateway.down = False
    await rig.run_until(lambda: rig.gateway.upstream is not None, limit_s=20, each=5)
    kinds = [e.kind for e in rig.store.events()]
    assert "gateway-reachable" in kinds and "gateway-upstream-restored" in kinds


async def test_the_gateway_check_never_undoes_a_stop(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    rig.runtime.on_start = lambda e: setattr(e, "healthy", True)
    rig.driver.submit(Apply("test-recipe"))
    await rig.run_until(lambda: rig.driver.machine.state is State.READY, 60)
    rig.driver.submit(Stop())
    await rig.run_until(lambda: rig.driver.machine.state is State.IDLE, 60)
    for _ in range(4):
        await rig.step(10)
    assert rig.gateway.upstream is None
    assert [c for c in rig.gateway.calls if c[0] == "point_to"] == [("point_to", "http://127.0.0.1:18000")]


def _bar(label: str, total: int) -> str:
    # tqdm on a pipe: every step redrawn with \r, the final state printed again several times.
    steps = [f"Capturing CUDA graphs ({label}): {n * 100 // total}%|##| {n}/{total} [00:01<00:00]\r"
             for n in range(1, total + 1)]
    final = f"Capturing CUDA graphs ({label}): 100%|##| {total}/{total} [00:04<00:00]\r"
    return "".join(steps) + final * 9 + "\n"


async def test_a_gpu_start_records_each_phase_once_with_its_own_label(tmp_path: Path) -> None:
    # Seen on the H200 (vLLM 0.26): 51 phase rows for one cold start — 51/51 ten times in the same
    # millisecond, "process started" from API server and engine core, weights loading labelled
    # "weights loaded".
    rig = make_rig(tmp_path, make_spec(budget=600, stall=300))
    rig.driver.submit(Apply("test-recipe"))
    await rig.step(1)
    engine = rig.runtime.current()
    script = {
        0: "(APIServer pid=1) INFO 11-30 08:00:01 [api_server.py:1] vLLM API server version 0.26.0\n",
        20: "(EngineCore pid=2) INFO 11-30 08:00:21 [core.py:1] Initializing a V1 LLM engine (v0.26.0) with\n"
            "(EngineCore pid=2) INFO [gpu_model_runner.py:1] Starting to load model /m...\n"
            "(EngineCore pid=2) INFO [default_loader.py:1] Loading weights took 0.12 seconds\n"
            "(EngineCore pid=2) INFO [gpu_model_runner.py:1] Model loading took 0.26 GiB memory and 0.6 s\n",
        30: "(EngineCore pid=2) INFO [monitor.py:1] torch.compile takes 13.2 s in total\n"
            "(EngineCore pid=2) INFO [gpu_worker.py:1] Available KV cache memory: 41.3 GiB\n"
            "(EngineCore pid=2) INFO [kv_cache_utils.py:1] GPU KV cache size: 1,923,456 tokens\n"
            + _bar("mixed prefill-decode, PIECEWISE", 51) + _bar("decode, FULL", 51)
            + "(EngineCore pid=2) INFO [gpu_model_runner.py:1] Graph capturing finished in 4 secs, "
              "took 0.39 GiB\n",
        40: "(APIServer pid=1) INFO:     Application startup complete.\n",
    }
    elapsed = 0
    while rig.driver.machine.state is not State.READY:
        assert elapsed <= 600
        engine.log += script.get(elapsed, "")
        engine.cpu += 8.0
        engine.healthy = elapsed >= 40
        await rig.step(10)
        elapsed += 10
    rec = rig.store.get_launch("L1")
    assert rec is not None
    names = [p.name for p in rec.phases]
    assert names.count("process_started") == 1 and names.count("weights_loading") == 1
    # per bar of a capture round (PIECEWISE + FULL bars of one pass are one round): first and last
    assert names.count("graph_capture") == 4, names
    assert len(names) == len(set(names)) + 3
    labels = [e.message for e in rec.events if e.kind == "phase"]
    assert "loading weights" in labels and "weights loaded" in labels
    assert labels.index("loading weights") < labels.index("weights loaded")
    captures = [m for m in labels if m.startswith("capturing graphs")]
    assert captures == ["capturing graphs round 1: 1/51 (mixed prefill-decode, PIECEWISE)",
                        "capturing graphs round 1: 51/51 (mixed prefill-decode, PIECEWISE)",
                        "capturing graphs round 1: 1/51 (decode, FULL)",
                        "capturing graphs round 1: 51/51 (decode, FULL)"]


def _seed_history(store: Store, spec: LaunchSpec, ready: tuple[float, ...], start: str = "cold") -> None:
    """Earlier launches of the same variant that reached ready: torch.compile took 18 s in each."""
    for i, ready_s in enumerate(ready):
        lid, t0 = f"P{i}", 1000.0 * i
        store.create_launch(lid, spec, "normal", Provenance(), now=t0, start=start)
        for name, elapsed in (("weights_loading", 1.0), ("weights_loaded", 9.0), ("compile_started", 10.0),
                              ("compile_finished", 28.0), ("api_up", ready_s - 2)):
            store.add_phase(lid, name, at=t0 + elapsed, elapsed_s=elapsed)
        store.mark_ready(lid, at=t0 + ready_s, ready_s=ready_s)
        store.mark_ended(lid, at=t0 + 500, status="stopped")


async def test_status_has_the_eta_from_history_and_a_slow_phase_is_flagged_not_killed(tmp_path: Path) -> None:
    spec = make_spec(budget=2700, stall=600)
    rig = make_rig(tmp_path, spec)
    _seed_history(rig.store, spec, (37.0, 40.0, 38.0))
    assert rig.driver.status()["eta"] is None  # nothing starting
    rig.driver.submit(Apply("test-recipe"))
    await rig.step(1)
    engine = rig.runtime.current()
    engine.log = ("INFO Starting to load model m...\nINFO Loading weights took 8.00 seconds\n"
                  "INFO Dynamo bytecode transform time: 2.00 s\n")
    engine.cpu = 1.0
    await rig.step(10)
    eta = rig.driver.status()["eta"]
    assert eta is not None
    assert (eta["start"], eta["basis"], eta["launches"], eta["median_s"], eta["min_s"], eta["max_s"]) == (
        "cold", "spec", 3, 38.0, 37.0, 40.0)
    assert eta["text"].endswith("(cold; 37–40 s over 3 launches)")
    assert eta["budget_s"] == 2700 and eta["stall"] is None
    phases = {p["phase"]: p for p in eta["phases"]}
    assert phases["compile_started"]["status"] == "current" and phases["compile_started"]["usual_s"] == 18.0
    assert phases["compile_finished"] == {"phase": "compile_finished", "label": "compiled",
                                          "status": "pending", "took_s": None, "usual_s": 8.0, "samples": 3}
    # a CPU recipe captures no graphs: not pending, in the ETA or in the launch's phase list
    assert "graph_capture" not in phases
    assert "graph_capture" not in [p["phase"] for p in rig.driver.status()["launch"]["phases"]]

    def flagged() -> list[Any]:
        return [e for e in rig.store.events() if e.kind == "likely-stalled"]

    def busy() -> bool:  # the engine keeps working (CPU), so the stall watch must not fire
        engine.cpu += 5.0
        return bool(flagged())

    await rig.run_until(busy, limit_s=300)
    [event] = flagged()
    assert event.launch_id == "L1" and event.data["phase"] == "compile_started"
    assert event.data["usual_s"] == 18.0
    status = rig.driver.status()
    assert status["state"] == "starting" and rig.runtime.stopped == []
    assert status["eta"]["stall"]["text"].startswith("likely stalled: torch.compile ")
    for _ in range(3):
        engine.cpu += 5.0
        await rig.step(10)
    assert len(flagged()) == 1 and rig.driver.machine.state is State.STARTING  # once per phase; no kill


async def test_without_history_the_eta_falls_back_to_the_budget(tmp_path: Path) -> None:
    rig = make_rig(tmp_path, make_spec(budget=600))
    rig.driver.submit(Apply("test-recipe"))
    await rig.step(1)
    eta = rig.driver.status()["eta"]
    assert eta["launches"] == 0 and eta["median_s"] is None
    assert eta["text"] == "no earlier launches of this variant: expected within the ready budget of 600 s"


async def test_adoption_never_stops_its_own_engine_for_one_it_cannot_supervise(tmp_path: Path) -> None:
    # Issue 23: another appliance's newer engine on a shared daemon (its spec unknown here) made a
    # restarted controller stop its own healthy engine as "older", then skip the other one.
    rig = make_rig(tmp_path)
    spec = make_spec()
    own = EngineHandle(launch_id="Lown", runtime="process", ref="801", recipe="test-recipe",
                       spec_hash=spec.spec_hash, started_at=rig.clock.t - 3600, instance="i-mine")
    rig.runtime.engines["Lown"] = FakeEngine(own, log="INFO Application startup complete.\n", healthy=True)
    rig.store.create_launch("Lown", spec, "normal", Provenance(), rig.clock.t - 3600)
    rig.store.set_handle("Lown", own, rig.clock.t - 3600)
    other = EngineHandle(launch_id="Lother", runtime="process", ref="802", recipe="another-recipe",
                         spec_hash="f" * 64, started_at=rig.clock.t - 60, instance="i-theirs")
    rig.runtime.engines["Lother"] = FakeEngine(other, healthy=True)

    await rig.driver.adopt()
    assert rig.runtime.stopped == []
    launch = rig.driver.machine.launch
    assert launch is not None and launch.launch_id == "Lown"
    await rig.step()
    assert rig.driver.machine.state is State.READY and rig.runtime.started == []
    rec = rig.store.get_launch("Lown")
    assert rec is not None and rec.ended_at is None
    # The instance that launched it is recorded with its handle.
    assert rec.handle is not None and rec.handle["instance"] == "i-mine"
    assert rig.runtime.engines["Lother"].running


async def test_an_unlabelled_engine_is_adopted_only_when_it_is_on_this_appliances_record(
    tmp_path: Path,
) -> None:
    """Engines launched before instance ids carry no label. After an upgrade our own must still be
    adopted (its launch is in our store); someone else's must be left alone, even when a recipe of
    ours has its name (`spec_for_recipe` would plan it)."""
    spec = make_spec()
    rig = make_rig(tmp_path, spec_for_recipe=lambda name: spec)
    stranger = EngineHandle(launch_id="Lstranger", runtime="process", ref="901", recipe="test-recipe",
                            spec_hash=spec.spec_hash, started_at=rig.clock.t - 60)
    rig.runtime.engines["Lstranger"] = FakeEngine(stranger, healthy=True)
    await rig.driver.adopt()
    assert rig.driver.machine.launch is None and rig.runtime.stopped == []
    assert rig.store.get_launch("Lstranger") is None
    assert any(e.kind == "adopt-skipped" and "no appliance instance label" in e.message
               for e in rig.store.events())
    # Ours from before the upgrade: on record, so adopted.
    again = make_rig(tmp_path / "again", spec_for_recipe=lambda name: spec)
    mine = stranger.model_copy(update={"launch_id": "Lmine"})
    again.runtime.engines["Lmine"] = FakeEngine(mine, log="INFO Application startup complete.\n",
                                                healthy=True)
    again.store.create_launch("Lmine", spec, "normal", Provenance(), again.clock.t - 60)
    again.store.set_handle("Lmine", mine, again.clock.t - 60)
    await again.driver.adopt()
    launch = again.driver.machine.launch
    assert launch is not None and launch.launch_id == "Lmine" and again.runtime.stopped == []


async def test_adoption_still_stops_an_older_engine_of_its_own(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    spec = make_spec()
    for launch_id, age in (("Lold", 7200), ("Lnew", 3600)):
        handle = EngineHandle(launch_id=launch_id, runtime="process", ref=str(age), recipe="test-recipe",
                              spec_hash=spec.spec_hash, started_at=rig.clock.t - age)
        rig.runtime.engines[launch_id] = FakeEngine(handle, log="INFO Application startup complete.\n",
                                                    healthy=True)
        rig.store.create_launch(launch_id, spec, "normal", Provenance(), rig.clock.t - age)
        rig.store.set_handle(launch_id, handle, rig.clock.t - age)
    await rig.driver.adopt()
    assert rig.runtime.stopped == ["Lold"]
    launch = rig.driver.machine.launch
    assert launch is not None and launch.launch_id == "Lnew"


async def test_an_engine_adopted_mid_start_completes_its_launch_record(tmp_path: Path) -> None:
    # Issue 23: a controller killed mid-start, then started again, adopted the starting engine and
    # followed it to ready, but the record stayed `starting`: no ready time, no cache verdict, and
    # none of the phases seen after the adoption.
    rig = make_rig(tmp_path)
    spec = make_spec()
    started = rig.clock.t - 20
    handle = EngineHandle(launch_id="Lmid", runtime="process", ref="901", recipe="test-recipe",
                          spec_hash=spec.spec_hash, started_at=started)
    engine = FakeEngine(handle, log="INFO Loading weights took 12.50 seconds\n")
    rig.runtime.engines["Lmid"] = engine
    rig.store.create_launch("Lmid", spec, "normal", Provenance(), started, start="warm")
    rig.store.set_handle("Lmid", handle, started)
    rig.store.add_phase("Lmid", "weights_loaded", started + 10, 10.0,
                        "INFO Loading weights took 12.50 seconds")

    await rig.driver.adopt()
    assert rig.driver.machine.state is State.STARTING
    await rig.step(5)
    engine.log += ("INFO Directly load AOT compilation from path /c/aot/abc/rank_0_0/model\n"
                   "INFO Application startup complete.\n")
    engine.healthy = True
    await rig.run_until(lambda: rig.driver.machine.state is State.READY, 60, each=5)
    rec = rig.store.get_launch("Lmid")
    assert rec is not None
    assert rec.status == "ready" and rec.ready_s is not None and rec.ready_at is not None
    assert rec.ready_s == pytest.approx(rig.driver.status()["launch"]["ready_s"], abs=0.1)
    assert rec.cache == "hit"
    phases = [p.name for p in rec.phases]
    assert phases.count("weights_loaded") == 1  # recorded once, by the controller that saw it first
    assert "compile_cache_hit" in phases and "api_up" in phases


async def test_an_engine_adopted_mid_start_keeps_filling_its_compile_cache_record(tmp_path: Path) -> None:
    # Issue 23: the cache evidence of a start adopted mid-way lands in the record the launching
    # controller began (its factors), not nowhere.
    rig = make_rig(tmp_path)
    spec = make_spec()
    started = rig.clock.t - 20
    handle = EngineHandle(launch_id="Lmid", runtime="process", ref="902", recipe="test-recipe",
                          spec_hash=spec.spec_hash, started_at=started)
    engine = FakeEngine(handle, log="")
    rig.runtime.engines["Lmid"] = engine
    rig.store.create_launch("Lmid", spec, "normal", Provenance(), started, start="warm")
    rig.store.set_handle("Lmid", handle, started)
    rig.store.update_compile_cache("Lmid", {"factors": launch_factors(spec, {}, Provenance()).model_dump(
        mode="json"), "previous_launch": None, "warnings": []})
    await rig.driver.adopt()
    engine.log = ("INFO Using cache directory: /c/torch_compile_cache/0123456789 for vLLM's torch.compile\n"
                  "INFO Directly load AOT compilation from path /c/aot/abc/rank_0_0/model\n"
                  "INFO Application startup complete.\n")
    engine.healthy = True
    await rig.run_until(lambda: rig.driver.machine.state is State.READY, 60, each=5)
    rec = rig.store.get_launch("Lmid")
    assert rec is not None and rec.cache == "hit"
    assert "factors" in rec.compile_cache  # the launching controller's part is kept
    seen = rec.compile_cache.get("seen") or {}
    assert seen.get("aot_path") and seen.get("evidence")


async def test_a_failed_launch_s_log_tail_is_in_the_status_while_failed(tmp_path: Path) -> None:
    rig = make_rig(tmp_path, policy=Policy(max_failures=1))

    def crash(engine: FakeEngine) -> None:
        engine.log = "".join(f"INFO line {i}\n" for i in range(30)) + (
            "OSError: Repo id must be in the form 'repo_name' or 'namespace/repo_name': '/models/nope'. "
            "Use `repo_type` argument if needed.\n")
        engine.die(exit_code=1)

    rig.runtime.on_start = crash
    rig.driver.submit(Apply("test-recipe"))
    await rig.run_until(lambda: rig.driver.machine.state is State.FAILED, limit_s=600, each=1)
    status = rig.driver.status()
    assert status["last_diagnosis"]["code"] == "model_path_invalid"
    tail = status["failed_log_tail"]
    assert len(tail) == 20 and tail[-1].startswith("OSError: Repo id must be") and tail[0] == "INFO line 11"
