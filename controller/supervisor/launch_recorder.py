"""What a launch leaves behind: its launch record, its metrics and its events, written in one place.

The driver decides and drives; this writes. From a start (`begin`) or an adoption (`adopted`) on:
phases as the log shows them, the engine facts and the compile-cache verdict when they change, the
ready time, a stall flagged once per phase, and at the end the exit with its diagnosis (`ended`, which
keeps `last_diagnosis` for the status). The engine's state on metrics and the event stream follows
the machine (`state_changed`). Whether the store's path still names the file it writes is watched
here too (`check_store`): every write of a launch goes to that file.

Per engine: it reads its engine's machine through a `MachineView`; the store, metrics, clock and
event stream it writes through are the host's (host_seams.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from appliance.diagnosis.signatures import DiagnosisCode
from appliance.observe.log_phases import PHASE_LABELS, CacheOutcome, PhaseEvent
from appliance.recipe.launch_spec import LaunchSpec
from controller.runtime.base import Provenance
from controller.supervisor import compile_cache, status_view
from controller.supervisor.exit_diagnosis import MACHINE_DIAGNOSED, ExitDiagnoser
from controller.supervisor.follow import LogFollower
from controller.supervisor.host_seams import HostSeams
from controller.supervisor.launch_run import LaunchRun
from controller.supervisor.machine import Launch, State
from controller.supervisor.machine_view import MachineView
from controller.supervisor.signals import MarkEnded, MarkReady, StartEngine, StartKind

# The driver's logger: the store-lost error and an unanswered runtime are the supervisor's, logged
# where they always were.
log = logging.getLogger("controller.supervisor.driver")


class LaunchRecorder:
    def __init__(self, host: HostSeams, view: MachineView, diagnoser: ExitDiagnoser) -> None:
        self._host = host
        self._store = host.store
        self._metrics = host.metrics
        self._clock = host.clock
        self._events = host.events
        self._view = view
        self._diagnoser = diagnoser
        self.last_diagnosis: dict[str, Any] | None = None
        # Why the launch store's path no longer names the file it writes (deleted or replaced), once seen.
        self.store_problem: str | None = None

    def state_changed(self) -> None:
        m = self._view.machine
        self._metrics.set_engine_state(m.state.value)
        if m.state is State.READY and m.launch is not None:
            # Every way into ready, including an adopted engine that was ready before the restart (it
            # has no MarkReady: its start was measured by the controller that launched it).
            self._metrics.set_engine_ready(m.launch.spec.recipe)
        self._events.publish({
            "type": "state",
            "state": m.state.value,
            "recipe": m.recipe,
            "launch_id": m.launch.launch_id if m.launch else None,
            "failures": m.failures,
        })

    def check_store(self) -> str | None:
        """The launch store's file still the one at its path? (a deleted or replaced store
        went unnoticed, its history lost at the next restart). One stat, on every step and liveness
        probe; said loudly once (log, event, `status`), and the controller is then not alive (/healthz
        503) so that it is restarted onto the file at the path."""
        problem = self._store.file_problem()
        if problem is not None and problem != self.store_problem:
            self.store_problem = problem
            log.error("launch store: %s", problem)
            self._events.note("store-lost", f"{problem}; the controller reports itself not alive (/healthz "
                              "503) until it is restarted")
        return problem

    # ------------------------------------------------------------------------------------------
    # A start

    async def begin(self, action: StartEngine, run: LaunchRun, prov: Provenance, now: float) -> None:
        """The launch record and the launch's metrics, before the runtime starts the engine."""
        spec = action.spec
        cold = action.kind is StartKind.COLD_WARMUP or run.cache_empty
        self._store.create_launch(action.launch_id, spec, action.kind.value, prov, now,
                                  start="cold" if cold else "warm")
        # The ETA's history, read once: earlier ready launches of this recipe
        # (appliance/observe/ready_eta.py).
        run.history = tuple(self._store.ready_history(spec.recipe, spec.spec_hash, exclude=action.launch_id))
        run.cold_start = cold
        self._metrics.begin_launch(spec.recipe, "cold" if cold else "warm",
                                   ready_budget_s=spec.ready_budget_s,
                                   min_mem_available_bytes=await self._host.mem_target_of(spec),
                                   started_at=now)
        m = self._view.machine
        if m.failures > 0 and m.last_failure is not None:
            self._metrics.record_restart(spec.recipe, m.last_failure.code)

    async def begin_compile(self, run: LaunchRun, spec: LaunchSpec, secret_env: Mapping[str, str],
                            prov: Provenance, emptied: bool) -> None:
        try:
            run.compile, warnings = await asyncio.to_thread(
                compile_cache.begin, self._store, run.launch_id, spec, secret_env, prov,
                emptied_on_purpose=emptied)
        except OSError as exc:  # an unreadable model or cache directory: the start goes on, said so
            self._events.note("compile-cache-warning", f"could not record compile factors: {exc}",
                              run.launch_id)
            return
        for warning in warnings:
            self._events.note("compile-cache-warning", warning, run.launch_id)

    def adopted(self, spec: LaunchSpec, target: int | None) -> None:
        # Not ready until it answers; the running recipe's floor, as at a start.
        self._metrics.adopt_launch(spec.recipe, min_mem_available_bytes=target)

    # ------------------------------------------------------------------------------------------
    # What the log shows

    def phase(self, launch: Launch, follower: LogFollower, event: PhaseEvent, now: float) -> bool:
        """One row per phase (per capture round: first and last step), labelled from the event itself
        (appliance/observe/phase_record.py); returns whether this event was recorded as a row."""
        keep = follower.recorder.keep(event)
        if keep:
            self._store.add_phase(launch.launch_id, event.phase.value, now, now - follower.started_at,
                                  event.line[:300])
        self._metrics.set_engine_phase(launch.spec.recipe, event.phase.value, now - follower.started_at)
        return keep

    def publish_phase(self, launch: Launch, follower: LogFollower, event: PhaseEvent, now: float,
                      label: str | None, progress: float | None) -> None:
        self._events.publish({
            "type": "phase", "launch_id": launch.launch_id, "phase": event.phase.value,
            "label": PHASE_LABELS[event.phase], "describe": label, "detail": event.detail or "",
            "elapsed_s": round(now - follower.started_at, 1), "progress": progress,
        })

    def engine_facts(self, launch: Launch, run: LaunchRun) -> None:
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
            peaks = self._host.process_peaks
            facts["ranks"] = follower.ranks.record(dict(peaks(launch.launch_id)) if peaks else {})
        if facts and facts != run.engine_seen:
            run.engine_seen = facts
            self._store.set_engine_facts(launch.launch_id, facts)

    def cache(self, launch: Launch, run: LaunchRun) -> None:
        self._compile(launch, run)
        outcome = run.follower.tracker.cache_outcome
        if outcome is CacheOutcome.UNKNOWN or run.cache_seen is outcome:
            return
        run.cache_seen = outcome
        self._store.set_cache(launch.launch_id, outcome.value)

    def _compile(self, launch: Launch, run: LaunchRun) -> None:
        """The log's cache lines into the record; a miss explained once, counted by why."""
        if run.compile is None:
            return
        already = run.compile.miss is not None
        patch = run.compile.observe(run.follower.tracker)
        if patch:
            self._store.update_compile_cache(launch.launch_id, patch)
        miss = run.compile.miss
        if miss is not None and not already:
            self._metrics.record_compile_cache_miss(miss.reason)
            why = "; ".join(miss.details)
            self._events.note("compile-cache-miss", f"compile cache miss ({miss.reason.value}): {why}",
                              launch.launch_id, miss.model_dump(mode="json"))

    def flag_stall(self, launch: Launch, run: LaunchRun | None) -> None:
        """A phase far over its usual duration (appliance/observe/ready_eta.py) is reported once, as an event:
        a flag for the operator before the budget runs out, not a kill — the machine's stall watch (no
        progress and no CPU) and the ready budget still decide when a start has failed."""
        if self._view.state is not State.STARTING or run is None:
            return
        expected = status_view.eta(launch, run, self._clock.now())
        stall = expected.stall if expected is not None else None
        if stall is None or stall.phase in run.stall_flagged:
            return
        run.stall_flagged.add(stall.phase)
        self._events.note("likely-stalled",
                          f"{stall.label} {round(stall.took_s)} s, usually {round(stall.usual_s)} s "
                          "(a flag, not a kill: the stall watch and the ready budget still decide)",
                          launch.launch_id, {"phase": stall.phase, "took_s": stall.took_s,
                                             "usual_s": stall.usual_s, "text": stall.text})

    def runtime_unanswered(self, launch: Launch, run: LaunchRun | None, exc: Exception) -> None:
        """The runtime could not be asked this poll (a Docker daemon restarting, an API server's 5xx,
        a log file gone): noted once per distinct error, and looked at again next poll. The engine's
        own death is still seen by the exit watch or the next look that works."""
        message = f"{type(exc).__name__}: {exc}"
        if run is None or message != run.runtime_error:
            log.warning("runtime did not answer for launch %s: %s", launch.launch_id, message)
            self._events.note("runtime-unanswered", f"the {launch.spec.kind} runtime did not answer: {exc}; "
                              "supervision goes on and asks again next poll", launch.launch_id)
        if run is not None:
            run.runtime_error = message

    # ------------------------------------------------------------------------------------------
    # Ready and ended

    def ready(self, action: MarkReady, run: LaunchRun | None) -> Launch | None:
        """The ready time into the record; the start's metrics when the launch is still the machine's.
        Returns that launch (None: the machine moved on)."""
        now = self._clock.now()
        self._store.mark_ready(action.launch_id, now, action.ready_s)
        launch = self._view.launch
        follower = run.follower if run is not None else None
        if launch is None or launch.launch_id != action.launch_id:
            return None
        cold = launch.kind is StartKind.COLD_WARMUP or (run is not None and run.cache_empty)
        start = "cold" if cold else "warm"
        self._metrics.record_ready(launch.spec.recipe, start, action.ready_s)
        outcome = follower.tracker.cache_outcome if follower else CacheOutcome.UNKNOWN
        self._metrics.record_compile_cache(launch.spec.recipe, start, outcome.value)
        if launch.kind is StartKind.WARM and outcome is not CacheOutcome.HIT:
            # ARCHITECTURE "Warm-cache restart": verify the hit from the log; a miss is reported.
            evidence = list(follower.tracker.cache_evidence) if follower else []
            message = f"the warm start did not prove a compile-cache hit ({outcome.value})"
            self._events.note("warm-restart-miss", message, action.launch_id, {"evidence": evidence})
        return launch

    def ended(self, action: MarkEnded, run: LaunchRun | None) -> None:
        """`run`: the launch's state, already dropped by the caller (`LaunchRuns.end`)."""
        now = self._clock.now()
        info = run.exit if run is not None else None
        diagnosis = run.diagnosis if run is not None else None
        follower = run.follower if run is not None else None
        failure = action.failure
        spec = self._store.get_spec(action.launch_id)
        if spec is not None and not action.replaced:
            # exited, stopped or never started: not ready any more (the old engine of a blue/green
            # switch: its series were the new launch's from its start on).
            self._metrics.end_launch(spec.recipe)
        current = self._view.launch
        if self._view.state is State.READY and current is not None:
            # A blue/green start that failed beside the same recipe: the old one still serves.
            self._metrics.set_engine_ready(current.spec.recipe)
        machine_diagnosed = failure is not None and failure.code in MACHINE_DIAGNOSED
        if failure is not None and machine_diagnosed and diagnosis is None and spec is not None:
            # The machine decided (stall, budget): classify with the same rules over the same evidence
            # (an OOM record or a known signature in the tail outranks "stalled").
            started = follower.started_at if follower else now
            launch = Launch(action.launch_id, spec, StartKind.NORMAL, started_at=started)
            diagnosis = self._diagnoser.diagnose(
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
        self._store.mark_ended(action.launch_id, now, action.status, info, diag_dict,
                               follower.tail_text() if follower else None)
