"""Lint a recipe against the domain's known failure modes: `lint(recipe) -> list[Finding]`. Pure.

Each rule encodes one measured incident (DOMAIN.md, cited in `fact`). Errors are things that break
a start, waste a warm cache or silently change output; warnings are legitimate choices with a cost
the operator should see; info is policy worth remembering. Shipped recipes lint without errors.
"""

from __future__ import annotations

from collections.abc import Callable

from appliance.host_facts import MIB
from appliance.observe.launch_proof import proves_path
from appliance.recipe.recipe_model import GraphMode, Platform, Recipe, Reproducibility
from appliance.recipe_terms import Finding as Finding  # re-exported: defined in a leaf for the plug-ins
from appliance.recipe_terms import Severity as Severity
from appliance.runtimes import registry as runtime_registry

_ORDER = {"error": 0, "warning": 1, "info": 2}
GPU_PLATFORMS = (Platform.GFX906, Platform.CUDA)
# S11f §10.1: the container's default `ulimit -l` (hard limit the same, cannot be raised inside).
DEFAULT_MEMLOCK_BYTES = 64 * MIB
# vLLM's default max_num_seqs on cards under 70 GiB when the recipe leaves it unset.
VLLM_DEFAULT_MAX_NUM_SEQS = 256
DEFAULT_GRAPH_BUDGET_S = 2700
# DOMAIN §3 / S14c §3.12.1: the bar was to leave ≥ 2 GB MemAvailable at the worst moment ("不挂 swap
# 也留 2 GB"); recipe C met it with 2.35 GiB, the best run without the extra swapfile reached 1.78 GiB
# and was counted a miss. Read as GiB (the stricter reading of "2 GB").
MEM_AVAILABLE_BAR_GIB = 2.0


def lint(recipe: Recipe) -> list[Finding]:
    found = [f for rule in _RULES for f in rule(recipe)]
    return sorted(found, key=lambda f: (_ORDER[f.severity], f.rule, f.field))


def has_errors(findings: list[Finding]) -> bool:
    return any(f.severity == "error" for f in findings)


def pinned_bytes_per_worker(recipe: Recipe) -> int | None:
    """S11f §10.1: each worker pins a StagedWriteTensor of max_num_reqs × max_model_len × 4 B."""
    if recipe.memory is not None and recipe.memory.pinned_bytes_per_worker is not None:
        return recipe.memory.pinned_bytes_per_worker
    if recipe.platform not in GPU_PLATFORMS or recipe.engine.max_model_len is None:
        return None
    seqs = recipe.engine.max_num_seqs or VLLM_DEFAULT_MAX_NUM_SEQS
    return seqs * recipe.engine.max_model_len * 4


def is_default_graph(recipe: Recipe) -> bool:
    """Graph mode with vLLM's default FULL_AND_PIECEWISE and its default capture sizes (51+2)."""
    e = recipe.engine
    return e.mode is GraphMode.GRAPH and e.cudagraph_mode in (None, "FULL_AND_PIECEWISE") \
        and e.cudagraph_capture_sizes is None


def _env(recipe: Recipe, name: str) -> str | None:
    var = recipe.env.vars.get(name)
    return var.value if var is not None else None


Rule = Callable[[Recipe], list[Finding]]


def _dtype_auto(r: Recipe) -> list[Finding]:
    if r.engine.dtype != "auto" and "auto" not in _flag_values(r, "--dtype"):
        return []
    sev: Severity = "error" if r.platform is Platform.GFX906 else "warning"
    return [Finding(rule="dtype-auto", severity=sev, field="engine.dtype",
                    message="dtype is 'auto': pin float16 (or the dtype you validated)",
                    fact="DOMAIN §2: the bf16 probe flips between runs, and bf16 prints garbage on the "
                         "27B model")]


def _bf16_gfx906(r: Recipe) -> list[Finding]:
    """The seed's hard rule on gfx906 is float16, always: the Z100 has no bf16 instructions and bf16
    prints garbage on the 27B model (DOMAIN §1, §2). Lint used to accept it."""
    if r.platform is not Platform.GFX906:
        return []
    values = {r.engine.dtype, *_flag_values(r, "--dtype")}
    if not values & {"bfloat16", "bf16"}:
        return []
    return [Finding(rule="dtype-bf16-gfx906", severity="error", field="engine.dtype",
                    message="dtype bfloat16 on gfx906: use float16",
                    fact="DOMAIN §1/§2: gfx906 has no bf16 instructions; bf16 prints garbage on the "
                         "27B model")]


