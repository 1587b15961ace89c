"""The transition table, row by row: for each state and observation, the next state and exactly the
notes, records and engine actions that follow. A mutation run over controller/supervisor/machine.py
found most rows pinned only through whole starts (docs/mutation-testing.md): a stop during the
start, a restart from backoff, a launch the runtime could not make, a lost ready engine, an exit seen
in each state. Notes (`Notify`) and records (`MarkEnded`, `MarkReady`) are compared whole: they are the
event log and the launch record. Gateway actions (`ClearUpstream`, `DrainGateway`) are compared by
their reason and timing only, so that what the gateway is told to do with held requests can grow."""

from __future__ import annotations

from dataclasses import replace
from typing import TypeVar

from controller.runtime.base import ExitInfo
from controller.supervisor.machine import AfterStop, Machine, Policy, State, progress, transition
from controller.supervisor.signals import (
    Action,
    Adopted,
    Apply,
    ClearUpstream,
    Drained,
    DrainGateway,
    Exited,
    ExitSeen,
    Failure,
    HealthLost,
    Launched,
    LaunchFailed,
    MarkEnded,
    Notify,
    Observation,
    PreflightFailed,
    PreflightOk,
    ReadyProbed,
    Reject,
    Restart,
    RunPreflight,
    Stop,
    StopEngine,
    Stopped,
    Tick,
)
from tests.unit.supervisor_helpers import make_handle, make_spec

A = TypeVar("A")
CRASH = Failure("signal-kill", "killed by SIGKILL", "look at dmesg", retryable=True)
FATAL = Failure("model_path_invalid", "not a model folder", "fix model.path", retryable=False)
GRACE = Policy().stop_grace_s
RETRY_AFTER = Policy().retry_after_s
GONE = ExitInfo(running=False, signal=15)


class Run:
    def __init__(self) -> None:
        self.m = Machine()
        self.seq = 0

    def feed(self, obs: Observation, now: float) -> list[Action]:
        self.m, actions = transition(self.m, obs, now)
        return actions

    def preflight(self, now: float = 0.0, recipe: str = "test-recipe") -> None:
        self.feed(Apply(recipe), now)

    def preflight_ok(self, now: float, recipe: str = "test-recipe") -> str:
        self.seq += 1
        lid = f"L{self.seq}"
        self.feed(PreflightOk(self.m.token, lid, make_spec(recipe=recipe), False, False), now)
        return lid

    def starting(self, now: float = 0.0, launched: bool = True) -> str:
        self.preflight(now)
        lid = self.preflight_ok(now)
        if launched:
            self.feed(Launched(lid, make_handle(lid, started_at=now)), now)
        return lid

    def ready(self, now: float = 0.0) -> str:
        lid = self.starting(now)
        self.feed(ReadyProbed(lid), now + 50)
        assert self.m.state is State.READY
        return lid

    def backoff(self, now: float = 0.0) -> str:
        lid = self.starting(now)
        self.feed(Exited(lid, ExitInfo(running=False, exit_code=137), CRASH), now + 5)
        assert self.m.state is State.BACKOFF
        return lid


def only(actions: list[Action], kind: type[A]) -> list[A]:
    return [a for a in actions if isinstance(a, kind)]


def kinds(actions: list[Action]) -> list[str]:
    return [a.kind if isinstance(a, Notify) else type(a).__name__ for a in actions]


def clear_of(actions: list[Action]) -> tuple[str, float]:
    (clear,) = only(actions, ClearUpstream)
    return clear.reason, clear.retry_after_s


# ---- stop, in every state ---------------------------------------------------------------------


def test_stop_of_a_ready_engine_drains_it_then_stops_it_then_idles() -> None:
    r = Run()
    lid = r.ready()
    out = r.feed(Stop(), 100)
    assert (r.m.state, r.m.after_stop, r.m.drain_until) == (State.DRAINING, AfterStop.IDLE, 130.0)
    assert out[0] == Notify("draining", "draining test-recipe", lid)
    (drain,) = only(out, DrainGateway)
    assert (drain.launch_id, drain.deadline_s) == (lid, 30.0)
    out = r.feed(Drained(lid), 101)
    assert r.m.state is State.STOPPING and out == [StopEngine(lid, make_handle(lid), GRACE)]
    out = r.feed(Stopped(lid, GONE), 102)
    assert r.m.state is State.IDLE and r.m.launch is None
    assert out[0] == MarkEnded(lid, "stopped", None)
    assert out[1] == Notify("idle", "engine stopped") and clear_of(out) == ("stopped", RETRY_AFTER)


