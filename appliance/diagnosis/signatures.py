"""The diagnosis table: every known failure signature, as data. The file an author edits.

`SIGNATURES` is one table: DOMAIN §5's rows followed by the seed record's further signatures (MFMA-only
kernels, Triton target/API mismatches, torchvision and extension ABI mismatches, RCCL's NET/Socket
fallback, a client disconnect seen by the engine's own server). The table's order is the report order of
`scan_text` (appliance/diagnosis/scan.py); each row's `rank` (unique) orders co-occurring signatures when
`diagnose` (appliance/diagnosis/diagnose.py) picks one, and its `decides` says whether it can be THE
diagnosis at all (a failure, the fallback, a degradation, or a note).

Adding a signature: a `DiagnosisCode` and a `Signature` row here; the scan and the choice read the
table and need no change (unless the row's summary quotes the engine's own numbers: `diagnose.py`).

Pure: patterns and words only.
"""

from __future__ import annotations

import re
from dataclasses import KW_ONLY, dataclass
from enum import StrEnum

from appliance.recipe.lint import RCCL_DEBUG_ENV


class DiagnosisCode(StrEnum):
    GLOBAL_OOM = "global_oom"
    CGROUP_OOM = "cgroup_oom"
    NODE_CONSTRAINED_OOM = "node_constrained_oom"
    OOM_KILLED_UNATTRIBUTED = "oom_killed_unattributed"
    PINNED_MEMORY_OOM = "pinned_memory_oom"
    CUSTOM_ALLREDUCE_UNSUPPORTED = "custom_allreduce_unsupported"
    DEVICE_OOM = "device_oom"
    GRAPH_PAD_FOR_CUDAGRAPH_BUG = "graph_pad_for_cudagraph_bug"
    COMPILE_CONSTRAINT_VIOLATION = "compile_constraint_violation"
    IMPORT_ORDER_BAD_ALLOC = "import_order_bad_alloc"
    CUDA_REINIT_FORKED = "cuda_reinit_forked"
    PACKED_SILU_NAN = "packed_silu_nan"
    HYDCU_MODULE_MISSING = "hydcu_module_missing"
    MODULE_NOT_FOUND = "module_not_found"  # a broken engine image/venv
    ENGINE_CONFIG_INVALID = "engine_config_invalid"  # vLLM refused the configuration
    BIND_LOCALHOST_IN_BRIDGE = "bind_localhost_in_bridge"
    WORKER_DIED = "worker_died"
    ENGINE_START_FAILED = "engine_start_failed"
    AOT_CACHE_MISS = "aot_cache_miss"
    STALLED = "stalled"
    READY_BUDGET_EXCEEDED = "ready_budget_exceeded"
    KILLED_BY_SIGNAL = "killed_by_signal"
    EXIT_NONZERO = "exit_nonzero"
    # Seed-record signatures beyond DOMAIN §5's table (their rows follow §5's in SIGNATURES below).
    MFMA_ONLY_KERNEL = "mfma_only_kernel"
    TRITON_UNSUPPORTED_TARGET = "triton_unsupported_target"
    TRITON_API_MISMATCH = "triton_api_mismatch"
    TORCHVISION_ABI_MISMATCH = "torchvision_abi_mismatch"
    EXTENSION_ABI_MISMATCH = "extension_abi_mismatch"
    RCCL_NET_SOCKET = "rccl_net_socket"
    RCCL_IOMMU_PT_MISSING = "rccl_iommu_pt_missing"
    CLIENT_DISCONNECT = "client_disconnect"
    PORT_IN_USE = "port_in_use"  # the engine's port held by another process
    # The card itself: a fatal Xid (fallen off the bus, uncontained ECC, GSP), an amdgpu reset or
    # uncorrectable RAS error on one of the engine's cards (appliance/observe/gpu_events.py).
    GPU_FAULT = "gpu_fault"
    # The engine's own fault as the driver saw it on the card: Xid 13/31/43, an amdgpu VM page fault.
    GPU_ENGINE_FAULT = "gpu_engine_fault"
    # The model folder is missing or not a Hugging Face folder: vLLM/transformers took the path for a
    # hub repo id and huggingface_hub's validate_repo_id refused it.
    MODEL_PATH_INVALID = "model_path_invalid"
    # vLLM's CPU worker: the requested KV cache does not fit the memory left on the NUMA node.
    KV_CACHE_TOO_LARGE = "kv_cache_too_large"
    # vLLM's GPU worker: the card has less free memory than gpu_memory_utilization × its total.
    GPU_MEMORY_SHORT = "gpu_memory_short"
    # The skinny-GEMM op wvSplitKQ is not built on gfx906 (no MFMA): FP8 per-tensor/per-channel path.
    SKINNY_GEMM_NOT_BUILT = "skinny_gemm_not_built"
    # hipExtMallocWithFlags(Uncached) fails on gfx906 whatever the size: no uncached memory pool.
    UNCACHED_MEMORY_UNSUPPORTED = "uncached_memory_unsupported"
    # The runtime reports why the engine never ran (an unschedulable pod, an image that cannot
    # be pulled) — there is no exit code and often no log line to read.
    RUNTIME_CANNOT_RUN = "runtime_cannot_run"
    # The process runtime's shim (the engine's parent, which records how it ended) was killed;
    # the engine went down with it (parent-death signal) and the runtime said so in its own words.
    SHIM_KILLED = "shim_killed"
    # Informational lines (never a failure).
    LOOPBACK_BIND = "loopback_bind"
    W8A8_BLOCK_FP8_DEFAULT_CONFIG = "w8a8_block_fp8_default_config"
    ROCBLASLT_NO_PATHS = "rocblaslt_no_paths"
    UNKNOWN = "unknown"


