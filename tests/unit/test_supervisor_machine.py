"""The pure transition function, driven observation by observation with explicit times."""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

from appliance.diagnosis.signatures import DiagnosisCode
from controller.runtime.base import ExitInfo
from controller.supervisor.machine import BUSY, Machine, Policy, State, backoff_delay, progress, transition
from controller.supervisor.signals import (
    Action,
    Adopted,
    Apply,
    ApplyOutcome,
    ClearUpstream,
    CpuSample,
    Drained,
    DrainGateway,
    Exited,
    ExitSeen,
    Failure,
    HealthLost,
    Launched,
    MarkEnded,
    MarkReady,
    Notify,
    Observation,
    PhaseSeen,
    PreflightFailed,
    PreflightOk,
    ReadyProbed,
    Reject,
    Restart,
    RunPreflight,
    SetUpstream,
    StartEngine,
    StartKind,
    Stop,
    StopEngine,
    Stopped,
    Tick,
)
from tests.unit.supervisor_helpers import make_handle, make_spec

A = TypeVar("A")
CRASH = Failure("signal-kill", "killed by SIGKILL", "", retryable=True)


class Run:
    """Feeds observations at given times and keeps every action."""

    def __init__(self, machine: Machine | None = None) -> None:
        self.m = machine or Machine()
        self.actions: list[Action] = []
        self.seq = 0

    def feed(self, obs: Observation, now: float) -> list[Action]:
        self.m, actions = transition(self.m, obs, now)
        self.actions.extend(actions)
        return actions

    def of(self, kind: type[A]) -> list[A]:
        return [a for a in self.actions if isinstance(a, kind)]

    def preflight_ok(self, now: float, budget: int = 600, stall: int = 120, **kw: bool) -> str:
        self.seq += 1
        lid = f"L{self.seq}"
        ok = PreflightOk(self.m.token, lid, make_spec(budget=budget, stall=stall),
                         warm_restart=kw.get("warm_restart", False), cache_empty=kw.get("cache_empty", False))
        self.feed(ok, now)
        return lid

    def start(self, now: float, budget: int = 600, stall: int = 120) -> str:
        """From preflight: pass it, and let the runtime report the engine launched."""
        lid = self.preflight_ok(now, budget, stall)
        self.feed(Launched(lid, make_handle(lid, started_at=now)), now)
        return lid


def test_apply_runs_preflight_then_starts_and_becomes_ready() -> None:
    r = Run()
    out = r.feed(Apply("test-recipe"), 0)
    assert r.m.state is State.PREFLIGHT
    assert RunPreflight(1, "test-recipe", False) in out
    lid = r.preflight_ok(1)
    assert r.m.state is State.STARTING
    assert r.of(StartEngine) == [StartEngine(lid, make_spec(), StartKind.NORMAL)]
    r.feed(Launched(lid, make_handle(lid)), 2)
    r.feed(ReadyProbed(lid), 92)
    assert r.m.state is State.READY
    assert MarkReady(lid, 90) in r.actions
    assert SetUpstream(lid, "http://127.0.0.1:18000", "smollm2") in r.actions


def test_a_40_minute_start_inside_its_2700_s_budget_is_waited_for() -> None:
    # DOMAIN §4: default graph is ready after 1542–1583 s and round 2 of graph capture logs
    # nothing for ~17 min; a budget ≥ 2700 s must be honoured, the CPU shows the work going on.
    r = Run()
    r.feed(Apply("test-recipe"), 0)
    lid = r.start(0, budget=2700, stall=600)
    cpu = 0.0
    for t in range(10, 2400, 10):
        cpu += 5.0
        r.feed(CpuSample(lid, cpu), t)
        if t in (60, 300, 900):
            r.feed(PhaseSeen(lid, "graph_capture"), t)
        r.feed(Tick(), t)
        assert r.m.state is State.STARTING, t
    assert progress(r.m, 1350) == 0.5
    r.feed(ReadyProbed(lid), 2400)
    assert r.m.state is State.READY
    assert r.of(StopEngine) == []


