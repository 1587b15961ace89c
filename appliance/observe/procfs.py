"""Parsers of the memory files the host watch reads. Pure: text in, frozen models out.

What an operator must watch on these hosts (DOMAIN §3, seed 000 chapter 一 §8): `MemAvailable` and its
minimum over a run, `/proc/swaps` and the swap peak, `vm.swappiness`, memory pressure (PSI), per-process
`RssAnon` of the engine's processes (`/proc/<pid>/smaps_rollup`), and the container's cgroup OOM
counters (`memory.events` on cgroup v2, `memory.oom_control` on v1).

The readers that open these files live in `controller/watch/`; they take the proc root as a
parameter so tests point them at fixture trees under `tests/fixtures/procfs/`.

Sizes are returned in bytes (Prometheus base units); the kernel prints kB (= KiB).
Malformed lines are skipped; a file that lacks a required key raises `ProcParseError` naming it.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

_KB = 1024


class ProcParseError(ValueError):
    """The text is not the file it claims to be (missing a required key, or empty)."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True)


# --- /proc/meminfo ------------------------------------------------------------------------------


class MemInfo(_Frozen):
    mem_total_bytes: int
    mem_free_bytes: int
    # None on kernels before 3.14, which do not print MemAvailable; `available_bytes` estimates it.
    mem_available_bytes: int | None
    buffers_bytes: int = 0
    cached_bytes: int = 0
    swap_total_bytes: int = 0
    swap_free_bytes: int = 0
    anon_pages_bytes: int = 0
    shmem_bytes: int = 0
    fields: dict[str, int] = {}  # every field, bytes for kB fields and raw counts for the others

    @property
    def available_bytes(self) -> int:
        """MemAvailable, or on old kernels the classic free + buffers + cache estimate."""
        if self.mem_available_bytes is not None:
            return self.mem_available_bytes
        return self.mem_free_bytes + self.buffers_bytes + self.cached_bytes

    @property
    def swap_used_bytes(self) -> int:
        return max(0, self.swap_total_bytes - self.swap_free_bytes)


_MEMINFO_LINE = re.compile(r"^([^:\s]+):\s+(\d+)(?:\s+(kB))?\s*$")


def parse_meminfo(text: str) -> MemInfo:
    fields: dict[str, int] = {}
    for line in text.splitlines():
        m = _MEMINFO_LINE.match(line)
        if m:
            fields[m.group(1)] = int(m.group(2)) * (_KB if m.group(3) else 1)
    for required in ("MemTotal", "MemFree"):
        if required not in fields:
            raise ProcParseError(f"/proc/meminfo text has no {required} line")
    return MemInfo(
        mem_total_bytes=fields["MemTotal"],
        mem_free_bytes=fields["MemFree"],
        mem_available_bytes=fields.get("MemAvailable"),
        buffers_bytes=fields.get("Buffers", 0),
        cached_bytes=fields.get("Cached", 0),
        swap_total_bytes=fields.get("SwapTotal", 0),
        swap_free_bytes=fields.get("SwapFree", 0),
        anon_pages_bytes=fields.get("AnonPages", 0),
        shmem_bytes=fields.get("Shmem", 0),
        fields=fields,
    )


# --- /proc/swaps --------------------------------------------------------------------------------


class SwapArea(_Frozen):
    filename: str
    type: str  # "file" or "partition"
    size_bytes: int
    used_bytes: int
    priority: int


_OCTAL = re.compile(r"\\([0-7]{3})")


def _unmangle(path: str) -> str:
    # The kernel escapes space, tab, newline and backslash in paths as \ooo (seq_file_path).
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), path)


def parse_swaps(text: str) -> list[SwapArea]:
    """`/proc/swaps`: a header line then one area per line. An empty list means no swap at all
    (DOMAIN §3: recipe C needs 8 GiB; the reference host ships with a 4 GiB `/swap.img`)."""
    areas: list[SwapArea] = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 5 or parts[0] == "Filename":
            continue
        size, used, prio = parts[-3], parts[-2], parts[-1]
        if not (size.isdigit() and used.isdigit() and prio.lstrip("-").isdigit()):
            continue
        # A filename may end in " (deleted)"; everything before the last four columns is the name.
        name = " ".join(parts[:-4])
        areas.append(
            SwapArea(
                filename=_unmangle(name),
                type=parts[-4],
                size_bytes=int(size) * _KB,
                used_bytes=int(used) * _KB,
                priority=int(prio),
            )
        )
    return areas


# --- /proc/pressure/memory (PSI) ----------------------------------------------------------------


class PressureLine(_Frozen):
    """Share of wall time (0..1) some/all non-idle tasks stalled on memory, over 10/60/300 s."""

    avg10: float
    avg60: float
    avg300: float
    total_seconds: float  # cumulative stall time since boot


class Pressure(_Frozen):
    some: PressureLine
    full: PressureLine | None  # absent on kernels that print only "some" (cpu before 5.13)


_PSI_LINE = re.compile(
    r"^(some|full)\s+avg10=([\d.]+)\s+avg60=([\d.]+)\s+avg300=([\d.]+)\s+total=(\d+)\s*$"
)


def parse_pressure(text: str) -> Pressure:
    """`/proc/pressure/memory` (also the cgroup v2 `memory.pressure`). The kernel prints
    percentages and microseconds; returned as ratios and seconds."""
    lines: dict[str, PressureLine] = {}
    for line in text.splitlines():
        m = _PSI_LINE.match(line.strip())
        if m:
            lines[m.group(1)] = PressureLine(
                avg10=float(m.group(2)) / 100,
                avg60=float(m.group(3)) / 100,
                avg300=float(m.group(4)) / 100,
                total_seconds=int(m.group(5)) / 1e6,
            )
    if "some" not in lines:
        raise ProcParseError("pressure text has no 'some' line")
    return Pressure(some=lines["some"], full=lines.get("full"))


