"""Host admission: can this host run this recipe? `admit(recipe, facts) -> Admission`. Pure.

The memory model (DOMAIN §3). The TP=4 graph OOMs were *global* OOMs: anonymous demand ≥ MemTotal +
swap. So the peak of one start is predicted as

    demand = workers × (RssAnon + RssFile per worker, for the mode) + EngineCore/API overhead
             + the start's transient (cold, or warm when the compile cache is already filled)

and set against what the host can hold:

    ram_left = MemTotal − page-cache floor − demand          (MemAvailable if nothing is swapped)
    margin   = MemTotal − page-cache floor + SwapTotal − demand   (RAM + swap left at the peak)
    reserve  = pressure_reserve_gib(vm.swappiness)          (MemAvailable the kernel keeps by swapping)
    min MemAvailable = max(ram_left, min(reserve, margin));  swap peak = demand − (RAM − that)

`margin < 0` is a predicted global OOM whatever the bar. Otherwise the kernel does not swap while RAM
alone leaves more than its reserve (S14d: eager B used not one page of a 16 GiB swapfile, MemAvailable
6.1 GiB with or without it); under pressure it swaps anonymous memory out until MemAvailable is back
at the reserve, and once swap is full MemAvailable is what RAM + swap leave (`margin`). More swap
therefore buys OOM headroom, not MemAvailable: S14c's recipe C had 2.35 GiB with 8 GiB swap (5.40 GiB of
it used) and 1.78 GiB with 4 GiB (swap 100% full) — 4 GiB more swap, +0.57 GiB available.
`vm.swappiness` decides the reserve: the kernel swaps anonymous pages early at 200 and late at 60.

Calibration, against every seed run in DOMAIN §2–§3 and S14/S14c/S14d that names the recipe and the
host (the cases of `test_every_seed_run_is_predicted_within_its_tolerance`):

- reserve(200) = 2.35 GiB: recipe C, 8 GiB swap, swappiness 200, min MemAvailable 2.35 GiB with swap
  not full. reserve(60) = 0.29 GiB: S14c's swappiness pair, the same 10 GiB swap on both arms (seed
  000 chapter 一 §2), margin 0.29 GiB at 60 and 2.71 GiB at 200 (that 2.71 is predicted 2.35: the
  lower of the two measurements at 200 is kept).
  Linear in between, 0 below swappiness ≈ 40.
- Recipe C's demand 33.73 GiB = 31.26 − 0.6 − 2.35 + 5.40 (RAM not available + swap peak of that
  run): its per-worker graph RssAnon is booked at 6.03 GiB (derived from that total, not a per-
  process measurement). The base's 7.28 GiB — the upper end of the TP=4 graph OOM victims' anon-rss
  (6.76–7.28, S14 §3.7–§3.8) — cannot stand for C: it predicts 38.73 GiB against the 38.66 GiB that
  8 GiB swap gives, a global OOM for the run that kept 2.35 GiB. Not because C skips where they
  died: C's own capture sizes died at the same point with the same anon-rss on the host without its
  memory recipe (seed 000 chapter 四 §3); one victim's anon-rss at a kill is not four workers'
  simultaneous share, and C's run, which survived, is the measurement of C's total. C′ keeps the
  base's figure and its measured peak (its transient is the rest). Both starts carry the same
  transient: S14c measured the warm start's peak ΣRssAnon +1.8% over the cold one ("无益"), so a warm
  start is modelled no lighter. The 4 GiB / swappiness 200 run is then predicted at 0.93 GiB (swap
  full) against the 1.78 GiB measured: the two C runs differ by 0.83 GiB in total demand, and the
  model keeps the heavier one.
- Recipe C′ (16 GiB swap, 66 MiB MemAvailable) and recipe B (6.1 GiB, swap untouched) are calibrated
  in their recipes' `memory:` sections; C′ at 4 GiB / swappiness 60 is the S14 global OOM.

The TP=4 graph arm that ran through on the 16 GiB swapfile (seed 000 chapter 四 §2, S14 §3.7.2:
7.4–8.8 GB swapped out during the start) is in the table for its survival only: what the kernel
swaps out with that much swap to spare is not the demand this model predicts. Left out because the
record does not name its host: the graph-pool arm whose "OOM was unchanged" (the swap and swappiness
of that arm are not recorded).

Verdict per check: refuse (predicted OOM, or a hard host requirement missing), warn (runs, but below
the recipe's own min MemAvailable bar, or a soft requirement such as ACS/boot parameters), admit.
A warm-restart recipe must survive both starts: the cold warm-up and the warm serving start.

A runtime placed on another node (`traits.placement` REMOTE, e.g. a cluster) is not judged against
this host at all: its facts say nothing about the node that will run the engine. Admission then keeps
what the recipe alone decides — the memory model (or its absence) and the predicted peak the node must
hold — and one line naming what the node needs: the plug-in's host-plan notes plus the recipe's peak
and pinned memory. The node itself is checked where it is (the scheduler, the plug-in's lint findings).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict

from appliance.engine_argv import flag_value
from appliance.host_facts import GIB, MIB, UNLIMITED, HostFacts
from appliance.observe.gpu_events import GpuEvent
from appliance.observe.gpu_health import CardHealth, assess
from appliance.recipe.gpu_kv_admission import GpuMemoryView, gpu_memory_checks
from appliance.recipe.lint import DEFAULT_MEMLOCK_BYTES, pinned_bytes_per_worker
from appliance.recipe.recipe_model import AcsState, GraphMode, Platform, Recipe
from appliance.runtimes import registry as runtime_registry
from appliance.runtimes.base import Placement, RuntimePlugin

Verdict = Literal["admit", "warn", "refuse"]
_RANK: dict[Verdict, int] = {"admit": 0, "warn": 1, "refuse": 2}
# A swapfile loses a header page; two 4 GiB files show 7.99999 GiB. Requirements compare with slack.
SWAP_SLACK_BYTES = 64 * MIB
GPU_VENDORS = {Platform.GFX906: ("hygon", "amd"), Platform.CUDA: ("nvidia",)}
FACT_GLOBAL_OOM = ("S14/S14c: TP=4 graph OOMs were global OOMs — anonymous demand ≈ 4 workers × ~7 GB "
                   "≥ MemTotal 31.26 + swap 4.0 GiB; page cache squeezed to ~600 MB")


class Check(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    verdict: Verdict
    message: str
    numbers: dict[str, float | int | str | None]
    fact: str


class Admission(BaseModel):
    model_config = ConfigDict(frozen=True)

    recipe: str
    verdict: Verdict
    checks: tuple[Check, ...]


# The kernel's reserve (module docstring): the MemAvailable it holds by swapping, by vm.swappiness.
RESERVE_AT_60_GIB = 0.29  # S14c: margin 0.29 GiB at swappiness 60
RESERVE_AT_200_GIB = 2.35  # S14c §3.12.1: recipe C, 8 GiB swap, swap not full, min MemAvailable 2.35 GiB


def pressure_reserve_gib(swappiness: int | None) -> float:
    """MemAvailable the kernel keeps by swapping anonymous memory out (see module docstring; S14c)."""
    s = 60 if swappiness is None else swappiness
    slope = (RESERVE_AT_200_GIB - RESERVE_AT_60_GIB) / 140
    return round(max(0.0, min(RESERVE_AT_200_GIB, RESERVE_AT_60_GIB + slope * (s - 60))), 3)


def admit(recipe: Recipe, facts: HostFacts, gpus: Sequence[CardHealth] = (),
          gpu_fatal: Mapping[int, Sequence[GpuEvent]] | None = None,
          gpu_memory: GpuMemoryView | None = None) -> Admission:
    """`gpus`: the cards' health where it was read (the GPU health watch, or `appliance plan` on this
    host); `gpu_fatal`: fatal kernel events per card since the controller started; `gpu_memory`: the
    cards' memory now, for a GPU recipe's KV request (appliance/recipe/gpu_kv_admission.py; None: not
    checked)."""
    plugin = runtime_registry.for_recipe(recipe)
    if plugin.traits.placement is Placement.REMOTE:
        kept: tuple[Check, ...] = (*_node_memory_checks(recipe), _remote_check(recipe, plugin))
    else:
        memlock = _memlock_check(recipe, facts)
        kept = (*_memory_checks(recipe, facts), *([memlock] if memlock else []),
                *_requirement_checks(recipe, facts), *gpu_health_checks(recipe, gpus, gpu_fatal or {}),
                *gpu_kv_checks(recipe, gpu_memory))
    verdict = max((c.verdict for c in kept), key=_RANK.__getitem__, default="admit")
    return Admission(recipe=recipe.name, verdict=verdict, checks=kept)


_NO_MODEL = Check(name="memory-peak", verdict="warn", numbers={},
                  message="the recipe has no memory model: host memory cannot be predicted",
                  fact="DOMAIN §3: host RAM is the binding constraint")
_START_LABEL = {"cold": "cold start (empty compile cache)", "warm": "warm restart (filled cache)"}


def _per_worker_gib(recipe: Recipe) -> float:
    model = recipe.memory
    assert model is not None
    if recipe.engine.mode is GraphMode.GRAPH:
        return model.worker_anon_gib_graph + model.worker_file_gib_graph
    return model.worker_anon_gib_eager + model.worker_file_gib_eager


def kv_request_gib(recipe: Recipe) -> float | None:
    """The KV cache a CPU engine will allocate in host RAM, in GiB: `--kv-cache-memory-bytes`, else
    `VLLM_CPU_KVCACHE_SPACE` (vLLM's CPU backend). None for other platforms (a GPU's KV cache is on
    the card) or when the recipe sets neither."""
    if recipe.platform is not Platform.CPU:
        return None
    flag = flag_value(recipe.engine.extra_args, "--kv-cache-memory-bytes")  # the one argv reader
    if flag is not None:
        try:
            return float(flag) / GIB
        except ValueError:
            return None
    var = recipe.env.vars.get("VLLM_CPU_KVCACHE_SPACE")
    try:
        return float(var.value) if var is not None else None
    except ValueError:
        return None


def _kv_extra_gib(recipe: Recipe) -> float:
    """KV cache requested beyond what the memory model's worker figures include (a child recipe that
    raises VLLM_CPU_KVCACHE_SPACE from 1 to 40 GiB was admitted on a 23 GiB host, then vLLM refused
    the allocation five times: the CPU model ignored the knob that dominates CPU memory)."""
    requested = kv_request_gib(recipe)
    if requested is None or recipe.memory is None:
        return 0.0
    return max(0.0, requested - recipe.memory.kv_cache_gib_included)


def _starts(recipe: Recipe) -> list[tuple[Literal["cold", "warm"], float, float]]:
    """(start, transient, predicted peak demand in GiB) for each start the recipe must survive. The
    recipe's memory model alone decides them — no host fact enters."""
    model = recipe.memory
    assert model is not None
    steady = recipe.workers * (_per_worker_gib(recipe) + _kv_extra_gib(recipe)) + model.overhead_gib
    starts: list[tuple[Literal["cold", "warm"], float]] = [("cold", model.startup_transient_gib)]
    if recipe.expect.warm_restart:
        warm = model.warm_transient_gib
        starts.append(("warm", model.startup_transient_gib if warm is None else warm))
    return [(kind, transient, steady + transient) for kind, transient in starts]


