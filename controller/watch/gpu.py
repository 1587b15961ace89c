"""Reading GPU memory and utilisation: NVML on NVIDIA, amdgpu sysfs on AMD/Hygon.

NVML comes from `nvidia-ml-py` (module `pynvml`), imported only when this runs: a host without it,
or without an NVIDIA driver, just has no NVIDIA samples. NVML asks the driver, so it is used only
when the host root is the real `/`; the sysfs files are read through the injected host root like
every other host fact (fixture trees under tests/fixtures/hosts). Parsing is appliance/observe/gpu_mem.py.
"""

from __future__ import annotations

import importlib
import logging
import re
from collections.abc import Collection
from pathlib import Path
from types import ModuleType
from typing import Any

from appliance.observe.gpu_mem import GpuSample, parse_amdgpu

log = logging.getLogger(__name__)

_CARD = re.compile(r"^card(\d+)$")
_AMDGPU_FILES = ("mem_info_vram_used", "mem_info_vram_total", "gpu_busy_percent", "vendor")


class GpuReader:
    def __init__(self, host_root: Path = Path("/"), nvml: bool | None = None) -> None:
        """`nvml`: None = use NVML when the host root is `/`."""
        self.host_root = host_root
        self._want_nvml = (host_root == Path("/")) if nvml is None else nvml
        self._nvml: ModuleType | None = None
        self._nvml_failed = False

    def sample(self) -> list[GpuSample]:
        return self._nvml_samples() + self._amdgpu_samples()

    # -- NVIDIA

    def _nvml_module(self) -> ModuleType | None:
        if not self._want_nvml or self._nvml_failed:
            return None
        if self._nvml is None:
            try:
                module = importlib.import_module("pynvml")
                module.nvmlInit()
            except Exception as exc:  # noqa: BLE001 - ImportError, NVMLError (no driver): no NVIDIA samples
                log.info("no NVML GPU samples: %s", exc)
                self._nvml_failed = True
                return None
            self._nvml = module
        return self._nvml

    def _nvml_samples(self) -> list[GpuSample]:
        nvml = self._nvml_module()
        if nvml is None:
            return []
        out: list[GpuSample] = []
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except Exception as exc:  # noqa: BLE001 - the driver went away: report, keep going
            log.warning("NVML device count failed: %s", exc)
            return []
        for i in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(i)
                mem: Any = nvml.nvmlDeviceGetMemoryInfo(handle)
                util: Any = nvml.nvmlDeviceGetUtilizationRates(handle)
                name = nvml.nvmlDeviceGetName(handle)
            except Exception as exc:  # noqa: BLE001 - one card failing must not hide the others
                log.warning("NVML read of GPU %d failed: %s", i, exc)
                continue
            out.append(GpuSample(index=i, vendor="nvidia",
                                 name=name.decode() if isinstance(name, bytes) else str(name),
                                 used_bytes=int(mem.used), total_bytes=int(mem.total),
                                 busy_percent=float(util.gpu)))
        return out

    def process_memory(self, pids: Collection[int]) -> dict[int, int] | None:
        """Bytes per NVML card that the given processes hold (NVML's running compute and graphics
        processes); None when NVML cannot say (no NVML, or a card's process list failed)."""
        nvml = self._nvml_module()
        if nvml is None:
            return None
        wanted = set(pids)
        held: dict[int, int] = {}
        try:
            for i in range(int(nvml.nvmlDeviceGetCount())):
                handle = nvml.nvmlDeviceGetHandleByIndex(i)
                procs: list[Any] = [*nvml.nvmlDeviceGetComputeRunningProcesses(handle),
                                    *nvml.nvmlDeviceGetGraphicsRunningProcesses(handle)]
                seen: set[int] = set()
                for p in procs:
                    used = getattr(p, "usedGpuMemory", None)
                    if p.pid in wanted and p.pid not in seen and isinstance(used, int):
                        seen.add(p.pid)  # a process in both lists is one allocation
                        held[i] = held.get(i, 0) + used
        except Exception as exc:  # noqa: BLE001 - NVMLError: the share is unknown, said by the caller
            log.info("NVML process memory not read: %s", exc)
            return None
        return held

    # -- AMD / Hygon (amdgpu sysfs)

    def _amdgpu_samples(self) -> list[GpuSample]:
        drm = self.host_root / "sys/class/drm"
        try:
            cards = sorted((int(m.group(1)), p) for p in drm.iterdir() if (m := _CARD.match(p.name)))
        except OSError:
            return []
        out: list[GpuSample] = []
        for index, card in cards:
            files: dict[str, str] = {}
            for name in _AMDGPU_FILES:
                try:
                    files[name] = (card / "device" / name).read_text()
                except OSError:
                    continue
            sample = parse_amdgpu(index, files)
            if sample is not None:
                out.append(sample)
        return out
