"""DockerRuntime: the Docker runtime's effectful half — the engine in a container, created with
exactly the LaunchSpec's options.

The create arguments are the docker plug-in's one translation (appliance/runtimes/docker.py
`container_kwargs`, also what `appliance recipes render --format docker-py` prints); only the SDK's
own types are made here (`to_sdk`). What matters is what the container is *created* with, because
some of it cannot be fixed later:

- **No memory limit** (DOMAIN §3): a cgroup limit counts page cache, so 29 GB of mmapped weights plus
  four TP workers hit it; and `docker update --memory=0` means "unchanged", not "unlimited". The
  create call never passes `mem_limit`/`memswap_limit` (HostConfig.Memory = MemorySwap = 0).
- **`memlock` ulimit** (DOMAIN §3, S11f §10.1): pinned host buffers need `--ulimit memlock=-1`; the
  hard limit cannot be raised inside the container. -1 is passed through as -1 (= unlimited).
- **Restart policy `no`**: the controller owns restarts (backoff, diagnosis); a daemon restarting the
  engine behind its back would hide OOM loops.
- Published ports bind to 127.0.0.1 unless configured: clients come in through the gateway.
- The entrypoint is set explicitly to the spec's command (argv[0] as entrypoint, the rest as cmd), so
  an image ENTRYPOINT can never silently wrap what `appliance recipes render` shows.
- **No key in the daemon's log.** The command runs under the container wrapper
  (controller/runtime/container_wrapper.py), PID 1 in the image's own `python -I -S`: it copies the
  engine's stdout/stderr through the key redaction, so the daemon's json log on disk
  (/var/lib/docker/containers/ID/ID-json.log) never holds the engine key that vLLM 0.26 prints in
  `non-default args`; it relays TERM/INT to the engine and exits with its status (128+N for a
  signal). Its files are put into the created container like the key file (`put_wrapper_files`).
  An image without `python` is refused at the start, saying why.
- NVIDIA cards (`gpus`, docker's `--gpus` syntax) become a DeviceRequest; gfx906 cards are
  plain device nodes (`/dev/kfd`, `/dev/dri`) in `devices` (LaunchSpec.runtime).
- The environment is exactly the spec's — plus whatever ENV the image itself declares (the daemon
  merges image ENV under the container's; the spec's values win).

The daemon is reached lazily, so a controller whose recipes all use the process runtime starts even
when no daemon runs; every daemon failure surfaces as EngineRuntimeError with an operator-readable message.
"""

from __future__ import annotations

import importlib.util
import io
import logging
import math
import re
import tarfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import docker
import docker.errors
import psutil
import requests
from docker.models.containers import Container
from docker.types import DeviceRequest, Ulimit

from appliance.engine_names import ENGINE_KEY_ENV
from appliance.engine_secret import (
    CONTAINER_KEY_DIR,
    CONTAINER_KEY_PATH,
    KEY_FILE_NAME,
    key_from_config,
)
from appliance.engine_secret import config_yaml as key_config_yaml
from appliance.recipe.launch_spec import LaunchSpec
from appliance.runtimes import docker as docker_plugin
from appliance.runtimes.docker import translate_source as translate_source  # re-exported (tests)
from controller.runtime.base import (
    LABEL_INSTANCE,
    LABEL_LAUNCH_ID,
    LABEL_MANAGED,
    LABEL_RECIPE,
    LABEL_SPEC_HASH,
    EngineHandle,
    EngineRuntimeError,
    ExitInfo,
    Provenance,
    ensure_cache_dirs,
)
from controller.runtime.log_offsets import slice_log
from controller.runtime.ports import PortCheck, ensure_port_free
from controller.runtime.registry import RuntimeContext

LEGACY_KEY_ENV = ENGINE_KEY_ENV  # where older controllers put the key: read back still

log = logging.getLogger(__name__)

