"""Issue 33: the gate's verdicts an operator can stake a recipe on — the pure protocol's side.

One test (or one parametrised set) per rule, each with the boundary the mutation run found
unpinned. The builders are test_protocol.py's."""

from __future__ import annotations

import pytest

from appliance.evaluation.accuracy import AccuracyResult, Kind, score_item, scored_text
from appliance.evaluation.accuracy import build_set as _build_set
from appliance.evaluation.bench_result import BenchResult
from appliance.evaluation.bench_tiers import SEED_TIERS, TierPlan, output_limit, plan_tiers
from appliance.evaluation.gate import Flag, StepStatus, Verdict
from appliance.evaluation.protocol import Thresholds, Tokens, gate, needs_more_rounds
from tests.unit.test_protocol import GOOD_ACC, _acc, _arms, _run, _smoke, _step

# ---- item 3: re-runs until >= 3 rounds AND every tier's spread < 5 %


def _rounds(cand_gains: list[float], *, tier_jitter: list[tuple[float, float, float]] | None = None):  # type: ignore[no-untyped-def]
    base = [_run("base", k, smoke=_smoke() if k == 0 else None, accuracy=_acc(GOOD_ACC))
            for k in range(len(cand_gains))]
    cand = []
    for k, gain in enumerate(cand_gains):
        jitter = tier_jitter[k] if tier_jitter else (1.0, 1.0, 1.0)
        seconds = tuple(10 / gain / j for j in jitter)
        cand.append(_run("cand", k, seconds=seconds, smoke=_smoke() if k == 0 else None,  # type: ignore[arg-type]
                         accuracy=_acc(GOOD_ACC)))
    return base, cand


def test_a_small_gain_then_a_large_one_is_rerun_not_ended_on_two_rounds() -> None:
    """+2 % then +6 %: the median (+4 %) left the band, which used to end the re-runs (ACCEPT on two
    rounds, spread never checked). The bar stays due once a small gain was seen."""
    base, cand = _rounds([1.02, 1.06])
    assert needs_more_rounds(base, cand, Thresholds())
    g = gate(base, cand)
    step = _step(g, "re-runs")
    assert step.status is StepStatus.HOLD and "not shown stable" in step.reasons[0]
    assert step.evidence["small_gain_seen"] is True
    assert g.verdict is Verdict.NOISE


def test_a_tier_spread_over_five_percent_holds_even_when_the_score_is_stable() -> None:
    """Per tier, as seed 003 §695 says, not on the weighted score alone: 4-8K swings ±4 % while the
    8-16K tier moves the other way and the score barely moves."""
    jitter = [(1.0, 1.0, 1.0), (1.04, 0.985, 1.0), (0.96, 1.015, 1.0)]
    base, cand = _rounds([1.02, 1.02, 1.02], tier_jitter=jitter)
    assert max(abs(c.score - cand[0].score) / cand[0].score for c in cand) < 0.05
    g = gate(base, cand)
    step = _step(g, "re-runs")
    assert step.status is StepStatus.HOLD and "candidate 4-8K" in step.reasons[0]
    assert step.evidence["tier_spreads"]["candidate"]["4-8K"] > 0.05


@pytest.mark.parametrize(("spread_ok", "status"), [(0.049, StepStatus.PASS), (0.051, StepStatus.HOLD)])
def test_the_spread_bar_both_sides(spread_ok: float, status: StepStatus) -> None:
    lo, hi = 1.02 * (1 - spread_ok / 2), 1.02 * (1 + spread_ok / 2)
    base, cand = _rounds([lo, 1.02, hi])
    assert _step(gate(base, cand), "re-runs").status is status


def test_an_sla_breach_in_the_last_round_rejects() -> None:
    base, cand = _rounds([1.02, 1.02, 1.02])
    cand[2] = _run("cand", 2, seconds=(10 / 1.02,) * 3, tpot=80)  # 1.6x P99 TPOT, round 3 only
    g = gate(base, cand)
    assert _step(g, "re-runs").status is StepStatus.FAIL
    assert any(r.startswith("round 3: SLA breach") for r in _step(g, "re-runs").reasons)
    assert g.verdict is Verdict.REJECT


# ---- item 9: a stable small gain is pending the full run; a clear gain is not


def test_a_stable_small_gain_is_accept_pending_full_until_the_full_run() -> None:
    base, cand = _rounds([1.02, 1.021, 1.019])
    g = gate(base, cand)
    assert g.verdict is Verdict.ACCEPT_PENDING_FULL
    assert "appliance compare --full" in g.reasons[-1]


