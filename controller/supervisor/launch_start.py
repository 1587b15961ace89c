"""The two decisions of a start that are not the machine's: emptying the cache root of a fresh-cache
start, and what a runtime's refusal to start means (retryable or not, and the hint)."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

from appliance.diagnosis.diagnosis import DiagnosisCode
from appliance.recipe.launch_spec import LaunchSpec
from controller.runtime.base import EngineRuntimeError
from controller.runtime.ports import PortInUse
from controller.supervisor.events import EventLog
from controller.supervisor.signals import Failure

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
