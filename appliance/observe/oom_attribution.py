"""Which launch did an OOM kill hit, and what does it mean. Pure.

Attribution (`attribute_oom`): an OOM event names the victim's pid and, on every kernel since 4.19,
its memory cgroup (`task_memcg=/docker/<id>`, `/system.slice/docker-<id>.scope`, …). A launch is
matched by, in order of trust:

1. container id — found in the event's cgroup paths (or the v1 `cpuset=` leaf name); full id or a
   unique prefix of at least 12 characters, as `docker ps` prints them;
2. cgroup path — the event's cgroup is one of the launch's cgroups or below one;
3. pid — the victim pid is in the launch's last known process set. The victim is dead when the
   event arrives, so callers pass the pids they sampled *before* (the watch sampler keeps them).

Diagnosis (`diagnose_oom`): DOMAIN §3/§5 — the TP=4 graph deaths were *global* OOMs (host RAM +
swap exhausted, `constraint=CONSTRAINT_NONE … global_oom`), not container limits; the action is
more swap / `vm.swappiness=200` / AOT warm restart / eager / smaller TP. A *cgroup* OOM
(`CONSTRAINT_MEMCG`, `Memory cgroup out of memory`) means the container was created with a memory
limit — cgroup v2 counts page cache, so 29 GB of mmapped weights hit a 32 GiB limit — and the fix
is to recreate the container without one (`docker update --memory=0` means "unchanged").
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Generic, Literal, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict

from appliance.observe.kmsg import OomEvent, OomScope

_GIB = 1024**3


class LaunchLike(Protocol):
    """What attribution needs to know about a launch (the store's records can satisfy it)."""

    @property
    def launch_id(self) -> str: ...
    @property
    def container_id(self) -> str | None: ...
    @property
    def cgroup_paths(self) -> tuple[str, ...]: ...
    @property
    def pids(self) -> frozenset[int]: ...


class LaunchTarget(BaseModel):
    """A plain LaunchLike: the supervisor builds one per live (or just-ended) launch."""

    model_config = ConfigDict(frozen=True)

    launch_id: str
    recipe: str | None = None
    container_id: str | None = None  # docker runtime
    cgroup_paths: tuple[str, ...] = ()  # memory cgroup paths as the kernel prints them (/docker/<id>)
    pids: frozenset[int] = frozenset()  # engine process tree as last sampled (process runtime too)


class MatchKind(StrEnum):
    CONTAINER_ID = "container_id"
    CGROUP = "cgroup"
    PID = "pid"


L = TypeVar("L", bound=LaunchLike)


@dataclass(frozen=True)
class OomAttribution(Generic[L]):
    launch: L
    matched_by: MatchKind


# 64 hex characters as a whole path component or after a runtime prefix:
# /docker/<id>, /system.slice/docker-<id>.scope, cri-containerd-<id>.scope, crio-<id>, libpod-<id>
_CONTAINER_ID = re.compile(r"(?:^|[/-])([0-9a-f]{64})(?:\.scope)?(?=/|$)")


def container_ids_in(path: str | None) -> list[str]:
    """Container ids named in a cgroup path (the innermost last)."""
    return _CONTAINER_ID.findall(path) if path else []


def event_container_id(event: OomEvent) -> str | None:
    """The victim's container id: from task_memcg, then oom_memcg, then the v1 cpuset leaf."""
    for candidate in (event.task_memcg, event.oom_memcg, event.cpuset):
        ids = container_ids_in(candidate)
        if ids:
            return ids[-1]
    return None


def _same_container(event_id: str, launch_id: str) -> bool:
    short = min(len(event_id), len(launch_id))
    return short >= 12 and event_id[:short] == launch_id[:short]


def _under(path: str, parent: str) -> bool:
    parent = parent.rstrip("/") or "/"
    return path == parent or path.startswith(parent + "/")


def attribute_oom(event: OomEvent, launches: Iterable[L]) -> OomAttribution[L] | None:
    """The launch the OOM event hit, or None when it hit something else on the host."""
    candidates = list(launches)
    cid = event_container_id(event)
    if cid is not None:
        for launch in candidates:
            if launch.container_id and _same_container(cid, launch.container_id):
                return OomAttribution(launch, MatchKind.CONTAINER_ID)
    paths = [p for p in (event.task_memcg, event.oom_memcg) if p]
    for path in paths:
        for launch in candidates:
            # "/" as a launch cgroup would claim every process on the host: not evidence.
            if any(lp.rstrip("/") and _under(path, lp) for lp in launch.cgroup_paths):
                return OomAttribution(launch, MatchKind.CGROUP)
    if event.pid is not None:
        for launch in candidates:
            if event.pid in launch.pids:
                return OomAttribution(launch, MatchKind.PID)
    return None


# --- diagnosis ----------------------------------------------------------------------------------


DiagnosisCode = Literal["global_oom", "cgroup_oom", "node_constrained_oom", "oom_unknown_scope"]

# Phase names as the engine-log follower reports them (appliance/observe/log_phases.py `Phase`, DOMAIN §4)
# → how an operator says it. First match wins, so the specific words come first.
_PHASE_WORDS: tuple[tuple[str, str], ...] = (
    ("graph", "graph capture"),
    ("capture", "graph capture"),
    ("compile", "torch.compile"),
    ("kv", "KV cache allocation"),
    ("profil", "memory profiling"),
    ("warm", "warm-up"),
    ("weight", "weights load"),
    ("load", "weights load"),
    ("init", "engine init"),
    ("api_up", "serving"),
    ("ready", "serving"),
    ("serv", "serving"),
    ("api", "API server start"),
    ("start", "start-up"),
)
_DONE_SUFFIXES = ("_done", "_finished", "_loaded")


def phase_words(phase: str | None) -> str | None:
    """`graph_capture` → "graph capture", `graph_capture_done` → "after graph capture"."""
    if not phase:
        return None
    low = phase.lower()
    done = low.endswith(_DONE_SUFFIXES)
    for key, words in _PHASE_WORDS:
        if key in low:
            return f"after {words}" if done and words != "serving" else words
    return low.replace("_", " ")


class OomDiagnosis(BaseModel):
    model_config = ConfigDict(frozen=True)

    code: DiagnosisCode
    title: str  # e.g. "global OOM during graph capture", "container memory limit"
    detail: str  # what was killed, how big, which cgroup
    action: str  # what to change (DOMAIN §5)
    scope: OomScope
    phase: str | None = None
    launch_id: str | None = None


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / _GIB:.2f} GiB"


