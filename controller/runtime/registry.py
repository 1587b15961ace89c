"""Runtime kind → its effectful half. Adding a runtime is one line in `RUNTIMES` (and one in
appliance/runtimes/registry.py for its pure half).

Each entry names the module of the runtime and says whether it needs something that may be absent
on this host (a daemon, a cluster, an SDK). Modules are imported only when their kind is asked for,
so a host without the docker SDK still runs the process runtime (as on the H200 host). The module provides
`make(ctx: RuntimeContext) -> Runtime` and `engine_key_of(ref: str) -> str | None` (the running
engine's API key by the runtime's own id, for a CLI that has no runtime object).

The key is LaunchSpec.kind (= `spec.runtime.kind`) and EngineHandle.runtime.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from controller.runtime.base import EngineRuntimeError, Runtime, RuntimeUnconfigured


@dataclass(frozen=True)
class RuntimeContext:
    """What a runtime may need to be built: `runs_dir` holds the process runtime's per-launch files
    (runtimes whose state lives in a daemon or a cluster keep nothing on disk)."""

    runs_dir: Path
    # This appliance instance's id (controller/settings.instance_id): the runtime labels its engines
    # with it and adopts only engines that carry it. None: unscoped (tests, tooling).
    instance_id: str | None = None


@dataclass(frozen=True)
class RuntimeEntry:
    module: str  # provides `make(ctx)` and `engine_key_of(ref)`
    # Needs something that may be absent here (daemon, cluster, SDK): at controller start it is
    # probed with `adopt()`, and left out with a note if it does not answer.
    external: bool
    # The pip extra that installs its SDK, when that SDK is optional (not a project dependency): its
    # absence is then a choice of the installer, not a fault, and the reason says what to install.
    extra: str | None = None


RUNTIMES: Mapping[str, RuntimeEntry] = {
    "process": RuntimeEntry("controller.runtime.process", external=False),
    "docker": RuntimeEntry("controller.runtime.docker", external=True),
    "kubernetes": RuntimeEntry("controller.runtime.kubernetes", external=True, extra="kubernetes"),
}
KINDS: tuple[str, ...] = tuple(RUNTIMES)


def entry(kind: str) -> RuntimeEntry:
    try:
        return RUNTIMES[kind]
    except KeyError:
        raise ValueError(f"unknown runtime kind {kind!r}; expected one of {', '.join(KINDS)}") from None


def make_runtime(kind: str, runs_dir: Path, instance_id: str | None = None) -> Runtime:
    """The runtime of `kind`. Raises ImportError when its SDK is not installed on this host."""
    module = importlib.import_module(entry(kind).module)
    make = cast(Callable[[RuntimeContext], Runtime], module.make)
    return make(RuntimeContext(runs_dir=runs_dir, instance_id=instance_id))


def engine_key_of(kind: str, ref: str) -> str | None:
    """The API key of running engine `ref` of `kind` (ImportError: no SDK here)."""
    module = importlib.import_module(entry(kind).module)
    read = cast(Callable[[str], "str | None"], module.engine_key_of)
    return read(ref)


@dataclass(frozen=True)
class Unavailable:
    """Why a runtime of the registry is not offered on this host. `fault`: something is broken
    (an SDK missing, a daemon or cluster not answering) and the operator is told at start; not a
    fault: the host is simply not set up for it (no cluster configuration), said only when a recipe
    of that kind is applied."""

    kind: str
    reason: str
    fault: bool


def available_runtimes(runs_dir: Path, skip: Iterable[str] = (), instance_id: str | None = None
                       ) -> tuple[dict[str, Runtime], dict[str, Unavailable]]:
    """Every runtime that can work on this host, and why each other one cannot.
    `skip`: kinds the operator turned off (e.g. `--no-docker`)."""
    runtimes: dict[str, Runtime] = {}
    missing: dict[str, Unavailable] = {}
    skipped = set(skip)
    for kind, item in RUNTIMES.items():
        if kind in skipped:
            missing[kind] = Unavailable(kind, f"{kind} runtime turned off for this controller", fault=False)
            continue
        try:
            rt = make_runtime(kind, runs_dir, instance_id)
        except ImportError as exc:  # no SDK on this host: the others still work
            if item.extra is not None:
                missing[kind] = Unavailable(
                    kind, f"{kind} runtime not installed: install the appliance with its "
                          f"[{item.extra}] extra (pip install 'llm-appliance[{item.extra}]')", fault=False)
            else:
                missing[kind] = Unavailable(
                    kind, f"{kind} runtime unavailable: the {kind} SDK cannot be imported ({exc})",
                    fault=True)
            continue
        if item.external:
            try:
                rt.adopt()  # also proves the daemon / cluster answers
            except RuntimeUnconfigured as exc:
                missing[kind] = Unavailable(kind, f"{kind} runtime unavailable: {exc}", fault=False)
                continue
            except EngineRuntimeError as exc:
                missing[kind] = Unavailable(kind, f"{kind} runtime unavailable: {exc}", fault=True)
                continue
        runtimes[kind] = rt
    return runtimes, missing
