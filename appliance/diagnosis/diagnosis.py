"""Why did the engine fail? The operators' rules of thumb (DOMAIN §5) as pure functions.

`SIGNATURES` is one table: DOMAIN §5's rows followed by the seed record's further signatures (MFMA-only
kernels, Triton target/API mismatches, torchvision and extension ABI mismatches, RCCL's NET/Socket
fallback, a client disconnect seen by the engine's own server). The table's order is the report order of
`scan_text`; each row's `rank` (unique) orders co-occurring signatures when `diagnose` picks one, and its
`decides` says whether it can be THE diagnosis at all (a failure, the fallback, a degradation, or a note).

Two entry points:

- `scan_text(text)` finds every known signature in a saved engine log or `dmesg`/kmsg text —
  failures, degradations (a compile-cache miss) and the benign lines that alarm newcomers
  (``Using default W8A8 Block FP8 kernel config``, ``rocblaslt warning: No paths matched``:
  expected on Z100, ignore).
- `diagnose(facts)` picks THE diagnosis of one failed start from everything the supervisor knows:
  exit code, signal, docker's OOMKilled flag, the log tail, kernel OOM records, the phase reached and
  whether the start stalled or ran over its budget. `retryable` maps the diagnosis to policy: a
  pinned-memory OOM "often succeeds on retry" (S11f §10.1) so the supervisor backs off and relaunches;
  a configuration bug is not, so it stops as FATAL instead of crash-looping through a 27-minute start.

Pure: no files, no clocks, no processes. Kernel OOM kills come in as `appliance.observe.kmsg.OomEvent`s
(the supervisor's kmsg watch, already attributed to the engine by `appliance.observe.oom_attribution`) and are
phrased by `oom_attribution.diagnose_oom`, so an OOM reads the same in the watch and here;
`oom_events_in_text` finds them in saved dmesg/kmsg/journal text for `doctor`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import KW_ONLY, dataclass
from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from appliance.observe.gpu_events import FaultSide, GpuAction, GpuEvent, GpuEventKind, gpu_events_in_text
from appliance.observe.kmsg import OomAssembler, OomEvent, OomEventKind, OomScope
from appliance.observe.log_phases import PHASE_LABELS, PROGRESS_ORDER, Phase
from appliance.observe.oom_attribution import diagnose_oom
from appliance.observe.rank_logs import deaths_in


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
    # Seed-record signatures beyond DOMAIN §5's table (rows in appliance/diagnosis/diagnosis_seed.py).
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
        retryable=True,
        rank=410, decides=Decides.DEGRADED,
    ),
    Signature(
        DiagnosisCode.RCCL_IOMMU_PT_MISSING, Severity.INFO, _rx(r"Missing \"?iommu=pt\"?"),
        "RCCL warns that the kernel command line lacks iommu=pt",
        "the reference host boots with iommu=pt (kept: RCCL says it can be unstable without); it changes "
        "no speed — add it to GRUB when convenient",
        "seed 000, S11f §10: iommu=pt was added and kept; Uncached allocation and RCCL P2P stayed "
        "unavailable and latency stayed within noise",
        retryable=True, benign=True,
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

_BY_CODE: dict[DiagnosisCode, Signature] = {s.code: s for s in SIGNATURES}


class Finding(BaseModel):
    """One signature found in a text: how often, where first, and what to do."""

    model_config = ConfigDict(frozen=True)

    code: DiagnosisCode
    severity: Severity
    benign: bool
    count: int
    first_line_no: int  # 1-based
    evidence: tuple[str, ...]  # up to three matching lines, "N: text"
    summary: str
    hint: str
    fact: str
    retryable: bool


class Diagnosis(BaseModel):
    model_config = ConfigDict(frozen=True)

    code: DiagnosisCode
    severity: Severity
    summary: str
    hint: str
    evidence: tuple[str, ...]
    retryable: bool
    fact: str
    findings: tuple[Finding, ...] = ()  # everything recognised in the log tail, benign lines included


# --- kernel OOM records ---------------------------------------------------------------------------

# Kernel lines come as /dev/kmsg records ("6,466,234772597,-;msg"), `dmesg` ("[  234.772597] msg"),
# `dmesg -T` ("[Sat Nov 29 07:13:00 2026] msg") or the journal ("Nov 29 07:13:00 host kernel: msg").
_KMSG_PREFIX = re.compile(r"^\d+,\d+,\d+,[^;]*;")
_DMESG_PREFIX = re.compile(r"^\s*(?:<\d+>)?\[[^\]]*\]\s?")
_JOURNAL_PREFIX = re.compile(r"^\w{3} +\d+ [\d:]+ \S+ kernel: ")


def kernel_message(line: str) -> str:
    """The kernel's message text of one saved kernel-log line, whatever tool saved it."""
    for prefix in (_KMSG_PREFIX, _DMESG_PREFIX, _JOURNAL_PREFIX):
        m = prefix.match(line)
        if m is not None:
            return line[m.end():]
    return line


