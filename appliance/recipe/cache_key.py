"""The compile-cache root of a recipe variant. Pure.

DOMAIN §2/§4 (S8 §5.4, S11m): with no fixed `VLLM_CACHE_ROOT` every start compiles a new "vintage"
and the token stream is a lottery; one cache root per recipe variant, and the root must not change
inside a service (changing `VLLM_CACHE_ROOT` changes the AOT key: the next start is cold, 352 s
instead of 230 s for recipe C, S14c). So the key covers what the *compiled artifacts* depend on and
nothing else:

- the engine build: image (+ digest) or the process runtime's interpreter, and the platform files
  sourced before start (DTK env: toolchain paths change kernels);
- the model (path, and the host directory its weights come from);
- the compile-relevant engine flags (`COMPILE_ENGINE_FIELDS`): dtype, TP, eager/graph, the graph
  mode and capture sizes (and what sizes vLLM's default capture list: max_num_seqs,
  max_num_batched_tokens), max_model_len and the cache layout flags vLLM hashes into its own
  compile key, the attention backend, and `extra_args` (opaque, so conservatively in);
- the environment, except variables known not to reach the compiler (`NON_COMPILE_ENV`): e.g.
  `VLLM_LOGGING_LEVEL` is in (DEBUG changes the AOT key, DOMAIN §2), `VLLM_DCU_USE_INT8_SDOT4` is in
  (it selects other kernels, S11k), `TOKENIZERS_PARALLELISM` is out. An unknown variable is in.

Out: sampling and API-server flags (`override_generation_config`, chat template kwargs, tool and
reasoning parsers, prompt token details, where it listens), memory sizing that does not change code
(`gpu_memory_utilization`, KV space), all-reduce flags — S13: "the AR flag and the compile flag do
not enter the AOT key" (two loads of one vintage bitwise identical, Δlogprob 0.000000) — which cards
are used (the count is TP), the torch-first wrapper (import order, not code), and everything an operator
edits for humans (`why`, `description`, `notes`), expectations, host requirements and the admission
memory model: a comment or a temperature change must not throw away a warm start. (Inside one root
vLLM keys its own AOT artifacts by its config hash and inductor/Triton caches are content-addressed,
so variants that share a root still reuse every kernel they have in common.)

Computed on the recipe as written (before ${APPLIANCE_HOME} is substituted), so the key is the
same on every host; the root directory itself lives under the host's cache root.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from appliance.host_facts import HostFacts
from appliance.recipe.recipe_model import Recipe
from appliance.runtimes import registry as runtime_registry

# Every EngineArgs field is in exactly one of these two sets (tests/unit/test_cache_key.py checks it,
# so a new field must be placed on purpose).
COMPILE_ENGINE_FIELDS = frozenset({
    "dtype", "tensor_parallel_size", "mode", "cudagraph_mode", "cudagraph_capture_sizes",
    "max_model_len", "max_num_batched_tokens", "max_num_seqs", "enable_prefix_caching",
    "mamba_cache_mode", "attention_backend", "extra_args",
})
NON_COMPILE_ENGINE_FIELDS = frozenset({
    "gpu_memory_utilization", "disable_custom_all_reduce", "skip_mm_profiling",
    "enable_prompt_tokens_details", "enable_auto_tool_choice", "tool_call_parser", "reasoning_parser",
    "override_generation_config", "default_chat_template_kwargs", "host", "port", "why",
})
# Environment variables that never reach the compiler: process plumbing, logging of other
# libraries, allocator and KV sizing, which cards (the count is TP), and all-reduce transport (S13).
NON_COMPILE_ENV = frozenset({
    "PYTHONUNBUFFERED", "TOKENIZERS_PARALLELISM", "VLLM_WORKER_MULTIPROC_METHOD", "TORCH_LOGS",
    "PYTORCH_HIP_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "MALLOC_ARENA_MAX", "VLLM_CPU_KVCACHE_SPACE",
    "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "VLLM_RPC_BASE_PATH", "HF_HUB_OFFLINE",
})
NON_COMPILE_ENV_PREFIXES = ("NCCL_", "RCCL_")


def compile_env(name: str) -> bool:
    return name not in NON_COMPILE_ENV and not name.startswith(NON_COMPILE_ENV_PREFIXES)


def cache_key_inputs(recipe: Recipe) -> dict[str, Any]:
    """The recipe values the key is computed from (shown by `appliance plan`)."""
    runtime = runtime_registry.for_recipe(recipe).cache_key_inputs(recipe)
    engine = {k: v for k, v in recipe.engine.model_dump(mode="json").items() if k in COMPILE_ENGINE_FIELDS}
    return {
        "platform": recipe.platform.value,
        "runtime": runtime,
        "model": {"path": recipe.model.path, "host_path": recipe.model.host_path},
        "engine": engine,
        "env": {name: var.value for name, var in sorted(recipe.env.vars.items()) if compile_env(name)},
        "source_files": list(recipe.env.source_files),
    }


def cache_key(recipe: Recipe) -> str:
    """12 hex chars of sha256 over `cache_key_inputs` (canonical JSON)."""
    blob = json.dumps(cache_key_inputs(recipe), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def variant_cache_root(recipe: Recipe, facts: HostFacts) -> str:
    """`<cache.root>/<recipe name>-<key>`: readable, and distinct per variant."""
    base = facts.expand(recipe.cache.root).rstrip("/")
    return f"{base}/{recipe.name}-{cache_key(recipe)}"
