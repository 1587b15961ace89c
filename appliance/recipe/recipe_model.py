"""The recipe: everything an operator must get right to run the engine on a host, written once.

Pure: pydantic v2 models only. A recipe is frozen and rejects unknown keys, so a typo in a YAML file
is an error naming the field instead of a silently ignored setting (one missing variable costs an
afternoon, DOMAIN §2 "missing one causes trouble").

Facts behind the fields are cited as DOMAIN §n / S<step> (see docs/domain.md).
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

from appliance.engine_names import ENGINE_KEY_ENV
from appliance.host_facts import HOME_PLACEHOLDER
from appliance.recipe.key_chars import ERROR_TYPE as KEY_CHARS_ERROR
from appliance.recipe.key_chars import key_problem
from appliance.recipe_terms import Platform as Platform  # re-exported: defined in a leaf for the plug-ins
from appliance.runtimes import registry as runtime_registry
from appliance.runtimes.base import RuntimeSection

# POSIX portable environment variable names (IEEE Std 1003.1 §8.1). A name is written unquoted into
# `export NAME=…` (shell render), `-e NAME=…` (docker) and compose's `environment:` — anything else
# (`X=1; touch p; Y`, `Z$(touch q)`) would be a command, so it is refused at load time.
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class Strict(BaseModel):
    """Base for every recipe part: frozen, unknown keys rejected."""

    model_config = ConfigDict(frozen=True, extra="forbid")


# The `runtime:` section: one model per runtime kind, owned by its plug-in (appliance/runtimes/),
# discriminated by `kind`. Typed as the plug-ins' common base: callers ask the kind's plug-in
# (appliance.runtimes.registry.for_recipe) instead of checking the section's class.
if TYPE_CHECKING:
    Runtime = RuntimeSection
else:
    Runtime = runtime_registry.section_union()


class ModelSpec(Strict):
    path: str = Field(description="Model path or id as the engine sees it (inside the container for docker).")
    served_name: str = Field(description="Stable served model name (DOMAIN §1: the same across slots).")
    host_path: str | None = Field(default=None, description="Host directory mounted at `path` (docker).")
    checksum: str | None = Field(
        default=None, description="A digest of the weights the operator declares (e.g. sha256 of the "
        "safetensors index). Not the engine's: compared between the arms of a compare (seed 004 §1: "
        "weights first among what must not differ), with the path.")
    aliases: tuple[str, ...] = Field(
        default=(), description="Other names clients may request the model by; the gateway rewrites them "
        "to `served_name` and lists them in GET /v1/models. Opt-in: without them any other name is a 404 "
        "(a client asking for a model the appliance does not serve must not get this one's answer). Not "
        "the engine's: its argv and environment are the same with or without them.")

    @field_validator("aliases")
    @classmethod
    def _aliases_distinct(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if any(not name.strip() for name in v):
            raise PydanticCustomError("alias_empty", "an alias must be a non-empty name")
        dup = sorted({name for name in v if v.count(name) > 1})
        if dup:
            raise PydanticCustomError("alias_duplicate", "aliases listed twice: {names}",
                                      {"names": ", ".join(dup)})
        return v

    @model_validator(mode="after")
    def _alias_not_served_name(self) -> ModelSpec:
        if self.served_name in self.aliases:
            raise PydanticCustomError("alias_is_served_name", "alias {name!r} is the served name itself",
                                      {"name": self.served_name})
        return self

    @model_serializer(mode="wrap")
    def _omit_no_aliases(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # A recipe without aliases dumps (and so diffs and hashes) exactly as before the field existed.
        data: dict[str, Any] = handler(self)
        if not self.aliases:
            data.pop("aliases", None)
        if self.checksum is None:  # likewise: a recipe without a weights checksum hashes as before
            data.pop("checksum", None)
        return data


class GraphMode(StrEnum):
    EAGER = "eager"  # --enforce-eager: reproducible token stream (DOMAIN §2 recipe B)
    GRAPH = "graph"  # CUDA/HIP graphs: faster, output varies across restarts (S14b/S14d)


class EngineArgs(Strict):
    tensor_parallel_size: int = Field(default=1, ge=1, le=16)
    dtype: Literal["float16", "bfloat16", "float32", "auto"] = "float16"
    max_model_len: int | None = Field(default=None, ge=16)
    gpu_memory_utilization: float | None = Field(default=None, gt=0.0, le=1.0)
    max_num_batched_tokens: int | None = Field(default=None, ge=1)
    max_num_seqs: int | None = Field(default=None, ge=1)
    mode: GraphMode = GraphMode.GRAPH
    cudagraph_mode: (
        Literal["NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"] | None
    ) = Field(default=None, description="None = the engine default (FULL_AND_PIECEWISE in vLLM ≥ 0.11).")
    cudagraph_capture_sizes: tuple[int, ...] | None = None
    enable_prefix_caching: bool | None = None
    mamba_cache_mode: str | None = None
    disable_custom_all_reduce: bool = False
    skip_mm_profiling: bool = False
    enable_prompt_tokens_details: bool = False
    enable_auto_tool_choice: bool = False
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    attention_backend: str | None = None
    override_generation_config: dict[str, Any] | None = None
    default_chat_template_kwargs: dict[str, Any] | None = None
    host: str = "0.0.0.0"
    port: int = Field(default=8000, ge=1, le=65535)
    extra_args: tuple[str, ...] = ()
    why: dict[str, str] = Field(
        default_factory=dict,
        description="Field name → the fact behind its value (shown by `recipes show`; not a cache input).",
    )

    @field_validator("extra_args")
    @classmethod
    def _api_key_fits_a_header(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        # The recipe's own --api-key is sent raw as `Authorization: Bearer KEY`
        # (appliance/recipe/key_chars.py).
        for key in _api_key_values(value):
            problem = key_problem(key)
            if problem is not None:
                raise PydanticCustomError(
                    KEY_CHARS_ERROR, "--api-key in extra_args: {problem}", {"problem": problem})
        return value

    @field_validator("why")
    @classmethod
    def _why_names_fields(cls, value: dict[str, str]) -> dict[str, str]:
        unknown = sorted(set(value) - set(cls.model_fields) - {"why"})
        if unknown:
            raise ValueError(f"'why' names unknown engine fields {unknown}; use the field names of `engine`")
        return value

    @model_validator(mode="after")
    def _graph_options_need_graph_mode(self) -> EngineArgs:
        if self.mode is GraphMode.EAGER and (self.cudagraph_mode or self.cudagraph_capture_sizes):
            raise ValueError(
                "cudagraph_mode/cudagraph_capture_sizes are set but mode is 'eager' "
                "(--enforce-eager disables graphs): remove them or set mode: graph"
            )
        return self


def _api_key_values(args: tuple[str, ...]) -> list[str]:
    """Every value of `--api-key` in `args`: `--api-key=K`, and `--api-key K [K2 ...]` (vLLM takes
    a list) up to the next option."""
    keys: list[str] = []
    taking = False
    for arg in args:
        if arg.startswith("--api-key="):
            keys.append(arg.split("=", 1)[1])
            taking = False
        elif arg == "--api-key":
            taking = True
        elif taking and not arg.startswith("--"):
            keys.append(arg)
        else:
            taking = False
    return keys


class EnvVar(Strict):
    value: str
    why: str | None = None


def _coerce_env(value: object) -> object:
    """Allow `NAME: "value"` as shorthand for `NAME: {value: "value"}` in YAML."""
    if isinstance(value, dict):
        out: dict[object, object] = {}
        for k, v in value.items():
            if isinstance(v, bool):
                # YAML turns `X: false` into a bool; str() would give "False", which no engine reads
                # as intended. Make the operator say exactly what the process will see.
                raise ValueError(f"env var {k}: write the value as a quoted string (e.g. \"0\" or \"false\")")
            out[k] = {"value": str(v)} if isinstance(v, str | int | float) else v
        return out
    return value


def is_env_name(name: str) -> bool:
    return ENV_NAME_RE.fullmatch(name) is not None


class Environment(Strict):
    vars: dict[str, EnvVar] = Field(default_factory=dict)
    source_files: tuple[str, ...] = Field(
        default=(), description="Shell files sourced before start, e.g. /opt/dtk/env.sh (DOMAIN §2)."
    )
    torch_first_wrapper: bool = Field(
        default=False,
        description="Start via `python -c 'import torch; ...main()'` "
        "(importing vllm first → std::bad_alloc, DOMAIN §5).",
    )

    @field_validator("vars", mode="before")
    @classmethod
    def _shorthand(cls, value: object) -> object:
        return _coerce_env(value)

    @field_validator("vars")
    @classmethod
    def _posix_names(cls, value: dict[str, EnvVar]) -> dict[str, EnvVar]:
        bad = [name for name in value if not is_env_name(name)]
        if bad:
            raise PydanticCustomError(
                "env-name-posix",
                "env var name(s) {names} are not POSIX names: a name must match [A-Za-z_][A-Za-z0-9_]* "
                "(it is written unquoted into the shell, docker and compose renders)",
                {"names": ", ".join(repr(n) for n in bad)},
            )
        own_key = value.get(ENGINE_KEY_ENV)
        problem = key_problem(own_key.value) if own_key is not None else None
        if problem is not None:  # vLLM sends no header, but the gateway and the probe present it
            raise PydanticCustomError(
                KEY_CHARS_ERROR, "{name}: {problem}", {"name": ENGINE_KEY_ENV, "problem": problem})
        return value


class AcsState(StrEnum):
    DISABLED = "disabled"  # redirect bits off (DOMAIN §6 deployed state)
    ENABLED = "enabled"
    ANY = "any"


class HostRequirements(Strict):
    min_ram_gib: float | None = Field(default=None, gt=0)
    swap_total_gib: float | None = Field(default=None, ge=0)
    swappiness: int | None = Field(default=None, ge=0, le=200)
    memlock_unlimited: bool = False
    no_cgroup_memory_limit: bool = True
    pcie_acs: AcsState = AcsState.ANY
    boot_params: tuple[str, ...] = ()
    kernel_module: str | None = None


class Reproducibility(StrEnum):
    BITWISE = "bitwise"
    VARIES = "varies-across-restarts"


SLO_TIERS = ("4-8K", "8-16K", "16-32K")  # the seed's benchmark tiers (DOMAIN §7)


class TierSlo(Strict):
    """Absolute targets for one tier, e.g. MLPerf's published TTFT/TPOT pairs for its server
    scenario (Llama 2 70B: TTFT 2000 ms, TPOT 200 ms). Goodput counts the requests meeting both."""

    ttft_ms: float | None = Field(default=None, gt=0)
    tpot_ms: float | None = Field(default=None, gt=0)


class DeploymentCheck(Strict):
    """Seed 004 §7's deployment check, run in the engine's own interpreter once it is ready: each
    patched file compiles (`python3 -m py_compile`), the installed copy is byte-identical to the
    source (`cmp -s "$SRC/$F" "$SITE/$F"`), and `import vllm` resolves to the expected directory
    (`cd /tmp && python3 -c "import vllm; print(vllm.__file__)"`). One GDN deployment copied three
    files and left the installed platforms/rocm.py old: it failed at import before the candidate ran."""

    files: tuple[str, ...] = Field(
        default=(), description="Patched files, relative to both roots (e.g. vllm/envs.py).")
    source_root: str | None = Field(
        default=None, description="Where the patched sources are (required with files).")
    site_root: str | None = Field(
        default=None, description="Where they are installed; unset: the directory the engine imports "
        "vllm from (the parent of the imported package), so the copy compared is the one that runs.")
    import_root: str = Field(
        description="The directory `import vllm` must resolve to in the engine's interpreter "
        "(the package directory, e.g. /src/vllm); ${APPLIANCE_HOME} is substituted.")

    @field_validator("files")
    @classmethod
    def _relative(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        bad = [f for f in value if not f or f.startswith("/") or ".." in f.split("/")]
        if bad:
            raise ValueError(
                f"deployment files are relative to the source and site roots, without '..': {bad}")
        return value

    @model_validator(mode="after")
    def _source_for_files(self) -> DeploymentCheck:
        if self.files and self.source_root is None:
            raise ValueError("deployment files need a source_root to compare against")
        return self

    def expanded(self, home: str) -> DeploymentCheck:
        """With ${APPLIANCE_HOME} substituted (the only placeholder recipes may use)."""
        def sub(text: str | None) -> str | None:
            return None if text is None else text.replace(HOME_PLACEHOLDER, home.rstrip("/") or "/")
        return self.model_copy(update={
            "source_root": sub(self.source_root), "site_root": sub(self.site_root),
            "import_root": sub(self.import_root) or self.import_root})


class Expectations(Strict):
    ready_budget_s: int = Field(ge=10, description="How long a start may take before it is a failure.")
    stall_window_s: int = Field(
        default=600, ge=10, description="No progress and no CPU for this long = stalled."
    )
    decode_ms_per_token: float | None = Field(default=None, gt=0)
    reproducibility: Reproducibility = Reproducibility.VARIES
    min_mem_available_gib: float | None = Field(default=None, ge=0)
    warm_restart: bool = Field(
        default=False, description="Warm the compile cache on an empty root, then restart (DOMAIN §4)."
    )
    notes: str = ""
    # --- kernel-path and deployment proof (DOMAIN §7; owned by controller/evaluation/) ---
    # Checked at ready and kept with the launch; a missing marker or a digest mismatch is a warning
    # at ready and fails `appliance compare` (controller/evaluation/proof.py).
    markers: tuple[str, ...] = Field(
        default=(), description="Log text that proves the intended path ran (e.g. a '… selected.' line)."
    )
    checksums: dict[str, str] = Field(
        default_factory=dict,
        description="Engine-side file path → its md5 (32 hex) or sha256 (64 hex) digest (e.g. "
        "_C_stable_libtorch, never to be rolled back; the seed records md5).",
    )
    forbidden_markers: tuple[str, ...] = Field(
        default=(),
        description="Log text that must not appear (beyond the defaults every launch is checked for: "
        "a Python traceback, a dead engine core).",
    )
    eager_twin: str | None = Field(
        default=None,
        description="The eager recipe (same weights, dtype and sampling) whose token streams stand for "
        "this one in the gate's token-stream steps when its text varies across restarts (a graph "
        "arm; DOMAIN §7). Without it `appliance compare` derives one (same model and mode eager).",
    )
    slo: dict[str, TierSlo] = Field(
        default_factory=dict,
        description="Optional absolute SLO targets per benchmark tier (4-8K, 8-16K, 16-32K), for goodput.",
    )
    deployment: DeploymentCheck | None = Field(
        default=None, description="Seed 004 §7's file-by-file deployment check, run in the engine's "
        "own interpreter after ready; a mismatch fails the proof (controller/evaluation/deployment.py).")

    @field_validator("checksums")
    @classmethod
    def _digests(cls, value: dict[str, str]) -> dict[str, str]:
        bad = sorted(p for p, d in value.items() if not re.fullmatch(r"[0-9a-fA-F]{32}|[0-9a-fA-F]{64}", d))
        if bad:
            raise ValueError(
                f"checksums must be md5 (32 hex characters) or sha256 (64 hex characters) digests: {bad}"
            )
        return {p: d.lower() for p, d in value.items()}

    @model_serializer(mode="wrap")
    def _omit_no_deployment(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # A recipe without a deployment check dumps (and so diffs and hashes) exactly as before.
        data: dict[str, Any] = handler(self)
        if self.deployment is None:
            data.pop("deployment", None)
        return data

    @field_validator("slo")
    @classmethod
    def _slo_tiers(cls, value: dict[str, TierSlo]) -> dict[str, TierSlo]:
        unknown = sorted(set(value) - set(SLO_TIERS))
        if unknown:
            raise ValueError(f"slo names unknown tier(s) {unknown}; the tiers are {list(SLO_TIERS)}")
        return value


class CachePolicy(Strict):
    root: str = Field(description="Base directory; the per-variant root is derived under it.")
    triton_cache_dir: str | None = Field(
        default=None, description="A fixed Triton cache volume (DOMAIN §2); default: inside the variant root."
    )


class MemoryModel(Strict):
    """Inputs for host admission (DOMAIN §3). GiB unless named otherwise."""

    worker_anon_gib_eager: float = Field(ge=0)
    worker_anon_gib_graph: float = Field(ge=0)
    worker_file_gib_eager: float = Field(
        default=0.0, ge=0, description="Per-worker file-backed resident memory (RssFile) in eager mode."
    )
    worker_file_gib_graph: float = Field(
        default=0.0, ge=0, description="Per-worker RssFile in graph mode (S14: 0.19 eager / 1.27 GiB graph)."
    )
    overhead_gib: float = Field(ge=0, description="EngineCore + API server anonymous memory.")
    startup_transient_gib: float = Field(
        default=0.0, ge=0, description="Peak above steady state during warm-up (cold start)."
    )
    warm_transient_gib: float | None = Field(
        default=None, ge=0, description="Peak above steady state on a warm-cache start, if different."
    )
    page_cache_floor_gib: float = Field(
        default=0.6, ge=0, description="Page cache the host keeps even when squeezed (S14: ~600 MB)."
    )
    pinned_bytes_per_worker: int | None = Field(
        default=None,
        ge=0,
        description="Pinned host bytes per worker; None = max_num_seqs × max_model_len × 4 B.",
    )
    kv_cache_gib_included: float = Field(
        default=0.0, ge=0,
        description="CPU engines: the KV cache space (VLLM_CPU_KVCACHE_SPACE, GiB) the worker figures "
                    "were measured with. Admission adds any larger request on top (a CPU KV cache lives "
                    "in host RAM).",
    )


class Recipe(Strict):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")
    description: str = ""
    extends: str | None = None
    abstract: bool = Field(default=False, description="A base recipe that cannot be launched itself.")
    platform: Platform
    runtime: Runtime
    model: ModelSpec
    devices: tuple[int, ...] | None = Field(
        default=None, description="GPU indices → HIP_/CUDA_VISIBLE_DEVICES (always explicit on GPUs)."
    )
    engine: EngineArgs = Field(default_factory=EngineArgs)
    env: Environment = Field(default_factory=Environment)
    host: HostRequirements = Field(default_factory=HostRequirements)
    expect: Expectations
    cache: CachePolicy
    memory: MemoryModel | None = None

    @property
    def workers(self) -> int:
        return self.engine.tensor_parallel_size