def _debug_logging(r: Recipe) -> list[Finding]:
    if (_env(r, "VLLM_LOGGING_LEVEL") or "").upper() != "DEBUG":
        return []
    return [Finding(rule="debug-logging", severity="error", field="env.vars.VLLM_LOGGING_LEVEL",
                    message="VLLM_LOGGING_LEVEL=DEBUG: use INFO",
                    fact="DOMAIN §2/§4: DEBUG turns on inductor asserts and changes the AOT cache key "
                         "(a new variant and a cold compile)")]


def _devices(r: Recipe) -> list[Finding]:
    if r.platform not in GPU_PLATFORMS:
        return []
    if not r.devices:
        return [Finding(rule="gpu-devices-unpinned", severity="error", field="devices",
                        message="no devices listed: HIP_/CUDA_VISIBLE_DEVICES would be unset",
                        fact="DOMAIN §2: HIP_VISIBLE_DEVICES always explicit — unset = grab all 4 cards")]
    out = []
    if len(r.devices) < r.engine.tensor_parallel_size:
        out.append(Finding(rule="devices-fewer-than-tp", severity="error", field="devices",
                           message=f"{len(r.devices)} devices listed for tensor_parallel_size "
                                   f"{r.engine.tensor_parallel_size}",
                           fact="one tensor-parallel worker per visible card"))
    for name in ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):
        if name in r.env.vars:
            out.append(Finding(rule="devices-in-env", severity="warning", field=f"env.vars.{name}",
                               message=f"{name} is set in env; render derives it from `devices` and "
                                       f"overrides this value — list the cards in `devices`",
                               fact="DOMAIN §2: the visible devices must be explicit and in one place"))
    return out


def _cache_root(r: Recipe) -> list[Finding]:
    root = r.cache.root.strip()
    if not root:
        return [Finding(rule="cache-root-missing", severity="error", field="cache.root",
                        message="no compile-cache root",
                        fact="S8 §5.4: without a fixed VLLM_CACHE_ROOT every start compiles a new "
                             "vintage (the token stream is a lottery) and 2.1 GB land in the container "
                             "layer")]
    out = []
    leftover = root.replace("${APPLIANCE_HOME}", "")
    if not root.startswith(("/", "${APPLIANCE_HOME}")) or root.startswith("/tmp") or "$" in leftover:
        out.append(Finding(rule="cache-root-unstable", severity="error", field="cache.root",
                           message=f"cache root {root!r} is not a fixed absolute path on a volume "
                                   f"(relative, under /tmp, or an unknown placeholder)",
                           fact="S11m: one stable cache root per recipe variant; a moving root is a cold "
                                "compile and a new vintage every start"))
    for name in ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR"):
        if name in r.env.vars:
            out.append(Finding(rule="cache-root-unstable", severity="error", field=f"env.vars.{name}",
                               message=f"{name} is set by hand; it would be shared by every variant "
                                       f"(render overrides it with the per-variant root — set cache.root)",
                               fact="S11m / MEASURED.md: each variant its own cache root, inductor's "
                                    "cache included (AOT off keeps the artifacts there)"))
    return out


# name → (bad value or None for "any value", fact)
_FORBIDDEN = {
    "ROCBLAS_TENSILE_LIBPATH": (None, "S03: exporting ROCBLAS_TENSILE_LIBPATH crashes any GEMM"),
    "NCCL_SHM_DISABLE": ("1", "DOMAIN §2: falls back to sockets, 7.3× slower all-reduce"),
    "VLLM_GFX906_TRITON_CAUSAL_CONV1D": ("1", "S15: quality regression — 4/4 starts fell into endless "
                                              "thinking"),
    "FLASH_ATTENTION_TRITON_AMD_ENABLE": ("TRUE", "DOMAIN §2: never set on gfx906 (no MFMA)"),
}


def _forbidden_env(r: Recipe) -> list[Finding]:
    out = []
    for name, (bad, fact) in _FORBIDDEN.items():
        value = _env(r, name)
        if value is not None and (bad is None or value.strip().upper() == bad):
            out.append(Finding(rule="forbidden-env", severity="error", field=f"env.vars.{name}",
                               message=f"{name}={value} must not be set", fact=fact))
    return out


def _attention_backend(r: Recipe) -> list[Finding]:
    if r.platform is not Platform.GFX906:
        return []
    if r.engine.attention_backend is None and not _flag_values(r, "--attention-backend") \
            and _env(r, "VLLM_ATTENTION_BACKEND") is None:
        return []
    return [Finding(rule="attention-backend-gfx906", severity="error", field="engine.attention_backend",
                    message="an explicit attention backend on gfx906: let the fork select its Triton path",
                    fact="S05: ROCm paged attention is an MFMA-only stub that asserts on device")]