def oom_events_in_text(lines: Iterable[str]) -> list[OomEvent]:
    """Kernel OOM kills in saved dmesg/kmsg/journal text (appliance.observe.kmsg does the parsing)."""
    assembler = OomAssembler()
    events: list[OomEvent] = []
    for line in lines:
        events.extend(assembler.feed_message(kernel_message(line.rstrip("\r\n"))))
    events.extend(assembler.flush())
    return [e for e in events if e.kind is OomEventKind.KILL]


def gpu_events_in_kernel_text(lines: Iterable[str]) -> list[GpuEvent]:
    """GPU kernel events (Xid, amdgpu resets …) in saved dmesg/kmsg/journal text, for `doctor`."""
    return gpu_events_in_text([kernel_message(line.rstrip("\r\n")) for line in lines])


def clip(text: str, limit: int = 320) -> str:
    """Shorten a long line in the middle: the head says who logged it, the tail holds the reason
    (``… load failure from <a 150-character path>, reason: 'function' object has no attribute …``)."""
    if len(text) <= limit:
        return text
    head = limit * 2 // 5
    return f"{text[:head]} … {text[-(limit - head - 3):]}"


# --- scanning text --------------------------------------------------------------------------------


def _matches(sig: Signature, lines: Sequence[str], i: int) -> bool:
    line = lines[i]
    if not any(p.search(line) for p in sig.patterns):
        return False
    if sig.needs_context or sig.unless_context:
        window = lines[max(0, i - CONTEXT_LINES): i + CONTEXT_LINES + 1]
        if sig.needs_context and not any(p.search(w) for w in window for p in sig.needs_context):
            return False
        if sig.unless_context and any(p.search(w) for w in window for p in sig.unless_context):
            return False
    return True


def _first_line(patterns: tuple[re.Pattern[str], ...], lines: Sequence[str]) -> int | None:
    return next((i for i, line in enumerate(lines) if any(p.search(line) for p in patterns)), None)


def scan_lines(lines: Sequence[str]) -> list[Finding]:
    """Every signature in `lines`, one Finding per code, in the order of `SIGNATURES`."""
    hits: dict[DiagnosisCode, list[int]] = {}
    clean = [line.rstrip("\r\n") for line in lines]
    # Where each row's `only_before` first appears: its triggers count only above that line.
    cutoff = {sig.code: _first_line(sig.only_before, clean) for sig in SIGNATURES if sig.only_before}
    for i in range(len(clean)):
        for sig in SIGNATURES:
            end = cutoff.get(sig.code)
            if end is not None and i > end:
                continue
            if _matches(sig, clean, i):
                hits.setdefault(sig.code, []).append(i)
    findings: list[Finding] = []
    for sig in SIGNATURES:
        where = hits.get(sig.code)
        if not where:
            continue
        findings.append(Finding(
            code=sig.code, severity=sig.severity, benign=sig.benign, count=len(where),
            first_line_no=where[0] + 1,
            evidence=tuple(f"{i + 1}: {clip(clean[i].strip())}" for i in where[:3]),
            summary=sig.summary, hint=sig.hint, fact=sig.fact, retryable=sig.retryable,
        ))
    return findings


def scan_text(text: str) -> list[Finding]:
    """Every signature in a saved engine log or dmesg/kmsg text (benign ones flagged as such)."""
    return scan_lines(text.split("\n"))


# --- diagnosing one failure -----------------------------------------------------------------------


