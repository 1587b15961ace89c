"""`appliance choose` on the H200 (tests/fixtures/evaluation/h200-choose-2026-12-02/, upstream vLLM
0.26.0, the standard mode): the decision record loads through its model and renders to the markdown
that came back, its one gate re-judges from the stored runs to the same verdict, and the record says
what the operator needs — champion and why, what was not tried and why, where the host was left."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from appliance.evaluation.bench_result import BenchResult
from appliance.evaluation.gate import Flag, GateResult, StepStatus, Verdict
from appliance.evaluation.protocol import Thresholds, Tokens, gate
from appliance.evaluation.tournament import ChoiceRecord, markdown, promotion_refusal
from tests.unit.test_h200_compare_fixture import _same

RUN = Path(__file__).resolve().parents[1] / "fixtures" / "evaluation" / "h200-choose-2026-12-02"
EAGER, GRAPH = "cuda-smollm2-eager", "cuda-smollm2-graph"


def _record() -> ChoiceRecord:
    return ChoiceRecord.model_validate(json.loads((RUN / "choice.json").read_text()))


def _comparison() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((RUN / "comparisons" / "cmp-548c97ff6411.json").read_text())
    return data


def test_the_record_names_the_champion_why_and_what_was_not_tried() -> None:
    r = _record()
    assert (r.state, r.baseline, r.champion, r.champion_verdict) == ("done", EAGER, GRAPH, "accept")
    assert r.fast is False and r.serving_before == EAGER and r.restored == EAGER and not r.promoted
    status = {x.recipe: x.status for x in r.lines}
    assert status[EAGER] == "baseline" and status[GRAPH] == "won"
    won = next(x for x in r.lines if x.recipe == GRAPH)
    assert won.comparison_id == "cmp-548c97ff6411" and won.verdict == "accept"
    # Every other recipe of the platform is in the record with why it was not tried.
    others = [x for x in r.lines if x.recipe not in (EAGER, GRAPH)]
    assert others and all(x.status == "not-tried" and "not matched by the pattern" in x.why for x in others)
    # The ETA came from the defaults (a fresh host: no launch history); the run took a fraction of it.
    assert r.eta_s == 2100.0 and r.ended_at is not None and r.ended_at - r.started_at < r.eta_s
    assert r.versions["vllm"] == "0.26.0"


def test_the_markdown_that_came_back_is_what_the_record_renders() -> None:
    assert markdown(_record()) == (RUN / "choice.md").read_text()


def test_the_champion_can_be_promoted_its_gate_was_a_full_accept() -> None:
    assert promotion_refusal(_record()) is None


def test_the_gate_re_judges_from_its_stored_runs_to_the_same_verdict() -> None:
    report = _comparison()
    assert (report["baseline"], report["candidate"]) == (EAGER, GRAPH)
    base = [BenchResult.model_validate(x) for x in report["runs"]["baseline"]]
    cand = [BenchResult.model_validate(x) for x in report["runs"]["candidate"]]
    stored = GateResult.model_validate(report["gate"])
    assert all(x.mode == "standard" and not x.ignore_eos for x in (*base, *cand))
    why = "derived: same model, dtype, platform and sampling, mode eager"
    twin = Tokens(source=EAGER, why=why, runs=base)
    again = gate(base, cand, Thresholds(), allowed_diffs=stored.allowed_diffs or None, cand_tokens=twin)
    assert again.verdict is stored.verdict is Verdict.ACCEPT
    assert Flag.EAGER_TWIN_EVIDENCE in again.flags and again.flags == stored.flags
    assert all(s.status is StepStatus.PASS for s in again.steps)
    assert [(s.name, s.reasons) for s in again.steps] == [(s.name, s.reasons) for s in stored.steps]
    for a, b in zip(again.steps, stored.steps, strict=True):
        _same(a.evidence, b.evidence, a.name)
    assert stored.score_delta is not None and stored.score_delta > 1.0  # graph well ahead on throughput
    accuracy = next(s for s in stored.steps if s.name == "accuracy")
    assert accuracy.evidence["sources"] == {"baseline": "own", "candidate": EAGER}


def test_the_launch_records_that_came_back_are_the_gate_s_arms() -> None:
    names = sorted(p.name for p in (RUN / "launches").glob("*.json"))
    recipes = [json.loads((RUN / "launches" / n).read_text())["recipe"] for n in names]
    assert recipes == [EAGER, GRAPH, GRAPH]  # the baseline, the graph arm's cold warm-up and its warm start
