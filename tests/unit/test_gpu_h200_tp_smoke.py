"""The TP model (scripts/make_tp_model.py) served by vLLM 0.26.0 on one H200, eager then graph
(scripts/gpu_h200/tp_model_smoke.sh, 2026-12-01): the appliance's own log parsers over both logs."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import Any

from appliance.observe.engine_facts import read_facts
from appliance.observe.log_phases import CacheOutcome, Phase, track_text
from appliance.observe.rank_logs import RankTracker

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "tests" / "fixtures" / "engine_logs" / "gpu-h200-tp-smoke-2026-12-01"


def _log(mode: str) -> str:
    return (SMOKE / f"engine-{mode}.log").read_text()


def _bench(mode: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((SMOKE / f"bench-{mode}.json").read_text())
    return data


def test_the_graph_start_compiles_and_captures() -> None:
    tracker = track_text(_log("graph"))
    s = tracker.summary()
    assert s.api_up and s.furthest is Phase.API_UP
    assert {Phase.COMPILE_STARTED, Phase.COMPILE_FINISHED, Phase.GRAPH_CAPTURE_DONE} <= set(s.reached)
    assert s.cache_outcome is CacheOutcome.MISS  # a fresh cache dir: compiled and saved
    assert s.compile_seconds == 11.87 and s.capture_rounds == 1 and s.capture_total == 51
    f = read_facts(_log("graph"))
    assert f.graph_pool_gib == 0.17 and f.graph_capture_seconds == 1.0
    assert f.memory is not None and f.memory.cudagraph_gib == 0.17 and f.memory.weights_gib == 0.03
    assert f.kv_cache_available_gib == 41.53


def test_the_eager_start_neither_compiles_nor_captures() -> None:
    s = track_text(_log("eager")).summary()
    assert s.api_up and s.furthest is Phase.API_UP
    assert not {Phase.COMPILE_STARTED, Phase.COMPILE_FINISHED, Phase.GRAPH_CAPTURE,
                Phase.GRAPH_CAPTURE_DONE} & set(s.reached)
    assert s.compile_seconds is None and s.capture_rounds == 0 and s.cache_outcome is CacheOutcome.UNKNOWN
    f = read_facts(_log("eager"))
    assert f.graph_pool_gib is None and f.graph_capture_seconds is None
    assert f.memory is not None and f.memory.cudagraph_gib == 0.0 and f.kv_cache_available_gib == 41.55
    assert "Enforce eager set" in _log("eager")


def test_both_are_one_process_of_the_same_model_without_rank_lines() -> None:
    # tensor_parallel_size=1 on one card: no Worker_TPn prefixes, so the rank tracker sees no ranks.
    for mode in ("eager", "graph"):
        text = _log(mode)
        assert "tensor_parallel_size=1" in text and "tp-llama-8h4kv" in text
        assert RankTracker().feed_text(text).ranks == []
        assert read_facts(text).attention_backend == "FLASH_ATTN"


def test_the_bench_figures_and_same_outputs() -> None:
    eager, graph = _bench("eager"), _bench("graph")
    assert (eager["decode_ms_per_token_median"], graph["decode_ms_per_token_median"]) == (4.996, 1.709)
    assert (eager["ttft_ms_median"], graph["ttft_ms_median"]) == (15.22, 8.34)
    for b in (eager, graph):
        assert b["same_across_requests"] and b["same_in_batch_as_serial"]
        assert len(set(b["serial_sha"]) | set(b["batch_sha"])) == 1
    assert eager["serial_sha"] == graph["serial_sha"]  # greedy output same with and without graphs


def test_make_txt_digests_are_the_recorded_ones() -> None:
    path = ROOT / "scripts" / "make_tp_model.py"
    spec = importlib.util.spec_from_file_location("make_tp_model", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    made = dict(re.findall(r"\[tp-model\] sha256 (\S+) ([0-9a-f]{64})", (SMOKE / "make.txt").read_text()))
    assert made == module.EXPECTED_SHA256
    assert "digests match the recorded ones" in (SMOKE / "make.txt").read_text()