@dataclass(frozen=True)
class FailureFacts:
    """Everything the supervisor knows when a start ends badly. All optional: `doctor` has only text."""

    exit_code: int | None = None
    signal: int | None = None  # terminating signal; derived from exit codes > 128 when absent
    oom_killed: bool | None = None  # docker State.OOMKilled
    log_tail: tuple[str, ...] = ()
    oom_events: tuple[OomEvent, ...] = ()  # kernel OOM kills of the engine's processes (attributed)
    gpu_events: tuple[GpuEvent, ...] = ()  # GPU kernel events on the engine's cards or pids (attributed)
    phase_reached: Phase | None = None
    progress: str | None = None  # e.g. PhaseTracker.describe(): "capturing graphs round 2: 38/51 · …"
    stalled: bool = False  # no phase progress and no CPU time for the stall window
    over_budget: bool = False  # the recipe's ready budget ran out
    elapsed_s: float | None = None
    budget_s: float | None = None
    probe_error: str | None = None  # the last readiness-probe error, e.g. "connection reset by peer"
    runtime_reason: str | None = None  # ExitInfo.reason: the runtime's words (kubernetes: Unschedulable: …)


_SIGNAL_NAMES = {1: "SIGHUP", 2: "SIGINT", 6: "SIGABRT", 9: "SIGKILL", 11: "SIGSEGV", 15: "SIGTERM"}
_EXCEPTION_LINE = re.compile(r"^\s*(?:\(\S+ pid=\d+\)\s*)?(?:[\w.]+\.)?\w*(?:Error|Exception|Interrupt)\b:?")
_FAILED_PROCS = re.compile(r"Failed core proc\(s\): \{(.*)\}")

def _by_rank(decides: Decides) -> tuple[DiagnosisCode, ...]:
    return tuple(s.code for s in sorted(SIGNATURES, key=lambda s: s.rank) if s.decides is decides)


# Known failures, most specific first (by rank). Kernel OOM first: the kill explains the death, and
# dying workers leave misleading tracebacks.
_FAILURE_ORDER: tuple[DiagnosisCode, ...] = _by_rank(Decides.FAILURE)
# Degradations (warnings) reported when nothing failed, first match wins.
_DEGRADED_ORDER: tuple[DiagnosisCode, ...] = _by_rank(Decides.DEGRADED)


def _signal_of(facts: FailureFacts) -> int | None:
    if facts.signal is not None:
        return facts.signal
    if facts.exit_code is not None and facts.exit_code > 128:
        return facts.exit_code - 128  # shell/docker convention: 128 + signal
    if facts.exit_code is not None and facts.exit_code < 0:
        return -facts.exit_code  # subprocess convention
    return None


def _signal_name(sig: int) -> str:
    return _SIGNAL_NAMES.get(sig, f"signal {sig}")


def _where(facts: FailureFacts) -> str:
    if facts.progress:
        return f" (at: {facts.progress})"
    if facts.phase_reached is not None:
        return f" (furthest phase: {PHASE_LABELS[facts.phase_reached]})"
    return ""


def _from_signature(
    sig: Signature,
    finding: Finding | None,
    facts: FailureFacts,
    findings: tuple[Finding, ...],
    extra_evidence: tuple[str, ...] = (),
    summary: str | None = None,
) -> Diagnosis:
    return Diagnosis(
        code=sig.code,
        severity=sig.severity,
        summary=(summary or sig.summary) + _where(facts),
        hint=sig.hint,
        evidence=extra_evidence + (finding.evidence if finding else ()),
        retryable=sig.retryable,
        fact=sig.fact,
        findings=findings,
    )


def _last_exception(lines: Sequence[str]) -> tuple[str, ...]:
    for line in reversed(lines):
        if _EXCEPTION_LINE.search(line) and "Traceback" not in line:
            return (clip(line.strip()),)
    return ()


_MISSING_MODULE = re.compile(r"No module named '([^']+)'")


_VALUE_ERROR = re.compile(r"Value error, (.+?)(?: \[type=|$)")