# --- /proc/<pid>/smaps_rollup and /proc/<pid>/status ---------------------------------------------


class ProcessMemory(_Frozen):
    """One process's memory. `anon_bytes` is what DOMAIN §3 calls RssAnon (4.30–4.52 GiB per TP=4
    eager worker, 6.60–6.93 GiB per TP=2 graph worker)."""

    pid: int
    comm: str | None = None
    rss_bytes: int
    anon_bytes: int
    swap_bytes: int
    pss_bytes: int | None = None


_KV_KB = re.compile(r"^([A-Za-z_()]+):\s+(\d+)\s+kB\s*$")


def _kb_fields(text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in text.splitlines():
        m = _KV_KB.match(line.strip())
        if m:
            out[m.group(1)] = int(m.group(2)) * _KB
    return out


def parse_smaps_rollup(text: str, pid: int, comm: str | None = None) -> ProcessMemory:
    fields = _kb_fields(text)
    if "Rss" not in fields or "Anonymous" not in fields:
        raise ProcParseError(f"smaps_rollup of pid {pid} has no Rss/Anonymous lines")
    return ProcessMemory(
        pid=pid,
        comm=comm,
        rss_bytes=fields["Rss"],
        anon_bytes=fields["Anonymous"],
        swap_bytes=fields.get("Swap", 0),
        pss_bytes=fields.get("Pss"),
    )


def parse_status_memory(text: str, pid: int) -> ProcessMemory:
    """`/proc/<pid>/status`: RssAnon/VmSwap, cheaper than smaps_rollup (which walks every VMA)
    and readable for processes whose smaps the reader may not open. Kernel threads have none."""
    fields = _kb_fields(text)
    name = next((line[5:].strip() for line in text.splitlines() if line.startswith("Name:")), None)
    if "RssAnon" not in fields:
        raise ProcParseError(f"status of pid {pid} has no RssAnon line (kernel thread or kernel < 4.5)")
    return ProcessMemory(
        pid=pid,
        comm=name,
        rss_bytes=fields.get("VmRSS", 0),
        anon_bytes=fields["RssAnon"],
        swap_bytes=fields.get("VmSwap", 0),
    )


# --- /proc/<pid>/stat, /proc/<pid>/cgroup --------------------------------------------------------


class ProcStat(_Frozen):
    pid: int
    comm: str
    state: str
    ppid: int


def parse_stat(text: str) -> ProcStat:
    """`/proc/<pid>/stat`. The comm is in parentheses and may itself contain spaces and ')', so the
    fields after it are found from the *last* ')'."""
    open_paren, close_paren = text.find("("), text.rfind(")")
    if open_paren < 0 or close_paren < open_paren:
        raise ProcParseError("stat text has no (comm)")
    head = text[:open_paren].strip()
    rest = text[close_paren + 1 :].split()
    if not head.isdigit() or len(rest) < 2 or not rest[1].lstrip("-").isdigit():
        raise ProcParseError("stat text has no pid/state/ppid")
    return ProcStat(pid=int(head), comm=text[open_paren + 1 : close_paren], state=rest[0], ppid=int(rest[1]))


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """`/proc/<pid>/cgroup` → controller name → path. The v2 unified hierarchy is key "" (line
    `0::/path`); a v1 line with several controllers (`4:cpu,cpuacct:/x`) yields each of them."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3 or not parts[0].isdigit():
            continue
        controllers = parts[1].split(",") if parts[1] else [""]
        for controller in controllers:
            out[controller] = parts[2]
    return out


def memory_cgroup_of(proc_cgroup: dict[str, str]) -> str | None:
    """The memory cgroup path of a process: the v1 `memory` controller, else the v2 hierarchy."""
    return proc_cgroup.get("memory") or proc_cgroup.get("")


# --- cgroup OOM counters ------------------------------------------------------------------------


class MemoryEvents(_Frozen):
    """cgroup v2 `memory.events` (hierarchical) or `memory.events.local`."""

    low: int = 0
    high: int = 0
    max: int = 0
    oom: int = 0
    oom_kill: int = 0
    oom_group_kill: int = 0  # 5.17+


def _key_ints(text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


def parse_memory_events(text: str) -> MemoryEvents:
    values = _key_ints(text)
    if "oom_kill" not in values and "oom" not in values:
        raise ProcParseError("memory.events text has no oom/oom_kill lines")
    known = MemoryEvents.model_fields
    return MemoryEvents(**{k: v for k, v in values.items() if k in known})


class OomControl(_Frozen):
    """cgroup v1 `memory.oom_control`. `oom_kill` exists since 4.13; None before."""

    oom_kill_disable: bool
    under_oom: bool
    oom_kill: int | None


def parse_oom_control(text: str) -> OomControl:
    values = _key_ints(text)
    if "under_oom" not in values:
        raise ProcParseError("memory.oom_control text has no under_oom line")
    return OomControl(
        oom_kill_disable=bool(values.get("oom_kill_disable", 0)),
        under_oom=bool(values["under_oom"]),
        oom_kill=values.get("oom_kill"),
    )


# --- /proc/sys/vm/swappiness --------------------------------------------------------------------


def parse_swappiness(text: str) -> int:
    """0..200 (values above 100 since 5.8). DOMAIN §3 / S14c: 60→200 raised the memory margin
    0.29→2.71 GiB at zero decode cost."""
    value = text.strip()
    if not value.isdigit():
        raise ProcParseError(f"swappiness is not a number: {value!r}")
    return int(value)
