"""The H200's same-card blue/green run (tests/fixtures/engine_logs/gpu-h200-samecard-2026-12-02/),
re-judged from its stored records by the judge samecard.sh ran on the device."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).parents[2]
RUN = ROOT / "tests/fixtures/engine_logs/gpu-h200-samecard-2026-12-02"


def _judge_script() -> ModuleType:
    script = ROOT / "scripts/gpu_h200/samecard_judge.py"
    spec = importlib.util.spec_from_file_location("samecard_judge", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_h200_restart_went_blue_green_on_the_same_card_with_no_failed_request() -> None:
    verdict = _judge_script().judge_folder(RUN)
    assert verdict.passed, verdict.failures
    figures = verdict.figures
    assert figures["placement"] == "same_card" and figures["holds"] == [] and figures["cut"] == 0
    assert figures["failed"] == 0 and figures["during_switch"] > 0 and figures["before_switch"] > 0
    text = (RUN / "samecard-summary.txt").read_text()
    assert text.startswith("same-card blue/green: PASS")
    assert "placement same_card" in text and "failed 0" in text


def test_the_restart_answer_and_the_record_carry_the_card_numbers() -> None:
    answer = json.loads((RUN / "restart.json").read_text())
    assert answer["switch"]["path"] == "blue_green"
    new = json.loads((RUN / "launch-20261202T033011-cuda-smollm2-graph-859f87.json").read_text())
    events = [e for e in new["events"] if e["kind"] == "switch-path"]
    assert events, "the new launch records the path it took"
    data = events[-1]["data"]
    assert data["gpu_placement"] == "same_card"
    # The rule as recorded: free now − need ≥ margin, on the card's own numbers.
    assert data["gpu0_free_gib"] - data["gpu0_need_gib"] >= data["gpu_margin_gib"]
    assert abs(data["gpu0_left_gib"] - (data["gpu0_free_gib"] - data["gpu0_need_gib"])) < 0.02


def test_no_secret_came_back() -> None:
    for path in RUN.iterdir():
        text = path.read_text(errors="replace")
        for shape in ("eng_", "sk-app-", "adm_"):
            for at in range(len(text)):
                at = text.find(shape, at)
                if at < 0:
                    break
                assert text[at + len(shape):].startswith("<redacted>"), (path.name, shape)
