"""The Docker runtime's pure half: the engine in a container, and the one spec → container translation.

Its effectful half is controller/runtime/docker.py, which creates the container with exactly
`container_kwargs(spec, launch_id, ...)`: the `docker-py` render prints the same function's output,
and the `docker run` and compose renders are written from it too, so a hand-run container and the
appliance's own cannot drift apart. What the container is *created* with matters because
some of it cannot be fixed later:

- **No memory limit** (DOMAIN §3): a cgroup limit counts page cache, so 29 GB of mmapped weights plus
  four TP workers hit it; and `docker update --memory=0` means "unchanged", not "unlimited". No
  `mem_limit`/`memswap_limit` is ever passed.
- **`memlock` ulimit** (DOMAIN §3, S11f §10.1): pinned host buffers need `--ulimit memlock=-1`; the
  hard limit cannot be raised inside the container. -1 is passed through as -1 (= unlimited).
- **Restart policy `no`**: the controller owns restarts (backoff, diagnosis).
- Published ports bind to 127.0.0.1 unless configured: clients come in through the gateway.
- The entrypoint is the spec's command[0] and the rest is the container's command, so an image
  ENTRYPOINT can never silently wrap what `appliance recipes render` shows.
- The appliance's own containers (`wrapped=True`) run that command under the container wrapper
  (controller/runtime/container_wrapper.py, `wrapped_argv`): the image's `python -I -S` as PID 1
  copies the engine's output through the key redaction, so the daemon's json log on disk never
  holds the engine key (vLLM 0.26 prints it in `non-default args`). The renders for hand-run
  containers (`docker run`, compose, docker-py) do not: the wrapper's files are put into the
  container by the runtime, and the rendered text says what that means for the daemon's log.
- NVIDIA cards (`gpus`, docker's `--gpus` syntax) become a device request; gfx906 cards are plain
  device nodes (`/dev/kfd`, `/dev/dri`).
- A bridge container listens on 0.0.0.0 inside and is published on 127.0.0.1 (DOMAIN §5: 127.0.0.1
  inside → connection reset).

Everything here is plain data (dicts, lists, tuples): the SDK's own types (Ulimit, DeviceRequest)
are made from it at the SDK edge, in the effectful half.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import Field

from appliance.engine_names import LABEL_LAUNCH_ID, LABEL_MANAGED, LABEL_RECIPE, LABEL_SPEC_HASH
from appliance.engine_secret import CONTAINER_KEY_PATH, with_key_config
from appliance.recipe_terms import Finding, Platform
from appliance.runtimes.base import (
    Format,
    FormatError,
    LaunchRuntime,
    Mount,
    Placement,
    RuntimeSection,
    RuntimeTraits,
)

if TYPE_CHECKING:
    from appliance.host_facts import HostFacts
    from appliance.recipe.launch_spec import LaunchSpec
    from appliance.recipe.recipe_model import Recipe

LOOPBACK = "127.0.0.1"
# The interpreter the engine runs under in an image (`interpreter`) — and the container wrapper too:
# it is started after the platform env files are sourced, so it is the engine's own python.
ENGINE_PYTHON = "python"
# Where the runtime puts the container wrapper and the two modules it imports, laid out as in the
# source tree (the wrapper finds `appliance/` two levels above itself). Modules, by import name.
WRAPPER_ROOT = "/run/appliance-wrapper"
WRAPPER_MODULES = (
    "controller.runtime.container_wrapper", "appliance.engine_redact", "appliance.engine_names",
)
WRAPPER_SCRIPT = f"{WRAPPER_ROOT}/controller/runtime/container_wrapper.py"
# What every rendered hand-run container says about the daemon's log (no wrapper there).
HAND_RUN_LOG_NOTE = (
    "# run by hand, the engine's output goes unfiltered into the daemon's json log on disk (vLLM 0.26 "
    "prints an --api-key's value in `non-default args`); the appliance runs it under its key-redacting "
    "container wrapper (controller/runtime/container_wrapper.py)"
)
CONTAINER_PREFIX = "appliance-"
_NAME_OK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class DockerRuntime(RuntimeSection):
    """The recipe's `runtime: {kind: docker, ...}` section."""

    kind: Literal["docker"] = "docker"
    image: str
    digest: str | None = Field(default=None, pattern=r"^sha256:[0-9a-f]{64}$")
    # DOMAIN §1: the production engine runs on a bridge network; that is why `--host 0.0.0.0` matters.
    network: Literal["bridge", "host"] = "bridge"
    ipc: Literal["host", "private", "shareable"] = "host"
    shm_size: str | None = None
    group_add: tuple[str, ...] = ()
    device_paths: tuple[str, ...] = Field(
        default=(), description="Host device nodes passed through, e.g. /dev/kfd, /dev/dri."
    )
    security_opt: tuple[str, ...] = ()

    @property
    def image_ref(self) -> str:
        """The image as the daemon is asked for it: pinned by digest when the recipe gives one."""
        return f"{self.image}@{self.digest}" if self.digest else self.image


