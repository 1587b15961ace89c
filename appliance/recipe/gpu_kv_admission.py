"""GPU admission of the KV request: `gpu_memory_utilization` × the card against what is free on it. Pure.

vLLM sizes a GPU engine's budget (weights, activations, graphs and the KV cache) as
`gpu_memory_utilization × the card's total memory` and, when the worker starts, refuses to run if the
card has less free than that (vllm/v1/worker/utils.py `request_memory`):

    ValueError: Free memory on device (F/T GiB) on startup is less than desired GPU memory
    utilization (U, R GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.

The refusal is the same on every retry, so it is checked before anything is stopped, per card of the
recipe, from the cards' memory as NVML (or amdgpu sysfs) reports it now:

    requested = utilization × NVML total
    available = NVML free − the new engine's CUDA context + what the engine being replaced holds there

Two measured corrections (the H200 recording, tests/fixtures/gpu_health/h200-2026-12-01/nvml-raw.json,
and the engine logs of docs/gpu-h200.md, tests/fixtures/engine_logs/gpu-h200/piecewise-cold.log):

- the new engine's own CUDA context takes memory before vLLM measures: NVML said 139.80 GiB free on
  the idle card, vLLM `Free memory on device (139.29/139.8 GiB)` — `CUDA_CONTEXT_GIB` = 0.51 GiB;
- vLLM's total is CUDA's (139.8 GiB), NVML's is 140.40 GiB (0.43% more): a shortfall within
  `EDGE_FRACTION` of the card's total is "at the edge" (warn), not a refusal.

The cards: the recipe's `devices` (its CUDA_/HIP_VISIBLE_DEVICES), one per tensor-parallel rank, else
the first `tensor_parallel_size` cards. NVIDIA cards are always checked (no NVML is a warning);
AMD/Hygon cards where amdgpu sysfs shows their VRAM (`mem_info_vram_total`/`_used`). These indices
are the runtime's; NVML's are PCI bus order. They are the same card when CUDA_DEVICE_ORDER=PCI_BUS_ID
(or on a host with one card, or cards whose CUDA order happens to be bus order); the appliance does
not set that variable today, so the check maps a recipe's index to NVML's index of the same number —
an assumption named in each check's numbers (`index_space`) and in docs/hardening-2.md.

The engine being replaced: a restart or apply stops it before the new one starts, so the memory its
processes hold on a card is free by then (`replaces_running=True`, the default). A side-by-side start
(blue/green) leaves it running: pass `replaces_running=False` and nothing is counted back. What it
holds comes from NVML's per-process usage of the engine's pids (`held`); when that is unknown, a card
that would fit only if the running engine is what uses it is a warning, not a refusal.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from appliance.host_facts import GIB
from appliance.observe.gpu_mem import GpuSample
from appliance.recipe.recipe_model import Platform, Recipe

Verdict = Literal["admit", "warn", "refuse"]

# vLLM's default when the recipe leaves `gpu_memory_utilization` unset (CacheConfig).
DEFAULT_UTILIZATION = 0.9
# The new engine's CUDA context, on the card before vLLM takes its snapshot (H200: NVML free 139.80 GiB
# idle, vLLM's "Free memory on device (139.29/139.8 GiB)").
CUDA_CONTEXT_GIB = 0.51
# NVML's total exceeds CUDA's, which vLLM multiplies (H200: 140.40 vs 139.8 GiB, 0.43%).
EDGE_FRACTION = 0.005
VENDORS = {Platform.GFX906: ("hygon", "amd"), Platform.CUDA: ("nvidia",)}
FACT = ("vLLM request_memory: `Free memory on device (F/T GiB) on startup is less than desired GPU memory "
        "utilization (U, R GiB)` refuses the start; H200 (docs/gpu-h200.md): NVML free 139.80 GiB idle, "
        "vLLM sees 139.29/139.8 GiB")


class CardMemory(BaseModel):
    """One card's memory now, bytes (None: not read)."""

    model_config = ConfigDict(frozen=True)

    index: int  # NVML index, or N of /sys/class/drm/cardN
    vendor: str
    total_bytes: int | None = None
    free_bytes: int | None = None

    @classmethod
    def from_sample(cls, sample: GpuSample) -> CardMemory:
        """From the memory watch's sample: NVML's (v1) free is total − used."""
        free = (sample.total_bytes - sample.used_bytes
                if sample.total_bytes is not None and sample.used_bytes is not None else None)
        return cls(index=sample.index, vendor=sample.vendor, total_bytes=sample.total_bytes, free_bytes=free)

    @classmethod
    def from_nvml_raw(cls, index: int, card: Mapping[str, Any]) -> CardMemory:
        """From a raw NVML recording's card (`{"memory": {"ok": {"total", "free", "used"}}}`)."""
        memory = card.get("memory")
        ok = memory.get("ok") if isinstance(memory, Mapping) else None
        if not isinstance(ok, Mapping):
            return cls(index=index, vendor="nvidia")
        return cls(index=index, vendor="nvidia", total_bytes=int(ok["total"]), free_bytes=int(ok["free"]))


class GpuMemoryView(BaseModel):
    """What admission knows of the cards' memory. `cards` None: not readable (`blind` says why).
    `held`: bytes per card that the engine being replaced holds (None: unknown; {} : it holds none,
    or nothing runs). `replaces_running`: the start stops the running engine first (restart/apply)."""

    model_config = ConfigDict(frozen=True)

    cards: tuple[CardMemory, ...] | None
    blind: str | None = None
    held: dict[int, int] | None = None
    replaces_running: bool = True


