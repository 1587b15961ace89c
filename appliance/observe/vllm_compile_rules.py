"""What each supported vLLM version hashes into its torch.compile cache key, kept as data. Pure.

vLLM names its compile cache directory `VLLM_CACHE_ROOT/torch_compile_cache/<hash>` after
`[env_hash, config_hash, code_hash, compiler_hash]` (vllm/compilation/backends.py; the AOT directory
`torch_aot_compile/<hash>` after `[env_hash, config_hash, …]`, vllm/compilation/caching.py
`aot_compile_hash_factors`). `env_hash` hashes `vllm.envs.compile_factors()`: every variable in
`environment_variables` except an ignore list. `config_hash` is `VllmConfig.compute_hash()`, built
from the engine arguments. So a value that differs between two launches of one variant moves the
cache — a full recompile on a warm restart — when it reaches a hashed variable or an engine argument.

On the H200: the per-launch engine key in `VLLM_API_KEY` did exactly that on vLLM 0.26.0, whose ignore
list lacks it, while the CPU engine's vLLM 0.32 ignores it (so a check run with the CPU engine alone
passes). The rules of the versions the appliance runs are therefore kept here with their provenance,
and tests/unit/test_compile_key_guard.py holds every shipped recipe, as the runtimes really start it
(environment and argv), to each of them; tests/integration/test_compile_key_real.py asks the CPU
engine's own vLLM.

- `0.26.0`: upstream, on the lent H200 (docs/gpu-h200.md). Ignore list copied from
  `vllm/envs.py` `compile_factors()` of the vllm-0.26.0 wheel (manylinux_2_28_x86_64, file sha256
  e078b0acb8e658fa…): 69 names.
- `gfx906`: the kernel-enabled image of the Z100 hosts, a 0.18.x/0.2x base (DOMAIN §1). Its source is
  not available here: held to the strictest rule — every `VLLM_*` variable and every variable
  0.26.0 knows is hashed, nothing ignored — so that the appliance depends on no version's list.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# Non-VLLM_ names in vLLM 0.26.0's `environment_variables` (vllm/envs.py): vLLM reads and hashes them too.
KNOWN_NON_VLLM = frozenset({
    "CMAKE_BUILD_TYPE", "CUDA_HOME", "CUDA_VISIBLE_DEVICES", "K_SCALE_CONSTANT", "LD_LIBRARY_PATH",
    "LOCAL_RANK", "MAX_JOBS", "MOONCAKE_PREFERRED_SEGMENT", "MOONCAKE_REQUESTER_LOCAL_HOSTNAME",
    "NO_COLOR", "NVCC_THREADS", "Q_SCALE_CONSTANT", "S3_ACCESS_KEY_ID", "S3_ENDPOINT_URL",
    "S3_SECRET_ACCESS_KEY", "VERBOSE", "V_SCALE_CONSTANT",
})
# vLLM 0.26.0 `compile_factors()`'s `ignored_factors`, verbatim.
IGNORED_0_26_0 = frozenset({
    "CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "LOCAL_RANK", "MAX_JOBS", "NO_COLOR",
    "S3_ACCESS_KEY_ID", "S3_ENDPOINT_URL", "S3_SECRET_ACCESS_KEY", "VLLM_ASSETS_CACHE",
    "VLLM_ASSETS_CACHE_MODEL_CLEAN", "VLLM_AUDIO_FETCH_TIMEOUT", "VLLM_CACHE_ROOT",
    "VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_MOE_PREPACK", "VLLM_CUDA_COMPATIBILITY_PATH",
    "VLLM_DEBUG_DUMP_PATH", "VLLM_DEBUG_LOG_API_SERVER_RESPONSE", "VLLM_DO_NOT_TRACK",
    "VLLM_DP_MASTER_IP", "VLLM_DP_MASTER_PORT", "VLLM_ENABLE_CUDA_COMPATIBILITY",
    "VLLM_ENABLE_STARTUP_PLAN", "VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_ENGINE_ITERATION_TIMEOUT_S",
    "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR",
    "VLLM_FLASHINFER_AUTOTUNE_SKIP_OPS", "VLLM_FORCE_AOT_LOAD", "VLLM_HOST_IP",
    "VLLM_HTTP_TIMEOUT_KEEP_ALIVE", "VLLM_IMAGE_FETCH_TIMEOUT", "VLLM_KEEP_ALIVE_ON_ENGINE_DEATH",
    "VLLM_LOGGING_COLOR", "VLLM_LOGGING_CONFIG_PATH", "VLLM_LOGGING_LEVEL", "VLLM_LOGGING_PREFIX",
    "VLLM_LOGGING_STREAM", "VLLM_LOG_STATS_INTERVAL", "VLLM_MAX_AUDIO_CLIP_FILESIZE_MB",
    "VLLM_MAX_AUDIO_DECODE_DURATION_S", "VLLM_MAX_AUDIO_PREPROCESS_WORKERS", "VLLM_MAX_IMAGE_PIXELS",
    "VLLM_MEDIA_CACHE", "VLLM_MEDIA_CACHE_MAX_SIZE_MB", "VLLM_MEDIA_CACHE_TTL_HOURS",
    "VLLM_MEDIA_CONNECTOR", "VLLM_MEDIA_FETCH_MAX_RETRIES", "VLLM_MEDIA_LOADING_THREAD_COUNT",
    "VLLM_MEDIA_URL_ALLOW_REDIRECTS", "VLLM_MODEL_REDIRECT_PATH", "VLLM_NIXL_SIDE_CHANNEL_HOST",
    "VLLM_NO_USAGE_STATS", "VLLM_OBJECT_STORAGE_SHM_BUFFER_NAME", "VLLM_PORT",
    "VLLM_RANDOMIZE_DP_DUMMY_INPUTS", "VLLM_RINGBUFFER_WARNING_INTERVAL", "VLLM_RPC_BASE_PATH",
    "VLLM_SERVER_DEV_MODE", "VLLM_SKIP_MODEL_NAME_VALIDATION", "VLLM_TEST_FORCE_LOAD_FORMAT",
    "VLLM_TUNED_CONFIG_FOLDER", "VLLM_USAGE_STATS_SERVER", "VLLM_USE_MODELSCOPE",
    "VLLM_V1_OUTPUT_PROC_CHUNK_SIZE", "VLLM_VIDEO_FETCH_TIMEOUT", "VLLM_VIDEO_LOADER_BACKEND",
    "VLLM_WORKER_MULTIPROC_METHOD", "VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS",
    "VLLM_ZENTORCH_WEIGHT_PREPACK",
})


@dataclass(frozen=True)
class CompileRule:
    """Which environment variables one vLLM version hashes into its compile key."""

    version: str
    source: str
    ignored: frozenset[str]

    def hashed(self, name: str) -> bool:
        """Read by vLLM (a `VLLM_*` name or one it knows) and not on the ignore list. vLLM hashes
        only the variables it knows; treating every `VLLM_*` name as known is the safe side."""
        return (name.startswith("VLLM_") or name in KNOWN_NON_VLLM) and name not in self.ignored


RULES: Mapping[str, CompileRule] = {
    "0.26.0": CompileRule("0.26.0", "vllm-0.26.0 wheel, vllm/envs.py compile_factors() (ignore list, "
                          "69 names)", IGNORED_0_26_0),
    "gfx906": CompileRule("gfx906", "Z100 image (0.18.x/0.2x base, DOMAIN §1): source not read here, "
                          "strictest rule", frozenset()),
}


def moved_by(rule: CompileRule, env_a: Mapping[str, str], env_b: Mapping[str, str]) -> list[str]:
    """The hashed variables whose values differ between two launches' environments (set in one
    only counts: vLLM hashes the unset default too)."""
    names = sorted(set(env_a) | set(env_b))
    return [n for n in names if rule.hashed(n) and env_a.get(n) != env_b.get(n)]


def per_launch_leaks(values: Mapping[str, str], env: Mapping[str, str], argv: tuple[str, ...]) -> list[str]:
    """Where a per-launch value (`values`: what it is → the value, e.g. the engine key, the launch id)
    reaches something vLLM reads: a `VLLM_*`/known variable or an argv word. Empty when none does."""
    out: list[str] = []
    for what, value in values.items():
        if not value:
            continue
        out += [f"{what} in env {n}" for n, v in sorted(env.items())
                if (n.startswith("VLLM_") or n in KNOWN_NON_VLLM) and value in v]
        out += [f"{what} in argv word {i}" for i, word in enumerate(argv) if value in word]
    return out
