"""The compile-key guard: no per-launch value may move vLLM's compile cache, under any supported version.

Two launches of every shipped recipe, each with its own launch id and fresh engine key, exactly as
the runtimes start them (tests/unit/engine_invocations.py), must give vLLM the same hashed
environment under every version's rule (appliance/observe/vllm_compile_rules.py: 0.26.0's ignore list from
its source; the gfx906 build held to the strictest rule) and the same argv; neither the key nor the
launch id may reach any variable vLLM reads or any argv word. The converse shows the check can fail:
the old delivery (`VLLM_API_KEY`) and a compile-relevant variable move the key under 0.26.0.
(tests/integration/test_compile_key_real.py asks the CPU engine's own vLLM the same questions.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from appliance.observe.vllm_compile_rules import RULES, moved_by, per_launch_leaks
from tests.unit.engine_invocations import invocation, specs

SPECS = specs()


@pytest.mark.parametrize("name", sorted(SPECS))
def test_two_launches_of_a_shipped_recipe_give_vllm_the_same_compile_inputs(
    name: str, tmp_path: Path,
) -> None:
    spec = SPECS[name]
    a = invocation(spec, "20261201T100000-launch-a", tmp_path)
    b = invocation(spec, "20261201T100500-launch-b", tmp_path)
    if a.key is not None:
        assert a.key != b.key  # a fresh key per launch: what made every warm start cold
    for rule in RULES.values():
        assert moved_by(rule, a.env, b.env) == [], f"{name}: {rule.version} would recompile"
    assert a.argv == b.argv, f"{name}: argv differs between launches"
    for inv in (a, b):
        leaks = per_launch_leaks({"engine key": inv.key or "", "launch id": inv.launch_id}, inv.env, inv.argv)
        assert leaks == [], f"{name}: {leaks}"
        assert "VLLM_API_KEY" not in inv.env or inv.key is None  # only a recipe's own, fixed key


def test_the_old_delivery_and_a_compile_variable_do_move_the_key() -> None:
    """The converse: the check fires on the old VLLM_API_KEY delivery and on a real compile input."""
    old_a, old_b = {"VLLM_API_KEY": "eng_one"}, {"VLLM_API_KEY": "eng_two"}
    assert moved_by(RULES["0.26.0"], old_a, old_b) == ["VLLM_API_KEY"]
    assert moved_by(RULES["gfx906"], old_a, old_b) == ["VLLM_API_KEY"]
    assert moved_by(RULES["0.26.0"], {"VLLM_USE_AOT_COMPILE": "1"}, {"VLLM_USE_AOT_COMPILE": "0"}) == [
        "VLLM_USE_AOT_COMPILE"]
    assert moved_by(RULES["0.26.0"], {}, {"VLLM_PP_LAYER_PARTITION": "8,8"}) == ["VLLM_PP_LAYER_PARTITION"]
    # Ignored by 0.26.0 (its source says so), hashed under the strictest rule.
    assert moved_by(RULES["0.26.0"], {"VLLM_PORT": "1"}, {"VLLM_PORT": "2"}) == []
    assert moved_by(RULES["gfx906"], {"VLLM_PORT": "1"}, {"VLLM_PORT": "2"}) == ["VLLM_PORT"]
    # Variables vLLM does not read move nothing.
    assert moved_by(RULES["gfx906"], {"PYTHONUNBUFFERED": "1"}, {"PYTHONUNBUFFERED": "0"}) == []
    leaks = per_launch_leaks({"engine key": "eng_one"}, {"VLLM_API_KEY": "eng_one"},
                             ("vllm", "--api-key", "eng_one"))
    assert leaks == ["engine key in env VLLM_API_KEY", "engine key in argv word 2"]


def test_every_runtime_kind_of_the_shipped_recipes_is_covered() -> None:
    assert {s.kind for s in SPECS.values()} >= {"process", "docker", "kubernetes"}
