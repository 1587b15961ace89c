"""The Runtime protocol: the one seam through which the controller touches engines.

Everything effectful about an engine — starting it, signalling it, reading its logs, finding it again
after a controller restart — goes through a Runtime. The supervisor's tests replace it with a fake;
the integration tests run the real ProcessRuntime (a real vLLM CPU engine) and DockerRuntime (a real
daemon). Methods are synchronous (the docker SDK is); the async supervisor driver calls them via
`asyncio.to_thread`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict

# Labels every engine launched by the appliance carries (re-exported for the runtimes).
from appliance.engine_names import LABEL_INSTANCE as LABEL_INSTANCE
from appliance.engine_names import LABEL_LAUNCH_ID as LABEL_LAUNCH_ID
from appliance.engine_names import LABEL_MANAGED as LABEL_MANAGED
from appliance.engine_names import LABEL_RECIPE as LABEL_RECIPE
from appliance.engine_names import LABEL_SPEC_HASH as LABEL_SPEC_HASH
from appliance.recipe.launch_spec import LaunchSpec
from appliance.runtimes import registry as runtime_registry


class EngineHandle(BaseModel):
    """How to find one running (or finished) engine again. Serialisable: stored in the launch record."""

    model_config = ConfigDict(frozen=True)

    launch_id: str
    runtime: str  # the runtime kind (LaunchSpec.kind): the key of controller/runtime/registry.py
    ref: str  # the runtime's own id: a PID (process), a container id (docker)...
    recipe: str
    spec_hash: str
    log_path: str | None = None
    started_at: float  # wall clock, seconds since the epoch
    # The appliance instance that launched it (LABEL_INSTANCE; controller/settings.instance_id); None:
    # launched by a controller that had none (an older controller), or a runtime built without one.
    instance: str | None = None

    @property
    def kind(self) -> str:
        """The runtime kind, as LaunchSpec.kind names it."""
        return self.runtime


class ExitInfo(BaseModel):
    """What the runtime knows about how an engine ended (or that it is still running)."""

    model_config = ConfigDict(frozen=True)

    running: bool
    exit_code: int | None = None
    signal: int | None = None  # the terminating signal, when known (process runtime; docker: code-128)
    oom_killed: bool | None = None  # docker's State.OOMKilled; None where the runtime cannot know
    # The runtime's own words for why it is not running, where it has them (kubernetes: a waiting
    # reason such as ImagePullBackOff, or an Unschedulable pod's scheduler message).
    reason: str | None = None


class Provenance(BaseModel):
    """Where the engine came from: an image (docker) or an interpreter and its packages (process).
    Stored in the launch record (controller/store.py) like the handle and the exit."""

    image: str | None = None
    image_id: str | None = None
    image_digest: str | None = None
    interpreter: str | None = None
    packages: dict[str, str] = {}


class EngineRuntimeError(Exception):
    """A runtime operation failed in a way the operator must see (image missing, daemon down...)."""


class RuntimeUnconfigured(EngineRuntimeError):
    """This host is not set up for the runtime at all (e.g. no cluster configuration). Not a fault
    at controller start — most hosts have no cluster — but the reason a recipe of that kind is refused."""


@runtime_checkable
class Runtime(Protocol):
    name: str

    def start(self, spec: LaunchSpec, launch_id: str, engine_key: str | None = None) -> EngineHandle:
        """Launch the engine exactly as the spec says, its port proven free first (PortInUse).
        `engine_key` (the per-launch engine API key) reaches vLLM as a 0600 config file given with
        `--config` at a path that is the same for every launch of the variant
        (appliance/engine_secret.py) — never argv, the environment (a `VLLM_*` variable can enter
        vLLM's compile-cache hash), records or logs. Returns at once; readiness is the
        supervisor's job."""
        ...

    def stop(self, handle: EngineHandle, grace_s: float) -> ExitInfo:
        """TERM, wait up to grace_s, then KILL — by PID / container id, never by pattern."""
        ...

    def inspect(self, handle: EngineHandle) -> ExitInfo:
        """Non-blocking: is it running; if not, how did it end."""
        ...

    def wait(self, handle: EngineHandle, timeout_s: float) -> ExitInfo:
        """Block up to timeout_s for the engine to end; returns running=True on timeout. Event-driven
        where the runtime can be (the supervisor's death notice: within about a second)."""
        ...

    def read_engine_key(self, handle: EngineHandle) -> str | None:
        """The key the running engine was given (read back by a controller that adopted the engine
        after a restart): from its key file, or from `VLLM_API_KEY` for an engine an older
        controller started; None when unknown."""
        ...

    def read_logs(self, handle: EngineHandle, offset: int) -> tuple[str, int]:
        """Log text appended since byte offset `offset`, and the new offset (poll-based streaming)."""
        ...

    def adopt(self) -> list[EngineHandle]:
        """Engines this appliance instance launched that are still running (by label or PID file):
        a runtime built with an instance id returns only engines labelled with it (another
        appliance may share the daemon or the namespace)."""
        ...

    def engine_pids(self, handle: EngineHandle) -> list[int]:
        """Host PIDs of the engine's processes (for memory watch and OOM attribution)."""
        ...

    def cpu_seconds(self, handle: EngineHandle) -> float:
        """Total CPU time of the engine's processes so far (stall detection: no progress AND no CPU)."""
        ...


# -- optional capabilities: a runtime has them or not; callers check with isinstance(rt, Capability)
# (never the runtime's class), so test fakes need not grow every method.


@runtime_checkable
class ContainerScoped(Protocol):
    def container_id(self, handle: EngineHandle) -> str | None:
        """The container whose cgroup the host watch attributes memory and OOM kills to; None when
        the engine runs in no container of its own."""
        ...


@runtime_checkable
class ProvenanceSource(Protocol):
    def provenance(self, spec: LaunchSpec) -> Provenance:
        """Where the engine comes from (image id and digest, or interpreter and package versions).
        Raises ValueError when it cannot be told (recorded as unknown)."""
        ...


@runtime_checkable
class EngineFiles(Protocol):
    def engine_file(self, handle: EngineHandle, path: str) -> bytes:
        """A file as the engine sees it (inside its container); raises on any failure to read."""
        ...


@runtime_checkable
class EngineExec(Protocol):
    def engine_exec(
        self, spec: LaunchSpec, handle: EngineHandle, argv: Sequence[str], timeout_s: float
    ) -> tuple[int | None, str]:
        """Run `argv` where the engine runs (its host or its container), with its environment, for at
        most `timeout_s`: (exit code, or None when it ran out of time; stdout and stderr). Raises
        EngineRuntimeError when it cannot be run at all. Never touches the engine itself."""
        ...


def host_cache_dirs(spec: LaunchSpec) -> list[Path]:
    """Host paths of the compile-cache directories the engine's env points at.

    They must exist before start: tempfile silently falls back to /tmp when TMPDIR is missing, and
    inductor then writes its 149 MB of headers to the shared /tmp (docs/engine-cpu.md), breaking the
    per-variant cache isolation. For a container, a path under a mount target maps to the mount's
    host source; a path on no mount lives in the container layer and is not ours to create.
    """
    return [Path(p) for p in runtime_registry.for_spec(spec).host_cache_dirs(spec)]


def ensure_cache_dirs(spec: LaunchSpec) -> None:
    for path in host_cache_dirs(spec):
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise EngineRuntimeError(f"cannot create the compile-cache directory {path}: {exc}") from exc
