"""`GET /status` and the launch record's diagnosis as plain dicts: the machine plus what the driver
knows about the current launch (its `LaunchRun`), rendered without side effects."""

from __future__ import annotations

from typing import Any

from appliance.observe.log_phases import PHASE_LABELS, CacheOutcome
from appliance.observe.ready_eta import ReadyEta, StartState, ready_eta, recipe_skips, start_state
from controller.runtime.base import ExitInfo
from controller.supervisor.launch_run import LaunchRun
from controller.supervisor.machine import Launch, Machine, State, progress
from controller.supervisor.signals import ApplyOutcome, Failure

# How many of a failed launch's last log lines `GET /status` shows while backing off or failed.
FAILED_TAIL_LINES = 20


def exit_dict(info: ExitInfo | None) -> dict[str, Any] | None:
    if info is None:
        return None
    return {"exit_code": info.exit_code, "signal": info.signal, "oom_killed": info.oom_killed}


def apply_dict(outcome: ApplyOutcome | None) -> dict[str, Any] | None:
    if outcome is None:
        return None
    return {"token": outcome.token, "recipe": outcome.recipe, "outcome": outcome.outcome,
            "failure": failure_dict(outcome.failure) if outcome.failure else None}


def failure_dict(f: Failure) -> dict[str, Any]:
    return {"code": f.code, "summary": f.summary, "hint": f.hint, "retryable": f.retryable}


def ready_s(launch: Launch, run: LaunchRun | None) -> float | None:
    if launch.ready_at is None:
        return None
    recorded = run.recorded_ready_s if run is not None else None
    return recorded if recorded is not None else round(launch.ready_at - launch.started_at, 1)


def describe(run: LaunchRun | None) -> str | None:
    """The progress line: the log's phase, or, before the engine has logged a phase, what the runtime
    says it waits for (a pod without a node), so a long quiet start is never silent."""
    if run is None:
        return None
    tracker = run.follower.tracker
    if tracker.current is None and run.runtime_note:
        return run.runtime_note
    return tracker.describe()


def eta(launch: Launch, run: LaunchRun | None, now: float) -> ReadyEta | None:
    """The expected ready time of a start under way, from earlier launches (appliance/observe/ready_eta.py);
    None once it is ready, before the runtime has started it, or without the driver's run."""
    if run is None or launch.handle is None or launch.ready_at is not None:
        return None
    tracker = run.follower.tracker
    cache = tracker.cache_outcome
    # The log's proof when it has come; before that, what the controller knew (cold if the cache root
    # was empty); an adopted engine, known neither way, is taken for a warm one.
    start = start_state(None if cache is CacheOutcome.UNKNOWN else cache.value, run.cold_start)
    return ready_eta(
        run.history, spec_hash=launch.spec.spec_hash, start=start or StartState.WARM,
        budget_s=launch.spec.ready_budget_s, started_at=launch.started_at, now=now,
        reached={p.value: at for p, at in tracker.reached.items()},
        skip=recipe_skips(launch.spec.argv, launch.spec.platform),
    )


def launch_status(launch: Launch, run: LaunchRun | None, now: float) -> dict[str, Any]:
    tracker = run.follower.tracker if run is not None else None
    started = launch.handle is not None
    # Phases the recipe cannot have (eager: no compile, no capture; CPU: no capture) are not pending.
    skip = recipe_skips(launch.spec.argv, launch.spec.platform)
    return {
        "id": launch.launch_id,
        "kind": launch.kind.value,
        "runtime": launch.spec.kind,
        "ref": launch.handle.ref if launch.handle else None,
        "engine_url": launch.spec.base_url,
        "served_model_name": launch.spec.served_model_name,
        "started_at": launch.started_at if started else None,
        "elapsed_s": round(now - launch.started_at, 1) if started else None,
        "ready_budget_s": launch.spec.ready_budget_s,
        "ready_at": launch.ready_at,
        "ready_s": ready_s(launch, run),
        "phase": tracker.current.value if tracker and tracker.current else None,
        "describe": describe(run),
        "phases": [
            {"phase": p.value, "label": PHASE_LABELS[p], "at": at} for p, at in tracker.phase_list()
            if at is not None or p not in skip
        ] if tracker else [],
        "cache": tracker.cache_outcome.value if tracker else None,
        # Why a compile-cache miss, vLLM's cache dir hash, bad cache roots (None: not recorded).
        "compile_cache": run.compile.summary() if run is not None and run.compile is not None else None,
        "probe_error": run.probe_error if run is not None else None,
        "runtime_note": run.runtime_note if run is not None else None,
        # Set once the runtime said the engine ended (state `exited`, then backoff/failed).
        "exit": exit_dict(run.exit_seen if run is not None else None),
    }


def status(m: Machine, run: LaunchRun | None, now: float,
           last_diagnosis: dict[str, Any] | None) -> dict[str, Any]:
    """`run`: the current launch's (None without one)."""
    if last_diagnosis is None and m.last_failure is not None:
        last_diagnosis = failure_dict(m.last_failure)
    starting = m.state is State.STARTING and m.launch is not None
    failed = m.state in (State.FAILED, State.BACKOFF)
    tail = (last_diagnosis or {}).get("log_tail") if failed else None
    expected = eta(m.launch, run, now) if starting and m.launch is not None else None
    return {
        "state": m.state.value,
        "recipe": m.recipe,
        "failures": m.failures,
        "max_failures": m.policy.max_failures,
        # Only while backing off, never below 0: the console once showed "next try in 0 s" beside a
        # start already under way (the deadline passed, the next poll not yet come).
        "backoff_remaining_s": (round(max(0.0, m.backoff_until - now), 1)
                                if m.state is State.BACKOFF and m.backoff_until is not None else None),
        "last_diagnosis": last_diagnosis,
        # The failed launch's last log lines, while the machine backs off or has given up.
        "failed_log_tail": list(tail)[-FAILED_TAIL_LINES:] if tail else None,
        "last_apply": apply_dict(m.apply),
        "launch": launch_status(m.launch, run, now) if m.launch is not None else None,
        "progress": progress(m, now),
        # The expected ready time from earlier launches of this variant (None when nothing is starting).
        "eta": expected.model_dump(mode="json") if expected is not None else None,
    }
