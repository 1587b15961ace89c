"""Each lint rule fires on the mistake it names and stays quiet on the shipped recipe it starts from."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from appliance.recipe.lint import RULE_IDS, Finding, has_errors, lint
from appliance.recipe.recipe_model import Recipe
from tests.unit.recipe_helpers import C_PRIME, SHIPPED, B, C, shipped, with_changes


def set_env(recipe: Recipe, **values: str | None) -> Recipe:
    """Set (or with None remove) env vars."""
    env = recipe.model_dump()["env"]["vars"]
    for name, value in values.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = {"value": value}
    return with_changes(recipe, env__vars=env)


def rules(recipe: Recipe) -> dict[str, Finding]:
    return {f.rule: f for f in lint(recipe)}


Case = tuple[str, str, Callable[[Recipe], Recipe], str]


def on_k8s(recipe: Recipe, **changes: object) -> Recipe:
    """The recipe run on a cluster (runtime kind kubernetes), with changes."""
    runtime = {"kind": "kubernetes", "image": "vllm/vllm-openai:v0.11.0"}
    return with_changes(recipe, runtime=runtime, **changes)


# (rule, start recipe, mistake, expected severity)
FIRES: list[Case] = [
    ("dtype-auto", C, lambda r: with_changes(r, engine__dtype="auto"), "error"),
    ("dtype-auto", "cuda-generic", lambda r: with_changes(r, engine__dtype="auto"), "warning"),
    ("dtype-auto", C, lambda r: with_changes(r, engine__extra_args=("--dtype", "auto")), "error"),
    ("dtype-bf16-gfx906", C, lambda r: with_changes(r, engine__dtype="bfloat16"), "error"),
    ("dtype-bf16-gfx906", C, lambda r: with_changes(r, engine__extra_args=("--dtype=bfloat16",)), "error"),
    ("debug-logging", C, lambda r: set_env(r, VLLM_LOGGING_LEVEL="DEBUG"), "error"),
    ("debug-logging", "cpu-smollm2", lambda r: set_env(r, VLLM_LOGGING_LEVEL="debug"), "error"),
    ("gpu-devices-unpinned", C, lambda r: with_changes(r, devices=None), "error"),
    ("gpu-devices-unpinned", "cuda-generic", lambda r: with_changes(r, devices=()), "error"),
    ("devices-fewer-than-tp", C, lambda r: with_changes(r, devices=(0, 1)), "error"),
    ("devices-in-env", C, lambda r: set_env(r, HIP_VISIBLE_DEVICES="0"), "warning"),
    ("cache-root-missing", C, lambda r: with_changes(r, cache__root=" "), "error"),
    ("cache-root-unstable", C, lambda r: with_changes(r, cache__root="/tmp/vllm"), "error"),
    ("cache-root-unstable", C, lambda r: with_changes(r, cache__root="cache"), "error"),
    ("cache-root-unstable", C, lambda r: with_changes(r, cache__root="${HOME}/cache"), "error"),
    ("cache-root-unstable", "cpu-smollm2", lambda r: set_env(r, VLLM_CACHE_ROOT="/var/cache/v"), "error"),
    ("cache-root-unstable", "cpu-smollm2", lambda r: set_env(r, TORCHINDUCTOR_CACHE_DIR="/x"), "error"),
    ("forbidden-env", C, lambda r: set_env(r, ROCBLAS_TENSILE_LIBPATH="/opt/dtk/lib/library"), "error"),
    ("forbidden-env", C, lambda r: set_env(r, NCCL_SHM_DISABLE="1"), "error"),
    ("forbidden-env", C, lambda r: set_env(r, VLLM_GFX906_TRITON_CAUSAL_CONV1D="1"), "error"),
    ("forbidden-env", C, lambda r: set_env(r, FLASH_ATTENTION_TRITON_AMD_ENABLE="True"), "error"),
    ("attention-backend-gfx906", C, lambda r: with_changes(r, engine__attention_backend="ROCM_ATTN"),
     "error"),
    ("attention-backend-gfx906", C,
     lambda r: with_changes(r, engine__extra_args=("--attention-backend=TRITON_ATTN",)), "error"),
    ("attention-backend-gfx906", C, lambda r: set_env(r, VLLM_ATTENTION_BACKEND="ROCM_ATTN"), "error"),
    ("custom-all-reduce-gfx906", C, lambda r: with_changes(r, engine__disable_custom_all_reduce=False),
     "warning"),
    ("loopback-bind-bridge", C, lambda r: with_changes(r, engine__host="127.0.0.1"), "error"),
    ("loopback-bind-bridge", "cuda-generic", lambda r: with_changes(r, engine__host="localhost"), "error"),
    ("default-full-graph-gfx906", C,
     lambda r: with_changes(r, engine__cudagraph_mode=None, engine__cudagraph_capture_sizes=None), "warning"),
    ("default-full-graph-gfx906", C,
     lambda r: with_changes(r, engine__cudagraph_mode="FULL_AND_PIECEWISE",
                            engine__cudagraph_capture_sizes=None, expect__ready_budget_s=3000), "warning"),
    ("ready-budget-default-graph", C_PRIME, lambda r: with_changes(r, expect__ready_budget_s=1500), "error"),
    ("pinned-memory-memlock", C, lambda r: with_changes(r, host__memlock_unlimited=False), "error"),
    ("pinned-memory-memlock", "cuda-generic", lambda r: with_changes(r, host__memlock_unlimited=False,
                                                                      engine__max_model_len=131072), "error"),
    ("no-torch-first-wrapper", C, lambda r: with_changes(r, env__torch_first_wrapper=False), "error"),
    ("gfx906-env", C, lambda r: set_env(r, PYTHONPATH=None), "error"),
    ("gfx906-env", C, lambda r: set_env(r, VLLM_WORKER_MULTIPROC_METHOD="fork"), "error"),
    ("gfx906-env", C, lambda r: set_env(r, VLLM_ROCM_USE_SKINNY_GEMM="1"), "error"),
    ("gfx906-env", C, lambda r: with_changes(r, env__source_files=("/opt/dtk/env.sh",)), "error"),
    ("graph-claims-bitwise", C, lambda r: with_changes(r, expect__reproducibility="bitwise"), "error"),
    ("eval-batch-not-fixed", C, lambda r: with_changes(r, engine__mode="eager", engine__cudagraph_mode=None,
                                                       engine__cudagraph_capture_sizes=None,
                                                       expect__reproducibility="bitwise"), "info"),
    ("cgroup-memory-limit-allowed", C, lambda r: with_changes(r, host__no_cgroup_memory_limit=False),
     "warning"),
    # production sets VLLM_DCU_USE_INT8_SDOT4=1 (DOMAIN §2); =0 is the rollback, never silent
    ("int8-sdot4-off", C, lambda r: set_env(r, VLLM_DCU_USE_INT8_SDOT4="0"), "warning"),
    ("int8-sdot4-off", B, lambda r: set_env(r, VLLM_DCU_USE_INT8_SDOT4="false"), "warning"),
    # the MemAvailable bar is "leave 2 GB" (S14c §3.12.1), 1.78 GiB was a miss
    ("mem-available-bar", C, lambda r: with_changes(r, expect__min_mem_available_gib=1.0), "warning"),
    ("mem-available-bar", B, lambda r: with_changes(r, expect__min_mem_available_gib=1.78), "warning"),
    ("mem-available-bar", B, lambda r: with_changes(r, expect__min_mem_available_gib=None), "warning"),
    # what a pod spec cannot express (appliance/runtimes/k8s/needs.py)
    ("k8s-memlock", "cpu-smollm2", lambda r: on_k8s(r, host__memlock_unlimited=True), "warning"),
    ("k8s-memory-limit", "cpu-smollm2", lambda r: on_k8s(r, host__no_cgroup_memory_limit=True), "warning"),
    ("k8s-swap", "cpu-smollm2", lambda r: on_k8s(r, host__swap_total_gib=8), "warning"),
    ("k8s-swappiness", "cpu-smollm2", lambda r: on_k8s(r, host__swappiness=200), "warning"),
    ("k8s-pcie-acs", "cpu-smollm2", lambda r: on_k8s(r, host__pcie_acs="disabled"), "warning"),
    ("k8s-boot-params", "cpu-smollm2", lambda r: on_k8s(r, host__boot_params=("iommu=pt",)), "warning"),
    ("k8s-kernel-module", "cpu-smollm2", lambda r: on_k8s(r, host__kernel_module="hydcu"), "warning"),
    ("k8s-devices-vs-tp", "cuda-generic", lambda r: on_k8s(r, devices=(0, 1)), "info"),
    # recipe B on a cluster: a pod has no device list, the plugin must hand it /dev/mkfd (seed 000 四 §2)
    ("k8s-dcu-mkfd", B, lambda r: on_k8s(r), "warning"),
    # The RCCL rows need NCCL_DEBUG=INFO (seed 000 一 §5): every shipped gfx906 TP recipe is told so;
    # here a one-card recipe moved to gfx906 at TP=2.
    ("rccl-rows-need-nccl-debug", "cuda-generic",
     lambda r: with_changes(r, platform="gfx906", engine__tensor_parallel_size=2, devices=(0, 1)), "info"),
    ("proof-undeclared", "cuda-smollm2-graph", lambda r: with_changes(r, expect__markers=()), "warning"),
    # issue 33: the mode line alone proves no kernel path
    ("proof-undeclared", "cuda-smollm2-graph",
     lambda r: with_changes(r, expect__markers=("enforce_eager=False",)), "warning"),
    # gfx906-base pins the seed's md5 (seed 000 S7c): drop the pin and the rule must fire.
    ("proof-libtorch-unpinned-gfx906", B, lambda r: with_changes(r, expect__checksums={}), "warning"),
]


@pytest.mark.parametrize(("rule", "start", "mistake", "severity"), FIRES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(FIRES)])
def test_rule_fires_on_its_mistake(rule: str, start: str, mistake: Callable[[Recipe], Recipe],
                                   severity: str) -> None:
    base = shipped()[start]
    assert rule not in rules(base), f"{rule} already fires on {start}"
    finding = rules(mistake(base)).get(rule)
    assert finding is not None, f"{rule} did not fire"
    assert finding.severity == severity
    assert finding.fact and finding.message and finding.field


def test_every_rule_is_exercised() -> None:
    assert {c[0] for c in FIRES} == set(RULE_IDS)


# Near misses: the condition next to the mistake must not fire.
QUIET: list[Case] = [
    ("custom-all-reduce-gfx906", C, lambda r: with_changes(r, engine__tensor_parallel_size=1, devices=(0,),
                                                           engine__disable_custom_all_reduce=False), ""),
    ("default-full-graph-gfx906", "gfx906-a-tp2-graph", lambda r: r, ""),  # TP=2: the 48 GiB fact is TP=4
    ("ready-budget-default-graph", C_PRIME, lambda r: r, ""),  # 2700 s is enough
    ("pinned-memory-memlock", "cpu-smollm2", lambda r: r, ""),  # no pinned UVA buffers on the CPU
    ("pinned-memory-memlock", C, lambda r: with_changes(r, host__memlock_unlimited=False,
                                                        engine__max_model_len=8192,
                                                        engine__max_num_seqs=8), ""),
    ("forbidden-env", C, lambda r: set_env(r, NCCL_SHM_DISABLE="0"), ""),
    ("eval-batch-not-fixed", B, lambda r: with_changes(r, engine__max_num_seqs=8), ""),
    ("graph-claims-bitwise", B, lambda r: r, ""),
    ("attention-backend-gfx906", "cuda-generic",
     lambda r: with_changes(r, engine__attention_backend="FLASHINFER"), ""),
    ("loopback-bind-bridge", "cpu-smollm2", lambda r: with_changes(r, engine__host="127.0.0.1"), ""),
    ("no-torch-first-wrapper", "cuda-generic", lambda r: r, ""),
    ("int8-sdot4-off", "cuda-generic", lambda r: set_env(r, VLLM_DCU_USE_INT8_SDOT4="0"), ""),
    ("mem-available-bar", "cpu-smollm2", lambda r: r, ""),  # the 2 GB bar is the 31 GiB gfx906 host's
    ("k8s-memlock", C, lambda r: r, ""),  # on the local Docker daemon, memlock is set at creation
    ("k8s-devices-vs-tp", "gfx906-b-tp4-eager-k8s", lambda r: r, ""),  # 4 devices, TP=4
    ("k8s-dcu-mkfd", "cuda-generic", lambda r: on_k8s(r), ""),  # NVIDIA: no mkfd
    ("rccl-rows-need-nccl-debug", B, lambda r: set_env(r, NCCL_DEBUG="INFO"), ""),
    ("rccl-rows-need-nccl-debug", B, lambda r: with_changes(r, engine__tensor_parallel_size=1, devices=(0,)),
     ""),  # one rank: no all-reduce
    ("proof-undeclared", "cpu-smollm2", lambda r: with_changes(r, expect__markers=()), ""),  # CPU: no GPU
    ("proof-libtorch-unpinned-gfx906", B, lambda r: with_changes(
        r, expect__checksums={"/src/vllm/_C_stable_libtorch.abi3.so": "a" * 32}), ""),
]


@pytest.mark.parametrize(("rule", "start", "change", "_"), QUIET,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(QUIET)])
def test_rule_stays_quiet_on_near_miss(rule: str, start: str, change: Callable[[Recipe], Recipe],
                                       _: str) -> None:
    assert rule not in rules(change(shipped()[start]))


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_recipes_have_no_lint_errors(name: str) -> None:
    findings = lint(shipped()[name])
    assert not has_errors(findings), [f.message for f in findings if f.severity == "error"]


def test_shipped_findings_are_the_expected_warnings() -> None:
    found = {n: sorted(f.rule for f in lint(shipped()[n])) for n in SHIPPED}
    rccl = "rccl-rows-need-nccl-debug"  # issue 33: the RCCL rows need NCCL_DEBUG=INFO, no recipe sets it
    assert found == {
        "cpu-smollm2": [], "cpu-smollm2-docker": [], "cpu-smollm2-eager": ["eval-batch-not-fixed"],
        "cuda-generic": ["proof-undeclared"],  # only enforce_eager=False: no path proof on record
        "gfx906-a-tp2-graph": [rccl],
        "cuda-smollm2-graph": [], "cuda-smollm2-eager": [], "cuda-smollm2-piecewise": [],
        B: ["eval-batch-not-fixed", rccl], C: [rccl], C_PRIME: ["default-full-graph-gfx906", rccl],
        "gfx906-fp8-tp4-eager": ["eval-batch-not-fixed", rccl],
        # recipe B on a cluster — what the node and namespace must provide
        "gfx906-b-tp4-eager-k8s": ["eval-batch-not-fixed", "k8s-boot-params", "k8s-dcu-mkfd",
                                   "k8s-kernel-module", "k8s-memlock", "k8s-memory-limit", "k8s-pcie-acs",
                                   rccl],
        # the tensor-parallel model's recipes: nothing to warn about (NVLink multicast off, devices = TP)
        "cpu-tp2": [],
        **{f"cuda-tp{tp}-{mode}{car}": [] for tp in (2, 4) for mode in ("eager", "graph", "piecewise")
           for car in ("", "-nocar")},
    }


def test_shipped_gfx906_recipes_keep_the_production_numbers() -> None:
    # DOMAIN §2: production sets VLLM_DCU_USE_INT8_SDOT4=1; DOMAIN §3: leave ≥ 2 GB MemAvailable.
    for recipe in shipped().values():
        if recipe.platform.value == "gfx906" and not recipe.abstract:
            assert recipe.env.vars["VLLM_DCU_USE_INT8_SDOT4"].value == "1", recipe.name
            assert (recipe.expect.min_mem_available_gib or 0) >= 2.0, recipe.name


def test_findings_are_sorted_errors_first() -> None:
    bad = with_changes(shipped()[C], host__no_cgroup_memory_limit=False, engine__dtype="auto")
    assert [f.severity for f in lint(bad)] == ["error", "warning", "info"]


def test_gfx906_recipes_pin_the_seeds_libtorch_md5() -> None:
    # Seed 000 S7c / chapter 一 §8: the fixed `_C_stable_libtorch` is md5 93bf7b4a…; every gfx906
    # recipe inherits the pin from gfx906-base, so a rolled-back library fails the proof at ready.
    for recipe in shipped().values():
        if recipe.platform.value == "gfx906" and not recipe.abstract:
            assert recipe.expect.checksums.get("/src/vllm/_C_stable_libtorch.abi3.so") == (
                "93bf7b4a391ac97e2f67cc7141633cb1"
            ), recipe.name
