"""The host watch's share for the engines started beside the primary (engine_set.py): per launch, the
host-wide MemAvailable low-water mark and swap peak over that launch's own run, its own processes'
RssAnon peaks, and the pids OOM attribution needs (the victim is dead when the kernel's record arrives,
so its pids must have been read before).

MemAvailable, swap and PSI are host-wide: every launch running at a sample is marked with that sample
(a low-water mark during two launches' runs is on both records, as the host ran both). The engine's own
processes are read under the same policy as the primary's (controller/watch/sample_policy.py), one
schedule per launch: every second while it starts, then when MemAvailable moves or on the slow cadence,
so an idle engine beside the primary costs no process-table scan per second.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from appliance.observe.procfs import ProcessMemory
from controller.watch.procreader import ProcReader
from controller.watch.sample_policy import ProcessSampleSchedule, SamplingPolicy
from controller.watch.sampler import HostSample, Watermarks


@dataclass(frozen=True)
class BesideEngine:
    """One engine beside the primary, as the watch saw it at a sample."""

    launch_id: str
    recipe: str
    container: str | None  # docker runtime: OOM attribution's strongest evidence
    starting: bool  # not READY yet: its processes are read every sample (DOMAIN §3: the peak is in start-up)
    phase: str | None
    roots: Callable[[], list[int]]  # its engine pids (a runtime call, blocking); [] when unavailable


@dataclass
class BesideRun:
    """What the watch keeps of one launch beside the primary while it runs."""

    engine: BesideEngine
    marks: Watermarks
    processes: tuple[ProcessMemory, ...] = ()  # its process tree as last read
    pids: frozenset[int] = field(default_factory=frozenset)  # every engine pid seen in its run


class BesideWatch:
    """The runs of the engines beside the primary: `read` (in a worker thread), then `observe` (on the
    event loop, where the marks are also read: `process_peaks`), once per host sample."""

    def __init__(self) -> None:
        self.runs: dict[str, BesideRun] = {}
        self._schedules: dict[str, ProcessSampleSchedule] = {}

    def read(self, sample: HostSample, engines: Sequence[BesideEngine], reader: ProcReader,
             policy: SamplingPolicy) -> dict[str, tuple[ProcessMemory, ...]]:
        """Blocking (process-table scan, smaps_rollup): the processes of each engine whose schedule
        says they are due, by launch id; the others keep their last read."""
        fresh: dict[str, tuple[ProcessMemory, ...]] = {}
        avail = sample.mem_available_bytes
        for engine in engines:
            schedule = self._schedules.setdefault(engine.launch_id, ProcessSampleSchedule(policy))
            if schedule.due(sample.at, avail, engine.launch_id, engine.starting) is None:
                continue
            tree = reader.process_tree(engine.roots())
            read = (reader.process_memory(pid) for pid in sorted(tree))
            fresh[engine.launch_id] = tuple(m for m in read if m is not None)
            schedule.done(sample.at, avail, engine.launch_id)
        return fresh

    def observe(self, sample: HostSample, engines: Sequence[BesideEngine],
                fresh: dict[str, tuple[ProcessMemory, ...]]) -> list[BesideRun]:
        """Mark every running engine's launch with `sample` and its own processes. Returns the runs
        that ended (no longer among `engines`), for their last write."""
        live: dict[str, BesideRun] = {}
        for engine in engines:
            run = self.runs.get(engine.launch_id) or BesideRun(engine, Watermarks(engine.launch_id))
            run.engine = engine
            run.processes = fresh.get(engine.launch_id, run.processes)
            # The host figures are the sample's; the processes are this engine's, as last read.
            run.marks.update(sample.model_copy(update={"processes": run.processes}), engine.phase)
            run.pids = frozenset(run.marks.pids_seen | {p.pid for p in run.processes})
            live[engine.launch_id] = run
        ended = [run for launch_id, run in self.runs.items() if launch_id not in live]
        self.runs = live
        self._schedules = {k: v for k, v in self._schedules.items() if k in live}
        return ended
