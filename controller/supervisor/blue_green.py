"""Blue/green: does the new launch fit beside the engine that serves now?

When it does, the new engine starts on another port while the old one keeps serving, the gateway is
pointed at it once it is ready, and only then is the old one drained and stopped: no hold, no gap
(machine.py's `old`). Otherwise the switch drains, stops and starts with the gateway holding new
requests (hold_plan.py).

It fits when all of these hold (the numbers go into the answer, so `apply` can say why):
- host RAM (DOMAIN §3: host RAM is the binding constraint): MemAvailable now (the serving engine's
  own footprint is already out of it) minus the new launch's predicted peak (admission's memory
  model, the cold or warm start it will be) stays at or above the new recipe's MemAvailable target
  (`expect.min_mem_available_gib`). A recipe without a memory model cannot be predicted: hold.
- GPU memory per card: no per-card free-memory figure is known before the launch, so the new launch's
  cards must not be the serving engine's (vLLM takes its `gpu_memory_utilization` share of each card
  it is given). A card the two share: hold. The serving engine's cards and cores are read from its
  launch record (the LaunchSpec it was started with), never from its recipe file, which may have
  been edited or deleted since; when the record does not say: hold.
- CPU cores (a CPU engine): vLLM's CPU worker binds its OpenMP threads to cores
  (`VLLM_CPU_OMP_THREADS_BIND`, `auto`: every core but the reserved ones) and keeps them busy; a second
  engine bound to the same cores is starved (measured on the 2-core test host: the new engine's worker,
  bound to core 0 beside the serving one, got 0.2 % of a CPU for 12 minutes and never came up). So the
  two launches' bound cores must be disjoint (e.g. one recipe binds core 1 explicitly); `nobind` or an
  overlap: hold.
- ports: a free port for the new engine (the recipe's own, else the next free one after it).
- a runtime that places the engine on another node (a cluster) is not judged here: hold.
- a cold warm-up start (empty compile cache with the warm-restart flow) is two starts: hold.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from appliance.host_facts import GIB, HostFacts
from appliance.recipe.admission import admit
from appliance.recipe.launch_port import on_port
from appliance.recipe.launch_spec import LaunchSpec
from appliance.recipe.recipe_loader import RecipeError
from appliance.recipe.recipe_model import Platform, Recipe
from appliance.recipe.render import DEVICES_ENV, RenderError
from appliance.runtimes.base import Placement
from appliance.runtimes.registry import for_recipe
from controller.runtime.base import EngineHandle, EngineRuntimeError, Runtime
from controller.runtime.ports import port_is_free
from controller.supervisor.preflight import UnknownRecipe, cache_is_empty
from host_setup.facts import HostFactsError

# What a look at the recipes and the host can raise; the switch then takes the hold path.
CHECK_ERRORS = (UnknownRecipe, RecipeError, RenderError, HostFactsError, EngineRuntimeError, OSError,
                ValueError)

# How far past the recipe's port a free one is looked for.
PORT_SCAN = 50

Numbers = dict[str, float | int | str | None]


@dataclass(frozen=True)
class Fit:
    """The verdict for one switch: beside (blue/green) or not (hold), why, and the numbers."""

    fits: bool
    why: str
    numbers: Numbers = field(default_factory=dict)
    port: int | None = None  # the new engine's port when it fits

    def view(self) -> dict[str, object]:
        return {"fits": self.fits, "why": self.why, "numbers": dict(self.numbers), "port": self.port}


def host_fit(recipe: Recipe, facts: HostFacts, cold: bool) -> tuple[bool, str, Numbers]:
    """MemAvailable now − the new start's predicted peak against the recipe's MemAvailable target."""
    start = "cold" if cold else "warm"
    checks = {c.name: c for c in admit(recipe, facts).checks}
    check = checks.get(f"memory-peak-{start}") or checks.get("memory-peak-cold")
    need = check.numbers.get("demand_gib") if check is not None else None
    target = recipe.expect.min_mem_available_gib or 0.0
    now_gib = round(facts.mem_available_gib, 2)
    numbers: Numbers = {"mem_available_gib": now_gib, "target_gib": target, "start": start}
    if not isinstance(need, int | float):
        return False, f"{recipe.name} has no memory model: its need beside the serving engine cannot be " \
                      "predicted", numbers
    left = round(now_gib - float(need), 2)
    numbers |= {"need_gib": round(float(need), 2), "left_gib": left}
    said = (f"MemAvailable now {now_gib:.2f} GiB − predicted need {float(need):.2f} GiB ({start} start) = "
            f"{left:.2f} GiB, {'≥' if left >= target else 'under'} the target {target:.2f} GiB")
    return left >= target, said, numbers


def launch_cards(spec: LaunchSpec) -> tuple[int, ...] | None:
    """The GPUs a launch was given, read from the launch itself (render writes the recipe's `devices`
    into HIP_/CUDA_VISIBLE_DEVICES): () for a launch on a platform without cards (CPU), None when a
    GPU launch's list is missing or unreadable."""
    try:
        name = DEVICES_ENV.get(Platform(spec.platform))
    except ValueError:
        return None  # a platform this controller does not know: its cards cannot be told
    if name is None:
        return ()
    value = spec.env.get(name, "").strip()
    parts = [p.strip() for p in value.split(",")]
    if not value or not all(p.isdigit() for p in parts):
        return None
    return tuple(int(p) for p in parts)