def test_a_drain_that_outlives_its_deadline_is_stopped_anyway() -> None:
    r = Run()
    lid = r.ready()
    r.feed(Stop(), 100)
    assert r.feed(Tick(), 129.9) == [] and r.m.state is State.DRAINING
    assert r.feed(Tick(), 130) == [StopEngine(lid, make_handle(lid), GRACE)]
    assert (r.m.state, r.m.drain_until) == (State.STOPPING, None)


def test_stop_during_the_preflight_of_a_new_recipe_drains_the_old_engine_and_drops_the_answer() -> None:
    r = Run()
    old = r.ready()
    r.preflight(100, recipe="other")
    token = r.m.token
    r.feed(Stop(), 101)
    assert (r.m.state, r.m.token, r.m.after_stop) == (State.DRAINING, token + 1, AfterStop.IDLE)
    # The preflight's late answer starts nothing.
    late = PreflightOk(token, "L9", make_spec(recipe="other"), False, False)
    assert r.feed(late, 102) == [] and r.m.state is State.DRAINING
    r.feed(Drained(old), 103)
    r.feed(Stopped(old, GONE), 104)
    assert r.m.state is State.IDLE


def test_stop_during_a_start_stops_without_a_drain() -> None:
    r = Run()
    lid = r.starting(10)
    out = r.feed(Stop(), 20)
    assert (r.m.state, r.m.after_stop, r.m.stop_failure) == (State.STOPPING, AfterStop.IDLE, None)
    assert out == [Notify("stop", "stop requested during the start", lid),
                   StopEngine(lid, make_handle(lid, started_at=10), GRACE)]
    out = r.feed(Stopped(lid, GONE), 21)
    assert out[0] == MarkEnded(lid, "stopped", None) and r.m.state is State.IDLE


def test_stop_before_the_runtime_answered_stops_the_engine_once_it_is_launched() -> None:
    r = Run()
    lid = r.starting(10, launched=False)
    out = r.feed(Stop(), 11)
    assert r.m.state is State.STOPPING and out == [Notify("stop", "stop requested during the start", lid)]
    out = r.feed(Launched(lid, make_handle(lid, started_at=12)), 12)
    assert out == [StopEngine(lid, make_handle(lid, started_at=12), GRACE)]
    assert r.m.state is State.STOPPING


def test_stop_while_draining_for_an_apply_cancels_the_new_start() -> None:
    r = Run()
    old = r.ready()
    r.preflight(100, recipe="other")
    r.preflight_ok(101, recipe="other")
    assert (r.m.state, r.m.after_stop) == (State.DRAINING, AfterStop.LAUNCH) and r.m.pending is not None
    out = r.feed(Stop(), 102)
    assert out == [Notify("stop", "stop requested")]
    assert (r.m.state, r.m.after_stop, r.m.pending) == (State.DRAINING, AfterStop.IDLE, None)
    r.feed(Drained(old), 103)
    r.feed(Stopped(old, GONE), 104)
    assert r.m.state is State.IDLE and r.m.launch is None


def test_stop_while_an_exit_is_classified_ends_idle_not_in_backoff() -> None:
    r = Run()
    lid = r.ready()
    r.feed(ExitSeen(lid, ExitInfo(running=False, exit_code=1)), 100)
    assert r.m.state is State.EXITED
    out = r.feed(Stop(), 101)
    assert out == [Notify("stop", "stop requested")] and r.m.halt and r.m.state is State.EXITED
    out = r.feed(Exited(lid, ExitInfo(running=False, exit_code=1), CRASH), 102)
    assert r.m.state is State.IDLE and (r.m.halt, r.m.failures, r.m.last_failure) == (False, 0, CRASH)
    assert kinds(out) == ["MarkEnded", "exited", "ClearUpstream", "idle", "ClearUpstream"]