def _missing_module_summary(finding: Finding) -> str | None:
    """MODULE_NOT_FOUND names the module(s), ENGINE_CONFIG_INVALID vLLM's reason; None for
    every other code."""
    if finding.code is DiagnosisCode.ENGINE_CONFIG_INVALID:
        reasons = [m.group(1).strip() for line in finding.evidence if (m := _VALUE_ERROR.search(line))]
        return f"vLLM refused the configuration: {reasons[0]} (not retryable)" if reasons else None
    if finding.code is not DiagnosisCode.MODULE_NOT_FOUND:
        return None
    names = sorted({m.group(1) for line in finding.evidence for m in _MISSING_MODULE.finditer(line)})
    return f"Python module {', '.join(repr(n) for n in names)} is not installed: the engine image/venv " \
           "is broken (not retryable)"


_KV_REFUSED = re.compile(
    r"Available memory on node (\d+) \((-?[\d.]+)/([\d.]+) GiB\) on kv cache allocation is less than "
    r"requested memory for kv \((-?[\d.]+(?:/[\d.]+)?) GiB\)")
_GPU_SHORT = re.compile(
    r"Free memory on device\b\s*([^\s(]*)\s*\(([\d.]+)/([\d.]+) GiB\) on startup is less than "
    r"(?:desired GPU memory utilization|the engine's budget[^(]*) \(([\d.]+), ([\d.]+) GiB\)")
_REPO_ID = re.compile(r"Repo id must (?:be in the form|use)[^:]*: '([^']*)'")
_TRACEBACK = re.compile(r"Traceback \(most recent call last\)")
# An exception line, also behind vLLM's `(Worker pid=N) ERROR mm-dd hh:mm:ss [file.py:N] ` prefix.
_RAISED = re.compile(r"(?:^|\]\s|\)\s)\s*(?:[\w.]+\.)?\w*(?:Error|Exception|Interrupt)\b:")


def _ruled_out(code: DiagnosisCode, facts: FailureFacts) -> bool:
    """A row the facts beyond the text rule out: the import-order crash happens at import, so not once
    the log tracker saw the start reach weight loading (the tail may have lost those lines)."""
    if code is not DiagnosisCode.IMPORT_ORDER_BAD_ALLOC or facts.phase_reached is None:
        return False
    reached = facts.phase_reached
    return reached in PROGRESS_ORDER and PROGRESS_ORDER.index(reached) >= PROGRESS_ORDER.index(
        Phase.WEIGHTS_LOADING)


def _summary_from_tail(code: DiagnosisCode, tail: Sequence[str]) -> str | None:
    """Rows whose summary quotes the engine's own numbers or names."""
    if code is DiagnosisCode.KV_CACHE_TOO_LARGE:
        for line in tail:
            if (m := _KV_REFUSED.search(line)) is not None:
                node, free, total, want = m.groups()
                return (f"the KV cache does not fit: vLLM asked for {want} GiB for KV on NUMA node {node}, "
                        f"which had {free} of {total} GiB available (not retryable)")
    if code is DiagnosisCode.GPU_MEMORY_SHORT:
        for line in tail:
            if (m := _GPU_SHORT.search(line)) is not None:
                device, free, total, util, want = m.groups()
                card = f"the card {device}" if device else "the card"
                return (f"{card} had {free} of {total} GiB free at start, less than gpu_memory_utilization "
                        f"{util} asks for ({want} GiB): vLLM refused to start (not retryable)")
    if code is DiagnosisCode.MODEL_PATH_INVALID:
        for line in tail:
            if (m := _REPO_ID.search(line)) is not None:
                return (f"the model path {m.group(1)!r} is not a model folder (missing, or no config.json): "
                        "vLLM took it for a Hugging Face repo id (not retryable)")
    if code is DiagnosisCode.WORKER_DIED:  # reached only when no traceback precedes the death
        return f"{_dead_worker(tail)} without a Python error: it was killed from outside"
    if code is DiagnosisCode.COMPILE_CONSTRAINT_VIOLATION and any("_dummy_run" in line for line in tail):
        return ("torch.compile failed a dynamic-shape guard (ConstraintViolationError) in profile_run → "
                "_dummy_run: the vLLM tree's defect (seen with cudagraph_mode=NONE), not the sdot4 op")
    return None


