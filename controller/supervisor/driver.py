"""The supervisor's async driver: turns the world into observations and executes the actions.

Everything with a side effect goes through an injected seam (host_seams.py: runtimes, prober, store,
preflight, clock; the gateway link), so the unit tests run a 40-minute start with fakes in milliseconds
and the integration tests run the same code against a real vLLM engine. One `step`: new log text
(PhaseSeen), CPU time (CpuSample), still running? (exit → diagnosis → Exited), readiness while starting
(ReadyProbed) or health while ready (HealthLost), the gateway's slot, then Tick. Slow work runs in tasks
that answer with observations; `submit` never awaits, so two concurrent API requests see one
consistent machine (the second apply of a pair gets its 409 from the transition, not from a race).

The driver drives; the state beside the machine is owned where it is used. Per host (`HostSeams`,
shared by every engine a controller supervises): runtimes, store, metrics, clock, the event stream
(events.py), prober, preflight, the host's watches. Per engine (built here): the machine, written by
`submit` only and read by everyone else through a `MachineView`; the launch runs (launch_run.py); the
`LaunchRecorder` (every write of a launch to its record, metrics and events); the `HoldKeeper` (the
switch path and the gateway's hold); the `GatewaySync` (the gateway's slot). Adoption: adoption.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from appliance.engine_secret import redact as redact_keys
from appliance.observe.phase_record import event_label
from controller.metrics import ControllerMetrics
from controller.runtime.base import EngineHandle, EngineRuntimeError, ExitInfo, Provenance, Runtime
from controller.store import Store
from controller.supervisor import adoption, status_view
from controller.supervisor.action_tasks import ActionTasks
from controller.supervisor.clock import Clock, SystemClock
from controller.supervisor.driver_config import DriverConfig
from controller.supervisor.engine_calls import START_ERRORS, empty_cache, start_failure, stop_engine
from controller.supervisor.events import EventLog
from controller.supervisor.exit_diagnosis import ExitDiagnoser, failure_of
from controller.supervisor.exit_watch import watch_run_exit
from controller.supervisor.follow import LogFollower
from controller.supervisor.gateway_link import GatewayLink
from controller.supervisor.gateway_sync import GatewaySync
from controller.supervisor.hold_keeper import HoldKeeper
from controller.supervisor.host_seams import (
    BesideFn,
    GpuEventSource,
    HostSeams,
    MemTarget,
    OnReady,
    OomSource,
    PreflightFn,
    ProcessPeaks,
    ProvenanceFn,
    SpecForRecipe,
)
from controller.supervisor.launch_key import launch_key
from controller.supervisor.launch_recorder import LaunchRecorder
from controller.supervisor.launch_run import LaunchRun, LaunchRuns
from controller.supervisor.machine import Launch, Machine, Policy, State, progress, transition
from controller.supervisor.machine_view import MachineCell, MachineView
from controller.supervisor.probes import Prober
from controller.supervisor.scrape_targets import ScrapeTargets
from controller.supervisor.signals import (
    Action,
    Adopted,
    ClearUpstream,
    CpuSample,
    Drained,
    DrainGateway,
    Exited,
    ExitSeen,
    HealthLost,
    Launched,
    LaunchFailed,
    MarkEnded,
    MarkReady,
    Notify,
    Observation,
    PhaseSeen,
    PreflightOk,
    ReadyProbed,
    Reject,
    RunPreflight,
    SetUpstream,
    StartEngine,
    StopEngine,
    Stopped,
    SwitchUpstream,
    Tick,
)

# Clock/SystemClock (clock.py) and DriverConfig (driver_config.py): re-exported for the driver's users.
__all__ = ["Clock", "Driver", "DriverConfig", "SystemClock"]

log = logging.getLogger(__name__)

# Liveness (GET /healthz): the loop must come round within this many polls, and never less than this
# long (a step may wait on the runtime for a while: a docker stop's grace runs in a task, not here).
LOOP_STALE_POLLS = 30
LOOP_STALE_MIN_S = 60.0


class Driver:
    """Supervises one engine: its machine, its launch runs, its hold and its gateway slot, through the
    host's seams (`host`)."""

    def __init__(
        self,
        *,
        runtimes: Mapping[str, Runtime],
        store: Store,
        preflight: PreflightFn,
        prober: Prober,
        gateway: GatewayLink,
        clock: Clock | None = None,
        policy: Policy | None = None,
        config: DriverConfig | None = None,
        provenance: ProvenanceFn | None = None,
        spec_for_recipe: SpecForRecipe | None = None,
        oom_events: OomSource | None = None,
        gpu_events: GpuEventSource | None = None,
        metrics: ControllerMetrics | None = None,
        mem_target: MemTarget | None = None,
        beside: BesideFn | None = None,
        unavailable_runtimes: Mapping[str, str] | None = None,
        process_peaks: ProcessPeaks | None = None,
        on_ready: OnReady | None = None,
        events: EventLog | None = None,
        scrape_targets: Path | ScrapeTargets | None = None,
        engine_name: str | None = None,
    ) -> None:
        clock = clock or SystemClock()
        metrics = metrics if metrics is not None else ControllerMetrics()
        self.host = HostSeams(
            runtimes=dict(runtimes), store=store, metrics=metrics, clock=clock,
            events=events or EventLog(store, clock), prober=prober, preflight=preflight,
            unavailable_runtimes=dict(unavailable_runtimes or {}), provenance=provenance,
            spec_for_recipe=spec_for_recipe, oom_events=oom_events, gpu_events=gpu_events,
            mem_target=mem_target, process_peaks=process_peaks, beside=beside, on_ready=on_ready)
        self.config = config or DriverConfig()
        # None: the primary engine (the gateway's default slot); else an engine started beside it,
        # named by its served model name (engine_set.py): its gateway slot and its launches' mark.
        self.engine_name = engine_name
        # Per engine: the machine (written by `submit` only; read through `view`) and what goes with it.
        self._cell = MachineCell(Machine(policy=policy or Policy()))
        self.view = MachineView(self._cell)
        self.runs = LaunchRuns()  # per-launch state: one LaunchRun from start/adoption to MarkEnded
        self.gateway_sync = GatewaySync(
            gateway, ready_launch=self.view.ready_launch, engine_key=self.runs.engine_key,
            note=self.host.events.note, check_interval_s=self.config.gateway_check_interval_s)
        self.diagnoser = ExitDiagnoser(clock, oom_events, gpu_events)
        self.recorder = LaunchRecorder(self.host, self.view, self.diagnoser)
        self.holds = HoldKeeper(self.host, self.view, self.runs, self.gateway_sync, self.config.hold)
        self._probing = False
        self._next_probe = 0.0
        self._health_failures = 0
        self.tasks = ActionTasks(self.host.events)  # slow work in flight, answering with observations
        self.loop_alive_at: float | None = None  # when `run`'s loop last came round (liveness)
        # What the API, the console and the watches reach the driver for, under their old names.
        self.runtimes, self.store, self.metrics = self.host.runtimes, store, self.host.metrics
        self.prober, self.preflight, self.clock = prober, preflight, clock
        self.note, self.subscribe = self.host.events.note, self.host.events.subscribe
        self.engine_key = self.runs.engine_key  # for in-controller clients (POST /compare); never printed
        self.switch_plan, self.hold_status = self.holds.switch_plan, self.holds.status
        self.check_store = self.recorder.check_store
        self.settle, self.shutdown = self.tasks.settle, self.tasks.shutdown
        self.metrics.set_engine_state(self.machine.state.value)
        # Prometheus' file_sd list of the engines to scrape (scrape_targets.py): written now (empty,
        # or what this machine holds) and after every transition that changes it.
        # One file for every engine of the host: a shared ScrapeTargets is handed in by the engine set.
        self.scrape_targets = (ScrapeTargets(scrape_targets) if isinstance(scrape_targets, Path)
                               else scrape_targets)
        if self.scrape_targets is not None:
            self.scrape_targets.publish(self.machine, self.engine_name)

    @property
    def machine(self) -> Machine:
        """The current machine (read-only: only `submit` replaces it; others read `view`)."""
        return self._cell.machine

    @property
    def gateway(self) -> GatewayLink:
        return self.gateway_sync.gateway

    @gateway.setter
    def gateway(self, link: GatewayLink) -> None:
        self.gateway_sync.gateway = link

    @property
    def store_problem(self) -> str | None:
        return self.recorder.store_problem

    # ------------------------------------------------------------------------------------------
    # The machine

    def submit(self, obs: Observation) -> Reject | None:
        """Run one transition and start its actions. Never awaits: atomic within the event loop."""
        before = self.machine
        self._cell.machine, actions = transition(before, obs, self.clock.now())
        if self.machine.state is not before.state:
            self.recorder.state_changed()
        if self.scrape_targets is not None:
            self.scrape_targets.publish(self.machine, self.engine_name)
        rejected: Reject | None = None
        for action in actions:
            if isinstance(action, Reject):
                rejected = action
            else:
                self._execute(action)
        return rejected

    # ------------------------------------------------------------------------------------------
    # The loop

    async def run(self, stop: asyncio.Event) -> None:
        """Step every poll interval until `stop` (the service adopts first, then runs this). No
        failure of one step ends supervision: the loop is the only thing watching the engine."""
        self.loop_alive_at = self.clock.now()
        while not stop.is_set():
            try:
                await self.step()
            except Exception:  # a bug in one look; the next poll looks again
                log.exception("supervisor step failed; supervision goes on")
            self.loop_alive_at = self.clock.now()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.config.poll_interval_s)

    def liveness_problem(self) -> str | None:
        """Why the controller is not alive though it answers HTTP: its launch store was deleted or
        replaced under it (`check_store`), or its supervision loop has not come round for much longer
        than a poll (a hung runtime call, a dead task). None: alive, or the loop was never started
        here (an API without supervision, in tests)."""
        store = self.check_store()
        if store is not None:
            return store
        if self.loop_alive_at is None:
            return None
        stale_s = max(LOOP_STALE_MIN_S, LOOP_STALE_POLLS * self.config.poll_interval_s)
        idle_s = self.clock.now() - self.loop_alive_at
        if idle_s <= stale_s:
            return None
        return (f"the supervision loop last came round {idle_s:.0f} s ago (a poll is "
                f"{self.config.poll_interval_s:g} s): the engine is not being watched")

    async def step(self) -> None:
        """One look at the world, then Tick (always: the budget and stall clocks run on it)."""
        self.check_store()
        launch = self.machine.launch
        if launch is not None and launch.handle is not None:
            try:
                await self._follow(launch)
                await self._watch_exit(launch)
            except (EngineRuntimeError, OSError) as exc:
                self.recorder.runtime_unanswered(launch, self.runs.get(launch.launch_id), exc)
            else:
                if (run := self.runs.get(launch.launch_id)) is not None:
                    run.runtime_error = None
            self._watch_readiness(launch)
            self._watch_gateway(launch)
            self.recorder.flag_stall(launch, self.runs.get(launch.launch_id))
        old = self.machine.old
        if old is not None and old.handle is not None and not self.machine.switched:
            try:
                await self._watch_exit(old)  # it serves while the new one starts beside it
            except (EngineRuntimeError, OSError) as exc:
                self.recorder.runtime_unanswered(old, self.runs.get(old.launch_id), exc)
        renewal = self.holds.renewal()
        if renewal is not None:
            self.tasks.spawn(renewal, "gateway hold renewal")
        self.submit(Tick())

    # ------------------------------------------------------------------------------------------
    # Watching the current engine

    async def _follow(self, launch: Launch, replay: bool = False) -> None:
        handle = launch.handle
        run = self.runs.get(launch.launch_id)
        if handle is None or run is None:
            return
        follower = run.follower
        rt = self.host.runtime(handle)
        text, offset = await asyncio.to_thread(rt.read_logs, handle, follower.offset)
        # vLLM 0.26.0 logs its arguments, the key from its config file among them (engine_secret.py):
        # nothing kept from the log (phase evidence, diagnosis excerpts) may hold it.
        text = redact_keys(text, [run.engine_key] if run.engine_key else [])
        now = self.clock.now()
        for event in follower.feed(text, offset, now):
            if replay:
                follower.recorder.keep(event)  # recorded by the controller that saw it first
                continue
            # Every event restarts the stall clock; only the recorded ones are the record's rows.
            keep = self.recorder.phase(launch, follower, event, now)
            label = follower.tracker.describe()
            self.submit(PhaseSeen(launch.launch_id, event.phase.value, event_label(event), recorded=keep))
            self.recorder.publish_phase(launch, follower, event, now, label, progress(self.machine, now))
        self.recorder.cache(launch, run)
        self.recorder.engine_facts(launch, run)
        if self.machine.state is State.STARTING:
            cpu = await asyncio.to_thread(rt.cpu_seconds, handle)
            self.submit(CpuSample(launch.launch_id, cpu))

    async def _watch_exit(self, launch: Launch) -> None:
        """The poll-time look (the fallback: the exit watcher normally saw it first)."""
        handle = launch.handle
        run = self.runs.get(launch.launch_id)
        if handle is None or self.machine.state is State.STOPPING or run is None or run.exiting:
            return
        info = await asyncio.to_thread(self.host.runtime(handle).inspect, handle)
        if not info.running:
            self._exit_noticed(launch.launch_id, info)
        else:
            run.runtime_note = info.reason  # a pod waiting for a node says so during the start

    def _exit_noticed(self, launch_id: str, info: ExitInfo) -> None:
        """The engine ended: out of the gateway now (ExitSeen), classified after the OOM settle."""
        m = self.machine
        launch = m.launch
        run = self.runs.get(launch_id)
        if m.old is not None and m.old.launch_id == launch_id and not m.switched:
            launch = m.old  # the engine serving while a new one starts beside it (blue/green)
        elif launch is None or launch.launch_id != launch_id or m.state is State.STOPPING:
            return
        if run is None or run.exiting:
            return
        run.exiting = True
        run.exit_seen = info
        self.submit(ExitSeen(launch_id, info))
        self.tasks.spawn(self._classify_exit(launch, info), f"classify-exit {launch_id}")

    def _watch_death(self, handle: EngineHandle) -> None:
        """Block in Runtime.wait in a thread (exit_watch.py): a death is known at once."""
        run = self.runs.get(handle.launch_id)
        if self.config.watch_exits and run is not None:
            watch_run_exit(self.host.runtime(handle), handle, run, self.view, on_exit=self._exit_noticed,
                           recheck_s=self.config.exit_watch_s)

    async def _classify_exit(self, launch: Launch, info: ExitInfo) -> None:
        await self.clock.sleep(self.config.oom_settle_s)
        await self._follow(launch)
        run = self.runs.get(launch.launch_id)
        diagnosis = self.diagnoser.diagnose(launch, info, run)
        if run is not None:  # kept for MarkEnded's record (gone already if the launch ended meanwhile)
            run.exit, run.diagnosis = info, diagnosis
        self.submit(Exited(launch.launch_id, info, failure_of(diagnosis)))

    def _watch_readiness(self, launch: Launch) -> None:
        now = self.clock.now()
        if self._probing or now < self._next_probe:
            return
        if self.machine.state is State.STARTING:
            self._probing = True
            self._next_probe = now + self.config.probe_interval_s
            self.tasks.spawn(self._probe_ready(launch), f"probe {launch.launch_id}")
        elif self.machine.state is State.READY:
            self._probing = True
            self._next_probe = now + self.config.health_interval_s
            self.tasks.spawn(self._probe_health(launch), f"health {launch.launch_id}")

    async def _probe_ready(self, launch: Launch) -> None:
        try:
            error = await self.prober.health(launch.spec)
            if error is None:
                # With this launch's key: an engine left over from another launch answers 401 here,
                # so a ready is never an orphan's.
                error = await self.prober.completion(launch.spec, self.runs.engine_key(launch.launch_id))
        finally:
            self._probing = False
        run = self.runs.get(launch.launch_id)
        if run is not None:
            run.probe_error = error
        if error is None:
            await self._follow(launch)  # the phases up to "API up" belong to the start
            self.submit(ReadyProbed(launch.launch_id))

    async def _probe_health(self, launch: Launch) -> None:
        try:
            error = await self.prober.health(launch.spec)
        finally:
            self._probing = False
        if error is None:
            self._health_failures = 0
            return
        self._health_failures += 1
        run = self.runs.get(launch.launch_id)
        if run is not None:
            run.probe_error = error
        if self._health_failures >= self.config.health_failures:
            self._health_failures = 0
            detail = f"{self.config.health_failures} health probes failed: {error}"
            self.submit(HealthLost(launch.launch_id, detail))

    def _watch_gateway(self, launch: Launch) -> None:
        if self.machine.state is State.READY and self.gateway_sync.check_due(self.clock.now()):
            self.tasks.spawn(self.gateway_sync.check(launch), f"gateway check {launch.launch_id}")

    # ------------------------------------------------------------------------------------------
    # Adoption (adoption.py finds the engine; the machine takes it or not)

    async def adopt(self, skip: adoption.Skip | None = None) -> None:
        """A controller restart never kills a healthy engine: find ours and supervise it again.
        `skip`: engines that are not this driver's to take nor to stop (the ones started beside the
        primary, adopted by their own drivers: engine_set.py)."""
        found = await adoption.find_engine(self.host, self.machine.policy.stop_grace_s, skip)
        if found is not None:
            await self.take(found)

    async def take(self, found: adoption.Found) -> None:
        """Supervise this running engine (found by `adoption`) as the machine's launch."""
        handle, spec, run = found.handle, found.spec, found.run
        self.runs.begin(run)
        self.submit(Adopted(handle, spec, ready_recorded=run.recorded_ready_s is not None))
        launch = self.machine.launch
        if launch is None or launch.launch_id != handle.launch_id:
            self.runs.end(handle.launch_id)  # the machine did not take it: nothing to keep
            return
        self.recorder.adopted(spec, found.mem_target)
        self._watch_death(handle)
        await self._follow(launch, replay=True)  # rebuild the phase picture without re-recording it

    # ------------------------------------------------------------------------------------------
    # Actions

    def _execute(self, action: Action) -> None:
        match action:
            case RunPreflight():
                self.tasks.spawn(self._preflight(action), f"preflight {action.recipe}")
            case StartEngine():
                self.tasks.spawn(self._start(action), f"start {action.launch_id}")
            case StopEngine():
                self.tasks.spawn(self._stop(action), f"stop {action.launch_id}")
            case DrainGateway():
                self.tasks.spawn(self._drain(action), f"drain {action.launch_id}")
            case SwitchUpstream():
                self.tasks.spawn(self._switch(action), f"switch to {action.launch_id}")
            case SetUpstream():
                point = self.gateway_sync.point_to(action.launch_id, action.base_url,
                                                   action.served_model_name)
                self.tasks.spawn(point, "gateway point")
            case ClearUpstream():
                hold = self.holds.begin(action.hold) if action.hold is not None else None
                clear = self.gateway_sync.clear(action.retry_after_s, action.reason, hold, action.detail,
                                                self.clock.now())
                self.tasks.spawn(clear, "gateway clear")
            case MarkReady():
                self._mark_ready(action)
            case MarkEnded():
                # The one place a launch's state goes: all of it, whatever happens below.
                self.recorder.ended(action, self.runs.end(action.launch_id))
            case Notify():
                self.note(action.kind, action.message, action.launch_id, action.data)
            case Reject():
                pass

    async def _preflight(self, action: RunPreflight) -> None:
        answer = await self.preflight(action.token, action.recipe, action.fresh_cache)
        if isinstance(answer, PreflightOk):
            answer = await self.holds.blue_green(answer)
        self.submit(answer)

    async def _start(self, action: StartEngine) -> None:
        now = self.clock.now()
        spec = action.spec
        if action.empty_cache_first is not None:
            await empty_cache(Path(action.empty_cache_first), action.launch_id, self.host.events)
        run = self.runs.begin(LaunchRun(action.launch_id, LogFollower(action.launch_id, started_at=now),
                                        cache_empty=action.cache_empty))
        prov = Provenance()
        if self.host.provenance is not None:
            try:
                prov = await asyncio.to_thread(self.host.provenance, spec)
            except (RuntimeError, OSError, ValueError) as exc:
                self.note("provenance-error", f"could not record versions: {exc}", action.launch_id)
        await self.recorder.begin(action, run, prov, now)
        if self.engine_name is not None:
            # The mark a later controller adopts it by as an engine beside the primary (engine_set.py).
            self.note(adoption.ALONGSIDE_EVENT, f"started beside the other engines as engine "
                      f"{self.engine_name!r}", action.launch_id, {"engine": self.engine_name})
        key, deliver = launch_key(spec)
        # The engine's environment is the spec's alone: the key goes in its --config file
        # (appliance/engine_secret.py), which the compile factors leave out like vLLM does.
        await self.recorder.begin_compile(run, spec, {}, prov, emptied=action.empty_cache_first is not None)
        try:
            rt = self.host.runtime(spec)
            handle = await asyncio.to_thread(rt.start, spec, action.launch_id, deliver)
        except START_ERRORS as exc:
            self.submit(LaunchFailed(action.launch_id, start_failure(exc, spec)))
            self._forget_unless_current(action.launch_id)  # a failure the machine ignored: no MarkEnded
            return
        run.engine_key = key
        self.store.set_handle(action.launch_id, handle, self.clock.now())
        run.follower.started_at = self.clock.now()
        self.submit(Launched(action.launch_id, handle))
        if self.view.is_current(action.launch_id):
            self._watch_death(handle)

    async def _stop(self, action: StopEngine) -> None:
        info = await stop_engine(self.host.runtime(action.handle), action, self.config.stop_retries,
                                 self.host.events)
        if info is None or info.running:
            # Never report a running engine as stopped: the host cannot hold two.
            self.note("stop-failed", "the engine did not stop; it stays under supervision", action.launch_id)
            return
        launch = self.machine.launch
        if launch is not None and launch.launch_id == action.launch_id:
            await self._follow(launch)
        run = self.runs.get(action.launch_id)
        if run is not None:
            run.exit = info
        self.submit(Stopped(action.launch_id, info))
        # An engine nobody wanted any more (launched after its launch was replaced) has no MarkEnded.
        self._forget_unless_current(action.launch_id)

    async def _switch(self, action: SwitchUpstream) -> None:
        """Blue/green: point the gateway at the new engine, let the old one's requests finish, then
        have the old one stopped (Drained)."""
        await self.holds.switch(action)
        self.submit(Drained(action.old_id))

    async def _drain(self, action: DrainGateway) -> None:
        await self.holds.drain(action)
        self.submit(Drained(action.launch_id))

    def _mark_ready(self, action: MarkReady) -> None:
        launch = self.recorder.ready(action, self.runs.get(action.launch_id))
        on_ready = self.host.on_ready
        if launch is not None and on_ready is not None and launch.handle is not None:
            self.tasks.spawn(on_ready(action.launch_id, launch.spec, launch.handle), "on-ready hook")

    def _forget_unless_current(self, launch_id: str) -> None:
        """Drop a launch's state when the machine has no such launch (it ignored a late answer)."""
        if not self.view.is_current(launch_id):
            self.runs.end(launch_id)

    # ------------------------------------------------------------------------------------------
    # Status

    @property
    def last_diagnosis(self) -> dict[str, Any] | None:
        return self.recorder.last_diagnosis

    def status(self) -> dict[str, Any]:
        launch = self.machine.launch
        run = self.runs.get(launch.launch_id) if launch is not None else None
        return {**status_view.status(self.machine, run, self.clock.now(), self.recorder.last_diagnosis),
                "store_problem": self.recorder.store_problem, "hold": self.holds.status(),
                "blue_green": self.holds.blue_green_status()}
