"""What the GPU health watch costs the controller: CPU per sample, and % of a core at its interval.

    python bench/gpu_health_cost.py [--samples 200] [--cards 8]

Runs the real sampling path — `HealthReader.sample()` then `GpuHealthLink.on_cards` (assess, the
Prometheus gauges) — over (a) the real H200 recording replayed through the NVML seam for `--cards`
cards, and (b) a fake amdgpu sysfs tree of 4 cards (real file reads), and prints CPU ms per sample and
the share of one core at the watch's interval (HEALTH_INTERVAL_S). The replay costs nothing of NVML
itself: the recording's own `sample_cost` (the NVML calls on the lent H200) is added per card.
The goal: the idle controller stays under 1% of a core (MEASURED.md: 0.8–1.4% without this watch).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from appliance.observe.gpu_health import ReplayQueries, recording_from_raw  # noqa: E402
from controller.metrics import ControllerMetrics  # noqa: E402
from controller.supervisor.gpu_health_watch import GpuHealthLink  # noqa: E402
from controller.watch.gpu_health import HEALTH_INTERVAL_S, HealthReader  # noqa: E402

H200 = REPO / "tests" / "fixtures" / "gpu_health" / "h200-2026-12-01" / "nvml-raw.json"


def _amd_tree(root: Path, cards: int) -> None:
    for n in range(cards):
        dev = root / f"sys/class/drm/card{n}/device"
        (dev / "hwmon/hwmon0").mkdir(parents=True)
        (dev / "ras").mkdir()
        files = {"vendor": "0x1d94", "uevent": f"PCI_SLOT_NAME=0000:{0x43 + n:02x}:00.0",
                 "current_link_speed": "16.0 GT/s PCIe", "max_link_speed": "16.0 GT/s PCIe",
                 "current_link_width": "16", "max_link_width": "16", "gpu_busy_percent": "0",
                 "hwmon/hwmon0/temp1_input": "45000", "hwmon/hwmon0/temp1_crit": "100000",
                 "hwmon/hwmon0/power1_average": "35000000", "hwmon/hwmon0/power1_cap": "300000000",
                 "ras/umc_err_count": "ue: 0\nce: 0\n", "ras/gfx_err_count": "ue: 0\nce: 0\n"}
        for name, text in files.items():
            (dev / name).write_text(text + "\n")


def _cost(reader: HealthReader, samples: int) -> float:
    """Median CPU seconds of one sample + on_cards."""
    link = GpuHealthLink(reader, metrics=ControllerMetrics())
    link.on_cards(reader.sample())  # warm-up: imports, label children
    costs = []
    for _ in range(samples):
        cpu = time.process_time()
        link.on_cards(reader.sample())
        costs.append(time.process_time() - cpu)
    return statistics.median(costs)


def measure(samples: int = 200, cards: int = 8) -> dict[str, Any]:
    raw = json.loads(H200.read_text())
    one = recording_from_raw(raw["samples"][0]["cards"][0])
    replay = ReplayQueries({"cards": [one] * cards})
    with tempfile.TemporaryDirectory() as tmp:
        nvidia_s = _cost(HealthReader(Path(tmp), nvml=replay), samples)
        _amd_tree(Path(tmp), 4)
        amd_s = _cost(HealthReader(Path(tmp), use_nvml=False), samples)
    # The recorder's raw calls on the H200 (more calls than the watch asks: fan, clocks, memory…);
    # after the first sample, one card's NVML calls cost this much CPU.
    nvml_card_s = statistics.median(c["cpu_s"] for c in raw["sample_cost"][1:])
    nvidia_total = nvidia_s + cards * nvml_card_s

    def pct(seconds: float) -> float:
        return round(100 * seconds / HEALTH_INTERVAL_S, 4)

    return {
        "interval_s": HEALTH_INTERVAL_S, "nvidia_cards": cards,
        "nvidia_parse_assess_metrics_ms": round(nvidia_s * 1000, 3),
        "h200_nvml_calls_ms_per_card": round(nvml_card_s * 1000, 3),
        "nvidia_total_ms_per_sample": round(nvidia_total * 1000, 3),
        "nvidia_core_percent": pct(nvidia_total),
        "amd_4_cards_ms_per_sample": round(amd_s * 1000, 3), "amd_core_percent": pct(amd_s),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--cards", type=int, default=8)
    args = ap.parse_args()
    print(json.dumps(measure(args.samples, args.cards), indent=1))


if __name__ == "__main__":
    main()