def test_budget_exceeded_stops_the_engine_and_fails_without_retry() -> None:
    r = Run()
    r.feed(Apply("test-recipe"), 0)
    lid = r.start(0, budget=2700, stall=600)
    for t in range(10, 2700, 10):
        r.feed(CpuSample(lid, t * 0.5), t)
        r.feed(Tick(), t)
    assert r.m.state is State.STARTING
    out = r.feed(Tick(), 2700)
    assert r.m.state is State.STOPPING
    assert [a for a in out if isinstance(a, StopEngine)]
    r.feed(Stopped(lid, ExitInfo(running=False, signal=15)), 2710)
    assert r.m.state is State.FAILED
    assert r.m.last_failure is not None and r.m.last_failure.code == "ready_budget_exceeded"
    assert any(isinstance(a, MarkEnded) and a.status == "failed" for a in r.actions)


def test_stall_is_no_phase_progress_and_no_cpu_for_the_window() -> None:
    r = Run()
    r.feed(Apply("test-recipe"), 0)
    lid = r.start(0, budget=2700, stall=120)
    r.feed(CpuSample(lid, 10.0), 0)
    # Quiet log but busy CPU: not a stall.
    for t in range(10, 300, 10):
        r.feed(CpuSample(lid, 10.0 + t), t)
        r.feed(Tick(), t)
    assert r.m.state is State.STARTING
    # A phase at 300, then the CPU stops moving (a little noise below the epsilon).
    r.feed(PhaseSeen(lid, "compile"), 300)
    for t in range(310, 420, 10):
        r.feed(CpuSample(lid, 300.1), t)
        r.feed(Tick(), t)
    assert r.m.state is State.STARTING  # 110 s quiet < 120 s
    r.feed(Tick(), 420)
    assert r.m.state is State.STOPPING
    r.feed(Stopped(lid, ExitInfo(running=False, signal=9)), 425)
    assert r.m.state is State.BACKOFF
    assert r.m.last_failure is not None and r.m.last_failure.code == "stalled"
    assert r.m.backoff_until == 435


def test_crash_loop_backs_off_10s_doubling_then_fails_with_the_diagnosis() -> None:
    r = Run(Machine(policy=Policy(max_failures=5)))
    r.feed(Apply("test-recipe"), 0)
    now = 0.0
    delays = []
    for _ in range(5):
        lid = r.start(now)
        now += 30
        r.feed(Exited(lid, ExitInfo(running=False, signal=9), CRASH), now)
        if r.m.state is State.FAILED:
            break
        assert r.m.state is State.BACKOFF
        assert r.m.backoff_until is not None
        delays.append(r.m.backoff_until - now)
        r.feed(Tick(), r.m.backoff_until - 1)
        assert r.m.state is State.BACKOFF
        now = r.m.backoff_until
        r.feed(Tick(), now)
        assert r.m.state is State.PREFLIGHT
    assert delays == [10, 20, 40, 80]
    assert r.m.state is State.FAILED
    assert r.m.last_failure == CRASH
    failed = [a for a in r.actions if isinstance(a, ClearUpstream) and a.reason == "failed"]
    assert failed and failed[-1].hold is None  # a failure for good: nothing is held any more
    assert failed[-1].detail is not None and "killed by SIGKILL" in failed[-1].detail


def test_backoff_is_capped_at_five_minutes() -> None:
    p = Policy()
    assert [backoff_delay(n, p) for n in (1, 2, 3, 4, 5, 6, 7, 12)] == [10, 20, 40, 80, 160, 300, 300, 300]


def test_failure_count_resets_only_after_ready_and_stable_for_the_window() -> None:
    r = Run(Machine(policy=Policy(stable_window_s=600, max_failures=10)))
    r.feed(Apply("test-recipe"), 0)
    lid = r.start(0)
    r.feed(Exited(lid, ExitInfo(running=False, signal=9), CRASH), 10)
    assert r.m.failures == 1
    r.feed(Tick(), 20)
    # Ready, then a crash 5 min later — not stable: the count keeps growing.
    lid = r.start(20)
    r.feed(ReadyProbed(lid), 100)
    r.feed(Tick(), 399)
    assert r.m.failures == 1
    r.feed(Exited(lid, ExitInfo(running=False, exit_code=1), CRASH), 400)
    assert r.m.failures == 2 and r.m.backoff_until == 420
    r.feed(Tick(), 420)
    lid = r.start(420)
    r.feed(ReadyProbed(lid), 500)
    r.feed(Tick(), 1099)
    assert r.m.failures == 2
    r.feed(Tick(), 1100)  # ready for 600 s: stable
    assert r.m.failures == 0
    r.feed(Exited(lid, ExitInfo(running=False, signal=9), CRASH), 5000)
    assert r.m.backoff_until == 5010  # back to the first delay


