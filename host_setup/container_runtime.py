"""Container runtime checks: Docker's cgroup version and driver, and that nothing above the engine
container limits its memory. Checks only.

DOMAIN §3: the TP=4 engine must run with no cgroup memory limit. Under cgroup v2 `memory.current`
counts page cache, so 29 GB of mmapped weights + 4 workers hit a 32 GiB limit (`memory.events
oom_kill 2`); `docker update --memory=0` means "unchanged", so a limited container must be
*recreated*. The rendered launch never sets a limit (LaunchSpec.memory_limit is always none); what is
left to check is the cgroup the daemon puts containers under (a `MemoryMax=` on docker.service or
the slice limits every container in it) — and, for a bare process, the controller's own cgroup.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from appliance.host_facts import parse_cgroup_limit
from appliance.runtimes.base import Placement
from host_setup.commands import Commands
from host_setup.memlock import DAEMON_JSON
from host_setup.model import Area, Finding, HostSetupError, Severity
from host_setup.root import HostRoot, read_text

WHY = (
    "DOMAIN §3: cgroup v2 counts page cache in memory.current; 29 GB of mmapped weights + 4 workers "
    "hit a 32 GiB limit — the engine container must be created with no memory limit"
)
DockerInfo = Callable[[], dict[str, Any]]


def docker_info_via(commands: Commands) -> DockerInfo:
    """`docker info` as a callable (the seam tests replace)."""

    def info() -> dict[str, Any]:
        out = commands.run(["docker", "info", "--format", "{{json .}}"]).stdout
        data = json.loads(out)
        if not isinstance(data, dict):
            raise HostSetupError("`docker info` did not return a JSON object")
        return data

    return info


@dataclass(frozen=True)
class RuntimeState:
    placement: Placement
    cgroup_version: int | None
    cgroup_driver: str | None
    source: str  # where the two above came from
    docker_error: str | None
    parent: str | None  # the cgroup containers are created under
    parent_limit: int | None  # its memory limit, None = none
    own_limit: int | None  # the controller's own cgroup limit (a process engine inherits it)


def read_runtime_state(
    root: HostRoot,
    placement: Placement,
    docker_info: DockerInfo | None,
    own_limit: int | None,
) -> RuntimeState:
    fs_version = 2 if (root.sys / "fs" / "cgroup" / "cgroup.controllers").exists() else None
    if fs_version is None and (root.sys / "fs" / "cgroup" / "memory").is_dir():
        fs_version = 1
    if placement is not Placement.LOCAL_DAEMON:
        return RuntimeState(placement, fs_version, None, "/sys/fs/cgroup", None, None, None, own_limit)
    daemon = _daemon_json(root)
    info: dict[str, Any] | None = None
    error: str | None = None
    if docker_info is not None:
        try:
            info = docker_info()
        except (HostSetupError, json.JSONDecodeError) as exc:
            error = str(exc)
    if info is not None:
        version = int(info["CgroupVersion"]) if str(info.get("CgroupVersion", "")).isdigit() else fs_version
        driver = info.get("CgroupDriver") or None
        source = "docker info"
    else:
        version, driver, source = (
            fs_version,
            _configured_driver(daemon, fs_version),
            "/sys/fs/cgroup, daemon.json",
        )
    parent = _container_parent(daemon, driver)
    limit = _parent_limit(root, version, parent)
    return RuntimeState(placement, version, driver, source, error, parent, limit, own_limit)


def plan_runtime(state: RuntimeState, no_limit_required: bool) -> list[Finding]:
    """Pure."""
    findings: list[Finding] = []
    if state.placement is Placement.REMOTE:
        return findings  # nothing on this host is above the engine: the node's notes say the rest
    if state.placement is Placement.LOCAL_DAEMON:
        driver = state.cgroup_driver or "unknown driver"
        version = f"cgroup v{state.cgroup_version}" if state.cgroup_version else "unknown cgroup version"
        findings.append(
            Finding(
                area=Area.RUNTIME,
                severity=Severity.INFO,
                message=f"docker: {version}, {driver} ({state.source})",
            )
        )
        if state.docker_error:
            findings.append(
                Finding(
                    area=Area.RUNTIME,
                    severity=Severity.WARN,
                    message=f"`docker info` failed: {state.docker_error}",
                    fix="start dockerd before launching a docker recipe",
                )
            )
    if not no_limit_required:
        return findings
    if state.cgroup_version == 2:
        findings.append(
            Finding(
                area=Area.RUNTIME,
                severity=Severity.INFO,
                message="cgroup v2 counts page cache in memory.current: a limit on the engine kills TP=4",
                why=WHY,
            )
        )
    if state.placement is Placement.LOCAL_DAEMON:
        if state.parent_limit is not None:
            findings.append(
                Finding(
                    area=Area.RUNTIME,
                    severity=Severity.WARN,
                    message=(
                        f"containers are created under {state.parent}, limited to "
                        f"{state.parent_limit / 1024**3:.2f} GiB: "
                        "the engine hits that limit even with none of its own"
                    ),
                    why=WHY,
                    fix="drop MemoryMax=/MemoryLimit= from docker.service or its slice",
                )
            )
        else:
            findings.append(
                Finding(
                    area=Area.RUNTIME,
                    severity=Severity.OK,
                    message=(
                        "the engine container gets no memory limit (none in the launch"
                        + (f", none on {state.parent})" if state.parent else ")")
                    ),
                )
            )
    elif state.own_limit is not None:
        findings.append(
            Finding(
                area=Area.RUNTIME,
                severity=Severity.WARN,
                message=(
                    f"the controller runs in a cgroup limited to {state.own_limit / 1024**3:.2f} GiB; "
                    "the engine process inherits it"
                ),
                why=WHY,
                fix="run the controller outside that limit (MemoryMax=infinity in its unit)",
            )
        )
    return findings


def _daemon_json(root: HostRoot) -> dict[str, Any]:
    text = read_text(root.path(DAEMON_JSON))
    try:
        data = json.loads(text) if text and text.strip() else {}
    except json.JSONDecodeError:
        return {}  # reported by the memlock check, which is the one that edits the file
    return data if isinstance(data, dict) else {}


def _configured_driver(daemon: dict[str, Any], version: int | None) -> str | None:
    for opt in daemon.get("exec-opts") or []:
        if isinstance(opt, str) and opt.startswith("native.cgroupdriver="):
            return opt.split("=", 1)[1]
    # dockerd's default: systemd on cgroup v2 hosts, cgroupfs on v1 (since Docker 20.10).
    return "systemd" if version == 2 else "cgroupfs" if version == 1 else None


def _container_parent(daemon: dict[str, Any], driver: str | None) -> str | None:
    explicit = daemon.get("cgroup-parent")
    if isinstance(explicit, str) and explicit:
        return explicit if explicit.startswith("/") or driver != "systemd" else f"/system.slice/{explicit}"
    if driver == "systemd":
        return "/system.slice"
    if driver == "cgroupfs":
        return "/docker"
    return None


def _parent_limit(root: HostRoot, version: int | None, parent: str | None) -> int | None:
    if parent is None or version is None:
        return None
    base = root.sys / "fs" / "cgroup"
    rel = parent.strip("/")
    path = base / rel / "memory.max" if version == 2 else base / "memory" / rel / "memory.limit_in_bytes"
    text = read_text(path)
    return parse_cgroup_limit(text) if text else None