def _dead_worker(tail: Sequence[str]) -> str:
    """"<which worker> died[ of <signal>]", in the executor's words: vLLM names the process
    `VllmWorker-<rank>` (its tensor-parallel rank) and reports `exit code: -9` for a SIGKILL
    (appliance/observe/rank_logs.py)."""
    deaths = deaths_in(tuple(tail))
    if not deaths:
        return "an engine worker process died"
    d = deaths[0]
    who = f"engine worker {d.process}" + (f" (tensor-parallel rank {d.rank})" if d.rank is not None else "")
    if d.signal is not None:
        return f"{who} died of {_signal_name(d.signal)} (exit code {d.exit_code})"
    if d.exit_code is not None:
        return f"{who} died with exit code {d.exit_code}"
    return f"{who} died"


def _error_before(tail: Sequence[str], finding: Finding) -> str | None:
    """The last Python exception line above the worker's death, when a traceback precedes it."""
    above = tail[:finding.first_line_no - 1]
    if not any(_TRACEBACK.search(line) for line in above):
        return None
    for line in reversed(above):
        if _RAISED.search(line) and "Traceback" not in line:
            return clip(line.strip())
    return "a Python traceback"


def _worker_died_after_error(
    sig: Signature, finding: Finding, facts: FailureFacts, findings: tuple[Finding, ...], error: str,
) -> Diagnosis:
    return Diagnosis(
        code=sig.code, severity=sig.severity,
        summary=f"{_dead_worker(facts.log_tail)} after a Python error (no known signature matched it)"
                + _where(facts),
        hint="read the traceback above the worker's death: the worker raised, it was not killed from "
             "outside; "
             "report the signature if it recurs",
        evidence=(error, *finding.evidence), retryable=True,
        fact="DOMAIN §5: unknown signatures are retried with backoff, then stopped as failed",
        findings=findings,
    )