def gpu_fit(spec: LaunchSpec, serving: LaunchSpec) -> tuple[bool, str, Numbers]:
    """The two launches' cards must be distinct (no per-card free memory is known beforehand). The
    serving engine's cards are its launch's (the launch record), not its recipe file's: the file may
    have been edited, or be gone, since it was launched. Not known: does not fit."""
    cards = launch_cards(spec)
    if cards is None:
        return False, f"the new launch's GPUs cannot be read from its {spec.platform} launch", {}
    if not cards:
        return True, "", {}
    theirs = launch_cards(serving)
    numbers: Numbers = {"gpus": ",".join(map(str, cards)),
                        "serving_gpus": None if theirs is None else ",".join(map(str, theirs))}
    if theirs is None:
        return False, (f"the serving launch's GPUs are not known (its launch record has no "
                       f"{serving.platform} card list): it may hold GPU {numbers['gpus']}"), numbers
    shared = sorted(set(cards) & set(theirs))
    if shared:
        return False, (f"GPU {','.join(map(str, shared))} would hold both engines (vLLM takes its "
                       "gpu_memory_utilization share of every card it is given)"), numbers
    why = f"GPUs {numbers['gpus']} are not the serving engine's ({numbers['serving_gpus'] or 'none'})"
    return True, why, numbers


BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"
RESERVED_ENV = "VLLM_CPU_NUM_OF_RESERVED_CPU"


def bound_cores(env: Mapping[str, str], cpus: int) -> frozenset[int] | None:
    """The cores a CPU engine's worker binds (None: not bound, it may run anywhere)."""
    bind = env.get(BIND_ENV, "auto").strip()
    if bind == "nobind":
        return None
    if bind == "auto":
        try:
            reserved = int(env.get(RESERVED_ENV, "1"))
        except ValueError:
            reserved = 1
        return frozenset(range(max(1, cpus - max(0, reserved))))
    cores: set[int] = set()
    for part in bind.replace("|", ",").split(","):
        lo, _, hi = part.strip().partition("-")
        if lo.isdigit() and (not hi or hi.isdigit()):
            cores.update(range(int(lo), int(hi or lo) + 1))
    return frozenset(cores) or None


def cpu_fit(spec: LaunchSpec, serving: LaunchSpec, cpus: int) -> tuple[bool, str, Numbers]:
    """Two CPU engines need disjoint bound cores (a busy worker starves another on its cores)."""
    if spec.platform != "cpu" or serving.platform != "cpu":
        return True, "", {}
    mine, theirs = bound_cores(spec.env, cpus), bound_cores(serving.env, cpus)
    show = {"cpu_cores": "any" if mine is None else ",".join(map(str, sorted(mine))),
            "serving_cpu_cores": "any" if theirs is None else ",".join(map(str, sorted(theirs)))}
    numbers: Numbers = {**show, "cpus": cpus}
    if mine is None or theirs is None or mine & theirs:
        return False, (f"the two CPU engines' workers would share cores ({show['cpu_cores']} and "
                       f"{show['serving_cpu_cores']}, {BIND_ENV}): a worker beside a busy one on its cores "
                       "is starved"), numbers
    why = f"CPU cores {show['cpu_cores']} are not the serving engine's ({show['serving_cpu_cores']})"
    return True, why, numbers


def pick_port(host: str, wanted: int, taken: int, is_free: Callable[[str, int], bool] = port_is_free,
              scan: int = PORT_SCAN) -> int | None:
    """The recipe's port when it is free, else the next free one after it (never `taken`)."""
    for port in range(wanted, min(wanted + scan, 65535) + 1):
        if port != taken and is_free(host, port):
            return port
    return None