def test_the_same_gain_on_the_full_run_is_accepted() -> None:
    base, cand = _rounds([1.02, 1.021, 1.019])

    def full(r: BenchResult) -> BenchResult:
        tiers = [t.model_copy(update={"requests": [q.model_copy(update={"index": i}) for i in range(100)
                                                   for q in t.requests[:1]]}) for t in r.tiers]
        return r.model_copy(update={"tiers": tiers})

    g = gate([full(r) for r in base], [full(r) for r in cand])
    assert g.verdict is Verdict.ACCEPT, g.reasons


def test_a_clear_gain_is_a_plain_accept() -> None:
    assert gate(*_arms()).verdict is Verdict.ACCEPT


def test_a_failed_smoke_that_stopped_the_compare_rejects_with_the_later_steps_skipped() -> None:
    base, cand = _arms(smoke=_smoke(alive=False))
    stopped = cand[0].model_copy(update={"tiers": [], "stopped": "the candidate's smoke failed"})
    g = gate(base, [stopped])
    assert [s.status for s in g.steps] == [StepStatus.PASS, StepStatus.FAIL, StepStatus.SKIPPED,
                                          StepStatus.SKIPPED, StepStatus.SKIPPED, StepStatus.SKIPPED]
    assert g.verdict is Verdict.REJECT and Flag.STOPPED_EARLY in g.flags
    assert _step(g, "score").reasons == ["not run: the candidate's smoke failed"]


# ---- missing tier / kind: rejected, never an exception


def test_a_candidate_missing_a_whole_tier_is_rejected_not_an_exception() -> None:
    base, cand = _arms()
    cand[0] = cand[0].model_copy(update={"tiers": cand[0].tiers[:2]})
    g = gate(base, cand)
    assert _step(g, "first-five").status is StepStatus.FAIL
    assert "candidate has no 16-32K tier" in _step(g, "first-five").reasons
    assert g.verdict is Verdict.REJECT


def test_a_candidate_missing_a_whole_accuracy_kind_is_rejected() -> None:
    acc = _acc({k: v for k, v in GOOD_ACC.items() if k is not Kind.AGGREGATION})
    g = gate(*_arms(accuracy=acc))
    step = _step(g, "accuracy")
    assert step.status is StepStatus.FAIL and g.verdict is Verdict.REJECT
    assert "the candidate has no keyword_aggregation items: not scored, never a pass" in step.reasons


def test_a_missing_kind_is_rejected_even_where_the_baseline_scored_zero() -> None:
    """The old drop arithmetic read a missing kind as 0 points: against a baseline at 0 it passed."""
    zero = {**GOOD_ACC, Kind.AGGREGATION: [0.0] * 5}
    cand = _acc({k: v for k, v in GOOD_ACC.items() if k is not Kind.AGGREGATION})
    g = gate(*_arms(base_kw={"accuracy": _acc(zero)}, accuracy=cand))
    assert any("has no keyword_aggregation items" in r for r in _step(g, "accuracy").reasons)


# ---- item 6: a veto that can bite, in stated units


def _kind_scores(points: float) -> AccuracyResult:
    scores = {**GOOD_ACC, Kind.RETRIEVAL: [points / 100] * 5}
    return _acc(scores)


@pytest.mark.parametrize(
    ("cand_points", "status"),
    [(57.0, StepStatus.PASS), (56.99, StepStatus.FAIL)],  # a drop of exactly 3 points, and just over
)
def test_the_accuracy_bar_is_in_points_and_a_drop_of_exactly_the_bar_passes(
    cand_points: float, status: StepStatus
) -> None:
    g = gate(*_arms(base_kw={"accuracy": _kind_scores(60.0)}, accuracy=_kind_scores(cand_points)))
    step = _step(g, "accuracy")
    assert step.status is status, step.reasons
    assert step.evidence["unit"].startswith("percentage points per kind")


def test_a_relative_three_percent_drop_under_three_points_passes() -> None:
    """The unit decided: 90 → 87.5 is −2.8 % relative... and 2.5 points; 20 → 19 is −5 % relative but
    1 point. Both pass: the bar is points, not a ratio."""
    g = gate(*_arms(base_kw={"accuracy": _kind_scores(20.0)}, accuracy=_kind_scores(19.0)))
    assert _step(g, "accuracy").status is StepStatus.PASS


@pytest.mark.parametrize(("points", "status"), [(0.0, StepStatus.FAIL), (9.9, StepStatus.FAIL),
                                                (10.0, StepStatus.PASS)])
def test_a_baseline_near_zero_in_a_kind_fails_closed(points: float, status: StepStatus) -> None:
    acc = _kind_scores(points)
    g = gate(*_arms(base_kw={"accuracy": acc}, accuracy=acc))  # 0 vs 0 used to pass
    step = _step(g, "accuracy")
    assert step.status is status
    if status is StepStatus.FAIL:
        assert "retrieval_multi_point cannot discriminate" in step.reasons[0]
        assert step.evidence["cannot_discriminate"] == ["retrieval_multi_point"]
        assert g.verdict is Verdict.REJECT


