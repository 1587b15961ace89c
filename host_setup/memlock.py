"""memlock: the pinned-memory limit the engine will actually see, fixed the right way per runtime.

Why (DOMAIN §3, S11f §10.1): each worker pins a `StagedWriteTensor` (max_num_reqs × max_model_len
× 4 B) — GB scale at max_model_len 262144 — while a container's default `ulimit -l` is 64 MB and
cannot be raised inside. The symptom is `hipErrorOutOfMemory` from `UvaBuffer`/`pin_memory=True`
during `load_model()`, which looks like a VRAM problem and is not.

- docker: the right fix is the container's own `--ulimit memlock=-1`, which the renderer emits for
  recipes with `memlock_unlimited` (it is fixed at container creation). dockerd's `default-ulimits`
  in `/etc/docker/daemon.json` is the fallback for containers created without it; it is changed only
  when the rendered launch does not carry the ulimit, and dockerd reads it only when it starts.
- process: the engine inherits the controller's limit. `/etc/security/limits.d/90-appliance.conf`
  makes it unlimited for new login sessions (pam_limits); a controller under systemd needs
  `LimitMEMLOCK=infinity` in its unit instead, which is reported.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from appliance.host_facts import UNLIMITED, parse_memlock
from appliance.runtimes.base import Placement
from host_setup.commands import HostContext
from host_setup.files import atomic_write, restore_file
from host_setup.model import (
    Area,
    Change,
    DockerDefaultUlimitAction,
    DockerDefaultUlimitUndo,
    FileUndo,
    Finding,
    HostSetupError,
    LimitsConfAction,
    Severity,
)
from host_setup.root import HostRoot, read_text

DAEMON_JSON = "/etc/docker/daemon.json"
LIMITS_CONF = "/etc/security/limits.d/90-appliance.conf"
LIMITS_CONTENT = (
    "# Written by `appliance host apply`: the engine pins GB of host memory (DOMAIN §3, S11f §10.1).\n"
    "# Removed by `appliance host revert`. `*` does not cover root in pam_limits, hence both.\n"
    "*    soft memlock unlimited\n"
    "*    hard memlock unlimited\n"
    "root soft memlock unlimited\n"
    "root hard memlock unlimited\n"
)
WHY = (
    "DOMAIN §3/S11f §10.1: each worker pins max_num_reqs × max_model_len × 4 B; a 64 MB memlock limit "
    "gives hipErrorOutOfMemory from UvaBuffer during load_model()"
)

Limit = tuple[int | None, int | None]  # (soft, hard) bytes; -1 = unlimited; None = unknown


@dataclass(frozen=True)
class MemlockState:
    placement: Placement  # who sets the engine's limit: dockerd (creation), or us (inherited)
    daemon_json: dict[str, Any] | None  # None: no file
    daemon_json_error: str | None
    dockerd_limit: Limit | None  # dockerd's own limit: what containers get without default-ulimits
    limits_conf: str | None  # our limits.d file
    self_limit: Limit  # this process's limit: what a process-runtime engine inherits

    @property
    def daemon_default(self) -> Limit | None:
        entry = ((self.daemon_json or {}).get("default-ulimits") or {}).get("memlock")
        if not isinstance(entry, dict):
            return None
        return _int_or_none(entry.get("Soft")), _int_or_none(entry.get("Hard"))


def read_memlock_state(root: HostRoot, placement: Placement) -> MemlockState:
    daemon_text = read_text(root.path(DAEMON_JSON))
    daemon: dict[str, Any] | None = None
    error: str | None = None
    if daemon_text is not None:
        try:
            loaded = json.loads(daemon_text) if daemon_text.strip() else {}
            if isinstance(loaded, dict):
                daemon = loaded
            else:
                error = "the top level is not a JSON object"
        except json.JSONDecodeError as exc:
            error = f"{exc.msg} at line {exc.lineno}"
    return MemlockState(
        placement=placement,
        daemon_json=daemon,
        daemon_json_error=error,
        dockerd_limit=_dockerd_limit(root),
        limits_conf=read_text(root.path(LIMITS_CONF)),
        self_limit=parse_memlock(read_text(root.proc / "self" / "limits") or ""),
    )


def plan_memlock(
    state: MemlockState, unlimited_required: bool, container_memlock: int | None
) -> tuple[list[Change], list[Finding]]:
    """Pure. `container_memlock`: the memlock soft limit in the rendered launch (-1 = unlimited,
    None = the launch sets none / unknown)."""
    if not unlimited_required:
        return [], []
    if state.placement is Placement.LOCAL_DAEMON:
        return _plan_docker(state, container_memlock)
    if state.placement is Placement.REMOTE:
        return [], []  # another node runs the engine: its plug-in's host-plan notes say what it needs
    return _plan_process(state)


def _plan_docker(state: MemlockState, container_memlock: int | None) -> tuple[list[Change], list[Finding]]:
    findings: list[Finding] = []
    container_ok = container_memlock == UNLIMITED
    if container_ok:
        findings.append(
            Finding(
                area=Area.MEMLOCK,
                severity=Severity.OK,
                message="the engine container is created with --ulimit memlock=-1",
                why=WHY,
            )
        )
    default = state.daemon_default or state.dockerd_limit
    if default == (UNLIMITED, UNLIMITED):
        findings.append(
            Finding(area=Area.MEMLOCK, severity=Severity.OK, message="dockerd default memlock: unlimited")
        )
        return [], findings
    if container_ok:
        findings.append(
            Finding(
                area=Area.MEMLOCK,
                severity=Severity.INFO,
                message=f"dockerd's default memlock is {_fmt(default)}; the engine container sets its own",
            )
        )
        return [], findings
    if state.daemon_json_error:
        findings.append(
            Finding(
                area=Area.MEMLOCK,
                severity=Severity.ERROR,
                message=f"cannot parse {DAEMON_JSON}: {state.daemon_json_error} (so dockerd cannot start)",
                fix=f"repair {DAEMON_JSON}",
            )
        )
        return [], findings
    findings.append(
        Finding(
            area=Area.MEMLOCK,
            severity=Severity.WARN,
            message="dockerd reads default-ulimits only when it starts",
            fix="restart dockerd (`systemctl restart docker`) while no engine runs; recreate the container",
        )
    )
    change = Change(
        id="memlock.docker-default-ulimits",
        area=Area.MEMLOCK,
        what=f"set default-ulimits memlock=-1:-1 in {DAEMON_JSON}",
        before=f"containers get memlock {_fmt(default)}",
        after="containers get memlock unlimited",
        why=WHY,
        action=DockerDefaultUlimitAction(daemon_json_host_path=DAEMON_JSON),
    )
    return [change], findings


def _plan_process(state: MemlockState) -> tuple[list[Change], list[Finding]]:
    findings: list[Finding] = []
    changes: list[Change] = []
    if state.self_limit[0] != UNLIMITED:
        findings.append(
            Finding(
                area=Area.MEMLOCK,
                severity=Severity.WARN,
                message=f"the controller runs with memlock {_fmt(state.self_limit)}; its engine inherits it",
                why=WHY,
                fix=(
                    "limits.d applies to new login sessions; a controller under systemd needs "
                    "LimitMEMLOCK=infinity in its unit — then restart the controller"
                ),
            )
        )
    if state.limits_conf != LIMITS_CONTENT:
        changes.append(
            Change(
                id="memlock.limits-d",
                area=Area.MEMLOCK,
                what=f"write {LIMITS_CONF} (memlock unlimited for new sessions)",
                before="absent" if state.limits_conf is None else "different content",
                after="memlock unlimited (soft and hard)",
                why=WHY,
                action=LimitsConfAction(host_path=LIMITS_CONF, content=LIMITS_CONTENT),
            )
        )
    else:
        findings.append(Finding(area=Area.MEMLOCK, severity=Severity.OK, message=f"{LIMITS_CONF} in place"))
    return changes, findings


# --- executor ----------------------------------------------------------------------------------


def capture_docker_default(action: DockerDefaultUlimitAction, ctx: HostContext) -> DockerDefaultUlimitUndo:
    path = ctx.root.path(action.daemon_json_host_path)
    data = _load_daemon_json(ctx.root, action.daemon_json_host_path)
    previous = (data.get("default-ulimits") or {}).get(action.name)
    return DockerDefaultUlimitUndo(
        daemon_json_host_path=action.daemon_json_host_path,
        name=action.name,
        file_existed=path.exists(),
        previous=previous if isinstance(previous, dict) else None,
    )


def apply_docker_default(action: DockerDefaultUlimitAction, ctx: HostContext) -> None:
    data = _load_daemon_json(ctx.root, action.daemon_json_host_path)
    ulimits = dict(data.get("default-ulimits") or {})
    ulimits[action.name] = {"Name": action.name, "Soft": action.soft, "Hard": action.hard}
    data["default-ulimits"] = ulimits
    atomic_write(ctx.root.path(action.daemon_json_host_path), json.dumps(data, indent=2) + "\n")


def revert_docker_default(undo: DockerDefaultUlimitUndo, ctx: HostContext) -> None:
    """Restore only our key: anything else edited in daemon.json since is kept."""
    path = ctx.root.path(undo.daemon_json_host_path)
    if not path.exists():
        return
    data = _load_daemon_json(ctx.root, undo.daemon_json_host_path)
    ulimits = dict(data.get("default-ulimits") or {})
    if undo.previous is None:
        ulimits.pop(undo.name, None)
    else:
        ulimits[undo.name] = undo.previous
    if ulimits:
        data["default-ulimits"] = ulimits
    else:
        data.pop("default-ulimits", None)
    if not data and not undo.file_existed:
        path.unlink()
    else:
        atomic_write(path, json.dumps(data, indent=2) + "\n")


def capture_file(action: LimitsConfAction, ctx: HostContext) -> FileUndo:
    return FileUndo(host_path=action.host_path, previous_content=read_text(ctx.root.path(action.host_path)))


def apply_file(action: LimitsConfAction, ctx: HostContext) -> None:
    atomic_write(ctx.root.path(action.host_path), action.content)


def revert_file(undo: FileUndo, ctx: HostContext) -> None:
    restore_file(ctx.root.path(undo.host_path), undo.previous_content)


# --- helpers -----------------------------------------------------------------------------------


def _load_daemon_json(root: HostRoot, host_path: str) -> dict[str, Any]:
    text = read_text(root.path(host_path))
    if text is None or not text.strip():
        return {}
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise HostSetupError(
            f"cannot parse {host_path}: {exc.msg} at line {exc.lineno}; nothing changed"
        ) from exc
    if not isinstance(data, dict):
        raise HostSetupError(f"{host_path} is not a JSON object; nothing changed")
    return data


def _dockerd_limit(root: HostRoot) -> Limit | None:
    for pidfile in ("/run/docker.pid", "/var/run/docker.pid"):
        pid = (read_text(root.path(pidfile)) or "").strip()
        if pid.isdigit():
            limits = read_text(root.proc / pid / "limits")
            if limits:
                return parse_memlock(limits)
    return None


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) else None


def _fmt(limit: Limit | None) -> str:
    if limit is None:
        return "unknown (dockerd not running or no pid file)"
    soft, hard = (
        "unlimited" if v == UNLIMITED else "unknown" if v is None else f"{v / 1024**2:.0f} MiB" for v in limit
    )
    return soft if soft == hard else f"{soft} soft / {hard} hard"