def _victim(event: OomEvent) -> str:
    who = f"{event.task or '?'} (pid {event.pid if event.pid is not None else '?'})"
    rss = f", anon-rss {_gib(event.anon_rss_bytes)}" if event.anon_rss_bytes is not None else ""
    cg = f", cgroup {event.cgroup_path}" if event.cgroup_path else ""
    return f"killed {who}{rss}{cg}"


def diagnose_oom(
    event: OomEvent, phase: str | None = None, launch_id: str | None = None
) -> OomDiagnosis:
    """Phrase the diagnosis of one OOM kill. `phase` is the engine phase at the time of the kill
    (from the log follower); the title names it because it decides the remedy: a global OOM during
    graph capture is the DOMAIN §3 signature of recipe C′/TP=4 graph on 31 GiB of RAM."""
    when = phase_words(phase)
    # "after graph capture" reads as it is; other phases read "during graph capture".
    during = "" if not when else f" {when}" if when.startswith("after ") else f" during {when}"
    detail = _victim(event)
    if event.scope is OomScope.GLOBAL:
        return OomDiagnosis(
            code="global_oom",
            title=f"global OOM{during}",
            detail=f"host RAM + swap exhausted ({event.constraint or 'no cgroup constraint'}); {detail}",
            action=(
                "Not a container limit (DOMAIN §3). Add swap (recipe C: +4 GiB swapfile, 8 GiB total), set "
                "vm.swappiness=200 (S14c: margin 0.29→2.71 GiB), warm the AOT compile cache and restart "
                "(swap-out need 8.8→~3 GiB), or fall back to eager / a smaller TP."
            ),
            scope=event.scope,
            phase=phase,
            launch_id=launch_id,
        )
    if event.scope is OomScope.CGROUP:
        limit_of = f" of {event.oom_memcg}" if event.oom_memcg else ""
        return OomDiagnosis(
            code="cgroup_oom",
            title="container memory limit",
            detail=f"memory cgroup limit{limit_of} hit{during}; {detail}",
            action=(
                "Recreate the engine container with no memory limit (DOMAIN §3: cgroup v2 counts page cache, "
                "29 GB of mmapped weights + 4 workers hit a 32 GiB limit; `docker update --memory=0` means "
                "'unchanged', not 'unlimited'); TP=4 27B W8A8 needs no limit or ≥ 48 GiB."
            ),
            scope=event.scope,
            phase=phase,
            launch_id=launch_id,
        )
    if event.scope in (OomScope.CPUSET, OomScope.MEMPOLICY):
        return OomDiagnosis(
            code="node_constrained_oom",
            title=f"{event.scope.value}-constrained OOM{during}",
            detail=f"the allowed NUMA nodes ran out ({event.constraint}); {detail}",
            action="Check the container's --cpuset-mems / numactl binding: the allowed nodes are too small.",
            scope=event.scope,
            phase=phase,
            launch_id=launch_id,
        )
    return OomDiagnosis(
        code="oom_unknown_scope",
        title=f"OOM kill{during}",
        detail=f"scope not printed by the kernel; {detail}",
        action="Read `dmesg` around the kill for `constraint=` to tell global from container-limit OOM.",
        scope=event.scope,
        phase=phase,
        launch_id=launch_id,
    )
