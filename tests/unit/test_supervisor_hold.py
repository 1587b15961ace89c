"""The supervisor's side of holding requests across a planned switch: which switches hold and why
(machine.py), how long (hold_plan.py, from the variant's history), and what the drain cut
(driver.py). The gateway's side: test_gateway_hold.py."""

from __future__ import annotations

from pathlib import Path

from appliance.observe.ready_eta import PastLaunch, StartState
from controller.gateway.hold.text import status_line
from controller.runtime.base import ExitInfo
from controller.supervisor.hold_plan import HoldPolicy, expected_ready_s, plan
from controller.supervisor.machine import STOPPED_DETAIL, Machine, State, transition
from controller.supervisor.signals import (
    Action,
    Apply,
    ClearUpstream,
    DrainGateway,
    Exited,
    Failure,
    Launched,
    Observation,
    PreflightOk,
    ReadyProbed,
    Restart,
    Stop,
    Tick,
)
from tests.unit.supervisor_helpers import make_handle, make_spec
from tests.unit.test_supervisor_driver import make_rig

CRASH = Failure("signal-kill", "killed by SIGKILL", "", retryable=True)


def _feed(m: Machine, obs: Observation, now: float, out: list[Action]) -> Machine:
    m, actions = transition(m, obs, now)
    out.extend(actions)
    return m


def _ready(recipe: str = "a") -> tuple[Machine, list[Action]]:
    out: list[Action] = []
    m = _feed(Machine(), Apply(recipe), 0, out)
    m = _feed(m, PreflightOk(m.token, "L1", make_spec(recipe=recipe), False, False), 1, out)
    m = _feed(m, Launched("L1", make_handle("L1", started_at=1)), 1, out)
    m = _feed(m, ReadyProbed("L1"), 50, out)
    assert m.state is State.READY
    return m, out


def test_an_apply_of_another_recipe_holds_and_says_where_to() -> None:
    m, out = _ready("a")
    m = _feed(m, Apply("b"), 60, out)
    m = _feed(m, PreflightOk(m.token, "L2", make_spec(recipe="b"), False, False), 61, out)
    drains = [a for a in out if isinstance(a, DrainGateway)]
    assert drains == [DrainGateway("L1", 30.0, hold="switching to b")]


def test_a_restart_holds_and_a_stop_does_not() -> None:
    m, out = _ready()
    _feed(m, Restart(blue_green=False), 60, out)
    assert [a.hold for a in out if isinstance(a, DrainGateway)] == ["restart"]
    m, out = _ready()
    _feed(m, Stop(), 60, out)
    assert [a.hold for a in out if isinstance(a, DrainGateway)] == [None]


def test_a_relaunch_after_a_crash_holds_and_a_stop_in_backoff_answers_held_requests() -> None:
    m, out = _ready()
    m = _feed(m, Exited("L1", ExitInfo(running=False, signal=9), CRASH), 70, out)
    assert m.state is State.BACKOFF
    clears = [a for a in out if isinstance(a, ClearUpstream)]
    hold = clears[-1].hold
    assert hold is not None and hold.startswith("relaunch after a failure, next try in 10")
    m = _feed(m, Stop(), 71, out)
    last = [a for a in out if isinstance(a, ClearUpstream)][-1]
    assert last.hold is None and last.detail == STOPPED_DETAIL
    m = _feed(m, Tick(), 200, out)
    assert m.state is State.IDLE


def _past(ready_s: float, start: StartState, spec_hash: str = "h1") -> PastLaunch:
    return PastLaunch(launch_id=f"L{ready_s}", spec_hash=spec_hash, start=start, ready_s=ready_s)


def test_the_bound_comes_from_the_variants_warm_history_plus_a_margin_capped() -> None:
    history = [_past(40, StartState.WARM), _past(50, StartState.WARM), _past(300, StartState.COLD),
               _past(10, StartState.WARM, "other")]
    assert expected_ready_s(history, "h1") == 45  # warm starts of this spec
    assert expected_ready_s([_past(300, StartState.COLD)], "h1") == 300
    assert expected_ready_s([], "h1") is None
    policy = HoldPolicy(margin_s=30, cap_s=300)
    assert plan("restart", 45, policy).wait_s == 75
    assert plan("restart", 45, policy).expected_ready_s == 45
    assert plan("restart", 600, policy).wait_s == 300  # capped
    assert plan("restart", None, policy).wait_s == 300  # no history: the cap
    assert plan("restart", 45, HoldPolicy(wait_s=20)).wait_s == 20  # configured
    assert plan("restart", 5, policy, floor_s=75).wait_s == 75  # a renewal never shortens it


async def test_a_restart_tells_the_gateway_to_hold_and_counts_what_the_drain_cut(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    rig.runtime.on_start = lambda e: setattr(e, "healthy", True)
    rig.driver.submit(Apply("test-recipe"))
    await rig.run_until(lambda: rig.driver.machine.state is State.READY, 120)
    rig.gateway.cut = 2
    rig.runtime.on_start = None
    rig.driver.submit(Restart())
    await rig.run_until(lambda: rig.driver.machine.state is State.STARTING, 120)
    hold = next(h for h in rig.gateway.holds if h is not None)
    assert hold.reason == "restart"
    # One earlier (warm) launch of this spec reached ready: its time plus the margin.
    first = rig.store.get_launch("L1")
    assert first is not None and first.ready_s is not None
    assert hold.expected_ready_s == round(first.ready_s, 1)
    assert hold.wait_s == round(min(300.0, first.ready_s + 30.0), 1)
    drained = [e for e in rig.store.events() if e.kind == "drained"]
    assert drained and "2 in-flight request(s) cut at the drain deadline" in drained[-1].message
    assert rig.driver.metrics.value("appliance_drain_cut_requests_total") == 2
    assert rig.driver.metrics.value("appliance_engine_switches_total", {"path": "hold"}) == 1
    rig.gateway.held = 3
    for _ in range(3):  # the start goes on: the hold is renewed
        await rig.step(10)
    assert rig.gateway.renewals and rig.gateway.renewals[-1].reason == "restart"
    held = rig.driver.status()["hold"]
    assert held is not None and held["waiting"] == 3
    assert status_line(held).startswith("holding 3 requests (restart), each up to ")
    rig.runtime.current().healthy = True
    await rig.run_until(lambda: rig.driver.machine.state is State.READY, 120)
    renewed = len(rig.gateway.renewals)
    await rig.step(10)
    assert len(rig.gateway.renewals) == renewed  # ready: nothing to hold for
    assert rig.driver.status()["hold"] is None
    await rig.driver.shutdown()


async def test_apply_and_restart_say_which_path_and_why_with_the_numbers(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    nothing = rig.driver.switch_plan("test-recipe")
    assert nothing["path"] == "start"
    assert "no earlier launch of test-recipe reached ready" in str(nothing["why"])
    rig.runtime.on_start = lambda e: setattr(e, "healthy", True)
    rig.driver.submit(Apply("test-recipe"))
    await rig.run_until(lambda: rig.driver.machine.state is State.READY, 120)
    switch = rig.driver.switch_plan("test-recipe", "0123456789abcdef")
    assert switch["path"] == "hold" and switch["launches"] == 1
    why = str(switch["why"])
    assert why.startswith("drain test-recipe (in-flight requests finish), stop it, start test-recipe")
    assert f"each up to {switch['wait_s']:g} s (expected ready in ~" in why
    assert "Not blue/green" in why  # says why not, rather than leaving it to be guessed
    await rig.driver.shutdown()