# Hints for start failures the daemon reports in its own words (matched on its explanation text).
_START_HINTS: tuple[tuple[str, str], ...] = (
    (
        "rlimit type 8",
        "the daemon may not raise RLIMIT_MEMLOCK (memlock): dockerd lacks CAP_SYS_RESOURCE or its own "
        "hard memlock limit is lower (systemd LimitMEMLOCK=infinity on the docker unit); DOMAIN §3 needs "
        "memlock=-1 for pinned host memory — or lower --max-model-len",
    ),
    ("error gathering device information", "a device in the spec does not exist on this host"),
    ("Unable to find group", "group_add names need an /etc/group entry in the image; use numeric GIDs"),
    ("port is already allocated", "another process already publishes that host port (the previous engine?)"),
    (f'"{docker_plugin.ENGINE_PYTHON}": executable file not found',
     f"the image has no `{docker_plugin.ENGINE_PYTHON}` on PATH: the appliance runs every engine container "
     "under its key-redacting wrapper (controller/runtime/container_wrapper.py) in the image's own "
     "interpreter, so that the daemon's log on disk never holds the engine key; build the image with "
     "the engine's python first on PATH"),
)


def container_name(launch_id: str) -> str:
    try:
        return docker_plugin.container_name(launch_id)
    except ValueError as exc:
        raise EngineRuntimeError(str(exc)) from None


# The hostname/hosts/resolv.conf files docker bind-mounts into every container it runs live under
# <data-root>/containers/<id>/: the one reliable trace of our own container id in /proc/self/mountinfo
# (HOSTNAME is the host's name under network_mode: host; cgroup v2 namespaces hide /docker/<id>).
_OWN_ID = re.compile(r"/containers/([0-9a-f]{64})/(?:hostname|hosts|resolv\.conf)\s")


def own_container_id(mountinfo: str) -> str | None:
    """The id of the container this process runs in, from /proc/self/mountinfo; None on a host."""
    match = _OWN_ID.search(mountinfo)
    return match.group(1) if match else None


def container_create_kwargs(
    spec: LaunchSpec,
    launch_id: str,
    publish_address: str = "127.0.0.1",
    host_mounts: Sequence[tuple[str, str]] = (),
    *,
    key_file: bool = False,
    wrapped: bool = False,
) -> dict[str, Any]:
    """Keyword arguments for `client.containers.create`: the docker plug-in's one translation
    (`appliance.runtimes.docker.container_kwargs`, what `render --format docker-py` prints), with
    its plain ulimit and device-request dicts made SDK types here, at the SDK edge."""
    try:
        kwargs = docker_plugin.container_kwargs(spec, launch_id, publish_address, host_mounts,
                                                key_file=key_file, wrapped=wrapped)
    except ValueError as exc:
        raise EngineRuntimeError(str(exc)) from None
    return to_sdk(kwargs)


def _wrapper_tar(under: str = "") -> bytes:
    """A tar of the container wrapper and the modules it imports (WRAPPER_MODULES), at their source
    tree paths under `[under/]appliance-wrapper`, with an empty `appliance/__init__.py` (a package
    marker: the wrapper needs no more of the package). Directories 0755 and files 0444, root's:
    readable by any image user, writable by none."""
    root = docker_plugin.WRAPPER_ROOT.rsplit("/", 1)[1]
    if under:
        root = f"{under}/{root}"
    files: dict[str, bytes] = {"appliance/__init__.py": b""}
    for module in docker_plugin.WRAPPER_MODULES:
        found = importlib.util.find_spec(module)
        if found is None or found.origin is None:
            raise EngineRuntimeError(f"the container wrapper's module {module} is not installed here")
        files[module.replace(".", "/") + ".py"] = Path(found.origin).read_bytes()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        folders = sorted({root} | {f"{root}/{'/'.join(name.split('/')[:i])}" for name in files
                                   for i in range(1, name.count("/") + 1)})
        if under:
            folders.insert(0, under)
        for folder in folders:
            entry = tarfile.TarInfo(folder)
            entry.type, entry.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(entry)
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(f"{root}/{name}")
            info.size, info.mode = len(data), 0o444
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _key_tar(key: str, folder: str, uid: int, gid: int, numeric: bool, under: str = "") -> bytes:
    """A tar of `[under/]folder/engine-key.yaml` (`under` created 0755 root when given)."""
    data = key_config_yaml(key).encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        if under:
            top = tarfile.TarInfo(under)
            top.type, top.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(top)
            folder = f"{under}/{folder}"
        entry = tarfile.TarInfo(folder)
        entry.type, entry.uid, entry.gid = tarfile.DIRTYPE, uid, gid
        entry.mode = 0o700 if numeric else 0o755
        tar.addfile(entry)
        info = tarfile.TarInfo(f"{folder}/{KEY_FILE_NAME}")
        info.size, info.mode, info.uid, info.gid = len(data), 0o400 if numeric else 0o444, uid, gid
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _container_file(container: Container, path: str) -> bytes:
    """A regular file of the container, through the Engine API's archive download."""
    stream, _ = container.get_archive(path)
    with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
        member = tar.next()
        data = tar.extractfile(member) if member is not None else None
        if data is None:
            raise FileNotFoundError(f"{path}: not a regular file in container {container.short_id}")
        return data.read()