def test_stop_in_backoff_failed_or_a_bare_preflight_goes_idle_and_ignores_late_answers() -> None:
    for prepare in ("backoff", "failed", "preflight"):
        r = Run()
        if prepare == "backoff":
            r.backoff()
        elif prepare == "failed":
            lid = r.starting()
            r.feed(Exited(lid, ExitInfo(running=False, exit_code=1), FATAL), 5)
            assert r.m.state is State.FAILED
        else:
            r.preflight()
        token = r.m.token
        out = r.feed(Stop(), 50)
        assert (r.m.state, r.m.token, r.m.backoff_until, r.m.pending) == (State.IDLE, token + 1, None, None)
        assert out[0] == Notify("stop", "stop requested") and clear_of(out) == ("stopped", RETRY_AFTER)
        assert r.feed(PreflightOk(token, "L9", make_spec(), False, False), 51) == []
        assert r.m.state is State.IDLE
        assert r.feed(Tick(), 10_000) == [] and r.m.state is State.IDLE  # no relaunch either


def test_stop_when_idle_does_nothing() -> None:
    r = Run()
    assert r.feed(Stop(), 0) == [] and r.m == Machine()


# ---- restart ----------------------------------------------------------------------------------


def test_restart_is_refused_while_a_start_is_in_progress_and_when_nothing_was_applied() -> None:
    assert Run().feed(Restart(), 0) == [Reject("no recipe has been applied: nothing to restart")]
    r = Run()
    r.preflight()
    assert r.feed(Restart(), 1) == [Reject("an engine start is in progress (state preflight)")]
    assert r.feed(Apply("x"), 1) == [
        Reject("an engine start is in progress (state preflight); wait for it or stop it first")]


def test_restart_of_a_ready_engine_without_blue_green_drains_it_then_preflights_the_same_recipe() -> None:
    r = Run()
    lid = r.ready()
    r.m = replace(r.m, failures=2)
    r.feed(Restart(blue_green=False), 100)
    assert (r.m.state, r.m.after_stop, r.m.failures) == (State.DRAINING, AfterStop.PREFLIGHT, 0)
    r.feed(Drained(lid), 101)
    token = r.m.token
    out = r.feed(Stopped(lid, GONE), 102)
    assert out == [MarkEnded(lid, "stopped", None), RunPreflight(token + 1, "test-recipe")]
    assert r.m.state is State.PREFLIGHT


def test_restart_of_a_ready_engine_preflights_while_it_serves_then_starts_beside_it_when_it_fits() -> None:
    r = Run()
    lid = r.ready()
    r.m = replace(r.m, failures=2)
    token = r.m.token
    out = r.feed(Restart(), 100)
    # Nothing drained yet: the engine serves while the same recipe's preflight runs.
    assert out == [Notify("restart", "restart test-recipe"), RunPreflight(token + 1, "test-recipe")]
    assert (r.m.state, r.m.failures, r.m.force, r.m.blue_green) == (State.PREFLIGHT, 0, True, True)
    assert r.m.launch is not None and r.m.launch.launch_id == lid
    # The driver found it fits beside (blue_green.py): the new launch starts, the old one serves on.
    spec = make_spec(recipe="test-recipe").model_copy(update={"port": 8001})
    out = r.feed(PreflightOk(r.m.token, "L2", spec, False, False, beside=True), 101)
    assert kinds(out) == ["blue-green", "StartEngine"] and not only(out, DrainGateway)
    assert r.m.state is State.STARTING and r.m.old is not None and r.m.old.launch_id == lid
    assert r.m.force is False  # spent on this preflight


def test_restart_of_a_ready_engine_that_does_not_fit_beside_drains_under_a_restart_hold() -> None:
    r = Run()
    lid = r.ready()
    r.feed(Restart(), 100)
    out = r.feed(PreflightOk(r.m.token, "L2", make_spec(recipe="test-recipe"), False, False), 101)
    (drain,) = only(out, DrainGateway)
    assert (drain.launch_id, drain.hold) == (lid, "restart")
    assert (r.m.state, r.m.after_stop, r.m.force) == (State.DRAINING, AfterStop.LAUNCH, False)


