"""`appliance choose` over eager, graph and piecewise on the H200
(tests/fixtures/evaluation/h200-choose-3-2026-12-02/, upstream vLLM 0.26.0, the standard mode): the
decision record loads and renders to the markdown that came back, both gates re-judge from their stored
runs to the same verdicts (graph beats eager; piecewise loses to the graph champion), and the record says
what the operator needs — champion and why, the order, what each candidate cost."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from appliance.evaluation.bench_result import BenchResult
from appliance.evaluation.gate import Flag, GateResult, StepStatus, Verdict
from appliance.evaluation.protocol import Thresholds, Tokens, gate
from appliance.evaluation.tournament import ChoiceRecord, markdown, promotion_refusal
from tests.unit.test_h200_compare_fixture import _same

RUN = Path(__file__).resolve().parents[1] / "fixtures" / "evaluation" / "h200-choose-3-2026-12-02"
EAGER, GRAPH, PIECEWISE = "cuda-smollm2-eager", "cuda-smollm2-graph", "cuda-smollm2-piecewise"
TWIN_WHY = "derived: same model, dtype, platform and sampling, mode eager"


def _record(name: str = "choice.json") -> ChoiceRecord:
    return ChoiceRecord.model_validate(json.loads((RUN / name).read_text()))


def _comparison(cid: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((RUN / "comparisons" / f"{cid}.json").read_text())
    return data


def _runs(report: dict[str, Any], arm: str) -> list[BenchResult]:
    return [BenchResult.model_validate(x) for x in report["runs"][arm]]


def test_the_record_names_the_champion_the_order_and_each_candidate_s_cost() -> None:
    r = _record()
    assert (r.state, r.baseline, r.champion, r.champion_verdict) == ("done", EAGER, GRAPH, "accept")
    assert r.fast is False and r.serving_before == EAGER and r.restored == EAGER and not r.promoted
    tried = [x for x in r.lines if x.recipe in (EAGER, GRAPH, PIECEWISE)]
    assert [(x.recipe, x.status, x.verdict) for x in tried] == [
        (EAGER, "baseline", None), (GRAPH, "won", "accept"), (PIECEWISE, "lost", "reject")]
    # Each candidate's cost is recorded, and the whole took a fraction of the defaults' ETA.
    assert all(x.took_s is not None and 0 < x.took_s < (x.eta_s or 0) for x in tried[1:])
    assert r.eta_s == 4200.0 and r.ended_at is not None and r.ended_at - r.started_at < r.eta_s
    assert r.versions["vllm"] == "0.26.0"
    others = [x for x in r.lines if x not in tried]
    assert others and all(x.status == "not-tried" and "not matched by the pattern" in x.why for x in others)


def test_the_markdown_that_came_back_is_what_the_record_renders() -> None:
    assert markdown(_record()) == (RUN / "choice.md").read_text()


def test_the_champion_can_be_promoted_its_gate_was_a_full_accept() -> None:
    assert promotion_refusal(_record()) is None


def test_graph_beat_eager_and_the_gate_re_judges_to_the_same_verdict() -> None:
    report = _comparison(_record().line(GRAPH).comparison_id or "")
    assert (report["baseline"], report["candidate"]) == (EAGER, GRAPH)
    base, cand = _runs(report, "baseline"), _runs(report, "candidate")
    stored = GateResult.model_validate(report["gate"])
    assert all(x.mode == "standard" and not x.ignore_eos for x in (*base, *cand))
    twin = Tokens(source=EAGER, why=TWIN_WHY, runs=base)
    again = gate(base, cand, Thresholds(), allowed_diffs=stored.allowed_diffs or None, cand_tokens=twin)
    assert again.verdict is stored.verdict is Verdict.ACCEPT
    assert Flag.EAGER_TWIN_EVIDENCE in again.flags and again.flags == stored.flags
    assert all(s.status is StepStatus.PASS for s in again.steps)
    assert [(s.name, s.reasons) for s in again.steps] == [(s.name, s.reasons) for s in stored.steps]
    for a, b in zip(again.steps, stored.steps, strict=True):
        _same(a.evidence, b.evidence, a.name)
    assert stored.score_delta is not None and stored.score_delta > 1.0


def test_piecewise_lost_to_the_graph_champion_and_re_judges_to_the_same_verdict() -> None:
    """The second gate ran against the champion (graph), not the baseline; both compiled arms took their
    length and accuracy evidence from the one eager twin, so length parity compares it with itself
    (flag shared-eager-twin) and throughput and the SLA decide: piecewise's score and its tiers' tail
    latency against graph's."""
    eager_runs = _runs(_comparison(_record().line(GRAPH).comparison_id or ""), "baseline")
    report = _comparison(_record().line(PIECEWISE).comparison_id or "")
    assert (report["baseline"], report["candidate"]) == (GRAPH, PIECEWISE)
    base, cand = _runs(report, "baseline"), _runs(report, "candidate")
    stored = GateResult.model_validate(report["gate"])
    twin = Tokens(source=EAGER, why=TWIN_WHY, runs=eager_runs)
    again = gate(base, cand, Thresholds(), allowed_diffs=stored.allowed_diffs or None,
                 base_tokens=twin, cand_tokens=twin)
    assert again.verdict is stored.verdict is Verdict.REJECT
    assert again.flags == stored.flags and Flag.SHARED_EAGER_TWIN in again.flags
    assert [(s.name, s.status, s.reasons) for s in again.steps] == [
        (s.name, s.status, s.reasons) for s in stored.steps]
    status = {s.name: s.status for s in stored.steps}
    assert status["score"] is StepStatus.FAIL and status["first-five"] is StepStatus.FAIL
    assert status["accuracy"] is StepStatus.SKIPPED  # it runs only after the throughput steps pass
    assert stored.score_delta is not None and stored.score_delta < 0


def test_the_launch_records_are_the_arms_and_the_return_to_eager() -> None:
    names = sorted(p.name for p in (RUN / "launches").glob("*.json"))
    recipes = [json.loads((RUN / "launches" / n).read_text())["recipe"] for n in names]
    # the baseline, graph warm (its cache kept from the acceptance run), piecewise warm, back to eager
    assert recipes == [EAGER, GRAPH, PIECEWISE, EAGER]


def test_the_first_try_s_record_still_loads_with_piecewise_left_out_by_the_plan() -> None:
    """The record of the first try (budget 40 min) was written under the plan-time budget rule; a
    record the store holds from then still loads and says why piecewise was not tried."""
    r = _record("first-try-choice.json")
    assert (r.state, r.champion) == ("done", GRAPH)
    line = r.line(PIECEWISE)
    assert line.status == "not-tried" and "left at its turn" in line.why
