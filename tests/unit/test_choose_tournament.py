"""The pure rules of a choice (appliance/evaluation/tournament.py), by equality."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from appliance.evaluation.tournament import (
    DEFAULT_BENCH_S,
    DEFAULT_READY_S,
    ArmCost,
    ChoiceInputError,
    ChoiceRecord,
    Entry,
    arm_cost,
    budget_note,
    choose_baseline,
    judged,
    margin_of,
    markdown,
    next_candidate,
    order,
    over_budget,
    parse_duration,
    plan,
    resumed,
    stop_at_budget,
)
from appliance.recipe.admission import Admission, Check

COST = ArmCost(cold_ready_s=100, warm_ready_s=20, bench_s=60, from_history=True)  # total 260 s
H200_CHOICE = (Path(__file__).resolve().parents[1] / "fixtures" / "evaluation" / "h200-choose-2026-12-02"
               / "choice.json")


def e(name: str, mode: str, margin: float | None, admitted: bool = True, reason: str | None = None) -> Entry:
    return Entry(recipe=name, mode=mode, spec_hash=f"h-{name}", admitted=admitted,
                 admission="admit" if admitted else "refuse", margin_gib=margin, reason=reason)


ENTRIES = [
    e("x-graph-small", "graph", 1.0),
    e("x-eager-big", "eager", 9.0),
    e("x-graph-big", "graph", 5.0),
    e("x-eager-small", "eager", 2.0),
    e("x-tp8", "graph", -3.0, admitted=False, reason="admission: predicted peak exceeds RAM + swap"),
]


def test_the_order_is_eager_first_then_compiled_larger_margin_first() -> None:
    assert [x.recipe for x in order(ENTRIES)] == [
        "x-eager-big", "x-eager-small", "x-graph-big", "x-graph-small"]


def test_the_baseline_is_the_eager_recipe_with_the_largest_margin() -> None:
    assert choose_baseline(ENTRIES, None).recipe == "x-eager-big"
    assert choose_baseline(ENTRIES, "x-graph-big").recipe == "x-graph-big"


def test_a_refused_baseline_is_bad_input_with_its_reason() -> None:
    with pytest.raises(ChoiceInputError, match=r"x-tp8.*refused.*predicted peak"):
        choose_baseline(ENTRIES, "x-tp8")


def test_no_admitted_eager_recipe_means_no_default_baseline() -> None:
    with pytest.raises(ChoiceInputError, match="no admitted eager recipe"):
        choose_baseline([e("g", "graph", 3.0)], None)
    with pytest.raises(ChoiceInputError, match="no recipe is admitted"):
        choose_baseline([e("g", "graph", 3.0, admitted=False)], None)


@pytest.mark.parametrize(
    "text, seconds", [("90s", 90), ("45m", 2700), ("2h", 7200), ("1h30m", 5400), ("30", 30)]
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "2 hours", "h", "1d", "-5m"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ChoiceInputError):
        parse_duration(text)


def test_arm_cost_from_history_and_defaults() -> None:
    history: list[tuple[str | None, float]] = [("cold", 100.0), ("warm", 20.0), ("warm", 30.0), (None, 999.0)]
    assert arm_cost(history, [50.0, 70.0]) == ArmCost(
        cold_ready_s=100, warm_ready_s=25, bench_s=60, from_history=True)
    assert arm_cost([], []) == ArmCost(cold_ready_s=300, warm_ready_s=300, bench_s=600, from_history=False)
    assert COST.total_s == 100 + 20 + 60 * 2 + 20


def test_margin_is_the_smallest_over_the_starts() -> None:
    def check(name: str, margin: float) -> Check:
        return Check(name=name, verdict="admit", message="", numbers={"margin_gib": margin}, fact="")

    checks = (check("memory-peak-cold", 2.5), check("memory-peak-warm", 4.0), check("memlock", -1))
    adm = Admission(recipe="r", verdict="admit", checks=checks)
    assert margin_of(adm) == (2.5, {"margin_gib": 2.5})
    assert margin_of(Admission(recipe="r", verdict="warn", checks=())) == (None, {})


def _plan(**kw: object) -> ChoiceRecord:
    args: dict[str, object] = dict(choice_id="c1", platform="cuda", entries=ENTRIES, pattern="x-*",
                                   baseline=None, costs={x.recipe: COST for x in ENTRIES}, budget_s=None,
                                   started_at=1000.0, serving_before="x-eager-big")
    args.update(kw)
    return plan(**args)  # type: ignore[arg-type]


def test_the_plan_lists_every_recipe_with_why() -> None:
    record = _plan(pattern="x-eager-*,x-graph-big,x-tp8")
    assert [(x.recipe, x.status, x.eta_s) for x in record.lines] == [
        ("x-eager-big", "baseline", None),
        ("x-eager-small", "planned", 260.0),
        ("x-graph-big", "planned", 260.0),
        ("x-graph-small", "not-tried", None),
        ("x-tp8", "refused", None),
    ]
    assert record.line("x-graph-small").why == "not matched by the pattern 'x-eager-*,x-graph-big,x-tp8'"
    assert record.line("x-tp8").why == "admission: predicted peak exceeds RAM + swap"
    assert (record.baseline, record.champion, record.eta_s) == ("x-eager-big", "x-eager-big", 520.0)


def test_the_budget_never_cuts_the_plan_but_a_budget_under_one_arm_is_bad_input() -> None:
    # Past the budget by the ETAs (260 + 260 + 260 s of 600 s): still planned, the turn decides.
    record = _plan(budget_s=600.0)
    assert [x.status for x in record.lines] == [
        "baseline", "planned", "planned", "planned", "refused"]
    assert record.line("x-graph-big").why == "candidate 2 by the rule"
    assert record.line("x-graph-small").why == (
        "candidate 3 by the rule; by the ETA it may not fit: expected 260 s, 80 s of 600 s left at its turn")
    assert record.eta_s == 780.0  # every planned line counted: the forecast is over the budget
    with pytest.raises(ChoiceInputError, match=r"too small for one arm: x-eager-small .* take 260 s"):
        _plan(budget_s=100.0)


# A fresh host (no launch history: the defaults, 2,100 s an arm) and `--budget 40m`, as measured on
# the H200 on 2026-12-02, where the graph gate took 173 s.
FRESH = ArmCost(cold_ready_s=DEFAULT_READY_S, warm_ready_s=DEFAULT_READY_S, bench_s=DEFAULT_BENCH_S,
                from_history=False)
H200 = [e("cuda-smollm2-eager", "eager", 121.4), e("cuda-smollm2-graph", "graph", 121.4),
        e("cuda-smollm2-piecewise", "graph", 121.4)]


def test_a_second_candidate_past_the_budget_by_the_eta_is_planned_with_the_may_not_fit_words() -> None:
    record = plan(choice_id="c", platform="cuda", entries=H200, pattern="cuda-smollm2-*", baseline=None,
                  costs={x.recipe: FRESH for x in H200}, budget_s=2400.0, started_at=0.0)
    assert [(x.recipe, x.status, x.eta_s) for x in record.lines] == [
        ("cuda-smollm2-eager", "baseline", None),
        ("cuda-smollm2-graph", "planned", 2100.0),
        ("cuda-smollm2-piecewise", "planned", 2100.0),
    ]
    assert record.line("cuda-smollm2-graph").why == "candidate 1 by the rule"
    assert record.line("cuda-smollm2-piecewise").why == (
        "candidate 2 by the rule; by the ETA it may not fit: expected 2100 s, 300 s of 2400 s "
        "left at its turn")
    assert record.eta_s == 4200.0
    assert budget_note(record.eta_s, record.budget_s).startswith("a forecast over the budget")
    assert budget_note(2400.0, 2400.0) == "" and budget_note(4200.0, None) == ""


def test_over_budget_is_the_time_spent_plus_the_candidates_eta_against_the_budget() -> None:
    record = plan(choice_id="c", platform="cuda", entries=H200, pattern="cuda-smollm2-*", baseline=None,
                  costs={x.recipe: FRESH for x in H200}, budget_s=2400.0, started_at=0.0)
    piecewise = "cuda-smollm2-piecewise"
    assert not over_budget(record, 173.0, piecewise)  # the graph gate as measured: piecewise is gated
    assert not over_budget(record, 300.0, piecewise)  # ending exactly at the budget fits
    assert over_budget(record, 300.5, piecewise)
    assert not over_budget(record.model_copy(update={"budget_s": None}), 1e9, piecewise)


def test_a_pattern_matching_nothing_is_bad_input_naming_what_there_is() -> None:
    with pytest.raises(ChoiceInputError, match=r"'nope-\*' matches no recipe of platform cuda"):
        _plan(pattern="nope-*")


def test_a_win_makes_the_champion_and_a_loss_keeps_it() -> None:
    record = _plan()
    won = judged(record, "x-eager-small", "accept", "cmp-1", ["faster"], 250.0)
    assert (won.champion, won.champion_verdict) == ("x-eager-small", "accept")
    assert won.line("x-eager-small").model_dump(include={"status", "against", "comparison_id", "took_s"}) == {
        "status": "won", "against": "x-eager-big", "comparison_id": "cmp-1", "took_s": 250.0}
    lost = judged(won, "x-graph-big", "hold", "cmp-2", ["noise"], 1.0)
    assert lost.champion == "x-eager-small" and lost.line("x-graph-big").against == "x-eager-small"
    assert lost.line("x-graph-big").status == "lost"


def test_budget_stop_and_resume() -> None:
    record = _plan()
    stopped = stop_at_budget(record, 700.0, 2000.0)
    assert stopped.state == "stopped-budget" and stopped.ended_at == 2000.0
    assert {x.status for x in stopped.lines} == {"baseline", "not-tried", "refused"}
    cut = record.model_copy(deep=True)
    cut.line("x-eager-small").status = "running"
    again = resumed(cut)
    assert again.line("x-eager-small").status == "planned"
    assert "controller restart" in again.line("x-eager-small").why


OLD_BUDGET_WHY = "budget: expected 2100 s, 300 s of 2400 s left at its turn"


def old_record(state: str = "done") -> ChoiceRecord:
    """A record as earlier versions stored it: the H200 fixture's choice with piecewise cut at plan
    time by the budget, in the words and figures the 2026-12-02 `--budget 40m` run wrote; `running`:
    caught mid-gate of graph by a controller restart."""
    data = json.loads(H200_CHOICE.read_text())
    for x in data["lines"]:
        if x["recipe"] == "cuda-smollm2-piecewise":
            x.update(status="not-tried", why=OLD_BUDGET_WHY, eta_s=2100.0, eta_from_history=False)
        if x["recipe"] == "cuda-smollm2-graph" and state == "running":
            x.update(status="running", verdict=None, comparison_id=None, took_s=None, against=None)
    if state == "running":
        data.update(state="running", ended_at=None, ended_why=None, restored=None,
                    champion=data["baseline"], champion_verdict=None)
    return ChoiceRecord.model_validate(data)


def test_an_old_record_with_plan_time_budget_lines_loads_and_they_stay_not_tried() -> None:
    done = old_record()
    piecewise = done.line("cuda-smollm2-piecewise")
    assert (piecewise.status, piecewise.why) == ("not-tried", OLD_BUDGET_WHY)
    assert f"| not-tried | - | - | - | 35.0 min | - | {OLD_BUDGET_WHY} |" in markdown(done)
    # Caught mid-gate and resumed: the cut gate runs again, the old budget line is not revived.
    again = resumed(old_record("running"))
    assert again.line("cuda-smollm2-graph").status == "planned"
    assert again.line("cuda-smollm2-piecewise").status == "not-tried"
    assert next_candidate(again) == again.line("cuda-smollm2-graph")
    assert next_candidate(judged(again, "cuda-smollm2-graph", "accept", "cmp-x", [], 173.0)) is None


def test_markdown_has_a_row_per_recipe_and_names_fast_mode() -> None:
    text = markdown(_plan(fast=True))
    assert "FAST MODE" in text
    assert sum(line.startswith("| x-") for line in text.splitlines()) == len(ENTRIES)


def test_promotion_is_refused_while_running_for_a_pending_full_run_and_for_no_decision() -> None:
    from appliance.evaluation.tournament import promotion_recorded, promotion_refusal

    record = _plan()
    assert promotion_refusal(record) is not None and "still running" in (promotion_refusal(record) or "")
    won = judged(record, "x-eager-small", "accept-pending-full", "cmp-1", [], 1.0)
    done = won.model_copy(update={"state": "done"})
    assert promotion_refusal(done) == (
        "x-eager-small's gate was ACCEPT-PENDING-FULL: promotion needs the full run first "
        "(appliance compare --full x-eager-big x-eager-small)")
    failed = record.model_copy(update={"state": "failed"})
    assert "no decision to promote" in (promotion_refusal(failed) or "")
    ok = judged(record, "x-eager-small", "accept", "cmp-1", [], 1.0).model_copy(update={"state": "done"})
    assert promotion_refusal(ok) is None
    assert promotion_recorded(ok, 5.0, "the console").model_dump(
        include={"promoted", "promoted_at", "promoted_via"}) == {
        "promoted": "x-eager-small", "promoted_at": 5.0, "promoted_via": "the console"}
