"""The container's own OOM counter: a second witness next to the kernel log (effectful).

cgroup v2: `memory.events` `oom_kill` (DOMAIN §3: the wrongly-then-rightly diagnosed cgroup OOM
showed `memory.events oom_kill 2`). cgroup v1: `memory.oom_control` `oom_kill` (kernel ≥ 4.13; this
dev machine's docker is v1 + cgroupfs, MEASURED.md). A *global* OOM that kills a process in the
container also counts here on v2 — the kernel log says which kind it was; this file only says
"the container lost a process to the OOM killer", and keeps saying it if kmsg records were lost.

The cgroup disappears when docker removes the container, so the witness must be polled while the
launch runs (the supervisor polls it with the host sampler); `poll()` returns None once it is gone.
Reading v1 `memory.oom_control` on kernel 6.x logs a one-time deprecation notice to kmsg.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass
from pathlib import Path

from appliance.observe.procfs import ProcParseError, parse_memory_events, parse_oom_control

DEFAULT_CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class CgroupOomFile:
    path: Path
    version: int  # 1 or 2


def container_cgroup_candidates(container_id: str) -> list[str]:
    """Memory cgroup paths docker uses for a container: cgroupfs driver, then systemd driver."""
    return [f"/docker/{container_id}", f"/system.slice/docker-{container_id}.scope"]


def resolve_oom_file(
    cgroup_path: str | None = None,
    *,
    container_id: str | None = None,
    cgroup_root: Path = DEFAULT_CGROUP_ROOT,
) -> CgroupOomFile | None:
    """Find the OOM counter file of a memory cgroup (path as in `/proc/<pid>/cgroup` or the
    kernel's `task_memcg=`), or of a docker container by id. None when it does not exist (yet)."""
    paths = [cgroup_path] if cgroup_path else []
    if container_id:
        paths += container_cgroup_candidates(container_id)
    for rel in paths:
        rel = rel.lstrip("/")
        v2 = cgroup_root / rel / "memory.events"
        if v2.is_file():
            return CgroupOomFile(v2, 2)
        v1 = cgroup_root / "memory" / rel / "memory.oom_control"
        if v1.is_file():
            return CgroupOomFile(v1, 1)
    return None


def read_oom_kills(file: CgroupOomFile) -> int | None:
    """The cgroup's oom_kill count; None when the cgroup is gone or the kernel predates the
    counter (v1 before 4.13)."""
    try:
        text = file.path.read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError as exc:
        # The cgroup was removed between open and read.
        if exc.errno == errno.ENODEV:
            return None
        raise
    try:
        if file.version == 2:
            return parse_memory_events(text).oom_kill
        return parse_oom_control(text).oom_kill
    except ProcParseError:
        return None


class CgroupOomWitness:
    """Count new OOM kills in one cgroup since the last poll."""

    def __init__(self, file: CgroupOomFile) -> None:
        self.file = file
        self.baseline = read_oom_kills(file)
        self.total_new = 0

    def poll(self) -> int | None:
        """New kills since the previous poll (0 if none); None once the cgroup is gone."""
        now = read_oom_kills(self.file)
        if now is None:
            return None
        if self.baseline is None or now < self.baseline:
            self.baseline = now
            return 0
        delta, self.baseline = now - self.baseline, now
        self.total_new += delta
        return delta