class Severity(StrEnum):
    INFO = "info"  # expected or informational: nothing to do
    WARNING = "warning"  # degraded (e.g. every start is cold) but not a crash
    ERROR = "error"  # a failure


_RANK = {Severity.INFO: 0, Severity.WARNING: 1, Severity.ERROR: 2}


def severity_at_least(severity: Severity, floor: Severity) -> bool:
    return _RANK[severity] >= _RANK[floor]


EXPECTED_ON_Z100 = "expected on Z100, ignore"


class Decides(StrEnum):
    """What a signature found in a failed start's log decides (`diagnose`)."""

    FAILURE = "failure"  # THE diagnosis when found: the found FAILURE row of lowest rank wins
    FALLBACK = "fallback"  # the engine's own "failed to start": only when nothing more specific explains it
    DEGRADED = "degraded"  # nothing failed but the engine runs degraded: lowest rank wins
    NOTE = "note"  # never THE diagnosis by itself: reported as a finding (benign or informational)


@dataclass(frozen=True)
class Signature:
    """One row of DOMAIN §5: what the text looks like, what it means, what to do."""

    code: DiagnosisCode
    severity: Severity
    patterns: tuple[re.Pattern[str], ...]  # any of these on one line triggers
    summary: str
    hint: str
    fact: str
    retryable: bool
    benign: bool = False
    # When set, one of these must occur within CONTEXT_LINES of the trigger (a traceback's frames).
    needs_context: tuple[re.Pattern[str], ...] = ()
    # When one of these occurs within CONTEXT_LINES, the trigger belongs to a more specific signature.
    unless_context: tuple[re.Pattern[str], ...] = ()
    # When one of these occurs on any EARLIER line, the trigger is past the phase the row is about
    # (a `std::bad_alloc` after the weights loaded is not the import-order crash).
    only_before: tuple[re.Pattern[str], ...] = ()
    # (variable, value) the engine's environment must have for the row's text to be printed at all
    # (RCCL's transport lines need NCCL_DEBUG=INFO): without it the row is blind, not clear.
    needs_env: tuple[tuple[str, str], ...] = ()
    _: KW_ONLY
    # Required on every row: the priority among co-occurring signatures (lower decides first; unique
    # across the table) and what the row can decide.
    rank: int
    decides: Decides


CONTEXT_LINES = 60  # a Python traceback through vLLM's worker is 20–50 frames


def _rx(*patterns: str, flags: int = 0) -> tuple[re.Pattern[str], ...]:
    return tuple(re.compile(p, flags) for p in patterns)


# HIP's assert wording, and CUDA/torch's. Not "to enable device-side assertions": torch prints that
# advice under every HIP error, OOMs included.
DEVICE_ASSERT = (r"Device-side assertion `[^`]*' failed", r"device-side assert triggered")
MFMA_STUBS = (r"wvSplitK", r"\bLLMM1\b", r"paged_attention", r"ROCM_ATTN", r"skinny_gemm",
              r"UNREACHABLE_CODE", r"_rocm_C\b")
# The server side of an HTTP connection in the engine's own log: a client went away mid-response.
SERVER_SIDE = (r"stream_generator", r"StreamingResponse", r"starlette", r"\banyio\b", r"ASGI",
               r"h11_impl", r"httptools_impl", r"uvicorn[/.]protocols", r"\bsend_bytes\b")
_HIP_OOM = _rx(r"hipErrorOutOfMemory", r"(?:HIP|CUDA) error: out of memory")
_PINNED_CONTEXT = _rx(r"buffer_utils\.py", r"UvaBuffer", r"pin_memory=True", r"StagedWriteTensor")
_EXTMALLOC = _rx(r"hipExtMallocWithFlags")
# Custom all-reduce's allocation, in each wording the seed record and PyTorch give it (DOMAIN §5,
# seed 000 S13 §3.1.1): hipExtMallocWithFlags(…Uncached) in csrc/custom_all_reduce.cu, reached from
# custom_all_reduce.py's create_shared_buffer → ops.allocate_shared_buffer_and_handle, whose OOM torch
# reports as `RuntimeError: HIP error: out of memory`; vLLM's CUDACHECK prints `Failed: Cuda error
# <file>:<line> 'out of memory'` and exits.
# Traceback frames only: vLLM logs `[custom_all_reduce.py:NN] Custom allreduce is disabled …` at every
# start, and a VRAM OOM near that line is still a VRAM OOM.
_CUSTOM_AR_CONTEXT = _EXTMALLOC + _rx(r"allocate_shared_buffer_and_handle", r"create_shared_buffer",
                                      r"custom_all_reduce\.cuh?\b", r"custom_all_reduce\.py\", line",
                                      r"\bCustomAllreduce\(")
_CUSTOM_AR_FAILED = _rx(r"Failed: (?:Cuda|HIP) error \S*custom_all_reduce\.cuh?:\d+ '(?:out of memory|"
                        r"hipErrorOutOfMemory)'")
# A client that went away, seen by the engine's own HTTP server: not the host-side reset of §2.
_SERVER_SIDE = _rx(*SERVER_SIDE, r"ConnectionResetError", r"BrokenPipeError")
_LOOPBACK_BIND = _rx(
    r"(?:Uvicorn running on|Starting vLLM (?:API )?server(?: \d+)? on) https?://(?:127\.0\.0\.1|localhost)\b"
)