def test_adoption_probes_and_never_stops_a_healthy_engine() -> None:
    r = Run()
    handle = make_handle("Lold", started_at=-5000)
    out = r.feed(Adopted(handle, make_spec(budget=600), ready_recorded=True), 0)
    assert r.m.state is State.STARTING and r.m.recipe == "test-recipe"
    assert not [a for a in out if isinstance(a, StopEngine | StartEngine)]
    # Its budget ran out long ago, but it gets the adoption grace to answer.
    r.feed(Tick(), 60)
    assert r.m.state is State.STARTING
    r.feed(ReadyProbed("Lold"), 61)
    assert r.m.state is State.READY
    assert r.of(StopEngine) == [] and r.of(StartEngine) == []
    assert SetUpstream("Lold", "http://127.0.0.1:18000", "smollm2") in r.actions
    assert r.of(MarkReady) == []  # its start was recorded by the controller that launched it


def test_an_engine_adopted_mid_start_is_marked_ready_like_any_start() -> None:
    # Issue 23: its record has no ready time yet; the controller that follows it to ready records it.
    r = Run()
    r.feed(Adopted(make_handle("Lmid", started_at=-20), make_spec(budget=600)), 0)
    r.feed(ReadyProbed("Lmid"), 16)
    assert r.m.state is State.READY
    assert r.of(MarkReady) == [MarkReady("Lmid", 36.0)]  # from its real start, not from the adoption


def test_apply_during_a_start_is_rejected_and_changes_nothing() -> None:
    r = Run()
    r.feed(Apply("test-recipe"), 0)
    for busy_state_step in range(2):
        before = r.m
        out = r.feed(Apply("other"), 1)
        assert len(out) == 1 and isinstance(out[0], Reject)
        assert r.m == before
        assert r.m.state in BUSY
        if busy_state_step == 0:
            r.start(2)


def test_apply_over_a_ready_engine_drains_stops_then_starts_the_new_one() -> None:
    r = Run()
    r.feed(Apply("test-recipe"), 0)
    old = r.start(0)
    r.feed(ReadyProbed(old), 50)
    r.feed(Apply("test-recipe", force=True), 100)  # the same spec: only --force restarts it
    assert r.m.state is State.PREFLIGHT and r.m.launch is not None  # old one keeps serving
    new = r.preflight_ok(101)
    assert r.m.state is State.DRAINING
    assert DrainGateway(old, 30.0, hold="restart") in r.actions  # same recipe, forced
    r.feed(Drained(old), 105)
    assert r.m.state is State.STOPPING and r.of(StopEngine)[-1].launch_id == old
    r.feed(Stopped(old, ExitInfo(running=False, exit_code=0)), 110)
    assert r.m.state is State.STARTING
    assert r.of(StartEngine)[-1].launch_id == new
    assert MarkEnded(old, "stopped", None) in r.actions


def test_drain_deadline_stops_anyway() -> None:
    r = Run()
    r.feed(Apply("test-recipe"), 0)
    lid = r.start(0)
    r.feed(ReadyProbed(lid), 50)
    r.feed(Stop(), 100)
    assert r.m.state is State.DRAINING
    r.feed(Tick(), 129)
    assert r.m.state is State.DRAINING
    r.feed(Tick(), 130)
    assert r.m.state is State.STOPPING
    r.feed(Stopped(lid, ExitInfo(running=False, exit_code=0)), 131)
    assert r.m.state is State.IDLE


