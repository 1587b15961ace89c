"""The same-card blue/green run's judge (appliance/evaluation/samecard_switch.py), on a synthetic run
shaped as scripts/gpu_h200/samecard.sh brings one back (launch records as `appliance launches ID
--json` writes them, switch_load.py's client JSON). The lead adds the H200's real fixture; this
judges it the same way (`judge_folder`)."""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from appliance.evaluation.samecard_switch import inputs_from_files, judge, p99, render_text, samples_of

ROOT = Path(__file__).parents[2]

T = 1_764_650_000.0  # the restart's preflight ended here (wall clock, as the records)


def _event(launch: str, kind: str, at: float, message: str, **data: Any) -> dict[str, Any]:
    return {"id": 1, "launch_id": launch, "at": at, "kind": kind, "message": message, "data": data}


def run() -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """L1 served; the restart started L2 beside it on GPU 0 at T, ready 61.5 s later, switched, L1
    drained and stopped 2 s after; 4 clients at 20 requests/s from T − 20 to T + 80, all 200."""
    numbers = {"path": "blue_green", "gpu_placement": "same_card", "gpus": "0", "serving_gpus": "0",
               "gpu0_free_gib": 96.2, "gpu0_need_gib": 42.63, "gpu0_left_gib": 53.57, "gpu_margin_gib": 4.0}
    old = {"id": "L2", "recipe": "cuda-smollm2-graph", "status": "stopped", "ready_s": 38.0,
           "ended_at": T + 63.5, "events": []}
    new = {"id": "L3", "recipe": "cuda-smollm2-graph", "status": "ready", "ready_s": 61.5,
           "ended_at": None, "events": [
               _event("L3", "switch-path", T,
                      "blue/green: … same-card blue/green: GPU 0 free now 96.20 GiB …", **numbers),
               _event("L3", "switched", T + 61.6, "blue/green: the gateway routes to …", path="blue_green",
                      cut=0, old_launch_id="L2", waited_s=0.4)]}
    samples = [[T - 20 + i * 0.05, 0.05 + (0.07 if i % 200 == 0 else 0.0), 200] for i in range(2000)]
    return [copy.deepcopy(old), copy.deepcopy(new)], {"samples": samples}


def test_a_same_card_switch_with_no_failure_passes_with_its_figures() -> None:
    records, client = run()
    verdict = judge(records, client)
    assert verdict.passed, verdict.failures
    f = verdict.figures
    assert (f["launch"], f["old_launch"], f["placement"], f["cut"]) == ("L3", "L2", "same_card", 0)
    assert f["numbers"]["gpu0_free_gib"] == 96.2 and f["numbers"]["gpu_margin_gib"] == 4.0
    assert (f["requests"], f["failed"], f["before_switch"]) == (2000, 0, 400)
    assert f["during_switch"] == len([i for i in range(2000) if 0 <= -20 + i * 0.05 <= 63.5])
    assert f["longest_s"] == 0.12 and f["p99_goal_met"] is True
    text = render_text(verdict)
    assert text.startswith("same-card blue/green: PASS") and "failed 0" in text and "FAIL:" not in text


def test_a_failed_request_fails_the_run() -> None:
    records, client = run()
    client["samples"][500][2] = 503
    client["samples"][501][2] = None
    verdict = judge(records, client)
    assert not verdict.passed
    assert verdict.failures == ["2 of 2000 requests failed (statuses ['503', 'None'])"]


def test_a_request_held_as_long_as_a_start_fails_the_run() -> None:
    records, client = run()
    client["samples"][900][1] = 61.5
    verdict = judge(records, client)
    assert not verdict.passed and "as long as the new engine's start (61.5 s)" in verdict.failures[0]
    client["samples"][900][1] = 61.4
    assert judge(records, client).passed


def test_blue_green_on_another_card_is_not_same_card() -> None:
    records, client = run()
    records[1]["events"][0]["data"]["gpu_placement"] = "disjoint_cards"
    verdict = judge(records, client)
    assert verdict.failures == ["blue/green, but not on the same card (placement 'disjoint_cards')"]


def test_a_hold_says_why_and_fails() -> None:
    records, client = run()
    records[1]["events"] = [_event("L3", "switch-path", T, "hold, not blue/green: same-card blue/green does "
                                   "not fit: GPU 0 free now 40.00 GiB …", path="hold")]
    verdict = judge(records, client)
    assert not verdict.passed
    assert verdict.failures[0].startswith("no launch took blue/green (L3: hold, not blue/green: same-card")


@pytest.mark.parametrize(("change", "failure"), [
    (lambda r: r[1]["events"].pop(), "launch L3 has no switched event: the gateway was never pointed at it"),
    (lambda r: r[1].update(status="exited"), "launch L3 is 'exited', not ready"),
    (lambda r: r[0].update(status="ready"), "the replaced launch L2 is 'ready', not stopped"),
    (lambda r: r.pop(0), "the replaced launch L2 is not in the records, not stopped"),
])
def test_the_switch_must_end_with_the_new_launch_ready_and_the_old_one_stopped(change: Any,
                                                                               failure: str) -> None:
    records, client = run()
    change(records)
    assert failure in judge(records, client).failures


def test_a_load_that_does_not_cover_the_switch_fails() -> None:
    records, client = run()
    client["samples"] = [s for s in client["samples"] if s[0] < T]
    assert judge(records, client).failures == [
        "no request began during the switch: the load did not cover it"]
    client["samples"] = []
    assert judge(records, client).failures == ["the client recorded no requests"]


def test_the_p99_goal_is_reported_not_judged() -> None:
    records, client = run()
    for s in client["samples"]:
        if T <= s[0] <= T + 63.5:
            s[1] = 0.5
    verdict = judge(records, client)
    assert verdict.passed and verdict.figures["p99_goal_met"] is False and verdict.figures["p99_ratio"] > 2
    assert "goal ≤ 2×: not met" in render_text(verdict)


def test_p99_and_samples_helpers() -> None:
    assert p99([]) is None and p99([1.0]) == 1.0
    assert p99([float(i) for i in range(1, 101)]) == 99.0
    assert p99([float(i) for i in range(1, 201)]) == 198.0
    assert samples_of({"samples": [[1, 2, 200], ["x", 1, 200], [1], [1.5, 0.5, "200"]]}) == [
        samples_of({"samples": [[1, 2, 200]]})[0], samples_of({"samples": [[1.5, 0.5, None]]})[0]]


def _judge_script() -> Any:
    path = ROOT / "scripts" / "gpu_h200" / "samecard_judge.py"
    spec = importlib.util.spec_from_file_location("samecard_judge", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_folder_judge_reads_what_the_script_brings_back(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    records, client = run()
    for r in records:
        (tmp_path / f"launch-{r['id']}.json").write_text(json.dumps(r))
    (tmp_path / "client.json").write_text(json.dumps(client))
    (tmp_path / "launches.json").write_text("[]")  # not an input
    script = _judge_script()
    assert script.judge_folder(tmp_path).passed
    assert script.main([str(tmp_path)]) == 0
    assert capsys.readouterr().out.startswith("same-card blue/green: PASS")
    (tmp_path / "launch-L3.json").write_text("not json")
    assert script.main([str(tmp_path)]) == 1
    assert "FAIL: no launch took blue/green" in capsys.readouterr().out
    assert inputs_from_files({"x/launch-L1.json": "[1]", "client.json": "{}"}) == ([], {})
