"""Host samples and per-launch low-water marks (effectful sampling; the marks are plain folds).

DOMAIN §3 "what to watch": min `MemAvailable` over the run (recipe C met its bar at 2.35 GiB), swap
peak (5.40 GiB), PSI, per-process `RssAnon`. The peak phase is the warm-up after KV allocation and
peak − steady is only 4–1469 MiB, so the minimum must be sampled often through start-up, not
inferred from steady state. `Watermarks` keeps the extremes per launch and per engine phase, and
the set of engine pids ever seen (OOM attribution needs the pids of processes that are already
dead when the kernel's kill line arrives).

Cheap sources (meminfo, PSI, swaps, swappiness) are read on every sample; the engine's process tree
and per-process smaps_rollup only when `controller.watch.sample_policy` says they can change an
answer (reading them every second cost the idle controller 7.9% of a core). In between, a
sample carries the last per-process read and says when it was made (`processes_at`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict

from appliance.observe.procfs import MemInfo, Pressure, ProcessMemory, SwapArea
from controller.watch.procreader import ProcReader
from controller.watch.sample_policy import ALWAYS, FullReason, ProcessSampleSchedule, SamplingPolicy


class HostSample(BaseModel):
    model_config = ConfigDict(frozen=True)

    at: float  # the sampler's clock (monotonic seconds unless injected otherwise)
    meminfo: MemInfo
    swaps: tuple[SwapArea, ...]
    pressure: Pressure | None
    swappiness: int | None
    processes: tuple[ProcessMemory, ...] = ()  # the engine's process tree, as last read
    processes_at: float | None = None  # when `processes` was read (≤ at); None = never
    full_reason: FullReason | None = None  # why this sample read the processes; None = it reused them

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


EngineRoots = Iterable[int] | Callable[[], Iterable[int]]


class HostSampler:
    """One call, one consistent-enough snapshot (the files are read back to back).

    `policy` decides when the per-process sources are read (`sample_policy`); the default, `ALWAYS`,
    reads them on every call (what a one-off sample wants). The controller's watch passes the
    scheduled policy, the launch id and whether the engine is still starting.
    """

    def __init__(self, reader: ProcReader | None = None, clock: Callable[[], float] = time.monotonic,
                 policy: SamplingPolicy = ALWAYS) -> None:
        self.reader = reader or ProcReader()
        self.clock = clock
        self.schedule = ProcessSampleSchedule(policy)
        self._processes: tuple[ProcessMemory, ...] = ()
        self._processes_at: float | None = None
        self._processes_launch: str | None = None

    def sample(self, engine_roots: EngineRoots = (), *, launch: str | None = None,
               starting: bool = True) -> HostSample:
        """`engine_roots` may be a callable: finding the engine's pids is itself a scan of the
        process table (psutil children / docker), so it runs only when the processes are read."""
        r = self.reader
        now = self.clock()
        meminfo = r.meminfo()
        reason = self.schedule.due(now, meminfo.available_bytes, launch, starting)
        if reason is not None:
            roots = engine_roots() if callable(engine_roots) else engine_roots
            pids = r.process_tree(roots)
            read = (r.process_memory(pid) for pid in sorted(pids))
            self._processes = tuple(m for m in read if m is not None)
            self._processes_at, self._processes_launch = now, launch
            self.schedule.done(now, meminfo.available_bytes, launch)
        elif launch != self._processes_launch:
            self._processes, self._processes_at, self._processes_launch = (), None, launch
        return HostSample(
            at=now,
            meminfo=meminfo,
            swaps=tuple(r.swaps()),
            pressure=r.pressure(),
            swappiness=r.swappiness(),
            processes=self._processes,
            processes_at=self._processes_at,
            full_reason=reason,
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
    launch: Callable[[], tuple[str | None, bool]] = lambda: (None, False),
    interval_s: float = 1.0,
    stop: asyncio.Event,
) -> None:
    """Sample every `interval_s` until `stop` is set. `launch()` → (launch id, still starting) feeds
    the sampler's policy; `engine_roots` is called only when the processes are read. Reading many
    large workers' smaps_rollup takes milliseconds each (the kernel walks every VMA), so sampling
    runs in a worker thread."""
    while not stop.is_set():
        launch_id, starting = launch()
        sample = await asyncio.to_thread(sampler.sample, engine_roots, launch=launch_id, starting=starting)
        on_sample(sample)
        try:
            await asyncio.wait_for(stop.wait(), timeout=interval_s)
        except TimeoutError:
            continue
