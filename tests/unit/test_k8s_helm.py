"""`render --format helm-values`: values for vLLM production-stack's chart, validated against
`appliance.runtimes.k8s.helm_model.HelmValues` — exactly the subset of the chart's values the render
writes, unknown keys forbidden. Its key names and types follow production-stack's documented values at
commit 01eaf92cb895ececa44ee86083f11522adafbbc9 (helm/values.schema.json); the chart's own schema is not
shipped here (nothing fetched from a public repository is committed). Helm itself does not run here: the
chart's templates are not rendered."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from appliance.recipe.render import render
from appliance.runtimes.k8s import kubernetes as k8s
from appliance.runtimes.k8s.helm import split_image
from appliance.runtimes.k8s.helm_model import HelmValues
from tests.unit.recipe_helpers import fixed_facts, shipped, with_changes

AN_IMAGE = "vllm/vllm-openai:v0.11.0"
K8S_RECIPE = "gfx906-b-tp4-eager-k8s"


def _values(name: str) -> dict[str, Any]:
    return _values_of(shipped()[name])


def _values_of(recipe: Any) -> dict[str, Any]:
    spec = render(recipe, fixed_facts())
    image = None if getattr(spec.runtime, "image", None) else AN_IMAGE
    text = k8s.render_with_image("helm-values", spec, recipe, image) if image else \
        k8s.PLUGIN.formats["helm-values"](spec, recipe)
    values: dict[str, Any] = yaml.safe_load(text)
    return values


@pytest.mark.parametrize("name", sorted(n for n, r in shipped().items() if not r.abstract))
def test_helm_values_validate_against_the_chart_values_model(name: str) -> None:
    values = _values(name)
    HelmValues.model_validate(values)  # every key one the chart documents, with its type
    engine = values["servingEngineSpec"]
    probe = engine["startupProbe"]
    assert probe["failureThreshold"] * probe["periodSeconds"] >= shipped()[name].expect.ready_budget_s
    assert engine["strategy"] == {"type": "Recreate"}
    (model,) = engine["modelSpec"]
    assert model["replicaCount"] == 1
    assert "limitMemory" not in model  # DOMAIN §3
    env = {e["name"]: e["value"] for e in model["env"]}
    assert not set(env) & {"CUDA_VISIBLE_DEVICES", "VLLM_API_KEY"}
    # Seed 000 chapter 一 §8: HIP_VISIBLE_DEVICES always explicit — renumbered for the pod's own cards.
    recipe = shipped()[name]
    if recipe.platform.value == "gfx906":
        assert env["HIP_VISIBLE_DEVICES"] == ",".join(str(i) for i in range(recipe.workers))
    else:
        assert "HIP_VISIBLE_DEVICES" not in env


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
    # recipe memory model (calibrated on C's own run): 4 × (6.03 + 1.27) + 3.1 + 1.43 = 33.73 → 34Gi
    assert model["requestMemory"] == "34Gi"
    assert values["servingEngineSpec"]["vllmApiKey"] == {
        "secretName": "appliance-gfx906-c-tp4-graph-piecewise-engine-key", "secretKey": "VLLM_API_KEY"}


def test_what_the_chart_cannot_carry_is_said() -> None:
    recipe = shipped()["gfx906-b-tp4-eager"]
    text = k8s.PLUGIN.formats["helm-values"](render(recipe, fixed_facts()), recipe)
    assert "torch-first wrapper" in text and "/opt/dtk/env.sh" in text
    assert "[k8s-memlock]" in text


def test_split_image() -> None:
    assert split_image("z100-vllm:dtk2604-gfx906") == ("z100-vllm", "dtk2604-gfx906")
    assert split_image("reg:5000/a/b") == ("reg:5000/a/b", "latest")
    assert split_image("reg:5000/a/b:t@sha256:" + "0" * 64) == ("reg:5000/a/b", "t@sha256:" + "0" * 64)


def test_every_optional_chart_key_the_render_writes_is_in_the_model() -> None:
    """The keys shipped recipes do not use (tolerations, runtime class, pull secret, storage class, CPU
    request) validate too."""
    recipe = with_changes(
        shipped()[K8S_RECIPE],
        runtime__tolerations=[{"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        runtime__runtime_class="kata", runtime__image_pull_secret="regcred", runtime__cpu_request="12",
        runtime__model={"size": "100Gi", "storage_class": "fast-ssd"},
    )
    values = HelmValues.model_validate(_values_of(recipe))
    (model,) = values.servingEngineSpec.modelSpec
    assert (model.runtimeClassName, model.imagePullSecret, model.storageClass, model.requestCPU) == (
        "kata", "regcred", "fast-ssd", 12)
    assert model.tolerations is not None and model.tolerations[0].effect == "NoSchedule"


@pytest.mark.parametrize(("where", "key", "value"), [
    (("modelSpec", 0), "limitMemory", "32Gi"),  # a key the model does not name (DOMAIN §3: never a limit)
    (("modelSpec", 0, "vllmConfig"), "tensorParalelSize", 4),  # misspelt: the chart would ignore it
    (("modelSpec", 0), "requestCPU", "6"),  # the chart types it integer
    (("modelSpec", 0), "storageClass", None),  # null instead of omitted
    ((), "containerPort", 8000.5),
])
def test_the_values_model_refuses_what_the_chart_would_not_take(
        where: tuple[str | int, ...], key: str, value: Any) -> None:
    values = copy.deepcopy(_values(K8S_RECIPE))
    node: Any = values["servingEngineSpec"]
    for part in where:
        node = node[part]
    node[key] = value
    with pytest.raises(ValidationError, match=key):
        HelmValues.model_validate(values)
