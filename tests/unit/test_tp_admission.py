"""Admission of the tensor-parallel recipes: one GPU per rank, host RAM per worker process.

DOMAIN §3: the memory story is per worker (each TP rank is its own process with its own RssAnon); the
demand admission predicts is workers × per-worker + overhead, so a TP=4 recipe asks for twice the
worker memory of its TP=2 sibling. And each rank needs its own card."""

from __future__ import annotations

import pytest

from appliance.host_facts import Gpu, HostFacts
from appliance.recipe.admission import Admission, admit
from tests.unit.recipe_helpers import fixed_facts, shipped, with_changes


def _h200s(n: int) -> HostFacts:
    gpus = tuple(Gpu(pci_address=f"0000:{0x18 + i:02x}:00.0", vendor="nvidia", vendor_id="0x10de",
                     device_id="0x2335", kind="display", driver="nvidia") for i in range(n))
    return fixed_facts().model_copy(update={"gpus": gpus})


def _check(a: Admission, name: str) -> tuple[str, dict[str, object]]:
    c = next(c for c in a.checks if c.name == name)
    return c.verdict, dict(c.numbers)


@pytest.mark.parametrize(("recipe", "cards", "verdict"), [
    ("cuda-tp2-graph", 1, "refuse"), ("cuda-tp2-graph", 2, "admit"),
    ("cuda-tp4-eager", 2, "refuse"), ("cuda-tp4-eager", 3, "refuse"), ("cuda-tp4-eager", 4, "admit"),
])
def test_each_rank_needs_its_own_gpu(recipe: str, cards: int, verdict: str) -> None:
    assert _check(admit(shipped()[recipe], _h200s(cards)), "gpus")[0] == verdict


def test_a_tp_recipe_listing_fewer_cards_than_ranks_still_needs_one_per_rank() -> None:
    narrow = with_changes(shipped()["cuda-tp4-graph"], devices=(0, 1))
    verdict, numbers = _check(admit(narrow, _h200s(2)), "gpus")
    assert (verdict, numbers["needed"]) == ("refuse", 4)


def test_host_ram_is_counted_per_worker_process() -> None:
    facts = _h200s(4)
    tp2 = _check(admit(shipped()["cuda-tp2-graph"], facts), "memory-peak-cold")[1]
    tp4 = _check(admit(shipped()["cuda-tp4-graph"], facts), "memory-peak-cold")[1]
    assert (tp2["workers"], tp4["workers"]) == (2, 4)
    per_worker = shipped()["cuda-tp4-graph"].memory.worker_anon_gib_graph  # type: ignore[union-attr]
    assert tp4["demand_gib"] == pytest.approx(float(tp2["demand_gib"]) + 2 * per_worker)  # type: ignore[arg-type]


def test_the_cpu_tp_recipe_counts_each_ranks_kv_cache_in_host_ram() -> None:
    # VLLM_CPU_KVCACHE_SPACE is per rank on the CPU (each worker logs its own 1 GiB): raising it to
    # 4 GiB adds 3 GiB per worker, 6 GiB at TP=2.
    base = _check(admit(shipped()["cpu-tp2"], fixed_facts()), "memory-peak-cold")[1]
    bigger = with_changes(shipped()["cpu-tp2"], env__vars__VLLM_CPU_KVCACHE_SPACE={"value": "4"})
    more = _check(admit(bigger, fixed_facts()), "memory-peak-cold")[1]
    assert more["demand_gib"] == pytest.approx(float(base["demand_gib"]) + 2 * 3)  # type: ignore[arg-type]