# Lines that prove the start got past import into weight loading (vLLM's loader and model runner).
_WEIGHTS_STARTED = _rx(r"Loading weights took", r"Model loading took",
                       r"Loading (?:safetensors|pt) checkpoint shards",
                       r"Starting to load model")

_GLOBAL_OOM_HINT = (
    "host RAM + swap are exhausted — this is not a cgroup limit. Add swap (recipe C: +4 GiB swapfile) and "
    "set vm.swappiness=200, warm the AOT compile cache then restart, or use eager / a smaller TP"
)
_GLOBAL_OOM_FACT = (
    "DOMAIN §3 / S14 §3.3.1: the TP=4 graph OOMs were global (constraint=CONSTRAINT_NONE … global_oom): "
    "anonymous demand ≈ 34–35 GB (victim anon-rss 6.76 GiB) ≥ MemTotal 31.26 + swap 4.0 GiB; the kill "
    "lands ~5 s after `Available KV cache memory`, at the start of the second graph-capture pass. "
    "S14c: swappiness 60→200 raised the margin 0.29→2.71 GiB at zero decode cost"
)
_CGROUP_OOM_HINT = (
    "the container's memory limit was hit (cgroup v2 counts page cache: mmapped weights count). Recreate "
    "the container WITHOUT a memory limit — `docker update --memory=0` means 'unchanged', not 'unlimited'"
)
_CGROUP_OOM_FACT = (
    "DOMAIN §3: 29 GB of mmapped weights + 4 workers hit a 32 GiB limit (memory.events oom_kill 2); "
    "production containers have MemLimit=0"
)