def _memory_checks(recipe: Recipe, facts: HostFacts) -> list[Check]:
    model = recipe.memory
    if model is None:
        return [_NO_MODEL]
    per_worker = _per_worker_gib(recipe)
    reserve = pressure_reserve_gib(facts.swappiness)
    target = recipe.expect.min_mem_available_gib or 0.0
    ram = facts.mem_total_gib - model.page_cache_floor_gib
    capacity = ram + facts.swap_total_gib
    checks = []
    for kind, transient, demand in _starts(recipe):
        margin = capacity - demand
        ram_left = ram - demand
        # RAM alone leaves more than the kernel's reserve: swap stays untouched (S14d). Otherwise the
        # kernel swaps until MemAvailable is back at its reserve, or swap is full (S14c).
        available = max(ram_left, min(reserve, margin))
        swap_peak = max(0.0, demand - (ram - available))
        in_ram = swap_peak == 0.0
        verdict: Verdict = "refuse" if margin < 0 else "warn" if available < target else "admit"
        label = _START_LABEL[kind]
        if verdict == "refuse":
            need = -margin
            message = (f"{label}: predicted peak {demand:.2f} GiB exceeds RAM + swap "
                       f"{capacity:.2f} GiB by {need:.2f} GiB — a global OOM. Add ≥ {need:.1f} GiB "
                       f"swap (and vm.swappiness 200 to keep MemAvailable up), use eager or a smaller TP")
        elif verdict == "warn":
            message = (f"{label}: predicted min MemAvailable {available:.2f} GiB at the peak "
                       f"({demand:.2f} of {capacity:.2f} GiB, swap {swap_peak:.2f} GiB) is under the "
                       f"recipe's min MemAvailable bar {target:.2f} GiB")
        elif in_ram:
            message = (f"{label}: predicted min MemAvailable {ram_left:.2f} GiB from RAM alone "
                       f"({demand:.2f} of {ram:.2f} GiB; swap not needed)")
        else:
            message = (f"{label}: predicted min MemAvailable {available:.2f} GiB at the peak "
                       f"({demand:.2f} of {capacity:.2f} GiB, swap {swap_peak:.2f} GiB; margin "
                       f"{margin:.2f} GiB before a global OOM)")
        checks.append(Check(
            name=f"memory-peak-{kind}", verdict=verdict, message=message, fact=FACT_GLOBAL_OOM,
            numbers={
                "workers": recipe.workers, "mode": recipe.engine.mode.value,
                "per_worker_gib": round(per_worker, 3), "overhead_gib": model.overhead_gib,
                "kv_extra_gib": round(_kv_extra_gib(recipe), 3),
                "transient_gib": transient, "demand_gib": round(demand, 3),
                "mem_total_gib": round(facts.mem_total_gib, 3),
                "page_cache_floor_gib": model.page_cache_floor_gib,
                "swap_total_gib": round(facts.swap_total_gib, 3), "swappiness": facts.swappiness,
                "pressure_reserve_gib": reserve, "capacity_gib": round(capacity, 3),
                "margin_gib": round(margin, 3), "ram_left_gib": round(ram_left, 3),
                "mem_available_gib": round(available, 3), "swap_peak_gib": round(swap_peak, 3),
                "min_mem_available_gib": target,
            }))
    return checks