def test_warm_cache_restart_flow_serves_only_the_warm_start() -> None:
    r = Run()
    r.feed(Apply("test-recipe"), 0)
    cold = r.preflight_ok(0, warm_restart=True, cache_empty=True)
    assert r.of(StartEngine)[-1].kind is StartKind.COLD_WARMUP
    r.feed(Launched(cold, make_handle(cold)), 0)
    r.feed(ReadyProbed(cold), 90)
    assert r.m.state is State.STOPPING
    assert r.of(SetUpstream) == []
    r.feed(Stopped(cold, ExitInfo(running=False, exit_code=0)), 95)
    assert r.m.state is State.PREFLIGHT
    # The second preflight sees a non-empty cache; the launch is the warm one anyway.
    warm = r.preflight_ok(96, warm_restart=True, cache_empty=False)
    assert r.of(StartEngine)[-1].kind is StartKind.WARM
    r.feed(Launched(warm, make_handle(warm)), 96)
    r.feed(ReadyProbed(warm), 130)
    assert r.m.state is State.READY
    assert [a.launch_id for a in r.of(SetUpstream)] == [warm]
    assert MarkReady(cold, 90) in r.actions and MarkReady(warm, 34) in r.actions


def test_a_warm_restart_recipe_with_a_filled_cache_starts_once() -> None:
    r = Run()
    r.feed(Apply("test-recipe"), 0)
    r.preflight_ok(0, warm_restart=True, cache_empty=False)
    assert r.of(StartEngine)[-1].kind is StartKind.NORMAL


def test_stale_answers_about_a_gone_engine_are_ignored() -> None:
    r = Run()
    r.feed(Apply("test-recipe"), 0)
    lid = r.start(0)
    before = r.m
    stale: list[Observation] = [
        ReadyProbed("Lother"), PhaseSeen("Lother", "x"), Exited("Lother", ExitInfo(running=False), CRASH)
    ]
    for obs in stale:
        r.feed(obs, 5)
    assert r.m == before
    # A late preflight answer after a stop is dropped too.
    r.feed(Stop(), 6)
    r.feed(Stopped(lid, ExitInfo(running=False)), 7)
    r.feed(Apply("test-recipe"), 8)
    r.feed(PreflightOk(r.m.token - 1, "Lstale", make_spec(), False, False), 9)
    assert r.m.state is State.PREFLIGHT


def test_stop_while_the_runtime_is_still_launching_stops_it_when_it_appears() -> None:
    r = Run()
    r.feed(Apply("test-recipe"), 0)
    lid = r.preflight_ok(0)
    r.feed(Stop(), 1)
    assert r.m.state is State.STOPPING and r.of(StopEngine) == []
    r.feed(Launched(lid, make_handle(lid)), 2)
    assert r.of(StopEngine)[-1].launch_id == lid
    r.feed(Stopped(lid, ExitInfo(running=False)), 3)
    assert r.m.state is State.IDLE


def test_health_lost_on_a_ready_engine_restarts_it_with_backoff() -> None:
    r = Run()
    r.feed(Apply("test-recipe"), 0)
    lid = r.start(0)
    r.feed(ReadyProbed(lid), 50)
    r.feed(HealthLost(lid, "3 probes failed"), 60)
    assert r.m.state is State.STOPPING
    assert isinstance(r.actions[-3], ClearUpstream)
    r.feed(Stopped(lid, ExitInfo(running=False, signal=9)), 70)
    assert r.m.state is State.BACKOFF and r.m.last_failure is not None
    assert r.m.last_failure.code == "health_lost"


def test_preflight_refusal_keeps_the_old_engine_serving() -> None:
    r = Run()
    r.feed(Apply("test-recipe"), 0)
    lid = r.start(0)
    r.feed(ReadyProbed(lid), 50)
    r.feed(Apply("too-big"), 60)
    refusal = Failure("admission-refused", "needs 35 GiB, host has 27", retryable=False)
    r.feed(PreflightFailed(r.m.token, refusal), 61)
    assert r.m.state is State.READY and r.m.recipe == "test-recipe" and r.m.last_failure == refusal
    # With nothing running, a refusal is final.
    r2 = Run()
    r2.feed(Apply("too-big"), 0)
    r2.feed(PreflightFailed(r2.m.token, refusal), 1)
    assert r2.m.state is State.FAILED


