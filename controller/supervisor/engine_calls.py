"""The runtime calls around a start and a stop that are not the machine's decisions: emptying the
cache root of a fresh-cache start, what a runtime's refusal to start means (retryable or not, and
the hint), and a stop retried until the engine is gone."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

from appliance.diagnosis.signatures import DiagnosisCode
from appliance.recipe.launch_spec import LaunchSpec
from controller.runtime.base import EngineRuntimeError, ExitInfo, Runtime
from controller.runtime.ports import PortInUse
from controller.supervisor.events import EventLog
from controller.supervisor.signals import Failure, StopEngine

# What `Runtime.start` raises that is the start's failure, not a bug of the driver.
START_ERRORS = (PortInUse, EngineRuntimeError, OSError)


async def empty_cache(root: Path, launch_id: str, events: EventLog) -> None:
    """`fresh_cache`: the variant's cache root goes before the start (a cold start on purpose)."""
    try:
        await asyncio.to_thread(shutil.rmtree, root)
        events.note("cache-emptied", f"emptied {root} (fresh_cache): a cold start", launch_id)
    except FileNotFoundError:
        pass
    except OSError as exc:
        events.note("cache-not-emptied", f"could not empty {root}: {exc}", launch_id)


def start_failure(exc: Exception, spec: LaunchSpec) -> Failure:
    """`exc`: one of START_ERRORS, raised by `Runtime.start` (or by finding the runtime)."""
    if isinstance(exc, PortInUse):
        # Retryable: the holder may be an engine of ours that is still going away.
        return Failure(
            DiagnosisCode.PORT_IN_USE.value, str(exc),
            "stop the process that holds the port (by PID), or give the recipe another engine.port",
            retryable=True)
    if isinstance(exc, EngineRuntimeError):
        return Failure(
            "launch_failed", f"the {spec.kind} runtime could not start the engine: {exc}",
            "see the message: a missing interpreter, image or device is an installation problem",
            retryable=False)
    return Failure("launch_failed", f"could not start the engine: {exc}", "", retryable=True)


async def stop_engine(rt: Runtime, action: StopEngine, retries: int, events: EventLog) -> ExitInfo | None:
    """Stop, retried `retries` times; between tries the runtime says whether the engine ended anyway.
    None or a running engine's info: it did not stop."""
    info: ExitInfo | None = None
    for attempt in range(1, retries + 1):
        try:
            info = await asyncio.to_thread(rt.stop, action.handle, action.grace_s)
            break
        except EngineRuntimeError as exc:
            events.note("stop-error", f"stop attempt {attempt}: {exc}", action.launch_id)
            info = await asyncio.to_thread(rt.inspect, action.handle)
            if not info.running:
                break
    return info
