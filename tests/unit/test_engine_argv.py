"""The one argv reader (appliance/engine_argv.py) and the typed facts a LaunchSpec carries:
render sets them from the recipe, they agree with what argv says, and a spec built without
them (an old launch record, a spec built by hand) gets them from its argv."""

from __future__ import annotations

import json

import pytest

from appliance import engine_argv
from appliance.recipe.launch_spec import DERIVED_FIELDS, HASH_EXCLUDE, LaunchSpec
from appliance.recipe.render import render
from tests.unit.recipe_helpers import REPO, SHIPPED, fixed_facts, shipped


def test_split_into_launcher_and_flag_groups() -> None:
    argv = ("vllm", "serve", "m", "--a", "1", "2", "--b", "-cc.x=y")
    assert engine_argv.split(argv) == (("vllm", "serve", "m"), (("--a", "1", "2"), ("--b",), ("-cc.x=y",)))
    assert engine_argv.join(*engine_argv.split(argv)) == argv
    code = ("python", "-c", "import torch; main()", "serve", "/m", "--dtype", "auto")
    assert engine_argv.split(code)[0] == code[:5]  # `-c` and its code are not flags
    assert engine_argv.split(("python",)) == (("python",), ())


def test_flag_value_and_model() -> None:
    assert engine_argv.flag_value(("x", "--api-key", "k", "--api-key", "j"), "--api-key") == "k"  # the first
    assert engine_argv.flag_value(("x", "--api-key=k2"), "--api-key") == "k2"
    assert engine_argv.flag_value(("x", "--api-key"), "--api-key") is None
    assert engine_argv.model_of(("vllm", "serve", "/m", "--dtype", "bfloat16")) == "/m"
    assert engine_argv.model_of(("python", "-m", "x", "--model", "/n", "--dtype", "auto")) == "/n"
    assert engine_argv.model_of(("python", "--model=/o")) == "/o"
    assert engine_argv.model_of(("python",)) is None


@pytest.mark.parametrize("name", SHIPPED)
def test_render_sets_the_facts_argv_states(name: str) -> None:
    """The typed fields come from the recipe; argv, written from the same recipe fields, says the same."""
    recipe = shipped()[name]
    spec = render(recipe, fixed_facts())
    assert spec.tensor_parallel_size == recipe.engine.tensor_parallel_size
    assert spec.model == fixed_facts().expand(recipe.model.path)
    assert {k: getattr(spec, k) for k in DERIVED_FIELDS} == engine_argv.facts_of(spec.argv)
    assert engine_argv.flag_value(spec.argv, "--served-model-name") == spec.served_model_name
    assert engine_argv.flag_value(spec.argv, "--port") == str(spec.port)
    assert engine_argv.join(spec.launcher, spec.flag_groups) == spec.argv


@pytest.mark.parametrize("name", SHIPPED)
def test_a_spec_without_the_facts_reads_them_from_argv(name: str) -> None:
    """A launch record written before the fields existed validates to the same spec."""
    spec = render(shipped()[name], fixed_facts())
    old = json.loads(spec.model_dump_json(exclude=set(DERIVED_FIELDS)))
    assert LaunchSpec.model_validate(old) == spec


def test_old_launch_records_get_the_facts() -> None:
    for path in sorted((REPO / "tests" / "fixtures" / "launch_spec_v1").glob("*.json")):
        spec = LaunchSpec.model_validate(json.loads(path.read_text()))
        assert spec.model == engine_argv.model_of(spec.argv) is not None
        assert spec.listen == engine_argv.flag_value(spec.argv, "--host")


def test_the_hash_leaves_the_derived_facts_out() -> None:
    assert DERIVED_FIELDS < HASH_EXCLUDE
    spec = render(shipped()["cpu-smollm2"], fixed_facts())
    assert not DERIVED_FIELDS & set(spec.model_dump(exclude=set(HASH_EXCLUDE)))
