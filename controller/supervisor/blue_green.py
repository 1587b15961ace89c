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
- GPU cards: the new launch's cards are the serving engine's or not. Disjoint cards fit (preflight's
  KV admission already judged them). When they share a card, the two engines share it (same-card
  blue/green) only if, for EVERY card the new launch uses, NVML's free memory now (the serving engine
  already holds what it holds there) covers what vLLM will ask plus the safety margin:

      free_now − (gpu_memory_utilization × total + the new engine's CUDA context) ≥ margin

  vLLM's `gpu_memory_utilization` is a fraction of the card's TOTAL memory that must be FREE when its
  worker starts (vllm/v1/worker/utils.py `request_memory` refuses otherwise: "Free memory on device …
  is less than desired GPU memory utilization"); the CUDA context and the totals are
  appliance/recipe/gpu_kv_admission.py's (NVML's total is 0.43% above CUDA's, so the need is
  slightly overstated: the safe side). Cards whose memory cannot be read: hold (fails closed, with
  the reason). The serving engine's cards and cores are read from its launch record (the LaunchSpec
  it was started with), never from its recipe file, which may have been edited or deleted since;
  when the record does not say: hold.
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

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from appliance.host_facts import GIB, HostFacts
from appliance.recipe.admission import admit
from appliance.recipe.gpu_kv_admission import CUDA_CONTEXT_GIB, GpuMemoryView, utilization
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

# What must stay free on a shared card once the new engine has taken what vLLM asks for. vLLM's
# request is not all it uses: on the H200 (vLLM 0.26, cuda-smollm2-graph, utilization 0.3 of 139.8
# GiB = 41.94 GiB asked) each engine held 44.2–44.3 GiB by NVML once ready (44.2 → 88.5 GiB with
# two), i.e. ~1.8 GiB past its request and CUDA context (CUDA graphs, NCCL/cuBLAS workspaces); the
# margin covers that with room for the serving engine's own growth.
SAME_CARD_MARGIN_GIB = 4.0


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


def same_card_fit(cards: Sequence[int], util: float, gpu: GpuMemoryView,
                  margin_gib: float) -> tuple[bool, str, Numbers]:
    """Same-card blue/green: every card of the new launch must keep `margin_gib` free after vLLM's
    request (utilization × total) and the new engine's CUDA context are taken from what NVML says is
    free now (the serving engine's share is already out of it). Unreadable: does not fit. A launch's
    card index is taken as NVML's index of the same number (gpu_kv_admission.py's `index_space`)."""
    numbers: Numbers = {"gpu_placement": "same_card", "gpu_utilization": util,
                        "cuda_context_gib": CUDA_CONTEXT_GIB, "gpu_margin_gib": margin_gib}
    if gpu.cards is None:
        return False, (f"same-card blue/green needs each card's free memory, and it cannot be read "
                       f"({gpu.blind or 'not read'})"), numbers
    seen = {c.index: c for c in gpu.cards}
    said: list[str] = []
    short: list[str] = []
    for index in cards:
        card = seen.get(index)
        if card is None or card.total_bytes is None or card.free_bytes is None:
            numbers[f"gpu{index}_free_gib"] = None
            return False, (f"same-card blue/green needs GPU {index}'s free memory, and NVML did not report "
                           "it"), numbers
        # Whole bytes, rounded up: the safe side of vLLM's float `utilization × total`.
        need = math.ceil(util * card.total_bytes) + math.ceil(CUDA_CONTEXT_GIB * GIB)
        left = card.free_bytes - need
        numbers |= {f"gpu{index}_free_gib": round(card.free_bytes / GIB, 2),
                    f"gpu{index}_total_gib": round(card.total_bytes / GIB, 2),
                    f"gpu{index}_need_gib": round(need / GIB, 2),
                    f"gpu{index}_left_gib": round(left / GIB, 2)}
        ok = left >= math.ceil(margin_gib * GIB)
        line = (f"GPU {index} free now {card.free_bytes / GIB:.2f} GiB − need {need / GIB:.2f} GiB "
                f"({util} × {card.total_bytes / GIB:.2f} GiB + {CUDA_CONTEXT_GIB:.2f} GiB CUDA context) = "
                f"{left / GIB:.2f} GiB, {'≥' if ok else 'under'} the margin {margin_gib:.2f} GiB")
        said.append(line)
        if not ok:
            short.append(line)
    if short:
        return False, ("same-card blue/green does not fit: " + "; ".join(short)
                       + " (vLLM refuses a start whose gpu_memory_utilization share is not free)"), numbers
    return True, "same-card blue/green: " + "; ".join(said), numbers


def gpu_fit(spec: LaunchSpec, serving: LaunchSpec, gpu: GpuMemoryView | None = None,
            util: float | None = None, margin_gib: float = SAME_CARD_MARGIN_GIB) -> tuple[bool, str, Numbers]:
    """Distinct cards fit; shared ones fit when every card of the new launch has room for it beside
    the serving engine (`same_card_fit`, from `gpu`: NVML now; None: not read, a shared card does not
    fit). The serving engine's cards are its launch's (the launch record), not its recipe file's: the
    file may have been edited, or be gone, since it was launched. Not known: does not fit."""
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
        if gpu is None or util is None:
            return False, (f"GPU {','.join(map(str, shared))} would hold both engines (vLLM takes its "
                           "gpu_memory_utilization share of every card it is given)"), numbers
        ok, why, same = same_card_fit(cards, util, gpu, margin_gib)
        return ok, why, numbers | same
    why = f"GPUs {numbers['gpus']} are not the serving engine's ({numbers['serving_gpus'] or 'none'})"
    return True, why, numbers | {"gpu_placement": "disjoint_cards"}


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
           is_free: Callable[[str, int], bool] = port_is_free, cpus: int | None = None,
           gpu: GpuMemoryView | None = None, margin_gib: float = SAME_CARD_MARGIN_GIB) -> Fit:
    """Blue/green or hold for a switch from `serving_spec` (the serving launch's record) to `spec`
    (rendered from `new`). Nothing is read from the serving engine's recipe file. `gpu`: the cards'
    memory now, for a launch that shares a card with the serving engine (None: not read, hold)."""
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
    gpu_ok, gpu_why, gpu_numbers = gpu_fit(spec, serving_spec, gpu, utilization(new), margin_gib)
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
    # The cards' memory now, as NVML reports it with the serving engine running (gpu_memory_check.py's
    # `view(replaces_running=False)`); None: no reader (a shared card then holds).
    gpu_memory: Callable[[], GpuMemoryView] | None = None
    margin_gib: float = SAME_CARD_MARGIN_GIB

    def __call__(self, name: str, cold: bool | None, serving_spec: LaunchSpec, handle: EngineHandle) -> Fit:
        new = self.recipe(name)
        facts = self.facts()
        spec = self.render(new, facts)
        if cold is None:  # a preview (apply's answer, the console): as the cache is now
            cold = cache_is_empty(Path(spec.cache_root))
        rt = self.runtimes.get(handle.kind)
        serving_gib: float | None = None
        if rt is not None:
            try:
                serving_gib = footprint_gib(rt.engine_pids(handle))
            except (EngineRuntimeError, OSError):
                serving_gib = None
        gpu = self.gpu_memory() if self.gpu_memory is not None and launch_cards(spec) else None
        return decide(new, facts, spec, serving_spec, cold=cold, serving_gib=serving_gib,
                      is_free=self.is_free, gpu=gpu, margin_gib=self.margin_gib)