def diagnose(facts: FailureFacts) -> Diagnosis:
    """THE diagnosis of one failed start. Evidence-first: kernel OOM records, then known log
    signatures, then the docker OOM flag, probes, stall/budget, signal, exit code."""
    tail = list(facts.log_tail)
    findings = tuple(scan_lines(tail))
    found = {f.code: f for f in findings}

    # 1. Kernel OOM kills attributed to the engine: the kill explains the death.
    kills = [e for e in facts.oom_events if e.kind is OomEventKind.KILL]
    if kills:
        return _from_oom(kills, facts, findings)

    # 1a. The card failed under the engine (a fatal Xid, a reset), or the driver saw the engine fault.
    if facts.gpu_events and (gpu := _from_gpu(facts.gpu_events, facts, findings)) is not None:
        return gpu

    # 1b. The runtime says the engine's shim was killed: the engine ended because its parent did (the
    # kernel's parent-death signal), whatever its log says while it shut down.
    if facts.runtime_reason and _SHIM_KILLED.search(facts.runtime_reason):
        return _shim_killed(facts.runtime_reason, facts, findings)

    # 2. Known signatures in the log tail, most specific first.
    for code in _FAILURE_ORDER:
        if code in found and not _ruled_out(code, facts):
            sig = _BY_CODE[code]
            if code is DiagnosisCode.WORKER_DIED and (error := _error_before(tail, found[code])):
                return _worker_died_after_error(sig, found[code], facts, findings, error)
            summary = _missing_module_summary(found[code]) or _summary_from_tail(code, tail)
            return _from_signature(sig, found[code], facts, findings, summary=summary)

    sig_no = _signal_of(facts)

    # 3. Docker says OOM-killed but no kernel record tells global from cgroup.
    if facts.oom_killed:
        return Diagnosis(
            code=DiagnosisCode.OOM_KILLED_UNATTRIBUTED, severity=Severity.ERROR,
            summary="the runtime reports the engine OOM-killed, but no kernel OOM record was available to "
                    "tell a global OOM from a cgroup limit" + _where(facts),
            hint="read `dmesg | grep -E 'oom-kill|Killed process'`: constraint=CONSTRAINT_NONE/global_oom "
                 "means host RAM + swap (add swap, swappiness 200, warm cache, eager); CONSTRAINT_MEMCG "
                 "means a container limit (recreate without one)",
            evidence=(f"OOMKilled=true, exit code {facts.exit_code}",), retryable=False,
            fact="DOMAIN §3: an earlier 'cgroup OOM' diagnosis from memory.events oom_kill was wrong — the "
                 "kernel text said global_oom",
            findings=findings,
        )

    # 3b. The runtime says why the engine never ran (no exit code): its words are the evidence. So
    # too when the controller gave up (budget, stall) while the runtime still said it was waiting
    # (a pod for a node): the stop's own exit code is of the controller's making, not the engine's.
    if facts.runtime_reason and (facts.exit_code is None or facts.over_budget or facts.stalled):
        return _runtime_cannot_run(facts.runtime_reason, facts, findings)

    # 4. The readiness probe was reset while the engine listens on loopback.
    if facts.probe_error and "reset" in facts.probe_error.lower() and DiagnosisCode.LOOPBACK_BIND in found:
        sig = _BY_CODE[DiagnosisCode.BIND_LOCALHOST_IN_BRIDGE]
        return _from_signature(sig, found[DiagnosisCode.LOOPBACK_BIND], facts, findings,
                               extra_evidence=(f"probe: {facts.probe_error}",))

    # 5. Stalled or out of time.
    cache_note = ""
    if DiagnosisCode.AOT_CACHE_MISS in found:
        cache_note = "; the compile cache missed, so this start was cold"
    if facts.stalled:
        return Diagnosis(
            code=DiagnosisCode.STALLED, severity=Severity.ERROR,
            summary="no phase progress and no CPU time for the stall window" + _where(facts) + cache_note,
            hint="look at what the engine waits on (py-spy dump, /proc/<pid>/stack); a model that does not "
                 "fit one card stalls in torch.compile — raise TP",
            evidence=_stall_evidence(facts, tail), retryable=True,
            fact="DOMAIN §3: 28.51 GiB weights on a 31.98 GiB card stalls in torch.compile",
            findings=findings,
        )
    if facts.over_budget:
        spent = ""
        if facts.elapsed_s is not None and facts.budget_s is not None:
            spent = f" ({facts.elapsed_s:.0f} s of a {facts.budget_s:.0f} s budget)"
        return Diagnosis(
            code=DiagnosisCode.READY_BUDGET_EXCEEDED, severity=Severity.ERROR,
            summary="the engine was still starting when its ready budget ran out" + spent + _where(facts)
                    + cache_note,
            hint="raise the recipe's ready budget (default graph needs ≥ 2700 s; recipe C 352 s cold / "
                 "230 s warm; eager B's ready time is not recorded) or make the start warm "
                 "(AOT warm-up then restart)",
            evidence=_stall_evidence(facts, tail), retryable=False,
            fact="DOMAIN §4: default graph is ready after 1542–1583 s; an orchestrator waiting 1500 s killed "
                 "the engine at 38/51 of graph-capture round 2",
            findings=findings,
        )

    # 6. The engine core reported a failed start with no known signature.
    if DiagnosisCode.ENGINE_START_FAILED in found:
        finding = found[DiagnosisCode.ENGINE_START_FAILED]
        child = _failed_child_signal(tail)
        summary = "the engine core failed to start; no known signature matched the traceback"
        if child is not None:
            summary = (f"the engine core failed to start: a core process died of {_signal_name(child)}"
                       + (" — with no OOM record at hand, check dmesg for an OOM kill" if child == 9 else ""))
        return _from_signature(_BY_CODE[DiagnosisCode.ENGINE_START_FAILED], finding, facts, findings,
                               extra_evidence=_last_exception(tail), summary=summary)

    # 7. Killed by a signal, or a plain non-zero exit.
    if sig_no is not None:
        sigkill = sig_no == 9
        return Diagnosis(
            code=DiagnosisCode.KILLED_BY_SIGNAL, severity=Severity.ERROR,
            summary=f"the engine was killed by {_signal_name(sig_no)}" + _where(facts) + cache_note,
            hint=("SIGKILL with no kernel OOM record: something outside killed it (an orchestrator's "
                  "timeout?) — check `dmesg | grep -i oom` if the kmsg watch was not running" if sigkill else
                  "see the log tail; SIGABRT right at import is the import-order bug (torch first)"),
            evidence=(f"exit code {facts.exit_code}, signal {sig_no}", *_last_exception(tail)),
            retryable=True,
            fact="DOMAIN §4: an orchestrator that waits only 1500 s kills a default-graph start at 38/51 of "
                 "round 2",
            findings=findings,
        )
    if facts.exit_code not in (None, 0):
        return Diagnosis(
            code=DiagnosisCode.EXIT_NONZERO, severity=Severity.ERROR,
            summary=f"the engine exited with code {facts.exit_code}" + _where(facts) + cache_note,
            hint="no known signature matched: read the log tail; retried with backoff, then stopped as "
                 "failed",
            evidence=(f"exit code {facts.exit_code}", *_last_exception(tail)), retryable=True,
            fact="ARCHITECTURE 'Failure': classify, back off (10 s doubling to 5 min), relaunch or stop as "
                 "FATAL",
            findings=findings,
        )

    # 8. Nothing failed, but the engine runs degraded: every start is cold, or the all-reduce is slow.
    for code in _DEGRADED_ORDER:
        if code in found:
            return _from_signature(_BY_CODE[code], found[code], facts, findings)

    return Diagnosis(
        code=DiagnosisCode.UNKNOWN, severity=Severity.INFO,
        summary="no known failure signature" + _where(facts),
        hint="nothing to act on from this text alone",
        evidence=(), retryable=True, fact="DOMAIN §5", findings=findings,
    )