class DockerLaunch(LaunchRuntime):
    """LaunchSpec.runtime of a docker launch: the container's options, as rendered."""

    kind: Literal["docker"] = "docker"
    image: str
    mounts: tuple[Mount, ...] = ()
    devices: tuple[str, ...] = ()
    gpus: str | None = Field(
        default=None,
        description="NVIDIA device request (`--gpus all`); which cards is CUDA_VISIBLE_DEVICES in env.",
    )
    group_add: tuple[str, ...] = ()
    ipc_mode: str | None = None
    shm_size: str | None = None
    network_mode: str | None = None
    security_opt: tuple[str, ...] = ()
    published_ports: dict[int, int] = Field(default_factory=dict, description="container port → host port")

    def engine_image(self) -> str | None:
        return self.image


def _section(recipe: Recipe) -> DockerRuntime:
    section = recipe.runtime
    if not isinstance(section, DockerRuntime):
        raise TypeError(f"recipe {recipe.name!r} is not a docker recipe ({section.kind})")
    return section


def launch_of(spec: LaunchSpec, fmt: str = "docker") -> DockerLaunch:
    """The spec's docker options, or FormatError naming the formats that do apply."""
    rt = spec.runtime
    if not isinstance(rt, DockerLaunch):
        raise FormatError(f"format '{fmt}' needs a docker recipe; '{spec.recipe}' runs as a {rt.kind} "
                          f"(use --format shell or json)")
    return rt


# -- the one translation: spec → container ------------------------------------------------------


def container_name(launch_id: str) -> str:
    name = CONTAINER_PREFIX + launch_id
    if not _NAME_OK.match(name):
        raise ValueError(f"launch id {launch_id!r} cannot be part of a container name ([A-Za-z0-9_.-])")
    return name


def engine_labels(spec: LaunchSpec, launch_id: str) -> dict[str, str]:
    """The spec's labels plus the appliance's own (by which the runtime's `adopt()` finds it again)."""
    return {
        **spec.labels,
        LABEL_MANAGED: "true",
        LABEL_LAUNCH_ID: launch_id,
        LABEL_RECIPE: spec.recipe,
        LABEL_SPEC_HASH: spec.spec_hash,
    }


def translate_source(source: str, host_mounts: Sequence[tuple[str, str]]) -> str:
    """A path as this controller sees it → the path the daemon must bind.

    A containerised controller (compose.yaml) sees APPLIANCE_HOME through a volume mounted at
    /var/lib/appliance; the daemon that creates the sibling engine container resolves bind sources
    on the host, where the same files are under the volume's own directory
    (/var/lib/docker/volumes/<name>/_data). `host_mounts` is (destination, source) of our own mounts;
    the longest destination that contains `source` wins. On a host it is empty: paths pass through.
    """
    for dest, host_src in sorted(host_mounts, key=lambda m: len(m[0]), reverse=True):
        d = dest.rstrip("/") or "/"
        if source == d or source.startswith(d.rstrip("/") + "/"):
            return host_src.rstrip("/") + source[len(d.rstrip("/")):]
    return source


def gpu_request(gpus: str) -> dict[str, Any]:
    """`--gpus` syntax → a device request as the Engine API spells it (`all`, a count, `device=0,2`)."""
    request: dict[str, Any] = {"Driver": "", "Count": 0, "DeviceIDs": [], "Capabilities": [["gpu"]],
                               "Options": {}}
    if gpus == "all":
        return {**request, "Count": -1}
    if gpus.isdigit():
        return {**request, "Count": int(gpus)}
    if gpus.startswith("device="):
        return {**request, "DeviceIDs": gpus.removeprefix("device=").split(",")}
    raise ValueError(f"gpus={gpus!r} is not `all`, a count, or `device=ID,...` (docker --gpus syntax)")


