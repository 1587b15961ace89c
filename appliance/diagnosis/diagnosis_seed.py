"""Failure signatures of the seed record beyond DOMAIN §5's table, as plain data. Pure.

`appliance.diagnosis.diagnosis` turns each row into a `Signature` (same fields, codes as `DiagnosisCode`
values); this module imports nothing from it so the table stays a table. Each row cites where the
seed record saw the failure (seed 000 = the Z100 adaptation record, "S<step> §n" as it cites itself).

Wordings are the tools' own: HIP's device assert (``Device-side assertion `…' failed``), the ROCm
runtime's ``HSA_STATUS_ERROR_EXCEPTION`` / ``Memory access fault by GPU node-N``, Triton's MLIR
diagnostic ``loc(…): error: unsupported target: 'gfx906'``, pybind11's ``incompatible function
arguments``, RCCL's ``NCCL INFO Channel … via NET/Socket/0`` and ``Missing "iommu=pt"`` warning.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SeedSignature:
    code: str  # a DiagnosisCode value
    severity: str  # a Severity value: "error" | "warning" | "info"
    patterns: tuple[str, ...]  # regexes; any on one line triggers
    summary: str
    hint: str
    fact: str
    retryable: bool
    benign: bool = False
    needs_context: tuple[str, ...] = ()  # one must occur within CONTEXT_LINES of the trigger
    unless_context: tuple[str, ...] = ()  # none may occur within CONTEXT_LINES of the trigger


# HIP's assert wording, and CUDA/torch's. Not "to enable device-side assertions": torch prints that
# advice under every HIP error, OOMs included.
DEVICE_ASSERT = (r"Device-side assertion `[^`]*' failed", r"device-side assert triggered")
MFMA_STUBS = (r"wvSplitK", r"\bLLMM1\b", r"paged_attention", r"ROCM_ATTN", r"skinny_gemm",
              r"UNREACHABLE_CODE", r"_rocm_C\b")
# The server side of an HTTP connection in the engine's own log: a client went away mid-response.
SERVER_SIDE = (r"stream_generator", r"StreamingResponse", r"starlette", r"\banyio\b", r"ASGI",
               r"h11_impl", r"httptools_impl", r"uvicorn[/.]protocols", r"\bsend_bytes\b")

SEED_SIGNATURES: tuple[SeedSignature, ...] = (
    # The fault is the trigger and the assertion (or a stub's name) its context: a device-side assert
    # alone is an ordinary kernel bug on other GPUs (the generic CUDA recipe), not an MFMA stub.
    SeedSignature(
        "mfma_only_kernel", "error",
        (r"HSA_STATUS_ERROR_EXCEPTION", r"Memory access fault by GPU", r"GPU memory access fault",
         r"\bVM fault\b"),
        "a kernel that exists only as an MFMA stub ran on gfx906: device-side assertion, then an HSA "
        "exception / GPU memory access fault",
        "do not force --attention-backend (ROCM_ATTN / _rocm_C::paged_attention is an MFMA-only stub; the "
        "automatic choice is TRITON_ATTN) and keep VLLM_ROCM_USE_SKINNY_GEMM=0 (wvSplitK* / LLMM1 are "
        "MFMA-only)",
        "seed 000, S8 §3.3 / S5 §3.6: csrc/rocm/attention.cu degrades to UNREACHABLE_CODE on gfx906 and a "
        "real call gives a device-side assertion + VM fault; wvSplitK's switch(N_in) implements 1..5 only",
        retryable=False, needs_context=DEVICE_ASSERT + MFMA_STUBS,
    ),
    SeedSignature(
        "triton_unsupported_target", "error",
        (r"error: unsupported target: '?gfx\w+", r"[Uu]nsupported target:? '?gfx9\d\d"),
        "Triton does not know this GPU target (unsupported target: 'gfx906')",
        "install the gfx906-patched Triton into the engine's environment (S06: self-built triton 3.6.0 with "
        "the VEGA ISA family, DTK hipDeviceProp_t and compiler.py patches), then clear TRITON_CACHE_DIR",
        "seed 000, S5 / S06 §2.1–§3.6: 14 Triton tests failed with `unsupported target` on the stock "
        "wheel; the patched triton 3.6.0 (5 files, 48 lines) removed all 14",
        retryable=False,
    ),
    SeedSignature(
        "triton_api_mismatch", "error",
        (r"incompatible function arguments", r"add_convert_to_buffer_ops",
         r"module 'triton[\w.]*' has no attribute", r"cannot import name '\w+' from 'triton[\w.]*'",
         r"No module named 'triton\.[\w.]+'"),
        "Triton's Python layer and its native library (or vLLM and Triton) disagree on an API",
        "the Triton Python package must match libtriton.so and the vLLM build: for the 3.6 wheel's "
        "add_convert_to_buffer_ops (Python 5 args, native 4) set AMDGCN_USE_BUFFER_OPS=0, or use the "
        "self-built patched Triton; never mix DTK wheels with community wheels",
        "seed 000, S4b §5.2 / S6 §3.3: amd.passes.ttgpuir.add_convert_to_buffer_ops is 5-argument in "
        "Python and 4-argument in libtriton.so ⇒ immediate crash",
        # Triton's own frames or modules, not the word: vLLM logs "Using Triton Attention backend".
        retryable=False, needs_context=(r"\btriton[/.]", r"libtriton", r"ttgpuir"),
    ),
    SeedSignature(
        "torchvision_abi_mismatch", "error", (r"operator torchvision::\w+ does not exist",),
        "torchvision was built for another torch (operator torchvision::nms does not exist)",
        "use an image whose torchvision matches its torch (torchvision 0.26.0 for torch 2.11: the "
        "z100-s9 / z100-eager containers); vLLM imports it through _aiter_ops → transformers → torchvision",
        "seed 000, S6 §5.3 / S11e §5-3: torchvision 0.25.0 built for torch 2.10 under torch 2.11 ⇒ `import "
        "torchvision` raises RuntimeError: operator torchvision::nms does not exist",
        retryable=False,
    ),
    SeedSignature(
        "extension_abi_mismatch", "error", (r"undefined symbol: \S+",),
        "a compiled extension was built against another torch/ROCm than the one installed (undefined "
        "symbol)",
        "run the engine with the torch its _C / _rocm_C / _C_stable_libtorch were built for (the target "
        "stack torch 2.11.0+das), or rebuild the extensions in this image",
        "seed 000, S11a §5-3 / S5 §5.1: extensions built for torch 2.11 in an image with torch 2.10 fail "
        "with `undefined symbol`",
        retryable=False, needs_context=(r"\.so\b", r"ImportError", r"OSError"),
    ),
    SeedSignature(
        "rccl_net_socket", "warning", (r"\bvia NET/Socket",),
        "RCCL fell back to NET/Socket for the tensor-parallel all-reduce (7.3× slower than SHM)",
        "unset NCCL_SHM_DISABLE: SHM is the only fast transport on this host (RCCL never uses P2P here); "
        "none of the ten P2P switch combinations helps",
        "seed 000, S11f §10: NCCL_SHM_DISABLE=1 did not buy P2P, it fell to `via NET/Socket` (1 MiB "
        "all-reduce 2247 → 16371 µs); SHM 0.70–0.72 GB/s is the measured best",
        retryable=True,
    ),
    SeedSignature(
        "rccl_iommu_pt_missing", "info", (r"Missing \"?iommu=pt\"?",),
        "RCCL warns that the kernel command line lacks iommu=pt",
        "the reference host boots with iommu=pt (kept: RCCL says it can be unstable without); it changes "
        "no speed — add it to GRUB when convenient",
        "seed 000, S11f §10: iommu=pt was added and kept; Uncached allocation and RCCL P2P stayed "
        "unavailable and latency stayed within noise",
        retryable=True, benign=True,
    ),
    SeedSignature(
        "client_disconnect", "info",
        (r"ConnectionResetError", r"[Cc]onnection reset by peer", r"BrokenPipeError", r"ClientDisconnect"),
        "a client closed its connection mid-response (seen from the engine's own server side)",
        "nothing to do for the engine: the client went away (timeout, cancel, a gateway retry)",
        "DOMAIN §2: `connection reset by peer` is a bridge-network bind problem only when the HOST's client "
        "sees it; inside the engine's stream generator it is a client disconnect",
        retryable=True, benign=True, needs_context=SERVER_SIDE,
    ),
)
