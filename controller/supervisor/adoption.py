"""A controller restart never kills a healthy engine: find ours among what the runtimes hold.

Every runtime lists the engines carrying this appliance's labels (`Runtime.adopt`). Only engines with
a known launch spec can be supervised (its launch record, or the recipe's plan for an engine of this
instance whose record is gone); the newest of those is the one to adopt and any older one of ours is
stopped (the host holds one engine at a time, DOMAIN §3). The chosen engine's record is made or
completed and its `LaunchRun` rebuilt: its engine key read back from where the runtime put it, its
recorded ready time, or, mid-start, its compile-cache record resumed. The driver then hands it to the
machine (`Adopted`) and watches it like any start.

Engines started beside the primary (controller/supervisor/engine_set.py) carry an `alongside` event
in their launch record: the primary's search skips them (`skip`), and `find_alongside` hands each of
them, one per served model name, to a driver of its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from appliance.recipe.engine_key import recipe_key
from appliance.recipe.launch_spec import LaunchSpec
from controller.runtime.base import EngineHandle, EngineRuntimeError, Provenance
from controller.store import REDACTED
from controller.supervisor import compile_cache
from controller.supervisor.follow import LogFollower
from controller.supervisor.host_seams import HostSeams
from controller.supervisor.launch_run import LaunchRun
from controller.supervisor.signals import StartKind

# The event kind that marks a launch started beside the primary engine (its driver notes it at start).
ALONGSIDE_EVENT = "alongside"

# Which engines a search leaves alone: neither taken nor stopped.
Skip = Callable[[EngineHandle], bool]


def started_alongside(host: HostSeams) -> Skip:
    """Whether an engine's launch record says it was started beside the primary."""
    def marked(handle: EngineHandle) -> bool:
        record = host.store.get_launch(handle.launch_id)
        return record is not None and any(e.kind == ALONGSIDE_EVENT for e in record.events)
    return marked


@dataclass(frozen=True)
class Found:
    """The engine to adopt: its handle, its spec, its rebuilt run and its recipe's MemAvailable floor."""

    handle: EngineHandle
    spec: LaunchSpec
    run: LaunchRun
    mem_target: int | None


async def _running(host: HostSeams) -> list[EngineHandle]:
    found: list[EngineHandle] = []
    for rt in host.runtimes.values():
        try:
            found.extend(await asyncio.to_thread(rt.adopt))
        except EngineRuntimeError as exc:
            host.events.note("adopt-error", f"{rt.name} runtime: {exc}")
    return found


async def find_engine(host: HostSeams, stop_grace_s: float, skip: Skip | None = None) -> Found | None:
    """The newest supervisable engine of ours (older ones stopped, their records closed), or None.
    Engines `skip` names are left alone (engines beside the primary, each adopted by its own driver)."""
    note = host.events.note
    found = [h for h in await _running(host) if skip is None or not skip(h)]
    if not found:
        return None
    # First which engines can be supervised at all (a known spec), newest first; only then is
    # one chosen and the other ones stopped. An engine whose spec is unknown is never the reason
    # to stop a healthy one of ours (it was another appliance's container).
    found.sort(key=lambda h: h.started_at, reverse=True)
    known: list[tuple[EngineHandle, LaunchSpec, bool]] = []  # (handle, spec, spec from the store)
    for candidate in found:
        stored = host.store.get_spec(candidate.launch_id)
        if stored is not None:
            known.append((candidate, stored, True))
            continue
        if candidate.instance is None:
            # No instance label and not in our records: another appliance's engine launched before
            # instance ids existed, or a hand-made one. Never ours to supervise or stop.
            note("adopt-skipped", f"engine {candidate.ref} ({candidate.recipe}) carries no "
                 "appliance instance label and is not in this appliance's launch records: "
                 "left alone",
                 candidate.launch_id)
            continue
        planned = (await asyncio.to_thread(host.spec_for_recipe, candidate.recipe)
                   if host.spec_for_recipe is not None else None)
        if planned is None:
            note("adopt-skipped", f"engine {candidate.ref} ({candidate.recipe}) is running but its "
                 "launch spec is unknown: left alone, not supervised", candidate.launch_id)
            continue
        known.append((candidate, planned, False))
    if not known:
        return None
    handle, spec, recorded = known[0]
    for extra, _, extra_recorded in known[1:]:
        # The host holds one engine at a time (DOMAIN §3); an older leftover of ours is stopped.
        note("adopt-extra", f"stopping older engine {extra.ref} ({extra.recipe})", extra.launch_id)
        info = await asyncio.to_thread(host.runtime(extra).stop, extra, stop_grace_s)
        if extra_recorded:
            host.store.mark_ended(extra.launch_id, host.clock.now(), "stopped", info)
    if not recorded:
        host.store.create_launch(handle.launch_id, spec, StartKind.ADOPTED.value, Provenance(),
                                 handle.started_at)
        host.store.set_handle(handle.launch_id, handle, handle.started_at)
    run = await _rebuild_run(host, handle, spec)
    return Found(handle, spec, run, await host.mem_target_of(spec))


