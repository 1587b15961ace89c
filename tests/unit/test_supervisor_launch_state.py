"""Per-launch state lives exactly as long as the launch (controller/supervisor/launch_run.py).

Many start/exit/stop cycles with the fake runtime and the fake clock — ready then killed, a failed
start, an apply of the running recipe ("unchanged"), a preflight cancelled by a stop, a stop — must
leave nothing behind for launches that ended: neither in the driver's `LaunchRuns` nor in any
other container the driver holds (the old bookkeeping kept ten dicts by launch id and leaked the
preflight's "cache empty" flag for every preflight that started nothing).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from controller.runtime.base import EngineHandle
from controller.supervisor.machine import State
from controller.supervisor.signals import Apply, Stop
from tests.unit.test_supervisor_driver import Rig, make_rig


def _launch_ids_held(driver: Any, launch_ids: set[str]) -> set[str]:
    """Every known launch id found as a key or member of a dict/set the driver (or an object it
    holds directly) keeps: any way of keeping per-launch state by id shows up here."""
    found: set[str] = set()
    seen: set[int] = set()

    def scan(obj: object, depth: int) -> None:
        if id(obj) in seen or depth > 2:
            return
        seen.add(id(obj))
        if isinstance(obj, dict):
            found.update(k for k in obj if isinstance(k, str) and k in launch_ids)
            for v in obj.values():
                scan(v, depth + 1)
        elif isinstance(obj, set | frozenset):
            found.update(k for k in obj if isinstance(k, str) and k in launch_ids)
        elif hasattr(obj, "__dict__") and not isinstance(obj, type):
            scan(vars(obj), depth + 1)

    for name, value in vars(driver).items():
        if name in ("machine", "store", "runtimes", "preflight", "prober", "gateway", "clock"):
            continue  # the machine and the seams: not the driver's bookkeeping
        scan(value, 0)
    return found


def _all_launch_ids(rig: Rig) -> set[str]:
    return {f"L{i}" for i in range(1, rig.preflight.calls + 1)}


def _assert_only_current(rig: Rig) -> None:
    launch = rig.driver.machine.launch
    current = {launch.launch_id} if launch is not None else set()
    held = _launch_ids_held(rig.driver, _all_launch_ids(rig))
    assert held <= current, f"state kept for ended launches: {sorted(held - current)}"
    assert rig.driver.runs.ids() <= current


async def test_many_launch_cycles_leave_no_per_launch_state_behind(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    rig.runtime.on_start = lambda e: setattr(e, "healthy", True)
    for _ in range(4):
        # Ready, then the engine is killed: backoff, relaunched, ready again.
        rig.driver.submit(Apply("test-recipe"))
        await rig.run_until(lambda: rig.driver.machine.state is State.READY, 60)
        _assert_only_current(rig)
        rig.runtime.current().die(signal=9)
        await rig.run_until(lambda: rig.driver.machine.state is State.READY, 120)
        _assert_only_current(rig)
        # An apply of the running recipe: its preflight starts nothing ("unchanged").
        rig.driver.submit(Apply("test-recipe"))
        await rig.run_until(lambda: rig.driver.machine.state is State.READY, 60)
        _assert_only_current(rig)
        # A stop: drained, stopped, idle — no launch, no state.
        rig.driver.submit(Stop())
        await rig.run_until(lambda: rig.driver.machine.state is State.IDLE, 60)
        _assert_only_current(rig)
        assert len(rig.driver.runs) == 0
        # A start the runtime refuses: failed before an engine existed.
        real_start = rig.runtime.start

        def refuse(*args: object, **kwargs: object) -> EngineHandle:
            raise OSError("no such file: the engine interpreter")

        rig.runtime.start = refuse  # type: ignore[method-assign]
        rig.driver.submit(Apply("test-recipe"))
        await rig.run_until(lambda: rig.driver.machine.state in (State.BACKOFF, State.FAILED), 60)
        rig.runtime.start = real_start  # type: ignore[method-assign]
        rig.driver.submit(Stop())
        await rig.run_until(lambda: rig.driver.machine.state is State.IDLE, 60)
        _assert_only_current(rig)
    assert rig.preflight.calls >= 16
    assert len(rig.driver.runs) == 0


async def test_an_adopted_launch_state_goes_when_it_exits(tmp_path: Path) -> None:
    from controller.runtime.base import Provenance
    from tests.unit.supervisor_helpers import FakeEngine, make_spec

    rig = make_rig(tmp_path)
    spec = make_spec()
    handle = EngineHandle(launch_id="L1", runtime="process", ref="778", recipe="test-recipe",
                          spec_hash=spec.spec_hash, started_at=rig.clock.t - 600)
    rig.runtime.engines["L1"] = FakeEngine(handle, log="INFO Application startup complete.\n", healthy=True)
    rig.store.create_launch("L1", spec, "normal", Provenance(), rig.clock.t - 600)
    rig.store.set_handle("L1", handle, rig.clock.t - 600)
    rig.store.mark_ready("L1", rig.clock.t - 500, 100.0)
    rig.preflight.calls = 1  # L1 is taken: the next launch is L2
    await rig.driver.adopt()
    assert rig.driver.runs.ids() == {"L1"}
    rig.runtime.engines["L1"].die(signal=9)
    await rig.run_until(
        lambda: rig.driver.machine.state is not State.READY and rig.driver.machine.launch is None, 60
    )
    assert "L1" not in _launch_ids_held(rig.driver, {"L1"})
    launch = rig.driver.machine.launch
    assert rig.driver.runs.ids() <= ({launch.launch_id} if launch else set())