def _key_of_container(container: Container) -> str | None:
    try:
        return key_from_config(_container_file(container, CONTAINER_KEY_PATH).decode(errors="replace"))
    except (docker.errors.NotFound, FileNotFoundError):
        pass  # no key file: an engine started by an older controller, or a recipe with its own key
    for item in container.attrs.get("Config", {}).get("Env") or []:
        name, sep, value = str(item).partition("=")
        if sep and name == LEGACY_KEY_ENV:
            return value
    return None


def to_sdk(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Plain create kwargs → the docker SDK's types where it has them (Ulimit, DeviceRequest)."""
    out = dict(kwargs)
    if "ulimits" in out:
        out["ulimits"] = [Ulimit(**u) for u in out["ulimits"]]
    if "device_requests" in out:
        out["device_requests"] = [DeviceRequest(**r) for r in out["device_requests"]]
    return out


def _parse_docker_time(value: str) -> float:
    """Docker's RFC 3339 timestamps carry nanoseconds, which `fromisoformat` rejects: cut to micro."""
    match = re.match(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)$", value)
    if not match:
        raise ValueError(f"unexpected docker timestamp {value!r}")
    frac = (match.group(2) or ".0")[:7]
    zone = "+00:00" if match.group(3) == "Z" else match.group(3)
    return datetime.fromisoformat(match.group(1) + frac + zone).timestamp()


def exit_info(state: dict[str, Any]) -> ExitInfo:
    """`State` of `docker inspect` → ExitInfo (pure)."""
    oom = bool(state.get("OOMKilled", False))
    if state.get("Running") or state.get("Restarting"):
        # OOMKilled can already be true while PID 1 lives: a worker was killed by the cgroup OOM killer.
        return ExitInfo(running=True, oom_killed=oom)
    if state.get("Status") == "created":
        return ExitInfo(running=False, oom_killed=oom)  # never started: there is no exit code
    code = int(state.get("ExitCode", 0))
    # Docker reports "killed by signal N" as 128+N (base.ExitInfo); above 128+64 it is a plain code.
    sig = code - 128 if 128 < code <= 128 + 64 else None
    return ExitInfo(running=False, exit_code=code, signal=sig, oom_killed=oom)


def api_failure(action: str, exc: docker.errors.APIError) -> EngineRuntimeError:
    """The daemon's own explanation of a failed call, plus a hint where we know one."""
    explanation = str(exc.explanation or exc)
    return EngineRuntimeError(f"docker: {action} failed: {explanation}{_hint(explanation)}")


def _hint(explanation: str) -> str:
    for needle, hint in _START_HINTS:
        if needle in explanation:
            return f" — {hint}"
    return ""


def make(ctx: RuntimeContext) -> DockerRuntime:
    """The registry's factory (controller/runtime/registry.py)."""
    return DockerRuntime(instance_id=ctx.instance_id)


class DockerRuntime:
    """Runs LaunchSpecs of kind `docker` through the docker SDK (never the CLI)."""

    name = "docker"

    def __init__(
        self,
        client: docker.DockerClient | None = None,
        *,
        publish_address: str = "127.0.0.1",
        kill_wait_s: float = 30.0,
        instance_id: str | None = None,
        port_check: PortCheck = ensure_port_free,
        redacting_wrapper: bool = True,
    ) -> None:
        """`publish_address`: host address published ports bind to. `kill_wait_s`: how long to wait
        for the container to end after the KILL that follows an unsuccessful `docker stop`.
        `instance_id`: this appliance's id (LABEL_INSTANCE on every container; adopt() takes only
        containers that carry it: another appliance may use the same daemon). None: unscoped.
        `port_check`: proves a host port free before the start (PortInUse otherwise); a seam so that
        tests with a fake daemon do not depend on what holds the host's real ports.
        `redacting_wrapper`: run the engine under the container wrapper (the module docstring).
        False only for images without Python (the busybox images of the container-option tests):
        then the daemon's json log on disk holds whatever the engine prints, keys included."""
        self._client = client
        self.redacting_wrapper = redacting_wrapper
        self._port_check = port_check
        self.instance_id = instance_id
        self.publish_address = publish_address
        self._kill_wait_s = kill_wait_s
        self._host_mounts: list[tuple[str, str]] | None = None
        self.mountinfo = Path("/proc/self/mountinfo")

    def host_mounts(self) -> list[tuple[str, str]]:
        """(destination, host source) of this controller's own bind and volume mounts when it runs
        in a container managed by the same daemon; [] on a host. Looked up once."""
        if self._host_mounts is None:
            try:
                own = own_container_id(self.mountinfo.read_text())
            except OSError:
                own = None
            mounts: list[tuple[str, str]] = []
            if own is not None:
                with self._daemon(f"inspect the controller's own container {own[:12]}"):
                    try:
                        attrs = self.client.api.inspect_container(own)
                    except docker.errors.NotFound:
                        attrs = {"Mounts": []}  # another daemon's container: paths pass through
                mounts = [(str(m["Destination"]), str(m["Source"])) for m in attrs.get("Mounts") or []
                          if m.get("Type") in ("bind", "volume") and m.get("Source")]
            self._host_mounts = mounts
        return self._host_mounts

    @contextmanager
    def _daemon(self, action: str, *, pass_not_found: bool = True) -> Iterator[None]:
        """Translate docker SDK failures into EngineRuntimeError naming what we were doing.
        NotFound passes through unless told otherwise: "the container is gone" is a state the
        callers handle; "no such network" while creating is an error."""
        try:
            yield
        except docker.errors.NotFound as exc:
            if pass_not_found:
                raise
            raise api_failure(action, exc) from exc
        except docker.errors.APIError as exc:
            raise api_failure(action, exc) from exc
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            raise EngineRuntimeError(
                f"docker: cannot {action}: the Docker daemon is not reachable ({exc}); "
                "start it (bash scripts/start-dockerd.sh) or check DOCKER_HOST"
            ) from exc

    @property
    def client(self) -> docker.DockerClient:
        if self._client is None:
            with self._daemon("connect to the daemon"):
                self._client = docker.from_env()
        return self._client

    def _container(self, handle: EngineHandle) -> Container | None:
        with self._daemon(f"inspect container {handle.ref[:12]}"):
            try:
                return self.client.containers.get(handle.ref)
            except docker.errors.NotFound:
                return None

    # -- start ---------------------------------------------------------------------------------

    def create(self, spec: LaunchSpec, launch_id: str, engine_key: str | None = None) -> Container:
        """Create (not start) the engine container, its key file in place (`put_key_file`).
        Separate from start() so that tests and `plan`-like tooling can `docker inspect` exactly
        what would run."""
        kwargs = container_create_kwargs(spec, launch_id, self.publish_address, self.host_mounts(),
                                         key_file=engine_key is not None, wrapped=self.redacting_wrapper)
        if self.instance_id is not None:
            kwargs["labels"] = {**kwargs["labels"], LABEL_INSTANCE: self.instance_id}
        with self._daemon(f"look up image {kwargs['image']}"):
            try:
                self.client.images.get(kwargs["image"])
            except docker.errors.ImageNotFound:
                raise EngineRuntimeError(
                    f"image {kwargs['image']!r} is not present on this host and the appliance never pulls "
                    "(no registry is assumed): build or `docker load` it first — see images/README.md"
                ) from None
        with self._daemon(f"create container {kwargs['name']}", pass_not_found=False):
            container = self.client.containers.create(**kwargs)
        try:
            if self.redacting_wrapper:
                self.put_wrapper_files(container)
            if engine_key is not None:
                self.put_key_file(container, engine_key)
        except EngineRuntimeError:
            with self._daemon(f"remove container {container.name} that got no key or wrapper file"):
                container.remove(force=True)
            raise
        return container

    def put_wrapper_files(self, container: Container) -> None:
        """The container wrapper and its two modules into the created (not yet started) container,
        under WRAPPER_ROOT, through the Engine API's archive upload (as `put_key_file`). An image
        without `/run` gets one, 0755 root."""
        parent = docker_plugin.WRAPPER_ROOT.rsplit("/", 1)[0]
        with self._daemon(f"put the container wrapper into {container.name}", pass_not_found=False):
            try:
                done = container.put_archive(parent or "/", _wrapper_tar())
            except docker.errors.NotFound:  # no such parent in the image: create it from the root
                done = container.put_archive("/", _wrapper_tar(under=parent.strip("/")))
            if not done:
                raise EngineRuntimeError(f"the daemon refused the container wrapper for {container.name}")

    def put_key_file(self, container: Container, key: str) -> None:
        """The key's vLLM config file into the created (not yet started) container, through the
        Engine API's archive upload: no host path to share (the controller may itself run in a
        container), nothing in the environment or `docker inspect`. Owned by the image's user when
        it is numeric, else by root; 0400 — a named user (not resolvable here) gets 0444: inside the
        container only the engine runs. An image without `/run` (busybox) gets one, 0755 root as
        everywhere else."""
        user = str(container.attrs.get("Config", {}).get("User") or "0")
        uid_text, _, gid_text = user.partition(":")
        numeric = uid_text.isdigit() and (not gid_text or gid_text.isdigit())
        uid = int(uid_text) if numeric else 0
        gid = int(gid_text) if numeric and gid_text else 0
        parent, name = CONTAINER_KEY_DIR.rsplit("/", 1)
        with self._daemon(f"put the engine key file into {container.name}", pass_not_found=False):
            try:
                done = container.put_archive(parent or "/", _key_tar(key, name, uid, gid, numeric))
            except docker.errors.NotFound:  # no such parent in the image: create it from the root
                done = container.put_archive(
                    "/", _key_tar(key, name, uid, gid, numeric, under=parent.strip("/")))
            if not done:
                raise EngineRuntimeError(f"the daemon refused the engine key file for {container.name}")

    def start(self, spec: LaunchSpec, launch_id: str, engine_key: str | None = None) -> EngineHandle:
        rt = spec.runtime
        if not isinstance(rt, docker_plugin.DockerLaunch):
            raise EngineRuntimeError(
                f"recipe {spec.recipe!r} renders for the {rt.kind!r} runtime, not 'docker'"
            )
        ensure_cache_dirs(spec)
        # Prove the host port free first (an orphan on it once answered the next launch's probes).
        if rt.network_mode == "host":  # the engine binds the host's port itself
            self._port_check(spec.host, spec.port)
        elif rt.network_mode != "none":
            for host_port in rt.published_ports.values():
                self._port_check(self.publish_address, host_port)
        container = self.create(spec, launch_id, engine_key)
        try:
            with self._daemon(f"start container {container.name}"):
                container.start()
                container.reload()
        except EngineRuntimeError:
            # It never ran: remove it (by id) so that the error is the record, not a dead container
            # holding the name.
            with self._daemon(f"remove container {container.name} that failed to start"):
                container.remove(force=True)
            raise
        started = container.attrs["State"].get("StartedAt", "")
        log.info("started %s (launch %s) as container %s", spec.recipe, launch_id, container.short_id)
        return EngineHandle(
            launch_id=launch_id,
            runtime=self.name,
            ref=str(container.id),
            recipe=spec.recipe,
            spec_hash=spec.spec_hash,
            log_path=None,
            started_at=_parse_docker_time(started) if started else time.time(),
            instance=self.instance_id,
        )

    # -- state ---------------------------------------------------------------------------------

    def inspect(self, handle: EngineHandle) -> ExitInfo:
        container = self._container(handle)
        if container is None:
            return ExitInfo(running=False)  # removed behind our back: how it ended is unknowable
        return exit_info(container.attrs["State"])

    def wait(self, handle: EngineHandle, timeout_s: float) -> ExitInfo:
        # Polling inspect rather than the blocking /wait endpoint: a socket timeout there is
        # indistinguishable from a daemon that stopped answering.
        deadline = time.monotonic() + timeout_s
        delay = 0.05
        while True:
            info = self.inspect(handle)
            if not info.running or time.monotonic() >= deadline:
                return info
            time.sleep(min(delay, max(deadline - time.monotonic(), 0.0)))
            delay = min(delay * 2, 0.5)  # a death is seen within half a second

    def stop(self, handle: EngineHandle, grace_s: float) -> ExitInfo:
        """`docker stop` (TERM to PID 1, `grace_s`, then KILL — by the daemon), then our own KILL if
        the container is somehow still running."""
        container = self._container(handle)
        if container is None:
            return ExitInfo(running=False)
        try:
            with self._daemon(f"stop container {container.name}"):
                container.stop(timeout=math.ceil(grace_s))
        except docker.errors.NotFound:
            return ExitInfo(running=False)
        info = self.wait(handle, 1.0)
        if info.running:
            log.warning("container %s still running after docker stop: KILL", container.short_id)
            try:
                with self._daemon(f"kill container {container.name}"):
                    container.kill()
            except docker.errors.NotFound:
                return ExitInfo(running=False)
            info = self.wait(handle, self._kill_wait_s)
        return info

    # -- logs, adoption, accounting ------------------------------------------------------------

    def read_logs(self, handle: EngineHandle, offset: int) -> tuple[str, int]:
        """The container's stdout+stderr after byte `offset`. The daemon only serves whole logs, so
        each poll fetches all of it (an engine start logs well under a megabyte)."""
        container = self._container(handle)
        if container is None:
            return "", offset
        with self._daemon(f"read logs of {container.name}"):
            try:
                blob = container.logs(stdout=True, stderr=True, timestamps=False)
            except docker.errors.NotFound:
                return "", offset
        return slice_log(blob, offset)

    def read_engine_key(self, handle: EngineHandle) -> str | None:
        """The running engine's key after a restart: its key file inside the container, or (a
        container an older controller started) `VLLM_API_KEY` in its environment."""
        container = self._container(handle)
        if container is None:
            return None
        return _key_of_container(container)

    def container_id(self, handle: EngineHandle) -> str | None:
        """The container the host watch reads the engine's cgroup of (ContainerScoped)."""
        return handle.ref

    def provenance(self, spec: LaunchSpec) -> Provenance:
        """The image's id and repo digest (ProvenanceSource); ValueError when the daemon cannot say."""
        image = spec.runtime.engine_image()
        if image is None:
            return Provenance()
        try:
            found = self.client.images.get(image)
        except (docker.errors.DockerException, EngineRuntimeError) as exc:
            # Recorded as unknown; the start itself reports a missing image with its own message.
            raise ValueError(f"image {image}: {exc}") from exc
        digests = found.attrs.get("RepoDigests") or []
        return Provenance(image=image, image_id=found.id, image_digest=digests[0] if digests else None)

    def engine_file(self, handle: EngineHandle, path: str) -> bytes:
        """A file as the engine sees it inside its container (EngineFiles)."""
        return _container_file(self.client.containers.get(handle.ref), path)

    def engine_exec(
        self, spec: LaunchSpec, handle: EngineHandle, argv: Sequence[str], timeout_s: float
    ) -> tuple[int | None, str]:
        """Run `argv` inside the engine's container (EngineExec): `docker exec`, which gets the
        container's environment. The SDK's exec has no timeout of its own, so coreutils `timeout`
        bounds it inside the container (exit 124: out of time; its KILL 5 s later if TERM is ignored)."""
        bounded = ["timeout", "-k", "5", str(max(1, math.ceil(timeout_s))), *argv]
        try:
            result = self.client.containers.get(handle.ref).exec_run(bounded, stdout=True, stderr=True)
        except (docker.errors.DockerException, requests.RequestException) as exc:
            raise EngineRuntimeError(f"cannot exec in container {handle.ref}: {exc}") from exc
        output = result.output or b""
        text = output.decode(errors="replace") if isinstance(output, bytes) else str(output)
        code = result.exit_code
        return (None if code in (124, 137) else code), text

    @staticmethod
    def engine_key_of(ref: str) -> str | None:
        """The key of container `ref`'s engine, for a CLI without a runtime object
        (controller/evaluation/bench_key.py); None when it cannot be read."""
        try:
            return _key_of_container(docker.from_env().containers.get(ref))
        except (docker.errors.DockerException, requests.RequestException):
            return None

    def adopt(self) -> list[EngineHandle]:
        """Running containers carrying the managed label — and this instance's id, when the runtime
        has one: another appliance's engines on the same daemon are not ours to adopt or stop."""
        with self._daemon("list managed containers"):
            containers = self.client.containers.list(
                filters={"label": f"{LABEL_MANAGED}=true", "status": "running"}
            )
        handles: list[EngineHandle] = []
        for container in containers:
            labels: dict[str, str] = container.labels
            # Unlabelled (launched before instance ids): handed to the driver, which adopts it only
            # when its launch is in this appliance's own records.
            if self.instance_id is not None and labels.get(LABEL_INSTANCE) not in (None, self.instance_id):
                log.info("container %s belongs to appliance instance %s, not this one (%s): not adopted",
                         container.short_id, labels.get(LABEL_INSTANCE, "(none)"), self.instance_id)
                continue
            if LABEL_LAUNCH_ID not in labels:
                log.warning(
                    "container %s has %s but no %s: not adopted",
                    container.short_id,
                    LABEL_MANAGED,
                    LABEL_LAUNCH_ID,
                )
                continue
            started = container.attrs["State"].get("StartedAt", "")
            handles.append(
                EngineHandle(
                    launch_id=labels[LABEL_LAUNCH_ID],
                    runtime=self.name,
                    ref=str(container.id),
                    recipe=labels.get(LABEL_RECIPE, ""),
                    spec_hash=labels.get(LABEL_SPEC_HASH, ""),
                    log_path=None,
                    started_at=_parse_docker_time(started) if started else 0.0,
                    instance=labels.get(LABEL_INSTANCE),
                )
            )
        return sorted(handles, key=lambda h: h.started_at)

    def _processes(self, handle: EngineHandle) -> list[psutil.Process]:
        container = self._container(handle)
        if container is None:
            return []
        pid = int(container.attrs["State"].get("Pid") or 0)
        if pid <= 0:
            return []  # not running
        try:
            root = psutil.Process(pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def engine_pids(self, handle: EngineHandle) -> list[int]:
        """Host PIDs: the container's PID 1 (State.Pid) and its descendants. State.Pid is in the
        daemon's PID namespace, so this is right when the controller runs on the host or in a
        container with the host's PID namespace (compose.yaml: `pid: host`)."""
        return sorted(p.pid for p in self._processes(handle))

    def cpu_seconds(self, handle: EngineHandle) -> float:
        """CPU time via psutil over the host PIDs (much cheaper than a `docker stats` round trip)."""
        total = 0.0
        for proc in self._processes(handle):
            try:
                t = proc.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += t.user + t.system + t.children_user + t.children_system
        return total


engine_key_of = DockerRuntime.engine_key_of  # the registry's by-ref reader (controller/runtime/registry.py)
