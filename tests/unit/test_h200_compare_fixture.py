"""The full acceptance protocol on the H200 (`appliance compare cuda-smollm2-eager cuda-smollm2-graph`,
scripts/gpu_h200/compare.sh, 2026-12-01): its compare.json loaded through the result models, re-judged
by the pure protocol from the stored runs, and rendered by the console's comparison page."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import httpx

from appliance.evaluation.bench_result import BenchResult
from appliance.evaluation.gate import Flag, GateResult, StepStatus, Verdict
from appliance.evaluation.protocol import Thresholds, gate
from controller.evaluation.store import EvalStore
from tests.unit import test_console as _console
from tests.unit.test_api import Rig
from tests.unit.test_console import login

home, rig, client = _console.home, _console.rig, _console.client

CMP = Path(__file__).resolve().parents[1] / "fixtures" / "evaluation" / "h200-compare-2026-12-01"
STEPS = ["proof", "smoke", "first-five", "re-runs", "score", "accuracy"]


def _report() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((CMP / "compare.json").read_text())
    return data


def _arms() -> tuple[list[BenchResult], list[BenchResult], GateResult]:
    report = _report()
    base = [BenchResult.model_validate(r) for r in report["runs"]["baseline"]]
    cand = [BenchResult.model_validate(r) for r in report["runs"]["candidate"]]
    return base, cand, GateResult.model_validate(report["gate"])


def _same(a: Any, b: Any, path: str = "") -> None:
    """Equal, floats to 1e-9 relative: the re-derivation may differ from the stored one in the last bit."""
    if isinstance(a, dict) and isinstance(b, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            _same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{path}[{i}]")
    elif isinstance(a, float) or isinstance(b, float):
        assert isinstance(a, (int, float)) and isinstance(b, (int, float)), path
        assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12), path
    else:
        assert a == b, path


def test_compare_json_loads_through_the_result_models() -> None:
    report = _report()
    base, cand, g = _arms()
    assert (report["baseline"], report["candidate"]) == ("cuda-smollm2-eager", "cuda-smollm2-graph")
    assert [r.recipe for r in base] == ["cuda-smollm2-eager"]
    assert [r.recipe for r in cand] == ["cuda-smollm2-graph"]
    assert g.verdict is Verdict.ACCEPT
    assert g.flags == [Flag.TEXTS_DIFFER, Flag.ACCURACY_ITEMS_FLIPPED]
    assert [s.name for s in g.steps] == STEPS and all(s.status is StepStatus.PASS for s in g.steps)
    assert round(g.score_baseline, 1) == 314.1 and round(g.score_candidate, 1) == 1312.1
    assert g.score_delta is not None and round(100 * g.score_delta, 1) == 317.7
    assert (g.texts_identical, g.texts_compared) == (9, 15)
    # The arm summaries are each run's own summary (JSON turns int keys into strings).
    for run, summary in zip([*base, *cand], [*report["baselines"], *report["candidates"]], strict=True):
        assert json.loads(json.dumps(run.summary())) == summary
    assert base[0].accuracy is not None and cand[0].accuracy is not None


def test_the_stored_runs_no_longer_accept_a_candidate_that_proved_only_its_mode() -> None:
    # Issue 33: the stored ACCEPT's candidate (cuda-smollm2-graph) declared only `enforce_eager=False`,
    # which proves the mode, not the kernel path. Re-judged today the proof step refuses it; the
    # recipe now declares its attention backend and graph mode (a new H200 run is the lead's).
    base, cand, stored = _arms()
    assert stored.verdict is Verdict.ACCEPT
    again = gate(base, cand, Thresholds(), allowed_diffs=stored.allowed_diffs or None)
    assert again.verdict is Verdict.REJECT
    assert "only the mode: 'enforce_eager=False'" in again.steps[0].reasons[0]


def test_the_stored_runs_re_judge_to_the_same_verdict_and_steps() -> None:
    base, cand, stored = _arms()
    # As it would read with the path markers the recipe declares now (issue 33), all seen in its log.
    path = {"Using FLASH_ATTN attention backend": True,
            "'cudagraph_mode': <CUDAGraphMode.FULL_AND_PIECEWISE": True}
    cand = [r.model_copy(update={"proof": r.proof.model_copy(
        update={"markers": {**r.proof.markers, **path}})}) for r in cand]
    again = gate(base, cand, Thresholds(), allowed_diffs=stored.allowed_diffs or None)
    assert again.verdict is stored.verdict is Verdict.ACCEPT and again.flags == stored.flags
    # Every step after the proof as stored (the proof's note now counts the path markers too).
    assert again.reasons[1:] == stored.reasons[1:]
    assert [(s.name, s.status, s.reasons) for s in again.steps] == [
        (s.name, s.status, s.reasons if s.name != "proof" else again.steps[0].reasons) for s in stored.steps]
    a, b = again.model_dump(mode="json"), stored.model_dump(mode="json")
    for d in (a, b):
        d["reasons"], d["steps"] = d["reasons"][1:], d["steps"][1:]
    _same(a, b)
    accuracy = again.steps[-1]
    assert "25.1 vs 24.6 points" in accuracy.reasons[0]
    assert "3 item(s) scored differently" in accuracy.reasons[0]


def test_the_summary_and_launches_agree_with_compare_json() -> None:
    summary = (CMP / "compare-summary.txt").read_text()
    assert "VERDICT ACCEPT" in summary and _report()["id"] == "cmp-72e4df3d4632" in summary
    base, cand, _ = _arms()
    launches = {entry["id"]: entry for entry in json.loads((CMP / "launches.json").read_text())}
    for run in (*base, *cand):
        assert run.launch_id is not None and launches[run.launch_id]["recipe"] == run.recipe
        assert (CMP / "runs" / run.launch_id / "engine.log").is_file()


async def test_the_console_renders_the_comparison_page(rig: Rig, client: httpx.AsyncClient) -> None:
    base, cand, g = _arms()
    evals = EvalStore(rig.store.path)
    evals.add_comparison(_report()["id"], base, cand, g)
    evals.close()
    await login(client)
    r = await client.get(f"/console/comparisons/{_report()['id']}")
    assert r.status_code == 200
    html = r.text
    assert '<span class="verdict verdict-accept" id="comparison-verdict">accept</span>' in html
    assert re.findall(r'<tr class="step-row" id="step-([^"]+)">', html) == STEPS
    assert "cuda-smollm2-eager" in html and "cuda-smollm2-graph" in html
    listing = (await client.get("/console/benchmarks")).text
    assert f'href="/console/comparisons/{_report()["id"]}"' in listing