def test_a_refused_restart_preflight_leaves_the_ready_engine_serving() -> None:
    r = Run()
    lid = r.ready()
    r.feed(Restart(), 100)
    out = r.feed(PreflightFailed(r.m.token, FATAL), 101)
    assert kinds(out) == ["preflight-failed"]
    assert r.m.state is State.READY and r.m.launch is not None and r.m.launch.launch_id == lid
    assert r.m.force is False


def test_restart_in_backoff_preflights_at_once_and_clears_the_count() -> None:
    r = Run()
    r.backoff(0)
    token = r.m.token
    out = r.feed(Restart(), 6)
    assert out == [Notify("restart", "restart test-recipe"), RunPreflight(token + 1, "test-recipe")]
    assert (r.m.state, r.m.token, r.m.failures, r.m.backoff_until) == (State.PREFLIGHT, token + 1, 0, None)


# ---- the runtime's answers --------------------------------------------------------------------


def test_a_launch_the_runtime_could_not_make_is_recorded_failed_then_backs_off_or_fails() -> None:
    r = Run()
    lid = r.starting(0, launched=False)
    out = r.feed(LaunchFailed(lid, CRASH), 3)
    assert out[0] == MarkEnded(lid, "failed", CRASH)
    assert (r.m.state, r.m.launch, r.m.failures, r.m.backoff_until) == (State.BACKOFF, None, 1, 13.0)
    r = Run()
    lid = r.starting(0, launched=False)
    out = r.feed(LaunchFailed(lid, FATAL), 3)
    assert out[0] == MarkEnded(lid, "failed", FATAL) and r.m.state is State.FAILED
    assert out[1] == Notify("failed", "failed (not retryable): not a model folder", data={
        "code": "model_path_invalid", "summary": "not a model folder", "hint": "fix model.path",
        "retryable": False})


def test_a_launch_failure_during_a_stop_ends_as_the_stop_would_and_strangers_are_ignored() -> None:
    r = Run()
    lid = r.starting(0, launched=False)
    r.feed(Stop(), 1)
    out = r.feed(LaunchFailed(lid, CRASH), 2)
    assert out[0] == MarkEnded(lid, "failed", CRASH) and r.m.state is State.IDLE and r.m.failures == 0
    r = Run()
    r.starting(0, launched=False)
    before = r.m
    assert r.feed(LaunchFailed("someone-else", CRASH), 2) == [] and r.m == before


def test_launched_starts_the_budget_clock_and_an_unwanted_engine_is_stopped() -> None:
    r = Run()
    lid = r.starting(0, launched=False)
    out = r.feed(Launched(lid, make_handle(lid, started_at=7)), 7)
    assert out == [Notify("launched", "normal start of test-recipe, ready budget 600 s", lid,
                          {"kind": "normal", "ref": "4242", "budget_s": 600})]
    assert r.m.launch is not None and (r.m.launch.started_at, r.m.launch.deadline) == (7, 607)
    assert progress(r.m, 307) == 0.5 and progress(r.m, 10_000) == 1.0 and progress(r.m, 0) == 0.0
    stray = make_handle("L77", ref="9999")
    assert r.feed(Launched("L77", stray), 8) == [StopEngine("L77", stray, GRACE)]


# ---- a ready engine that stops answering, an engine that dies ----------------------------------