def test_restart_needs_something_to_restart_and_resets_a_failed_machine() -> None:
    r = Run()
    out = r.feed(Restart(), 0)
    assert isinstance(out[0], Reject)
    failed = replace(Machine(), state=State.FAILED, recipe="test-recipe", failures=5)
    r = Run(failed)
    r.feed(Restart(), 0)
    assert r.m.state is State.PREFLIGHT and r.m.failures == 0


# --- failure codes: one spelling, appliance.diagnosis.signatures's ----------------------------------------

CONTROLLER = Path(__file__).resolve().parents[2] / "controller"


def _literal_failure_codes(source: str) -> list[str]:
    """String literals given as the code of a `Failure(...)` in Python source."""
    codes: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Failure"):
            continue
        args = [*node.args[:1], *(k.value for k in node.keywords if k.arg == "code")]
        codes += [a.value for a in args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    return codes


def _diagnosis_spelled(code: str) -> bool:
    return code.lower().replace("-", "_").replace(" ", "_") in {c.value for c in DiagnosisCode}


def test_literal_failure_codes_are_found_and_a_respelled_diagnosis_code_is_caught() -> None:
    src = ('Failure("ready-budget-exceeded", "x")\n'
           'Failure(code="stalled")\n'
           'Failure(DiagnosisCode.STALLED.value)')
    assert _literal_failure_codes(src) == ["ready-budget-exceeded", "stalled"]
    assert all(_diagnosis_spelled(c) for c in _literal_failure_codes(src))
    assert not _diagnosis_spelled("health_lost")


def test_the_controller_never_spells_a_diagnosis_code_itself() -> None:
    # A failure the diagnosis module also knows (stall, spent budget, ...) takes its code from
    # DiagnosisCode: the driver re-diagnoses machine-decided failures by code, the API and the launch
    # records show it, and a second spelling ("ready-budget-exceeded") silently splits them.
    offenders = [
        (str(path.relative_to(CONTROLLER.parent)), code)
        for path in sorted(CONTROLLER.rglob("*.py"))
        for code in _literal_failure_codes(path.read_text())
        if _diagnosis_spelled(code)
    ]
    assert not offenders, offenders


def test_the_machines_own_failures_carry_diagnosis_codes() -> None:
    r = Run()
    r.feed(Apply("test-recipe"), 0)
    r.start(0, budget=100, stall=600)
    r.feed(Tick(), 100)
    assert r.m.stop_failure is not None and r.m.stop_failure.code == DiagnosisCode.READY_BUDGET_EXCEEDED
    r2 = Run()
    r2.feed(Apply("test-recipe"), 0)
    lid = r2.start(0, budget=2700, stall=120)
    r2.feed(CpuSample(lid, 1.0), 0)
    r2.feed(Tick(), 120)
    assert r2.m.stop_failure is not None and r2.m.stop_failure.code == DiagnosisCode.STALLED


def test_apply_of_the_ready_launch_spec_is_a_no_op_that_says_so() -> None:
    """`apply` of the recipe already running once restarted it (95 s of 503) without a word."""
    r = Run()
    r.feed(Apply("test-recipe"), 0)
    lid = r.start(0)
    r.feed(ReadyProbed(lid), 50)
    r.feed(Apply("test-recipe"), 100)
    token = r.m.token
    assert r.m.apply == ApplyOutcome(token, "test-recipe", "pending")
    r.preflight_ok(101)
    assert r.m.state is State.READY and r.m.launch is not None and r.m.launch.launch_id == lid
    assert r.m.apply == ApplyOutcome(token, "test-recipe", "unchanged")
    assert not r.of(DrainGateway) and not r.of(StopEngine)
    assert "already running with this exact launch spec" in r.of(Notify)[-1].message
    # fresh_cache (a cold start on purpose) is a restart, as is --force.
    r.feed(Apply("test-recipe", fresh_cache=True), 200)
    r.preflight_ok(201)
    assert r.m.state is State.DRAINING and r.m.apply is not None and r.m.apply.outcome == "started"


def test_apply_of_an_edited_recipe_restarts_even_though_its_name_is_the_same() -> None:
    """Only the exact spec is a no-op: every test preflight returned the same spec hash, so a mutant
    that compared names only ("unchanged" for an edited recipe) survived the suite."""
    r = Run()
    r.feed(Apply("test-recipe"), 0)
    lid = r.start(0)
    r.feed(ReadyProbed(lid), 50)
    r.feed(Apply("test-recipe"), 100)
    edited = make_spec().model_copy(update={"spec_hash": "edited-" + make_spec().spec_hash})
    r.feed(PreflightOk(r.m.token, "L9", edited, warm_restart=False, cache_empty=False), 101)
    assert r.m.apply is not None and r.m.apply.outcome == "started"
    assert r.m.state is State.DRAINING and r.of(DrainGateway)


def test_a_refused_apply_over_a_ready_engine_is_recorded_as_refused() -> None:
    """`apply X --follow` refused by admission once printed "ready: <old recipe>" and exit 0."""
    r = Run()
    r.feed(Apply("test-recipe"), 0)
    lid = r.start(0)
    r.feed(ReadyProbed(lid), 50)
    r.feed(Apply("too-big"), 100)
    refusal = Failure("admission_refused", "needs 80 GiB, the host has 16", retryable=False)
    r.feed(PreflightFailed(r.m.token, refusal), 101)
    assert r.m.state is State.READY and r.m.recipe == "test-recipe"  # the old engine keeps serving
    assert r.m.apply == ApplyOutcome(r.m.token, "too-big", "refused", refusal)


def test_a_death_takes_the_engine_out_of_the_gateway_before_it_is_classified() -> None:
    """After kill -9 of the engine there were, ~12 s of 502 while `status` said ready."""
    r = Run()
    r.feed(Apply("test-recipe"), 0)
    lid = r.start(0)
    r.feed(ReadyProbed(lid), 50)
    r.actions.clear()
    r.feed(ExitSeen(lid, ExitInfo(running=False, exit_code=137, signal=9)), 100)
    assert r.m.state is State.EXITED
    assert r.actions[-1] == ClearUpstream("engine exited", 10.0, hold="the engine exited; relaunching it")
    assert isinstance(r.feed(Apply("test-recipe"), 100.1)[0], Reject)  # one thing at a time
    r.feed(Exited(lid, ExitInfo(running=False, exit_code=137, signal=9), CRASH), 101)
    assert r.m.state is State.BACKOFF and r.m.launch is None
    assert MarkEnded(lid, "exited", CRASH) in r.actions


def test_stop_while_the_exit_is_classified_ends_idle_not_in_backoff() -> None:
    r = Run()
    r.feed(Apply("test-recipe"), 0)
    lid = r.start(0)
    r.feed(ReadyProbed(lid), 50)
    r.feed(ExitSeen(lid, ExitInfo(running=False, exit_code=137, signal=9)), 100)
    r.feed(Stop(), 100.5)
    assert r.m.state is State.EXITED
    r.feed(Exited(lid, ExitInfo(running=False, exit_code=137, signal=9), CRASH), 101)
    assert r.m.state is State.IDLE and r.m.backoff_until is None


def test_the_backoff_countdown_is_shown_only_while_backing_off_and_never_below_zero() -> None:
    from controller.supervisor.status_view import status

    r = Run()
    r.feed(Apply("test-recipe"), 0)
    lid = r.start(0)
    r.feed(ExitSeen(lid, ExitInfo(running=False, exit_code=137, signal=9)), 10)
    r.feed(Exited(lid, ExitInfo(running=False, exit_code=137, signal=9), CRASH), 11)
    assert r.m.state is State.BACKOFF and r.m.backoff_until is not None
    assert status(r.m, None, r.m.backoff_until - 4.0, None)["backoff_remaining_s"] == 4.0
    assert status(r.m, None, r.m.backoff_until + 3.0, None)["backoff_remaining_s"] == 0.0  # poll not yet come
    starting = replace(r.m, state=State.STARTING)
    assert status(starting, None, r.m.backoff_until + 3.0, None)["backoff_remaining_s"] is None
