"""Host samples and per-launch low-water marks (effectful sampling; the marks are plain folds).

DOMAIN §3 "what to watch": min `MemAvailable` over the run (recipe C met its bar at 2.35 GiB), swap
peak (5.40 GiB), PSI, per-process `RssAnon`. The peak phase is the warm-up after KV allocation and
peak − steady is only 4–1469 MiB, so the minimum must be sampled often through start-up, not
inferred from steady state. `Watermarks` keeps the extremes per launch and per engine phase, and
the set of engine pids ever seen (OOM attribution needs the pids of processes that are already
dead when the kernel's kill line arrives).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict

from appliance.procfs import MemInfo, Pressure, ProcessMemory, SwapArea
from controller.watch.procreader import ProcReader


class HostSample(BaseModel):
    model_config = ConfigDict(frozen=True)

    at: float  # the sampler's clock (monotonic seconds unless injected otherwise)
    meminfo: MemInfo
    swaps: tuple[SwapArea, ...]
    pressure: Pressure | None
    swappiness: int | None
    processes: tuple[ProcessMemory, ...] = ()  # the engine's process tree

    @property
    def mem_available_bytes(self) -> int:
        return self.meminfo.available_bytes

    @property
    def swap_total_bytes(self) -> int:
        # /proc/swaps is the authority on areas; meminfo's SwapTotal is the same sum.
        return sum(a.size_bytes for a in self.swaps) if self.swaps else self.meminfo.swap_total_bytes

    @property
    def swap_used_bytes(self) -> int:
        return self.meminfo.swap_used_bytes

    @property
    def engine_anon_bytes(self) -> int:
        return sum(p.anon_bytes for p in self.processes)


class HostSampler:
    """One call, one consistent-enough snapshot (the files are read back to back)."""

    def __init__(self, reader: ProcReader | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.reader = reader or ProcReader()
        self.clock = clock

    def sample(self, engine_roots: Iterable[int] = ()) -> HostSample:
        r = self.reader
        meminfo = r.meminfo()
        pids = r.process_tree(engine_roots)
        procs = tuple(m for m in (r.process_memory(pid) for pid in sorted(pids)) if m is not None)
        return HostSample(
            at=self.clock(),
            meminfo=meminfo,
            swaps=tuple(r.swaps()),
            pressure=r.pressure(),
            swappiness=r.swappiness(),
            processes=procs,
        )


class WatermarkSummary(BaseModel):
    """What goes into the launch record (bytes; ratios 0..1)."""

    model_config = ConfigDict(frozen=True)

    samples: int
    mem_available_min_bytes: int | None
    mem_available_min_at: float | None
    mem_available_min_by_phase: dict[str, int]
    swap_used_peak_bytes: int
    swap_total_bytes: int
    pressure_some_avg10_peak: float
    pressure_full_avg10_peak: float
    engine_anon_peak_bytes: int
    process_anon_peak_bytes: dict[str, int]  # "comm[pid]" → peak RssAnon
    swappiness: int | None


@dataclass
class Watermarks:
    """Low-water and high-water marks of one launch. Feed it every sample taken while it runs."""

    launch_id: str
    samples: int = 0
    mem_available_min_bytes: int | None = None
    mem_available_min_at: float | None = None
    mem_available_min_by_phase: dict[str, int] = field(default_factory=dict)
    swap_used_peak_bytes: int = 0
    swap_total_bytes: int = 0
    pressure_some_avg10_peak: float = 0.0
    pressure_full_avg10_peak: float = 0.0
    engine_anon_peak_bytes: int = 0
    process_anon_peak_bytes: dict[str, int] = field(default_factory=dict)
    pids_seen: set[int] = field(default_factory=set)
    swappiness: int | None = None

    def update(self, sample: HostSample, phase: str | None = None) -> None:
        self.samples += 1
        avail = sample.mem_available_bytes
        if self.mem_available_min_bytes is None or avail < self.mem_available_min_bytes:
            self.mem_available_min_bytes = avail
            self.mem_available_min_at = sample.at
        if phase is not None:
            prev = self.mem_available_min_by_phase.get(phase)
            self.mem_available_min_by_phase[phase] = avail if prev is None else min(prev, avail)
        self.swap_used_peak_bytes = max(self.swap_used_peak_bytes, sample.swap_used_bytes)
        self.swap_total_bytes = sample.swap_total_bytes
        if sample.pressure is not None:
            self.pressure_some_avg10_peak = max(self.pressure_some_avg10_peak, sample.pressure.some.avg10)
            if sample.pressure.full is not None:
                self.pressure_full_avg10_peak = max(self.pressure_full_avg10_peak, sample.pressure.full.avg10)
        self.engine_anon_peak_bytes = max(self.engine_anon_peak_bytes, sample.engine_anon_bytes)
        for proc in sample.processes:
            key = f"{proc.comm or '?'}[{proc.pid}]"
            self.process_anon_peak_bytes[key] = max(self.process_anon_peak_bytes.get(key, 0), proc.anon_bytes)
            self.pids_seen.add(proc.pid)
        self.swappiness = sample.swappiness

    def summary(self) -> WatermarkSummary:
        return WatermarkSummary(
            samples=self.samples,
            mem_available_min_bytes=self.mem_available_min_bytes,
            mem_available_min_at=self.mem_available_min_at,
            mem_available_min_by_phase=dict(self.mem_available_min_by_phase),
            swap_used_peak_bytes=self.swap_used_peak_bytes,
            swap_total_bytes=self.swap_total_bytes,
            pressure_some_avg10_peak=self.pressure_some_avg10_peak,
            pressure_full_avg10_peak=self.pressure_full_avg10_peak,
            engine_anon_peak_bytes=self.engine_anon_peak_bytes,
            process_anon_peak_bytes=dict(self.process_anon_peak_bytes),
            swappiness=self.swappiness,
        )


async def run_sampler(
    sampler: HostSampler,
    on_sample: Callable[[HostSample], None],
    *,
    engine_roots: Callable[[], Iterable[int]] = lambda: (),
    interval_s: float = 1.0,
    stop: asyncio.Event,
) -> None:
    """Sample every `interval_s` until `stop` is set. Reading many large workers' smaps_rollup
    takes milliseconds each (the kernel walks every VMA), so it runs in a worker thread."""
    while not stop.is_set():
        roots = list(engine_roots())
        sample = await asyncio.to_thread(sampler.sample, roots)
        on_sample(sample)
        try:
            await asyncio.wait_for(stop.wait(), timeout=interval_s)
        except TimeoutError:
            continue