# The process runtime's words (controller/runtime/process.py `_ended`): "the engine's shim (pid N) was
# killed (killed by signal 9 (SIGKILL))".
_SHIM_KILLED = re.compile(r"\bshim \(pid \d+\) was killed\b")


def _shim_killed(reason: str, facts: FailureFacts, findings: tuple[Finding, ...]) -> Diagnosis:
    return Diagnosis(
        code=DiagnosisCode.SHIM_KILLED, severity=Severity.ERROR,
        summary=f"{reason}: the engine ended with it" + _where(facts),
        hint="something outside the appliance killed the engine's shim (a `kill -9` by PID or pattern, "
             "a service manager stopping the controller's cgroup, the kernel's OOM killer — check "
             "`dmesg | grep -i oom`); the engine's own exit status is unknown. Retried like a crash",
        evidence=(f"runtime: {reason}",), retryable=True,
        fact="the shim is the engine's parent; when it dies the kernel TERMs the engine and the "
             "runtime ends what is left of its process group",
        findings=findings,
    )


def _runtime_cannot_run(reason: str, facts: FailureFacts, findings: tuple[Finding, ...]) -> Diagnosis:
    # Waiting for capacity can end by itself (an autoscaler, another launch ending): retryable.
    # An image or configuration the runtime refuses needs someone to change it: not retryable.
    capacity = reason.startswith("Unschedulable")
    return Diagnosis(
        code=DiagnosisCode.RUNTIME_CANNOT_RUN, severity=Severity.ERROR,
        summary=f"the runtime could not run the engine: {reason}" + _where(facts),
        hint=("the cluster has no node with the requested GPUs / memory / labels free: see `appliance host "
              "plan RECIPE` for what the node must have, free the resources, or change the node selector; "
              "where an autoscaler adds nodes more slowly than the controller's grace "
              "(APPLIANCE_K8S_UNSCHEDULABLE_GRACE_S, 300 s by default), raise that grace"
              if capacity else
              "the image cannot be pulled or the container cannot be created as rendered: check the image "
              "name, the registry's pull secret and the referenced Secret/claims"),
        evidence=(f"runtime: {reason}",), retryable=capacity,
        fact="a pod the scheduler cannot place never starts, so it has neither exit code nor log",
        findings=findings,
    )


_OOM_CODES = {
    OomScope.GLOBAL: DiagnosisCode.GLOBAL_OOM,
    OomScope.CGROUP: DiagnosisCode.CGROUP_OOM,
    OomScope.CPUSET: DiagnosisCode.NODE_CONSTRAINED_OOM,
    OomScope.MEMPOLICY: DiagnosisCode.NODE_CONSTRAINED_OOM,
}