def test_substring_scoring_needs_whole_words() -> None:
    item = next(i for i in _build_set(64, 64, 1) if i.kind is Kind.RETRIEVAL)
    item = item.model_copy(update={"answers": ["1234", "5678", "9012"]})
    assert score_item(item, "12345 56789 90123") == 0.0  # "1234" inside "12345" is not an answer
    assert score_item(item, "1234,5678 and 9012.") == 1.0  # punctuation separates answers


def test_an_empty_answer_is_scored_from_the_reasoning_text() -> None:
    assert scored_text("", "The city is Oslo.") == ("The city is Oslo.", "reasoning")
    assert scored_text("Oslo", "thinking about Lisbon") == ("Oslo", "content")
    assert scored_text("", None) == ("", "content")


def test_an_answer_scored_from_reasoning_is_said_in_the_report() -> None:
    acc = _acc(GOOD_ACC)
    acc = acc.model_copy(update={"items": [acc.items[0].model_copy(update={"answered_in": "reasoning"}),
                                           *acc.items[1:]]})
    g = gate(*_arms(accuracy=acc))
    assert any("1 answer(s) scored from the reasoning text" in r for r in _step(g, "accuracy").reasons)


# ---- item 1: an arm whose text varies across restarts reads its eager twin's token evidence


def test_a_graph_arms_length_hold_and_accuracy_come_from_its_eager_twin() -> None:
    # The graph candidate's own outputs are 12 % longer and its accuracy dropped: both are its
    # token stream, which never feeds a gate. The twin (the eager baseline) stands for it.
    worse = {**GOOD_ACC, Kind.RETRIEVAL: [0.0] * 5}
    base, cand = _arms(cand_seconds=10 * 1.12 / 1.5, lens=112, accuracy=_acc(worse), smoke=_smoke(tokens=80))
    twin = Tokens(source="base", why="derived: same model, dtype, sampling; mode eager", runs=base)
    own = gate(base, cand)
    assert own.verdict is not Verdict.ACCEPT  # on its own stream: smoke length, length hold, veto
    g = gate(base, cand, cand_tokens=twin)
    assert g.verdict is Verdict.ACCEPT, g.reasons
    assert Flag.EAGER_TWIN_EVIDENCE in g.flags
    assert _step(g, "smoke").evidence["length_sources"]["candidate"] == "base"
    assert _step(g, "score").evidence["length_sources"]["candidate"] == "base"
    assert _step(g, "accuracy").evidence["sources"]["candidate"] == "base"
    said = "candidate: smoke length, length hold and accuracy from its eager twin base"
    assert any(said in r for r in g.reasons)
    # Its own lengths are still shown.
    assert _step(g, "score").evidence["output_lengths"]["candidate"]["all"]["max"] == 112


def test_throughput_and_sla_stay_the_graph_arms_own() -> None:
    base, cand = _arms(ttft=(100, 400, 400))  # the candidate breaches the 8-16K SLA itself
    g = gate(base, cand, cand_tokens=Tokens(source="base", why="twin", runs=base))
    assert _step(g, "first-five").status is StepStatus.FAIL and g.verdict is Verdict.REJECT


# ---- item 2: declared output per tier, the distribution in the report, fast mode named


def test_every_seed_tier_declares_its_official_max_output_and_the_cap_is_fast_mode() -> None:
    assert all(t.max_output >= 1024 for t in SEED_TIERS)
    t = SEED_TIERS[1]
    assert output_limit(t, None) == t.max_output and output_limit(t, 64) == 64
    plan: TierPlan = plan_tiers(8192, 1024)
    assert all(tier.max_output == 1024 for tier in plan.tiers)  # inputs scale, the output does not


def test_the_output_length_distribution_shows_requests_stopped_by_the_cap() -> None:
    r = _run("a", lens=64).model_copy(update={"output_limits": {t.name: 64 for t in SEED_TIERS}})
    dist = r.length_distribution()
    assert dist["8-16K"] == {"n": 5, "min": 64, "median": 64, "mean": 64.0, "max": 64, "at_cap": 5, "cap": 64}
    assert dist["all"]["n"] == 15


def test_a_fast_mode_result_is_named_in_the_verdict() -> None:
    base, cand = _arms()
    base = [r.model_copy(update={"mode": "fast"}) for r in base]
    g = gate(base, cand)
    assert Flag.FAST_MODE in g.flags and any(r.startswith("FAST MODE") for r in g.reasons)

