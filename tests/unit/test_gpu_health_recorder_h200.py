"""The recorder's own output from the real H200 (tests/fixtures/gpu_health/h200-2026-12-01-recorder/):
what `scripts/gpu_h200/record_gpu_health.py` wrote through the watch's NVML seam, replayed here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from appliance.observe.gpu_events import parse_gpu_line
from appliance.observe.gpu_health import NVML_QUERIES, ReplayQueries, assess, card_from_queries

REC = Path(__file__).parents[1] / "fixtures" / "gpu_health" / "h200-2026-12-01-recorder"


def recording() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((REC / "nvml-queries.json").read_text())
    return data


def test_the_recording_is_the_recorders_format_with_every_query() -> None:
    rec = recording()
    assert rec["format"] == "appliance-gpu-health-recording/1" and rec["driver"] == "580.159.04"
    assert rec["count"] == 1 and len(rec["samples"]) >= 2
    for sample in rec["samples"]:
        assert set(sample["cards"][0]) == set(NVML_QUERIES)


def test_replayed_it_assesses_to_what_the_card_itself_assessed() -> None:
    # The recorder assessed the last sample on the H200; the replay must reach the same card and verdict.
    rec = recording()
    card = card_from_queries(0, ReplayQueries(rec, sample=len(rec["samples"]) - 1))
    recorded = json.loads((REC / "assessed.json").read_text())
    assert len(recorded) == 1
    assert card.model_dump(mode="json") == recorded[0]["card"]
    assert [f.model_dump(mode="json") for f in assess(card)] == recorded[0]["findings"] == []
    assert card.name == "NVIDIA H200" and card.throttle_reasons == ("gpu_idle",)
    assert set(card.unsupported) == {"retired_pages", "retired_pages_pending"}


def test_every_sample_is_healthy() -> None:
    rec = recording()
    for i in range(len(rec["samples"])):
        assert assess(card_from_queries(0, ReplayQueries(rec, sample=i))) == []


def test_the_drivers_kernel_lines_are_not_gpu_events() -> None:
    # Real NVRM/nvidia boot lines (FBHUB poison clear, persistence-mode notice): none is an Xid.
    lines = [ln for ln in (REC / "dmesg-nvrm.txt").read_text().splitlines() if ln.strip()]
    assert any("NVRM:" in ln for ln in lines) and any("FBHUB" in ln for ln in lines)
    assert [ln for ln in lines if parse_gpu_line(ln) is not None] == []
