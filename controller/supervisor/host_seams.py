"""What every engine supervised on this host shares: the host's seams, built once per controller.

The driver supervises one engine (its machine, its launch runs, its hold, its gateway slot: per
engine); what it reaches the world through is per host and lives here — the runtimes (and why the
missing kinds are missing), the launch store, the metrics registry, the clock, the event stream, the
prober, preflight and the host's own watches (OOM kills, GPU events, per-process RSS). A controller
that supervises several engines side by side hands each driver the same `HostSeams`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from appliance.observe.gpu_events import GpuEvent
from appliance.observe.kmsg import OomEvent
from appliance.recipe.launch_spec import LaunchSpec
from controller.metrics import ControllerMetrics
from controller.runtime.base import EngineHandle, EngineRuntimeError, Provenance, Runtime
from controller.store import Store
from controller.supervisor.blue_green import Fit
from controller.supervisor.clock import Clock
from controller.supervisor.events import EventLog
from controller.supervisor.probes import Prober
from controller.supervisor.signals import PreflightFailed, PreflightOk

PreflightFn = Callable[[int, str, bool], Awaitable[PreflightOk | PreflightFailed]]
ProvenanceFn = Callable[[LaunchSpec], Provenance]
SpecForRecipe = Callable[[str], LaunchSpec | None]
OomSource = Callable[[str], Sequence[OomEvent]]
# launch id → the GPU kernel events attributed to it (controller/supervisor/gpu_health_watch.py).
GpuEventSource = Callable[[str], Sequence[GpuEvent]]
# recipe name → its MemAvailable floor in bytes (controller/watch/recipe_target.py; blocking: loads
# the recipe), for `MemAvailableBelowRecipeTarget`.
MemTarget = Callable[[str], int | None]
# Blue/green (blue_green.py; blocking): does a launch of this recipe (its start cold? None: as its cache
# is now) fit beside the serving engine (its spec and handle)? The verdict, its numbers and the port. The
# spec is the serving launch's own (the one it was started or adopted with, as in its launch record):
# its cards and cores are judged from it, never from its recipe file, which may have changed since.
BesideFn = Callable[[str, bool | None, LaunchSpec, EngineHandle], Fit]
# Called (as a task) when a launch becomes ready: the kernel-path/deployment proof
# (controller/evaluation/proof.py, DOMAIN §7).
OnReady = Callable[[str, LaunchSpec, EngineHandle], Coroutine[Any, Any, None]]
# The host watch's peak RssAnon per engine pid for a launch: with TP > 1 the record gives each rank's
# worker process its own host RAM (DOMAIN §3: memory is per worker).
ProcessPeaks = Callable[[str], Mapping[int, int]]


@dataclass(frozen=True)
class HostSeams:
    runtimes: Mapping[str, Runtime]
    store: Store
    metrics: ControllerMetrics
    clock: Clock
    events: EventLog
    prober: Prober
    preflight: PreflightFn
    # Kinds this host does not offer, and why (service.build fills it from the registry).
    unavailable_runtimes: Mapping[str, str]
    provenance: ProvenanceFn | None = None
    spec_for_recipe: SpecForRecipe | None = None
    oom_events: OomSource | None = None
    gpu_events: GpuEventSource | None = None
    mem_target: MemTarget | None = None
    process_peaks: ProcessPeaks | None = None
    beside: BesideFn | None = None  # None: every switch drains, stops and starts with the hold
    on_ready: OnReady | None = None  # None: nothing extra at ready

    def runtime(self, handle_or_spec: EngineHandle | LaunchSpec) -> Runtime:
        kind = handle_or_spec.kind
        rt = self.runtimes.get(kind)
        if rt is None:
            why = self.unavailable_runtimes.get(kind)
            raise EngineRuntimeError(f"no {kind!r} runtime is configured in this controller"
                                     + (f": {why}" if why else ""))
        return rt

    async def mem_target_of(self, spec: LaunchSpec) -> int | None:
        """The recipe's MemAvailable floor (recipe_target.py), loaded off the loop."""
        if self.mem_target is None:
            return None
        return await asyncio.to_thread(self.mem_target, spec.recipe)
