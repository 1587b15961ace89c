"""LaunchSpec: the exact, complete launch a recipe renders to. Pure data.

Runtimes (controller/runtime/) execute a LaunchSpec and nothing else, so what `appliance recipes
render` shows is exactly what runs. The spec hash labels the container/process so that a restarted
controller can adopt an engine it launched (and tell whether it is the same launch).
"""

from __future__ import annotations

import hashlib
import json
import shlex
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from appliance.recipe_model import is_env_name
from appliance.runtimes import registry as runtime_registry
from appliance.runtimes.base import LaunchRuntime
from appliance.runtimes.base import Mount as Mount  # re-exported: callers build specs with it

if TYPE_CHECKING:
    RuntimeLaunch = LaunchRuntime
else:
    RuntimeLaunch = runtime_registry.launch_union()

# Labels every engine launched by the appliance carries (docker labels; the PID file holds the same).
# Defined here because render writes them and `appliance` may not import `controller`;
# controller/runtime/base.py must keep the same strings.
LABEL_MANAGED = "appliance.managed"
LABEL_LAUNCH_ID = "appliance.launch_id"
LABEL_RECIPE = "appliance.recipe"
LABEL_SPEC_HASH = "appliance.spec_hash"
# Environment variables render pins to directories (appliance/render.py): compile caches and, on the
# CPU, TMPDIR (inductor's C++ precompiled headers).
CACHE_DIR_ENV = ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TMPDIR")


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
    host: str = "127.0.0.1"
    port: int
    served_model_name: str
    cache_root: str
    ready_budget_s: int
    stall_window_s: int
    probes: Probes = Field(default_factory=Probes)

    @model_validator(mode="before")
    @classmethod
    def _migrate_flat_runtime(cls, data: Any) -> Any:
        """A launch record written before issue 13 has `runtime: "docker"|"process"` and the runtime's
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
        if not self.source_files:
            return self.argv
        sources = " && ".join(f". {shlex.quote(f)}" for f in self.source_files)
        return ("bash", "-c", f'{sources} && exec "$@"', "engine", *self.argv)

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
