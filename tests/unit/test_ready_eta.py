"""appliance/observe/ready_eta.py: earlier launches in, ETA / phase expectations / stall flag out. Plain
values, a fake clock (`now` is a number), golden texts."""

from __future__ import annotations

from appliance.observe.log_phases import Phase
from appliance.observe.ready_eta import (
    PastLaunch,
    PhaseExpectation,
    ReadyEta,
    StallFlag,
    StartState,
    impossible_phases,
    phase_durations,
    ready_eta,
    recipe_skips,
    start_state,
)

WARM, COLD = StartState.WARM, StartState.COLD


def past(launch_id: str, ready_s: float, start: StartState | None = WARM, spec_hash: str = "aaaa",
         compile_s: float = 18.0) -> PastLaunch:
    # process 0, weights 2..10, torch.compile 10..10+compile_s, KV, API up 2 s before ready
    c_end = 10.0 + compile_s
    return PastLaunch(
        launch_id=launch_id, spec_hash=spec_hash, start=start, ready_s=ready_s,
        phases=(("process_started", 0.0), ("weights_loading", 2.0), ("weights_loaded", 10.0),
                ("compile_started", 10.0), ("compile_cache_hit", 11.0), ("compile_finished", c_end),
                ("kv_cache", c_end + 1.0), ("api_up", ready_s - 2.0)),
    )


HISTORY = (past("a", 37.0, compile_s=17.0), past("b", 40.0, compile_s=19.0), past("c", 38.0),
           past("d", 300.0, start=COLD, compile_s=200.0))

T0 = 1000.0  # the fake clock's start of this launch


def eta(now: float, reached: dict[str, float], history: tuple[PastLaunch, ...] = HISTORY,
        start: StartState = WARM, spec_hash: str = "aaaa", skip: frozenset[Phase] = frozenset()) -> ReadyEta:
    return ready_eta(history, spec_hash=spec_hash, start=start, budget_s=600, started_at=T0, now=now,
                     reached=reached, skip=skip)


def test_start_state_prefers_the_logs_proof() -> None:
    assert start_state("hit", True) is WARM
    assert start_state("miss", False) is COLD
    assert start_state(None, True) is COLD
    assert start_state(None, False) is WARM
    assert start_state(None, None) is None


def test_phase_durations_run_to_the_next_phase_and_the_last_to_ready() -> None:
    got = phase_durations((("process_started", 0.0), ("weights_loading", 2.0), ("compile_cache_hit", 3.0),
                           ("weights_loaded", 10.0), ("weights_loading", 12.0), ("api_up", 30.0)), 31.5)
    assert got == {"process_started": 2.0, "weights_loading": 8.0, "weights_loaded": 20.0, "api_up": 1.5}
    assert phase_durations((("process_started", 0.0), ("weights_loading", 2.0)), None) == {
        "process_started": 2.0}


def test_expected_ready_from_the_same_variant_and_cache_state() -> None:
    e = eta(T0, {"process_started": T0})
    assert (e.basis, e.launches, e.median_s, e.min_s, e.max_s, e.remaining_s) == (
        "spec", 3, 38.0, 37.0, 40.0, 38.0)
    assert e.text == "expected ready in ~38 s (warm; 37–40 s over 3 launches)"
    assert e.stall is None
    later = eta(T0 + 20.0, {"process_started": T0, "weights_loading": T0 + 2, "weights_loaded": T0 + 10,
                            "compile_started": T0 + 10})
    assert later.text == "expected ready in ~18 s (warm; 37–40 s over 3 launches)"
    cold = eta(T0 + 100.0, {"process_started": T0}, start=COLD)
    assert cold.text == "expected ready in ~200 s (cold; 300 s over 1 launch)"


def test_past_the_usual_time() -> None:
    e = eta(T0 + 50.0, {"process_started": T0})
    assert e.remaining_s == -12.0
    assert e.text == "past the usual ready time of ~38 s by 12 s (warm; 37–40 s over 3 launches)"


