"""bench.engine_cpu: the CPU engine started outside the supervisor is the default recipe, rendered.

One source of truth (recipes/cpu-smollm2.yaml → render): engine_env and the harness's argv cannot
drift from what the supervisor launches, and the rendered env is pinned to the one measured in
docs/engine-cpu.md (cold 241 s / warm 26 s init engine, torch cache hit lines).
"""

from __future__ import annotations

from pathlib import Path

from appliance.recipe.recipe_loader import load_recipes
from appliance.recipe.render import render
from bench import engine_cpu
from controller.settings import DEFAULT_RECIPE, paths, recipes_dir
from host_setup.facts import gather_facts
from tests.unit.recipe_helpers import HOME, fixed_facts

ROOT = Path("/srv/trial/cache")


def test_engine_env_is_the_rendered_recipe_env_for_the_same_cache_root() -> None:
    """The drift guard: exactly the recipe as the supervisor renders it, only the root replaced."""
    facts = gather_facts(Path("/"), appliance_home=paths().home)
    recipe = load_recipes(recipes_dir())[DEFAULT_RECIPE]
    assert engine_cpu.engine_env(ROOT) == render(recipe, facts, cache_root=str(ROOT)).env
    assert engine_cpu.engine_env(ROOT, facts=fixed_facts()) == render(
        recipe, fixed_facts(), cache_root=str(ROOT)).env


def test_rendered_env_is_the_measured_one() -> None:
    """docs/engine-cpu.md "Starting it": every variable of the measured warm restart, nothing else."""
    assert engine_cpu.engine_env(ROOT, facts=fixed_facts()) == {
        "VLLM_CACHE_ROOT": f"{ROOT}/vllm",
        "TORCHINDUCTOR_CACHE_DIR": f"{ROOT}/inductor",  # where the warm-start artifacts live
        "TRITON_CACHE_DIR": f"{ROOT}/triton",
        "TMPDIR": f"{ROOT}/tmp",  # inductor's C++ precompiled headers (149 MB)
        "VLLM_RPC_BASE_PATH": "/tmp",  # IPC sockets: out of the cache root, ≤ 107-byte paths
        "VLLM_USE_AOT_COMPILE": "0",  # the AOT load always fails on the CPU in 0.32.0
        "TORCH_LOGS": engine_cpu.CACHE_PROOF_TORCH_LOGS,  # the only hit/miss proof
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_LOGGING_LEVEL": "INFO",
        "PYTHONUNBUFFERED": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }


def test_the_supervisor_launch_carries_the_cache_proof_loggers() -> None:
    """Without a cache root override too: the supervisor's own launch can prove a warm restart."""
    spec = engine_cpu.launch_spec(facts=fixed_facts())
    assert spec.env["TORCH_LOGS"] == engine_cpu.CACHE_PROOF_TORCH_LOGS
    assert spec.cache_root.startswith(f"{HOME}/cache/{DEFAULT_RECIPE}-")


def test_launch_spec_argv_is_the_recipe_with_the_port_replaced() -> None:
    spec = engine_cpu.launch_spec(ROOT, port=18431, facts=fixed_facts())
    assert spec.command() == spec.argv == (
        f"{HOME}/engine/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server",
        "--model", f"{HOME}/models/smollm2-135m-instruct",
        "--served-model-name", "smollm2",
        "--dtype", "bfloat16", "--tensor-parallel-size", "1", "--max-model-len", "2048",
        "--host", "127.0.0.1", "--port", "18431",
    )
    assert (spec.cache_root, spec.base_url, spec.served_model_name) == (
        str(ROOT), "http://127.0.0.1:18431", "smollm2")


def test_port_is_not_a_compile_input() -> None:
    """Another port keeps the variant's cache root (so a harness on a free port still starts warm)."""
    assert (engine_cpu.launch_spec(port=18431, facts=fixed_facts()).cache_root
            == engine_cpu.launch_spec(facts=fixed_facts()).cache_root)


def test_prepare_cache_dirs_creates_every_pinned_directory(tmp_path: Path) -> None:
    spec = engine_cpu.launch_spec(tmp_path / "c", facts=fixed_facts())
    assert spec.cache_dirs() == tuple(str(tmp_path / "c" / d) for d in ("inductor", "tmp", "triton", "vllm"))
    engine_cpu.prepare_cache_dirs(spec)
    engine_cpu.prepare_cache_dirs(spec)  # idempotent: a warm restart reuses the root
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == ["inductor", "tmp", "triton", "vllm"]
