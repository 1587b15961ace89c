"""Read the host's memory files through an injected proc root (effectful; parsing is in
`appliance.observe.procfs`).

Tests point `proc_root` at a fixture tree (`tests/fixtures/procfs/<host>/proc`), the way
prometheus `client_python` takes `proc='/proc'`. Processes come and go between listing and
reading: a vanished pid is skipped, never an error.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

from appliance.observe.procfs import (
    MemInfo,
    Pressure,
    ProcessMemory,
    ProcParseError,
    ProcStat,
    SwapArea,
    memory_cgroup_of,
    parse_meminfo,
    parse_pressure,
    parse_proc_cgroup,
    parse_smaps_rollup,
    parse_stat,
    parse_status_memory,
    parse_swappiness,
    parse_swaps,
)

log = logging.getLogger(__name__)

# A pid can exit between listing /proc and reading its files: ENOENT, or ESRCH on read.
_GONE = (FileNotFoundError, ProcessLookupError)


class ProcReader:
    def __init__(self, proc_root: Path = Path("/proc")) -> None:
        self.root = proc_root

    def _text(self, *parts: str) -> str:
        return self.root.joinpath(*parts).read_text(errors="replace")

    def meminfo(self) -> MemInfo:
        return parse_meminfo(self._text("meminfo"))

    def swaps(self) -> list[SwapArea]:
        return parse_swaps(self._text("swaps"))

    def pressure(self) -> Pressure | None:
        """None where PSI is unavailable: kernels before 4.20, or booted with psi=0 (then the file
        exists but reading it fails with EOPNOTSUPP)."""
        try:
            return parse_pressure(self._text("pressure", "memory"))
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.debug("PSI unreadable: %s", exc)
            return None

    def swappiness(self) -> int | None:
        try:
            return parse_swappiness(self._text("sys", "vm", "swappiness"))
        except FileNotFoundError:
            return None

    def pids(self) -> list[int]:
        return sorted(int(p.name) for p in self.root.iterdir() if p.name.isdigit())

    def stat(self, pid: int) -> ProcStat | None:
        try:
            return parse_stat(self._text(str(pid), "stat"))
        except _GONE:
            return None

    def process_memory(self, pid: int) -> ProcessMemory | None:
        """smaps_rollup (Anonymous = RssAnon, Swap, Pss), else status (RssAnon, VmSwap) where
        smaps_rollup is missing (kernel < 4.14) or not permitted; None when the pid is gone or is
        a kernel thread."""
        stat = self.stat(pid)
        comm = stat.comm if stat else None
        try:
            return parse_smaps_rollup(self._text(str(pid), "smaps_rollup"), pid, comm)
        except _GONE:
            if not self.root.joinpath(str(pid)).exists():
                return None
        except (PermissionError, ProcParseError):
            pass
        try:
            mem = parse_status_memory(self._text(str(pid), "status"), pid)
        except _GONE:
            return None
        except ProcParseError:
            return None  # kernel thread: no user memory
        return mem.model_copy(update={"comm": comm or mem.comm})

    def memory_cgroup(self, pid: int) -> str | None:
        try:
            return memory_cgroup_of(parse_proc_cgroup(self._text(str(pid), "cgroup")))
        except _GONE:
            return None

    def process_tree(self, roots: Iterable[int]) -> set[int]:
        """The roots and all their live descendants (the engine's API server, EngineCore and
        `VLLM::Worker_TP*` processes all descend from the launched pid or container init)."""
        wanted = set(roots)
        if not wanted:
            return set()
        children: dict[int, list[int]] = {}
        alive: set[int] = set()
        for pid in self.pids():
            st = self.stat(pid)
            if st is None:
                continue
            alive.add(pid)
            children.setdefault(st.ppid, []).append(pid)
        out: set[int] = set()
        stack = [p for p in wanted if p in alive]
        while stack:
            pid = stack.pop()
            if pid in out:
                continue
            out.add(pid)
            stack.extend(children.get(pid, ()))
        return out