def _node_peak_gib(recipe: Recipe) -> float | None:
    """What the node's RAM + usable swap must hold at the worst start: the predicted peak plus the
    page-cache floor the kernel keeps (DOMAIN §3). None without a memory model."""
    if recipe.memory is None:
        return None
    return max(d for _, _, d in _starts(recipe)) + recipe.memory.page_cache_floor_gib


def _node_memory_checks(recipe: Recipe) -> list[Check]:
    """A remote recipe's memory, from the recipe alone: the peak each start demands of the node."""
    model = recipe.memory
    if model is None:
        return [_NO_MODEL]
    starts = _starts(recipe)
    need = _node_peak_gib(recipe)
    assert need is not None
    peaks = ", ".join(f"{_START_LABEL[kind]} {demand:.2f} GiB" for kind, _, demand in starts)
    bar = recipe.expect.min_mem_available_gib
    return [Check(
        name="memory-peak-node", verdict="admit",
        message=f"predicted peak {peaks}; with the page-cache floor {model.page_cache_floor_gib:.2f} GiB "
                f"the node's RAM + usable swap must hold {need:.2f} GiB"
                + (f", and leave MemAvailable ≥ {bar:.2f} GiB (the recipe's bar)" if bar else ""),
        fact=FACT_GLOBAL_OOM,
        numbers={"workers": recipe.workers, "mode": recipe.engine.mode.value,
                 "per_worker_gib": round(_per_worker_gib(recipe), 3), "overhead_gib": model.overhead_gib,
                 **{f"demand_{kind}_gib": round(demand, 3) for kind, _, demand in starts},
                 "page_cache_floor_gib": model.page_cache_floor_gib, "node_needs_gib": round(need, 3),
                 "min_mem_available_gib": bar})]


