"""bench/gpu_health_cost.py runs (a few samples) and reports its figures."""

from __future__ import annotations

import importlib.util
from pathlib import Path


def test_the_gpu_health_cost_bench_reports_per_sample_cost_and_core_share() -> None:
    path = Path(__file__).parents[2] / "bench" / "gpu_health_cost.py"
    spec = importlib.util.spec_from_file_location("gpu_health_cost", path)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = bench.measure(samples=3, cards=2)
    assert out["nvidia_cards"] == 2 and out["interval_s"] == 10.0
    assert out["h200_nvml_calls_ms_per_card"] > 0  # from the recording's own sample_cost
    assert out["nvidia_total_ms_per_sample"] >= out["nvidia_parse_assess_metrics_ms"]
    assert out["amd_core_percent"] >= 0 and out["nvidia_core_percent"] >= 0
