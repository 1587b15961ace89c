"""vLLM 0.26.0's real refusal on the H200 with another process holding 100 GiB, and the admission
judgements recorded on the same card (scripts/gpu_h200/kv_admission_check.sh, 2026-12-01)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from appliance.diagnosis.diagnose import FailureFacts, diagnose
from appliance.diagnosis.scan import scan_text
from appliance.diagnosis.signatures import DiagnosisCode
from appliance.recipe.gpu_kv_admission import CardMemory, GpuMemoryView, gpu_memory_checks
from tests.unit.recipe_helpers import shipped

DOCTOR = Path(__file__).resolve().parents[1] / "fixtures" / "doctor"
REAL = DOCTOR / "gpu_memory_short_h200_real.log"
RUN = DOCTOR.parent / "gpu_kv_admission" / "h200-2026-12-01"
MIB = 2**20


def test_the_real_refusal_is_gpu_memory_short_not_retried_with_its_numbers() -> None:
    text = REAL.read_text()
    assert "Free memory on device cuda:0 (38.77/139.8 GiB)" in text  # the real line, not composed
    diagnosis = diagnose(FailureFacts(exit_code=1, log_tail=tuple(text.split("\n"))))
    assert diagnosis.code is DiagnosisCode.GPU_MEMORY_SHORT and not diagnosis.retryable
    for figure in ("cuda:0", "38.77 of 139.8 GiB free", "0.9", "125.82 GiB"):
        assert figure in diagnosis.summary
    assert DiagnosisCode.GPU_MEMORY_SHORT in {f.code for f in scan_text(text)}
    # What the diagnosis said on the machine itself, recorded beside the judgements.
    recorded = (RUN / "diagnosis.txt").read_text()
    assert recorded.startswith("diagnosis gpu_memory_short not retryable")
    assert diagnosis.summary in recorded


def _judgements(label: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((RUN / f"judge-{label}.json").read_text())
    return data


@pytest.mark.parametrize("label", ["idle", "held"])
def test_the_recorded_judgements_are_what_admission_gives_for_the_recorded_card(label: str) -> None:
    rec = _judgements(label)
    cards = tuple(CardMemory.model_validate(c) for c in rec["cards"])
    held = {int(k): int(v) for k, v in rec["held_by_pid"].items()}
    base = shipped()["cuda-smollm2-graph"]
    views = {"nothing_replaced": GpuMemoryView(cards=cards, held={}),
             "replacing_pid": GpuMemoryView(cards=cards, held=held),
             "side_by_side": GpuMemoryView(cards=cards, held=held, replaces_running=False)}
    keys = [k for k in rec if "/" in k]
    assert keys
    for key in keys:
        util, how = key.split("/")
        recipe = base.model_copy(update={"engine": base.engine.model_copy(
            update={"gpu_memory_utilization": float(util)})})
        (check,) = gpu_memory_checks(recipe, views[how])
        assert (check.verdict, check.message) == (rec[key]["verdict"], rec[key]["message"]), key


def test_the_held_card_refuses_0_9_unless_the_holder_is_the_engine_being_replaced() -> None:
    rec = _judgements("held")
    assert rec["0.9/nothing_replaced"]["verdict"] == rec["0.9/side_by_side"]["verdict"] == "refuse"
    assert rec["0.9/replacing_pid"]["verdict"] == "admit"
    assert "87.58 GiB short" in rec["0.9/nothing_replaced"]["message"]
    assert _judgements("idle")["0.9/nothing_replaced"]["verdict"] == "admit"


@pytest.mark.parametrize("label", ["idle", "held"])
def test_nvml_free_agrees_with_nvidia_smi_on_the_same_card(label: str) -> None:
    # nvidia-smi --query-gpu=memory.used,memory.free,memory.total (MiB), read just after the judgement.
    used, free, total = (int(x.split()[0]) for x in (RUN / f"nvidia-smi-{label}.txt").read_text().split(","))
    (card,) = _judgements(label)["cards"]
    assert card["total_bytes"] == total * MIB
    assert abs(card["free_bytes"] / MIB - free) <= 1
    assert used + free <= total
