"""The compile-cache root per recipe variant: what moves it and what must not (S11m, DOMAIN §4)."""

from __future__ import annotations

import pytest

from appliance.recipe.cache_key import cache_key, variant_cache_root
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
    # flags that do not reach the compiler (sampling, API server, memory sizing, all-reduce)
    {"engine__override_generation_config": {"temperature": 0.2, "repetition_penalty": 1.05}},
    {"engine__override_generation_config": None},
    {"engine__default_chat_template_kwargs": {"reasoning_effort": "high"}},
    {"engine__tool_call_parser": "hermes"},
    {"engine__reasoning_parser": None},
    {"engine__enable_auto_tool_choice": False},
    {"engine__enable_prompt_tokens_details": False},
    {"engine__gpu_memory_utilization": 0.9},
    {"engine__disable_custom_all_reduce": False},  # S13: the AR flag is not in the AOT key
    {"engine__skip_mm_profiling": False},
    {"devices": (3, 2, 1, 0)},  # which cards; the count is TP
    {"env__torch_first_wrapper": False},  # import order, not compiled code
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
    {"engine__cudagraph_mode": "FULL_AND_PIECEWISE"},
    {"engine__cudagraph_mode": None, "engine__cudagraph_capture_sizes": None, "engine__mode": "eager"},
    {"engine__dtype": "bfloat16"},
    {"engine__tensor_parallel_size": 2},
    {"engine__max_model_len": 131072},
    {"engine__max_num_seqs": 64},
    {"engine__max_num_batched_tokens": 512},
    {"engine__mamba_cache_mode": "all"},
    {"engine__attention_backend": "TRITON_ATTN"},
    {"engine__extra_args": ("--seed", "1")},
    {"engine__extra_args": ("-cc.inductor_compile_config.benchmark_combo_kernel=False",)},
    {"runtime__image": "z100-vllm:other"},
    {"runtime__digest": "sha256:" + "0" * 64},
    {"model__path": "/models/other"},
    {"model__host_path": "/srv/models/other"},
    {"env__source_files": ("/opt/dtk-26.10/env.sh", "/src/tools/dcu/env.sh")},
])
def test_compile_inputs_move_the_root(changes: dict[str, object]) -> None:
    base = shipped()[C]
    assert cache_key(with_changes(base, **changes)) != cache_key(base)


@pytest.mark.parametrize(("name", "value"), [
    ("VLLM_DCU_USE_INT8_SDOT4", "0"),  # other kernels (S11k)
    ("VLLM_LOGGING_LEVEL", "DEBUG"),  # DOMAIN §2: DEBUG changes the AOT cache key
    ("PYTHONPATH", "/src"),  # without the patched triton the gfx906 kernels do not build
    ("SOME_UNKNOWN_SWITCH", "1"),  # unknown: conservatively a compile input
])
def test_a_compile_env_value_moves_the_root(name: str, value: str) -> None:
    base = shipped()[C]
    env = base.model_dump()["env"]["vars"]
    env[name] = {"value": value}
    assert cache_key(with_changes(base, env__vars=env)) != cache_key(base)


@pytest.mark.parametrize(("name", "value"), [
    ("TOKENIZERS_PARALLELISM", "true"),
    ("PYTHONUNBUFFERED", "0"),
    ("PYTORCH_HIP_ALLOC_CONF", "expandable_segments:False"),
    ("NCCL_DEBUG", "INFO"),  # all-reduce transport (S13)
    ("TORCH_LOGS", "+dynamo"),
])
def test_a_non_compile_env_value_keeps_the_root(name: str, value: str) -> None:
    base = shipped()[C]
    env = base.model_dump()["env"]["vars"]
    env[name] = {"value": value}
    assert cache_key(with_changes(base, env__vars=env)) == cache_key(base)


def test_every_engine_field_is_classified() -> None:
    from appliance.recipe.cache_key import COMPILE_ENGINE_FIELDS, NON_COMPILE_ENGINE_FIELDS
    from appliance.recipe.recipe_model import EngineArgs

    assert not COMPILE_ENGINE_FIELDS & NON_COMPILE_ENGINE_FIELDS
    assert set(EngineArgs.model_fields) == COMPILE_ENGINE_FIELDS | NON_COMPILE_ENGINE_FIELDS


def test_the_sampling_temperature_keeps_the_root_of_every_shipped_recipe() -> None:
    for recipe in shipped().values():
        changed = with_changes(recipe, engine__override_generation_config={"temperature": 0.1})
        assert cache_key(changed) == cache_key(recipe), recipe.name


def test_root_lives_under_the_hosts_cache_dir_named_by_recipe() -> None:
    r = shipped()[C]
    assert variant_cache_root(r, fixed_facts()) == f"{HOME}/cache/{C}-{cache_key(r)}"
    assert len(cache_key(r)) == 12