def decide(new: Recipe, facts: HostFacts, spec: LaunchSpec, serving_spec: LaunchSpec,
           *, cold: bool, serving_gib: float | None = None,
           is_free: Callable[[str, int], bool] = port_is_free, cpus: int | None = None) -> Fit:
    """Blue/green or hold for a switch from `serving_spec` (the serving launch's record) to `spec`
    (rendered from `new`). Nothing is read from the serving engine's recipe file."""
    base: Numbers = {"serving_footprint_gib": None if serving_gib is None else round(serving_gib, 2)}
    if for_recipe(new).traits.placement is Placement.REMOTE:
        return Fit(False, f"{new.name} runs on a cluster node: its memory is not this host's to judge", base)
    if cold and new.expect.warm_restart:
        return Fit(False, f"{new.name} starts cold with the warm-restart flow (a cold warm-up, then the "
                   "serving start): not beside", base)
    ram_ok, ram_why, numbers = host_fit(new, facts, cold)
    numbers = {**base, **numbers}
    if serving_gib is not None:
        ram_why += f" (the serving engine's {serving_gib:.2f} GiB is already out of MemAvailable)"
    if not ram_ok:
        return Fit(False, ram_why, numbers)
    gpu_ok, gpu_why, gpu_numbers = gpu_fit(spec, serving_spec)
    numbers |= gpu_numbers
    if not gpu_ok:
        return Fit(False, f"{ram_why}; but {gpu_why}", numbers)
    cpu_ok, cpu_why, cpu_numbers = cpu_fit(spec, serving_spec, cpus or os.cpu_count() or 1)
    numbers |= cpu_numbers
    if not cpu_ok:
        return Fit(False, f"{ram_why}; but {cpu_why}", numbers)
    gpu_why = "; ".join(w for w in (gpu_why, cpu_why) if w)
    port = pick_port(spec.host, spec.port, serving_spec.port, is_free)
    numbers["port"] = port
    if port is None:
        return Fit(False, f"{ram_why}; but no free port in {spec.port}–{spec.port + PORT_SCAN}", numbers)
    why = ram_why + (f"; {gpu_why}" if gpu_why else "") + f"; port {port} is free"
    return Fit(True, why, numbers, port)


def footprint_gib(pids: Sequence[int]) -> float | None:
    """Resident memory of the engine's processes and their children (the running engine's measured
    footprint; None: none visible, e.g. a container in another PID namespace)."""
    seen: set[int] = set()
    total = 0
    for pid in pids:
        try:
            procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
        except psutil.Error:
            continue
        for proc in procs:
            if proc.pid in seen:
                continue
            seen.add(proc.pid)
            try:
                total += proc.memory_info().rss
            except psutil.Error:
                continue
    return total / GIB if seen else None


def serving_footprint(runtimes: Mapping[str, Runtime], handle: EngineHandle) -> float | None:
    """The resident GiB of a running engine through its runtime (blocking); None when not measurable."""
    rt = runtimes.get(handle.kind)
    if rt is None:
        return None
    try:
        return footprint_gib(rt.engine_pids(handle))
    except (EngineRuntimeError, OSError):
        return None


def moved(spec: LaunchSpec, fit: Fit) -> LaunchSpec:
    """The launch as the blue/green switch starts it: on the fit's port."""
    return spec if fit.port is None else on_port(spec, fit.port)


@dataclass
class BesideCheck:
    """The driver's `beside` seam (blocking): loads the recipes, reads the host facts now, renders the
    new launch and measures the serving engine, then `decide`s."""

    recipe: Callable[[str], Recipe]
    facts: Callable[[], HostFacts]
    render: Callable[[Recipe, HostFacts], LaunchSpec]
    runtimes: Mapping[str, Runtime]
    is_free: Callable[[str, int], bool] = port_is_free

    def __call__(self, name: str, cold: bool | None, serving_spec: LaunchSpec, handle: EngineHandle) -> Fit:
        new = self.recipe(name)
        facts = self.facts()
        spec = self.render(new, facts)
        if cold is None:  # a preview (apply's answer, the console): as the cache is now
            cold = cache_is_empty(Path(spec.cache_root))
        serving_gib = serving_footprint(self.runtimes, handle)
        return decide(new, facts, spec, serving_spec, cold=cold, serving_gib=serving_gib,
                      is_free=self.is_free)
