"""The pynvml adapter (controller/watch/gpu_health.py: `PynvmlQueries`, `load_pynvml`) against a fake
`pynvml` module put at the import seam (`sys.modules`).

The fake answers each NVML call by its arguments — a distinct number per constant, per ECC kind and
counter, per retirement cause — so a query wired to the wrong call, the wrong constant or the wrong
unit gives a different answer than the one asserted. The constants are NVML's own values
(nvml.h), which pynvml re-exports."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import pytest

from appliance.observe.gpu_health import NVML_QUERIES
from controller.watch.gpu_health import HealthReader, PynvmlQueries, load_pynvml


class _Pci:
    def __init__(self, bus: Any) -> None:
        self.busId = bus


class _Util:
    gpu = 37


class FakeNvmlError(Exception):
    pass


def fake_pynvml(*, event_reasons: bool = True, name: Any = b"NVIDIA H200") -> types.ModuleType:
    """A pynvml with two cards; `calls` records every call with its arguments."""
    m = types.ModuleType("pynvml")
    calls: list[tuple[Any, ...]] = []
    m.calls = calls  # type: ignore[attr-defined]
    # nvml.h's values (pynvml re-exports them under these names).
    consts = {
        "NVML_TEMPERATURE_GPU": 0,
        "NVML_TEMPERATURE_THRESHOLD_SHUTDOWN": 0,
        "NVML_TEMPERATURE_THRESHOLD_SLOWDOWN": 1,
        "NVML_MEMORY_ERROR_TYPE_CORRECTED": 0,
        "NVML_MEMORY_ERROR_TYPE_UNCORRECTED": 1,
        "NVML_VOLATILE_ECC": 0,
        "NVML_AGGREGATE_ECC": 1,
        "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS": 0,
        "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR": 1,
    }
    for k, v in consts.items():
        setattr(m, k, v)

    def rec(fn: str, *args: Any) -> None:
        calls.append((fn, *args))

    def handle(i: int) -> tuple[str, int]:
        rec("handle", i)
        return ("h", i)

    def temp(h: Any, sensor: int) -> int:
        rec("temp", h, sensor)
        return {0: 41}[sensor]  # only the GPU sensor exists

    def threshold(h: Any, which: int) -> int:
        return {1: 87, 0: 92}[which]  # slowdown, shutdown

    def ecc(h: Any, kind: int, counter: int) -> int:
        return {(0, 0): 3, (1, 0): 1, (0, 1): 30, (1, 1): 10}[(kind, counter)]

    def retired(h: Any, cause: int) -> list[int]:
        return {0: [0xA, 0xB], 1: [0xC, 0xD, 0xE]}[cause]  # 2 SBE pages, 3 DBE pages

    m.nvmlInit = lambda: rec("init")  # type: ignore[attr-defined]
    m.nvmlDeviceGetCount = lambda: 2  # type: ignore[attr-defined]
    m.nvmlDeviceGetHandleByIndex = handle  # type: ignore[attr-defined]
    m.nvmlDeviceGetName = lambda h: name  # type: ignore[attr-defined]
    m.nvmlDeviceGetPciInfo = lambda h: _Pci(b"00000000:3B:00.0")  # type: ignore[attr-defined]
    m.nvmlDeviceGetTemperature = temp  # type: ignore[attr-defined]
    m.nvmlDeviceGetTemperatureThreshold = threshold  # type: ignore[attr-defined]
    m.nvmlDeviceGetPowerUsage = lambda h: 312_500  # type: ignore[attr-defined]  # mW
    m.nvmlDeviceGetEnforcedPowerLimit = lambda h: 700_000  # type: ignore[attr-defined]  # mW
    if event_reasons:  # the newer name (driver 535+); older pynvml has only the throttle one
        m.nvmlDeviceGetCurrentClocksEventReasons = lambda h: 0x4  # type: ignore[attr-defined]
    m.nvmlDeviceGetCurrentClocksThrottleReasons = lambda h: 0x40  # type: ignore[attr-defined]
    m.nvmlDeviceGetTotalEccErrors = ecc  # type: ignore[attr-defined]
    m.nvmlDeviceGetRetiredPages = retired  # type: ignore[attr-defined]
    m.nvmlDeviceGetRetiredPagesPendingStatus = lambda h: 1  # type: ignore[attr-defined]
    m.nvmlDeviceGetRemappedRows = lambda h: (2, 1, 0, 0)  # type: ignore[attr-defined]
    m.nvmlDeviceGetCurrPcieLinkGeneration = lambda h: 4  # type: ignore[attr-defined]
    m.nvmlDeviceGetMaxPcieLinkGeneration = lambda h: 5  # type: ignore[attr-defined]
    m.nvmlDeviceGetCurrPcieLinkWidth = lambda h: 8  # type: ignore[attr-defined]
    m.nvmlDeviceGetMaxPcieLinkWidth = lambda h: 16  # type: ignore[attr-defined]
    m.nvmlDeviceGetUtilizationRates = lambda h: _Util()  # type: ignore[attr-defined]
    # Like NVML, every per-card call needs a handle the library gave out (not None, not an index).
    for attr in dir(m):
        if attr.startswith("nvmlDevice") and attr not in ("nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex"):
            setattr(m, attr, _needs_handle(getattr(m, attr)))
    return m


def _needs_handle(call: Any) -> Any:
    def checked(h: Any, *args: Any) -> Any:
        if not (isinstance(h, tuple) and h[:1] == ("h",)):
            raise FakeNvmlError(f"Invalid Argument: {h!r} is not a device handle")
        return call(h, *args)

    return checked


EXPECTED: dict[str, Any] = {
    "name": "NVIDIA H200",
    "pci_bus_id": "00000000:3B:00.0",
    "temperature_c": 41,
    "temperature_slowdown_c": 87,
    "temperature_shutdown_c": 92,
    "power_w": 312.5,
    "power_limit_w": 700.0,
    "throttle_reasons": 0x4,
    "ecc_volatile_corrected": 3,
    "ecc_volatile_uncorrected": 1,
    "ecc_aggregate_corrected": 30,
    "ecc_aggregate_uncorrected": 10,
    "retired_pages": 5,
    "retired_pages_pending": True,
    "remapped_rows": [2, 1, 0, 0],
    "pcie_gen": 4,
    "pcie_gen_max": 5,
    "pcie_width": 8,
    "pcie_width_max": 16,
    "utilization_percent": 37,
}


def test_every_query_is_answered_by_its_own_nvml_call() -> None:
    assert set(EXPECTED) == set(NVML_QUERIES)
    queries = PynvmlQueries(fake_pynvml())
    assert queries.count() == 2
    answers = {name: queries.query(0, name) for name in NVML_QUERIES}
    assert answers == EXPECTED
    # The types the parser relies on: text as str, counters as int, a bool, a list of ints.
    assert type(answers["name"]) is str and type(answers["pci_bus_id"]) is str
    assert type(answers["retired_pages_pending"]) is bool and type(answers["throttle_reasons"]) is int
    assert all(type(v) is int for v in answers["remapped_rows"])


def test_older_pynvml_reads_throttling_by_its_old_name() -> None:
    queries = PynvmlQueries(fake_pynvml(event_reasons=False))
    assert queries.query(0, "throttle_reasons") == 0x40


def test_a_name_given_as_text_is_kept_as_it_is() -> None:
    assert PynvmlQueries(fake_pynvml(name="NVIDIA H100")).query(0, "name") == "NVIDIA H100"


def test_each_card_handle_is_taken_once_and_kept() -> None:
    nvml = fake_pynvml()
    queries = PynvmlQueries(nvml)
    for _ in range(2):
        queries.query(0, "temperature_c")
        queries.query(1, "temperature_c")
    calls: list[tuple[Any, ...]] = nvml.calls
    assert [c for c in calls if c[0] == "handle"] == [("handle", 0), ("handle", 1)]
    # Each card's query goes to that card's handle.
    assert [c[1] for c in calls if c[0] == "temp"] == [("h", 0), ("h", 1), ("h", 0), ("h", 1)]


def test_load_pynvml_initialises_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    queries, why = load_pynvml()
    assert why is None and isinstance(queries, PynvmlQueries) and queries.nvml is nvml
    assert nvml.calls == [("init",)]


def test_load_pynvml_says_why_it_cannot(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # nvidia-ml-py not installed
    queries, why = load_pynvml()
    assert queries is None and why is not None and why.startswith("ModuleNotFoundError: ")

    broken = fake_pynvml()

    def no_driver() -> None:
        raise FakeNvmlError("Driver Not Loaded")

    broken.nvmlInit = no_driver  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", broken)
    assert load_pynvml() == (None, "FakeNvmlError: Driver Not Loaded")


def test_the_reader_reads_every_card_through_pynvml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    reader = HealthReader(tmp_path, use_nvml=True)
    cards = reader.sample()
    assert [c.index for c in cards] == [0, 1] and reader.blind_note is None
    card = cards[0]
    assert (card.name, card.pci, card.temperature_c, card.power_w, card.power_limit_w) == (
        "NVIDIA H200", "0000:3b:00", 41.0, 312.5, 700.0)
    assert (card.ecc_volatile_uncorrected, card.ecc_aggregate_corrected, card.retired_pages) == (1, 30, 5)
    assert (card.remapped_rows_corrected, card.remapped_rows_uncorrected, card.retired_pages_pending) == (
        2, 1, True)
    assert card.blind == ()
