"""Start-up check of what the host watch and the Docker runtime were granted (effectful, read-only).

In a container (compose.yaml) the controller sees the host only through grants: the host PID
namespace, /dev/kmsg, the Docker socket, the host's cgroup tree. A missing grant does not fail
anything loudly by itself — the watch just goes blind (no OOM record, no engine RSS). So each
grant is tried once at start-up and a missing one becomes one warning sentence naming what is
blind (logged and recorded as a controller event), never a silent gap. Each check only opens or
reads; nothing is changed.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from appliance import settings


@dataclass(frozen=True)
class GrantCheck:
    grant: str  # what compose.yaml grants (the comment there names the same thing)
    ok: bool
    detail: str  # when not ok: the one sentence an operator reads


@dataclass(frozen=True)
class GrantPaths:
    proc: Path = Path("/proc")
    kmsg: Path = Path("/dev/kmsg")
    docker_socket: Path | None = Path("/var/run/docker.sock")
    # compose.yaml mounts the host's cgroup tree here; on a host the controller reads /sys/fs/cgroup.
    host_cgroup: Path = Path("/sys/fs/cgroup")
    dockerenv: Path = Path("/.dockerenv")


def in_container(paths: GrantPaths = GrantPaths()) -> bool:
    return paths.dockerenv.exists()


def _readable(path: Path, must_contain: str | None = None) -> str | None:
    """None if `path` reads (and holds `must_contain`), else why not."""
    try:
        text = path.read_text()
    except OSError as exc:
        return exc.strerror or str(exc)
    if must_contain is not None and must_contain not in text:
        return f"no {must_contain} in it"
    return None


def _kmsg_error(path: Path) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        return exc.strerror or str(exc)
    try:
        os.read(fd, 8192)  # EAGAIN (nothing new) is fine; EPERM is the missing CAP_SYSLOG
    except BlockingIOError:
        pass
    except OSError as exc:
        if exc.errno not in (errno.EPIPE,):  # EPIPE: a record was overwritten meanwhile: readable
            return exc.strerror or str(exc)
    finally:
        os.close(fd)
    return None


def check_grants(
    paths: GrantPaths = GrantPaths(),
    *,
    pid: int | None = None,
    docker_ping: Callable[[], str | None] | None = None,
) -> list[GrantCheck]:
    """Every grant, checked. `docker_ping` returns None when the daemon answers, else why not."""
    out: list[GrantCheck] = []
    own_pid = os.getpid() if pid is None else pid
    # PID 1 is the entrypoint only in a private PID namespace: then the engine container's
    # State.Pid (a host PID) names nothing here.
    host_pids = own_pid != 1
    out.append(GrantCheck("pid: host", host_pids, "" if host_pids else (
        "no host PID namespace (pid: host): the engine's processes are invisible, so its RSS is not "
        "watched and OOM kills cannot be matched by pid")))
    why = _readable(paths.proc / "meminfo", "MemAvailable")
    out.append(GrantCheck("/proc/meminfo", why is None,
                          "" if why is None else f"cannot read {paths.proc / 'meminfo'} ({why}): host "
                          "MemAvailable and admission are blind"))
    why = _readable(paths.proc / "swaps")
    out.append(GrantCheck("/proc/swaps", why is None, "" if why is None else (
        f"cannot read {paths.proc / 'swaps'} ({why}): swap use is not watched")))
    why = _readable(paths.proc / "pressure" / "memory", "some")
    out.append(GrantCheck("/proc/pressure/memory", why is None, "" if why is None else (
        f"cannot read {paths.proc / 'pressure' / 'memory'} ({why}): memory pressure (PSI) is not watched")))
    why = _kmsg_error(paths.kmsg)
    out.append(GrantCheck("/dev/kmsg", why is None,
                          "" if why is None else f"cannot read {paths.kmsg} ({why}; needs the device and "
                          "CAP_SYSLOG): kernel OOM kills will not be seen, only exit codes"))
    if paths.docker_socket is not None:
        if not paths.docker_socket.exists():
            why = f"no Docker socket at {paths.docker_socket}"
        elif docker_ping is not None:
            why = docker_ping()
        else:
            why = None
        out.append(GrantCheck("docker socket", why is None,
                              "" if why is None else f"{why}: engines of the docker runtime can be neither "
                              "started nor adopted"))
    why = None
    v1_memory = paths.host_cgroup / "memory"
    if not v1_memory.is_dir() and not (paths.host_cgroup / "cgroup.controllers").exists():
        why = "not mounted"
    elif v1_memory.is_dir() and not (v1_memory / "docker").is_dir():
        why = "no docker/ cgroups under it (the container's own cgroup, not the host's tree?)"
    out.append(GrantCheck(f"host cgroup tree {paths.host_cgroup}", why is None,
                          "" if why is None else f"host cgroup tree at {paths.host_cgroup} {why}: the engine "
                          "container's own OOM counter cannot be read"))
    return out


def grant_paths_from_env(env: dict[str, str] | None = None) -> GrantPaths:
    """compose.yaml mounts the host's cgroup tree at APPLIANCE_HOST_CGROUP (/host/sys/fs/cgroup)."""
    e = os.environ if env is None else env
    socket = e.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    return GrantPaths(
        host_cgroup=(settings.current() if env is None else settings.Settings.from_environ(env)).host_cgroup,
        docker_socket=Path(socket.removeprefix("unix://")) if socket.startswith("unix://") else None,
    )