def _custom_all_reduce(r: Recipe) -> list[Finding]:
    if r.platform is not Platform.GFX906 or r.engine.disable_custom_all_reduce \
            or r.engine.tensor_parallel_size < 2:
        return []
    return [Finding(rule="custom-all-reduce-gfx906", severity="warning",
                    field="engine.disable_custom_all_reduce",
                    message="custom all-reduce left enabled on gfx906: set disable_custom_all_reduce: true",
                    fact="S13: doubly blocked on gfx906 (hipExtMallocWithFlags uncached → "
                         "hipErrorOutOfMemory); stating it is harmless")]


def _runtime_rules(r: Recipe) -> list[Finding]:
    """Findings only the recipe's runtime kind can make (its plug-in's `lint`, e.g. loopback-bind-bridge)."""
    return runtime_registry.for_recipe(r).lint(r)


def _default_full_graph(r: Recipe) -> list[Finding]:
    if r.platform is not Platform.GFX906 or not is_default_graph(r) or r.engine.tensor_parallel_size < 4:
        return []
    return [Finding(rule="default-full-graph-gfx906", severity="warning", field="engine.cudagraph_mode",
                    message="default FULL_AND_PIECEWISE graph (51+2 capture sizes) at TP≥4: needs ≥ 48 GiB "
                            "RAM or 16 GiB swap; admission decides on the actual host",
                    fact="S14c: ready 1645 s, min MemAvailable 66 MiB with 16 GiB swap, only 4.3% faster "
                         "than PIECEWISE with sizes 1 2 4 8")]


def _graph_budget(r: Recipe) -> list[Finding]:
    if r.platform is not Platform.GFX906 or not is_default_graph(r) \
            or r.expect.ready_budget_s >= DEFAULT_GRAPH_BUDGET_S:
        return []
    return [Finding(rule="ready-budget-default-graph", severity="error", field="expect.ready_budget_s",
                    message=f"ready budget {r.expect.ready_budget_s} s for the default graph mode: "
                            f"use ≥ {DEFAULT_GRAPH_BUDGET_S} s",
                    fact="DOMAIN §4: default graph is ready after 1542–1583 s; a 1500 s wait killed the "
                         "engine at 38/51 of capture round 2")]


def _pinned_memlock(r: Recipe) -> list[Finding]:
    pinned = pinned_bytes_per_worker(r)
    if pinned is None or pinned <= DEFAULT_MEMLOCK_BYTES or r.host.memlock_unlimited:
        return []
    return [Finding(rule="pinned-memory-memlock", severity="error", field="host.memlock_unlimited",
                    message=f"each worker pins ≈{pinned / MIB:.0f} MiB (max_num_seqs × max_model_len × 4 B) "
                            f"but memlock is not unlimited (default {DEFAULT_MEMLOCK_BYTES // MIB} MiB): set "
                            f"host.memlock_unlimited: true or lower max_model_len",
                    fact="S11f §10.1: hipErrorOutOfMemory from UvaBuffer / pin_memory=True during "
                         "load_model() — not a VRAM problem")]


def _torch_first(r: Recipe) -> list[Finding]:
    if r.platform is not Platform.GFX906 or r.env.torch_first_wrapper:
        return []
    return [Finding(rule="no-torch-first-wrapper", severity="error", field="env.torch_first_wrapper",
                    message="vllm would be imported before torch: set env.torch_first_wrapper: true",
                    fact="S04: importing vllm before torch → std::bad_alloc, SIGABRT 134 at import")]


# DOMAIN §2 "must export — missing one causes trouble": name → required value (None = any value).
_GFX906_REQUIRED = {
    "PYTHONPATH": None, "VLLM_WORKER_MULTIPROC_METHOD": "spawn", "TOKENIZERS_PARALLELISM": None,
    "PYTORCH_HIP_ALLOC_CONF": None, "PYTHONUNBUFFERED": None, "VLLM_LOGGING_LEVEL": None,
    "VLLM_ROCM_USE_SKINNY_GEMM": "0", "VLLM_DCU_USE_INT8_SDOT4": None,
}
_GFX906_SOURCES = ("/opt/dtk/env.sh", "/src/tools/dcu/env.sh")


