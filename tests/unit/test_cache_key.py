"""The compile-cache root per recipe variant: what moves it and what must not (S11m, DOMAIN §4)."""

from __future__ import annotations

import pytest

from appliance.cache_key import cache_key, variant_cache_root
from tests.unit.recipe_helpers import HOME, C, fixed_facts, shipped, with_changes


@pytest.mark.parametrize("changes", [
    {"description": "reworded"},
    {"expect__notes": "a note"},
    {"expect__ready_budget_s": 1200},
    {"expect__decode_ms_per_token": 50.0},
    {"host__swappiness": 100},
    {"host__swap_total_gib": 16.0},
    {"memory__overhead_gib": 2.0},
    {"engine__why": {"dtype": "another reason"}},
    {"engine__port": 8001},
    {"engine__host": "0.0.0.0"},
])
def test_prose_expectations_host_and_listen_address_keep_the_root(changes: dict[str, object]) -> None:
    base = shipped()[C]
    assert cache_key(with_changes(base, **changes)) == cache_key(base)


def test_env_why_keeps_the_root() -> None:
    base = shipped()[C]
    env = base.model_dump()["env"]["vars"]
    env["VLLM_LOGGING_LEVEL"]["why"] = "reworded"
    assert cache_key(with_changes(base, env__vars=env)) == cache_key(base)


@pytest.mark.parametrize("changes", [
    {"engine__cudagraph_capture_sizes": (1, 2, 4, 8, 16)},
    {"engine__max_model_len": 131072},
    {"engine__extra_args": ("--seed", "1")},
    {"runtime__image": "z100-vllm:other"},
    {"model__path": "/models/other"},
    {"devices": (0, 1, 2)},
    {"env__torch_first_wrapper": False},
])
def test_compile_inputs_move_the_root(changes: dict[str, object]) -> None:
    base = shipped()[C]
    assert cache_key(with_changes(base, **changes)) != cache_key(base)


def test_an_env_value_moves_the_root() -> None:
    base = shipped()[C]
    env = base.model_dump()["env"]["vars"]
    env["VLLM_DCU_USE_INT8_SDOT4"]["value"] = "0"
    assert cache_key(with_changes(base, env__vars=env)) != cache_key(base)


def test_root_lives_under_the_hosts_cache_dir_named_by_recipe() -> None:
    r = shipped()[C]
    assert variant_cache_root(r, fixed_facts()) == f"{HOME}/cache/{C}-{cache_key(r)}"
    assert len(cache_key(r)) == 12
