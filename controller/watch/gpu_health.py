"""Reading card health: NVML on NVIDIA (the `CardQueries` seam answered by pynvml), amdgpu sysfs on
AMD/Hygon. Parsing and judging are appliance/observe/gpu_health.py.

NVML comes from `nvidia-ml-py` (module `pynvml`, the `gpu` extra), imported only when this runs, like
the memory watch (controller/watch/gpu.py). NVML missing or failing is said once, as one warning that
names what is blind, and the watch goes on with what it can read; a query a card does not support
(the H200's retired-pages query, MEASURED.md) is not asked again.

Cost: one NVIDIA card is ~20 NVML calls (microseconds each, the ECC counters the slowest), one AMD card
~15 small sysfs reads; `HealthReader` is sampled every `HEALTH_INTERVAL_S`, far from the memory watch's
2 s, which keeps an idle controller under 1% of a core (bench/controller_idle.py).
"""

from __future__ import annotations

import importlib
import logging
import re
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from appliance.host_facts import GPU_VENDORS
from appliance.observe.gpu_events import pci_key
from appliance.observe.gpu_health import (
    NVML_QUERIES,
    CardHealth,
    CardQueries,
    card_from_queries,
    parse_amdgpu_health,
)

log = logging.getLogger(__name__)

HEALTH_INTERVAL_S = 10.0
_CARD = re.compile(r"^card(\d+)$")
_AMD_FILES = ("current_link_speed", "max_link_speed", "current_link_width", "max_link_width",
              "gpu_busy_percent", "vendor")
_HWMON_FILES = ("temp1_input", "temp1_crit", "temp1_emergency", "power1_average", "power1_input",
                "power1_cap")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class PynvmlQueries:
    """`CardQueries` answered by pynvml (the recorder uses the same class, so a recording is what the
    reader saw)."""

    def __init__(self, nvml: ModuleType) -> None:
        self.nvml = nvml
        self._handles: dict[int, Any] = {}
        n = nvml
        self._calls: dict[str, Callable[[Any], Any]] = {
            "name": lambda h: _text(n.nvmlDeviceGetName(h)),
            "pci_bus_id": lambda h: _text(n.nvmlDeviceGetPciInfo(h).busId),
            "temperature_c": lambda h: n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU),
            "temperature_slowdown_c": lambda h: n.nvmlDeviceGetTemperatureThreshold(
                h, n.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
            "temperature_shutdown_c": lambda h: n.nvmlDeviceGetTemperatureThreshold(
                h, n.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN),
            "power_w": lambda h: n.nvmlDeviceGetPowerUsage(h) / 1000.0,
            "power_limit_w": lambda h: n.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0,
            "throttle_reasons": self._throttle,
            "ecc_volatile_corrected": lambda h: self._ecc(h, "CORRECTED", "VOLATILE"),
            "ecc_volatile_uncorrected": lambda h: self._ecc(h, "UNCORRECTED", "VOLATILE"),
            "ecc_aggregate_corrected": lambda h: self._ecc(h, "CORRECTED", "AGGREGATE"),
            "ecc_aggregate_uncorrected": lambda h: self._ecc(h, "UNCORRECTED", "AGGREGATE"),
            "retired_pages": lambda h: sum(
                len(n.nvmlDeviceGetRetiredPages(h, cause)) for cause in (
                    n.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
                    n.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)),
            "retired_pages_pending": lambda h: bool(n.nvmlDeviceGetRetiredPagesPendingStatus(h)),
            "remapped_rows": lambda h: [int(v) for v in n.nvmlDeviceGetRemappedRows(h)],
            "pcie_gen": lambda h: n.nvmlDeviceGetCurrPcieLinkGeneration(h),
            "pcie_gen_max": lambda h: n.nvmlDeviceGetMaxPcieLinkGeneration(h),
            "pcie_width": lambda h: n.nvmlDeviceGetCurrPcieLinkWidth(h),
            "pcie_width_max": lambda h: n.nvmlDeviceGetMaxPcieLinkWidth(h),
            "utilization_percent": lambda h: n.nvmlDeviceGetUtilizationRates(h).gpu,
        }
        missing = set(NVML_QUERIES) - set(self._calls)
        assert not missing, missing

    def _throttle(self, handle: Any) -> int:
        n = self.nvml
        get = getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            n.nvmlDeviceGetCurrentClocksThrottleReasons
        return int(get(handle))

    def _ecc(self, handle: Any, kind: str, counter: str) -> int:
        n = self.nvml
        return int(n.nvmlDeviceGetTotalEccErrors(handle, getattr(n, f"NVML_MEMORY_ERROR_TYPE_{kind}"),
                                                 getattr(n, f"NVML_{counter}_ECC")))

    def count(self) -> int:
        return int(self.nvml.nvmlDeviceGetCount())

    def query(self, index: int, name: str) -> Any:
        handle = self._handles.get(index)
        if handle is None:
            handle = self._handles[index] = self.nvml.nvmlDeviceGetHandleByIndex(index)
        return self._calls[name](handle)