def _gfx906_env(r: Recipe) -> list[Finding]:
    if r.platform is not Platform.GFX906:
        return []
    out = []
    for name, wanted in _GFX906_REQUIRED.items():
        value = _env(r, name)
        if value is None or (wanted is not None and value != wanted):
            got = "missing" if value is None else f"is {value!r}"
            out.append(Finding(rule="gfx906-env", severity="error", field=f"env.vars.{name}",
                               message=f"{name} {got}" + (f"; set it to {wanted!r}" if wanted else ""),
                               fact="DOMAIN §2 / seed 000 chapter 一 §8: the must-export environment — "
                                    "missing one causes trouble"))
    for path in _GFX906_SOURCES:
        if path not in r.env.source_files:
            out.append(Finding(rule="gfx906-env", severity="error", field="env.source_files",
                               message=f"{path} is not sourced before start",
                               fact="DOMAIN §2: `. /opt/dtk/env.sh` and `. /src/tools/dcu/env.sh` first"))
    return out


def _int8_sdot4_off(r: Recipe) -> list[Finding]:
    """A warning, not an error: =0 is the seed's own rollback when the sdot4 custom op trips a
    `ConstraintViolationError` in torch.compile (S11k, DOMAIN §5), and lint errors refuse a launch —
    an operator must still be able to roll back. It is never silent, though: production sets =1."""
    value = _env(r, "VLLM_DCU_USE_INT8_SDOT4")
    if r.platform is not Platform.GFX906 or value is None or value.strip() == "1":
        return []
    return [Finding(rule="int8-sdot4-off", severity="warning", field="env.vars.VLLM_DCU_USE_INT8_SDOT4",
                    message=f"VLLM_DCU_USE_INT8_SDOT4={value}: the INT8 GEMMs fall back to the Triton path, "
                            f"decode ≈3.9× slower than production (=1); keep =0 only as the rollback for a "
                            f"ConstraintViolationError in torch.compile, and expect different greedy output",
                    fact="DOMAIN §2 / S11k, S11l: the fork's default is OFF for numerical caution; "
                         "production sets =1 explicitly (decode 3.82–3.91×)")]


# RCCL prints its transport lines (`via SHM`, `via NET/Socket`) and its `Missing "iommu=pt"` warning
# only with NCCL_DEBUG=INFO (seed 000 一 §5: "`NCCL_DEBUG=INFO` 证明 RCCL 只用 SHM"). The diagnosis rows
# built on those lines (appliance/diagnosis/signatures.py, `needs_env`) are blind without it.
RCCL_DEBUG_ENV = ("NCCL_DEBUG", "INFO")


def _rccl_debug(r: Recipe) -> list[Finding]:
    """Decision: the recipes leave NCCL_DEBUG alone (it is not the production launch, and
    INFO writes every channel of every rank at each start); the rows say they need it and lint says,
    for every gfx906 recipe with more than one rank, that they cannot fire as it stands."""
    name, wanted = RCCL_DEBUG_ENV
    value = _env(r, name)
    if r.platform is not Platform.GFX906 or r.workers < 2 or (value or "").upper() == wanted:
        return []
    return [Finding(rule="rccl-rows-need-nccl-debug", severity="info", field=f"env.vars.{name}",
                    message=f"{name} is {'unset' if value is None else repr(value)}: RCCL prints no "
                            "transport lines, so the diagnosis rows `via NET/Socket` (rccl_net_socket) "
                            f"and `Missing \"iommu=pt\"` (rccl_iommu_pt_missing) cannot fire; set "
                            f"{name}={wanted} for the first launch of this recipe on a host to see its "
                            "transport",
                    fact="seed 000 chapter 一 §5 / S11f §10: `NCCL_DEBUG=INFO` is how the record proved "
                         "56/56 channels SHM and saw NCCL_SHM_DISABLE=1 fall to `via NET/Socket`")]


def _mem_available_bar(r: Recipe) -> list[Finding]:
    if r.platform is not Platform.GFX906 or r.abstract:
        return []
    bar = r.expect.min_mem_available_gib
    if bar is not None and bar >= MEM_AVAILABLE_BAR_GIB:
        return []
    got = "not set" if bar is None else f"{bar} GiB"
    return [Finding(rule="mem-available-bar", severity="warning", field="expect.min_mem_available_gib",
                    message=f"min MemAvailable bar is {got}: the production bar is ≥ "
                            f"{MEM_AVAILABLE_BAR_GIB} GiB at the worst moment",
                    fact="DOMAIN §3 / S14c §3.12.1: leave ≥ 2 GB MemAvailable; recipe C met it with 2.35 "
                         "GiB, 1.78 GiB with swap 100% full was counted a miss")]


