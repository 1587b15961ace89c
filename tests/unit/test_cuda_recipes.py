"""The cuda-smollm2-* recipes: B / C / C′ at the GPU kit's scale, filled from MEASURED.md."""

from __future__ import annotations

import pytest

from appliance.recipe.lint import has_errors, lint
from appliance.recipe.render import render
from tests.unit.recipe_helpers import fixed_facts, shipped

CUDA = ("cuda-smollm2-graph", "cuda-smollm2-eager", "cuda-smollm2-piecewise")
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                 "NVSHMEM_DISABLE_NVLS": "1"}


@pytest.mark.parametrize("name", CUDA)
def test_renders_for_the_process_runtime_with_the_measured_environment(name: str) -> None:
    recipe = shipped()[name]
    assert not has_errors(lint(recipe))
    spec = render(recipe, fixed_facts())
    assert spec.kind == "process" and spec.platform == "cuda"
    assert spec.env["CUDA_VISIBLE_DEVICES"] == "0"
    assert spec.env["VLLM_USE_FLASHINFER_SAMPLER"] == "0"  # MEASURED.md: no flashinfer in the kit
    for k, v in MULTICAST_OFF.items():  # device KINDS.md: NVLink multicast stays off
        assert spec.env[k] == v
    assert spec.env["PYTHONPATH"].endswith("/engine/cuda/site")
    assert spec.argv[1:3] == ("-m", "vllm.entrypoints.openai.api_server")


def test_the_three_modes_differ_only_where_they_should() -> None:
    graph, eager, piece = (render(shipped()[n], fixed_facts()) for n in CUDA)
    assert "--enforce-eager" in eager.argv and "--enforce-eager" not in graph.argv
    i = piece.argv.index("--cudagraph-capture-sizes")
    assert piece.argv[i + 1:i + 5] == ("1", "2", "4", "8")
    assert "-cc.cudagraph_mode=PIECEWISE" in piece.argv
    assert len({graph.cache_root, eager.cache_root, piece.cache_root}) == 3  # one cache root each


def test_expectations_are_the_measured_ones() -> None:
    r = shipped()
    # MEASURED.md, "Upstream vLLM 0.26.0 on one H200": decode 2.3–2.6 / 6–10 / 17.5 ms per token.
    assert r["cuda-smollm2-graph"].expect.decode_ms_per_token == 2.6
    assert r["cuda-smollm2-piecewise"].expect.decode_ms_per_token == 10.0
    assert r["cuda-smollm2-eager"].expect.decode_ms_per_token == 17.5
    assert r["cuda-smollm2-graph"].expect.warm_restart and not r["cuda-smollm2-eager"].expect.warm_restart