def wrapped_argv(engine_argv: Sequence[str], *, key_file: bool) -> tuple[str, ...]:
    """The engine's argv under the container wrapper: `python -I -S WRAPPER [--key-file K] -- ARGV`.
    `-I`: the engine's PYTHONPATH/PYTHONHOME do not reach the wrapper; `-S`: no site-packages, so
    no `.pth` runs (the gfx906 image's torch-first one would import torch into it)."""
    key = ("--key-file", CONTAINER_KEY_PATH) if key_file else ()
    return (ENGINE_PYTHON, "-I", "-S", WRAPPER_SCRIPT, *key, "--", *engine_argv)


def container_kwargs(
    spec: LaunchSpec,
    launch_id: str,
    publish_address: str = LOOPBACK,
    host_mounts: Sequence[tuple[str, str]] = (),
    *,
    key_file: bool = False,
    wrapped: bool = False,
) -> dict[str, Any]:
    """Keyword arguments for docker SDK `client.containers.create(**kwargs)`, as plain data.

    `key_file`: the engine reads its per-launch API key from a vLLM config file that the runtime
    puts into the created container before it starts (appliance/engine_secret.py: `--config` at a
    path that is the same for every launch; never an environment variable) — renders
    never pass it. `wrapped`: the engine runs under the container wrapper (`wrapped_argv`), whose
    files the runtime puts into the container too — renders never pass it either.
    `host_mounts`: the controller's own mounts when it runs in a container
    (`translate_source`). Raises ValueError for a spec that cannot become a container.
    """
    rt = spec.runtime
    if not isinstance(rt, DockerLaunch):
        raise ValueError(f"recipe {spec.recipe!r} renders for the {rt.kind!r} runtime, not 'docker'")
    engine = with_key_config(spec.argv, CONTAINER_KEY_PATH) if key_file else spec.argv
    command = spec.sourced(wrapped_argv(engine, key_file=key_file) if wrapped else engine)
    kwargs: dict[str, Any] = {
        "image": rt.image,
        "name": container_name(launch_id),
        "entrypoint": [command[0]],
        "command": list(command[1:]),
        "environment": dict(spec.env),
        "labels": engine_labels(spec, launch_id),
        "volumes": [f"{translate_source(m.source, host_mounts)}:{m.target}:{'ro' if m.read_only else 'rw'}"
                    for m in rt.mounts],
        "devices": list(rt.devices),
        "group_add": list(rt.group_add),
        "security_opt": list(rt.security_opt),
        "ulimits": [{"Name": u.name, "Soft": u.soft, "Hard": u.hard} for u in spec.ulimits],
        "restart_policy": {"Name": spec.restart_policy},
        "detach": True,
        # Deliberately absent: mem_limit / memswap_limit (DOMAIN §3, see the module docstring).
    }
    if spec.workdir is not None:
        kwargs["working_dir"] = spec.workdir
    if rt.ipc_mode is not None:
        kwargs["ipc_mode"] = rt.ipc_mode
    if rt.shm_size is not None:
        kwargs["shm_size"] = rt.shm_size
    if rt.network_mode is not None:
        kwargs["network_mode"] = rt.network_mode
    if rt.gpus is not None:
        kwargs["device_requests"] = [gpu_request(rt.gpus)]
    # With host (or no) networking there is nothing to publish: the engine's port is the host's.
    if rt.published_ports and rt.network_mode not in ("host", "none"):
        kwargs["ports"] = {
            f"{container_port}/tcp": (publish_address, host_port)
            for container_port, host_port in sorted(rt.published_ports.items())
        }
    return kwargs


def manual_launch_id(spec: LaunchSpec) -> str:
    """The launch id the renders use: the controller gives each launch its own; a hand-run container
    is named and labelled as this one."""
    return f"manual-{spec.recipe}"


def render_kwargs(spec: LaunchSpec, fmt: str) -> dict[str, Any]:
    launch_of(spec, fmt)
    try:
        return container_kwargs(spec, manual_launch_id(spec))
    except ValueError as exc:
        raise FormatError(str(exc)) from exc