def load_pynvml() -> tuple[PynvmlQueries | None, str | None]:
    """(queries, None) or (None, why NVML cannot be used)."""
    try:
        module = importlib.import_module("pynvml")
        module.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - ImportError, NVMLError_LibraryNotFound / DriverNotLoaded
        return None, f"{type(exc).__name__}: {exc}"
    return PynvmlQueries(module), None


class HealthReader:
    """All cards' health, NVIDIA then AMD/Hygon. Never raises: what cannot be read is blind."""

    def __init__(self, host_root: Path = Path("/"), nvml: CardQueries | None = None,
                 use_nvml: bool | None = None) -> None:
        self.host_root = host_root
        self._nvml = nvml
        self._want_nvml = nvml is not None or ((host_root == Path("/")) if use_nvml is None else use_nvml)
        self._nvml_tried = nvml is not None
        self._unsupported: dict[int, set[str]] = {}  # queries a card answered "not supported" to
        self.blind_note: str | None = None  # the one warning: what is blind and why

    def sample(self) -> list[CardHealth]:
        return self._nvidia() + self._amd()

    def _queries(self) -> CardQueries | None:
        if not self._want_nvml:
            return None
        if not self._nvml_tried:
            self._nvml_tried = True
            self._nvml, why = load_pynvml()
            if self._nvml is None and self._nvidia_present():
                self._blind(f"NVML unavailable ({why}): NVIDIA temperature, power, throttling, ECC, "
                            "remapped rows and PCIe link are not watched")
            elif self._nvml is None:  # no NVIDIA card here: nothing is blind (a CPU or AMD host)
                log.info("no NVML (%s) and no NVIDIA PCI device: NVIDIA health not read", why)
        return self._nvml

    def _nvidia_present(self) -> bool:
        """An NVIDIA PCI device (vendor 0x10de) on the host, whatever the driver says."""
        try:
            devices = list((self.host_root / "sys/bus/pci/devices").iterdir())
        except OSError:
            return True  # cannot tell: say what is blind rather than stay silent
        return any(_read(d / "vendor").strip().lower() == "0x10de" for d in devices)

    def _blind(self, note: str) -> None:
        if self.blind_note is None:
            self.blind_note = note
            log.warning("%s", note)

    def _nvidia(self) -> list[CardHealth]:
        queries = self._queries()
        if queries is None:
            return []
        try:
            count = queries.count()
        except Exception as exc:  # noqa: BLE001 - the driver went away: blind, the watch goes on
            self._blind(f"NVML device count failed ({exc}): NVIDIA card health is not watched")
            return []
        out: list[CardHealth] = []
        for i in range(count):
            card = card_from_queries(i, queries, skip=self._unsupported.get(i, ()))
            # A query the card does not support is not asked again (a failing NVML call costs more
            # than one that answers); one that failed otherwise is asked again next time.
            self._unsupported.setdefault(i, set()).update(card.unsupported)
            out.append(card)
        return out

    def _amd(self) -> list[CardHealth]:
        drm = self.host_root / "sys/class/drm"
        try:
            cards = sorted((int(m.group(1)), p) for p in drm.iterdir() if (m := _CARD.match(p.name)))
        except OSError:
            return []
        out: list[CardHealth] = []
        for index, card in cards:
            device = card / "device"
            vendor = GPU_VENDORS.get(_read(device / "vendor").strip().lower(), "")
            if vendor not in ("amd", "hygon"):
                continue
            out.append(parse_amdgpu_health(index, vendor, amd_files(device), pci=_pci_of(device)))
        return out


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _pci_of(device: Path) -> str | None:
    """The card's PCI address: the `device` link's target ("…/0000:28:00.0"), or PCI_SLOT_NAME in uevent."""
    try:
        key = pci_key(device.resolve().name)
    except OSError:
        key = None
    if key is not None:
        return key
    m = re.search(r"^PCI_SLOT_NAME=(\S+)", _read(device / "uevent"), re.MULTILINE)
    return pci_key(m.group(1)) if m else None


def amd_files(device: Path) -> dict[str, str]:
    files: dict[str, str] = {}
    for name in _AMD_FILES:
        if (text := _read(device / name)):
            files[name] = text
    try:
        hwmons = sorted((device / "hwmon").iterdir())
    except OSError:
        hwmons = []
    for hw in hwmons[:1]:
        for name in _HWMON_FILES:
            if (text := _read(hw / name)):
                files[f"hwmon/{hw.name}/{name}"] = text
    try:
        ras = sorted(p for p in (device / "ras").iterdir() if p.name.endswith("_err_count"))
    except OSError:
        ras = []
    for p in ras:
        if (text := _read(p)):
            files[f"ras/{p.name}"] = text
    return files


def cards_by_pci(cards: list[CardHealth]) -> dict[str, int]:
    """PCI address → card index, for attributing kernel events (both vendors)."""
    return {c.pci: c.index for c in cards if c.pci}