def test_a_ready_engine_that_stops_answering_is_stopped_then_backs_off() -> None:
    r = Run()
    lid = r.ready()
    assert r.feed(HealthLost("other", "timeout"), 100) == []
    out = r.feed(HealthLost(lid, "3 probes timed out"), 100)
    assert r.m.state is State.STOPPING and r.m.stop_failure is not None
    assert (r.m.stop_failure.code, r.m.stop_failure.retryable) == ("health_lost", True)
    assert r.m.stop_failure.summary == "the ready engine stopped answering: 3 probes timed out"
    assert clear_of(out) == ("engine not answering", RETRY_AFTER)
    assert Notify("health-lost", "the ready engine stopped answering: 3 probes timed out", lid) in out
    assert out[-1] == StopEngine(lid, make_handle(lid), GRACE)
    out = r.feed(Stopped(lid, GONE), 101)
    assert out[0] == MarkEnded(lid, "failed", r.m.last_failure) and r.m.state is State.BACKOFF
    # Not while starting: a start's own probes decide there.
    s = Run()
    sid = s.starting()
    assert s.feed(HealthLost(sid, "timeout"), 5) == [] and s.m.state is State.STARTING


def test_a_death_seen_takes_the_engine_out_of_the_gateway_in_every_state_that_served_it() -> None:
    r = Run()
    lid = r.ready()
    out = r.feed(ExitSeen(lid, ExitInfo(running=False, exit_code=1, signal=None)), 100)
    assert r.m.state is State.EXITED
    assert out[0] == Notify("exit-seen", "the engine ended (exit code 1); out of the gateway, classifying "
                            "the exit", lid, {"exit_code": 1, "signal": None})
    assert clear_of(out) == ("engine exited", RETRY_AFTER)
    unknown = Run()
    uid = unknown.starting()
    out = unknown.feed(ExitSeen(uid, ExitInfo(running=False, exit_code=None, signal=9)), 5)
    assert "(exit status unknown)" in out[0].message and unknown.m.state is State.EXITED  # type: ignore[union-attr]
    # The old engine dies while a new recipe's preflight runs: out of the gateway, preflight goes on.
    p = Run()
    old = p.ready()
    p.preflight(100, recipe="other")
    out = p.feed(ExitSeen(old, ExitInfo(running=False, exit_code=1)), 101)
    assert p.m.state is State.PREFLIGHT and kinds(out) == ["exit-seen", "ClearUpstream"]
    out = p.feed(Exited(old, ExitInfo(running=False, exit_code=1), CRASH), 102)
    assert p.m.state is State.PREFLIGHT and p.m.launch is None and p.m.last_failure == CRASH
    assert kinds(out) == ["MarkEnded", "exited", "ClearUpstream"]
    # Draining: already out of the gateway; its exit ends the stop.
    d = Run()
    did = d.ready()
    d.feed(Stop(), 100)
    assert d.feed(ExitSeen(did, ExitInfo(running=False, exit_code=0)), 101) == []
    out = d.feed(Exited(did, ExitInfo(running=False, exit_code=0), CRASH), 102)
    assert d.m.state is State.IDLE and out[0] == MarkEnded(did, "exited", CRASH)
    # Stopping: our own stop; Stopped reports it.
    s = Run()
    sid = s.starting()
    s.feed(Stop(), 1)
    assert s.feed(ExitSeen(sid, ExitInfo(running=False, exit_code=0)), 2) == []
    assert s.feed(Exited(sid, ExitInfo(running=False, exit_code=0), CRASH), 2) == []
    assert s.m.state is State.STOPPING


def test_an_exit_during_the_start_backs_off_with_its_failure_recorded() -> None:
    r = Run()
    lid = r.starting()
    out = r.feed(Exited(lid, ExitInfo(running=False, exit_code=137), CRASH), 5)
    assert out[0] == MarkEnded(lid, "exited", CRASH)
    assert out[1] == Notify("exited", "killed by SIGKILL", lid, {
        "code": "signal-kill", "summary": "killed by SIGKILL", "hint": "look at dmesg", "retryable": True})
    assert out[3] == Notify("backoff", "failure 1: retry in 10 s (signal-kill)", data={
        "delay_s": 10.0, "failures": 1, "code": "signal-kill", "summary": "killed by SIGKILL",
        "hint": "look at dmesg", "retryable": True})
    assert clear_of(out[-1:]) == ("backoff", 10.0)
    assert (r.m.state, r.m.failures, r.m.backoff_until, r.m.last_failure) == (State.BACKOFF, 1, 15.0, CRASH)


