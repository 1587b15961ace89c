"""Host requirement checks and the compile-cache key at their edges: what a mutation run over
appliance/recipe/admission.py and appliance/recipe/cache_key.py found unpinned (docs/mutation-testing.md).
The memory model's own edges are in test_admission.py."""

from __future__ import annotations

import pytest

from appliance.host_facts import GIB, MIB, UNLIMITED, HostFacts
from appliance.recipe.admission import SWAP_SLACK_BYTES, admit, kv_request_gib
from appliance.recipe.cache_key import cache_key
from appliance.recipe.recipe_model import Recipe
from tests.unit.recipe_helpers import B, C, host, shipped, with_changes

CPU = "cpu-smollm2"


def _check(recipe: Recipe, facts: HostFacts, name: str) -> tuple[str, dict[str, object], str]:
    found = [c for c in admit(recipe, facts).checks if c.name == name]
    assert len(found) == 1, f"{name}: {[c.name for c in admit(recipe, facts).checks]}"
    return found[0].verdict, dict(found[0].numbers), found[0].message


def _names(recipe: Recipe, facts: HostFacts) -> set[str]:
    return {c.name for c in admit(recipe, facts).checks}


def test_min_ram_is_checked_and_exactly_enough_is_enough() -> None:
    facts = host("reference").model_copy(update={"mem_total_bytes": 32 * GIB})
    needs_32 = with_changes(shipped()[CPU], host__min_ram_gib=32)
    assert _check(needs_32, facts, "min-ram") == (
        "admit", {"mem_total_gib": 32.0, "required_gib": 32.0}, "MemTotal 32.00 GiB, recipe needs 32.0 GiB")
    needs_more = with_changes(shipped()[CPU], host__min_ram_gib=32.5)
    verdict, numbers, _ = _check(needs_more, facts, "min-ram")
    assert (verdict, numbers) == ("refuse", {"mem_total_gib": 32.0, "required_gib": 32.5})
    assert "min-ram" not in _names(shipped()[CPU], facts)  # no requirement, no check


def test_swap_total_says_how_much_to_add_and_counts_a_swapfile_header_as_slack() -> None:
    c = shipped()[C]
    verdict, numbers, message = _check(c, host("reference"), "swap-total")
    assert (verdict, numbers) == ("refuse", {"swap_total_gib": 4.0, "required_gib": 8.0})
    assert message.endswith(": add a 4.0 GiB swapfile (`appliance host apply gfx906-c-tp4-graph-piecewise`)")
    half = host("reference").model_copy(update={"swap_total_bytes": int(7.5 * GIB)})
    assert ": add a 0.5 GiB swapfile" in _check(c, half, "swap-total")[2]
    # Exactly 8 GiB less the slack a swapfile header costs is 8 GiB; one byte less is not.
    edge = host("reference").model_copy(update={"swap_total_bytes": 8 * GIB - SWAP_SLACK_BYTES})
    verdict, _, message = _check(c, edge, "swap-total")
    assert verdict == "admit" and "add a" not in message
    short = edge.model_copy(update={"swap_total_bytes": 8 * GIB - SWAP_SLACK_BYTES - 1})
    assert _check(c, short, "swap-total")[0] == "refuse"


def test_the_host_checks_name_their_numbers() -> None:
    facts = host("reference").model_copy(update={"gpus": host("reference").gpus[:3]})
    c = shipped()[C]
    assert _check(c, facts, "swappiness")[:2] == ("refuse", {"swappiness": 60, "required": 200})
    assert _check(c, facts, "gpus")[:2] == ("refuse", {"found": 3, "needed": 4})
    assert _check(c, facts, "kernel-module")[:2] == ("admit", {"kernel": "5.15.0-191-generic"})
    assert _check(c, facts, "pcie-acs")[2] == "ACS redirect off via pci=disable_acs_redir="


def test_a_cgroup_limit_is_judged_only_for_recipes_that_require_none() -> None:
    cpu = shipped()[CPU]
    facts = host("reference")
    assert _check(cpu, facts, "cgroup-memory-limit")[:2] == ("admit", {"limit_bytes": None})
    assert "no cgroup memory limit" in _check(cpu, facts, "cgroup-memory-limit")[2]
    limited = facts.model_copy(update={"cgroup_memory_limit_bytes": 32 * GIB})
    assert _check(cpu, limited, "cgroup-memory-limit")[:2] == ("refuse", {"limit_bytes": 32 * GIB})
    indifferent = with_changes(cpu, host__no_cgroup_memory_limit=False)
    assert "cgroup-memory-limit" not in _names(indifferent, limited)