# -- formats ---------------------------------------------------------------------------------------


def _docker_py(spec: LaunchSpec, recipe: Recipe | None) -> str:
    return json.dumps(render_kwargs(spec, "docker-py"), indent=2) + "\n"


def _docker_run(spec: LaunchSpec, recipe: Recipe | None) -> str:
    kw = render_kwargs(spec, "docker")
    rt = launch_of(spec)
    opts: list[list[str]] = [["--name", kw["name"]], ["--restart", kw["restart_policy"]["Name"]]]
    opts += [["--label", f"{k}={v}"] for k, v in sorted(kw["labels"].items())]
    if "network_mode" in kw:
        opts.append([f"--network={kw['network_mode']}"])
    if "ipc_mode" in kw:
        opts.append([f"--ipc={kw['ipc_mode']}"])
    if "shm_size" in kw:
        opts.append([f"--shm-size={kw['shm_size']}"])
    opts += [[f"--device={d}"] for d in kw["devices"]]
    if rt.gpus is not None:
        opts.append(["--gpus", rt.gpus])
    opts += [["--group-add", g] for g in kw["group_add"]]
    opts += [["--security-opt", s] for s in kw["security_opt"]]
    opts += [["--ulimit", f"{u['Name']}={u['Soft']}:{u['Hard']}"] for u in kw["ulimits"]]
    opts += [["-p", f"{addr}:{hp}:{port.removesuffix('/tcp')}"]
             for port, (addr, hp) in kw.get("ports", {}).items()]
    opts += [["-v", v] for v in kw["volumes"]]
    opts += [["-e", f"{k}={v}"] for k, v in kw["environment"].items()]
    if "working_dir" in kw:
        opts.append(["--workdir", kw["working_dir"]])
    opts.append(["--entrypoint", kw["entrypoint"][0]])
    lines = ["# no --memory: the container must be created without a memory limit (DOMAIN §3)",
             HAND_RUN_LOG_NOTE, "docker run -d \\"]
    lines += [f"  {shlex.join(o)} \\" for o in opts]
    lines.append(f"  {shlex.quote(kw['image'])} \\")
    lines.append("  " + shlex.join(kw["command"]))
    return "\n".join(lines) + "\n"


def _compose(spec: LaunchSpec, recipe: Recipe | None) -> str:
    kw = render_kwargs(spec, "compose")
    rt = launch_of(spec)
    service: dict[str, Any] = {
        "image": kw["image"],
        "container_name": kw["name"],
        "entrypoint": kw["entrypoint"],
        "command": kw["command"],
        "environment": kw["environment"],
        "volumes": kw["volumes"],
        "restart": kw["restart_policy"]["Name"],
        "labels": kw["labels"],
    }
    optional: dict[str, Any] = {
        "working_dir": kw.get("working_dir"), "devices": kw["devices"], "group_add": kw["group_add"],
        "ipc": kw.get("ipc_mode"), "shm_size": kw.get("shm_size"), "network_mode": kw.get("network_mode"),
        "security_opt": kw["security_opt"],
        "ulimits": {u["Name"]: {"soft": u["Soft"], "hard": u["Hard"]} for u in kw["ulimits"]},
        "ports": [f"{addr}:{hp}:{port.removesuffix('/tcp')}"
                  for port, (addr, hp) in kw.get("ports", {}).items()],
    }
    service.update({k: v for k, v in optional.items() if v})
    if rt.gpus is not None:
        request = kw["device_requests"][0]
        device: dict[str, Any] = {"driver": "nvidia", "capabilities": ["gpu"]}
        if request["DeviceIDs"]:
            device["device_ids"] = request["DeviceIDs"]
        else:
            device["count"] = "all" if request["Count"] == -1 else request["Count"]
        service["deploy"] = {"resources": {"reservations": {"devices": [device]}}}
    doc = {"services": {"engine": compose_escape(service)}}
    header = ("# compose service for recipe '{}' (spec {}); no mem_limit by design (DOMAIN §3)\n"
              "# every '$' is written '$$': compose interpolates values, this file states them literally\n")
    return (header.format(spec.recipe, spec.spec_hash) + HAND_RUN_LOG_NOTE + "\n"
            + yaml.safe_dump(doc, sort_keys=False, width=200))