def test_the_fifth_failure_in_a_row_fails_for_good() -> None:
    r = Run()
    r.m = replace(r.m, failures=4)
    lid = r.starting()
    r.m = replace(r.m, failures=4)
    out = r.feed(Exited(lid, ExitInfo(running=False, exit_code=137), CRASH), 5)
    assert r.m.state is State.FAILED and r.m.failures == 5
    assert Notify("failed", "failed (5 consecutive failures): killed by SIGKILL", data={
        "code": "signal-kill", "summary": "killed by SIGKILL", "hint": "look at dmesg",
        "retryable": True}) in out
    assert ("failed", RETRY_AFTER) in [(c.reason, c.retry_after_s) for c in only(out, ClearUpstream)]


# ---- time -------------------------------------------------------------------------------------


def test_backoff_relaunches_when_its_delay_is_over() -> None:
    r = Run()
    r.backoff(0)
    assert r.feed(Tick(), 14.9) == []
    token = r.m.token
    out = r.feed(Tick(), 15)
    assert out == [Notify("relaunch", "relaunching test-recipe after failure 1"),
                   RunPreflight(token + 1, "test-recipe")]
    assert (r.m.state, r.m.backoff_until) == (State.PREFLIGHT, None)


def test_a_stable_ready_engine_resets_the_failure_count_once() -> None:
    r = Run()
    lid = r.ready(0)  # ready at 50
    r.m = replace(r.m, failures=3)
    assert r.feed(Tick(), 649) == []
    out = r.feed(Tick(), 650)
    assert out == [Notify("backoff-reset", "stable for 600 s: failure count reset", lid, {"failures": 3})]
    assert r.m.failures == 0 and r.feed(Tick(), 2000) == []


def test_a_spent_budget_names_the_last_phase() -> None:
    r = Run()
    lid = r.starting(0)
    out = r.feed(Tick(), 600)
    assert r.m.state is State.STOPPING and r.m.stop_failure is not None
    assert r.m.stop_failure.summary == "not ready after 600 s (last phase: none)"
    assert out[0].kind == "ready_budget_exceeded" and out[-1] == StopEngine(  # type: ignore[union-attr]
        lid, make_handle(lid), GRACE)


# ---- adoption ---------------------------------------------------------------------------------


def test_an_engine_found_at_start_up_is_adopted_only_by_an_idle_supervisor() -> None:
    h = make_handle("L5", ref="5555", started_at=0)
    r = Run()
    out = r.feed(Adopted(h, make_spec()), 100)
    assert out == [Notify("adopted", "adopted running engine 5555 (test-recipe)", "L5", {"ref": "5555"})]
    assert r.m.state is State.STARTING and r.m.recipe == "test-recipe"
    assert r.m.launch is not None and r.m.launch.deadline == 600  # its own budget, past the grace
    busy = Run()
    busy.preflight()
    assert busy.feed(Adopted(h, make_spec()), 1) == [
        Notify("adopt-skipped", "engine 5555 found but the supervisor is busy")]


# ---- second pass: rows the first pass left open -------------------------------------------------


def test_observations_about_another_launch_change_nothing() -> None:
    from controller.supervisor.signals import CpuSample, PhaseSeen

    r = Run()
    r.ready(0)
    before = r.m
    for obs in (CpuSample("L9", 5.0), PhaseSeen("L9", "graph_capture", "x"), ReadyProbed("L9"),
                ExitSeen("L9", ExitInfo(running=False, exit_code=1)), Stopped("L9", GONE), Drained("L9"),
                HealthLost("L9", "timeout"), Exited("L9", ExitInfo(running=False, exit_code=1), CRASH)):
        assert r.feed(obs, 60) == [], obs
        assert r.m == before, obs


def test_a_stale_preflight_refusal_is_ignored() -> None:
    r = Run()
    r.backoff(0)
    r.feed(Tick(), 15)  # relaunch: a new preflight
    stale = r.m.token - 1
    assert r.feed(PreflightFailed(stale, FATAL), 16) == [] and r.m.state is State.PREFLIGHT


