"""The full acceptance protocol on the H200 in the standard mode (`appliance compare cuda-smollm2-eager
cuda-smollm2-graph`, scripts/gpu_h200/compare.sh, 2026-12-02, upstream vLLM 0.26.0): real output
lengths (each tier's declared max output 1024, stop at EOS), the graph arm's token-stream evidence
from its eager twin, the kernel-path proof with declared path lines and the deployment probe.
Its compare.json is loaded through the result models and re-judged by the pure protocol; each
launch record's `deployment-proof` event is re-evaluated against what the recipe declared."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from appliance.evaluation.bench_result import BenchResult
from appliance.evaluation.deployment import DeploymentFacts, evaluate, version_summary
from appliance.evaluation.gate import Flag, GateResult, StepStatus, Verdict
from appliance.evaluation.protocol import Thresholds, Tokens, gate
from appliance.recipe.recipe_model import DeploymentCheck
from tests.unit.test_h200_compare_fixture import _same

CMP = Path(__file__).resolve().parents[1] / "fixtures" / "evaluation" / "h200-compare-2026-12-02"
STEPS = ["proof", "smoke", "first-five", "re-runs", "score", "accuracy"]
EAGER, GRAPH = "cuda-smollm2-eager", "cuda-smollm2-graph"
LAUNCHES = sorted(p.name for p in CMP.glob("launch-*.json"))
CAP = 1024  # every tier's declared max output in the standard mode


def _report() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((CMP / "compare.json").read_text())
    return data


def _arms() -> tuple[list[BenchResult], list[BenchResult], GateResult]:
    report = _report()
    base = [BenchResult.model_validate(r) for r in report["runs"]["baseline"]]
    cand = [BenchResult.model_validate(r) for r in report["runs"]["candidate"]]
    return base, cand, GateResult.model_validate(report["gate"])


def _twin(base: list[BenchResult]) -> Tokens:
    """The graph arm's token-stream evidence as compare derived it: its eager twin is the baseline
    recipe itself, so the twin's runs are the baseline's (compare.json keeps no third arm)."""
    why = "derived: same model, dtype, platform and sampling, mode eager"
    return Tokens(source=EAGER, why=why, runs=base)


def _step(g: GateResult, name: str) -> Any:
    return next(s for s in g.steps if s.name == name)


def test_compare_json_loads_through_the_result_models() -> None:
    report = _report()
    base, cand, g = _arms()
    assert report["id"] == "cmp-7278e8ccbde0"
    assert (report["baseline"], report["candidate"]) == (EAGER, GRAPH)
    assert [r.recipe for r in base] == [EAGER] and [r.recipe for r in cand] == [GRAPH]
    assert [r.mode for r in (*base, *cand)] == ["standard", "standard"]
    assert all(not r.ignore_eos and r.stopped is None for r in (*base, *cand))  # stop at EOS
    assert all(set(r.output_limits.values()) == {CAP} for r in (*base, *cand))
    assert g.verdict is Verdict.ACCEPT
    assert g.flags == [Flag.TEXTS_DIFFER, Flag.EAGER_TWIN_EVIDENCE]
    assert [s.name for s in g.steps] == STEPS and all(s.status is StepStatus.PASS for s in g.steps)
    assert round(g.score_baseline, 1) == 248.7 and round(g.score_candidate, 1) == 2245.8
    assert g.score_delta is not None and round(100 * g.score_delta, 2) == 802.87
    assert (g.output_tokens_baseline, g.output_tokens_candidate) == (15360, 15360)
    assert (g.texts_identical, g.texts_compared) == (5, 15)
    # One round: the gain is far outside the small-gain band, so no re-run was asked for.
    assert _step(g, "re-runs").evidence["rounds"] == 1
    assert "no re-run needed" in _step(g, "re-runs").reasons[0]
    # The arm summaries are each run's own summary (JSON turns int keys into strings).
    for run, summary in zip([*base, *cand], [*report["baselines"], *report["candidates"]], strict=True):
        assert json.loads(json.dumps(run.summary())) == summary
    assert (report["baselines"][0]["decode_ms_median"], report["candidates"][0]["decode_ms_median"]) == (
        23.316, 1.74)
    # Only the eager arm was scored: the graph arm's accuracy is its eager twin's.
    assert base[0].accuracy is not None and cand[0].accuracy is None


def test_the_stored_runs_re_judge_to_the_same_verdict_and_steps() -> None:
    base, cand, stored = _arms()
    again = gate(base, cand, Thresholds(), allowed_diffs=stored.allowed_diffs or None,
                 cand_tokens=_twin(base))
    assert again.verdict is stored.verdict is Verdict.ACCEPT and again.flags == stored.flags
    assert [(s.name, s.status) for s in again.steps] == [(s.name, s.status) for s in stored.steps]
    assert again.reasons == stored.reasons
    for field in ("score_baseline", "score_candidate", "score_delta", "output_tokens_baseline",
                  "output_tokens_candidate", "texts_identical", "texts_compared", "sla"):
        _same(getattr(again, field), getattr(stored, field), field)
    for a, b in zip(again.steps, stored.steps, strict=True):
        assert a.reasons == b.reasons, a.name
        _same(a.evidence, b.evidence, a.name)


def test_without_its_eager_twin_the_graph_arm_has_no_accuracy_to_judge() -> None:
    # Why the twin matters here: the graph arm was never scored itself (its text varies across
    # restarts), so re-judged on its own evidence the accuracy veto has nothing for it.
    base, cand, stored = _arms()
    alone = gate(base, cand, Thresholds(), allowed_diffs=stored.allowed_diffs or None)
    assert Flag.EAGER_TWIN_EVIDENCE not in alone.flags
    accuracy = _step(alone, "accuracy")
    assert accuracy.status is StepStatus.SKIPPED and accuracy.reasons == ["accuracy was not measured"]


def test_the_evidence_says_the_graph_arms_lengths_and_accuracy_came_from_its_eager_twin() -> None:
    _, _, g = _arms()
    twin = {"baseline": "own", "candidate": EAGER}
    smoke, score, accuracy = _step(g, "smoke"), _step(g, "score"), _step(g, "accuracy")
    assert smoke.evidence["length_sources"] == twin
    assert smoke.evidence["output_tokens"] == {"baseline": CAP, "candidate": CAP}
    assert f"candidate smoke length from its eager twin {EAGER}" in smoke.reasons[1]
    assert score.evidence["length_sources"] == twin
    assert (f"candidate output lengths for the length hold come from its eager twin {EAGER}"
            in score.reasons[1])
    assert accuracy.evidence["sources"] == twin
    assert accuracy.reasons[0].startswith("accuracy 29.6 vs 29.6 points")
    assert "0 item(s) scored differently" in accuracy.reasons[0] and accuracy.evidence["flipped"] == []
    assert round(accuracy.evidence["overall_baseline"], 2) == round(accuracy.evidence["overall_candidate"], 2)
    assert any(r.startswith(f"candidate: smoke length, length hold and accuracy from its eager twin {EAGER}")
               for r in g.reasons)


@pytest.mark.parametrize("arm", ["baseline", "candidate"])
def test_the_output_length_distributions_per_arm_are_as_recorded(arm: str) -> None:
    # SmolLM2-135M never reached EOS on these prompts within 1024 tokens: every request of both arms
    # stopped at the cap, so the length-parity check (lengths equal under greedy decoding) still
    # cannot fire on this model — both arms' lengths are the cap by construction.
    report = _report()
    lengths = _step(GateResult.model_validate(report["gate"]), "score").evidence["output_lengths"][arm]
    tier = {"n": 5, "min": CAP, "median": CAP, "mean": float(CAP), "max": CAP, "at_cap": 5, "cap": CAP}
    assert lengths == {"4-8K": tier, "8-16K": tier, "16-32K": tier, "all": {**tier, "n": 15, "at_cap": 15}}
    assert report[f"{arm}s"][0]["output_lengths"] == lengths
    run = BenchResult.model_validate(report["runs"][arm][0])
    assert run.summary()["output_lengths"] == lengths


def test_the_summary_agrees_with_compare_json() -> None:
    summary = (CMP / "compare-summary.txt").read_text()
    assert f"compare {_report()['id']}: {GRAPH} vs {EAGER}: VERDICT ACCEPT" in summary
    assert "score 2245.8 vs 248.7 output tok/s; output tokens 15360 vs 15360; texts identical 5/15" in summary
    assert "decode 23.316 ms/token" in summary and "decode 1.74 ms/token" in summary
    assert summary.count("output lengths all: {'n': 15, 'min': 1024, 'median': 1024, 'mean': 1024.0, "
                         "'max': 1024, 'at_cap': 15, 'cap': 1024}") == 2


def _launch(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((CMP / name).read_text())
    return data


def test_the_launch_records_are_the_three_the_compare_used() -> None:
    base, cand, _ = _arms()
    records = {_launch(n)["id"]: _launch(n) for n in LAUNCHES}
    assert [(r["recipe"], r["kind"]) for r in sorted(records.values(), key=lambda r: r["created_at"])] == [
        (EAGER, "normal"), (GRAPH, "cold-warmup"), (GRAPH, "warm")]
    for run in (*base, *cand):  # the benched launches are the eager one and the graph warm restart
        assert run.launch_id is not None and records[run.launch_id]["recipe"] == run.recipe


@pytest.mark.parametrize("name", LAUNCHES)
def test_every_launchs_deployment_proof_has_no_problem_and_the_versions_named(name: str) -> None:
    record = _launch(name)
    proofs = [e for e in record["events"] if e["kind"] == "deployment-proof"]
    assert len(proofs) == 1
    data = proofs[0]["data"]
    check = DeploymentCheck.model_validate(data["declared"])
    facts = DeploymentFacts.model_validate(data["facts"])
    assert check.import_root == "/root/app/engine/cuda/site/vllm"
    assert data["problems"] == [] and evaluate(check, facts) == []  # re-evaluated, still none
    assert facts.versions == {"cuda": "13.0", "hip": None, "torch": "2.11.0+cu130", "vllm": "0.26.0"}
    assert [(d.name, d.capability, round((d.total_memory_bytes or 0) / 2**30)) for d in facts.devices] == [
        ("NVIDIA H200", "9.0", 140)]
    assert data["versions"] == version_summary(facts) == (
        "vllm 0.26.0; torch 2.11.0+cu130; cuda 13.0; GPU0 NVIDIA H200 (cc 9.0, 140 GiB)")
    assert record["packages"]["vllm"] == "0.26.0"
    # The probe runs after ready, off the ready path: it took 5.4-5.8 s and landed 5.6-5.9 s after ready.
    ready = next(e for e in record["events"] if e["kind"] in ("ready", "warmup-ready"))
    assert 5.0 < proofs[0]["at"] - ready["at"] < 6.0
    assert 5.0 < data["probe_s"] < 6.0


def test_the_fixture_carries_no_key() -> None:
    # Engine, admin and app keys are redacted in what was brought back; a fixture must never hold one.
    key = re.compile(r"\b(eng_|adm_|sk-app-)(?!<redacted>)[A-Za-z0-9]")
    for path in sorted(CMP.iterdir()):
        assert not key.search(path.read_text()), path.name
