"""What the supervisor's pure state machine consumes (observations) and produces (actions).

Pure data, no behaviour. The async driver (driver.py) turns the world into observations — an
operator request, a runtime result, a log phase, a CPU sample, a probe answer, the passing of
time — and executes the actions the transition function returns. Observations about one engine
carry its launch id, so a late answer about an engine that is gone is recognised and ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from appliance.recipe.launch_spec import LaunchSpec
from controller.runtime.base import EngineHandle, ExitInfo


class StartKind(StrEnum):
    NORMAL = "normal"
    # ARCHITECTURE "Warm-cache restart": the first start on an empty per-recipe cache root only
    # fills the compile cache (S14c: 352 s cold); the engine is then restarted on the same root
    # (230 s warm) and only that second start serves.
    COLD_WARMUP = "cold-warmup"
    WARM = "warm"
    ADOPTED = "adopted"  # found running after a controller restart: never killed for that


@dataclass(frozen=True)
class Failure:
    """Why a start or a running engine failed, in the terms of appliance.diagnosis.diagnose.Diagnosis."""

    code: str
    summary: str
    hint: str = ""
    retryable: bool = True


# --------------------------------------------------------------------------------------------
# Observations


@dataclass(frozen=True)
class Apply:
    """Operator: run this recipe (replacing whatever runs now)."""

    recipe: str
    fresh_cache: bool = False  # empty the recipe's cache root first (forces the warm-up flow)
    # Restart even when the very same launch spec is already ready (otherwise: a no-op, said so).
    force: bool = False
    # Start beside the serving engine when it fits (blue_green.py); False: always the hold path.
    blue_green: bool = True


@dataclass(frozen=True)
class Restart:
    """Operator: restart the current recipe."""

    # From ready: preflight first while the engine serves, then start the new launch beside it when it
    # fits (blue_green.py: another card, or room on the same one); False: drain, stop, start (the hold).
    blue_green: bool = True


@dataclass(frozen=True)
class Stop:
    """Operator: stop the engine and stay idle."""


@dataclass(frozen=True)
class PreflightOk:
    token: int
    launch_id: str
    spec: LaunchSpec
    warm_restart: bool  # the recipe asks for the warm-cache restart flow
    cache_empty: bool  # its cache root holds no compiled artifacts yet (or will be emptied first)
    # fresh_cache: this (validated) variant root is emptied right before the engine starts — not
    # during preflight, while the old engine may still run on it.
    empty_cache_first: str | None = None
    # Blue/green: the driver found that this launch (already moved to a free port) fits beside the
    # serving engine (controller/supervisor/blue_green.py); it starts while the old one serves.
    beside: bool = False


@dataclass(frozen=True)
class PreflightFailed:
    token: int
    failure: Failure


@dataclass(frozen=True)
class Launched:
    launch_id: str
    handle: EngineHandle


@dataclass(frozen=True)
class LaunchFailed:
    launch_id: str
    failure: Failure


@dataclass(frozen=True)
class PhaseSeen:
    """The log parser saw the start advance (a new phase, a capture step, the KV cache size...)."""

    launch_id: str
    phase: str
    detail: str = ""
    # recorded False: progress for the stall clock only, no event (appliance/observe/phase_record.py)
    recorded: bool = True


@dataclass(frozen=True)
class CpuSample:
    launch_id: str
    cpu_seconds: float  # total CPU time of the engine's processes so far


@dataclass(frozen=True)
class ReadyProbed:
    """`/health` answered AND one real chat completion succeeded."""

    launch_id: str


@dataclass(frozen=True)
class HealthLost:
    """A ready engine stopped answering `/health` (several probes in a row)."""

    launch_id: str
    detail: str


@dataclass(frozen=True)
class ExitSeen:
    """The runtime says the engine ended — before the exit is classified (the kernel's OOM record
    may trail the death). Enough to take it out of the gateway at once."""

    launch_id: str
    exit: ExitInfo


@dataclass(frozen=True)
class Exited:
    """The engine ended on its own; the driver has already classified how."""

    launch_id: str
    exit: ExitInfo
    failure: Failure


@dataclass(frozen=True)
class Drained:
    launch_id: str


@dataclass(frozen=True)
class Stopped:
    """A Stop action finished: the engine is gone."""

    launch_id: str
    exit: ExitInfo


@dataclass(frozen=True)
class Adopted:
    """At controller start-up: an engine this appliance launched is still running."""

    handle: EngineHandle
    spec: LaunchSpec
    # Its record already has a ready time (it was ready before the controller restarted): not
    # re-measured. False: adopted mid-start, its ready is recorded here like any start's.
    ready_recorded: bool = False


@dataclass(frozen=True)
class Tick:
    """Time passed (budgets, stall windows, backoff, the stable window)."""


Observation = (
    Apply | Restart | Stop | PreflightOk | PreflightFailed | Launched | LaunchFailed | PhaseSeen | CpuSample
    | ReadyProbed | HealthLost | ExitSeen | Exited | Drained | Stopped | Adopted | Tick
)


# --------------------------------------------------------------------------------------------
# Actions


@dataclass(frozen=True)
class Reject:
    """The request conflicts with what is happening (the API answers 409)."""

    reason: str


@dataclass(frozen=True)
class ApplyOutcome:
    """What became of one apply request (its preflight token): shown by `status`, so that
    `appliance apply` can say "refused" or "unchanged" instead of "ready: <the old recipe>"."""

    token: int
    recipe: str
    # "pending" | "started" | "refused" | "unchanged" | "failed" (blue/green: the old one serves on)
    outcome: str
    failure: Failure | None = None


@dataclass(frozen=True)
class RunPreflight:
    """load → lint → host facts → admission → render; answer PreflightOk/PreflightFailed."""

    token: int
    recipe: str
    fresh_cache: bool = False


@dataclass(frozen=True)
class StartEngine:
    launch_id: str
    spec: LaunchSpec
    kind: StartKind
    empty_cache_first: str | None = None
    cache_empty: bool = False  # the preflight found the cache root empty: a cold start (metrics)


@dataclass(frozen=True)
class DrainGateway:
    """Tell the gateway to stop sending new requests to this slot and let in-flight ones finish."""

    launch_id: str
    deadline_s: float
    # Why new requests are held meanwhile (a restart, another recipe): the gateway queues them until
    # the next engine is ready instead of refusing them. None: a stop; new requests get 503 at once.
    hold: str | None = None


@dataclass(frozen=True)
class StopEngine:
    launch_id: str
    handle: EngineHandle
    grace_s: float


@dataclass(frozen=True)
class SwitchUpstream:
    """Blue/green: the gateway's upstream is now the new ready slot; requests still running on the old
    one finish (up to ``deadline_s``), then the old engine is stopped (Drained with ``old_id``)."""

    launch_id: str
    base_url: str
    served_model_name: str
    old_id: str
    deadline_s: float


@dataclass(frozen=True)
class SetUpstream:
    """The gateway's upstream is now this ready slot."""

    launch_id: str
    base_url: str
    served_model_name: str


@dataclass(frozen=True)
class ClearUpstream:
    """No ready slot: the gateway answers 503 with Retry-After meanwhile (never hangs)."""

    reason: str
    retry_after_s: float
    # Why new requests are held (a relaunch is scheduled); None: 503 at once, and requests still
    # held are answered with `detail` (the failure's one line, or "stopped").
    hold: str | None = None
    detail: str | None = None


@dataclass(frozen=True)
class MarkReady:
    launch_id: str
    ready_s: float


@dataclass(frozen=True)
class MarkEnded:
    launch_id: str
    status: str  # "stopped" | "failed" | "exited"
    failure: Failure | None = None
    # The old engine of a blue/green switch: its per-launch metrics are already the new launch's.
    replaced: bool = False


@dataclass(frozen=True)
class Notify:
    """An event for the launch record and the /events stream."""

    kind: str
    message: str
    launch_id: str | None = None
    data: dict[str, object] = field(default_factory=dict)


Action = (
    Reject | RunPreflight | StartEngine | DrainGateway | StopEngine | SetUpstream | SwitchUpstream
    | ClearUpstream | MarkReady | MarkEnded | Notify
)
