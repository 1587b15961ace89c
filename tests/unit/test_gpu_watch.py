"""GPU memory watch: amdgpu sysfs through the host root, NVML when present, peaks by
phase into the launch record, Prometheus gauges."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from appliance.observe.gpu_mem import GpuSample, PhasePeaks, parse_amdgpu
from controller.supervisor.gpu_memory_watch import GpuWatchLink
from controller.supervisor.signals import Apply
from controller.watch.gpu import GpuReader
from tests.unit.test_supervisor_driver import make_rig

GPUMEM = Path(__file__).resolve().parent.parent / "fixtures" / "hosts" / "gfx906-gpumem"
Z100_VRAM = 34342961152  # 31.98 GiB (DOMAIN §1)


def test_amdgpu_sysfs_is_read_through_the_host_root() -> None:
    samples = GpuReader(GPUMEM).sample()
    assert [s.index for s in samples] == [0, 1, 2, 3]  # card0-DP-1 is a connector, not a card
    assert all(s.vendor == "hygon" and s.total_bytes == Z100_VRAM for s in samples)
    assert samples[0].used_bytes == 31180000000 and samples[0].busy_percent == 90.0


def test_a_card_without_vram_files_is_no_sample_and_bad_numbers_are_dropped() -> None:
    assert parse_amdgpu(0, {"vendor": "0x1002"}) is None
    s = parse_amdgpu(1, {"mem_info_vram_total": "100\n", "mem_info_vram_used": "x",
                         "gpu_busy_percent": "250"})
    assert s is not None and s.total_bytes == 100 and s.used_bytes is None and s.busy_percent is None


def test_a_host_root_without_drm_gives_no_samples(tmp_path: Path) -> None:
    assert GpuReader(tmp_path).sample() == []


class _Mem:
    used, total = 47_000_000_000, 150_000_000_000


class _Util:
    gpu = 37


def _fake_pynvml() -> types.ModuleType:
    m = types.ModuleType("pynvml")
    m.nvmlInit = lambda: None  # type: ignore[attr-defined]
    m.nvmlDeviceGetCount = lambda: 1  # type: ignore[attr-defined]
    m.nvmlDeviceGetHandleByIndex = lambda i: ("h", i)  # type: ignore[attr-defined]
    m.nvmlDeviceGetMemoryInfo = lambda h: _Mem()  # type: ignore[attr-defined]
    m.nvmlDeviceGetUtilizationRates = lambda h: _Util()  # type: ignore[attr-defined]
    m.nvmlDeviceGetName = lambda h: "NVIDIA H200"  # type: ignore[attr-defined]
    return m


def test_nvml_samples_when_nvidia_ml_py_is_there(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml())
    [s] = GpuReader(tmp_path, nvml=True).sample()
    assert (s.vendor, s.name, s.used_bytes, s.total_bytes, s.busy_percent) == \
        ("nvidia", "NVIDIA H200", 47_000_000_000, 150_000_000_000, 37.0)


def test_no_nvml_module_means_no_nvidia_samples_not_an_error(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # nvidia-ml-py not installed
    reader = GpuReader(tmp_path, nvml=True)
    assert reader.sample() == [] and reader.sample() == []


def test_peaks_are_kept_per_phase_and_card() -> None:
    peaks = PhasePeaks()

    def s(used: int, busy: float) -> GpuSample:
        return GpuSample(index=0, vendor="nvidia", used_bytes=used, total_bytes=10, busy_percent=busy)

    assert peaks.update("kv_cache", [s(5, 10.0)])
    assert peaks.update("graph_capture", [s(7, 80.0)])
    assert not peaks.update("graph_capture", [s(6, 50.0)])  # nothing rose
    rec = peaks.record()
    assert rec["kv_cache"]["0"]["used_max_bytes"] == 5
    assert rec["graph_capture"]["0"] == {"used_max_bytes": 7, "total_bytes": 10, "busy_max_percent": 80.0}


async def test_the_launch_record_gets_gpu_peaks_by_phase_and_metrics_the_samples(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    link = GpuWatchLink(rig.store, GpuReader(GPUMEM), record_every_s=0.0)
    link.current_launch = lambda: rig.driver.machine.launch
    rig.driver.submit(Apply("test-recipe"))
    await rig.step(1)
    rig.runtime.current().log += "Capturing CUDA graphs (decode, FULL): 50%|##| 2/4 [00:01<00:01]\r"
    await rig.step(1)
    link.on_samples(link.reader.sample())
    rec = rig.store.get_launch("L1")
    assert rec is not None
    assert rec.gpu_peaks["graph_capture"]["3"]["used_max_bytes"] == 31150000000
    body = link.metrics.render()[0].decode()
    assert 'appliance_gpu_memory_total_bytes{gpu="0",vendor="hygon"} 3.4342961152e+10' in body
    assert 'appliance_gpu_utilization_ratio{gpu="3",vendor="hygon"} 0.93' in body
