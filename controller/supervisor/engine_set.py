"""Several engines on one host: the primary driver and the drivers of the engines started beside it.

The primary `Driver` is the one a one-engine host has always had (the gateway's `default` slot,
`POST /apply` without `alongside`, the host watches); nothing about it changes. Each engine started
beside it (`POST /apply {"alongside": true}`, `appliance apply NAME --alongside`) gets a `Driver` of
its own, keyed by its served model name (the recipe's `model.served_name`), built by the factory
service.build hands in: the same host seams (store, runtimes, preflight, prober, clock, events), its
own machine, launch runs and records, and its own gateway slot named by that model name, so the gateway
routes `model` to it (controller/gateway/engines.py). Its launches carry an `alongside` event, by which
a restarted controller gives each of them back to a driver of its own (adoption.py). Each driver runs
its own supervision loop, started and stopped with the primary's; an engine beside the primary that
is stopped (idle, nothing launched) is removed from the set, its scrape targets and its gateway slot
with it (its model then answers 404). One that failed for good stays, with its diagnosis, until it is
stopped. Prometheus' target file is one for the set (scrape_targets.py). Each driver records into a
metrics registry of its own (one shared registry would let a launch clear another engine's per-launch
series); `GET /metrics` exports the primary's with every engine's per-engine series merged in under the
same families, labelled `model` (engine_metrics.py), so the engine alerts fire per model and name it
and the engine-serving dashboard has a Models row.

Whether a recipe may start beside the running engines is alongside_admission.py's judgement.

Named gaps (what follows the primary engine only, for now):
- the GPU watches (GPU memory and health) and the load sampler watch the primary's launch alone. The
  host memory watch follows every engine (host_memory_watch.py `beside`, beside_watch.py): a kernel OOM
  kill is attributed among all their launches (container id, cgroup, pids read before the kill), so an
  engine's own exit diagnosis names the OOM killer, and each launch record gets the host's MemAvailable
  low-water mark and swap peak over its own run and its processes' RssAnon peaks (TP ranks' host RAM);
  but the Prometheus launch watermarks (`appliance_launch_*` minimum and peaks) and the engine process
  memory series stay the primary's (the watch records into the primary's registry);
- a restart of an engine beside the primary drains, stops and starts (no blue/green beside itself);
  so do the primary's apply and restart while a CPU engine, or one not ready yet, runs beside it (its
  CPU fit compares cores with its own serving engine only); beside ready GPU engines it may go
  blue/green (`primary_blue_green`: NVML and MemAvailable already count theirs).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import re
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

from appliance.host_facts import HostFacts
from appliance.recipe.gpu_kv_admission import GpuMemoryView
from appliance.recipe.launch_spec import LaunchSpec
from appliance.recipe.recipe_model import Recipe
from controller.runtime.ports import port_is_free
from controller.supervisor import adoption
from controller.supervisor.alongside_admission import Engine, judgement, primary_refusal
from controller.supervisor.driver import Driver
from controller.supervisor.machine import State
from controller.supervisor.status_view import ready_s

log = logging.getLogger(__name__)

Factory = Callable[[str], Driver]  # served model name → a new driver for an engine beside the primary
Plan = Callable[[str], tuple[Recipe, HostFacts, LaunchSpec]]  # blocking: preflight.plan
RemoveSlot = Callable[[Driver], Awaitable[None]]  # the gateway forgets that driver's slot


# The gateway's engine names (controller/gateway/admin.py `EngineName`); a served model name may hold
# more (`Qwen/Qwen3-8B`).
_SLOT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def slot_name(model: str) -> str:
    """The gateway slot of the engine serving `model`: the model name itself when the gateway takes it
    as an engine name, else a readable form of it with a short hash (two names never share a slot)."""
    if _SLOT_NAME.match(model):
        return model
    readable = re.sub(r"[^A-Za-z0-9._-]", "-", model).lstrip("._-")[:48] or "model"
    return f"{readable}-{hashlib.sha256(model.encode()).hexdigest()[:10]}"


class Judged(NamedTuple):
    """What `EngineSet.judge` says of a recipe to start beside the running engines."""

    model: str  # the served model name it would start under ("" when refused before it was read)
    refused: str | None  # why it may not start; None: it may
    fits: str | None = None  # when it may: why it fits, with the numbers (RAM, cores, cards)


class AlongsideRefused(Exception):
    """An engine may not start beside the running ones: the reason names what is in the way."""


class EngineSet:
    def __init__(self, primary: Driver, factory: Factory | None = None, *, plan: Plan | None = None,
                 remove_slot: RemoveSlot | None = None,
                 is_free: Callable[[str, int], bool] = port_is_free,
                 gpu_memory: Callable[[], GpuMemoryView] | None = None, cpus: int | None = None) -> None:
        self.primary = primary
        self._factory = factory
        self._plan = plan
        self._remove_slot = remove_slot
        self._is_free = is_free
        self._gpu_memory = gpu_memory
        self._cpus = cpus or os.cpu_count() or 1
        self.alongside: dict[str, Driver] = {}
        self._stop: asyncio.Event | None = None  # the controller's; set when `run` runs
        self._loops: dict[str, tuple[asyncio.Event, asyncio.Task[None]]] = {}
        self._primary_loop: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------------------------------
    # Which engine

    @property
    def supports_alongside(self) -> bool:
        return self._factory is not None

    def engines(self) -> list[tuple[str | None, Driver]]:
        """(engine name, driver), the primary first (name None)."""
        return [(None, self.primary), *self.alongside.items()]

    @staticmethod
    def model_of(name: str | None, driver: Driver) -> str | None:
        """The model an engine serves: its launch's served name (the primary's while it has a launch),
        else the name an engine beside the primary was started under."""
        launch = driver.view.launch
        if launch is not None:
            return launch.spec.served_model_name
        return name

    def models(self) -> dict[str, Driver]:
        """Every served model name (and alias) → the driver serving it."""
        found: dict[str, Driver] = {}
        for name, driver in self.engines():
            model = self.model_of(name, driver)
            if model is not None:
                found[model] = driver
                launch = driver.view.launch
                for alias in launch.spec.served_model_aliases if launch is not None else ():
                    found.setdefault(alias, driver)
        return found

    def for_model(self, model: str) -> Driver | None:
        return self.models().get(model)

    # ------------------------------------------------------------------------------------------
    # Starting one beside the others

    def judge(self, recipe: str) -> Judged:
        """Blocking: the served model name `recipe` would start under, why it may not start beside the
        running engines (None: it may) and, when it may, why it fits (the numbers). Raises what
        preflight.plan raises for a recipe that does not load or render."""
        if self._plan is None or self._factory is None:
            return Judged("", "this controller runs one engine: it has no way to start one beside it")
        primary = self.primary.view
        if primary.launch is None and primary.state in (State.IDLE, State.FAILED):
            # Nothing to start beside; and the gateway's default slot keeps claiming the name the
            # primary last served (controller/gateway/engines.py), which a slot of the same name
            # would be refused.
            return Judged("", f"the primary engine runs nothing (state {primary.state.value}): apply "
                          f"{recipe} without --alongside, as the primary engine")
        new, facts, spec = self._plan(recipe)
        engines = [self._beside(name, d) for name, d in self.engines()
                   if d.view.state is not State.IDLE or d.view.launch]
        gpu = self._gpu_memory() if self._gpu_memory is not None else None
        why, fits = judgement(new, facts, spec, engines, is_free=self._is_free, cpus=self._cpus, gpu=gpu)
        return Judged(spec.served_model_name, why, fits or None)

    def _beside(self, name: str | None, d: Driver) -> Engine:
        return Engine(self.model_of(name, d) or "default", d.view.state, d.view.recipe,
                      d.view.launch.spec if d.view.launch is not None else None)

    def judge_primary(self, recipe: str) -> str | None:
        """Blocking: why the primary may not switch to `recipe` while engines run beside it (a name or
        port one of them holds); None: it may (and without engines beside it, nothing is read)."""
        if not self.alongside or self._plan is None:
            return None
        _, _, spec = self._plan(recipe)
        return primary_refusal(spec, [self._beside(name, d) for name, d in self.alongside.items()])

    def primary_blue_green(self, asked: bool = True) -> bool:
        """Whether the primary's apply or restart may take the blue/green path: as asked while it runs
        alone or beside ready GPU engines only — NVML's free memory and MemAvailable already count what
        they hold, and their ports are bound, so the new engine's fit and port are judged truly. Never
        beside a CPU engine or one not ready yet: the CPU fit compares cores with the primary's own
        serving engine only, and a starting engine has not shown its peak or bound its port."""
        if not asked:
            return False
        for driver in self.alongside.values():
            launch = driver.view.launch
            if driver.view.state is not State.READY or launch is None or launch.spec.platform == "cpu":
                return False
        return True

    def add(self, model: str) -> Driver:
        """A new driver for an engine beside the primary, serving `model`; its loop runs at once when
        the set's does. Raises AlongsideRefused when that name is taken."""
        if self._factory is None:
            raise AlongsideRefused("this controller runs one engine: it has no way to start one beside it")
        holder = self.for_model(model)
        if holder is not None or model in self.alongside:
            raise AlongsideRefused(f"model name {model!r} is served by another engine")
        driver = self._factory(model)
        self.alongside[model] = driver
        if self._stop is not None:
            self._start_loop(model, driver)
        return driver

    # ------------------------------------------------------------------------------------------
    # Loops

    def _start_loop(self, name: str, driver: Driver) -> None:
        own = asyncio.Event()
        self._loops[name] = (own, asyncio.create_task(driver.run(own), name=f"supervisor {name}"))

    async def run(self, stop: asyncio.Event) -> None:
        """Every driver's supervision loop until `stop`; engines beside the primary that were stopped
        are removed every poll."""
        self._stop = stop
        self._primary_loop = asyncio.create_task(self.primary.run(stop), name="supervisor")
        for name, driver in list(self.alongside.items()):
            self._start_loop(name, driver)
        try:
            while not stop.is_set():
                await self.reap()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=self.primary.config.poll_interval_s)
        finally:
            for own, _ in self._loops.values():
                own.set()
            loops = [task for _, task in self._loops.values()]
            await asyncio.gather(self._primary_loop, *loops, return_exceptions=True)
            self._loops.clear()

    def stopped(self) -> list[str]:
        """The engines beside the primary that are stopped: idle, nothing launched or draining."""
        return [name for name, d in self.alongside.items()
                if d.view.state is State.IDLE and d.machine.launch is None and d.machine.old is None]

    async def reap(self) -> list[str]:
        """Remove the stopped engines beside the primary: their loop, their scrape targets and their
        gateway slot (their model answers 404 from then on)."""
        gone = self.stopped()
        for name in gone:
            driver = self.alongside.pop(name)
            loop = self._loops.pop(name, None)
            if loop is not None:
                loop[0].set()
                with contextlib.suppress(asyncio.CancelledError):
                    await loop[1]
            await driver.settle()
            if driver.scrape_targets is not None:
                driver.scrape_targets.forget(name)
            if self._remove_slot is not None:
                try:
                    await self._remove_slot(driver)
                except Exception as exc:  # noqa: BLE001 - the gateway's failure is said, never fatal
                    driver.note("gateway-error", f"removing engine {name!r}: {exc}")
            driver.note("alongside-removed", f"engine {name!r} stopped: removed from the engine set")
        return gone

    async def adopt(self) -> None:
        """A controller restart: the primary takes the engine it takes today, every engine started
        beside it goes back to a driver of its own."""
        marked = adoption.started_alongside(self.primary.host)
        await self.primary.adopt(skip=marked if self._factory is not None else None)
        if self._factory is None:
            return
        for found in await adoption.find_alongside(self.primary.host,
                                                   self.primary.machine.policy.stop_grace_s, marked):
            model = found.spec.served_model_name
            if self.for_model(model) is not None or model in self.alongside:
                continue  # never two engines under one name; the primary's stays
            driver = self._factory(model)
            self.alongside[model] = driver
            await driver.take(found)

    def liveness_problem(self) -> str | None:
        """The first engine whose supervision has stopped (or the store's problem), named; None: every
        engine's loop comes round."""
        for name, driver in self.engines():
            problem = driver.liveness_problem()
            if problem is not None:
                return problem if name is None else f"engine {name!r}: {problem}"
        return None

    async def shutdown(self) -> None:
        for _, driver in self.engines():
            await driver.shutdown()

    # ------------------------------------------------------------------------------------------
    # Status

    def entries(self) -> list[dict[str, Any]]:
        """`GET /status` → `engines`: one short entry per engine, the primary first."""
        rows: list[dict[str, Any]] = []
        for name, d in self.engines():
            m = d.machine
            if name is None and m.state is State.IDLE and m.launch is None:
                continue  # the primary with nothing to say
            launch = m.launch
            run = d.runs.get(launch.launch_id) if launch is not None else None
            diagnosis = d.last_diagnosis
            summary = diagnosis.get("summary") if isinstance(diagnosis, dict) else None
            if summary is None and m.last_failure is not None:
                summary = m.last_failure.summary
            rows.append({
                "engine": name or "default", "primary": name is None, "model": self.model_of(name, d),
                "recipe": m.recipe, "state": m.state.value,
                "launch_id": launch.launch_id if launch is not None else None,
                "port": launch.spec.port if launch is not None else None,
                "ready_s": ready_s(launch, run) if launch is not None else None,
                "diagnosis": summary,
            })
        return rows