def _remote_check(recipe: Recipe, plugin: RuntimePlugin) -> Check:
    """One line for a runtime on another node: nothing of this host is judged, and what the node needs
    is named — the recipe's own numbers first, then the plug-in's host-plan notes."""
    needs: list[str] = []
    peak = _node_peak_gib(recipe)
    if peak is not None:
        needs.append(f"RAM + usable swap ≥ {peak:.2f} GiB at the predicted peak")
    if recipe.host.min_ram_gib is not None:
        needs.append(f"MemTotal ≥ {recipe.host.min_ram_gib} GiB")
    pinned = pinned_bytes_per_worker(recipe)
    if pinned is not None:
        needs.append(f"RLIMIT_MEMLOCK ≥ {pinned / MIB:.0f} MiB for each of the {recipe.workers} worker(s) "
                     f"(pinned host buffers)")
    # A plug-in's notes are sentences ("the node needs …"); in this list the lead-in is said once.
    needs += [note.removeprefix("the node needs ") for note in plugin.host_plan_notes(recipe)]
    return Check(
        name="placement", verdict="admit",
        message="runs on a cluster node: this host is not checked; the node needs: "
                + ("; ".join(needs) if needs else "nothing the recipe names"),
        numbers={"placement": plugin.traits.placement.value, "node_needs": len(needs)},
        fact="the runtime's placement is remote: this host's RAM, swap, memlock, cgroup and GPUs are not "
             "the node's")


