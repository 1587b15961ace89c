"""May a recipe start beside the engines that run now? (`appliance apply NAME --alongside`)

A judgement over what the engine set knows (engine_set.py): the new recipe, its rendering on this
host, the host facts now and each engine's launch (read from its launch spec, never from its recipe
file). Blocking: it looks at the recipe's cache root and probes its port (engine_set.judge runs it in
a worker thread). The first refusal is the answer, and it names the engine in the way and what to stop:

- an engine still starting (or about to start again: preflight, starting, exited, backoff): its peak is
  not in MemAvailable yet, so nothing beside it can be judged — wait for it to be ready;
- the recipe is one an engine runs already (restart that engine instead);
- a model name (the served name or an alias) another engine claims: the gateway routes a name to
  one engine (controller/gateway/engines.py);
- the engine port: another engine's, or in use on this host (the port is the recipe's own: an
  engine started beside others is never moved to another port, so its launch is exactly the
  recipe's rendering);
- host RAM: MemAvailable now (what every running engine holds is already out of it) minus the new
  start's predicted peak against the recipe's MemAvailable target (blue_green.py `host_fit`);
- per running engine: CPU cores (two CPU workers on one core starve, `cpu_fit`) and GPU cards
  (a shared card needs room by NVML's free memory now, `gpu_fit`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from appliance.host_facts import HostFacts
from appliance.recipe.gpu_kv_admission import GpuMemoryView, utilization
from appliance.recipe.launch_spec import LaunchSpec
from appliance.recipe.recipe_model import Recipe
from controller.runtime.ports import port_is_free
from controller.supervisor.blue_green import cpu_fit, gpu_fit, host_fit
from controller.supervisor.machine import State
from controller.supervisor.preflight import cache_is_empty

# States in which an engine will hold more than it holds now (its start's peak is still to come).
STARTING_STATES = frozenset({State.PREFLIGHT, State.STARTING, State.EXITED, State.BACKOFF})


@dataclass(frozen=True)
class Engine:
    """One engine of the set as the judgement sees it."""

    model: str  # the name the operator stops it by (`--model`)
    state: State
    recipe: str | None
    spec: LaunchSpec | None  # its launch's (None: nothing launched, e.g. failed for good)

    @property
    def names(self) -> frozenset[str]:
        if self.spec is None:
            return frozenset({self.model})
        return frozenset({self.model, self.spec.served_model_name, *self.spec.served_model_aliases})

    def who(self) -> str:
        return f"engine {self.model!r} (recipe {self.recipe or '?'})"


def _stop_it(engine: Engine) -> str:
    return f"stop it first: `appliance stop --model {engine.model}`"


def refusal(new: Recipe, facts: HostFacts, spec: LaunchSpec, engines: Sequence[Engine], *,
            is_free: Callable[[str, int], bool] = port_is_free, cpus: int = 1,
            gpu: GpuMemoryView | None = None, cold: bool | None = None) -> str | None:
    """Why `new` (rendered as `spec`) may not start beside `engines`; None: it may."""
    return judgement(new, facts, spec, engines, is_free=is_free, cpus=cpus, gpu=gpu, cold=cold)[0]


def judgement(new: Recipe, facts: HostFacts, spec: LaunchSpec, engines: Sequence[Engine], *,
              is_free: Callable[[str, int], bool] = port_is_free, cpus: int = 1,
              gpu: GpuMemoryView | None = None, cold: bool | None = None) -> tuple[str | None, str]:
    """(why `new` may not start beside `engines` — None: it may —, why it fits, with the numbers: the
    host RAM sentence and each running engine's CPU and GPU sentences, as `apply --alongside` and the
    launch record show them; empty when refused before the numbers were read)."""
    fits: list[str] = []

    def why_not() -> str | None:
        for e in engines:
            if e.state in STARTING_STATES:
                return (f"{e.who()} is {e.state.value}: what it holds at its peak is not in MemAvailable "
                        "yet, so a start beside it cannot be judged; wait until it is ready")
        for e in engines:
            if e.recipe == new.name and e.state is not State.IDLE:
                return (f"recipe {new.name!r} is what {e.who()} runs already; restart it "
                        f"(`appliance restart --model {e.model}`) or apply another recipe beside it")
        if taken := _names_taken(spec, engines):
            e, name = taken[0]
            return (f"model name {name!r} is served by {e.who()}: the gateway routes a name to one "
                    f"engine; {_stop_it(e)}, or give the recipe another model.served_name")
        if on_port := _port_taken(spec, engines):
            e = on_port[0]
            return f"port {spec.port} is {e.who()}'s; {_stop_it(e)}, or give the recipe another engine port"
        running = [e for e in engines if e.spec is not None]
        if not is_free(spec.host, spec.port):
            return (f"port {spec.port} is in use on this host (not by an engine of this appliance): free it, "
                    "or give the recipe another engine port")
        start_cold = cache_is_empty_safe(spec) if cold is None else cold
        ram_ok, ram_why, _ = host_fit(new, facts, start_cold)
        if not ram_ok and running:
            names = ", ".join(e.who() for e in running)
            return (f"host RAM: {ram_why} (what the running engines hold is already out of MemAvailable: "
                    f"{names}); stop one first: `appliance stop --model {running[0].model}`")
        if not ram_ok:
            return f"host RAM: {ram_why}"
        fits.append(f"host RAM: {ram_why}")
        util = utilization(new)
        for e in running:
            assert e.spec is not None
            cpu_ok, cpu_why, _ = cpu_fit(spec, e.spec, cpus)
            if not cpu_ok:
                return (f"CPU cores beside {e.who()}: {cpu_why}; {_stop_it(e)}, "
                        "or bind the recipe to other cores")
            if cpu_why:
                fits.append(f"CPU cores beside {e.who()}: {cpu_why}")
            gpu_ok, gpu_why, _ = gpu_fit(spec, e.spec, gpu, util)
            if not gpu_ok:
                return f"GPU beside {e.who()}: {gpu_why}; {_stop_it(e)}, or give the recipe other cards"
            if gpu_why:
                fits.append(f"GPU beside {e.who()}: {gpu_why}")
        return None

    refused = why_not()
    return refused, "" if refused is not None else "; ".join(fits)


def cache_is_empty_safe(spec: LaunchSpec) -> bool:
    """Whether the start will be cold (an unreadable cache root counts as cold: the larger peak)."""
    try:
        return cache_is_empty(Path(spec.cache_root))
    except OSError:
        return True


def primary_refusal(spec: LaunchSpec, others: Sequence[Engine]) -> str | None:
    """Why the primary engine may not switch to `spec` while `others` run beside it: a model name or
    the port one of them holds (the gateway would refuse the name; the engine would not bind)."""
    for e in others:  # engine by engine, a name before a port, as the primary's answer always was
        if taken := _names_taken(spec, [e]):
            return (f"model name {taken[0][1]!r} is served by {e.who()}, beside the primary engine; "
                    f"{_stop_it(e)}")
        if _port_taken(spec, [e]):
            return f"port {spec.port} is {e.who()}'s, beside the primary engine; {_stop_it(e)}"
    return None


def _names_taken(spec: LaunchSpec, engines: Sequence[Engine]) -> list[tuple[Engine, str]]:
    """Each engine claiming one of the names `spec` serves (its served name or an alias), with the
    first such name: the gateway routes a name to one engine."""
    wanted = {spec.served_model_name, *spec.served_model_aliases}
    return [(e, sorted(wanted & e.names)[0]) for e in engines if wanted & e.names]


def _port_taken(spec: LaunchSpec, engines: Sequence[Engine]) -> list[Engine]:
    """Each launched engine on `spec`'s port."""
    return [e for e in engines if e.spec is not None and e.spec.port == spec.port]
