"""LaunchSpec: the exact, complete launch a recipe renders to. Pure data.

Runtimes (controller/runtime/) execute a LaunchSpec and nothing else, so what `appliance recipes
render` shows is exactly what runs. The spec hash labels the container/process so that a restarted
controller can adopt an engine it launched (and tell whether it is the same launch).
"""

from __future__ import annotations

import hashlib
import json
import shlex
from collections.abc import Sequence
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

from appliance import engine_argv

# Re-exported: render and the runtimes take the labels from here too.
from appliance.engine_names import LABEL_LAUNCH_ID as LABEL_LAUNCH_ID
from appliance.engine_names import LABEL_MANAGED as LABEL_MANAGED
from appliance.engine_names import LABEL_RECIPE as LABEL_RECIPE
from appliance.engine_names import LABEL_SPEC_HASH as LABEL_SPEC_HASH
from appliance.recipe.recipe_model import is_env_name
from appliance.runtimes import registry as runtime_registry
from appliance.runtimes.base import LaunchRuntime
from appliance.runtimes.base import Mount as Mount  # re-exported: callers build specs with it

if TYPE_CHECKING:
    RuntimeLaunch = LaunchRuntime
else:
    RuntimeLaunch = runtime_registry.launch_union()

# Environment variables render pins to directories (appliance/recipe/render.py): compile caches and, on the
# CPU, TMPDIR (inductor's C++ precompiled headers).
CACHE_DIR_ENV = ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TMPDIR")
# The engine facts a spec carries as typed fields. They are derived: render sets them
# from the same recipe fields it writes into argv, so argv already says each of them, and the spec
# hash leaves them out — it hashes what runs, and a launch hashes the same as before they existed
# (a restarted controller adopts engines by that hash; tests/unit/test_spec_hash_pins.py pins it).
DERIVED_FIELDS = frozenset({"model", "tensor_parallel_size", "listen"})
# What the spec hash does not cover: itself, the labels that carry it, and the derived facts.
HASH_EXCLUDE = frozenset({"spec_hash", "labels"}) | DERIVED_FIELDS


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Ulimit(Frozen):
    name: str
    soft: int  # -1 = unlimited
    hard: int


class Probes(Frozen):
    """How the supervisor decides the engine is ready: /health answers AND one real completion succeeds."""

    health_path: str = "/health"
    models_path: str = "/v1/models"
    completion_path: str = "/v1/chat/completions"
    completion_prompt: str = "Say OK."
    completion_max_tokens: int = 4