def _from_oom(kills: Sequence[OomEvent], facts: FailureFacts, findings: tuple[Finding, ...]) -> Diagnosis:
    # A global OOM decides over a cgroup one in the same failure: it is the host, not this container.
    order = (OomScope.GLOBAL, OomScope.CGROUP, OomScope.CPUSET, OomScope.MEMPOLICY, OomScope.UNKNOWN)
    main = min(kills, key=lambda e: order.index(e.scope))
    phase = facts.phase_reached.value if facts.phase_reached is not None else None
    said = diagnose_oom(main, phase=phase)
    code = _OOM_CODES.get(main.scope, DiagnosisCode.OOM_KILLED_UNATTRIBUTED)
    sig = _BY_CODE.get(code)
    others = len(kills) - 1
    more = f" (+{others} more kill{'s' if others > 1 else ''})" if others else ""
    evidence = tuple(line for e in kills for line in e.lines)[:8]
    return Diagnosis(
        code=code, severity=Severity.ERROR, summary=f"{said.title}: {said.detail}{more}",
        hint=said.action, evidence=evidence, retryable=False,
        fact=sig.fact if sig else "DOMAIN §3: tell a global OOM from a cgroup limit by the kernel's "
                                  "constraint=",
        findings=findings,
    )


def _stall_evidence(facts: FailureFacts, tail: Sequence[str]) -> tuple[str, ...]:
    last = tuple(clip(line.strip()) for line in tail[-3:] if line.strip())
    where = (f"at: {facts.progress}",) if facts.progress else ()
    return where + last


def _failed_child_signal(lines: Sequence[str]) -> int | None:
    for line in reversed(lines):
        m = _FAILED_PROCS.search(line)
        if m is not None:
            codes = re.findall(r":\s*(-?\d+)", m.group(1))
            for code in codes:
                if int(code) < 0:
                    return -int(code)
            return None
    return None


_ACTION_HINT = {
    GpuAction.DRAIN_NODE: "drain the node and reboot it; check power, seating and cooling",
    GpuAction.RESET_GPU: "reset the card (nvidia-smi -r -i N, or reboot) before relaunching on it; "
                         "drain the node if it recurs, check cooling",
    GpuAction.CHECK_COOLING: "check cooling and airflow, then reset the card",
    GpuAction.RESTART_APP: "relaunching is enough; reset the card when it is idle",
    GpuAction.NONE: "nothing to do for the card",
}


def _from_gpu(events: Sequence[GpuEvent], facts: FailureFacts,
              findings: tuple[Finding, ...]) -> Diagnosis | None:
    """A GPU event that explains the death: a hardware fault first (fatal ones first), then the
    engine's own fault as the driver saw it. Consequences (Xid 45) and notes (63, 92) explain nothing."""
    hardware = [e for e in events if e.side is FaultSide.HARDWARE and e.action is not GpuAction.NONE]
    hangs = [e for e in events if e.kind is GpuEventKind.RING_TIMEOUT]
    application = [e for e in events if e.side is FaultSide.APPLICATION]
    evidence = tuple(clip(e.text) for e in events if e.text)[:8]
    main = next((e for e in hardware if e.fatal), None) or next(
        (e for e in hardware if e.xid not in (63, 92)), None)
    if main is None and hangs:
        main = hangs[0]
    if main is not None:
        sig = _BY_CODE[DiagnosisCode.GPU_FAULT]
        others = len(events) - 1
        more = f" (+{others} more GPU event{'s' if others > 1 else ''})" if others else ""
        return Diagnosis(
            code=sig.code, severity=Severity.ERROR,
            summary=f"GPU fault, not an engine bug — {main.describe()}{more}" + _where(facts),
            hint=_ACTION_HINT[main.action]
            + (f" — then `appliance gpu reset-done {main.card if main.card is not None else 'N'}`; not "
               "relaunched on this card until then" if main.fatal else ""),
            evidence=evidence, retryable=not main.fatal, fact=sig.fact, findings=findings,
        )
    if application:
        first = application[0]
        sig = _BY_CODE[DiagnosisCode.GPU_ENGINE_FAULT]
        return Diagnosis(
            code=sig.code, severity=Severity.ERROR,
            summary=f"the engine faulted on the GPU — {first.describe()}; the card is healthy"
            + _where(facts),
            hint=sig.hint, evidence=evidence, retryable=True, fact=sig.fact, findings=findings,
        )
    return None