def test_a_retryable_preflight_failure_backs_off_from_its_own_time() -> None:
    r = Run()
    r.preflight(0)
    unreadable = Failure("host_facts_unreadable", "cannot read /proc/meminfo", "", retryable=True)
    out = r.feed(PreflightFailed(r.m.token, unreadable), 7)
    assert out[0] == Notify("preflight-failed", "cannot read /proc/meminfo", data={
        "code": "host_facts_unreadable", "summary": "cannot read /proc/meminfo", "hint": "",
        "retryable": True})
    assert (r.m.state, r.m.backoff_until) == (State.BACKOFF, 17.0)


def test_a_refused_apply_over_a_ready_engine_is_noted_and_the_old_engine_keeps_serving() -> None:
    r = Run()
    r.ready(0)
    r.preflight(100, recipe="too-big")
    refusal = Failure("admission_refused", "needs 80 GiB", "smaller model", retryable=False)
    out = r.feed(PreflightFailed(r.m.token, refusal), 101)
    assert out == [Notify("preflight-failed", "needs 80 GiB", data={
        "code": "admission_refused", "summary": "needs 80 GiB", "hint": "smaller model", "retryable": False})]
    assert (r.m.state, r.m.recipe, r.m.last_failure) == (State.READY, "test-recipe", refusal)


def test_a_relaunch_refused_by_preflight_does_not_rewrite_the_applys_outcome() -> None:
    r = Run()
    r.backoff(0)
    assert r.m.apply is not None and r.m.apply.outcome == "started"
    r.feed(Tick(), 15)
    unreadable = Failure("host_facts_unreadable", "cannot read", "", retryable=True)
    r.feed(PreflightFailed(r.m.token, unreadable), 16)
    assert r.m.apply.outcome == "started"


def test_an_apply_clears_the_failure_count_and_the_backoff() -> None:
    r = Run()
    r.backoff(0)
    r.m = replace(r.m, failures=3)
    out = r.feed(Apply("test-recipe", fresh_cache=True), 6)
    assert (r.m.state, r.m.failures, r.m.backoff_until, r.m.pending) == (State.PREFLIGHT, 0, None, None)
    assert out == [Notify("apply", "apply test-recipe", data={"recipe": "test-recipe", "fresh_cache": True}),
                   RunPreflight(r.m.token, "test-recipe", True)]


def test_an_apply_of_the_running_launch_is_noted_against_that_launch() -> None:
    r = Run()
    lid = r.ready(0)
    r.preflight(100)
    ok = PreflightOk(r.m.token, "L9", make_spec(), False, False)
    out = r.feed(ok, 101)
    assert out == [Notify("unchanged", "test-recipe is already running with this exact launch spec "
                          "(0123456789abcdef): nothing restarted (use --force to restart it)", lid)]
    assert r.m.state is State.READY


def test_the_stall_clock_starts_when_the_runtime_has_launched_the_engine() -> None:
    r = Run()
    r.preflight(0)
    lid = r.preflight_ok(0)
    r.feed(Launched(lid, make_handle(lid, started_at=100)), 100)  # the runtime took 100 s
    assert r.feed(Tick(), 219) == [] and r.m.state is State.STARTING  # stall window 120 s
    r.feed(Tick(), 220)
    assert r.m.state is State.STOPPING and r.m.stop_failure is not None
    assert r.m.stop_failure.code == "stalled" and r.m.stop_failure.retryable


def test_cpu_time_keeps_a_quiet_start_alive_from_each_sample_that_shows_work() -> None:
    from controller.supervisor.signals import CpuSample

    r = Run()
    lid = r.starting(0)  # stall window 120 s
    r.feed(CpuSample(lid, 0.0), 10)  # the reference
    r.feed(CpuSample(lid, 1.0), 20)  # work
    r.feed(CpuSample(lid, 1.5), 30)  # exactly the 0.5 s epsilon: work too
    assert r.feed(Tick(), 149) == [] and r.m.state is State.STARTING
    r.feed(Tick(), 150)
    assert r.m.state is State.STOPPING


