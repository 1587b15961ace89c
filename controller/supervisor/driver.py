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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from appliance.diagnosis import Diagnosis, DiagnosisCode, FailureFacts, diagnose
from appliance.kmsg import OomEvent
from appliance.launch_spec import LaunchSpec
from appliance.log_phases import PHASE_LABELS, CacheOutcome, PhaseEvent
from appliance.phase_record import event_label
from controller import metrics
from controller.runtime.base import EngineHandle, ExitInfo, Runtime, RuntimeError_
from controller.runtime.ports import PortInUse
from controller.store import REDACTED, Provenance, Store
from controller.supervisor.engine_key import ENGINE_KEY_ENV, launch_key, recipe_key
from controller.supervisor.follow import LogFollower
from controller.supervisor.gateway_link import GatewayError, GatewayLink, same_upstream
from controller.supervisor.machine import Launch, Machine, Policy, State, progress, transition
from controller.supervisor.probes import Prober, reachable_url
from controller.supervisor.signals import (
    Action,
    Adopted,
    ApplyOutcome,
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
    Tick,
)

log = logging.getLogger(__name__)

PreflightFn = Callable[[int, str, bool], Awaitable[PreflightOk | PreflightFailed]]
ProvenanceFn = Callable[[LaunchSpec], Provenance]
SpecForRecipe = Callable[[str], LaunchSpec | None]
OomSource = Callable[[str], Sequence[OomEvent]]


