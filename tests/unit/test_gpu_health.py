"""Card health (appliance/observe/gpu_health.py, controller/watch/gpu_health.py): the real H200
recording replayed through the NVML seam, faults injected on top, amdgpu fake sysfs trees."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from appliance.observe.gpu_events import parse_gpu_line
from appliance.observe.gpu_health import (
    NVML_QUERIES,
    CardHealth,
    ReplayQueries,
    assess,
    card_from_queries,
    pcie_gen,
    ras_counts,
    recording_from_raw,
    throttle_names,
    verdict_of,
)
from controller.watch.gpu_health import HealthReader, cards_by_pci

H200 = Path(__file__).parents[1] / "fixtures" / "gpu_health" / "h200-2026-12-01" / "nvml-raw.json"


def h200_recording() -> dict[str, Any]:
    raw = json.loads(H200.read_text())
    return {"samples": [{"cards": [recording_from_raw(c) for c in s["cards"]]} for s in raw["samples"]]}


def h200(inject: dict[str, Any] | None = None) -> CardHealth:
    return card_from_queries(0, ReplayQueries(h200_recording(), {0: inject or {}}))


def test_the_recorded_h200_is_healthy() -> None:
    card = h200()
    assert card.name == "NVIDIA H200" and card.pci == "0000:00:06"
    assert card.temperature_slowdown_c == 89 and card.temperature_shutdown_c == 95  # MEASURED.md
    assert card.power_limit_w == 700
    assert card.throttle_reasons == ("gpu_idle",) and card.slowing == ()
    assert (card.pcie_gen, card.pcie_gen_max, card.pcie_width, card.pcie_width_max) == (5, 5, 16, 16)
    assert card.remap_pending is False and card.ecc_aggregate_uncorrected == 0
    # Retired pages are not supported on this generation (row remapping replaces them): blind, not healthy.
    assert set(card.blind) == set(card.unsupported) == {"retired_pages", "retired_pages_pending"}
    assert assess(card) == []


def test_every_recorded_sample_replays() -> None:
    rec = h200_recording()
    for i in range(len(rec["samples"])):
        card = card_from_queries(0, ReplayQueries(rec, sample=i))
        assert card.temperature_c is not None
        assert set(card.blind) <= {"retired_pages", "retired_pages_pending"}


@pytest.mark.parametrize(("inject", "check", "verdict"), [
    ({"throttle_reasons": 0x40 | 0x20}, "throttling", "warn"),
    ({"temperature_c": 86}, "hot", "warn"),
    ({"temperature_c": 95}, "overheat", "refuse"),
    ({"ecc_volatile_uncorrected": 2}, "ecc-uncorrectable", "warn"),
    ({"remapped_rows": [0, 1, 1, 0]}, "remap-pending", "warn"),
    ({"remapped_rows": [0, 1, 0, 1]}, "remap-failure", "refuse"),
    ({"pcie_width": 8}, "pcie-link", "warn"),
    ({"pcie_gen": 3, "utilization_percent": 80}, "pcie-link", "warn"),
])
def test_injected_faults(inject: dict[str, Any], check: str, verdict: str) -> None:
    findings = assess(h200(inject))
    assert [(f.check, f.verdict) for f in findings] == [(check, verdict)]
    assert findings[0].message.startswith("GPU 0: ")


def test_an_idle_card_at_a_lower_link_gen_is_not_a_warning() -> None:
    # NVIDIA and AMD drop the link generation at idle to save power.
    assert assess(h200({"pcie_gen": 1, "utilization_percent": 0})) == []


def test_a_lost_card_and_a_fatal_event_refuse() -> None:
    lost = h200({q: {"error": "NVMLError_GpuIsLost: GPU is lost"} for q in NVML_QUERIES})
    assert lost.lost and verdict_of(assess(lost)) == "refuse"
    event = parse_gpu_line("NVRM: Xid (PCI:0000:00:06): 95, pid=7, name=python3, Uncontained ECC error")
    assert event is not None
    findings = assess(h200(), [event])
    assert [f.check for f in findings] == ["fatal-event"] and "Xid 95" in findings[0].message


def test_throttle_bits() -> None:
    assert throttle_names(0x1 | 0x4) == ("gpu_idle", "sw_power_cap")
    assert throttle_names(0x1000) == ("unknown_0x1000",)


def test_nvml_missing_is_one_warning_and_the_watch_goes_on(caplog: pytest.LogCaptureFixture,
                                                            tmp_path: Path) -> None:
    class Broken:
        def count(self) -> int:
            raise RuntimeError("NVMLError_DriverNotLoaded: Driver Not Loaded")

        def query(self, index: int, name: str) -> Any:
            raise AssertionError("not reached")

    reader = HealthReader(tmp_path, nvml=Broken())
    with caplog.at_level(logging.WARNING):
        assert reader.sample() == [] and reader.sample() == []
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "not watched" in warnings[0].getMessage()
    assert reader.blind_note is not None


def test_unsupported_queries_are_not_asked_again(tmp_path: Path) -> None:
    asked: list[str] = []

    class Counting(ReplayQueries):
        def query(self, index: int, name: str) -> Any:
            asked.append(name)
            return super().query(index, name)

    reader = HealthReader(tmp_path, nvml=Counting(h200_recording()))
    reader.sample()
    first = len(asked)
    reader.sample()
    assert "retired_pages" not in asked[first:] and len(asked) - first == len(NVML_QUERIES) - 2


# --- AMD / Hygon fake sysfs -----------------------------------------------------------------------


def _card(root: Path, n: int, *, vendor: str = "0x1d94", slot: str = "0000:43:00.0", temp: int = 45000,
          ue: int = 0, width: int = 16) -> None:
    dev = root / f"sys/class/drm/card{n}/device"
    (dev / "hwmon/hwmon3").mkdir(parents=True)
    (dev / "ras").mkdir()
    files = {
        "vendor": vendor, "uevent": f"DRIVER=amdgpu\nPCI_SLOT_NAME={slot}\n",
        "current_link_speed": "16.0 GT/s PCIe", "max_link_speed": "16.0 GT/s PCIe",
        "current_link_width": str(width), "max_link_width": "16", "gpu_busy_percent": "0",
        "hwmon/hwmon3/temp1_input": str(temp), "hwmon/hwmon3/temp1_crit": "100000",
        "hwmon/hwmon3/temp1_emergency": "105000", "hwmon/hwmon3/power1_average": "35000000",
        "hwmon/hwmon3/power1_cap": "300000000",
        "ras/umc_err_count": f"ue: {ue}\nce: 3\n", "ras/gfx_err_count": "ue: 0\nce: 1\n",
    }
    for name, text in files.items():
        (dev / name).write_text(text + "\n")


def test_amdgpu_sysfs_tree(tmp_path: Path) -> None:
    _card(tmp_path, 0)
    _card(tmp_path, 1, slot="0000:44:00.0", temp=101000, ue=2, width=8)
    (tmp_path / "sys/class/drm/card1-DP-1").mkdir()  # a connector, not a card
    cards = HealthReader(tmp_path, use_nvml=False).sample()
    assert [(c.index, c.vendor, c.pci) for c in cards] == [(0, "hygon", "0000:43:00"),
                                                           (1, "hygon", "0000:44:00")]
    ok, bad = cards
    assert (ok.temperature_c, ok.temperature_slowdown_c, ok.power_w, ok.power_limit_w) == (45, 100, 35, 300)
    assert (ok.ecc_aggregate_uncorrected, ok.ecc_aggregate_corrected) == (0, 4)
    assert (ok.pcie_gen, ok.pcie_width) == (4, 16)
    assert assess(ok) == [] and ok.blind == ()
    assert {f.check for f in assess(bad)} == {"hot", "ecc-uncorrectable", "pcie-link"}
    assert cards_by_pci(cards) == {"0000:43:00": 0, "0000:44:00": 1}


def test_amdgpu_missing_files_are_blind(tmp_path: Path) -> None:
    dev = tmp_path / "sys/class/drm/card0/device"
    dev.mkdir(parents=True)
    (dev / "vendor").write_text("0x1002\n")
    (card,) = HealthReader(tmp_path, use_nvml=False).sample()
    assert card.vendor == "amd" and "temperature_c" in card.blind and assess(card) == []


def test_sysfs_helpers() -> None:
    assert pcie_gen("32.0 GT/s PCIe") == 5 and pcie_gen("8.0 GT/s") == 3 and pcie_gen("Unknown") is None
    assert ras_counts("ue: 1\nce: 7\n") == (1, 7) and ras_counts("garbage") == (None, None)


def test_the_recorders_output_replays_to_the_card_it_recorded() -> None:
    # scripts/gpu_h200/record_gpu_health.py asks the same seam the controller reads with; its JSON is
    # what ReplayQueries answers back (here it records the replayed H200, faults included).
    import importlib.util

    path = Path(__file__).parents[2] / "scripts" / "gpu_h200" / "record_gpu_health.py"
    spec = importlib.util.spec_from_file_location("record_gpu_health", path)
    assert spec is not None and spec.loader is not None
    recorder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recorder)
    source = ReplayQueries(h200_recording(), {0: {"remapped_rows": [0, 1, 1, 0]}})
    recording = json.loads(json.dumps(recorder.record(source, 2, 0.0, "580.159.04", sleep=lambda _: None)))
    assert recording["format"] == "appliance-gpu-health-recording/1" and len(recording["samples"]) == 2
    replayed = card_from_queries(0, ReplayQueries(recording, sample=1))
    assert replayed == card_from_queries(0, source)
    assert replayed.remap_pending and [f.check for f in assess(replayed)] == ["remap-pending"]


def test_no_nvml_on_a_host_without_nvidia_cards_is_not_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A CPU or AMD host: pynvml missing there blinds nothing.
    from controller.watch import gpu_health

    monkeypatch.setattr(gpu_health, "load_pynvml", lambda: (None, "ModuleNotFoundError: pynvml"))
    dev = tmp_path / "sys/bus/pci/devices/0000:43:00.0"
    dev.mkdir(parents=True)
    (dev / "vendor").write_text("0x1d94\n")
    reader = HealthReader(tmp_path, use_nvml=True)
    with caplog.at_level(logging.WARNING):
        reader.sample()
    assert reader.blind_note is None and not [r for r in caplog.records if r.levelno >= logging.WARNING]
    (tmp_path / "sys/bus/pci/devices/0000:3b:00.0").mkdir()
    (tmp_path / "sys/bus/pci/devices/0000:3b:00.0/vendor").write_text("0x10de\n")
    nvidia_host = HealthReader(tmp_path, use_nvml=True)
    nvidia_host.sample()
    assert nvidia_host.blind_note == (
        "NVML unavailable (ModuleNotFoundError: pynvml): NVIDIA temperature, power, throttling, ECC, "
        "remapped rows and PCIe link are not watched")


def test_a_busy_card_at_its_power_cap_is_not_throttling() -> None:
    assert assess(h200({"throttle_reasons": 0x4, "utilization_percent": 95})) == []
    assert [f.check for f in assess(h200({"throttle_reasons": 0x4}))] == ["throttling"]  # idle at the cap
    assert [f.check for f in assess(h200({"throttle_reasons": 0x4 | 0x40, "utilization_percent": 95}))] == [
        "throttling"]


def test_an_amd_card_s_pci_address_comes_from_its_device_link(tmp_path: Path) -> None:
    # sysfs: card0/device is a link to the PCI device's directory, named by its address; no uevent.
    pci_dir = tmp_path / "sys/devices/pci0000:00/0000:28:00.0"
    pci_dir.mkdir(parents=True)
    (pci_dir / "vendor").write_text("0x1002\n")
    drm = tmp_path / "sys/class/drm/card0"
    drm.mkdir(parents=True)
    (drm / "device").symlink_to(pci_dir)
    (card,) = HealthReader(tmp_path, use_nvml=False).sample()
    assert (card.vendor, card.pci) == ("amd", "0000:28:00")


def test_a_host_whose_pci_devices_cannot_be_listed_says_nvml_is_blind(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # No sys/bus/pci/devices to read: an NVIDIA card cannot be ruled out, so NVML missing is said.
    from controller.watch import gpu_health

    monkeypatch.setattr(gpu_health, "load_pynvml", lambda: (None, "NVMLError_LibraryNotFound: x"))
    reader = HealthReader(tmp_path, use_nvml=True)
    with caplog.at_level(logging.WARNING):
        assert reader.sample() == []
    assert reader.blind_note is not None and "NVMLError_LibraryNotFound: x" in reader.blind_note
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == [reader.blind_note]


def test_amd_files_are_the_files_there_and_no_others(tmp_path: Path) -> None:
    from controller.watch.gpu_health import amd_files

    dev = tmp_path / "device"
    (dev / "hwmon/hwmon2").mkdir(parents=True)
    (dev / "vendor").write_text("0x1002\n")
    (dev / "hwmon/hwmon2/temp1_input").write_text("45000\n")
    assert amd_files(dev) == {"vendor": "0x1002\n", "hwmon/hwmon2/temp1_input": "45000\n"}


# -- written from mutmut's survivors (docs/mutation-testing.md, fourth round) ------------------


class _Loader:
    """``load_pynvml`` at its seam: counts its calls, answers ``result``."""

    def __init__(self, result: tuple[Any, str | None]) -> None:
        self.result = result
        self.calls = 0

    def __call__(self) -> tuple[Any, str | None]:
        self.calls += 1
        return self.result


def test_nvml_is_wanted_by_default_only_on_the_real_host_and_loaded_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from controller.watch import gpu_health

    queries = object()
    loader = _Loader((queries, None))
    monkeypatch.setattr(gpu_health, "load_pynvml", loader)
    assert HealthReader(tmp_path)._queries() is None  # a host tree (fixture, recording): not this host's NVML
    assert loader.calls == 0
    reader = HealthReader(Path("/"))
    assert reader._queries() is queries and reader._queries() is queries
    assert loader.calls == 1  # loaded once, then kept


def test_no_nvml_and_no_nvidia_card_is_said_at_info(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from controller.watch import gpu_health

    monkeypatch.setattr(gpu_health, "load_pynvml", _Loader((None, "ModuleNotFoundError: pynvml")))
    (tmp_path / "sys/bus/pci/devices").mkdir(parents=True)
    with caplog.at_level(logging.INFO, logger=gpu_health.log.name):
        HealthReader(tmp_path, use_nvml=True).sample()
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.INFO,
         "no NVML (ModuleNotFoundError: pynvml) and no NVIDIA PCI device: NVIDIA health not read")]
    caplog.clear()
    monkeypatch.setattr(gpu_health, "load_pynvml", _Loader((_NoCards(), None)))
    with caplog.at_level(logging.INFO, logger=gpu_health.log.name):  # NVML loaded: nothing to say
        HealthReader(tmp_path, use_nvml=True).sample()
    assert caplog.records == []


class _NoCards:
    def count(self) -> int:
        return 0

    def query(self, index: int, name: str) -> Any:
        raise AssertionError("no card to ask")


def test_a_card_of_another_vendor_before_an_amd_card_is_skipped(tmp_path: Path) -> None:
    nvidia = tmp_path / "sys/class/drm/card0/device"
    nvidia.mkdir(parents=True)
    (nvidia / "vendor").write_text("0x10de\n")  # read through NVML, not sysfs
    _card(tmp_path, 1)
    cards = HealthReader(tmp_path, use_nvml=False).sample()
    assert [(c.index, c.vendor) for c in cards] == [(1, "hygon")]