class LaunchSpec(Frozen):
    recipe: str
    spec_hash: str = Field(description="sha256 over everything below except labels; first 16 hex chars.")
    platform: str
    runtime: RuntimeLaunch = Field(
        description="The runtime kind's own launch options, discriminated by `kind` (appliance/runtimes/)."
    )
    workdir: str | None = None
    argv: tuple[str, ...] = Field(description="The engine command itself (without the sourcing wrapper).")
    source_files: tuple[str, ...] = ()
    env: dict[str, str]
    ulimits: tuple[Ulimit, ...] = ()
    memory_limit: None = Field(
        default=None, description="Always none: DOMAIN §3, a cgroup limit counts page cache and kills TP=4."
    )
    labels: dict[str, str] = Field(default_factory=dict)
    restart_policy: Literal["no"] = "no"  # the controller owns restarts
    host: str = Field(default="127.0.0.1", description="Where the controller reaches the engine.")
    port: int
    served_model_name: str
    served_model_aliases: tuple[str, ...] = Field(
        default=(), description="Other names the gateway accepts for the served model (the recipe's "
        "model.aliases) and rewrites to it; not the engine's (argv and env do not change). Left out of "
        "the dump, and so of the hash, when empty: a launch without aliases hashes as before.")
    # Derived facts (DERIVED_FIELDS): what the renders read instead of parsing argv.
    model: str | None = Field(
        default=None, description="The model as the engine is told (`serve MODEL` / `--model MODEL`): "
        "the recipe's model.path, expanded. Derived: not in the spec hash.")
    tensor_parallel_size: int = Field(
        default=1, ge=1, description="The recipe's engine.tensor_parallel_size (`--tensor-parallel-size`), "
        "the number of GPUs. Derived: not in the spec hash.")
    listen: str | None = Field(
        default=None, description="The address the engine binds (`--host`); `host` is where it is "
        "reached. Derived: not in the spec hash.")
    cache_root: str
    ready_budget_s: int
    stall_window_s: int
    probes: Probes = Field(default_factory=Probes)

    @model_serializer(mode="wrap")
    def _omit_no_aliases(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # tests/unit/test_spec_hash_pins.py and the golden renders pin launches without aliases.
        data: dict[str, Any] = handler(self)
        if not self.served_model_aliases:
            data.pop("served_model_aliases", None)
        return data

    @model_validator(mode="before")
    @classmethod
    def _migrate_flat_runtime(cls, data: Any) -> Any:
        """A launch record of an older controller has `runtime: "docker"|"process"` and the runtime's
        options as flat fields beside it (image, mounts, python, ...): move them into the sub-model.
        Flat fields the kind does not have were written empty (None, (), {}) and are dropped; a
        non-empty one is left where it is, so validation names it instead of losing it."""
        if not isinstance(data, dict) or not isinstance(data.get("runtime"), str):
            return data
        kind = data["runtime"]
        launch_fields = set(runtime_registry.plugin(kind).launch.model_fields) - {"kind"}
        out: dict[str, Any] = {}
        sub: dict[str, Any] = {"kind": kind}
        for key, value in data.items():
            if key in launch_fields:
                sub[key] = value
            elif key in _FLAT_LEGACY and key not in cls.model_fields and not value:
                continue
            elif key != "runtime":
                out[key] = value
        out["runtime"] = sub
        return out

    @model_validator(mode="before")
    @classmethod
    def _derive_facts(cls, data: Any) -> Any:
        """A spec built without the derived facts (a launch record written before them, a spec built
        by hand) gets them from its argv; render always sets them from the recipe."""
        if not isinstance(data, dict) or "argv" not in data or data.keys() >= DERIVED_FIELDS:
            return data
        found = engine_argv.facts_of(tuple(data["argv"]))
        return {**{k: v for k, v in found.items() if v is not None}, **data}

    @property
    def launcher(self) -> tuple[str, ...]:
        """The words of argv before the first flag (`vllm serve MODEL`, `python -c CODE serve MODEL`)."""
        return engine_argv.split(self.argv)[0]

    @property
    def flag_groups(self) -> tuple[tuple[str, ...], ...]:
        """The engine flags after the launcher, each with its values, in argv order."""
        return engine_argv.split(self.argv)[1]

    @property
    def kind(self) -> str:
        """The runtime kind (`runtime.kind`): the key of both runtime registries."""
        return self.runtime.kind

    @field_validator("env")
    @classmethod
    def _posix_env_names(cls, value: dict[str, str]) -> dict[str, str]:
        # Names go unquoted into `export NAME=…` and `-e NAME=…`; the recipe loader refuses bad ones,
        # and a spec read back from a record or built by hand must not bring them in another way.
        bad = sorted(name for name in value if not is_env_name(name))
        if bad:
            raise ValueError(f"env var names {bad} are not POSIX names ([A-Za-z_][A-Za-z0-9_]*)")
        return value

    def command(self) -> tuple[str, ...]:
        """The full command: source the platform env files first (DOMAIN §2), then exec the engine."""
        return self.sourced(self.argv)

    def sourced(self, argv: Sequence[str]) -> tuple[str, ...]:
        """`argv` run the way the engine is: after the platform env files are sourced (the Docker
        runtime runs its container wrapper so, in the interpreter the sourced env puts first)."""
        if not self.source_files:
            return tuple(argv)
        sources = " && ".join(f". {shlex.quote(f)}" for f in self.source_files)
        return ("bash", "-c", f'{sources} && exec "$@"', "engine", *argv)

    def cache_dirs(self) -> tuple[str, ...]:
        """The directories the env pins the compile caches to, sorted: they must exist before start.

        tempfile silently falls back to /tmp when TMPDIR does not exist (docs/engine-cpu.md), and a
        missing cache directory is created by each tool on its own terms, or not at all.
        """
        return tuple(sorted({self.env[k] for k in CACHE_DIR_ENV if k in self.env}))

    @property
    def base_url(self) -> str:
        """The URL the controller and the gateway (on the host) reach the engine at: a wildcard bind
        (a bridge container listens on 0.0.0.0 inside, published on loopback) is reached through
        loopback. The one URL function: probes, status, the gateway's upstream all use it."""
        host = self.host
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"
        return f"http://{host}:{self.port}"


# Every runtime option an old, flat launch record may carry (see LaunchSpec._migrate_flat_runtime).
_FLAT_LEGACY = runtime_registry.launch_field_names() | {
    "image", "python", "mounts", "devices", "gpus", "group_add", "ipc_mode", "shm_size", "network_mode",
    "security_opt", "published_ports",
}


def spec_hash(fields: dict[str, object]) -> str:
    """Stable content hash of the launch-relevant fields (sorted JSON)."""
    blob = json.dumps(fields, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