SIGNATURES: tuple[Signature, ...] = (
    Signature(
        DiagnosisCode.GLOBAL_OOM, Severity.ERROR,
        _rx(r"oom-kill:.*constraint=CONSTRAINT_NONE", r"oom-kill:.*\bglobal_oom\b",
            r"(?<![Cc]group )\bOut of memory: Kill(?:ed)? process"),
        "the kernel's global OOM killer killed a process: host RAM + swap exhausted",
        _GLOBAL_OOM_HINT, _GLOBAL_OOM_FACT, retryable=False,
        rank=10, decides=Decides.FAILURE,
    ),
    Signature(
        DiagnosisCode.CGROUP_OOM, Severity.ERROR,
        _rx(r"oom-kill:.*constraint=CONSTRAINT_MEMCG", r"Memory cgroup out of memory",
            r"killed as a result of limit of"),
        "the memory cgroup OOM killer killed a process: a container memory limit was hit",
        _CGROUP_OOM_HINT, _CGROUP_OOM_FACT, retryable=False,
        rank=20, decides=Decides.FAILURE,
    ),
    Signature(
        DiagnosisCode.PINNED_MEMORY_OOM, Severity.ERROR, _HIP_OOM,
        "pinned host memory could not be allocated (memlock ulimit) — not a VRAM problem",
        "create the container with `--ulimit memlock=-1`, or lower --max-model-len; a retry often succeeds",
        "DOMAIN §3 / S11f §10.1: each worker pins a StagedWriteTensor of max_num_reqs × max_model_len × 4 B "
        "(GB scale at maxlen 262144); the container default `ulimit -l` is 64 MB and cannot be raised inside",
        retryable=True, needs_context=_PINNED_CONTEXT,
        rank=30, decides=Decides.FAILURE,
    ),
    Signature(
        DiagnosisCode.CUSTOM_ALLREDUCE_UNSUPPORTED, Severity.ERROR, _HIP_OOM + _CUSTOM_AR_FAILED,
        "custom all-reduce tried to allocate uncached device memory (hipExtMallocWithFlags) and failed",
        "keep --disable-custom-all-reduce: custom all-reduce is unsupported on gfx906 (the 'out of memory' "
        "is the missing uncached pool, not VRAM)",
        "DOMAIN §2/§5: custom all-reduce is doubly blocked on gfx906 (platform gate + uncached "
        "hipExtMallocWithFlags fails even for 4 KB on an idle card); removing the flag gains nothing",
        retryable=False, needs_context=_CUSTOM_AR_CONTEXT,
        rank=40, decides=Decides.FAILURE,
    ),
    Signature(
        DiagnosisCode.GRAPH_PAD_FOR_CUDAGRAPH_BUG, Severity.ERROR,
        _rx(r"has no attribute 'pad_for_cudagraph'"),
        "FULL graph capture hit the GDN `pad_for_cudagraph` bug of an unpatched build",
        "use -cc.cudagraph_mode=PIECEWISE or the patched image",
        "S09 §3.10.1 / S09b: default FULL_AND_PIECEWISE raised AttributeError 'VllmConfig' object has no "
        "attribute 'pad_for_cudagraph' during FULL capture; fixed in gdn_attn.py (m.num_actual_tokens)",
        retryable=False,
        rank=50, decides=Decides.FAILURE,
    ),
    Signature(
        DiagnosisCode.COMPILE_CONSTRAINT_VIOLATION, Severity.ERROR, _rx(r"ConstraintViolationError"),
        "torch.compile failed a dynamic-shape guard (ConstraintViolationError)",
        "known fork issue (custom-op / dynamic-shape guard), two known cases. The bare sdot4 op "
        "(_rocm_C.w8a8_sdot4_gemm with VLLM_DCU_USE_INT8_SDOT4=1): roll the INT8 kernel back with "
        "VLLM_DCU_USE_INT8_SDOT4=0 (the Triton path, same tree; decode 3.8–3.9× slower), or run eager "
        "(--enforce-eager), or use the patched build (sdot4 as a torch.library custom_op). Raised in "
        "profile_run → _dummy_run instead (inputs_embeds/positions specialised to 2048 against "
        "mark_dynamic, seen with -cc.cudagraph_mode=NONE): a deterministic defect of the vLLM tree that the "
        "sdot4 switch does not touch — keep graphs on (the production mode) or run eager; the fix is a "
        "change to vllm/ itself",
        "S11k: with VLLM_DCU_USE_INT8_SDOT4=1 the bare _rocm_C.w8a8_sdot4_gemm call made Dynamo add "
        "Eq(dim, hint) on the symbolic token dim → ConstraintViolationError within 150 s, `=0` ran; fixed "
        "by a custom_op with the M branch in an opaque body (0 graph breaks). Seed 000 rollback path: "
        "`VLLM_DCU_USE_INT8_SDOT4=0` returns to the Triton kernel. Seed 000 open items (S11e, its compile "
        "section): with cudagraph_mode=NONE, profile_run → _dummy_run raised it on two card pairs — a "
        "tree defect",
        retryable=False,
        rank=60, decides=Decides.FAILURE,
    ),
    Signature(
        DiagnosisCode.IMPORT_ORDER_BAD_ALLOC, Severity.ERROR, _rx(r"std::bad_alloc"),
        "std::bad_alloc at start-up, before any weights loaded: vllm was imported before torch",
        "launch through the torch-first wrapper: python -c 'import torch; from vllm.entrypoints.cli.main "
        "import main; main()' serve <model>",
        "DOMAIN §2 / S05: importing vllm before torch → std::bad_alloc, SIGABRT (exit 134) right at import; "
        "a bad_alloc once the weights are loading or loaded is some other allocation failure",
        retryable=False, only_before=_WEIGHTS_STARTED,
        rank=70, decides=Decides.FAILURE,
    ),
    Signature(
        DiagnosisCode.CUDA_REINIT_FORKED, Severity.ERROR,
        _rx(r"Cannot re-initialize (?:CUDA|HIP) in forked subprocess"),
        "a worker was forked after the parent touched the GPU runtime",
        "set VLLM_WORKER_MULTIPROC_METHOD=spawn",
        "DOMAIN §2 'must export': VLLM_WORKER_MULTIPROC_METHOD=spawn",
        retryable=False,
        rank=80, decides=Decides.FAILURE,
    ),
    Signature(
        DiagnosisCode.PACKED_SILU_NAN, Severity.ERROR,
        _rx(r"(?:\block\b[\s'\",]*){8,}", r"\blogits?\b.*\bNaN\b|\bNaN\b.*\blogits?\b"),
        "NaN logits / degenerate `lock lock lock…` output in eager mode",
        "an old _C_stable_libtorch with the packed-SiLU bug is installed: never roll that library back",
        "DOMAIN §5 / S7b–S7c: the fp16 packed-SiLU branch produced NaN and 'lock'×16; fixed in csrc",
        retryable=False,
        rank=90, decides=Decides.FAILURE,
    ),
    Signature(
        DiagnosisCode.DEVICE_OOM, Severity.ERROR,
        _rx(r"torch\.OutOfMemoryError", r"(?:HIP|CUDA) out of memory", r"hipErrorOutOfMemory",
            r"(?:HIP|CUDA) error: out of memory", r"No available memory for the cache blocks"),
        "GPU memory (VRAM) exhausted",
        "lower --gpu-memory-utilization, --max-model-len or --max-num-seqs, or raise TP; a single Z100 "
        "cannot hold 27B W8A8",
        "DOMAIN §3: 28.51 GiB of weights on a 31.98 GiB card does not fit",
        retryable=False, unless_context=_PINNED_CONTEXT + _CUSTOM_AR_CONTEXT,
        rank=180, decides=Decides.FAILURE,
    ),
    Signature(
        DiagnosisCode.HYDCU_MODULE_MISSING, Severity.ERROR,
        _rx(r"Module hydcu not found", r"\bhydcu\b.*(?:not found|No such file)"),
        "the running kernel has no hydcu module: the host has no GPU",
        "boot the pinned kernel (5.15.0-191) and keep GRUB pinned (GRUB_DEFAULT=\"1>2\")",
        "DOMAIN §1: 5.15.0-194 has no hydcu driver module; rebooting into it leaves the host with no GPU",
        retryable=False,
        rank=100, decides=Decides.FAILURE,
    ),
    Signature(
        DiagnosisCode.BIND_LOCALHOST_IN_BRIDGE, Severity.ERROR, _rx(r"[Cc]onnection reset by peer"),
        "connection reset by peer: the engine is bound to 127.0.0.1 behind docker's port mapping",
        "start the engine with --host 0.0.0.0 inside a bridge-network container",
        "DOMAIN §2: bound to 127.0.0.1 the in-container curl works but the host gets 'connection reset by "
        "peer'",
        # The engine's own server writing to a client that left (client_disconnect) is not this.
        retryable=False, unless_context=_SERVER_SIDE,
        rank=190, decides=Decides.FAILURE,
    ),
    Signature(
        DiagnosisCode.WORKER_DIED, Severity.ERROR,
        _rx(r"Worker proc \S+ died unexpectedly", r"A worker died"),
        "an engine worker process died unexpectedly",
        "with no kernel OOM record at hand and no Python error before the death, read "
        "`dmesg | grep -E 'oom-kill|Killed process'` (or pass the "
        "dmesg text to `appliance doctor` too): a global OOM leaves exactly this in the engine log",
        "DOMAIN §3: the TP=4 graph global OOM lands ~5 s after `Available KV cache memory: 16.99 GiB`, at "
        "the start of the second graph-capture pass",
        retryable=True,
        rank=200, decides=Decides.FAILURE,
    ),
    # Seen on the H200 (gpu-kit): `No module named 'flashinfer'` when the engine core started. A missing
    # module is the same on every retry: the image or venv is broken, so this stops instead of backing off.
    Signature(
        DiagnosisCode.MODULE_NOT_FOUND, Severity.ERROR,
        _rx(r"ModuleNotFoundError: No module named '[^']+'"),
        "a Python module the engine needs is not installed: the engine image/venv is broken",
        "install the module into the engine's environment (or turn off the feature that imports it: "
        "VLLM_USE_FLASHINFER_SAMPLER=0 for flashinfer); retrying cannot help",
        "MEASURED.md (H200): `No module named 'flashinfer'` from the V2 model runner's sampler without "
        "flashinfer; gpu-kit: `No module named 'llguidance'` at api_server import",
        retryable=False,
        rank=160, decides=Decides.FAILURE,
    ),
    # Seen on 2 × H200 (TP=2 with SmolLM2-135M): "Value error, Total number of attention heads (9)
    # must be divisible by tensor parallel size (2)" — vLLM's config validation, the same on every retry.
    Signature(
        DiagnosisCode.ENGINE_CONFIG_INVALID, Severity.ERROR,
        _rx(r"validation errors? for VllmConfig",
            r"Value error, .*must be divisible by tensor parallel size"),
        "vLLM refused the engine configuration (recipe vs model): retrying cannot help",
        "read the `Value error, …` line: change the recipe (tensor_parallel_size must divide the model's "
        "attention heads; max_model_len within the model's) or pick another model",
        "docs/gpu-h200.md: TP=2 with SmolLM2-135M (9 attention heads) was retried 4 times with backoff "
        "before this signature existed",
        retryable=False,
        rank=170, decides=Decides.FAILURE,
    ),
    Signature(
        DiagnosisCode.ENGINE_START_FAILED, Severity.ERROR,
        _rx(r"EngineCore failed to start", r"Engine core initialization failed",
            r"Engine process failed to start"),
        "the engine core reported a failed start (its root cause is above that line)",
        "read the traceback above the first matching line; report the signature if it recurs",
        "DOMAIN §5: unknown signatures are retried with backoff, then stopped as failed",
        retryable=True,
        rank=300, decides=Decides.FALLBACK,
    ),
    Signature(
        DiagnosisCode.AOT_CACHE_MISS, Severity.WARNING,
        _rx(r"Source code has changed since the last compilation",
            r"Compiling model again due to a load failure", r"Cannot load aot compilation from path"),
        "the AOT compile cache missed: this start compiled again (cold)",
        "check VLLM_CACHE_ROOT (fixed, on a volume, one per recipe variant), VLLM_LOGGING_LEVEL (never "
        "DEBUG), the image and compilation_config; VLLM_FORCE_AOT_LOAD=1 turns a silent miss into an error",
        "DOMAIN §4 / S11m: a real bug made every start a miss until fixed; a warm restart must be proven by "
        "`Directly load AOT compilation from path …` (recipe C: ready 352 s cold → 230 s warm)",
        retryable=True,
        rank=400, decides=Decides.DEGRADED,
    ),
    Signature(
        DiagnosisCode.LOOPBACK_BIND, Severity.INFO, _LOOPBACK_BIND,
        "the engine listens on loopback only",
        "fine for the process runtime; inside a bridge-network container use --host 0.0.0.0",
        "DOMAIN §2: --host 0.0.0.0 inside a bridge-network container",
        retryable=True,
        rank=500, decides=Decides.NOTE,
    ),
    Signature(
        # Not benign: the seed ties this line to the Triton block-FP8 fallback,
        # 1984.8 ms/token — unusable — unless the fork's FP8 emulation kernels are on.
        DiagnosisCode.W8A8_BLOCK_FP8_DEFAULT_CONFIG, Severity.WARNING,
        _rx(r"Using default W8A8 Block FP8 kernel config"),
        "vLLM has no tuned block-FP8 kernel config for this GPU: on Z100 that is the Triton fallback "
        "kernel unless the FP8 emulation took effect",
        "check that VLLM_DCU_USE_FP8_EMU=1 reached the engine (`appliance launches ID`: env) and that "
        "decode is ≈ 123 ms/token, not ≈ 2 s",
        "DOMAIN §5 / S11f §9.4: the fallback kernel decoded at 1984.8 ms/token, the emulation kernels "
        "(VLLM_DCU_USE_FP8_EMU=1, default off in the fork) at 123.0", retryable=True,
        rank=510, decides=Decides.NOTE,
    ),
    Signature(
        DiagnosisCode.ROCBLASLT_NO_PATHS, Severity.INFO, _rx(r"rocblaslt warning: No paths matched"),
        "hipBLASLt has no gfx906 code and falls back to rocBLAS", EXPECTED_ON_Z100,
        "DOMAIN §5: hipBLASLt has no gfx906 code; the rocBLAS fallback is what runs", retryable=True,
        benign=True,
        rank=520, decides=Decides.NOTE,
    ),
    # An engine orphaned by a killed shim kept the port; every relaunch died
    # with this line while the orphan answered the probes.
    Signature(
        DiagnosisCode.PORT_IN_USE, Severity.ERROR,
        _rx(r"[Aa]ddress already in use", r"\bEADDRINUSE\b"),
        "the engine could not bind its port: another process holds it (an engine left from an earlier "
        "launch?)",
        "find the holder (`ss -ltnp 'sport = :PORT'`) and stop it by PID — the controller refuses to "
        "launch while the port is taken and names the holder when it can — or give the recipe another "
        "engine.port",
        "a vLLM server orphaned by a killed shim held port 8000; each relaunch failed with "
        "`Address already in use`",
        retryable=True,
        rank=210, decides=Decides.FAILURE,
    ),
    # A model path that is not a model folder: transformers/vLLM fall back to treating it as a hub repo
    # id and huggingface_hub's validate_repo_id refuses it (an OSError or its own HFValidationError).
    Signature(
        DiagnosisCode.MODEL_PATH_INVALID, Severity.ERROR,
        _rx(r"Repo id must be in the form 'repo_name' or 'namespace/repo_name'",
            r"Repo id must use alphanumeric chars"),
        "the model path is not a model folder: vLLM took it for a Hugging Face repo id",
        "the model folder is missing or is not a Hugging Face folder (no config.json): vLLM took the path "
        "for a hub repo id. The appliance never downloads models — check the recipe's model.path (the path "
        "inside the engine) and model.host_path (the folder mounted there) and that config.json is in it",
        "huggingface_hub's validate_repo_id: `Repo id must be in the form 'repo_name' or "
        "'namespace/repo_name': '<path>'. Use `repo_type` argument if needed.` — raised when a local path "
        "does not exist, so the error names a repo id instead of the missing folder",
        retryable=False,
        rank=174, decides=Decides.FAILURE,
    ),
    # vLLM's CPU worker checks the KV cache against the NUMA node's free memory before allocating it.
    Signature(
        DiagnosisCode.KV_CACHE_TOO_LARGE, Severity.ERROR,
        _rx(r"on kv cache allocation is less than requested memory for kv"),
        "the requested KV cache does not fit the memory left on the node (vLLM refused to allocate it)",
        "lower the KV cache (--kv-cache-memory-bytes / VLLM_CPU_KVCACHE_SPACE, or the recipe's memory "
        "fraction), free memory on that node, or pin the engine to a node with more; retrying cannot help",
        "vLLM's CPU worker: `Available memory on node N (free/total GiB) on kv cache allocation is less than "
        "requested memory for kv (X GiB)` — a configuration/host-size refusal, the same on every retry",
        retryable=False,
        rank=172, decides=Decides.FAILURE,
    ),
    # vLLM's GPU worker checks `gpu_memory_utilization × total` against the card's free memory when it
    # starts (vllm/v1/worker/utils.py `request_memory`), before the weights load.
    Signature(
        DiagnosisCode.GPU_MEMORY_SHORT, Severity.ERROR,
        _rx(r"Free memory on device\b[^(\n]*\([\d.]+/[\d.]+ GiB\) on startup is less than "
            r"(?:desired GPU memory utilization|the engine's budget)"),
        "the card has less free memory than the recipe's gpu_memory_utilization asks for (vLLM refused to "
        "start)",
        "lower engine.gpu_memory_utilization, or stop what else holds the card (`nvidia-smi` lists its "
        "processes: an engine left from an earlier launch?); `appliance plan NAME` checks each card before "
        "the running engine is stopped; retrying cannot help while the card stays that full",
        "vLLM's GPU worker: `Free memory on device (F/T GiB) on startup is less than desired GPU memory "
        "utilization (U, R GiB). Decrease GPU memory utilization or reduce GPU memory used by other "
        "processes.` — a configuration/occupancy refusal, the same on every retry",
        retryable=False,
        rank=173, decides=Decides.FAILURE,
    ),
    # The seed record's further signatures (seed 000 = the Z100 adaptation record, "S<step> §n" as it
    # cites itself); wordings are the tools' own.
    # The fault is the trigger and the assertion (or a stub's name) its context: a device-side assert
    # alone is an ordinary kernel bug on other GPUs (the generic CUDA recipe), not an MFMA stub.
    Signature(
        DiagnosisCode.MFMA_ONLY_KERNEL, Severity.ERROR,
        _rx(r"HSA_STATUS_ERROR_EXCEPTION", r"Memory access fault by GPU", r"GPU memory access fault",
            r"\bVM fault\b"),
        "a kernel that exists only as an MFMA stub ran on gfx906: device-side assertion, then an HSA "
        "exception / GPU memory access fault",
        "do not force --attention-backend (ROCM_ATTN / _rocm_C::paged_attention is an MFMA-only stub; the "
        "automatic choice is TRITON_ATTN) and keep VLLM_ROCM_USE_SKINNY_GEMM=0 (wvSplitK* / LLMM1 are "
        "MFMA-only)",
        "seed 000, S8 §3.3 / S5 §3.6: csrc/rocm/attention.cu degrades to UNREACHABLE_CODE on gfx906 and a "
        "real call gives a device-side assertion + VM fault; wvSplitK's switch(N_in) implements 1..5 only",
        retryable=False, needs_context=_rx(*DEVICE_ASSERT, *MFMA_STUBS),
        rank=110, decides=Decides.FAILURE,
    ),
    Signature(
        DiagnosisCode.TRITON_UNSUPPORTED_TARGET, Severity.ERROR,
        _rx(r"error: unsupported target: '?gfx\w+", r"[Uu]nsupported target:? '?gfx9\d\d"),
        "Triton does not know this GPU target (unsupported target: 'gfx906')",
        "prepend the gfx906-patched Triton to PYTHONPATH (the common base: "
        "PYTHONPATH=/src:/mnt/game/triton-gfx906/install; S06: self-built triton 3.6.0 with the VEGA ISA "
        "family, DTK hipDeviceProp_t and compiler.py patches) — never pip-install it over the DTK's "
        "Triton — then clear TRITON_CACHE_DIR",
        "seed 000, S5 / S06 §2.1–§3.6: 14 Triton tests failed with `unsupported target` on the stock "
        "wheel; the patched triton 3.6.0 (5 files, 48 lines) removed all 14",
        retryable=False,
        rank=120, decides=Decides.FAILURE,
    ),
    Signature(
        DiagnosisCode.TRITON_API_MISMATCH, Severity.ERROR,
        _rx(r"incompatible function arguments", r"add_convert_to_buffer_ops",
            r"module 'triton[\w.]*' has no attribute", r"cannot import name '\w+' from 'triton[\w.]*'",
         r"No module named 'triton\.[\w.]+'"),
        "Triton's Python layer and its native library (or vLLM and Triton) disagree on an API",
        "the Triton Python package must match libtriton.so and the vLLM build: for the 3.6 wheel's "
        "add_convert_to_buffer_ops (Python 5 args, native 4) set AMDGCN_USE_BUFFER_OPS=0, or prepend the "
        "self-built patched Triton to PYTHONPATH (never pip-install it over the DTK's Triton); never mix "
        "DTK wheels with community wheels",
        "seed 000, S4b §5.2 / S6 §3.3: amd.passes.ttgpuir.add_convert_to_buffer_ops is 5-argument in "
        "Python and 4-argument in libtriton.so ⇒ immediate crash",
        # Triton's own frames or modules, not the word: vLLM logs "Using Triton Attention backend".
        retryable=False, needs_context=_rx(r"\btriton[/.]", r"libtriton", r"ttgpuir"),
        rank=130, decides=Decides.FAILURE,
    ),
    Signature(
        DiagnosisCode.TORCHVISION_ABI_MISMATCH, Severity.ERROR,
        _rx(r"operator torchvision::\w+ does not exist"),
        "torchvision was built for another torch (operator torchvision::nms does not exist)",
        "use an image whose torchvision matches its torch (torchvision 0.26.0 for torch 2.11: the "
        "z100-s9 / z100-eager containers); vLLM imports it through _aiter_ops → transformers → torchvision",
        "seed 000, S6 §5.3 / S11e §5-3: torchvision 0.25.0 built for torch 2.10 under torch 2.11 ⇒ `import "
        "torchvision` raises RuntimeError: operator torchvision::nms does not exist",
        retryable=False,
        rank=140, decides=Decides.FAILURE,
    ),
    Signature(
        DiagnosisCode.EXTENSION_ABI_MISMATCH, Severity.ERROR, _rx(r"undefined symbol: \S+"),
        "a compiled extension was built against another torch/ROCm than the one installed (undefined "
        "symbol)",
        "run the engine with the torch its _C / _rocm_C / _C_stable_libtorch were built for (the target "
        "stack torch 2.11.0+das), or rebuild the extensions in this image",
        "seed 000, S11a §5-3 / S5 §5.1: extensions built for torch 2.11 in an image with torch 2.10 fail "
        "with `undefined symbol`",
        retryable=False, needs_context=_rx(r"\.so\b", r"ImportError", r"OSError"),
        rank=150, decides=Decides.FAILURE,
    ),
    Signature(
        DiagnosisCode.SKINNY_GEMM_NOT_BUILT, Severity.ERROR,
        _rx(r"has no attribute 'wvSplitKQ'", r"wvSplitKQ \(skinny GEMM\) is not built"),
        "the FP8 skinny-GEMM kernel wvSplitKQ is not built on gfx906 (no MFMA): an FP8 per-tensor / "
        "per-channel path reached it",
        "FP8 per-tensor / per-channel W8A8 is not supported on gfx906 (ROCmFP8ScaledMMLinearKernel refuses "
        "it; rocm_per_tensor_float_w8a8_scaled_mm_impl calls wvSplitKQ for M≤4 unguarded): serve the "
        "block-scaled FP8 checkpoint with VLLM_DCU_USE_FP8_EMU=1 (the FP8 slot) or the W8A8 INT8 model; "
        "never register that path as a custom op",
        "seed 000 residual-risk table (S8, its FP8 scaled-mm section): \"wvSplitKQ (skinny GEMM) is not "
        "built on gfx906 (no MFMA)\" — "
        "a loud AttributeError rather than silently wrong numbers; forced through, S5's device assert",
        retryable=False,
        rank=125, decides=Decides.FAILURE,
    ),
    Signature(
        DiagnosisCode.UNCACHED_MEMORY_UNSUPPORTED, Severity.INFO,
        _rx(r"\bUncached\(0x3\)\s*rc=\d+\s+out of memory"),
        "uncached device memory (hipExtMallocWithFlags Uncached 0x3) is unavailable on gfx906 — no "
        "uncached pool, not a VRAM shortage; why RCCL never uses P2P and custom all-reduce cannot work "
        "here (keep --disable-custom-all-reduce, NCCL_SHM_DISABLE unset)",
        EXPECTED_ON_Z100,
        "seed 000, S11f §10 / S13 §3.1.1: a ctypes probe of hipExtMallocWithFlags gave Default(0x0) rc=0 and "
        "Uncached(0x3) rc=2 out of memory (4 KB too; Finegrained/UncachedXdp likewise), with or without "
        "iommu=pt",
        retryable=True, benign=True,
        rank=535, decides=Decides.NOTE,
    ),
    Signature(
        DiagnosisCode.RCCL_NET_SOCKET, Severity.WARNING, _rx(r"\bvia NET/Socket"),
        "RCCL fell back to NET/Socket for the tensor-parallel all-reduce (7.3× slower than SHM)",
        "unset NCCL_SHM_DISABLE: SHM is the only fast transport on this host (RCCL never uses P2P here); "
        "none of the ten P2P switch combinations helps",
        "seed 000, S11f §10: NCCL_SHM_DISABLE=1 did not buy P2P, it fell to `via NET/Socket` (1 MiB "
        "all-reduce 2247 → 16371 µs); SHM 0.70–0.72 GB/s is the measured best",
        retryable=True, needs_env=(RCCL_DEBUG_ENV,),
        rank=410, decides=Decides.DEGRADED,
    ),
    Signature(
        DiagnosisCode.RCCL_IOMMU_PT_MISSING, Severity.INFO, _rx(r"Missing \"?iommu=pt\"?"),
        "RCCL warns that the kernel command line lacks iommu=pt",
        "the reference host boots with iommu=pt (kept: RCCL says it can be unstable without); it changes "
        "no speed — add it to GRUB when convenient",
        "seed 000, S11f §10: iommu=pt was added and kept; Uncached allocation and RCCL P2P stayed "
        "unavailable and latency stayed within noise",
        retryable=True, benign=True, needs_env=(RCCL_DEBUG_ENV,),
        rank=530, decides=Decides.NOTE,
    ),
    Signature(
        DiagnosisCode.CLIENT_DISCONNECT, Severity.INFO,
        _rx(r"ConnectionResetError", r"[Cc]onnection reset by peer", r"BrokenPipeError", r"ClientDisconnect"),
        "a client closed its connection mid-response (seen from the engine's own server side)",
        "nothing to do for the engine: the client went away (timeout, cancel, a gateway retry)",
        "DOMAIN §2: `connection reset by peer` is a bridge-network bind problem only when the HOST's client "
        "sees it; inside the engine's stream generator it is a client disconnect",
        retryable=True, benign=True, needs_context=_rx(*SERVER_SIDE),
        rank=540, decides=Decides.NOTE,
    ),
    # Kernel-log rows (saved dmesg for `doctor`; a live failure gets the structured events, `_from_gpu`).
    # Fatal Xids of NVIDIA's catalogue (appliance/observe/gpu_events.XID_TABLE) and amdgpu's reset /
    # uncorrectable RAS lines (drivers/gpu/drm/amd/amdgpu: amdgpu_device.c, amdgpu_ras.c).
    Signature(
        DiagnosisCode.GPU_FAULT, Severity.ERROR,
        _rx(r"NVRM: Xid \([^)]*\): (?:48|61|62|64|74|79|95|119|120)\b", r"NVRM: .*fallen off the bus",
            r"(?:amdgpu|hydcu) \S+: (?:amdgpu: )?GPU reset begin!",
            r"\d+ uncorrectable hardware errors detected in"),
        "the GPU itself failed (a fatal Xid, a card reset or an uncorrectable memory error): not an "
        "engine bug",
        "reset the card (nvidia-smi -r, or reboot), drain the node if it recurs, check cooling and power; "
        "do not relaunch on that card before it is reset",
        "NVIDIA Xid catalogue (docs.nvidia.com/deploy/xid-errors): 79 fallen off the bus, 48/95 "
        "uncorrectable ECC, 119/120 GSP — resolution RESET_GPU or drain; amdgpu: a reset loses every "
        "context on the card",
        retryable=False,
        rank=25, decides=Decides.FAILURE,
    ),
    Signature(
        DiagnosisCode.GPU_ENGINE_FAULT, Severity.ERROR,
        _rx(r"NVRM: Xid \([^)]*\): (?:13|31|43)\b", r"(?:amdgpu|hydcu) \S+: (?:amdgpu: )?\[\w+\] "
            r"(?:retry |no-retry )?page fault"),
        "the engine faulted on the GPU (illegal address / graphics exception): the application's fault, "
        "the card is healthy",
        "an engine/kernel bug: read the engine's CUDA/HIP error above its death; retried with backoff",
        "NVIDIA Xid catalogue: 13 graphics engine exception, 31 MMU fault, 43 GPU stopped processing — "
        "user application faults, immediate action RESTART_APP (43: IGNORE, the GPU stays healthy)",
        retryable=True,
        rank=27, decides=Decides.FAILURE,
    ),
)


def blind_rows(env: dict[str, str]) -> tuple[DiagnosisCode, ...]:
    """The rows that cannot fire for an engine started with `env`: the variable they need is unset
    or has another value (case-insensitive, as RCCL reads NCCL_DEBUG)."""
    return tuple(
        sig.code for sig in SIGNATURES
        if any(env.get(name, "").upper() != value.upper() for name, value in sig.needs_env)
    )
