"""The supervisor's state machine. Pure: `transition(machine, observation, now) -> (machine, actions)`.

No I/O, no clock, no randomness: time comes in as `now`, the world comes in as observations
(signals.py), and everything to do goes out as actions that the driver executes. Tests drive it
with plain values; a 40-minute start takes microseconds.

States and arrows (every arrow in `transition` carries the same label in a comment):

    idle ──apply──▶ preflight ──ok──▶ starting ──ready──▶ ready
      ▲                │ failed           │ exit / budget / stall      │ exit / health lost
      │                ▼                  ▼                            ▼
      │             failed ◀─N failures─ backoff ◀──────────────── (failure)
      │                                   ▲
      │                                   └── exited ◀── death seen (starting/ready), classified
      │                                   │ delay over → preflight
      └── stopping ◀── draining ◀── stop / restart / apply of another recipe (from ready)

    Blue/green (an apply whose launch fits beside the serving one, PreflightOk.beside): the serving
    launch moves to `old`, the new one goes preflight ──ok──▶ starting ──ready──▶ ready with the
    gateway switched to it (SwitchUpstream), then `old` is drained and stopped; a failure of the new
    one goes back to ready on `old` (`_fail`).

Rules that come from the domain:
- Budgets are the recipe's: default graph needs ≥ 2700 s (DOMAIN §4: an orchestrator that waited
  1500 s killed the engine at 38/51 of capture round 2). A long start is not a failure while it
  is inside its budget and not stalled.
- Stalled = no phase progress AND no CPU time for the stall window: a quiet log alone is normal
  (graph capture round 2 logs nothing for ~17 min, DOMAIN §4), a busy CPU means work is happening.
- Backoff 10 s doubling to 5 min; the failure count resets only after the engine was ready AND
  stayed up for the stable window (ARCHITECTURE: a load that crashes after 20 min is not stable;
  DOMAIN §3: the TP=4 graph OOM lands at the start of the second capture pass).
- Warm-cache restart (DOMAIN §4, S14c: ready 351 → 230 s): cold start on an empty cache root,
  then restart on the same root; only the warm start is put behind the gateway.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from appliance.diagnosis.signatures import DiagnosisCode
from appliance.recipe.launch_port import on_port
from appliance.recipe.launch_spec import LaunchSpec
from controller.runtime.base import EngineHandle
from controller.supervisor.signals import (
    Action,
    Adopted,
    Apply,
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
    Restart,
    RunPreflight,
    SetUpstream,
    StartEngine,
    StartKind,
    Stop,
    StopEngine,
    Stopped,
    SwitchUpstream,
    Tick,
)


class State(StrEnum):
    IDLE = "idle"
    PREFLIGHT = "preflight"
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    STOPPING = "stopping"
    BACKOFF = "backoff"
    FAILED = "failed"
    # The engine died on its own; it is out of the gateway and its exit is being classified (the
    # kernel's OOM record can trail the death by up to the driver's oom_settle_s), then backoff.
    EXITED = "exited"


# What held requests are told when the engine is stopped on purpose (no start follows).
STOPPED_DETAIL = "no engine is ready: it was stopped"
EXITED_HOLD = "the engine exited; relaunching it"

# A start is "in progress" in these states: a second apply/restart is a conflict (API 409).
BUSY = frozenset({State.PREFLIGHT, State.STARTING, State.DRAINING, State.STOPPING, State.EXITED})


class AfterStop(StrEnum):
    """What follows once the engine being stopped is gone."""

    IDLE = "idle"
    LAUNCH = "launch"  # start the pending preflight result (apply of a new recipe over a ready one)
    PREFLIGHT = "preflight"  # re-render and start the target recipe (restart, warm-cache second start)


@dataclass(frozen=True)
class Policy:
    backoff_initial_s: float = 10.0
    backoff_max_s: float = 300.0
    max_failures: int = 5  # consecutive failures before `failed`
    stable_window_s: float = 600.0  # ready this long before the failure count resets
    drain_deadline_s: float = 30.0
    # DOMAIN §7: TERM, wait for the engine to release the device, then KILL.
    stop_grace_s: float = 30.0
    # An adopted engine gets at least this long to answer its probes before its budget applies.
    adopt_grace_s: float = 120.0
    # CPU time below this between samples is "no CPU" (an idle Python process still ticks a little).
    cpu_epsilon_s: float = 0.5
    retry_after_s: float = 10.0  # what the gateway tells clients while there is no slot


@dataclass(frozen=True)
class Launch:
    """The engine the machine is responsible for (starting, ready, draining or stopping)."""

    launch_id: str
    spec: LaunchSpec
    kind: StartKind
    handle: EngineHandle | None = None  # None until the runtime has started it
    started_at: float = 0.0
    deadline: float = 0.0  # started_at + ready budget (later for an adopted engine)
    progress_at: float = 0.0  # last phase progress
    cpu_ref: float | None = None  # CPU seconds at the last sample that showed CPU use
    cpu_at: float = 0.0  # when CPU use was last seen
    phase: str | None = None
    ready_at: float | None = None
    ready_recorded: bool = False  # adopted, and its record already has its ready time


@dataclass(frozen=True)
class Machine:
    state: State = State.IDLE
    policy: Policy = Policy()
    recipe: str | None = None  # the target: what should be running
    launch: Launch | None = None
    token: int = 0  # the current preflight; a late answer to an older one is ignored
    after_stop: AfterStop = AfterStop.IDLE
    pending: PreflightOk | None = None  # the launch waiting for the old engine to stop
    stop_failure: Failure | None = None  # we are stopping the engine because it failed (budget, stall...)
    next_kind: StartKind | None = None  # the kind the next preflight's launch gets (warm after warm-up)
    failures: int = 0  # consecutive failures; reset by a stable ready engine or an operator request
    backoff_until: float | None = None
    drain_until: float | None = None
    last_failure: Failure | None = None
    apply: ApplyOutcome | None = None  # what became of the latest apply request
    force: bool = False  # the pending apply restarts even an identical ready launch
    halt: bool = False  # stop requested while the exit of a dead engine was being classified
    # Blue/green (blue_green.py): the engine that still serves while `launch` starts beside it on its
    # own port; once the new one is ready and the gateway points at it (`switched`), the old one is
    # drained and stopped. None: one engine, as always.
    old: Launch | None = None
    switched: bool = False  # the gateway routes to `launch`; `old` is being drained and stopped
    blue_green: bool = True  # the pending apply may start beside the serving engine (Apply.blue_green)


def _old_serves(m: Machine) -> bool:
    """A blue/green switch is under way and the old engine still has the gateway."""
    return m.old is not None and not m.switched


def backoff_delay(failures: int, policy: Policy) -> float:
    """10 s, 20 s, 40 s … capped at 5 min (failures counts this one, ≥ 1)."""
    delay: float = policy.backoff_initial_s * 2.0 ** max(failures - 1, 0)
    return min(delay, policy.backoff_max_s)


def progress(machine: Machine, now: float) -> float | None:
    """Fraction of the ready budget used by the current start (None when nothing is starting)."""
    launch = machine.launch
    if machine.state is not State.STARTING or launch is None or launch.handle is None:
        return None
    budget = launch.spec.ready_budget_s
    return max(0.0, min(1.0, (now - launch.started_at) / budget))


def transition(m: Machine, obs: Observation, now: float) -> tuple[Machine, list[Action]]:
    """The one place where the supervisor decides. Pure."""
    match obs:
        case Apply():
            return _apply(m, obs)
        case Restart():
            return _restart(m, obs, now)
        case Stop():
            return _stop(m, now)
        case PreflightOk():
            return _preflight_ok(m, obs, now)
        case PreflightFailed():
            return _preflight_failed(m, obs, now)
        case Launched():
            return _launched(m, obs, now)
        case LaunchFailed():
            return _launch_failed(m, obs, now)
        case PhaseSeen():
            return _phase(m, obs, now)
        case CpuSample():
            return _cpu(m, obs, now)
        case ReadyProbed():
            return _ready(m, obs, now)
        case HealthLost():
            return _health_lost(m, obs)
        case ExitSeen():
            return _exit_seen(m, obs)
        case Exited():
            return _exited(m, obs, now)
        case Drained():
            return _drained(m, obs)
        case Stopped():
            return _stopped(m, obs, now)
        case Adopted():
            return _adopted(m, obs, now)
        case Tick():
            return _tick(m, now)


# --------------------------------------------------------------------------------------------
# Operator requests


def _apply(m: Machine, obs: Apply) -> tuple[Machine, list[Action]]:
    if m.state in BUSY:
        # preflight/starting/draining/stopping + apply → rejected: one start at a time (API 409).
        return m, [Reject(f"an engine start is in progress (state {m.state}); wait for it or stop it first")]
    if m.old is not None:
        # ready (blue/green, the old engine still being drained and stopped) + apply → rejected.
        return m, [Reject(f"the previous engine ({m.old.spec.recipe}) of a blue/green switch is still being "
                          "drained and stopped; try again in a moment")]
    # idle/ready/backoff/failed + apply → preflight. A ready engine keeps serving until the new
    # recipe has passed its preflight; an operator request clears the failure count.
    token = m.token + 1
    m2 = replace(
        m, state=State.PREFLIGHT, recipe=obs.recipe, token=token, failures=0, backoff_until=None,
        next_kind=None, pending=None, apply=ApplyOutcome(token, obs.recipe, "pending"),
        force=obs.force or obs.fresh_cache, blue_green=obs.blue_green,
    )
    return m2, [
        Notify("apply", f"apply {obs.recipe}", data={"recipe": obs.recipe, "fresh_cache": obs.fresh_cache}),
        RunPreflight(token, obs.recipe, obs.fresh_cache),
    ]


def _restart(m: Machine, obs: Restart, now: float) -> tuple[Machine, list[Action]]:
    if m.state in BUSY:
        # preflight/starting/draining/stopping + restart → rejected (API 409).
        return m, [Reject(f"an engine start is in progress (state {m.state})")]
    if m.old is not None:
        return m, [Reject(f"the previous engine ({m.old.spec.recipe}) of a blue/green switch is still being "
                          "drained and stopped; try again in a moment")]
    if m.recipe is None:
        # idle (never applied) + restart → rejected: nothing to restart.
        return m, [Reject("no recipe has been applied: nothing to restart")]
    if m.state is State.READY and m.launch is not None and obs.blue_green:
        # ready + restart → preflight of the same recipe while the engine serves (as an apply --force
        # of it): the driver starts the new launch beside it when it fits (blue/green, no hold), else
        # the preflight answer drains it first (the hold); a refused preflight leaves it serving.
        token = m.token + 1
        m2 = replace(m, state=State.PREFLIGHT, token=token, failures=0, backoff_until=None, next_kind=None,
                     pending=None, force=True, blue_green=True)
        return m2, [Notify("restart", f"restart {m.recipe}"), RunPreflight(token, m.recipe)]
    if m.state is State.READY and m.launch is not None:
        # ready + restart (no blue/green) → draining, then stopping, then preflight of the same recipe.
        m2 = replace(m, after_stop=AfterStop.PREFLIGHT, failures=0, next_kind=None)
        return _begin_drain(m2, m.launch, now)
    # idle/backoff/failed + restart → preflight at once (the operator overrides the backoff).
    token = m.token + 1
    m2 = replace(m, state=State.PREFLIGHT, token=token, failures=0, backoff_until=None, next_kind=None)
    return m2, [Notify("restart", f"restart {m.recipe}"), RunPreflight(token, m.recipe)]


def _stop(m: Machine, now: float) -> tuple[Machine, list[Action]]:
    launch = m.launch
    if m.state is State.READY and launch is not None:
        # ready + stop → draining (in-flight requests finish), then stopping, then idle.
        return _begin_drain(replace(m, after_stop=AfterStop.IDLE, pending=None), launch, now)
    if m.state is State.PREFLIGHT and launch is not None:
        # preflight over a ready engine + stop → draining the old engine; the preflight answer is dropped.
        m2 = replace(m, after_stop=AfterStop.IDLE, pending=None, token=m.token + 1)
        return _begin_drain(m2, launch, now)
    if m.state is State.STARTING and launch is not None:
        # starting + stop → stopping (no drain: nothing was routed to it), then idle.
        m2 = replace(m, state=State.STOPPING, after_stop=AfterStop.IDLE, pending=None, stop_failure=None)
        note = Notify("stop", "stop requested during the start", launch.launch_id)
        return m2, [note, *_stop_engine(m2, launch)]
    if m.state in (State.DRAINING, State.STOPPING):
        # draining/stopping + stop → same state, but nothing follows the stop.
        return replace(m, after_stop=AfterStop.IDLE, pending=None), [Notify("stop", "stop requested")]
    if m.state is State.EXITED:
        # exited + stop → exited; once classified, idle instead of backoff.
        return replace(m, halt=True), [Notify("stop", "stop requested")]
    if m.state is State.IDLE:
        # idle + stop → idle (nothing to do).
        return m, []
    # preflight (nothing running)/backoff/failed + stop → idle.
    m2 = replace(m, state=State.IDLE, token=m.token + 1, backoff_until=None, pending=None)
    return m2, [Notify("stop", "stop requested"),
                ClearUpstream("stopped", m.policy.retry_after_s, detail=STOPPED_DETAIL)]


# --------------------------------------------------------------------------------------------
# Preflight and launch


def _preflight_ok(m: Machine, obs: PreflightOk, now: float) -> tuple[Machine, list[Action]]:
    if m.state is not State.PREFLIGHT or obs.token != m.token:
        return m, []  # an answer to a preflight that was superseded or cancelled
    ours = m.apply is not None and m.apply.token == obs.token
    current = m.launch
    if (ours and not m.force and current is not None and current.handle is not None
            and current.spec.recipe == obs.spec.recipe
            and on_port(obs.spec, current.spec.port).spec_hash == current.spec.spec_hash):
        # preflight ok for exactly the launch that is ready → ready, nothing restarted (an apply of
        # the running recipe cost 95 s of 503 without a word; `--force` restarts it).
        message = (f"{obs.spec.recipe} is already running with this exact launch spec "
                   f"({obs.spec.spec_hash}): nothing restarted (use --force to restart it)")
        assert m.apply is not None
        m2 = replace(m, state=State.READY, recipe=current.spec.recipe, force=False,
                     apply=replace(m.apply, outcome="unchanged"))
        return m2, [Notify("unchanged", message, current.launch_id)]
    if ours:
        assert m.apply is not None
        m = replace(m, apply=replace(m.apply, outcome="started"))
    m = replace(m, force=False)  # an apply's --force, or a restart's: spent on this preflight
    old = m.launch
    cold_warmup = m.next_kind is None and obs.warm_restart and obs.cache_empty
    if obs.beside and old is not None and old.handle is not None and m.old is None and not cold_warmup:
        # preflight ok, fits beside the serving engine → starting the new one on its own port; the
        # gateway keeps routing to the old one until the new one is ready (blue/green, no hold).
        note = Notify("blue-green", f"starting {obs.spec.recipe} beside {old.spec.recipe} (port "
                      f"{obs.spec.port}); {old.spec.recipe} serves until it is ready", obs.launch_id,
                      {"old_launch_id": old.launch_id, "port": obs.spec.port})
        m2, actions = _start(replace(m, old=old, launch=None, switched=False), obs, now)
        return m2, [note, *actions]
    if old is not None:
        # preflight ok while the old engine serves → draining it; the new launch waits.
        return _begin_drain(replace(m, pending=obs, after_stop=AfterStop.LAUNCH), old, now)
    # preflight ok → starting.
    return _start(m, obs, now)


def _preflight_failed(m: Machine, obs: PreflightFailed, now: float) -> tuple[Machine, list[Action]]:
    if m.state is not State.PREFLIGHT or obs.token != m.token:
        return m, []
    if m.apply is not None and m.apply.token == obs.token:
        m = replace(m, apply=replace(m.apply, outcome="refused", failure=obs.failure))
    m = replace(m, force=False)
    note = Notify("preflight-failed", obs.failure.summary, data=_failure_data(obs.failure))
    if m.launch is not None:
        # preflight failed while the old engine serves → ready (keep serving the old recipe).
        old = m.launch.spec.recipe
        return replace(m, state=State.READY, recipe=old, last_failure=obs.failure), [note]
    # preflight failed, nothing running → backoff (retryable) or failed.
    m2, actions = _fail(m, obs.failure, now)
    return m2, [note, *actions]


def _start(m: Machine, ok: PreflightOk, now: float) -> tuple[Machine, list[Action]]:
    if m.next_kind is not None:
        kind = m.next_kind
    elif ok.warm_restart and ok.cache_empty:
        kind = StartKind.COLD_WARMUP
    else:
        kind = StartKind.NORMAL
    launch = Launch(
        launch_id=ok.launch_id, spec=ok.spec, kind=kind, started_at=now, progress_at=now, cpu_at=now
    )
    m2 = replace(m, state=State.STARTING, launch=launch, pending=None, next_kind=None, stop_failure=None)
    return m2, [StartEngine(ok.launch_id, ok.spec, kind, ok.empty_cache_first, ok.cache_empty)]


def _launched(m: Machine, obs: Launched, now: float) -> tuple[Machine, list[Action]]:
    launch = m.launch
    if launch is None or launch.launch_id != obs.launch_id:
        # An engine nobody wants any more (the host holds one engine at a time): stop it.
        return m, [StopEngine(obs.launch_id, obs.handle, m.policy.stop_grace_s)]
    budget = launch.spec.ready_budget_s
    started = replace(
        launch, handle=obs.handle, started_at=now, deadline=now + budget, progress_at=now, cpu_at=now,
    )
    if m.state is State.STOPPING:
        # stopping (stop requested while the runtime was starting it) + launched → stop it now.
        m2 = replace(m, launch=started)
        return m2, _stop_engine(m2, started)
    # starting + launched → starting: the budget clock runs from here.
    note = Notify(
        "launched", f"{launch.kind} start of {launch.spec.recipe}, ready budget {budget} s",
        launch.launch_id, {"kind": str(launch.kind), "ref": obs.handle.ref, "budget_s": budget},
    )
    return replace(m, launch=started), [note]


def _launch_failed(m: Machine, obs: LaunchFailed, now: float) -> tuple[Machine, list[Action]]:
    launch = m.launch
    if launch is None or launch.launch_id != obs.launch_id:
        return m, []
    m2 = replace(m, launch=None)
    ended = MarkEnded(launch.launch_id, "failed", obs.failure)
    if m.state is State.STOPPING:
        # stopping + launch failed → whatever follows the stop.
        m3, actions = _after_stopped(m2, now)
        return m3, [ended, *actions]
    # starting + launch failed → backoff or failed.
    m3, actions = _fail(m2, obs.failure, now)
    return m3, [ended, *actions]


# --------------------------------------------------------------------------------------------
# Progress of a start


def _phase(m: Machine, obs: PhaseSeen, now: float) -> tuple[Machine, list[Action]]:
    launch = m.launch
    if launch is None or launch.launch_id != obs.launch_id:
        return m, []
    # any state + phase → same state; the stall clock restarts.
    m2 = replace(m, launch=replace(launch, phase=obs.phase, progress_at=now))
    if not obs.recorded:
        return m2, []
    return m2, [Notify("phase", obs.detail or obs.phase, launch.launch_id, {"phase": obs.phase})]


def _cpu(m: Machine, obs: CpuSample, now: float) -> tuple[Machine, list[Action]]:
    launch = m.launch
    if launch is None or launch.launch_id != obs.launch_id:
        return m, []
    if launch.cpu_ref is None:
        return replace(m, launch=replace(launch, cpu_ref=obs.cpu_seconds)), []
    if obs.cpu_seconds - launch.cpu_ref >= m.policy.cpu_epsilon_s:
        # CPU time advanced: the engine is working even if its log is quiet.
        return replace(m, launch=replace(launch, cpu_ref=obs.cpu_seconds, cpu_at=now)), []
    return m, []


def _ready(m: Machine, obs: ReadyProbed, now: float) -> tuple[Machine, list[Action]]:
    launch = m.launch
    if m.state is not State.STARTING or launch is None or launch.launch_id != obs.launch_id:
        return m, []
    ready_s = round(now - launch.started_at, 3)
    marked = MarkReady(launch.launch_id, ready_s)
    if launch.kind is StartKind.COLD_WARMUP:
        # starting (cold warm-up) + ready → stopping, then a warm start on the same cache root.
        m2 = replace(
            m, state=State.STOPPING, launch=replace(launch, ready_at=now), after_stop=AfterStop.PREFLIGHT,
            next_kind=StartKind.WARM, stop_failure=None,
        )
        note = Notify(
            "warmup-ready", f"cold start ready in {ready_s} s; restarting on the same cache root",
            launch.launch_id, {"ready_s": ready_s},
        )
        return m2, [marked, note, *_stop_engine(m2, launch)]
    # starting + ready → ready: the gateway gets the slot. An adopted engine that was ready before
    # the restart has its ready time recorded already; one adopted mid-start is recorded here.
    m2 = replace(m, state=State.READY, launch=replace(launch, ready_at=now), last_failure=None)
    ready_note = Notify("ready", f"{launch.spec.recipe} ready in {ready_s} s", launch.launch_id,
                        {"ready_s": ready_s, "kind": str(launch.kind)})
    old = m.old
    if old is not None and not m.switched:
        # starting (blue/green) + ready → ready: the gateway switches to the new engine at once (no
        # hold), the old one's in-flight requests finish, then it is stopped (Drained, Stopped).
        switch = SwitchUpstream(launch.launch_id, launch.spec.base_url, launch.spec.served_model_name,
                                old.launch_id, m.policy.drain_deadline_s)
        return replace(m2, switched=True), [marked, ready_note, switch]
    return m2, [
        *([marked] if not launch.ready_recorded else []),
        ready_note,
        SetUpstream(launch.launch_id, launch.spec.base_url, launch.spec.served_model_name),
    ]


def _health_lost(m: Machine, obs: HealthLost) -> tuple[Machine, list[Action]]:
    launch = m.launch
    if m.state is not State.READY or launch is None or launch.launch_id != obs.launch_id:
        return m, []
    # ready + health lost → stopping (no drain: it does not answer), then backoff.
    failure = Failure("health_lost", f"the ready engine stopped answering: {obs.detail}",
                      "see the log tail; the engine is restarted", retryable=True)
    m2 = replace(m, state=State.STOPPING, stop_failure=failure, after_stop=AfterStop.IDLE)
    return m2, [
        ClearUpstream("engine not answering", m.policy.retry_after_s,
                      hold="the engine stopped answering; restarting it"),
        Notify("health-lost", failure.summary, launch.launch_id),
        *_stop_engine(m2, launch),
    ]


def _exit_seen(m: Machine, obs: ExitSeen) -> tuple[Machine, list[Action]]:
    launch = m.launch
    how = (f"exit code {obs.exit.exit_code}" if obs.exit.exit_code is not None else "exit status unknown")
    old = m.old
    if old is not None and old.launch_id == obs.launch_id:
        if m.switched:
            return m, []  # past the switch: our own stop (Stopped reports its end)
        # starting (blue/green) + the serving old engine's death seen → starting: out of the
        # gateway, which holds new requests until the new engine is ready.
        target = launch.spec.recipe if launch is not None else m.recipe
        note = Notify("exit-seen", f"the serving engine ended ({how}) while {target} starts beside it",
                      old.launch_id, {"exit_code": obs.exit.exit_code, "signal": obs.exit.signal})
        return m, [note, ClearUpstream("engine exited", m.policy.retry_after_s,
                                       hold=f"the serving engine exited; {target} is starting")]
    if launch is None or launch.launch_id != obs.launch_id:
        return m, []
    note = Notify("exit-seen", f"the engine ended ({how}); out of the gateway, classifying the exit",
                  launch.launch_id, {"exit_code": obs.exit.exit_code, "signal": obs.exit.signal})
    # Held while the exit is classified: a relaunch is the likely next step; a failure for good
    # answers the held requests with its reason (`_fail`).
    clear = ClearUpstream("engine exited", m.policy.retry_after_s, hold=EXITED_HOLD)
    if m.state is State.STARTING and _old_serves(m):
        # starting (blue/green) + the new engine's death seen → exited; the old one keeps the gateway.
        return replace(m, state=State.EXITED, halt=False), [note]
    if m.state in (State.READY, State.STARTING):
        # ready/starting + death seen → exited: the gateway answers 503 + Retry-After at once,
        # not 502 "cannot connect" while the exit is classified (it was ~12 s of 502).
        return replace(m, state=State.EXITED, halt=False), [note, clear]
    if m.state is State.PREFLIGHT:
        # preflight (old engine serving) + death seen → preflight; the old engine leaves the gateway.
        return m, [note, clear]
    return m, []  # draining (already out of the gateway), stopping (our own stop), exited


def _exited(m: Machine, obs: Exited, now: float) -> tuple[Machine, list[Action]]:
    launch = m.launch
    old = m.old
    if old is not None and old.launch_id == obs.launch_id:
        if m.switched:
            return m, []  # past the switch: our own stop (Stopped reports its end)
        # starting (blue/green) + the old engine's exit classified → starting, one engine again.
        return replace(m, old=None), [MarkEnded(old.launch_id, "exited", obs.failure, replaced=True),
                                      Notify("exited", obs.failure.summary, old.launch_id,
                                             _failure_data(obs.failure))]
    if launch is None or launch.launch_id != obs.launch_id:
        return m, []
    if m.state is State.STOPPING:
        return m, []  # the Stop action reports the end itself (Stopped)
    m2 = replace(m, launch=None)
    ended = MarkEnded(launch.launch_id, "exited", obs.failure)
    note = Notify("exited", obs.failure.summary, launch.launch_id, _failure_data(obs.failure))
    if _old_serves(m):
        # The new engine of a blue/green switch died: the old one serves on (`_fail`), no clear.
        m3, actions = _fail(m2, obs.failure, now)
        return m3, [ended, note, *actions]
    clear = ClearUpstream("engine exited", m.policy.retry_after_s, hold=EXITED_HOLD)
    if m.state is State.DRAINING:
        # draining + exited → whatever follows the stop (it stopped by itself).
        m3, actions = _after_stopped(m2, now)
        return m3, [ended, note, clear, *actions]
    if m.state is State.PREFLIGHT:
        # preflight (old engine serving) + exited → preflight; the new launch replaces it anyway.
        return replace(m2, last_failure=obs.failure), [ended, note, clear]
    if m.state is State.EXITED and m.halt:
        # exited (a stop was requested meanwhile) + classified → idle.
        halted = replace(m2, halt=False, after_stop=AfterStop.IDLE, last_failure=obs.failure)
        m3, actions = _after_stopped(halted, now)
        return m3, [ended, note, clear, *actions]
    # starting/ready/exited + exited → backoff or failed.
    m3, actions = _fail(m2, obs.failure, now)
    return m3, [ended, note, clear, *actions]


def _drained(m: Machine, obs: Drained) -> tuple[Machine, list[Action]]:
    old = m.old
    if old is not None and m.switched and old.launch_id == obs.launch_id:
        # ready (blue/green, the old engine drained) → ready; the old engine is stopped.
        return m, _stop_engine(m, old)
    launch = m.launch
    if m.state is not State.DRAINING or launch is None or launch.launch_id != obs.launch_id:
        return m, []
    # draining + drained → stopping.
    m2 = replace(m, state=State.STOPPING, drain_until=None)
    return m2, _stop_engine(m2, launch)


def _stopped(m: Machine, obs: Stopped, now: float) -> tuple[Machine, list[Action]]:
    old = m.old
    if old is not None and m.switched and old.launch_id == obs.launch_id:
        # ready (blue/green, the old engine stopping) + stopped → ready, one engine again.
        served = m.launch.spec.recipe if m.launch is not None else m.recipe
        note = Notify("blue-green-done", f"{old.spec.recipe} drained and stopped; {served} serves",
                      old.launch_id)
        ended = MarkEnded(old.launch_id, "stopped", replaced=True)
        return replace(m, old=None, switched=False), [ended, note]
    launch = m.launch
    if launch is None or launch.launch_id != obs.launch_id:
        return m, []
    failure = m.stop_failure
    m2 = replace(m, launch=None, stop_failure=None)
    status = "failed" if failure is not None else "stopped"
    ended = MarkEnded(launch.launch_id, status, failure)
    if failure is not None:
        # stopping (because it failed: budget, stall, health) + stopped → backoff or failed.
        m3, actions = _fail(m2, failure, now)
        return m3, [ended, *actions]
    # stopping + stopped → idle / starting (pending apply) / preflight (restart, warm second start).
    m3, actions = _after_stopped(m2, now)
    return m3, [ended, *actions]


def _adopted(m: Machine, obs: Adopted, now: float) -> tuple[Machine, list[Action]]:
    if m.state is not State.IDLE or m.launch is not None:
        return m, [Notify("adopt-skipped", f"engine {obs.handle.ref} found but the supervisor is busy")]
    # idle + adopted → starting: probed like any start, never restarted for being found. Its
    # budget runs from its real start, but it always gets adopt_grace_s to answer the probes.
    h = obs.handle
    deadline = max(h.started_at + obs.spec.ready_budget_s, now + m.policy.adopt_grace_s)
    launch = Launch(
        launch_id=h.launch_id, spec=obs.spec, kind=StartKind.ADOPTED, handle=h, started_at=h.started_at,
        deadline=deadline, progress_at=now, cpu_at=now, ready_recorded=obs.ready_recorded,
    )
    m2 = replace(m, state=State.STARTING, recipe=h.recipe, launch=launch)
    note = Notify("adopted", f"adopted running engine {h.ref} ({h.recipe})", h.launch_id, {"ref": h.ref})
    return m2, [note]


# --------------------------------------------------------------------------------------------
# Time


def _tick(m: Machine, now: float) -> tuple[Machine, list[Action]]:
    launch = m.launch
    if m.state is State.STARTING and launch is not None and launch.handle is not None:
        if now >= launch.deadline:
            # starting + budget spent → stopping, then failed (retrying cannot make it faster).
            failure = Failure(
                DiagnosisCode.READY_BUDGET_EXCEEDED.value,
                f"not ready after {launch.spec.ready_budget_s} s (last phase: {launch.phase or 'none'})",
                "if the phases were still advancing, raise expect.ready_budget_s (default graph needs "
                "≥ 2700 s, DOMAIN §4); otherwise read the log tail",
                retryable=False,
            )
            return _stop_failed(m, launch, failure)
        quiet_since = max(launch.progress_at, launch.cpu_at)
        if now - quiet_since >= launch.spec.stall_window_s:
            # starting + no phase progress and no CPU for the stall window → stopping, then backoff.
            failure = Failure(
                DiagnosisCode.STALLED.value,
                f"no phase progress and no CPU time for {round(now - quiet_since)} s "
                f"(last phase: {launch.phase or 'none'})",
                "the start hung; see the log tail (a card too small for the model stalls in torch.compile, "
                "DOMAIN §3)",
                retryable=True,
            )
            return _stop_failed(m, launch, failure)
        return m, []
    if m.state is State.READY and launch is not None and launch.ready_at is not None:
        if m.failures > 0 and now - launch.ready_at >= m.policy.stable_window_s:
            # ready + stable for the window → ready, failure count reset (the only automatic reset).
            note = Notify("backoff-reset", f"stable for {m.policy.stable_window_s:g} s: failure count reset",
                          launch.launch_id, {"failures": m.failures})
            return replace(m, failures=0), [note]
        return m, []
    if m.state is State.BACKOFF and m.backoff_until is not None and now >= m.backoff_until and m.recipe:
        # backoff + delay over → preflight (re-render: the host may have changed meanwhile).
        token = m.token + 1
        m2 = replace(m, state=State.PREFLIGHT, token=token, backoff_until=None)
        return m2, [Notify("relaunch", f"relaunching {m.recipe} after failure {m.failures}"),
                    RunPreflight(token, m.recipe)]
    draining = m.state is State.DRAINING and launch is not None and m.drain_until is not None
    if draining and launch is not None and m.drain_until is not None and now >= m.drain_until:
        # draining + drain deadline passed → stopping anyway.
        m2 = replace(m, state=State.STOPPING, drain_until=None)
        return m2, _stop_engine(m2, launch)
    return m, []


# --------------------------------------------------------------------------------------------
# Helpers


def _begin_drain(m: Machine, launch: Launch, now: float) -> tuple[Machine, list[Action]]:
    if launch.handle is None:
        m2 = replace(m, state=State.STOPPING, drain_until=None)
        return m2, _stop_engine(m2, launch)
    deadline = m.policy.drain_deadline_s
    m2 = replace(m, state=State.DRAINING, drain_until=now + deadline)
    return m2, [
        Notify("draining", f"draining {launch.spec.recipe}", launch.launch_id),
        DrainGateway(launch.launch_id, deadline, hold=_switch_reason(m, launch)),
    ]


def _switch_reason(m: Machine, launch: Launch) -> str | None:
    """Why the gateway holds new requests across this drain; None when nothing follows (a stop)."""
    if m.after_stop is AfterStop.LAUNCH and m.pending is not None:
        recipe = m.pending.spec.recipe
        return "restart" if recipe == launch.spec.recipe else f"switching to {recipe}"
    if m.after_stop is AfterStop.PREFLIGHT:
        return "restart"
    return None


def _stop_engine(m: Machine, launch: Launch) -> list[Action]:
    if launch.handle is None:
        return []  # the runtime has not answered yet; Launched will trigger the stop
    return [StopEngine(launch.launch_id, launch.handle, m.policy.stop_grace_s)]


def _stop_failed(m: Machine, launch: Launch, failure: Failure) -> tuple[Machine, list[Action]]:
    m2 = replace(m, state=State.STOPPING, stop_failure=failure, after_stop=AfterStop.IDLE)
    return m2, [Notify(failure.code, failure.summary, launch.launch_id, _failure_data(failure)),
                *_stop_engine(m2, launch)]


def _after_stopped(m: Machine, now: float) -> tuple[Machine, list[Action]]:
    old = m.old
    if old is not None and not m.switched:
        # stop during a blue/green start: the new engine is gone → draining the old one, then idle.
        m2 = replace(m, launch=old, old=None, after_stop=AfterStop.IDLE, pending=None)
        return _begin_drain(m2, old, now)
    if m.after_stop is AfterStop.LAUNCH and m.pending is not None:
        return _start(replace(m, after_stop=AfterStop.IDLE), m.pending, now)
    if m.after_stop is AfterStop.PREFLIGHT and m.recipe is not None:
        token = m.token + 1
        m2 = replace(m, state=State.PREFLIGHT, token=token, after_stop=AfterStop.IDLE)
        return m2, [RunPreflight(token, m.recipe)]
    m2 = replace(m, state=State.IDLE, after_stop=AfterStop.IDLE, pending=None)
    return m2, [Notify("idle", "engine stopped"),
                ClearUpstream("stopped", m.policy.retry_after_s, detail=STOPPED_DETAIL)]


def _fail(m: Machine, failure: Failure, now: float) -> tuple[Machine, list[Action]]:
    old = m.old
    if old is not None and not m.switched:
        # the new engine of a blue/green switch failed → ready on the old one, which never left the
        # gateway: nobody noticed. The failure is kept (status, the launch record's diagnosis).
        apply = m.apply
        if apply is not None and apply.outcome == "started":
            apply = replace(apply, outcome="failed", failure=failure)
        m2 = replace(m, state=State.READY, launch=old, old=None, recipe=old.spec.recipe,
                     last_failure=failure, backoff_until=None, next_kind=None, stop_failure=None, apply=apply)
        said = f"the new engine failed beside {old.spec.recipe}, which keeps serving: {failure.summary}"
        return m2, [Notify("blue-green-failed", said, old.launch_id, _failure_data(failure))]
    failures = m.failures + 1
    p = m.policy
    if not failure.retryable or failures >= p.max_failures:
        why = "not retryable" if not failure.retryable else f"{failures} consecutive failures"
        m2 = replace(m, state=State.FAILED, failures=failures, last_failure=failure, backoff_until=None,
                     next_kind=None)
        return m2, [Notify("failed", f"failed ({why}): {failure.summary}", data=_failure_data(failure)),
                    ClearUpstream("failed", p.retry_after_s,
                                  detail=f"the engine failed ({why}): {failure.summary}")]
    delay = backoff_delay(failures, p)
    m2 = replace(m, state=State.BACKOFF, failures=failures, last_failure=failure, backoff_until=now + delay)
    return m2, [Notify("backoff", f"failure {failures}: retry in {delay:g} s ({failure.code})",
                       data={"delay_s": delay, "failures": failures, **_failure_data(failure)}),
                ClearUpstream("backoff", delay, hold=f"relaunch after a failure, next try in {delay:g} s")]


def _failure_data(failure: Failure) -> dict[str, object]:
    return {
        "code": failure.code,
        "summary": failure.summary,
        "hint": failure.hint,
        "retryable": failure.retryable,
    }