def _reproducibility(r: Recipe) -> list[Finding]:
    out = []
    bitwise = r.expect.reproducibility is Reproducibility.BITWISE
    if bitwise and r.engine.mode is GraphMode.GRAPH and r.platform in GPU_PLATFORMS:
        out.append(Finding(rule="graph-claims-bitwise", severity="error", field="expect.reproducibility",
                           message="a graph recipe cannot promise bitwise output: use "
                                   "varies-across-restarts, or eager for quality work",
                           fact="S14b/S14d: graph output varies across restarts (12/12 prompts differ); "
                                "only eager is bitwise"))
    if bitwise and r.engine.max_num_seqs is None:
        out.append(Finding(rule="eval-batch-not-fixed", severity="info", field="engine.max_num_seqs",
                           message="bitwise output holds only for a fixed batch composition: evaluations "
                                   "must fix and record --max-num-seqs and concurrency",
                           fact="S14d: even eager diverged at token 6 between conc=2 and serial"))
    return out


def _cgroup_limit(r: Recipe) -> list[Finding]:
    if r.host.no_cgroup_memory_limit:
        return []
    return [Finding(rule="cgroup-memory-limit-allowed", severity="warning",
                    field="host.no_cgroup_memory_limit",
                    message="the recipe tolerates a cgroup memory limit",
                    fact="DOMAIN §3: cgroup v2 counts page cache — 29 GB of mmapped weights + 4 workers "
                         "hit a 32 GiB limit (memory.events oom_kill 2)")]


def _proof(r: Recipe) -> list[Finding]:
    """A production (GPU) recipe should say what proves its path ran, and a gfx906 one should pin
    `_C_stable_libtorch`, whose rollback brings back the packed-SiLU NaN bug."""
    if r.abstract or r.platform not in GPU_PLATFORMS:
        return []
    out = []
    if not any(proves_path(m) for m in r.expect.markers):
        mode = [m for m in r.expect.markers if not proves_path(m)]
        out.append(Finding(rule="proof-undeclared", severity="warning", field="expect.markers",
                           message=("only the mode " + ", ".join(repr(m) for m in mode) if mode
                                    else "no markers") + ": `appliance compare` cannot prove this "
                                   "recipe's kernel path ran and will not accept it as a candidate "
                                   "(declare its attention backend, graph mode, all-reduce or '… "
                                   "selected.' log line)",
                           fact="DOMAIN §7 (seed 004 §5.2): a log line proves the path was taken; the "
                                "deployment is checked file by file"))
    if r.platform is Platform.GFX906 and not any("_C_stable_libtorch" in p for p in r.expect.checksums):
        out.append(Finding(rule="proof-libtorch-unpinned-gfx906", severity="warning",
                           field="expect.checksums",
                           message="`_C_stable_libtorch` is not pinned by a checksum (md5 or sha256): a "
                                   "rollback to the packed-SiLU build would pass unnoticed",
                           fact="DOMAIN §5 (S7b/S7c): NaN logits / `lock lock lock` come from the old "
                                "_C_stable_libtorch; never roll that library back"))
    return out


def _flag_values(r: Recipe, flag: str) -> list[str]:
    args = list(r.engine.extra_args)
    values = [args[i + 1] for i, a in enumerate(args[:-1]) if a == flag]
    return values + [a.split("=", 1)[1] for a in args if a.startswith(flag + "=")]


_RULES: tuple[Rule, ...] = (
    _dtype_auto, _bf16_gfx906, _debug_logging, _devices, _cache_root, _forbidden_env, _attention_backend,
    _custom_all_reduce, _runtime_rules, _default_full_graph, _graph_budget, _pinned_memlock,
    _torch_first, _gfx906_env, _int8_sdot4_off, _mem_available_bar, _reproducibility, _cgroup_limit,
    _proof, _rccl_debug,
)
RULE_IDS = (
    "dtype-auto", "dtype-bf16-gfx906", "debug-logging", "gpu-devices-unpinned", "devices-fewer-than-tp",
    "devices-in-env",
    "cache-root-missing", "cache-root-unstable", "forbidden-env", "attention-backend-gfx906",
    "custom-all-reduce-gfx906", "default-full-graph-gfx906",
    "ready-budget-default-graph", "pinned-memory-memlock", "no-torch-first-wrapper", "gfx906-env",
    "graph-claims-bitwise", "eval-batch-not-fixed", "cgroup-memory-limit-allowed", "int8-sdot4-off",
    "mem-available-bar", "proof-undeclared", "proof-libtorch-unpinned-gfx906", "rccl-rows-need-nccl-debug",
    *runtime_registry.lint_rule_ids(),
)
