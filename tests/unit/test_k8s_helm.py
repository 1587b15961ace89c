"""`render --format helm-values`: values for vLLM production-stack's chart, validated with `jsonschema`
against the chart's own values.schema.json (tests/fixtures/helm/, its commit in the README there).
Helm itself does not run here: the chart's templates are not rendered."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
import yaml

from appliance.render import render
from appliance.runtimes import kubernetes as k8s
from appliance.runtimes.k8s_helm import flag_groups, split_image
from tests.unit.recipe_helpers import REPO, fixed_facts, shipped

SCHEMA_PATH = REPO / "tests" / "fixtures" / "helm" / "production-stack-values.schema.json"
SCHEMA = json.loads(SCHEMA_PATH.read_text())
AN_IMAGE = "vllm/vllm-openai:v0.11.0"


def _values(name: str) -> dict[str, Any]:
    recipe = shipped()[name]
    spec = render(recipe, fixed_facts())
    image = None if getattr(spec.runtime, "image", None) else AN_IMAGE
    text = k8s.render_with_image("helm-values", spec, recipe, image) if image else \
        k8s.PLUGIN.formats["helm-values"](spec, recipe)
    values: dict[str, Any] = yaml.safe_load(text)
    return values


def _unknown_keys(value: Any, schema: dict[str, Any], path: str) -> list[str]:
    """Keys the schema does not name (it allows them, but the chart would ignore them)."""
    if not isinstance(value, dict) or "properties" not in schema:
        if isinstance(value, list) and "items" in schema:
            return [u for i, v in enumerate(value) for u in _unknown_keys(v, schema["items"], f"{path}[{i}]")]
        return []
    out = [f"{path}.{k}" for k in value if k not in schema["properties"]]
    return out + [u for k, v in value.items() if k in schema["properties"]
                  for u in _unknown_keys(v, schema["properties"][k], f"{path}.{k}")]


@pytest.mark.parametrize("name", sorted(n for n, r in shipped().items() if not r.abstract))
def test_helm_values_validate_against_the_chart_schema(name: str) -> None:
    values = _values(name)
    jsonschema.validate(values, SCHEMA)
    assert _unknown_keys(values, SCHEMA, "") == []
    engine = values["servingEngineSpec"]
    probe = engine["startupProbe"]
    assert probe["failureThreshold"] * probe["periodSeconds"] >= shipped()[name].expect.ready_budget_s
    assert engine["strategy"] == {"type": "Recreate"}
    (model,) = engine["modelSpec"]
    assert model["replicaCount"] == 1
    assert "limitMemory" not in model  # DOMAIN §3
    assert not {e["name"] for e in model["env"]} & {"HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES",
                                                   "VLLM_API_KEY"}


def test_gfx906_values_carry_amd_gpus_and_caches_in_the_volume() -> None:
    values = _values("gfx906-c-tp4-graph-piecewise")
    (model,) = values["servingEngineSpec"]["modelSpec"]
    assert (model["requestGPU"], model["requestGPUType"]) == (4, "amd.com/gpu")
    assert model["vllmConfig"]["tensorParallelSize"] == 4
    assert model["vllmConfig"]["dtype"] == "float16"  # never auto (DOMAIN §2)
    assert model["shmSize"] == "16Gi"
    env = {e["name"]: e["value"] for e in model["env"]}
    for name in ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        assert env[name].startswith("/data/"), name  # the chart's volume (pvcStorage)
    extra = model["vllmConfig"]["extraArgs"]
    assert extra[extra.index("--cudagraph-capture-sizes") + 1: extra.index("--cudagraph-capture-sizes") + 5] \
        == ["1", "2", "4", "8"]
    assert "--host" not in extra and "--port" not in extra  # the chart writes them
    # recipe memory model: 4 × (6.76 + 1.27) + 3.1 + 1.43 = 36.65 → 37Gi, a request only
    assert model["requestMemory"] == "37Gi"
    assert values["servingEngineSpec"]["vllmApiKey"] == {
        "secretName": "appliance-gfx906-c-tp4-graph-piecewise-engine-key", "secretKey": "VLLM_API_KEY"}


def test_what_the_chart_cannot_carry_is_said() -> None:
    recipe = shipped()["gfx906-b-tp4-eager"]
    text = k8s.PLUGIN.formats["helm-values"](render(recipe, fixed_facts()), recipe)
    assert "torch-first wrapper" in text and "/opt/dtk/env.sh" in text
    assert "[k8s-memlock]" in text


def test_split_image_and_flag_groups() -> None:
    assert split_image("z100-vllm:dtk2604-gfx906") == ("z100-vllm", "dtk2604-gfx906")
    assert split_image("reg:5000/a/b") == ("reg:5000/a/b", "latest")
    assert split_image("reg:5000/a/b:t@sha256:" + "0" * 64) == ("reg:5000/a/b", "t@sha256:" + "0" * 64)
    assert flag_groups(("vllm", "serve", "m", "--a", "1", "2", "--b", "-cc.x=y")) == [
        ["--a", "1", "2"], ["--b"], ["-cc.x=y"]]