def _memlock_check(recipe: Recipe, facts: HostFacts) -> Check | None:
    pinned = pinned_bytes_per_worker(recipe)
    if pinned is None:
        return None
    if runtime_registry.for_recipe(recipe).traits.sets_own_memlock:
        # The container gets what render asks for at creation (--ulimit memlock=-1), else the
        # runtime's default.
        limit = UNLIMITED if recipe.host.memlock_unlimited else DEFAULT_MEMLOCK_BYTES
        source = "container ulimit (render)"
    else:
        # The process runtime may raise the soft limit up to the hard one when the recipe asks for it.
        raise_ok = recipe.host.memlock_unlimited and facts.memlock_hard_bytes == UNLIMITED
        limit_opt = UNLIMITED if raise_ok else facts.memlock_soft_bytes
        limit = DEFAULT_MEMLOCK_BYTES if limit_opt is None else limit_opt
        source = "this host's RLIMIT_MEMLOCK"
    ok = limit == UNLIMITED or pinned <= limit
    limit_text = "unlimited" if limit == UNLIMITED else f"{limit / MIB:.0f} MiB"
    return Check(
        name="pinned-memlock", verdict="admit" if ok else "refuse",
        message=f"each worker pins ≈{pinned / MIB:.0f} MiB; memlock from {source} is {limit_text}"
                + ("" if ok else ": raise it (--ulimit memlock=-1 / limits.d) or lower max_model_len"),
        numbers={"pinned_bytes_per_worker": pinned, "memlock_bytes": limit},
        fact="S11f §10.1: hipErrorOutOfMemory from UvaBuffer / pin_memory=True in load_model() under 64 MB")


