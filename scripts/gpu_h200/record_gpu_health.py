#!/usr/bin/env python3
"""Record a real card's health through the controller's own NVML seam, as a test fixture.

    python3 scripts/gpu_h200/record_gpu_health.py OUT_DIR [--samples 5] [--interval 1]

Runs on the GPU machine in well under a minute (needs `nvidia-ml-py`, the `gpu` extra). It asks every
query of `NVML_QUERIES` through `PynvmlQueries` — the class the controller reads cards with
(controller/watch/gpu_health.py) — so the recording is what the watch saw, errors included
(`{"error": "NVMLError_NotSupported: Not Supported"}`), and writes into OUT_DIR:

- `nvml-queries.json`: {"format", "driver", "samples": [{"t", "cards": [{query: answer}]}],
  "sample_cost": [{"wall_s", "cpu_s"}]} — replayed by `ReplayQueries` in tests/unit/test_gpu_health.py;
- `assessed.json`: what `assess` says of each card of the last sample (a healthy card: nothing);
- `dmesg-nvrm.txt`: the kernel log's `NVRM:` lines (for the Xid parser: a healthy card has no Xid).

Copy OUT_DIR to tests/fixtures/gpu_health/<machine>-<date>/ and point the replay test at it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root (or .gpuwt/)

from appliance.observe.gpu_health import (
    NVML_QUERIES,
    CardQueries,
    ReplayQueries,
    assess,
    card_from_queries,
)
from controller.watch.gpu_health import load_pynvml

FORMAT = "appliance-gpu-health-recording/1"


def _answer(queries: Any, index: int, name: str) -> Any:
    try:
        value = queries.query(index, name)
    except Exception as exc:  # noqa: BLE001 - recorded as NVML said it
        return {"error": f"{type(exc).__name__}: {exc}"}
    return value if isinstance(value, (int, float, str, bool, list)) or value is None else str(value)


def record(queries: CardQueries, samples: int, interval_s: float, driver: str,
           sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
    """`samples` samples of every card through the seam, with each sample's cost."""
    count = queries.count()
    out: list[dict[str, Any]] = []
    costs: list[dict[str, float]] = []
    for i in range(samples):
        wall, cpu = time.perf_counter(), time.process_time()
        cards = [{name: _answer(queries, k, name) for name in NVML_QUERIES} for k in range(count)]
        costs.append({"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu})
        out.append({"t": time.time(), "cards": cards})
        if i + 1 < samples:
            sleep(interval_s)
    return {"format": FORMAT, "driver": driver, "count": count, "samples": out, "sample_cost": costs}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--samples", type=int, default=5)
    ap.add_argument("--interval", type=float, default=1.0)
    args = ap.parse_args()
    queries, why = load_pynvml()
    if queries is None:
        print(f"NVML unavailable: {why}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        driver = queries.nvml.nvmlSystemGetDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else str(driver)
    except Exception as exc:  # noqa: BLE001
        driver = f"unknown ({exc})"
    recording = record(queries, args.samples, args.interval, driver)
    count, costs = recording["count"], recording["sample_cost"]
    (args.out / "nvml-queries.json").write_text(json.dumps(recording, indent=1) + "\n")
    replay = ReplayQueries(recording, sample=len(recording["samples"]) - 1)
    assessed = []
    for k in range(count):
        card = card_from_queries(k, replay)
        assessed.append({"card": card.model_dump(mode="json"),
                         "findings": [f.model_dump(mode="json") for f in assess(card)]})
    (args.out / "assessed.json").write_text(json.dumps(assessed, indent=1) + "\n")
    try:
        dmesg = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        dmesg = f"dmesg unavailable: {exc}\n"
    (args.out / "dmesg-nvrm.txt").write_text("".join(line + "\n" for line in dmesg.splitlines()
                                                     if "NVRM" in line or "nvidia" in line.lower()))
    per_sample = sorted(c["cpu_s"] for c in costs[1:] or costs)
    print(json.dumps({"cards": count, "driver": driver, "findings": sum(len(a["findings"]) for a in assessed),
                      "cpu_s_per_sample_median": per_sample[len(per_sample) // 2]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
