"""GPU memory and utilisation samples, and a launch's peaks by start-up phase. Pure.

Graph capture is where GPU memory jumps (MEASURED.md, H200: the default mode's graph pool
took 0.39 GiB, PIECEWISE [1,2,4,8] 0.05 GiB; DOMAIN §3: on a 31.98 GiB Z100 the margin is what
decides a start), so a launch record keeps, per phase, the highest memory use and utilisation each
card showed. Samples come from NVML on NVIDIA (controller/watch/gpu.py) and from the amdgpu sysfs
files on AMD/Hygon cards, parsed here:

- ``/sys/class/drm/cardN/device/mem_info_vram_used``, ``mem_info_vram_total``: bytes, one integer;
- ``/sys/class/drm/cardN/device/gpu_busy_percent``: 0..100;
- ``/sys/class/drm/cardN/device/vendor``: ``0x1002`` (AMD) or ``0x1d94`` (Hygon).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from pydantic import BaseModel, ConfigDict

from appliance.host_facts import GPU_VENDORS


class GpuSample(BaseModel):
    model_config = ConfigDict(frozen=True)

    index: int  # NVML index, or N of /sys/class/drm/cardN
    vendor: str  # nvidia | amd | hygon | unknown
    name: str | None = None
    used_bytes: int | None = None
    total_bytes: int | None = None
    busy_percent: float | None = None


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text.strip(), 0)
    except ValueError:
        return None


def parse_amdgpu(index: int, files: Mapping[str, str]) -> GpuSample | None:
    """One card from its sysfs files (name → content); None when it has no VRAM accounting."""
    total = _int(files.get("mem_info_vram_total"))
    used = _int(files.get("mem_info_vram_used"))
    if total is None and used is None:
        return None
    busy = _int(files.get("gpu_busy_percent"))
    vendor = GPU_VENDORS.get((files.get("vendor") or "").strip().lower(), "unknown")
    return GpuSample(index=index, vendor=vendor, used_bytes=used, total_bytes=total,
                     busy_percent=float(busy) if busy is not None and 0 <= busy <= 100 else None)


class GpuPeak(BaseModel):
    used_max_bytes: int | None = None
    total_bytes: int | None = None
    busy_max_percent: float | None = None


def _max(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    return a if b is None else max(a, b)


class PhasePeaks:
    """Per phase (the supervisor's current phase when the sample was taken), per card: the peaks."""

    def __init__(self) -> None:
        self.by_phase: dict[str, dict[int, GpuPeak]] = {}

    def update(self, phase: str | None, samples: Iterable[GpuSample]) -> bool:
        """Fold samples in; True when a peak rose (worth writing to the record)."""
        key = phase or "before_first_phase"
        cards = self.by_phase.setdefault(key, {})
        changed = False
        for s in samples:
            old = cards.get(s.index, GpuPeak())
            used = _max(old.used_max_bytes, s.used_bytes)
            new = GpuPeak(used_max_bytes=int(used) if used is not None else None,
                          total_bytes=s.total_bytes or old.total_bytes,
                          busy_max_percent=_max(old.busy_max_percent, s.busy_percent))
            if new != old:
                cards[s.index] = new
                changed = True
        return changed

    def record(self) -> dict[str, dict[str, dict[str, float | int | None]]]:
        """JSON-able: {phase: {card index: {used_max_bytes, total_bytes, busy_max_percent}}}."""
        return {phase: {str(i): p.model_dump() for i, p in sorted(cards.items())}
                for phase, cards in self.by_phase.items()}
