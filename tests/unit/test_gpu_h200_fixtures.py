"""The parser, the engine facts, the phase record and the doctor on REAL H200 output (docs/gpu-h200.md).

tests/fixtures/engine_logs/gpu-h200/: what the appliance itself produced on a lent NVIDIA H200 with
upstream vLLM 0.26.0 and SmolLM2-135M (docs/gpu-h200.md has the commands): the engine logs of a cold
and a warm start of each cuda-smollm2-* recipe, the launch records (`appliance launches ID`),
`launches --json`, `status --json`, the controller's own log and the host probes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from appliance.diagnosis.diagnose import FailureFacts, diagnose
from appliance.diagnosis.scan import scan_text
from appliance.diagnosis.signatures import DiagnosisCode
from appliance.observe.engine_facts import read_facts
from appliance.observe.log_phases import CacheOutcome, Phase, track_text
from appliance.observe.phase_record import PhaseRecorder, event_label

H200 = Path(__file__).resolve().parent.parent / "fixtures" / "engine_logs" / "gpu-h200"
GIB = 1024**3


def _log(name: str) -> str:
    return (H200 / f"{name}.log").read_text()


def _record(recipe: str, kind: str) -> dict[str, Any]:
    for path in sorted((H200 / "records").glob(f"launch-*-{recipe}-*.json")):
        data: dict[str, Any] = json.loads(path.read_text())
        if data["kind"] == kind:
            return data
    raise AssertionError(f"no {kind} record of {recipe}")


@pytest.mark.parametrize(("mode", "outcome"), [
    ("graph-cold", CacheOutcome.MISS), ("graph-warm", CacheOutcome.HIT),
    ("piecewise-cold", CacheOutcome.MISS), ("piecewise-warm", CacheOutcome.HIT),
    ("eager-cold", CacheOutcome.UNKNOWN), ("eager-warm", CacheOutcome.UNKNOWN),
])
def test_every_start_reaches_api_up_with_the_right_cache_outcome(mode: str, outcome: CacheOutcome) -> None:
    tracker = track_text(_log(mode))
    assert tracker.api_up and tracker.furthest is Phase.API_UP
    assert tracker.cache_outcome is outcome
    if outcome is CacheOutcome.HIT:  # the GPU's own proof (DOMAIN §4), unlike the CPU build's miss
        assert any("Directly load AOT compilation from path" in e for e in tracker.cache_evidence)


def test_compiled_starts_finish_the_compile_phase_with_its_seconds() -> None:
    cold, warm = track_text(_log("graph-cold")).summary(), track_text(_log("graph-warm")).summary()
    assert cold.compile_seconds == 18.35 and warm.compile_seconds == 3.93  # the warm start loads
    # PIECEWISE then FULL bars of one pass: one round (the seed's counting), 51 sizes
    assert cold.capture_rounds == 1 and cold.capture_total == 51
    assert track_text(_log("piecewise-cold")).summary().capture_total == 4  # sizes 1 2 4 8


@pytest.mark.parametrize(("mode", "pool", "kv_gib", "kv_tokens"), [
    ("graph-cold", 0.39, 41.27, 1923504), ("piecewise-warm", 0.05, 41.32, 1925840),
    ("eager-cold", None, 41.33, 1925872),
])
def test_engine_facts_of_the_real_logs(mode: str, pool: float | None, kv_gib: float, kv_tokens: int) -> None:
    f = read_facts(_log(mode))
    assert (f.attention_backend, f.flash_attn_version, f.model_runner) == ("FLASH_ATTN", 3, "V2")
    assert f.memory is not None and f.memory.total_gib == 139.8 and f.memory.weights_gib == 0.26
    assert f.memory.requested_gib == 41.94 and f.memory.utilization == 0.3
    # a smaller graph pool leaves more for the KV cache
    assert f.kv_cache_available_gib == kv_gib and f.kv_cache_tokens == kv_tokens
    assert f.graph_pool_gib == pool
    assert f.memory.cudagraph_gib == (pool or 0.0)


@pytest.mark.parametrize(("recipe", "kind", "mode"), [
    ("cuda-smollm2-graph", "cold-warmup", "graph-cold"), ("cuda-smollm2-graph", "warm", "graph-warm"),
    ("cuda-smollm2-piecewise", "cold-warmup", "piecewise-cold"),
    ("cuda-smollm2-eager", "normal", "eager-cold"),
])
def test_the_record_keeps_one_row_per_phase_as_the_recorder_says(recipe: str, kind: str,
                                                                  mode: str) -> None:
    # The rows the controller stored on the H200 are exactly what the recorder keeps of the whole log:
    # one per phase, and per capture round its first and last step (51 rows before).
    # The records were stored by the H200 run, before capture rounds were counted the seed's way
    # (the PIECEWISE and FULL bars of one pass are one round): the rows are the same, the
    # capture labels now say round 1 for the FULL bar where the run wrote round 2.
    rec = _record(recipe, kind)
    recorder = PhaseRecorder()
    kept = [e for e in track_text(_log(mode)).events if recorder.keep(e)]
    names = [p["name"] for p in rec["phases"]]
    assert names == [e.phase.value for e in kept]
    assert names.count("process_started") == 1 and len(names) <= 16
    labels = [e["message"] for e in rec["events"] if e["kind"] == "phase"]
    relabel = [event_label(e) for e in kept]
    assert [m.replace("round 2", "round 1") for m in labels] == relabel
    assert "weights loaded" not in labels[: labels.index("loading weights")]


def test_records_hold_versions_engine_facts_and_gpu_peaks_by_phase() -> None:
    rec = _record("cuda-smollm2-graph", "cold-warmup")
    assert rec["packages"] == {"torch": "2.11.0", "transformers": "5.17.0", "vllm": "0.26.0"}
    engine = rec["engine"]
    assert isinstance(engine, dict) and engine["compile_seconds"] == 18.35
    assert engine["memory"]["cudagraph_gib"] == 0.39 and engine["model_runner"] == "V2"
    peaks = rec["gpu_peaks"]
    assert isinstance(peaks, dict)
    # NVML on the H200: GPU memory jumps when the KV cache is allocated (0.3 × 139.8 GiB).
    kv, compiled = peaks["kv_cache"]["0"], peaks["compile_finished"]["0"]
    assert kv["used_max_bytes"] > 40 * GIB > compiled["used_max_bytes"]
    assert peaks["kv_cache"]["0"]["total_bytes"] == 150754820096


def test_warm_restarts_are_recorded_as_hits_and_faster() -> None:
    for recipe in ("cuda-smollm2-graph", "cuda-smollm2-piecewise"):
        cold, warm = _record(recipe, "cold-warmup"), _record(recipe, "warm")
        assert (cold["cache"], warm["cache"]) == ("miss", "hit")
        assert warm["ready_s"] < cold["ready_s"]


def test_doctor_finds_no_failure_in_the_real_starts() -> None:
    for mode in ("graph-cold", "graph-warm", "piecewise-warm", "eager-cold"):
        codes = {f.code for f in scan_text(_log(mode)) if not f.benign}
        assert codes <= {DiagnosisCode.AOT_CACHE_MISS, DiagnosisCode.LOOPBACK_BIND}, (mode, codes)


def test_the_controller_log_has_the_controllers_own_lines() -> None:
    text = (H200 / "controller.log").read_text()
    # The first attempt ran the old code: provenance imported the docker SDK, absent on the device.
    assert "ModuleNotFoundError: No module named 'docker'" in text
    # our own lines, not only uvicorn's
    assert text.count("controller.runtime.process: started cuda-smollm2-") >= 6
    assert "Uvicorn running on" in text


def test_tp2_with_9_attention_heads_is_a_config_error_not_retried() -> None:
    # 2 × H200: vLLM refuses TP=2 for SmolLM2-135M (9 heads). The controller of that run retried it
    # 4 times with backoff (its record says exit_nonzero, retryable); now it stops at once.
    old = json.loads(next((H200 / "records").glob("launch-*-cuda-smollm2-tp2-graph-*.json")).read_text())
    assert old["diagnosis"]["code"] == "exit_nonzero" and old["diagnosis"]["retryable"] is True
    d = diagnose(FailureFacts(exit_code=1, log_tail=tuple(_log("tp2-heads-not-divisible").splitlines())))
    assert d.code is DiagnosisCode.ENGINE_CONFIG_INVALID and d.retryable is False
    assert "attention heads (9) must be divisible by tensor parallel size (2)" in d.summary