async def find_alongside(host: HostSeams, stop_grace_s: float, marked: Skip) -> list[Found]:
    """The running engines of ours that were started beside the primary (`marked`), with a launch
    record: the newest per served model name (an older one of the same name is stopped: the gateway
    routes a name to one engine)."""
    note = host.events.note
    found = sorted((h for h in await _running(host) if marked(h)), key=lambda h: h.started_at, reverse=True)
    taken: dict[str, Found] = {}
    for handle in found:
        spec = host.store.get_spec(handle.launch_id)
        if spec is None:
            continue  # marked, so it has a record; a record without a spec cannot be supervised
        if spec.served_model_name in taken:
            note("adopt-extra", f"stopping older engine {handle.ref} ({handle.recipe}): engine "
                 f"{spec.served_model_name!r} is a newer one", handle.launch_id)
            info = await asyncio.to_thread(host.runtime(handle).stop, handle, stop_grace_s)
            host.store.mark_ended(handle.launch_id, host.clock.now(), "stopped", info)
            continue
        run = await _rebuild_run(host, handle, spec)
        taken[spec.served_model_name] = Found(handle, spec, run, await host.mem_target_of(spec))
    return list(taken.values())


async def _rebuild_run(host: HostSeams, handle: EngineHandle, spec: LaunchSpec) -> LaunchRun:
    note = host.events.note
    run = LaunchRun(handle.launch_id, LogFollower(handle.launch_id, started_at=handle.started_at))
    # The key lives only where the runtime put it for the engine (its key file): read it back
    # from there (or the recipe's own `--api-key`, when the spec at hand still holds it: a stored
    # spec is redacted).
    key: str | None = None
    try:
        key = await asyncio.to_thread(host.runtime(handle).read_engine_key, handle)
    except EngineRuntimeError as exc:
        note("adopt-key-unknown", f"cannot read the engine's API key: {exc}", handle.launch_id)
    own = recipe_key(spec)
    run.engine_key = key or (own if own != REDACTED else None)
    record = host.store.get_launch(handle.launch_id)
    if record is not None and record.ready_s is not None:
        run.recorded_ready_s = record.ready_s
    elif record is not None:
        # Adopted mid-start: its record is completed here like any start's — phases
        # after the adoption, ready time (MarkReady), cache verdict and the compile-cache evidence.
        try:
            run.compile = await asyncio.to_thread(compile_cache.resume, host.store, handle.launch_id,
                                                  spec, record.compile_cache)
        except (ValueError, OSError) as exc:  # a record this version cannot read: the start goes on
            note("compile-cache-warning", f"could not resume the compile-cache record: {exc}",
                 handle.launch_id)
    run.history = tuple(host.store.ready_history(spec.recipe, spec.spec_hash, exclude=handle.launch_id))
    return run