def test_falls_back_to_the_same_recipe_then_to_the_budget() -> None:
    other = tuple(h.model_copy(update={"spec_hash": "bbbb"}) for h in HISTORY)
    e = eta(T0, {}, history=other)
    assert (e.basis, e.launches) == ("recipe", 3)
    assert e.text == "expected ready in ~38 s (warm; 37–40 s over 3 launches of this recipe)"
    none = eta(T0, {}, history=())
    assert (none.basis, none.launches, none.median_s, none.remaining_s) == (None, 0, None, None)
    assert none.text == "no earlier launches of this variant: expected within the ready budget of 600 s"
    only_cold = eta(T0, {}, history=(HISTORY[3],))
    assert only_cold.text == ("no earlier warm launches of this variant: expected within the ready budget "
                              "of 600 s")
    unknown = eta(T0, {}, history=(past("x", 50.0, start=None),))
    assert unknown.launches == 0


def test_each_phase_against_its_history() -> None:
    e = eta(T0 + 25.0, {"process_started": T0, "weights_loading": T0 + 2, "weights_loaded": T0 + 12,
                        "compile_started": T0 + 12})
    by = {p.phase: p for p in e.phases}
    assert by["weights_loading"] == PhaseExpectation(phase="weights_loading", label="loading weights",
                                                     status="done", took_s=10.0, usual_s=8.0, samples=3)
    assert by["compile_started"] == PhaseExpectation(phase="compile_started", label="torch.compile",
                                                     status="current", took_s=13.0, usual_s=18.0, samples=3)
    assert by["kv_cache"].status == "pending" and by["kv_cache"].usual_s == 36.0 - 29.0
    # graph capture never happened in these launches: pending, no history
    assert by["graph_capture"] == PhaseExpectation(phase="graph_capture", label="capturing graphs",
                                                   status="pending", took_s=None, usual_s=None, samples=0)


def test_a_phase_at_several_times_its_usual_duration_is_a_likely_stall() -> None:
    reached = {"process_started": T0, "weights_loading": T0 + 2, "weights_loaded": T0 + 10,
               "compile_started": T0 + 10}
    # 3 × 18 = 54 s and 54 − 18 ≥ 30: flagged at 54 s in torch.compile, not at 53 s
    assert eta(T0 + 63.0, reached).stall is None
    e = eta(T0 + 64.0, reached)
    assert e.stall == StallFlag(phase="compile_started", label="torch.compile", took_s=54.0, usual_s=18.0,
                                text="likely stalled: torch.compile 54 s, usually 18 s")
    late = eta(T0 + 105.0, reached).stall
    assert late is not None and late.text == "likely stalled: torch.compile 95 s, usually 18 s"
    # a short phase needs 30 s more than usual, not just 3×: weights usually take 8 s
    w = {"process_started": T0, "weights_loading": T0 + 2}
    assert eta(T0 + 2 + 37.0, w).stall is None
    assert eta(T0 + 2 + 38.0, w).stall == StallFlag(phase="weights_loading", label="loading weights",
                                                    took_s=38.0, usual_s=8.0,
                                                    text="likely stalled: loading weights 38 s, usually 8 s")
    # no history: never flagged
    assert eta(T0 + 10_000.0, reached, history=()).stall is None


def test_phases_the_recipe_cannot_have_are_not_pending() -> None:
    assert impossible_phases(eager=True, cpu=False) == frozenset(
        {Phase.COMPILE_STARTED, Phase.COMPILE_FINISHED, Phase.GRAPH_CAPTURE, Phase.GRAPH_CAPTURE_DONE})
    assert impossible_phases(eager=False, cpu=True) == frozenset(
        {Phase.GRAPH_CAPTURE, Phase.GRAPH_CAPTURE_DONE})
    assert impossible_phases(eager=False, cpu=False) == frozenset()
    e = eta(T0 + 1, {"process_started": T0}, skip=impossible_phases(eager=True, cpu=False))
    assert [p.phase for p in e.phases] == ["process_started", "weights_loading", "weights_loaded", "kv_cache",
                                           "engine_init_done", "api_starting", "api_up"]
    # seen anyway (the log is the truth): shown
    seen = eta(T0 + 20, {"process_started": T0, "compile_started": T0 + 5},
               skip=impossible_phases(eager=False, cpu=True) | {Phase.COMPILE_STARTED})
    assert "compile_started" in [p.phase for p in seen.phases]


def test_a_launch_specs_skips() -> None:
    assert recipe_skips(("vllm", "serve", "m", "--enforce-eager"), "cuda") == impossible_phases(True, False)
    assert recipe_skips(("vllm", "serve", "m"), "cpu") == impossible_phases(False, True)
    assert recipe_skips(("vllm", "serve", "m"), "cuda") == frozenset()
