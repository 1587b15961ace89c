"""What this host can read about the cards a recipe runs on: names and power caps.

DOMAIN §7: results from different cards must not be mixed (cards 0/1 vs 2/3 differ by ~16 %, power
caps 280 vs 250 W), so every bench result records them. NVIDIA through NVML (`nvidia-ml-py`, only
when installed), AMD/Hygon through amdgpu's hwmon `power1_cap` (µW); what cannot be read is left
out, never guessed.
"""

from __future__ import annotations

import importlib
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def _nvml(devices: list[int]) -> dict[str, Any]:
    try:
        nvml: Any = importlib.import_module("pynvml")
        nvml.nvmlInit()
    except Exception:  # noqa: BLE001 — no module, no driver: nothing read
        return {}
    try:
        names: list[str] = []
        caps: list[float | None] = []
        for i in devices:
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            name = nvml.nvmlDeviceGetName(h)
            names.append(name.decode() if isinstance(name, bytes) else str(name))
            try:
                caps.append(nvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0)
            except Exception:  # noqa: BLE001
                caps.append(None)
        return {"names": names, "power_caps_w": caps}
    except Exception as exc:  # noqa: BLE001
        log.info("NVML could not describe devices %s: %s", devices, exc)
        return {}
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            log.debug("nvmlShutdown failed")


def _amdgpu(devices: list[int], root: Path) -> dict[str, Any]:
    caps: list[float | None] = []
    found = False
    for i in devices:
        cap: float | None = None
        for f in sorted((root / f"sys/class/drm/card{i}/device/hwmon").glob("hwmon*/power1_cap")):
            try:
                cap = int(f.read_text().strip()) / 1e6
                found = True
            except (OSError, ValueError):
                pass
        caps.append(cap)
    return {"power_caps_w": caps} if found else {}


def read_cards(platform: str | None, devices: list[int] | None, root: Path = Path("/")) -> dict[str, Any]:
    if not devices:
        return {}
    if platform == "cuda":
        return _nvml(devices)
    if platform == "gfx906":
        return _amdgpu(devices, root)
    return {}
