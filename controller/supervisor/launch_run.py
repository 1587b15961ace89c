"""What the driver knows about one launch, in one object, from its start (or adoption) to its end.

The state machine (`machine.Launch`) holds what the transitions need; the driver holds the rest —
the log follower, the engine's API key, what the exit looked like, the last probe error, what was
already written to the launch record. That used to be about ten dicts keyed by launch id, each
cleaned up by hand in `MarkEnded` (and one, the preflight's "cache empty", never for a preflight
that did not start anything). Here a `LaunchRun` is created where a launch starts or is adopted
and dropped in one place (`LaunchRuns.end`) when it ends, so nothing is left half-cleaned.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from appliance.diagnosis.diagnose import Diagnosis
from appliance.observe.log_phases import CacheOutcome
from appliance.observe.ready_eta import PastLaunch
from controller.runtime.base import ExitInfo
from controller.supervisor.compile_cache import CompileWatch
from controller.supervisor.follow import LogFollower


@dataclass
class LaunchRun:
    launch_id: str
    follower: LogFollower
    # The preflight found the launch's cache root empty (or it will be emptied): a cold start.
    cache_empty: bool = False
    # The per-launch engine API key (engine_key.py): in memory only, never stored or printed.
    engine_key: str | None = None
    # An adopted engine: its launch-to-ready as recorded by the controller that launched it.
    recorded_ready_s: float | None = None
    probe_error: str | None = None  # the latest failed readiness/health probe, for status and diagnosis
    # The runtime's words while the engine is not running yet (kubernetes: a pod waiting for a node
    # inside its grace), for status and, if the budget runs out meanwhile, the diagnosis.
    runtime_note: str | None = None
    runtime_error: str | None = None  # the last poll's runtime failure (noted once, until a poll works)
    # What was last written to the launch record (written again only when it changes).
    cache_seen: CacheOutcome | None = None
    engine_seen: dict[str, object] | None = None
    # The compile-cache record: factors at start, the log's cache lines, why a miss.
    compile: CompileWatch | None = None
    # The exit: `exit_seen` as soon as the runtime says the engine ended (status shows it);
    # `exit`/`diagnosis` once classified or stopped, for the launch record at `MarkEnded`.
    exit_seen: ExitInfo | None = None
    exiting: bool = False  # the exit is being classified: seen once, not again by the next poll
    exit: ExitInfo | None = None
    diagnosis: Diagnosis | None = None
    watched: bool = False  # an exit-watch thread waits on this engine
    # The ETA (appliance/observe/ready_eta.py): earlier ready launches of the recipe, read once at the start;
    # whether the controller started it cold (None: not known, an adopted engine); the phases already
    # flagged as likely stalled (one event per phase).
    history: tuple[PastLaunch, ...] = ()
    cold_start: bool | None = None
    stall_flagged: set[str] = field(default_factory=set)


class LaunchRuns:
    """The live launches by id: normally one; two while a new start overlaps the old one's end."""

    def __init__(self) -> None:
        self._runs: dict[str, LaunchRun] = {}

    def begin(self, run: LaunchRun) -> LaunchRun:
        self._runs[run.launch_id] = run
        return run

    def get(self, launch_id: str) -> LaunchRun | None:
        return self._runs.get(launch_id)

    def end(self, launch_id: str) -> LaunchRun | None:
        """The launch ended: its state goes, all of it (the caller still gets it for the record)."""
        return self._runs.pop(launch_id, None)

    def ids(self) -> frozenset[str]:
        return frozenset(self._runs)

    def __iter__(self) -> Iterator[LaunchRun]:
        return iter(list(self._runs.values()))

    def __len__(self) -> int:
        return len(self._runs)
