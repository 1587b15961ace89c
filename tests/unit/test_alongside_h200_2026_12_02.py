"""Two engines on the H200's one card (tests/fixtures/engine_logs/gpu-h200-alongside-2026-12-02/,
scripts/gpu_h200/alongside.sh, upstream vLLM 0.26.0): re-judged from its stored records by the judge
the script ran on the device — both engines ready side by side, each model's clients with 0 failed
across a restart of the primary, that restart blue/green on the same card with two engines already
on it, and the side model gone (404) after `stop --model` while the primary keeps answering."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).parents[2]
RUN = ROOT / "tests/fixtures/engine_logs/gpu-h200-alongside-2026-12-02"


def _judge() -> ModuleType:
    script = ROOT / "scripts/gpu_h200/alongside_judge.py"
    spec = importlib.util.spec_from_file_location("alongside_judge", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("alongside_judge", module)  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def test_two_engines_served_side_by_side_on_one_card_and_the_primary_switched_beside_them() -> None:
    verdict = _judge().judge_folder(RUN)
    assert verdict.passed, {k: v for k, v in verdict.checks.items() if not v}
    assert len(verdict.checks) == 7
    switch = verdict.switch
    assert switch is not None and switch.passed, switch.failures if switch else None
    f = switch.figures
    assert f["placement"] == "same_card" and f["holds"] == [] and f["cut"] == 0
    assert f["failed"] == 0 and f["before_switch"] > 0 and f["during_switch"] > 0
    assert f["p99_goal_met"] is True
    engines = {e["model"]: e for e in verdict.figures["engines"]}
    assert engines["smollm2"]["recipe"] == "cuda-smollm2-graph"
    assert engines["smollm2-side"]["recipe"] == "cuda-smollm2-eager-side"
    assert engines["smollm2"]["port"] != engines["smollm2-side"]["port"]
    assert (RUN / "alongside-summary.txt").read_text().splitlines()[0] == "two engines on one card: PASS"


def test_the_switch_counted_the_engine_beside_it_on_the_card() -> None:
    """With two engines on the card, the card's free memory was what the third (the primary's new
    engine) had to fit in — the rule as recorded, on the card's own numbers — and the new engine took
    a port neither running engine held."""
    restart = json.loads((RUN / "restart.json").read_text())["switch"]
    assert restart["path"] == "blue_green"
    new = json.loads((RUN / "launch-20261202T124139-cuda-smollm2-graph-482486.json").read_text())
    data = [e for e in new["events"] if e["kind"] == "switch-path"][-1]["data"]
    assert data["gpu_placement"] == "same_card"
    assert data["gpu0_free_gib"] - data["gpu0_need_gib"] >= data["gpu_margin_gib"]
    # Free memory with two engines on it is well below the card's total less one engine's share.
    assert data["gpu0_free_gib"] < data["gpu0_total_gib"] - 2 * data["gpu0_need_gib"] + 2
    ports = {e["port"] for e in json.loads((RUN / "status-both.json").read_text())["engines"]}
    assert "--port" in new["argv"] and int(new["argv"][new["argv"].index("--port") + 1]) not in ports


def test_the_side_engine_kept_its_own_launch_record_marked_alongside() -> None:
    side = json.loads((RUN / "launch-20261202T124017-cuda-smollm2-eager-side-516b21.json").read_text())
    kinds = [e["kind"] for e in side["events"]]
    assert kinds[0] == "alongside" and "ready" in kinds and side["status"] == "stopped"
    assert kinds[-2:] == ["draining", "drained"]  # `stop --model` drained it before the stop


def test_no_secret_came_back() -> None:
    for path in RUN.rglob("*"):
        if not path.is_file():
            continue
        text = path.read_text(errors="replace")
        for shape in ("eng_", "sk-app-", "adm_"):
            at = text.find(shape)
            while at >= 0:
                assert text[at + len(shape):].startswith("<redacted>"), (path.name, shape)
                at = text.find(shape, at + 1)