class Clock(Protocol):
    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """Wall-clock seconds: launch records and adopted engines' start times are wall clock too."""

    def now(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


@dataclass(frozen=True)
class DriverConfig:
    poll_interval_s: float = 1.0
    probe_interval_s: float = 2.0  # readiness probes while starting
    health_interval_s: float = 10.0  # liveness probes while ready
    health_failures: int = 3  # consecutive failed health probes → HealthLost
    # The kernel's OOM record can trail the process's death a little; wait this long for the kmsg
    # watch before classifying an exit (its detection latency goal is < 1 s, issue 4).
    oom_settle_s: float = 1.0
    stop_retries: int = 3
    # While ready: ask the gateway (GET /admin/upstream) whether it still routes to the engine. A
    # gateway restarted under a running controller has no slot and answers 503 until told again.
    gateway_check_interval_s: float = 10.0
    # A thread per engine blocks in Runtime.wait (pidfd / docker) so that a death is known at once,
    # not at the next poll (issue 9); it re-checks that its launch is still current this often.
    watch_exits: bool = True
    exit_watch_s: float = 30.0


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
        on_launch: Callable[[LaunchSpec], None] | None = None,
    ) -> None:
        self.runtimes = dict(runtimes)
        self.store = store
        self.preflight = preflight
        self.prober = prober
        self.gateway = gateway
        self.clock = clock or SystemClock()
        self.config = config or DriverConfig()
        self.provenance = provenance
        self.spec_for_recipe = spec_for_recipe
        self.oom_events = oom_events
        self.on_launch = on_launch  # the host watch: publishes the recipe's MemAvailable target (blocking)
        self.m = Machine(policy=policy or Policy())
        self.last_diagnosis: dict[str, Any] | None = None
        self._followers: dict[str, LogFollower] = {}
        self._exits: dict[str, ExitInfo] = {}
        self._diagnoses: dict[str, Diagnosis] = {}
        self._cache_empty: dict[str, bool] = {}
        self._probe_error: dict[str, str] = {}
        self._exiting: set[str] = set()
        self._probing = False
        self._next_probe = 0.0
        self._health_failures = 0
        self._checking_gateway = False
        self._next_gateway_check = 0.0
        self._gateway_unreachable = False
        self._cache_seen: dict[str, CacheOutcome] = {}
        self._engine_seen: dict[str, dict[str, object]] = {}
        self._recorded_ready_s: dict[str, float] = {}  # adopted engines: their start as recorded
        # The per-launch engine API key (engine_key.py): in memory only, never stored or printed.
        self._engine_keys: dict[str, str | None] = {}
        self._exit_seen: dict[str, ExitInfo] = {}
        self._watched: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._subscribers: set[asyncio.Queue[dict[str, Any]]] = set()
        self._gateway_lock = asyncio.Lock()
        # Called (as a task) when a launch becomes ready: the kernel-path/deployment proof
        # (controller/evaluation/proof.py, DOMAIN §7). None: nothing extra at ready.
        self.on_ready: Callable[[str, LaunchSpec, EngineHandle], Coroutine[Any, Any, None]] | None = None
        metrics.set_engine_state(self.m.state.value)

    # ------------------------------------------------------------------------------------------
    # The machine

    def submit(self, obs: Observation) -> Reject | None:
        """Run one transition and start its actions. Never awaits: atomic within the event loop."""
        before = self.m
        self.m, actions = transition(before, obs, self.clock.now())
        if self.m.state is not before.state:
            self._state_changed()
        rejected: Reject | None = None
        for action in actions:
            if isinstance(action, Reject):
                rejected = action
            else:
                self._execute(action)
        return rejected

    def _state_changed(self) -> None:
        m = self.m
        metrics.set_engine_state(m.state.value)
        if m.state is State.READY and m.launch is not None:
            # Every way into ready, including an adopted engine (it has no MarkReady: its start was
            # measured by the controller that launched it).
            metrics.set_engine_ready(m.launch.spec.recipe)
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
        """Step every poll interval until `stop` (the service adopts first, then runs this)."""
        while not stop.is_set():
            await self.step()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.config.poll_interval_s)

    async def step(self) -> None:
        """One look at the world, then Tick."""
        launch = self.m.launch
        if launch is not None and launch.handle is not None:
            await self._follow(launch)
            await self._watch_exit(launch)
            self._watch_readiness(launch)
            self._watch_gateway(launch)
        self.submit(Tick())

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
            raise RuntimeError_(f"no {kind!r} runtime is configured in this controller")
        return rt

    async def _follow(self, launch: Launch, replay: bool = False) -> None:
        handle = launch.handle
        follower = self._followers.get(launch.launch_id)
        if handle is None or follower is None:
            return
        rt = self._runtime(handle)
        text, offset = await asyncio.to_thread(rt.read_logs, handle, follower.offset)
        now = self.clock.now()
        events = follower.feed(text, offset, now)
        for event in events:
            if replay:
                follower.recorder.keep(event)  # recorded by the controller that saw it first
            else:
                self._phase(launch, follower, event, now)
        self._record_cache(launch, follower)
        self._record_engine(launch, follower)
        if self.m.state is State.STARTING:
            cpu = await asyncio.to_thread(rt.cpu_seconds, handle)
            self.submit(CpuSample(launch.launch_id, cpu))

    def _phase(self, launch: Launch, follower: LogFollower, event: PhaseEvent, now: float) -> None:
        elapsed = now - follower.started_at
        detail = event.detail or ""
        # One row per phase (per capture round: first and last step), labelled from the event itself
        # (appliance/phase_record.py); every event still restarts the stall clock.
        keep = follower.recorder.keep(event)
        if keep:
            self.store.add_phase(launch.launch_id, event.phase.value, now, elapsed, event.line[:300])
        metrics.set_engine_phase(launch.spec.recipe, event.phase.value, elapsed)
        label = follower.tracker.describe()
        self.submit(PhaseSeen(launch.launch_id, event.phase.value, event_label(event), recorded=keep))
        self._publish({
            "type": "phase", "launch_id": launch.launch_id, "phase": event.phase.value,
            "label": PHASE_LABELS[event.phase], "describe": label, "detail": detail,
            "elapsed_s": round(elapsed, 1), "progress": progress(self.m, now),
        })

    def _record_engine(self, launch: Launch, follower: LogFollower) -> None:
        """Engine facts (appliance/engine_facts.py) and the start's own seconds → the launch record."""
        summary = follower.tracker.summary()
        seconds = {"weights_seconds": summary.weights_seconds, "weights_gib": summary.weights_gib,
                   "compile_seconds": summary.compile_seconds,
                   "init_engine_seconds": summary.init_engine_seconds}
        facts = {**follower.facts.facts.model_dump(mode="json", exclude_none=True),
                 **{k: v for k, v in seconds.items() if v is not None}}
        if facts and facts != self._engine_seen.get(launch.launch_id):
            self._engine_seen[launch.launch_id] = facts
            self.store.set_engine_facts(launch.launch_id, facts)

    def _record_cache(self, launch: Launch, follower: LogFollower) -> None:
        outcome = follower.tracker.cache_outcome
        if outcome is CacheOutcome.UNKNOWN or self._cache_seen.get(launch.launch_id) is outcome:
            return
        self._cache_seen[launch.launch_id] = outcome
        self.store.set_cache(launch.launch_id, outcome.value)

    async def _watch_exit(self, launch: Launch) -> None:
        """The poll-time look (the fallback: the exit watcher normally saw it first)."""
        handle = launch.handle
        if handle is None or self.m.state is State.STOPPING or launch.launch_id in self._exiting:
            return
        info = await asyncio.to_thread(self._runtime(handle).inspect, handle)
        if not info.running:
            self._exit_noticed(launch.launch_id, info)

    def _exit_noticed(self, launch_id: str, info: ExitInfo) -> None:
        """The engine ended: out of the gateway now (ExitSeen), classified after the OOM settle."""
        launch = self.m.launch
        if (launch is None or launch.launch_id != launch_id or self.m.state is State.STOPPING
                or launch_id in self._exiting):
            return
        self._exiting.add(launch_id)
        self._exit_seen[launch_id] = info
        self.submit(ExitSeen(launch_id, info))
        self._spawn(self._classify_exit(launch, info), f"classify-exit {launch_id}")

    def _watch_death(self, handle: EngineHandle) -> None:
        """A daemon thread blocked in Runtime.wait for this engine (a daemon: a controller exit is
        never held up by it; the engine is adopted next time). It reports back on the loop."""
        if not self.config.watch_exits or handle.launch_id in self._watched:
            return
        loop = asyncio.get_running_loop()
        self._watched.add(handle.launch_id)
        rt = self._runtime(handle)

        def current() -> bool:
            launch = self.m.launch
            return launch is not None and launch.launch_id == handle.launch_id and not loop.is_closed()

        def watch() -> None:
            try:
                while current():
                    info = rt.wait(handle, self.config.exit_watch_s)
                    if not info.running:
                        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                            loop.call_soon_threadsafe(self._exit_noticed, handle.launch_id, info)
                        return
            except (RuntimeError_, OSError) as exc:
                log.warning("exit watch of %s ended: %s (the poll still sees it)", handle.launch_id, exc)
            finally:
                self._watched.discard(handle.launch_id)

        threading.Thread(target=watch, name=f"exit-watch {handle.launch_id}", daemon=True).start()

    async def _classify_exit(self, launch: Launch, info: ExitInfo) -> None:
        await self.clock.sleep(self.config.oom_settle_s)
        await self._follow(launch)
        diagnosis = self._diagnose(launch, info, self._followers.get(launch.launch_id))
        self._exits[launch.launch_id] = info
        self._diagnoses[launch.launch_id] = diagnosis
        self.submit(Exited(launch.launch_id, info, failure_of(diagnosis)))

    def _diagnose(
        self, launch: Launch, info: ExitInfo | None, follower: LogFollower | None, *,
        stalled: bool = False, over_budget: bool = False,
    ) -> Diagnosis:
        tracker = follower.tracker if follower else None
        now = self.clock.now()
        facts = FailureFacts(
            exit_code=info.exit_code if info else None,
            signal=info.signal if info else None,
            oom_killed=info.oom_killed if info else None,
            runtime_reason=info.reason if info else None,
            log_tail=follower.tail_lines() if follower else (),
            oom_events=tuple(self.oom_events(launch.launch_id)) if self.oom_events else (),
            phase_reached=tracker.furthest if tracker else None,
            progress=tracker.describe() if tracker and tracker.current else None,
            stalled=stalled,
            over_budget=over_budget,
            elapsed_s=now - launch.started_at,
            budget_s=float(launch.spec.ready_budget_s),
            probe_error=self._probe_error.get(launch.launch_id),
        )
        return diagnose(facts)

    def _watch_readiness(self, launch: Launch) -> None:
        now = self.clock.now()
        if self._probing or now < self._next_probe:
            return
        if self.m.state is State.STARTING:
            self._probing = True
            self._next_probe = now + self.config.probe_interval_s
            self._spawn(self._probe_ready(launch), f"probe {launch.launch_id}")
        elif self.m.state is State.READY:
            self._probing = True
            self._next_probe = now + self.config.health_interval_s
            self._spawn(self._probe_health(launch), f"health {launch.launch_id}")

    async def _probe_ready(self, launch: Launch) -> None:
        try:
            error = await self.prober.health(launch.spec)
            if error is None:
                # With this launch's key: an engine left over from another launch answers 401 here,
                # so a ready is never an orphan's (issue 9).
                error = await self.prober.completion(launch.spec, self._engine_keys.get(launch.launch_id))
        finally:
            self._probing = False
        if error is None:
            self._probe_error.pop(launch.launch_id, None)
            await self._follow(launch)  # the phases up to "API up" belong to the start
            self.submit(ReadyProbed(launch.launch_id))
        else:
            self._probe_error[launch.launch_id] = error

    async def _probe_health(self, launch: Launch) -> None:
        try:
            error = await self.prober.health(launch.spec)
        finally:
            self._probing = False
        if error is None:
            self._health_failures = 0
            return
        self._health_failures += 1
        self._probe_error[launch.launch_id] = error
        if self._health_failures >= self.config.health_failures:
            self._health_failures = 0
            detail = f"{self.config.health_failures} health probes failed: {error}"
            self.submit(HealthLost(launch.launch_id, detail))

    def _watch_gateway(self, launch: Launch) -> None:
        now = self.clock.now()
        if self.m.state is not State.READY or self._checking_gateway or now < self._next_gateway_check:
            return
        self._checking_gateway = True
        self._next_gateway_check = now + self.config.gateway_check_interval_s
        self._spawn(self._check_gateway(launch), f"gateway check {launch.launch_id}")

    async def _check_gateway(self, launch: Launch) -> None:
        """Re-send the upstream when the gateway routes elsewhere or nowhere (it restarted, or the
        point_to at ready time failed). Under the gateway lock: a drain or clear is never undone."""
        try:
            async with self._gateway_lock:
                current = self.m.launch.launch_id if self.m.launch is not None else None
                if self.m.state is State.READY and current == launch.launch_id:
                    await self._reassert_upstream(launch)
        finally:
            self._checking_gateway = False

    async def _reassert_upstream(self, launch: Launch) -> None:
        url, model = reachable_url(launch.spec), launch.spec.served_model_name
        try:
            found = await self.gateway.current()
            if not same_upstream(found, url, model):
                await self.gateway.point_to(url, model, self._engine_keys.get(launch.launch_id))
        except GatewayError as exc:
            if not self._gateway_unreachable:  # said once per outage, not every check
                self._gateway_unreachable = True
                self.note("gateway-error", f"upstream check: {exc}", launch.launch_id)
            return
        if self._gateway_unreachable:
            self._gateway_unreachable = False
            self.note("gateway-reachable", "the gateway answers again", launch.launch_id)
        if not same_upstream(found, url, model):
            was = {"url": found.url, "served_model": found.served_model} if found else None
            self.note("gateway-upstream-restored",
                      f"the gateway routed to {found.url if found else 'nothing'}: upstream {url} sent again",
                      launch.launch_id, {"found": was, "url": url, "served_model": model})

    # ------------------------------------------------------------------------------------------
    # Adoption

    def engine_key(self, launch_id: str) -> str | None:
        """The launch's engine API key, for in-controller clients (POST /compare); never printed."""
        return self._engine_keys.get(launch_id)

    async def adopt(self) -> None:
        """A controller restart never kills a healthy engine: find ours and supervise it again."""
        found: list[EngineHandle] = []
        for rt in self.runtimes.values():
            try:
                found.extend(await asyncio.to_thread(rt.adopt))
            except RuntimeError_ as exc:
                self.note("adopt-error", f"{rt.name} runtime: {exc}")
        if not found:
            return
        found.sort(key=lambda h: h.started_at)
        handle = found[-1]
        for extra in found[:-1]:
            # The host holds one engine at a time (DOMAIN §3); an older leftover is stopped.
            self.note("adopt-extra", f"stopping older engine {extra.ref} ({extra.recipe})", extra.launch_id)
            info = await asyncio.to_thread(self._runtime(extra).stop, extra, self.m.policy.stop_grace_s)
            self.store.mark_ended(extra.launch_id, self.clock.now(), "stopped", info)
        spec = self.store.get_spec(handle.launch_id)
        if spec is None and self.spec_for_recipe is not None:
            spec = await asyncio.to_thread(self.spec_for_recipe, handle.recipe)
            if spec is not None:
                self.store.create_launch(handle.launch_id, spec, StartKind.ADOPTED.value, Provenance(),
                                         handle.started_at)
                self.store.set_handle(handle.launch_id, handle, handle.started_at)
        if spec is None:
            self.note("adopt-skipped", f"engine {handle.ref} ({handle.recipe}) is running but its launch "
                       "spec is unknown: left alone, not supervised", handle.launch_id)
            return
        self._followers[handle.launch_id] = LogFollower(handle.launch_id, started_at=handle.started_at)
        # The key lives only in the engine's environment: read it back from there (or the recipe's
        # own `--api-key`, when the spec at hand still holds it: a stored spec is redacted).
        key: str | None = None
        try:
            key = await asyncio.to_thread(self._runtime(handle).engine_env_value, handle, ENGINE_KEY_ENV)
        except RuntimeError_ as exc:
            self.note("adopt-key-unknown", f"cannot read the engine's API key: {exc}", handle.launch_id)
        own = recipe_key(spec)
        self._engine_keys[handle.launch_id] = key or (own if own != REDACTED else None)
        record = self.store.get_launch(handle.launch_id)
        if record is not None and record.ready_s is not None:
            self._recorded_ready_s[handle.launch_id] = record.ready_s
        self.submit(Adopted(handle, spec))
        if self.on_launch is not None:
            await asyncio.to_thread(self.on_launch, spec)
        launch = self.m.launch
        if launch is not None and launch.launch_id == handle.launch_id:
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
            case SetUpstream():
                self._spawn(self._gateway_call("point_to", action.launch_id), "gateway point")
            case ClearUpstream():
                self._spawn(self._gateway_clear(action), "gateway clear")
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
            self._cache_empty[answer.launch_id] = answer.cache_empty
        self.submit(answer)

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
        self._followers[action.launch_id] = LogFollower(action.launch_id, started_at=now)
        prov = Provenance()
        if self.provenance is not None:
            try:
                prov = await asyncio.to_thread(self.provenance, spec)
            except (RuntimeError, OSError, ValueError) as exc:
                self.note("provenance-error", f"could not record versions: {exc}", action.launch_id)
        self.store.create_launch(action.launch_id, spec, action.kind.value, prov, now)
        cold = action.kind is StartKind.COLD_WARMUP or self._cache_empty.get(action.launch_id, False)
        metrics.begin_launch(spec.recipe, "cold" if cold else "warm", ready_budget_s=spec.ready_budget_s,
                             min_mem_available_bytes=None, started_at=now)
        if self.on_launch is not None:
            await asyncio.to_thread(self.on_launch, spec)
        if self.m.failures > 0 and self.m.last_failure is not None:
            metrics.record_restart(spec.recipe, self.m.last_failure.code)
        key, secret_env = launch_key(spec)
        try:
            rt = self._runtime(spec)
            handle = await asyncio.to_thread(rt.start, spec, action.launch_id, secret_env)
        except PortInUse as exc:
            # Retryable: the holder may be an engine of ours that is still going away.
            self.submit(LaunchFailed(action.launch_id, Failure(
                DiagnosisCode.PORT_IN_USE.value, str(exc),
                "stop the process that holds the port (by PID), or give the recipe another engine.port",
                retryable=True)))
            return
        except RuntimeError_ as exc:
            self.submit(LaunchFailed(action.launch_id, Failure(
                "launch_failed", f"the {spec.kind} runtime could not start the engine: {exc}",
                "see the message: a missing interpreter, image or device is an installation problem",
                retryable=False)))
            return
        except OSError as exc:
            self.submit(LaunchFailed(action.launch_id, Failure(
                "launch_failed", f"could not start the engine: {exc}", "", retryable=True)))
            return
        self._engine_keys[action.launch_id] = key
        self.store.set_handle(action.launch_id, handle, self.clock.now())
        self._followers[action.launch_id].started_at = self.clock.now()
        self.submit(Launched(action.launch_id, handle))
        launch = self.m.launch
        if launch is not None and launch.launch_id == action.launch_id:
            self._watch_death(handle)

    async def _stop(self, action: StopEngine) -> None:
        rt = self._runtime(action.handle)
        info: ExitInfo | None = None
        for attempt in range(1, self.config.stop_retries + 1):
            try:
                info = await asyncio.to_thread(rt.stop, action.handle, action.grace_s)
                break
            except RuntimeError_ as exc:
                self.note("stop-error", f"stop attempt {attempt}: {exc}", action.launch_id)
                info = await asyncio.to_thread(rt.inspect, action.handle)
                if not info.running:
                    break
        if info is None or info.running:
            # Never report a running engine as stopped: the host cannot hold two.
            self.note("stop-failed", "the engine did not stop; it stays under supervision", action.launch_id)
            return
        launch = self.m.launch
        if launch is not None and launch.launch_id == action.launch_id:
            await self._follow(launch)
        self._exits[action.launch_id] = info
        self.submit(Stopped(action.launch_id, info))

    async def _drain(self, action: DrainGateway) -> None:
        async with self._gateway_lock:
            try:
                await self.gateway.drain(action.deadline_s, self.m.policy.retry_after_s)
            except GatewayError as exc:
                self.note("gateway-error", f"drain: {exc}", action.launch_id)
        self.submit(Drained(action.launch_id))

    async def _gateway_call(self, what: str, launch_id: str) -> None:
        async with self._gateway_lock:
            launch = self.m.launch
            if launch is None or launch.launch_id != launch_id or self.m.state is not State.READY:
                return  # it stopped being ready before we got here
            try:
                await self.gateway.point_to(reachable_url(launch.spec), launch.spec.served_model_name,
                                            self._engine_keys.get(launch_id))
            except GatewayError as exc:
                self.note("gateway-error", f"{what}: {exc}", launch_id)

    async def _gateway_clear(self, action: ClearUpstream) -> None:
        async with self._gateway_lock:
            try:
                await self.gateway.clear(action.retry_after_s)
            except GatewayError as exc:
                self.note("gateway-error", f"clear ({action.reason}): {exc}")

    def _mark_ready(self, action: MarkReady) -> None:
        now = self.clock.now()
        self.store.mark_ready(action.launch_id, now, action.ready_s)
        launch = self.m.launch
        follower = self._followers.get(action.launch_id)
        if launch is None or launch.launch_id != action.launch_id:
            return
        cold = launch.kind is StartKind.COLD_WARMUP or self._cache_empty.get(action.launch_id, False)
        start = "cold" if cold else "warm"
        metrics.record_ready(launch.spec.recipe, start, action.ready_s)
        if self.on_ready is not None and launch.handle is not None:
            self._spawn(self.on_ready(action.launch_id, launch.spec, launch.handle), "on-ready hook")
        outcome = follower.tracker.cache_outcome if follower else CacheOutcome.UNKNOWN
        metrics.record_compile_cache(launch.spec.recipe, start, outcome.value)
        if launch.kind is StartKind.WARM and outcome is not CacheOutcome.HIT:
            # ARCHITECTURE "Warm-cache restart": verify the hit from the log; a miss is reported.
            evidence = list(follower.tracker.cache_evidence) if follower else []
            message = f"the warm start did not prove a compile-cache hit ({outcome.value})"
            self.note("warm-restart-miss", message, action.launch_id, {"evidence": evidence})

    def _mark_ended(self, action: MarkEnded) -> None:
        now = self.clock.now()
        info = self._exits.pop(action.launch_id, None)
        diagnosis = self._diagnoses.pop(action.launch_id, None)
        follower = self._followers.pop(action.launch_id, None)
        failure = action.failure
        spec = self.store.get_spec(action.launch_id)
        if spec is not None:
            metrics.end_launch(spec.recipe)  # exited, stopped or never started: not ready any more
        machine_diagnosed = failure is not None and failure.code in _MACHINE_DIAGNOSED
        if failure is not None and machine_diagnosed and diagnosis is None and spec is not None:
            # The machine decided (stall, budget): classify with the same rules over the same evidence
            # (an OOM record or a known signature in the tail outranks "stalled").
            started = follower.started_at if follower else now
            launch = Launch(action.launch_id, spec, StartKind.NORMAL, started_at=started)
            diagnosis = self._diagnose(
                launch, info, follower, stalled=failure.code == DiagnosisCode.STALLED,
                over_budget=failure.code == DiagnosisCode.READY_BUDGET_EXCEEDED,
            )
        diag_dict: dict[str, Any] | None = None
        if diagnosis is not None:
            diag_dict = diagnosis.model_dump(mode="json", exclude={"findings"})
        elif failure is not None:
            diag_dict = _failure_dict(failure)
        if diag_dict is not None:
            diag_dict["launch_id"] = action.launch_id
            self.last_diagnosis = diag_dict
        self.store.mark_ended(action.launch_id, now, action.status, info, diag_dict,
                              follower.tail_text() if follower else None)
        for table in (self._probe_error, self._cache_seen, self._cache_empty, self._recorded_ready_s,
                      self._engine_keys, self._exit_seen):
            table.pop(action.launch_id, None)
        self._exiting.discard(action.launch_id)

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

    def _ready_s(self, launch: Launch) -> float | None:
        if launch.ready_at is None:
            return None
        recorded = self._recorded_ready_s.get(launch.launch_id)
        return recorded if recorded is not None else round(launch.ready_at - launch.started_at, 1)

    def _last_diagnosis(self) -> dict[str, Any] | None:
        if self.last_diagnosis is not None:
            return self.last_diagnosis
        return _failure_dict(self.m.last_failure) if self.m.last_failure else None

    def status(self) -> dict[str, Any]:
        m = self.m
        now = self.clock.now()
        launch = m.launch
        out: dict[str, Any] = {
            "state": m.state.value,
            "recipe": m.recipe,
            "failures": m.failures,
            "max_failures": m.policy.max_failures,
            "backoff_remaining_s": round(m.backoff_until - now, 1) if m.backoff_until is not None else None,
            "last_diagnosis": self._last_diagnosis(),
            "last_apply": _apply_dict(m.apply),
            "launch": None,
        }
        if launch is not None:
            follower = self._followers.get(launch.launch_id)
            tracker = follower.tracker if follower else None
            started = launch.handle is not None
            out["launch"] = {
                "id": launch.launch_id,
                "kind": launch.kind.value,
                "runtime": launch.spec.kind,
                "ref": launch.handle.ref if launch.handle else None,
                "engine_url": reachable_url(launch.spec),
                "served_model_name": launch.spec.served_model_name,
                "started_at": launch.started_at if started else None,
                "elapsed_s": round(now - launch.started_at, 1) if started else None,
                "ready_budget_s": launch.spec.ready_budget_s,
                "ready_at": launch.ready_at,
                "ready_s": self._ready_s(launch),
                "phase": tracker.current.value if tracker and tracker.current else None,
                "describe": tracker.describe() if tracker else None,
                "phases": [
                    {"phase": p.value, "label": PHASE_LABELS[p], "at": at} for p, at in tracker.phase_list()
                ] if tracker else [],
                "cache": tracker.cache_outcome.value if tracker else None,
                "probe_error": self._probe_error.get(launch.launch_id),
                # Set once the runtime said the engine ended (state `exited`, then backoff/failed).
                "exit": _exit_dict(self._exit_seen.get(launch.launch_id)),
            }
        out["progress"] = progress(m, now)
        return out


# The failures the machine itself decides; their codes are appliance.diagnosis's, so the driver's
# re-diagnosis over the evidence and the machine's own verdict use one spelling.
_MACHINE_DIAGNOSED = frozenset({DiagnosisCode.STALLED.value, DiagnosisCode.READY_BUDGET_EXCEEDED.value})


def _exit_dict(info: ExitInfo | None) -> dict[str, Any] | None:
    if info is None:
        return None
    return {"exit_code": info.exit_code, "signal": info.signal, "oom_killed": info.oom_killed}


def _apply_dict(outcome: ApplyOutcome | None) -> dict[str, Any] | None:
    if outcome is None:
        return None
    return {"token": outcome.token, "recipe": outcome.recipe, "outcome": outcome.outcome,
            "failure": _failure_dict(outcome.failure) if outcome.failure else None}


def _failure_dict(f: Failure) -> dict[str, Any]:
    return {"code": f.code, "summary": f.summary, "hint": f.hint, "retryable": f.retryable}