def test_a_gpu_recipe_without_devices_has_no_gpu_count_check() -> None:
    assert "gpus" in _names(shipped()[B], host("reference"))
    assert "gpus" not in _names(with_changes(shipped()[B], devices=()), host("reference"))


@pytest.mark.parametrize(("wants_unlimited", "hard", "soft", "pinned_mib", "verdict", "limit"), [
    (True, UNLIMITED, 8 * MIB, 256, "admit", UNLIMITED),  # the process runtime may raise soft to hard
    (True, 64 * MIB, 8 * MIB, 256, "refuse", 8 * MIB),  # it cannot: the soft limit is what the engine gets
    (False, UNLIMITED, 8 * MIB, 256, "refuse", 8 * MIB),  # the recipe does not ask for it
    (False, None, None, 64, "admit", 64 * MIB),  # unknown: the 64 MiB default, and exactly enough is enough
    (False, None, None, 65, "refuse", 64 * MIB),
])
def test_pinned_memory_against_the_process_runtimes_own_memlock(
        wants_unlimited: bool, hard: int | None, soft: int | None, pinned_mib: int, verdict: str,
        limit: int) -> None:
    recipe = with_changes(shipped()[CPU], host__memlock_unlimited=wants_unlimited,
                          memory__pinned_bytes_per_worker=pinned_mib * MIB)
    facts = host("reference").model_copy(update={"memlock_hard_bytes": hard, "memlock_soft_bytes": soft})
    got, numbers, message = _check(recipe, facts, "pinned-memlock")
    assert (got, numbers) == (verdict, {"pinned_bytes_per_worker": pinned_mib * MIB, "memlock_bytes": limit})
    assert ("unlimited" in message) is (limit == UNLIMITED)
    assert ("raise it (--ulimit memlock=-1 / limits.d)" in message) is (verdict == "refuse")
    assert "this host's RLIMIT_MEMLOCK" in message


def test_a_cpu_recipe_without_a_kv_request_has_none() -> None:
    cpu = shipped()[CPU]
    assert kv_request_gib(cpu) is not None
    data = cpu.model_dump()
    data["env"]["vars"].pop("VLLM_CPU_KVCACHE_SPACE")
    assert kv_request_gib(Recipe.model_validate(data)) is None


def test_a_cluster_recipe_names_the_ram_it_needs_and_says_when_it_names_nothing() -> None:
    k8s = shipped()["gfx906-b-tp4-eager-k8s"]
    message = _check(with_changes(k8s, host__min_ram_gib=48), host("reference"), "placement")[2]
    assert "; MemTotal ≥ 48.0 GiB;" in message
    assert "MemTotal ≥" not in _check(k8s, host("reference"), "placement")[2]


# The compile-cache key names the cache directory every warm start reads: a change in how it is
# computed turns every filled cache cold (ready 230 s → 352 s for recipe C, S14c). To change it on
# purpose, print the new keys (`cache_key(shipped()[n])`), paste them here, and say so in the commit.
PINNED_CACHE_KEYS = {
    "cpu-smollm2": "5304934fad8a",
    "cuda-smollm2-graph": "ffe9998d1759",
    "gfx906-b-tp4-eager": "0ba72641c086",
    "gfx906-c-tp4-graph-piecewise": "9e4670fcc58a",
}


@pytest.mark.parametrize("name", sorted(PINNED_CACHE_KEYS))
def test_the_cache_key_of_a_shipped_recipe_does_not_move(name: str) -> None:
    assert cache_key(shipped()[name]) == PINNED_CACHE_KEYS[name]


def test_a_cache_root_with_a_trailing_slash_gives_one_slash_before_the_variant() -> None:
    from appliance.recipe.cache_key import variant_cache_root

    cpu = with_changes(shipped()[CPU], cache__root="/srv/cache/")
    root = variant_cache_root(cpu, host("reference"))
    assert root == f"/srv/cache/{CPU}-{cache_key(cpu)}"