class MemCheck(BaseModel):
    """A check in admission's shape (appliance/recipe/admission.py `Check`)."""

    model_config = ConfigDict(frozen=True)

    name: str
    verdict: Verdict
    message: str
    numbers: dict[str, float | int | str | None]
    fact: str = FACT


def recipe_cards(recipe: Recipe) -> tuple[int, ...]:
    """The cards the engine uses: one per tensor-parallel rank, from the recipe's devices."""
    if recipe.devices:
        return tuple(recipe.devices[:recipe.workers])
    return tuple(range(recipe.workers))


def utilization(recipe: Recipe) -> float:
    value = recipe.engine.gpu_memory_utilization
    return DEFAULT_UTILIZATION if value is None else value


def _gib(n: float) -> float:
    return round(n / GIB, 2)


def gpu_memory_checks(recipe: Recipe, view: GpuMemoryView) -> list[MemCheck]:
    """One check per card of a GPU recipe (none for other platforms): refuse when the request clearly
    does not fit, warn when it cannot be told (no reading, an unknown share of the running engine, at
    the edge), admit with the numbers otherwise."""
    vendors = VENDORS.get(recipe.platform)
    if vendors is None:
        return []
    util = utilization(recipe)
    wanted = recipe_cards(recipe)
    seen = {c.index: c for c in view.cards or () if c.vendor in vendors}
    if recipe.platform is not Platform.CUDA and not any(
            i in seen and seen[i].total_bytes is not None for i in wanted):
        # AMD/Hygon: checked where amdgpu sysfs gives VRAM numbers; a DCU whose driver (hydcu) shows
        # none is not a blind spot to warn about on every plan (the CUDA context figure is the H200's).
        return []
    if view.cards is None:
        return [MemCheck(
            name="gpu-memory", verdict="warn",
            message=f"card memory unknown ({view.blind or 'not read'}): gpu_memory_utilization {util} "
                    f"on GPU(s) {list(wanted)} is not checked against what is free",
            numbers={"utilization": util})]
    return [_card_check(util, index, seen.get(index), view) for index in wanted]


def _card_check(util: float, index: int, card: CardMemory | None, view: GpuMemoryView) -> MemCheck:
    name = f"gpu-memory {index}"
    if card is None or card.total_bytes is None or card.free_bytes is None:
        return MemCheck(name=name, verdict="warn",
                        message=f"GPU {index}: its memory was not read; gpu_memory_utilization {util} is "
                                "not checked against what is free",
                        numbers={"gpu": index, "utilization": util})
    total, free = card.total_bytes, card.free_bytes
    requested = util * total
    context = CUDA_CONTEXT_GIB * GIB
    held_known = view.held is not None or not view.replaces_running
    held = (view.held or {}).get(index, 0) if view.replaces_running else 0
    available = free - context + held
    # With the running engine's share unknown, the best case is that all the card's use is its own.
    best = free - context + (total - free) if not held_known else available
    edge = EDGE_FRACTION * total
    short = requested - available
    numbers: dict[str, float | int | str | None] = {
        "gpu": index, "index_space": "recipe device = NVML index (CUDA_DEVICE_ORDER=PCI_BUS_ID)",
        "utilization": util, "total_gib": _gib(total), "free_gib": _gib(free),
        "requested_gib": _gib(requested), "cuda_context_gib": CUDA_CONTEXT_GIB,
        "replaced_engine_holds_gib": _gib(held) if held_known else None,
        "replaces_running": str(view.replaces_running).lower(), "available_gib": _gib(available),
        "max_utilization": round(max(0.0, best) / total, 3),
    }
    held_text = (f" + {_gib(held):.2f} GiB the engine being replaced holds" if held_known and held
                 else " (the running engine is not stopped first)" if not view.replaces_running else "")
    head = (f"GPU {index}: gpu_memory_utilization {util} asks {_gib(requested):.2f} GiB of "
            f"{_gib(total):.2f} GiB; free {_gib(free):.2f} GiB{held_text} − {CUDA_CONTEXT_GIB:.2f} GiB "
            f"for the new engine's CUDA context leaves {_gib(available):.2f} GiB")
    if short <= 0:
        return MemCheck(name=name, verdict="admit", message=head, numbers=numbers)
    fits_at = max(0.0, available) / total
    if not held_known and requested <= best + edge:
        return MemCheck(name=name, verdict="warn", numbers=numbers,
                        message=f"{head}: it fits only if the engine being replaced is what uses the "
                                f"other {_gib(total - free):.2f} GiB (its share could not be read)")
    if short <= edge:
        return MemCheck(name=name, verdict="warn", numbers=numbers,
                        message=f"{head}: at the edge (within {EDGE_FRACTION:.1%} of the card, where "
                                "NVML's and CUDA's totals differ); vLLM may refuse the start")
    return MemCheck(name=name, verdict="refuse", numbers=numbers,
                    message=f"{head}: {_gib(short):.2f} GiB short — vLLM would refuse the start (`Free "
                            "memory on device … is less than desired GPU memory utilization`). Lower "
                            f"engine.gpu_memory_utilization to ≤ {fits_at:.2f}, or free the card "
                            "(another process holds it)")