def test_a_phase_restarts_the_stall_clock_and_is_noted_when_recorded() -> None:
    from controller.supervisor.signals import PhaseSeen

    r = Run()
    lid = r.starting(0)
    out = r.feed(PhaseSeen(lid, "graph_capture", "capturing graphs 3/51"), 100)
    assert out == [Notify("phase", "capturing graphs 3/51", lid, {"phase": "graph_capture"})]
    assert r.m.launch is not None and (r.m.launch.phase, r.m.launch.progress_at) == ("graph_capture", 100)
    assert r.feed(Tick(), 219) == [] and r.m.state is State.STARTING


def test_a_cold_warm_up_restarts_warm_and_the_second_ready_is_the_one_served() -> None:
    r = Run()
    r.preflight(0)
    r.feed(PreflightOk(r.m.token, "L1", make_spec(), True, True), 0)
    r.feed(Launched("L1", make_handle("L1")), 0)
    out = r.feed(ReadyProbed("L1"), 351.2341)
    assert out[1] == Notify(
        "warmup-ready", "cold start ready in 351.234 s; restarting on the same cache root", "L1",
        {"ready_s": 351.234})
    assert r.m.state is State.STOPPING and r.m.launch is not None and r.m.launch.ready_at == 351.2341
    r.feed(Stopped("L1", GONE), 352)
    assert r.m.state is State.PREFLIGHT
    r.feed(PreflightOk(r.m.token, "L2", make_spec(), True, False), 353)
    r.feed(Launched("L2", make_handle("L2", started_at=353)), 353)
    out = r.feed(ReadyProbed("L2"), 583)
    assert Notify("ready", "test-recipe ready in 230 s", "L2", {"ready_s": 230, "kind": "warm"}) in out


def test_a_ready_engine_clears_the_last_failure_and_one_failure_resets_after_the_window() -> None:
    r = Run()
    r.backoff(0)
    r.feed(Tick(), 15)
    lid = r.preflight_ok(16)
    r.feed(Launched(lid, make_handle(lid, started_at=16)), 16)
    r.feed(ReadyProbed(lid), 40)
    assert (r.m.state, r.m.last_failure, r.m.failures) == (State.READY, None, 1)
    out = r.feed(Tick(), 640)
    assert r.m.failures == 0 and out[0].kind == "backoff-reset"  # type: ignore[union-attr]


def test_an_adopted_engine_gets_its_stall_window_from_adoption() -> None:
    r = Run()
    h = make_handle("L5", started_at=0)
    r.feed(Adopted(h, make_spec(budget=5000)), 1000)
    assert r.feed(Tick(), 1119) == [] and r.m.state is State.STARTING
    r.feed(Tick(), 1120)
    assert r.m.state is State.STOPPING


def test_the_first_exit_note_tells_the_gateway_when_to_retry() -> None:
    r = Run()
    lid = r.starting()
    out = r.feed(Exited(lid, ExitInfo(running=False, exit_code=137), CRASH), 5)
    assert [(c.reason, c.retry_after_s) for c in only(out, ClearUpstream)] == [
        ("engine exited", RETRY_AFTER), ("backoff", 10.0)]


def test_a_lost_engine_is_restarted_with_the_hint_to_read_its_log() -> None:
    r = Run()
    lid = r.ready()
    r.feed(HealthLost(lid, "timeout"), 100)
    assert r.m.stop_failure is not None
    assert r.m.stop_failure.hint == "see the log tail; the engine is restarted"


def test_late_answers_for_the_current_launch_are_ignored_outside_their_state() -> None:
    r = Run()
    lid = r.ready(0)
    before = r.m
    assert r.feed(ReadyProbed(lid), 60) == [] and r.m == before  # ready once, recorded once
    assert r.feed(Drained(lid), 61) == [] and r.m == before  # no drain was asked for


def test_a_spent_budget_is_noted_with_its_failure_against_the_launch() -> None:
    r = Run()
    lid = r.starting(0)
    out = r.feed(Tick(), 600)
    assert r.m.stop_failure is not None
    assert out[0] == Notify("ready_budget_exceeded", "not ready after 600 s (last phase: none)", lid, {
        "code": "ready_budget_exceeded", "summary": "not ready after 600 s (last phase: none)",
        "hint": r.m.stop_failure.hint, "retryable": False})