def _requirement_checks(recipe: Recipe, facts: HostFacts) -> list[Check]:
    req = recipe.host
    out: list[Check] = []

    def check(name: str, ok: bool, bad: Verdict, message: str, fact: str,
              **numbers: float | int | str | None) -> None:
        out.append(Check(name=name, verdict="admit" if ok else bad, message=message, numbers=numbers,
                         fact=fact))

    if req.min_ram_gib is not None:
        check("min-ram", facts.mem_total_gib >= req.min_ram_gib, "refuse",
              f"MemTotal {facts.mem_total_gib:.2f} GiB, recipe needs {req.min_ram_gib} GiB",
              "DOMAIN §3: host RAM is the binding constraint",
              mem_total_gib=round(facts.mem_total_gib, 3), required_gib=req.min_ram_gib)
    if req.swap_total_gib is not None:
        ok = facts.swap_total_bytes + SWAP_SLACK_BYTES >= req.swap_total_gib * GIB
        missing = max(0.0, req.swap_total_gib - facts.swap_total_gib)
        check("swap-total", ok, "refuse",
              f"SwapTotal {facts.swap_total_gib:.2f} GiB, recipe needs {req.swap_total_gib} GiB"
              + ("" if ok else f": add a {missing:.1f} GiB swapfile (`appliance host apply {recipe.name}`)"),
              "S14c: recipe C needs +4 GiB swapfile (8 GiB total); the default graph needed 16 GiB",
              swap_total_gib=round(facts.swap_total_gib, 3), required_gib=req.swap_total_gib)
    if req.swappiness is not None:
        ok = facts.swappiness is not None and facts.swappiness >= req.swappiness
        check("swappiness", ok, "refuse",
              f"vm.swappiness is {facts.swappiness}, recipe needs ≥ {req.swappiness}",
              "S14c: swappiness 60→200 raised the memory margin 0.29→2.71 GiB at zero decode cost",
              swappiness=facts.swappiness, required=req.swappiness)
    traits = runtime_registry.for_recipe(recipe).traits
    if req.memlock_unlimited and not traits.sets_own_memlock:
        ok = facts.memlock_hard_bytes == UNLIMITED
        check("memlock-unlimited", ok, "refuse",
              f"hard RLIMIT_MEMLOCK is {facts.memlock_hard_bytes}; the process engine cannot raise it",
              "S11f §10.1: pinned host memory vs memlock", memlock_hard_bytes=facts.memlock_hard_bytes)
    if req.no_cgroup_memory_limit and not traits.own_cgroup:
        limit = facts.cgroup_memory_limit_bytes
        check("cgroup-memory-limit", limit is None, "refuse",
              "no cgroup memory limit" if limit is None else
              f"the appliance runs in a cgroup limited to {limit / GIB:.2f} GiB; the engine inherits it",
              "DOMAIN §3: cgroup v2 counts page cache; 29 GB mmapped weights + 4 workers hit a 32 GiB limit",
              limit_bytes=limit)
    if req.pcie_acs is AcsState.DISABLED:
        check("pcie-acs", facts.has_boot_param("pci=disable_acs_redir="), "warn",
              "ACS redirect off via pci=disable_acs_redir=" if facts.has_boot_param("pci=disable_acs_redir=")
              else "ACS state not set at boot (see `appliance host plan`); no effect on decode expected",
              "DOMAIN §6: ACS off lifts cross-card copy_ 6.95→28.3 GB/s; decode effect zero (RCCL uses SHM)")
    for param in req.boot_params:
        check(f"boot-param {param}", facts.has_boot_param(param), "warn",
              f"kernel command line {'has' if facts.has_boot_param(param) else 'lacks'} {param}",
              "DOMAIN §1: the reference host boots with iommu=pt pci=disable_acs_redir=<12 bridges>")
    if req.kernel_module is not None:
        present = req.kernel_module in facts.modules
        check("kernel-module", present, "refuse",
              f"module {req.kernel_module} is {'loaded' if present else 'NOT loaded: no GPU driver'}"
              f" (kernel {facts.kernel_release})",
              "DOMAIN §1: 5.15.0-194 has no hydcu module — booting it leaves the host with no GPU",
              kernel=facts.kernel_release)
    if recipe.platform in GPU_VENDORS and recipe.devices:
        gpus = facts.gpus_of(GPU_VENDORS[recipe.platform])
        # The highest card index listed, and one card per tensor-parallel rank (each rank is a worker
        # process on its own GPU): a TP=4 recipe needs four cards even if it lists fewer.
        needed = max(max(recipe.devices) + 1, recipe.workers)
        check("gpus", len(gpus) >= needed, "refuse",
              f"{len(gpus)} {'/'.join(GPU_VENDORS[recipe.platform])} GPU(s) found in sysfs; devices "
              f"{list(recipe.devices)} at tensor_parallel_size {recipe.workers} need {needed}",
              "DOMAIN §2: HIP_/CUDA_VISIBLE_DEVICES lists cards that must exist",
              found=len(gpus), needed=needed)
    return out


def gpu_kv_checks(recipe: Recipe, view: GpuMemoryView | None) -> list[Check]:
    """A GPU recipe's `gpu_memory_utilization` × each card against its free memory (vLLM refuses the
    start otherwise); nothing when the cards' memory was not asked for."""
    if view is None:
        return []
    return [Check(**c.model_dump()) for c in gpu_memory_checks(recipe, view)]


_GPU_HEALTH_FACT = ("NVIDIA Xid catalogue (docs.nvidia.com/deploy/xid-errors) and NVML thresholds "
                    "(MEASURED.md, H200: slowdown 89 °C, shutdown 95 °C); DOMAIN §6: cross-card copies "
                    "depend on the PCIe link")


def gpu_health_checks(recipe: Recipe, gpus: Sequence[CardHealth],
                      fatal: Mapping[int, Sequence[GpuEvent]]) -> list[Check]:
    """The health of the recipe's cards (its `devices`; every card when it names none): warn on a card
    that throttles, runs hot, has uncorrectable ECC errors or pending remaps, or a link below its
    maximum; refuse a card in a fatal state (lost, a failed remap, at shutdown temperature, a fatal
    kernel event since it was last reset). Vendors the platform does not use are not looked at."""
    vendors = GPU_VENDORS.get(recipe.platform)
    if vendors is None:
        return []
    wanted = set(recipe.devices) if recipe.devices else None
    out: list[Check] = []
    for card in gpus:
        if card.vendor not in vendors or (wanted is not None and card.index not in wanted):
            continue
        for f in assess(card, fatal.get(card.index, ())):
            out.append(Check(name=f"gpu-health {f.check}", verdict=f.verdict, message=f.message,
                             numbers={"gpu": card.index, "temperature_c": card.temperature_c,
                                      "slowdown_c": card.temperature_slowdown_c},
                             fact=_GPU_HEALTH_FACT))
    return out