def compose_escape(value: Any) -> Any:
    """Every string value with `$` doubled: compose would read `$HOME` as the caller's variable and
    `$(` or `$@` (the sourcing wrapper's `exec "$@"`) as an interpolation error, so the file would
    not describe the launch the other formats describe. Keys are names (POSIX env names, label keys)."""
    if isinstance(value, str):
        return value.replace("$", "$$")
    if isinstance(value, dict):
        return {k: compose_escape(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [compose_escape(v) for v in value]
    return value


# -- the plug-in -------------------------------------------------------------------------------------


class DockerPlugin:
    kind = "docker"
    section = DockerRuntime
    launch = DockerLaunch
    traits = RuntimeTraits(sets_own_memlock=True, own_cgroup=True, placement=Placement.LOCAL_DAEMON,
                           console_script=True)
    formats: Mapping[str, Format] = {"docker": _docker_run, "docker-py": _docker_py, "compose": _compose}
    default_format = "docker"
    lint_rules = ("loopback-bind-bridge",)

    def render_launch(self, recipe: Recipe, facts: HostFacts, root: str,
                      env: Mapping[str, str]) -> DockerLaunch:
        docker = _section(recipe)
        mounts = []
        if recipe.model.host_path:
            mounts.append(Mount(source=facts.expand(recipe.model.host_path), target=recipe.model.path,
                                read_only=True))
        # Same path inside and out: the log lines that name cache paths mean the same on the host.
        mounts.append(Mount(source=root, target=root))
        triton = env["TRITON_CACHE_DIR"]
        if not triton.startswith(root + "/"):
            mounts.append(Mount(source=triton, target=triton))  # a volume, not the container layer
        bridge = docker.network == "bridge"
        return DockerLaunch(
            image=docker.image_ref,
            mounts=tuple(mounts),
            devices=docker.device_paths,
            gpus="all" if recipe.platform is Platform.CUDA else None,
            group_add=docker.group_add,
            ipc_mode=docker.ipc,
            shm_size=docker.shm_size,
            network_mode=docker.network,
            security_opt=docker.security_opt,
            published_ports={recipe.engine.port: recipe.engine.port} if bridge else {},
        )

    def listen(self, recipe: Recipe) -> str:
        return recipe.engine.host  # 0.0.0.0 inside a bridge container (DOMAIN §5)

    def reach(self, recipe: Recipe) -> str:
        bridge = _section(recipe).network == "bridge"
        return LOOPBACK if bridge or recipe.engine.host == "0.0.0.0" else recipe.engine.host

    def interpreter(self, recipe: Recipe, facts: HostFacts) -> str:
        return ENGINE_PYTHON  # in the image, the interpreter the sourced DTK env puts first on PATH

    def workdir(self, recipe: Recipe, facts: HostFacts) -> str | None:
        return None  # the image's own WORKDIR

    def cache_key_inputs(self, recipe: Recipe) -> dict[str, object]:
        section = _section(recipe)
        return {"kind": self.kind, "image": section.image, "digest": section.digest}

    def lint(self, recipe: Recipe) -> list[Finding]:
        loopback = recipe.engine.host in ("127.0.0.1", "localhost", "::1")
        if _section(recipe).network != "bridge" or not loopback:
            return []
        return [Finding(rule="loopback-bind-bridge", severity="error", field="engine.host",
                        message=f"--host {recipe.engine.host} inside a bridge-network container: use 0.0.0.0",
                        fact="DOMAIN §5: the in-container curl works but the host gets `connection reset "
                             "by peer`")]

    def host_plan_notes(self, recipe: Recipe) -> list[str]:
        return []

    def host_cache_dirs(self, spec: LaunchSpec) -> list[str]:
        """A path under a mount target maps to the mount's host source; a path on no mount lives in
        the container layer and is not ours to create."""
        out: list[str] = []
        for inside in spec.cache_dirs():
            for mount in launch_of(spec).mounts:
                target = mount.target.rstrip("/")
                if inside == target or inside.startswith(target + "/"):
                    out.append(mount.source + inside[len(target):])
                    break
        return out


PLUGIN = DockerPlugin()
