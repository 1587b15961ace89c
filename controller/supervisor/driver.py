"""The supervisor's async driver: turns the world into observations and executes the actions.

Everything with a side effect goes through an injected seam — the Runtime (engines), the Prober
(readiness), the GatewayLink, the Store, the preflight, and the Clock — so the unit tests run a
40-minute start with fakes in milliseconds, and the integration tests run the same code against
a real vLLM engine.

One loop iteration (`step`): read new log text (phases → PhaseSeen), sample CPU time (CpuSample),
see whether the engine is still running (exit → diagnosis → Exited), probe readiness while
starting (ReadyProbed) or health while ready (HealthLost), check that the gateway still routes to
the ready engine (a restarted gateway forgets its slot), then Tick. Slow work (runtime calls,
probes, preflight, gateway calls) runs in tasks that answer with observations; `submit` itself
never awaits, so two concurrent API requests see one consistent machine (the second apply of a
pair gets its 409 from the transition function, not from a race).

What the driver knows per launch beyond the machine (its log follower, engine key, probe error,
exit) is one `LaunchRun` (launch_run.py), created at start or adoption and dropped at `MarkEnded`.
The metrics are an injected `ControllerMetrics` (controller/metrics.py); the launch facts they carry
(cold/warm, ready budget, the recipe's MemAvailable target) are set here at start and adoption and
cleared when the launch ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from appliance.diagnosis.diagnose import Diagnosis, FailureFacts, diagnose
from appliance.diagnosis.signatures import DiagnosisCode
from appliance.engine_secret import redact as redact_keys
from appliance.observe.gpu_events import GpuEvent
from appliance.observe.kmsg import OomEvent
from appliance.observe.log_phases import PHASE_LABELS, CacheOutcome, PhaseEvent
from appliance.observe.phase_record import event_label
from appliance.recipe.engine_key import recipe_key
from appliance.recipe.launch_port import on_port
from appliance.recipe.launch_spec import LaunchSpec
from controller.metrics import ControllerMetrics
from controller.runtime.base import EngineHandle, EngineRuntimeError, ExitInfo, Provenance, Runtime
from controller.runtime.ports import PortInUse
from controller.store import REDACTED, Store
from controller.supervisor import compile_cache, status_view
from controller.supervisor.blue_green import CHECK_ERRORS, Fit, moved
from controller.supervisor.clock import Clock, SystemClock
from controller.supervisor.engine_key import launch_key
from controller.supervisor.exit_watch import watch_exit
from controller.supervisor.follow import LogFollower
from controller.supervisor.gateway_link import GatewayLink, HoldPlan
from controller.supervisor.gateway_sync import GatewaySync
from controller.supervisor.hold_plan import HoldPolicy, expected_ready_s, switch_view
from controller.supervisor.hold_plan import plan as hold_plan
from controller.supervisor.launch_run import LaunchRun, LaunchRuns
from controller.supervisor.machine import Launch, Machine, Policy, State, progress, transition
from controller.supervisor.probes import Prober
from controller.supervisor.signals import (
    Action,
    Adopted,
    ClearUpstream,
    CpuSample,
    Drained,
    DrainGateway,
    Exited,
    ExitSeen,
    Failure,
    HealthLost,
    Launched,
    LaunchFailed,
    MarkEnded,
    MarkReady,
    Notify,
    Observation,
    PhaseSeen,
    PreflightFailed,
    PreflightOk,
    ReadyProbed,
    Reject,
    RunPreflight,
    SetUpstream,
    StartEngine,
    StartKind,
    StopEngine,
    Stopped,
    SwitchUpstream,
    Tick,
)

__all__ = ["Clock", "Driver", "DriverConfig", "SystemClock"]  # Clock/SystemClock: clock.py, re-exported

log = logging.getLogger(__name__)

# Liveness (GET /healthz): the loop must come round within this many polls, and never less than this
# long (a step may wait on the runtime for a while: a docker stop's grace runs in a task, not here).
LOOP_STALE_POLLS = 30
LOOP_STALE_MIN_S = 60.0

PreflightFn = Callable[[int, str, bool], Awaitable[PreflightOk | PreflightFailed]]
ProvenanceFn = Callable[[LaunchSpec], Provenance]
SpecForRecipe = Callable[[str], LaunchSpec | None]
OomSource = Callable[[str], Sequence[OomEvent]]
# launch id → the GPU kernel events attributed to it (controller/supervisor/gpu_health_link.py).
GpuEventSource = Callable[[str], Sequence[GpuEvent]]
# recipe name → its MemAvailable floor in bytes (controller/watch/recipe_target.py; blocking: loads
# the recipe), for `MemAvailableBelowRecipeTarget`.
MemTarget = Callable[[str], int | None]
# Blue/green (blue_green.py; blocking): does a launch of this recipe (its start cold? None: as its cache
# is now) fit beside the serving engine (its spec and handle)? The verdict, its numbers and the port. The
# spec is the serving launch's own (the one it was started or adopted with, as in its launch record):
# its cards and cores are judged from it, never from its recipe file, which may have changed since.
BesideFn = Callable[[str, bool | None, LaunchSpec, EngineHandle], Fit]


@dataclass(frozen=True)
class DriverConfig:
    poll_interval_s: float = 1.0
    probe_interval_s: float = 2.0  # readiness probes while starting
    health_interval_s: float = 10.0  # liveness probes while ready
    health_failures: int = 3  # consecutive failed health probes → HealthLost
    # The kernel's OOM record can trail the process's death a little; wait this long for the kmsg
    # watch before classifying an exit (its detection latency goal is < 1 s).
    oom_settle_s: float = 1.0
    stop_retries: int = 3
    # While ready: ask the gateway (GET /admin/upstream) whether it still routes to the engine. A
    # gateway restarted under a running controller has no slot and answers 503 until told again.
    gateway_check_interval_s: float = 10.0
    # A thread per engine blocks in Runtime.wait (pidfd / docker) so that a death is known at once,
    # not at the next poll; it re-checks that its launch is still current this often.
    watch_exits: bool = True
    exit_watch_s: float = 30.0
    # How long the gateway holds new requests during a planned switch (hold_plan.py).
    hold: HoldPolicy = field(default_factory=HoldPolicy)


def failure_of(d: Diagnosis) -> Failure:
    return Failure(code=d.code.value, summary=d.summary, hint=d.hint, retryable=d.retryable)


class Driver:
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
    ) -> None:
        self.runtimes = dict(runtimes)
        # Kinds this host does not offer, and why (service.build fills it from the registry).
        self.unavailable_runtimes: dict[str, str] = {}
        self.store = store
        self.preflight = preflight
        self.prober = prober
        self.clock = clock or SystemClock()
        self.config = config or DriverConfig()
        self.provenance = provenance
        self.spec_for_recipe = spec_for_recipe
        self.oom_events = oom_events
        self.gpu_events = gpu_events
        self.metrics = metrics if metrics is not None else ControllerMetrics()
        self.mem_target = mem_target
        self.beside = beside  # None: every switch drains, stops and starts with the hold
        self.machine = Machine(policy=policy or Policy())
        self.last_diagnosis: dict[str, Any] | None = None
        self.runs = LaunchRuns()  # per-launch state: one LaunchRun from start/adoption to MarkEnded
        self._probing = False
        self._next_probe = 0.0
        self._health_failures = 0
        self._next_hold_renewal = 0.0
        self._hold_floor_s = 0.0  # the bound the current hold promised (renewals never shorten it)
        self._tasks: set[asyncio.Task[None]] = set()
        self._subscribers: set[asyncio.Queue[dict[str, Any]]] = set()
        self.loop_alive_at: float | None = None  # when `run`'s loop last came round (liveness)
        # Why the launch store's path no longer names the file it writes (deleted or replaced), once seen.
        self.store_problem: str | None = None
        self.gateway_sync = GatewaySync(
            gateway, ready_launch=self._ready_launch, engine_key=self.engine_key, note=self.note,
            check_interval_s=self.config.gateway_check_interval_s)
        # Called (as a task) when a launch becomes ready: the kernel-path/deployment proof
        # (controller/evaluation/proof.py, DOMAIN §7). None: nothing extra at ready.
        self.on_ready: Callable[[str, LaunchSpec, EngineHandle], Coroutine[Any, Any, None]] | None = None
        # The host watch's peak RssAnon per engine pid for a launch (service.build wires it): with TP > 1
        # the record gives each rank's worker process its own host RAM (DOMAIN §3: memory is per worker).
        self.process_peaks: Callable[[str], Mapping[int, int]] | None = None
        self.metrics.set_engine_state(self.machine.state.value)

    @property
    def gateway(self) -> GatewayLink:
        return self.gateway_sync.gateway

    @gateway.setter
    def gateway(self, link: GatewayLink) -> None:
        self.gateway_sync.gateway = link

    def _ready_launch(self) -> Launch | None:
        return self.machine.launch if self.machine.state is State.READY else None

    # ------------------------------------------------------------------------------------------
    # The machine

    def submit(self, obs: Observation) -> Reject | None:
        """Run one transition and start its actions. Never awaits: atomic within the event loop."""
        before = self.machine
        self.machine, actions = transition(before, obs, self.clock.now())
        if self.machine.state is not before.state:
            self._state_changed()
        rejected: Reject | None = None
        for action in actions:
            if isinstance(action, Reject):
                rejected = action
            else:
                self._execute(action)
        return rejected

    def _state_changed(self) -> None:
        m = self.machine
        self.metrics.set_engine_state(m.state.value)
        if m.state is State.READY and m.launch is not None:
            # Every way into ready, including an adopted engine that was ready before the restart (it
            # has no MarkReady: its start was measured by the controller that launched it).
            self.metrics.set_engine_ready(m.launch.spec.recipe)
        self._publish({
            "type": "state",
            "state": m.state.value,
            "recipe": m.recipe,
            "launch_id": m.launch.launch_id if m.launch else None,
            "failures": m.failures,
        })

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

    def check_store(self) -> str | None:
        """The launch store's file still the one at its path? (a deleted or replaced store
        went unnoticed, its history lost at the next restart). One stat, on every step and liveness
        probe; said loudly once (log, event, `status`), and the controller is then not alive (/healthz
        503) so that it is restarted onto the file at the path."""
        problem = self.store.file_problem()
        if problem is not None and problem != self.store_problem:
            self.store_problem = problem
            log.error("launch store: %s", problem)
            self.note("store-lost", f"{problem}; the controller reports itself not alive (/healthz 503) "
                      "until it is restarted")
        return problem

    async def step(self) -> None:
        """One look at the world, then Tick (always: the budget and stall clocks run on it)."""
        self.check_store()
        launch = self.machine.launch
        if launch is not None and launch.handle is not None:
            try:
                await self._follow(launch)
                await self._watch_exit(launch)
            except (EngineRuntimeError, OSError) as exc:
                self._runtime_unanswered(launch, exc)
            else:
                if (run := self.runs.get(launch.launch_id)) is not None:
                    run.runtime_error = None
            self._watch_readiness(launch)
            self._watch_gateway(launch)
            self._flag_stall(launch)
        old = self.machine.old
        if old is not None and old.handle is not None and not self.machine.switched:
            try:
                await self._watch_exit(old)  # it serves while the new one starts beside it
            except (EngineRuntimeError, OSError) as exc:
                self._runtime_unanswered(old, exc)
        self._renew_hold()
        self.submit(Tick())

    def _flag_stall(self, launch: Launch) -> None:
        """A phase far over its usual duration (appliance/observe/ready_eta.py) is reported once, as an event:
        a flag for the operator before the budget runs out, not a kill — the machine's stall watch (no
        progress and no CPU) and the ready budget still decide when a start has failed."""
        run = self.runs.get(launch.launch_id)
        if self.machine.state is not State.STARTING or run is None:
            return
        expected = status_view.eta(launch, run, self.clock.now())
        stall = expected.stall if expected is not None else None
        if stall is None or stall.phase in run.stall_flagged:
            return
        run.stall_flagged.add(stall.phase)
        self.note("likely-stalled",
                  f"{stall.label} {round(stall.took_s)} s, usually {round(stall.usual_s)} s "
                  "(a flag, not a kill: the stall watch and the ready budget still decide)",
                  launch.launch_id, {"phase": stall.phase, "took_s": stall.took_s,
                                     "usual_s": stall.usual_s, "text": stall.text})

    def _runtime_unanswered(self, launch: Launch, exc: Exception) -> None:
        """The runtime could not be asked this poll (a Docker daemon restarting, an API server's 5xx,
        a log file gone): noted once per distinct error, and looked at again next poll. The engine's
        own death is still seen by the exit watch or the next look that works."""
        message = f"{type(exc).__name__}: {exc}"
        run = self.runs.get(launch.launch_id)
        if run is None or message != run.runtime_error:
            log.warning("runtime did not answer for launch %s: %s", launch.launch_id, message)
            self.note("runtime-unanswered", f"the {launch.spec.kind} runtime did not answer: {exc}; "
                      "supervision goes on and asks again next poll", launch.launch_id)
        if run is not None:
            run.runtime_error = message

    async def settle(self) -> None:
        """Wait for every action task (tests; shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def shutdown(self) -> None:
        """Controller exit: cancel our tasks. The engine keeps running, to be adopted next time."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*list(self._tasks), return_exceptions=True)

    def _spawn(self, coro: Coroutine[Any, Any, None], what: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=what)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            # A bug in an action must be seen, not swallowed: logged with its traceback and put in
            # the event stream. The machine stays consistent (the answer just never comes).
            log.error("supervisor task %s failed", task.get_name(), exc_info=exc)
            self.note("internal-error", f"{task.get_name()}: {exc!r}")

    # ------------------------------------------------------------------------------------------
    # Watching the current engine

    def _runtime(self, handle_or_spec: EngineHandle | LaunchSpec) -> Runtime:
        kind = handle_or_spec.kind
        rt = self.runtimes.get(kind)
        if rt is None:
            why = self.unavailable_runtimes.get(kind)
            raise EngineRuntimeError(f"no {kind!r} runtime is configured in this controller"
                                + (f": {why}" if why else ""))
        return rt

    async def _follow(self, launch: Launch, replay: bool = False) -> None:
        handle = launch.handle
        run = self.runs.get(launch.launch_id)
        if handle is None or run is None:
            return
        follower = run.follower
        rt = self._runtime(handle)
        text, offset = await asyncio.to_thread(rt.read_logs, handle, follower.offset)
        # vLLM 0.26.0 logs its arguments, the key from its config file among them (engine_secret.py):
        # nothing kept from the log (phase evidence, diagnosis excerpts) may hold it.
        text = redact_keys(text, [run.engine_key] if run.engine_key else [])
        now = self.clock.now()
        events = follower.feed(text, offset, now)
        for event in events:
            if replay:
                follower.recorder.keep(event)  # recorded by the controller that saw it first
            else:
                self._phase(launch, follower, event, now)
        self._record_cache(launch, run)
        self._record_engine(launch, run)
        if self.machine.state is State.STARTING:
            cpu = await asyncio.to_thread(rt.cpu_seconds, handle)
            self.submit(CpuSample(launch.launch_id, cpu))

    def _phase(self, launch: Launch, follower: LogFollower, event: PhaseEvent, now: float) -> None:
        elapsed = now - follower.started_at
        detail = event.detail or ""
        # One row per phase (per capture round: first and last step), labelled from the event itself
        # (appliance/observe/phase_record.py); every event still restarts the stall clock.
        keep = follower.recorder.keep(event)
        if keep:
            self.store.add_phase(launch.launch_id, event.phase.value, now, elapsed, event.line[:300])
        self.metrics.set_engine_phase(launch.spec.recipe, event.phase.value, elapsed)
        label = follower.tracker.describe()
        self.submit(PhaseSeen(launch.launch_id, event.phase.value, event_label(event), recorded=keep))
        self._publish({
            "type": "phase", "launch_id": launch.launch_id, "phase": event.phase.value,
            "label": PHASE_LABELS[event.phase], "describe": label, "detail": detail,
            "elapsed_s": round(elapsed, 1), "progress": progress(self.machine, now),
        })

    def _record_engine(self, launch: Launch, run: LaunchRun) -> None:
        """Engine facts (appliance/observe/engine_facts.py) and the start's own seconds → the launch
        record."""
        follower = run.follower
        summary = follower.tracker.summary()
        seconds = {"weights_seconds": summary.weights_seconds, "weights_gib": summary.weights_gib,
                   "compile_seconds": summary.compile_seconds,
                   "init_engine_seconds": summary.init_engine_seconds}
        facts = {**follower.facts.facts.model_dump(mode="json", exclude_none=True),
                 **{k: v for k, v in seconds.items() if v is not None}}
        if len(follower.ranks.ranks) > 1:  # tensor parallel: each rank's phases, cache lines and host RAM
            peaks = dict(self.process_peaks(launch.launch_id)) if self.process_peaks else {}
            facts["ranks"] = follower.ranks.record(peaks)
        if facts and facts != run.engine_seen:
            run.engine_seen = facts
            self.store.set_engine_facts(launch.launch_id, facts)

    def _record_cache(self, launch: Launch, run: LaunchRun) -> None:
        self._record_compile(launch, run)
        outcome = run.follower.tracker.cache_outcome
        if outcome is CacheOutcome.UNKNOWN or run.cache_seen is outcome:
            return
        run.cache_seen = outcome
        self.store.set_cache(launch.launch_id, outcome.value)

    def _record_compile(self, launch: Launch, run: LaunchRun) -> None:
        """The log's cache lines into the record; a miss explained once, counted by why."""
        if run.compile is None:
            return
        already = run.compile.miss is not None
        patch = run.compile.observe(run.follower.tracker)
        if patch:
            self.store.update_compile_cache(launch.launch_id, patch)
        miss = run.compile.miss
        if miss is not None and not already:
            self.metrics.record_compile_cache_miss(miss.reason)
            why = "; ".join(miss.details)
            self.note("compile-cache-miss", f"compile cache miss ({miss.reason.value}): {why}",
                      launch.launch_id, miss.model_dump(mode="json"))

    async def _begin_compile(self, run: LaunchRun, spec: LaunchSpec, secret_env: Mapping[str, str],
                             prov: Provenance, emptied: bool) -> None:
        try:
            run.compile, warnings = await asyncio.to_thread(
                compile_cache.begin, self.store, run.launch_id, spec, secret_env, prov,
                emptied_on_purpose=emptied)
        except OSError as exc:  # an unreadable model or cache directory: the start goes on, said so
            self.note("compile-cache-warning", f"could not record compile factors: {exc}", run.launch_id)
            return
        for warning in warnings:
            self.note("compile-cache-warning", warning, run.launch_id)

    async def _watch_exit(self, launch: Launch) -> None:
        """The poll-time look (the fallback: the exit watcher normally saw it first)."""
        handle = launch.handle
        run = self.runs.get(launch.launch_id)
        if handle is None or self.machine.state is State.STOPPING or run is None or run.exiting:
            return
        info = await asyncio.to_thread(self._runtime(handle).inspect, handle)
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
        self._spawn(self._classify_exit(launch, info), f"classify-exit {launch_id}")

    def _watch_death(self, handle: EngineHandle) -> None:
        """Block in Runtime.wait in a thread (exit_watch.py): a death is known at once."""
        run = self.runs.get(handle.launch_id)
        if not self.config.watch_exits or run is None or run.watched:
            return
        run.watched = True

        def current() -> bool:
            m = self.machine
            return any(la is not None and la.launch_id == handle.launch_id for la in (m.launch, m.old))

        def done() -> None:
            run.watched = False

        watch_exit(self._runtime(handle), handle, loop=asyncio.get_running_loop(), still_current=current,
                   on_exit=self._exit_noticed, on_done=done, recheck_s=self.config.exit_watch_s)

    async def _classify_exit(self, launch: Launch, info: ExitInfo) -> None:
        await self.clock.sleep(self.config.oom_settle_s)
        await self._follow(launch)
        run = self.runs.get(launch.launch_id)
        diagnosis = self._diagnose(launch, info, run)
        if run is not None:  # kept for MarkEnded's record (gone already if the launch ended meanwhile)
            run.exit, run.diagnosis = info, diagnosis
        self.submit(Exited(launch.launch_id, info, failure_of(diagnosis)))

    def _diagnose(
        self, launch: Launch, info: ExitInfo | None, run: LaunchRun | None, *,
        stalled: bool = False, over_budget: bool = False,
    ) -> Diagnosis:
        follower = run.follower if run is not None else None
        tracker = follower.tracker if follower else None
        now = self.clock.now()
        facts = FailureFacts(
            exit_code=info.exit_code if info else None,
            signal=info.signal if info else None,
            oom_killed=info.oom_killed if info else None,
            # When the machine decided (budget, stall), `info` is what stopping the engine returned,
            # so its reason is the controller's doing; what counts is what the runtime said while the
            # engine waited (a pod for a node), so the record has the scheduler's words.
            runtime_reason=(run.runtime_note if run is not None else None) if stalled or over_budget
            else info.reason if info else None,
            log_tail=follower.tail_lines() if follower else (),
            oom_events=tuple(self.oom_events(launch.launch_id)) if self.oom_events else (),
            gpu_events=tuple(self.gpu_events(launch.launch_id)) if self.gpu_events else (),
            phase_reached=tracker.furthest if tracker else None,
            progress=tracker.describe() if tracker and tracker.current else None,
            stalled=stalled,
            over_budget=over_budget,
            elapsed_s=now - launch.started_at,
            budget_s=float(launch.spec.ready_budget_s),
            probe_error=run.probe_error if run is not None else None,
        )
        return diagnose(facts)

    def _watch_readiness(self, launch: Launch) -> None:
        now = self.clock.now()
        if self._probing or now < self._next_probe:
            return
        if self.machine.state is State.STARTING:
            self._probing = True
            self._next_probe = now + self.config.probe_interval_s
            self._spawn(self._probe_ready(launch), f"probe {launch.launch_id}")
        elif self.machine.state is State.READY:
            self._probing = True
            self._next_probe = now + self.config.health_interval_s
            self._spawn(self._probe_health(launch), f"health {launch.launch_id}")

    async def _probe_ready(self, launch: Launch) -> None:
        try:
            error = await self.prober.health(launch.spec)
            if error is None:
                # With this launch's key: an engine left over from another launch answers 401 here,
                # so a ready is never an orphan's.
                error = await self.prober.completion(launch.spec, self.engine_key(launch.launch_id))
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
            self._spawn(self.gateway_sync.check(launch), f"gateway check {launch.launch_id}")

    # ------------------------------------------------------------------------------------------
    # Adoption

    def engine_key(self, launch_id: str) -> str | None:
        """The launch's engine API key, for in-controller clients (POST /compare); never printed."""
        run = self.runs.get(launch_id)
        return run.engine_key if run is not None else None

    async def adopt(self) -> None:
        """A controller restart never kills a healthy engine: find ours and supervise it again."""
        found: list[EngineHandle] = []
        for rt in self.runtimes.values():
            try:
                found.extend(await asyncio.to_thread(rt.adopt))
            except EngineRuntimeError as exc:
                self.note("adopt-error", f"{rt.name} runtime: {exc}")
        if not found:
            return
        # First which engines can be supervised at all (a known spec), newest first; only then is
        # one chosen and the other ones stopped. An engine whose spec is unknown is never the reason
        # to stop a healthy one of ours (it was another appliance's container).
        found.sort(key=lambda h: h.started_at, reverse=True)
        known: list[tuple[EngineHandle, LaunchSpec, bool]] = []  # (handle, spec, spec from the store)
        for candidate in found:
            stored = self.store.get_spec(candidate.launch_id)
            if stored is not None:
                known.append((candidate, stored, True))
                continue
            if candidate.instance is None:
                # No instance label and not in our records: another appliance's engine launched before
                # instance ids existed, or a hand-made one. Never ours to supervise or stop.
                self.note("adopt-skipped", f"engine {candidate.ref} ({candidate.recipe}) carries no "
                          "appliance instance label and is not in this appliance's launch records: "
                          "left alone",
                          candidate.launch_id)
                continue
            planned = (await asyncio.to_thread(self.spec_for_recipe, candidate.recipe)
                       if self.spec_for_recipe is not None else None)
            if planned is None:
                self.note("adopt-skipped", f"engine {candidate.ref} ({candidate.recipe}) is running but its "
                          "launch spec is unknown: left alone, not supervised", candidate.launch_id)
                continue
            known.append((candidate, planned, False))
        if not known:
            return
        handle, spec, recorded = known[0]
        for extra, _, extra_recorded in known[1:]:
            # The host holds one engine at a time (DOMAIN §3); an older leftover of ours is stopped.
            self.note("adopt-extra", f"stopping older engine {extra.ref} ({extra.recipe})", extra.launch_id)
            info = await asyncio.to_thread(self._runtime(extra).stop, extra, self.machine.policy.stop_grace_s)
            if extra_recorded:
                self.store.mark_ended(extra.launch_id, self.clock.now(), "stopped", info)
        if not recorded:
            self.store.create_launch(handle.launch_id, spec, StartKind.ADOPTED.value, Provenance(),
                                     handle.started_at)
            self.store.set_handle(handle.launch_id, handle, handle.started_at)
        run = LaunchRun(handle.launch_id, LogFollower(handle.launch_id, started_at=handle.started_at))
        # The key lives only where the runtime put it for the engine (its key file): read it back
        # from there (or the recipe's own `--api-key`, when the spec at hand still holds it: a stored
        # spec is redacted).
        key: str | None = None
        try:
            key = await asyncio.to_thread(self._runtime(handle).read_engine_key, handle)
        except EngineRuntimeError as exc:
            self.note("adopt-key-unknown", f"cannot read the engine's API key: {exc}", handle.launch_id)
        own = recipe_key(spec)
        run.engine_key = key or (own if own != REDACTED else None)
        record = self.store.get_launch(handle.launch_id)
        if record is not None and record.ready_s is not None:
            run.recorded_ready_s = record.ready_s
        elif record is not None:
            # Adopted mid-start: its record is completed here like any start's — phases
            # after the adoption, ready time (MarkReady), cache verdict and the compile-cache evidence.
            try:
                run.compile = await asyncio.to_thread(compile_cache.resume, self.store, handle.launch_id,
                                                      spec, record.compile_cache)
            except (ValueError, OSError) as exc:  # a record this version cannot read: the start goes on
                self.note("compile-cache-warning", f"could not resume the compile-cache record: {exc}",
                          handle.launch_id)
        run.history = tuple(self.store.ready_history(spec.recipe, spec.spec_hash, exclude=handle.launch_id))
        target = await self._mem_target(spec)
        self.runs.begin(run)
        self.submit(Adopted(handle, spec, ready_recorded=run.recorded_ready_s is not None))
        launch = self.machine.launch
        if launch is None or launch.launch_id != handle.launch_id:
            self.runs.end(handle.launch_id)  # the machine did not take it: nothing to keep
            return
        # Not ready until it answers; the running recipe's floor, as at a start.
        self.metrics.adopt_launch(spec.recipe, min_mem_available_bytes=target)
        self._watch_death(handle)
        await self._follow(launch, replay=True)  # rebuild the phase picture without re-recording it

    # ------------------------------------------------------------------------------------------
    # Actions

    def _execute(self, action: Action) -> None:
        match action:
            case RunPreflight():
                self._spawn(self._preflight(action), f"preflight {action.recipe}")
            case StartEngine():
                self._spawn(self._start(action), f"start {action.launch_id}")
            case StopEngine():
                self._spawn(self._stop(action), f"stop {action.launch_id}")
            case DrainGateway():
                self._spawn(self._drain(action), f"drain {action.launch_id}")
            case SwitchUpstream():
                self._spawn(self._switch(action), f"switch to {action.launch_id}")
            case SetUpstream():
                point = self.gateway_sync.point_to(action.launch_id, action.base_url,
                                                   action.served_model_name)
                self._spawn(point, "gateway point")
            case ClearUpstream():
                hold = self._hold(action.hold) if action.hold is not None else None
                clear = self.gateway_sync.clear(action.retry_after_s, action.reason, hold, action.detail,
                                                self.clock.now())
                self._spawn(clear, "gateway clear")
            case MarkReady():
                self._mark_ready(action)
            case MarkEnded():
                self._mark_ended(action)
            case Notify():
                self.note(action.kind, action.message, action.launch_id, action.data)
            case Reject():
                pass

    async def _preflight(self, action: RunPreflight) -> None:
        answer = await self.preflight(action.token, action.recipe, action.fresh_cache)
        if isinstance(answer, PreflightOk):
            answer = await self._blue_green(answer)
        self.submit(answer)

    async def _blue_green(self, ok: PreflightOk) -> PreflightOk:
        """The launch moved to a free port and marked `beside` when it fits beside the serving engine
        (blue_green.py); unchanged otherwise (the switch then holds)."""
        m = self.machine
        serving = m.launch
        if (self.beside is None or not m.blue_green or m.state is not State.PREFLIGHT or ok.token != m.token
                or serving is None or serving.handle is None or m.old is not None):
            return ok
        if (not m.force and serving.spec.recipe == ok.spec.recipe
                and on_port(ok.spec, serving.spec.port).spec_hash == serving.spec.spec_hash):
            return ok  # the very launch that serves: the machine answers "unchanged"
        cold = ok.empty_cache_first is not None or ok.cache_empty
        try:
            fit = await asyncio.to_thread(self.beside, ok.spec.recipe, cold, serving.spec, serving.handle)
        except CHECK_ERRORS as exc:  # the check is an optimisation: a failed look means the hold path
            self.note("switch-path", f"hold: the blue/green check failed ({exc})", ok.launch_id,
                      {"path": "hold"})
            return ok
        data: dict[str, object] = {"path": "blue_green" if fit.fits else "hold", **fit.numbers}
        if not fit.fits:
            self.note("switch-path", f"hold, not blue/green: {fit.why}", ok.launch_id, data)
            return ok
        self.note("switch-path", f"blue/green: {fit.why}", ok.launch_id, data)
        return replace(ok, spec=moved(ok.spec, fit), beside=True)

    async def _start(self, action: StartEngine) -> None:
        now = self.clock.now()
        spec = action.spec
        if action.empty_cache_first is not None:
            root = Path(action.empty_cache_first)
            try:
                await asyncio.to_thread(shutil.rmtree, root)
                self.note("cache-emptied", f"emptied {root} (fresh_cache): a cold start", action.launch_id)
            except FileNotFoundError:
                pass
            except OSError as exc:
                self.note("cache-not-emptied", f"could not empty {root}: {exc}", action.launch_id)
        run = self.runs.begin(LaunchRun(action.launch_id, LogFollower(action.launch_id, started_at=now),
                                        cache_empty=action.cache_empty))
        prov = Provenance()
        if self.provenance is not None:
            try:
                prov = await asyncio.to_thread(self.provenance, spec)
            except (RuntimeError, OSError, ValueError) as exc:
                self.note("provenance-error", f"could not record versions: {exc}", action.launch_id)
        cold = action.kind is StartKind.COLD_WARMUP or run.cache_empty
        self.store.create_launch(action.launch_id, spec, action.kind.value, prov, now,
                                 start="cold" if cold else "warm")
        # The ETA's history, read once: earlier ready launches of this recipe
        # (appliance/observe/ready_eta.py).
        run.history = tuple(self.store.ready_history(spec.recipe, spec.spec_hash, exclude=action.launch_id))
        run.cold_start = cold
        self.metrics.begin_launch(spec.recipe, "cold" if cold else "warm", ready_budget_s=spec.ready_budget_s,
                                  min_mem_available_bytes=await self._mem_target(spec), started_at=now)
        if self.machine.failures > 0 and self.machine.last_failure is not None:
            self.metrics.record_restart(spec.recipe, self.machine.last_failure.code)
        key, deliver = launch_key(spec)
        # The engine's environment is the spec's alone: the key goes in its --config file
        # (appliance/engine_secret.py), which the compile factors leave out like vLLM does.
        await self._begin_compile(run, spec, {}, prov, emptied=action.empty_cache_first is not None)
        failure: Failure | None = None
        try:
            rt = self._runtime(spec)
            handle = await asyncio.to_thread(rt.start, spec, action.launch_id, deliver)
        except PortInUse as exc:
            # Retryable: the holder may be an engine of ours that is still going away.
            failure = Failure(
                DiagnosisCode.PORT_IN_USE.value, str(exc),
                "stop the process that holds the port (by PID), or give the recipe another engine.port",
                retryable=True)
        except EngineRuntimeError as exc:
            failure = Failure(
                "launch_failed", f"the {spec.kind} runtime could not start the engine: {exc}",
                "see the message: a missing interpreter, image or device is an installation problem",
                retryable=False)
        except OSError as exc:
            failure = Failure("launch_failed", f"could not start the engine: {exc}", "", retryable=True)
        if failure is not None:
            self.submit(LaunchFailed(action.launch_id, failure))
            self._forget_unless_current(action.launch_id)  # a failure the machine ignored: no MarkEnded
            return
        run.engine_key = key
        self.store.set_handle(action.launch_id, handle, self.clock.now())
        run.follower.started_at = self.clock.now()
        self.submit(Launched(action.launch_id, handle))
        launch = self.machine.launch
        if launch is not None and launch.launch_id == action.launch_id:
            self._watch_death(handle)

    async def _stop(self, action: StopEngine) -> None:
        rt = self._runtime(action.handle)
        info: ExitInfo | None = None
        for attempt in range(1, self.config.stop_retries + 1):
            try:
                info = await asyncio.to_thread(rt.stop, action.handle, action.grace_s)
                break
            except EngineRuntimeError as exc:
                self.note("stop-error", f"stop attempt {attempt}: {exc}", action.launch_id)
                info = await asyncio.to_thread(rt.inspect, action.handle)
                if not info.running:
                    break
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
        result = await self.gateway_sync.switch(action.launch_id, action.base_url, action.served_model_name,
                                                action.deadline_s)
        cut = result.aborted if result is not None else 0
        self.metrics.record_switch("blue_green", cut)
        said = ("" if result is None else
                f"; {cut} in-flight request(s) on the old engine cut at the drain deadline of "
                f"{action.deadline_s:g} s" if cut else f"; the old engine's requests finished in "
                f"{result.waited_s:.1f} s")
        self.note("switched", f"blue/green: the gateway routes to {action.base_url}{said}; stopping the "
                  "old engine", action.launch_id,
                  {"path": "blue_green", "cut": cut, "old_launch_id": action.old_id,
                   "waited_s": None if result is None else round(result.waited_s, 3)})
        self.submit(Drained(action.old_id))

    async def _drain(self, action: DrainGateway) -> None:
        hold = self._hold(action.hold) if action.hold is not None else None
        path = "hold" if hold is not None else "stop"
        if hold is not None:
            self.note("switch-path", f"{hold.reason}: drain, stop, start; the gateway holds new requests "
                      f"meanwhile (each up to {hold.wait_s:g} s)", action.launch_id,
                      {"path": path, "wait_s": hold.wait_s, "expected_ready_s": hold.expected_ready_s})
        result = await self.gateway_sync.drain(action.launch_id, action.deadline_s,
                                                self.machine.policy.retry_after_s, hold, self.clock.now())
        cut = result.aborted if result is not None else 0
        self.metrics.record_switch(path, cut)
        if result is not None:
            said = (f"{cut} in-flight request(s) cut at the drain deadline of {action.deadline_s:g} s"
                    if cut else f"in-flight requests finished in {result.waited_s:.1f} s")
            self.note("drained", f"drained before the stop: {said}", action.launch_id,
                      {"cut": cut, "waited_s": round(result.waited_s, 3), "path": path})
        self.submit(Drained(action.launch_id))

    # ------------------------------------------------------------------------------------------
    # The gateway's hold during a planned switch (hold_plan.py, controller/gateway/hold.py)

    def _hold(self, reason: str) -> HoldPlan:
        """The hold to begin now: its bound from the target's history."""
        self._hold_floor_s = 0.0
        self._next_hold_renewal = self.clock.now() + self.config.hold.renew_s
        plan = hold_plan(reason, self._expected_ready_s(), self.config.hold)
        self._hold_floor_s = plan.wait_s
        return plan

    def _expected_ready_s(self) -> float | None:
        """Seconds until the engine being switched to is expected ready (None: no history)."""
        m, now = self.machine, self.clock.now()
        launch = m.launch
        if m.state is State.STARTING and launch is not None:
            expected = status_view.eta(launch, self.runs.get(launch.launch_id), now)
            if expected is not None and expected.remaining_s is not None:
                return max(0.0, expected.remaining_s)
        spec = m.pending.spec if m.pending is not None else (launch.spec if launch is not None else None)
        recipe = spec.recipe if spec is not None else m.recipe
        if recipe is None:
            return None
        history = self.store.ready_history(recipe, spec.spec_hash if spec is not None else "")
        ready = expected_ready_s(history, spec.spec_hash if spec is not None else None)
        if ready is None:
            return None
        if m.state is State.BACKOFF and m.backoff_until is not None:
            ready += max(0.0, m.backoff_until - now)
        return ready

    def _renew_hold(self) -> None:
        """While a switch goes on, send the gateway a later estimate and a fresh lease (a hold the
        controller stops renewing lapses: a dead controller leaves nobody waiting long)."""
        reason = self.gateway_sync.holding
        now = self.clock.now()
        if reason is None or self.machine.state in (State.READY, State.IDLE, State.FAILED):
            return
        if now < self._next_hold_renewal:
            return
        self._next_hold_renewal = now + self.config.hold.renew_s
        plan = hold_plan(reason, self._expected_ready_s(), self.config.hold, floor_s=self._hold_floor_s)
        self._hold_floor_s = plan.wait_s
        self._spawn(self.gateway_sync.renew_hold(plan, now), "gateway hold renewal")

    def switch_plan(self, recipe: str, spec_hash: str | None = None, *,
                    restart: bool = False) -> dict[str, object]:
        """Which path a switch to `recipe` takes now and why, with the numbers (hold_plan.switch_view);
        `restart`: the restart's path, or an apply without blue/green (they always drain first)."""
        history = self.store.ready_history(recipe, spec_hash or "")
        expected = expected_ready_s(history, spec_hash)
        launch = self.machine.launch
        ready = self.machine.state is State.READY and launch is not None and self.machine.old is None
        serving = launch.spec.recipe if ready and launch is not None else None
        plan = hold_plan("restart" if serving == recipe else f"switching to {recipe}", expected,
                         self.config.hold)
        fit: Fit | None = None
        if ready and not restart and self.beside is not None and launch is not None and launch.handle:
            try:
                fit = self.beside(recipe, None, launch.spec, launch.handle)
            except CHECK_ERRORS as exc:  # a preview: the switch itself decides again
                fit = Fit(False, f"the blue/green check failed ({exc})")
        return switch_view(serving, recipe, plan, len(history), fit)

    def hold_status(self) -> dict[str, Any] | None:
        """The gateway's hold during a switch, for the status: reason, bound, requests held (None
        until the gateway said), seconds to the expected ready time."""
        view = self.gateway_sync.hold_view
        if view is None or self.gateway_sync.holding is None or self.machine.state is State.READY:
            return None
        ready_in = view.get("ready_in_s")
        at = view.get("at")
        if isinstance(ready_in, int | float) and isinstance(at, int | float):
            ready_in = max(0.0, ready_in - (self.clock.now() - at))
        return {"reason": view["reason"], "wait_s": view["wait_s"], "waiting": view["waiting"],
                "ready_in_s": None if ready_in is None else round(float(ready_in), 1)}

    def _mark_ready(self, action: MarkReady) -> None:
        now = self.clock.now()
        self.store.mark_ready(action.launch_id, now, action.ready_s)
        launch = self.machine.launch
        run = self.runs.get(action.launch_id)
        follower = run.follower if run is not None else None
        if launch is None or launch.launch_id != action.launch_id:
            return
        cold = launch.kind is StartKind.COLD_WARMUP or (run is not None and run.cache_empty)
        start = "cold" if cold else "warm"
        self.metrics.record_ready(launch.spec.recipe, start, action.ready_s)
        if self.on_ready is not None and launch.handle is not None:
            self._spawn(self.on_ready(action.launch_id, launch.spec, launch.handle), "on-ready hook")
        outcome = follower.tracker.cache_outcome if follower else CacheOutcome.UNKNOWN
        self.metrics.record_compile_cache(launch.spec.recipe, start, outcome.value)
        if launch.kind is StartKind.WARM and outcome is not CacheOutcome.HIT:
            # ARCHITECTURE "Warm-cache restart": verify the hit from the log; a miss is reported.
            evidence = list(follower.tracker.cache_evidence) if follower else []
            message = f"the warm start did not prove a compile-cache hit ({outcome.value})"
            self.note("warm-restart-miss", message, action.launch_id, {"evidence": evidence})

    def _mark_ended(self, action: MarkEnded) -> None:
        now = self.clock.now()
        # The one place a launch's state goes: all of it, whatever happens below.
        run = self.runs.end(action.launch_id)
        info = run.exit if run is not None else None
        diagnosis = run.diagnosis if run is not None else None
        follower = run.follower if run is not None else None
        failure = action.failure
        spec = self.store.get_spec(action.launch_id)
        if spec is not None and not action.replaced:
            # exited, stopped or never started: not ready any more (the old engine of a blue/green
            # switch: its series were the new launch's from its start on).
            self.metrics.end_launch(spec.recipe)
        current = self.machine.launch
        if self.machine.state is State.READY and current is not None:
            # A blue/green start that failed beside the same recipe: the old one still serves.
            self.metrics.set_engine_ready(current.spec.recipe)
        machine_diagnosed = failure is not None and failure.code in _MACHINE_DIAGNOSED
        if failure is not None and machine_diagnosed and diagnosis is None and spec is not None:
            # The machine decided (stall, budget): classify with the same rules over the same evidence
            # (an OOM record or a known signature in the tail outranks "stalled").
            started = follower.started_at if follower else now
            launch = Launch(action.launch_id, spec, StartKind.NORMAL, started_at=started)
            diagnosis = self._diagnose(
                launch, info, run, stalled=failure.code == DiagnosisCode.STALLED,
                over_budget=failure.code == DiagnosisCode.READY_BUDGET_EXCEEDED,
            )
        diag_dict: dict[str, Any] | None = None
        if diagnosis is not None:
            diag_dict = diagnosis.model_dump(mode="json", exclude={"findings"})
        elif failure is not None:
            diag_dict = status_view.failure_dict(failure)
        if diag_dict is not None:
            diag_dict["launch_id"] = action.launch_id
            # The status shows the failed launch's last log lines beside its diagnosis (the record
            # keeps its own, longer tail in the store's log_tail column).
            tail = follower.tail_lines()[-status_view.FAILED_TAIL_LINES:] if follower else ()
            self.last_diagnosis = {**diag_dict, "log_tail": list(tail)}
        self.store.mark_ended(action.launch_id, now, action.status, info, diag_dict,
                              follower.tail_text() if follower else None)

    def _forget_unless_current(self, launch_id: str) -> None:
        """Drop a launch's state when the machine has no such launch (it ignored a late answer)."""
        launch = self.machine.launch
        if launch is None or launch.launch_id != launch_id:
            self.runs.end(launch_id)

    async def _mem_target(self, spec: LaunchSpec) -> int | None:
        """The recipe's MemAvailable floor (recipe_target.py), loaded off the loop."""
        if self.mem_target is None:
            return None
        return await asyncio.to_thread(self.mem_target, spec.recipe)

    # ------------------------------------------------------------------------------------------
    # Events and status

    def note(self, kind: str, message: str, launch_id: str | None = None,
              data: Mapping[str, object] | None = None) -> None:
        record = self.store.add_event(kind, message, self.clock.now(), launch_id, data)
        self._publish({"type": "event", **record.model_dump()})

    def _publish(self, event: dict[str, Any]) -> None:
        for queue in list(self._subscribers):
            if queue.full():
                continue  # a stuck client loses events, never blocks the supervisor
            queue.put_nowait(event)

    @contextlib.asynccontextmanager
    async def subscribe(self, maxsize: int = 1000) -> AsyncIterator[asyncio.Queue[dict[str, Any]]]:
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=maxsize)
        self._subscribers.add(queue)
        try:
            yield queue
        finally:
            self._subscribers.discard(queue)

    def status(self) -> dict[str, Any]:
        launch = self.machine.launch
        run = self.runs.get(launch.launch_id) if launch is not None else None
        return {**status_view.status(self.machine, run, self.clock.now(), self.last_diagnosis),
                "store_problem": self.store_problem, "hold": self.hold_status(),
                "blue_green": self._blue_green_status()}

    def _blue_green_status(self) -> dict[str, Any] | None:
        """The other engine of a blue/green switch: still serving (the new one starts beside it) or
        being drained and stopped (the gateway routes to the new one). None: one engine."""
        m = self.machine
        if m.old is None:
            return None
        return {"old_launch_id": m.old.launch_id, "old_recipe": m.old.spec.recipe,
                "old_url": m.old.spec.base_url, "old": "stopping" if m.switched else "serving"}


# The failures the machine itself decides; their codes are appliance.diagnosis.signatures's, so the driver's
# re-diagnosis over the evidence and the machine's own verdict use one spelling.
_MACHINE_DIAGNOSED = frozenset({DiagnosisCode.STALLED.value, DiagnosisCode.READY_BUDGET_EXCEEDED.value})
