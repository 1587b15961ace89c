"""The host watch, tied to the launch it is watching (the host readers, the launch records).

- Every second: one host sample (MemAvailable, swap, PSI; the engine's processes' RssAnon when
  `controller.watch.sample_policy` says it can have changed: start-up, MemAvailable moving, a slow
  cadence) → Prometheus, and the current launch's low-water / high-water marks → the launch record (DOMAIN §3
  "what to watch": min MemAvailable over the run, swap peak; recipe C met its bar at 2.35 GiB min
  and a 5.40 GiB swap peak).
- Every kernel OOM kill from `/dev/kmsg` → Prometheus, attributed to a launch (container id,
  cgroup, or the pids sampled before the kill: the victim is dead when the record arrives) → the
  launch record, and kept for the driver's exit diagnosis (a global OOM is not a cgroup OOM).

The primary engine is `engine`; the engines started beside it (engine_set.py) are `beside`: each of
their launches gets the same low-water / high-water marks in its record and the same OOM attribution
(beside_watch.py keeps their runs). The Prometheus watermark gauges (`appliance_launch_*`) stay the
primary's: this registry is the primary's, and each engine beside it records into its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from appliance.observe.kmsg import KmsgRecord, OomEvent, OomEventKind, SeqGap
from appliance.observe.oom_attribution import LaunchTarget, attribute_oom
from appliance.observe.rank_logs import anon_by_pid
from controller.metrics import ControllerMetrics
from controller.runtime.base import ContainerScoped, EngineHandle, EngineRuntimeError, Runtime
from controller.store import Store
from controller.supervisor.beside_watch import BesideEngine, BesideRun, BesideWatch
from controller.supervisor.machine import Launch, State
from controller.watch.history import HOST_HISTORY
from controller.watch.kmsg_follower import DevKmsg, KmsgFollower
from controller.watch.sample_policy import SamplingPolicy
from controller.watch.sampler import HostSample, HostSampler, Watermarks

log = logging.getLogger(__name__)

KEEP_ENDED_S = 120.0  # an OOM record for a launch that just ended still finds it


@dataclass(frozen=True)
class EngineView:
    """What the watch reads of the supervisor and tells it, as narrow callables — no reference to
    the Driver itself (the driver takes the watch's `oom_events`; `engine_view` in
    controller/service.py wires these to the driver)."""

    launch: Callable[[], Launch | None]  # the launch the supervisor is running, if any
    state: Callable[[], State]  # the supervisor's state (starting until READY)
    runtime: Callable[[str], Runtime | None]  # the runtime of a kind (EngineHandle.runtime)
    note: Callable[[str, str, str | None], None]  # an event (kind, message, launch id)


class HostWatchLink:
    def __init__(self, store: Store, sampler: HostSampler | None = None, record_every_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic,
                 metrics: ControllerMetrics | None = None) -> None:
        self.store = store
        self.metrics = metrics if metrics is not None else ControllerMetrics()
        self.sampler = sampler or HostSampler(policy=SamplingPolicy())
        self.record_every_s = record_every_s
        self.clock = clock
        self.engine: EngineView | None = None  # set once the driver exists (it takes our oom_events)
        # The engines started beside the primary, as of now (controller/service.py wires the engine set).
        self.beside: Callable[[], list[EngineView]] = lambda: []
        self._beside = BesideWatch()
        self._beside_last_record = 0.0
        self._marks: Watermarks | None = None
        self._last_record = 0.0
        self._targets: dict[str, tuple[LaunchTarget, float]] = {}  # launch id → (target, last seen)
        self._ooms: dict[str, list[OomEvent]] = {}
        # Every kernel record, for the GPU event watch (controller/supervisor/gpu_health_watch.py).
        self.on_record: Callable[[KmsgRecord], None] | None = None

    # -- for the driver

    def oom_events(self, launch_id: str) -> list[OomEvent]:
        return list(self._ooms.get(launch_id, ()))

    def pids_of(self, launch_id: str) -> frozenset[int]:
        """The engine's pids seen for a launch (still there for KEEP_ENDED_S after it ended)."""
        seen = self._targets.get(launch_id)
        return seen[0].pids if seen is not None else frozenset()

    # -- sampling

    def _current(self) -> tuple[str, str, list[int], str | None] | None:
        """(launch id, recipe, engine pids, container id) of the engine being watched (blocking:
        the pids are a process-table scan)."""
        watched = self._watched()
        if watched is None:
            return None
        launch_id, recipe, handle, container, _ = watched
        return launch_id, recipe, self._engine_pids(handle), container

    def _watched(self, view: EngineView | None = None
                 ) -> tuple[str, str, EngineHandle, str | None, bool] | None:
        """(launch id, recipe, handle, container id, still starting) of the primary's launch, or of
        `view`'s — without scanning processes."""
        engine = view if view is not None else self.engine
        launch = engine.launch() if engine else None
        if engine is None or launch is None or launch.handle is None:
            return None
        handle = launch.handle
        runtime = engine.runtime(handle.runtime)
        container = runtime.container_id(handle) if isinstance(runtime, ContainerScoped) else None
        starting = engine.state() is not State.READY
        return launch.launch_id, launch.spec.recipe, handle, container, starting

    def _engine_pids(self, handle: EngineHandle, view: EngineView | None = None) -> list[int]:
        engine = view if view is not None else self.engine
        runtime = engine.runtime(handle.runtime) if engine else None
        try:
            return runtime.engine_pids(handle) if runtime else []
        except (EngineRuntimeError, OSError) as exc:
            # A Docker daemon restarting cannot say the container's PID: the host is still sampled
            # (MemAvailable, swap, PSI), the engine's processes at the next read that works.
            log.info("engine pids of %s unavailable this sample: %s", handle.launch_id, exc)
            return []

    async def run_sampler(self, stop: asyncio.Event, interval_s: float = 1.0) -> None:
        while not stop.is_set():
            try:
                await self._sample_once()
            except Exception:  # one bad sample must not end the host watch (the OOM record's context)
                log.exception("host sample failed; the watch goes on")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=interval_s)

    async def _sample_once(self) -> None:
        watched = self._watched()
        if watched is None:
            sample = await asyncio.to_thread(self.sampler.sample, ())
            self.on_sample(sample, None)
        else:
            launch_id, recipe, handle, container, starting = watched
            # The engine's pids are looked up (a process-table scan) only when the sampler
            # reads the processes; in between, the pids of the last read stand.
            roots = functools.partial(self._engine_pids, handle)
            sample = await asyncio.to_thread(self.sampler.sample, roots, launch=launch_id,
                                             starting=starting)
            self.on_sample(sample, (launch_id, recipe, [p.pid for p in sample.processes], container))
        beside = self._beside_engines()
        if beside or self._beside.runs:
            fresh = await asyncio.to_thread(self._beside.read, sample, beside, self.sampler.reader,
                                            self.sampler.schedule.policy)
            self.on_beside(self._beside.observe(sample, beside, fresh))

    def _beside_engines(self) -> list[BesideEngine]:
        """The launches of the engines beside the primary that have a handle (without scanning)."""
        engines = []
        for view in self.beside():
            watched = self._watched(view)
            launch = view.launch()
            if watched is None or launch is None:
                continue
            launch_id, recipe, handle, container, starting = watched
            engines.append(BesideEngine(launch_id, recipe, container, starting, launch.phase,
                                        functools.partial(self._engine_pids, handle, view)))
        return engines

    def on_beside(self, ended: list[BesideRun]) -> None:
        """After BesideWatch.observe (`ended`: the runs that just left): their pids for OOM
        attribution, their marks into the records (every record_every_s, and once more as a launch
        leaves, so its low-water mark since the last write is not lost)."""
        now = self.clock()
        for run in self._beside.runs.values():
            self._targets[run.engine.launch_id] = (self._target(run.engine.launch_id, run.engine.recipe,
                                                                run.engine.container, run.pids), now)
        due = now - self._beside_last_record >= self.record_every_s
        for run in [*ended, *(self._beside.runs.values() if due else ())]:
            self._record(run.marks)
        if due:
            self._beside_last_record = now

    @staticmethod
    def _target(launch_id: str, recipe: str, container: str | None, pids: frozenset[int]) -> LaunchTarget:
        return LaunchTarget(launch_id=launch_id, recipe=recipe, container_id=container,
                            cgroup_paths=(f"/docker/{container}",) if container else (), pids=pids)

    def on_sample(self, sample: HostSample, current: tuple[str, str, list[int], str | None] | None) -> None:
        self.metrics.observe_host(sample)
        HOST_HISTORY.record(sample)  # the console's memory charts (controller/watch/history.py)
        if current is None:
            self._flush()
            self._marks = None
            return
        launch_id, recipe, pids, container = current
        if self._marks is None or self._marks.launch_id != launch_id:
            self._flush()
            self._marks = Watermarks(launch_id)
        launch = self.engine.launch() if self.engine else None
        phase = launch.phase if launch else None
        self._marks.update(sample, phase)
        self.metrics.observe_watermarks(recipe, self._marks)
        self._targets[launch_id] = (
            self._target(launch_id, recipe, container, frozenset(self._marks.pids_seen | set(pids))),
            self.clock(),
        )
        if self.clock() - self._last_record >= self.record_every_s:
            self._flush()

    def process_peaks(self, launch_id: str) -> dict[int, int]:
        """Peak RssAnon per engine pid of a launch being watched, the primary's or one beside it
        (empty for any other launch)."""
        beside = self._beside.runs.get(launch_id)
        marks = beside.marks if beside is not None else self._marks
        if marks is None or marks.launch_id != launch_id:
            return {}
        return anon_by_pid(marks.process_anon_peak_bytes)

    def _flush(self) -> None:
        marks = self._marks
        if marks is None or marks.samples == 0:
            return
        self._last_record = self.clock()
        self._record(marks)

    def _record(self, marks: Watermarks) -> None:
        if marks.samples:
            self.store.record_memory(marks.launch_id, marks.mem_available_min_bytes,
                                     marks.swap_used_peak_bytes)

    # -- kernel OOM kills

    def on_oom(self, event: OomEvent) -> None:
        self.metrics.record_oom_event(event)
        HOST_HISTORY.record_oom(event)  # OOM marks on the console's memory chart
        if event.kind is not OomEventKind.KILL:
            return
        now = self.clock()
        self._targets = {k: v for k, v in self._targets.items() if now - v[1] <= KEEP_ENDED_S}
        hit = attribute_oom(event, [target for target, _ in self._targets.values()])
        summary = (f"{event.scope.value} OOM kill: {event.task or '?'} (pid {event.pid}), "
                   f"anon-rss {event.anon_rss_bytes or 0} B")
        if hit is None:
            self._note("oom-kill", summary + " — not one of our engines", None)
            return
        launch_id = hit.launch.launch_id
        self._ooms.setdefault(launch_id, []).append(event)
        record = {**event.model_dump(mode="json"), "matched_by": hit.matched_by.value}
        self.store.record_oom(launch_id, record)
        self._note("oom-kill", summary + f" (matched by {hit.matched_by.value})", launch_id)

    def on_gap(self, gap: SeqGap) -> None:
        self.metrics.record_kmsg_gap(gap)

    def _note(self, kind: str, message: str, launch_id: str | None) -> None:
        if self.engine is not None:
            self.engine.note(kind, message, launch_id)
        else:
            self.store.add_event(kind, message, time.time(), launch_id)

    async def run_kmsg(self, stop: asyncio.Event, path: Path = Path("/dev/kmsg")) -> None:
        """Follow the kernel log; without permission (not root) the watch runs without it, said once."""
        try:
            source = DevKmsg(path)
        except OSError as exc:
            self._note("kmsg-unavailable", f"cannot read {path} ({exc.strerror}): OOM kills will be "
                       "diagnosed from exit codes and logs only"
                       + ("; GPU Xid/reset events are not seen" if self.on_record is not None else ""), None)
            return
        follower = KmsgFollower(source, self.on_oom, on_gap=self.on_gap, on_record=self.on_record)
        try:
            await follower.run(stop)
        finally:
            source.close()
