"""Kernel log records (`/dev/kmsg`) and the OOM killer's lines in them → OOM events. Pure.

Operators found out about engine deaths by reading `dmesg` afterwards; this module turns
the same text into structured events while it happens. Nothing here opens a file: the follower in
`controller/watch/kmsg_follower.py` feeds records in, tests feed fixture text.

Record format (Documentation/ABI/testing/dev-kmsg), one record per `read()`:

    prio,seq,ts_usec,flags[,more...];message
     KEY=value            <- continuation ("dictionary") lines start with a space

`prio` is `facility << 3 | level`; the message escapes bytes < 0x20, >= 0x7f and the backslash
as `\\xNN`.

OOM lines across kernel generations (mm/oom_kill.c, mm/memcontrol.c), all recognised:

- `<comm> invoked oom-killer: gfp_mask=0x…(…), [nodemask=…,] order=N, [oom_adj=N,] oom_score_adj=N`
- `oom-kill:constraint=CONSTRAINT_…,nodemask=…,cpuset=…,mems_allowed=…,` then `global_oom` or
  `oom_memcg=…`, `task_memcg=…`, `task=…,pid=…,uid=…` (4.19+; the keys are parsed in any order)
- `Task in <memcg> killed as a result of limit of <memcg>` (memcg OOMs before 4.19)
- `Out of memory: Killed process …` / `Memory cgroup out of memory: Killed process …` with
  `total-vm:…kB, anon-rss:…kB, file-rss:…kB, shmem-rss:…kB[, UID:… pgtables:…kB oom_score_adj:…]`
- the older `…: Kill process N (comm) score S or sacrifice child` followed by `Killed process …`
  (with or without the `…: ` prefix, and the RHEL 6 form `Killed process N, UID U, (comm) …`)
- `oom_reaper: reaped process N (comm), now anon-rss:…kB, file-rss:…kB, shmem-rss:…kB`

DOMAIN §3/§5: the difference that matters to an operator is *global* (host RAM + swap exhausted:
`constraint=CONSTRAINT_NONE … global_oom`) versus *cgroup* (the container's memory limit:
`CONSTRAINT_MEMCG … oom_memcg=/docker/<id>` or `Memory cgroup out of memory`). Every event says
which, from whichever of those lines the kernel printed (the summary line is rate-limited together
with the rest of the header in `dump_header`, so sometimes only the `Killed process` line is there).

Garbage is ignored, never raised on: every parser returns None for text it does not know.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum

from pydantic import BaseModel, ConfigDict

_KB = 1024


class KmsgRecord(BaseModel):
    """One `/dev/kmsg` record."""

    model_config = ConfigDict(frozen=True)

    facility: int
    level: int
    seq: int
    ts_usec: int  # kernel local_clock() microseconds since boot (≈ CLOCK_MONOTONIC)
    flags: str
    message: str
    fields: dict[str, str] = {}  # continuation lines, e.g. SUBSYSTEM=pci, DEVICE=+pci:0000:00:01.0


_HEADER = re.compile(r"^(\d+),(\d+),(\d+),([^,;]*)(?:,[^;]*)?$")
_ESCAPE = re.compile(rb"\\x([0-9a-fA-F]{2})")


def _unescape(text: str) -> str:
    raw = text.encode("utf-8", errors="surrogateescape")
    return _ESCAPE.sub(lambda m: bytes([int(m.group(1), 16)]), raw).decode("utf-8", errors="replace")


def parse_record(raw: str | bytes) -> KmsgRecord | None:
    """Parse one record as returned by one `read()` of /dev/kmsg; None when it is not one."""
    text = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else raw
    lines = text.split("\n")
    head, sep, message = lines[0].partition(";")
    if not sep:
        return None
    m = _HEADER.match(head)
    if m is None:
        return None
    prio, seq, ts = int(m.group(1)), int(m.group(2)), int(m.group(3))
    fields: dict[str, str] = {}
    for cont in lines[1:]:
        if not cont.startswith(" "):
            continue  # the trailing "" after the final newline, or junk
        key, eq, value = cont[1:].partition("=")
        if eq and key:
            fields[key] = _unescape(value)
    return KmsgRecord(
        facility=prio >> 3,
        level=prio & 7,
        seq=seq,
        ts_usec=ts,
        flags=m.group(4),
        message=_unescape(message.rstrip("\r")),
        fields=fields,
    )


def parse_stream(text: str) -> Iterator[KmsgRecord]:
    """Records from concatenated /dev/kmsg reads (a saved dump): continuation lines, which start
    with a space, belong to the record above them. Lines that are not records are skipped."""
    current: list[str] = []
    for line in text.splitlines():
        if line.startswith(" ") and current:
            current.append(line)
            continue
        if current:
            rec = parse_record("\n".join(current))
            if rec is not None:
                yield rec
        current = [line] if not line.startswith(" ") else []
    if current:
        rec = parse_record("\n".join(current))
        if rec is not None:
            yield rec


# --- sequence numbers ---------------------------------------------------------------------------


class SeqGap(BaseModel):
    """Records the kernel overwrote before we read them (ring buffer wrapped, or we were slow)."""

    model_config = ConfigDict(frozen=True)

    expected: int
    got: int

    @property
    def lost(self) -> int:
        return self.got - self.expected


@dataclass
class SequenceTracker:
    """Report gaps in the record sequence. A sequence going backwards means a new reader position
    (or a reboot between saved dumps): it restarts the count instead of reporting a gap."""

    last: int | None = None

    def observe(self, seq: int) -> SeqGap | None:
        prev, self.last = self.last, seq
        if prev is None or seq <= prev:
            return None
        if seq != prev + 1:
            return SeqGap(expected=prev + 1, got=seq)
        return None


# --- OOM lines ----------------------------------------------------------------------------------


class OomScope(StrEnum):
    """Why the OOM killer ran — the distinction DOMAIN §5 turns into different actions."""

    GLOBAL = "global"  # CONSTRAINT_NONE: host RAM + swap exhausted (DOMAIN §3)
    CGROUP = "cgroup"  # CONSTRAINT_MEMCG: a memory cgroup limit (the container's --memory)
    CPUSET = "cpuset"  # CONSTRAINT_CPUSET: the task's allowed NUMA nodes are full
    MEMPOLICY = "mempolicy"  # CONSTRAINT_MEMORY_POLICY: an mbind/set_mempolicy node set is full
    UNKNOWN = "unknown"


class OomEventKind(StrEnum):
    KILL = "kill"  # the kernel killed a task
    REAPED = "reaped"  # oom_reaper freed a victim's anonymous memory (follows a kill)


class OomEvent(BaseModel):
    """One OOM kill (or reaper confirmation) assembled from the lines of one OOM episode."""

    model_config = ConfigDict(frozen=True)

    kind: OomEventKind
    scope: OomScope
    constraint: str | None = None  # kernel's CONSTRAINT_* name when the summary line was seen
    pid: int | None = None  # victim, global (host) pid namespace
    task: str | None = None  # victim comm (≤ 15 characters, e.g. "VLLM::Worker_TP")
    anon_rss_bytes: int | None = None
    file_rss_bytes: int | None = None
    shmem_rss_bytes: int | None = None
    total_vm_bytes: int | None = None
    uid: int | None = None
    oom_score_adj: int | None = None
    score: int | None = None  # old "score S or sacrifice child" form
    oom_memcg: str | None = None  # the cgroup whose limit was hit (cgroup OOMs)
    task_memcg: str | None = None  # the victim's memory cgroup, e.g. /docker/<id>
    cpuset: str | None = None
    trigger_task: str | None = None  # comm of the allocating task that invoked the OOM killer
    gfp_mask: str | None = None
    order: int | None = None
    reason: str | None = None  # the message prefix: "Out of memory", "Memory cgroup out of memory", …
    seq: int | None = None  # sequence number of the record that completed the event
    ts_usec: int | None = None
    lines: tuple[str, ...] = ()  # the OOM lines it was built from, for the launch record

    @property
    def cgroup_path(self) -> str | None:
        """The victim's cgroup: where attribution to a container looks first."""
        return self.task_memcg or self.oom_memcg


@dataclass(frozen=True)
class _Invoked:
    task: str
    gfp_mask: str | None
    order: int | None


@dataclass(frozen=True)
class _Summary:
    values: dict[str, str]
    global_oom: bool


@dataclass(frozen=True)
class _TaskIn:
    task_memcg: str
    oom_memcg: str


@dataclass(frozen=True)
class _Sacrifice:
    reason: str | None
    pid: int
    task: str
    score: int


@dataclass(frozen=True)
class _Killed:
    reason: str | None
    pid: int
    task: str
    stats: dict[str, int]


@dataclass(frozen=True)
class _Reaped:
    pid: int
    task: str
    stats: dict[str, int]


@dataclass(frozen=True)
class _MemcgHint:
    """Lines of the OOM header that only a memcg OOM prints (used when no summary line exists)."""

    cgroup: str | None


OomLine = _Invoked | _Summary | _TaskIn | _Sacrifice | _Killed | _Reaped | _MemcgHint

_INVOKED = re.compile(r"^(?P<task>.*?) invoked oom-killer: (?P<rest>.*)$")
_GFP = re.compile(r"gfp_mask=(0x[0-9a-fA-F]+)")
_ORDER = re.compile(r"\border=(-?\d+)")
_TASK_IN = re.compile(r"^Task in (?P<task>\S+) killed as a result of limit of (?P<memcg>\S+)\s*$")
_SACRIFICE = re.compile(
    r"^(?:(?P<reason>[^:]+): )?Kill process (?P<pid>\d+) \((?P<task>.*)\) "
    r"score (?P<score>\d+) or sacrifice child"
)
_KILLED = re.compile(
    r"^(?:(?P<reason>[^:]+): )?Killed process (?P<pid>\d+)(?:, UID (?P<uid>\d+),)? "
    r"\((?P<task>.*)\)(?P<rest>.*)$"
)
_REAPED = re.compile(r"^oom_reaper: reaped process (?P<pid>\d+) \((?P<task>.*)\),? now (?P<rest>.*)$")
_STAT = re.compile(r"([A-Za-z_-]+):(-?\d+)(kB)?")
_MEMCG_STATS = re.compile(r"^Memory cgroup stats for (?P<path>\S+?):?(?:\s|$)")


def _stats(rest: str) -> dict[str, int]:
    return {key: int(value) * (_KB if unit else 1) for key, value, unit in _STAT.findall(rest)}


def _summary(body: str) -> _Summary:
    # Values such as nodemask=0-1,3 contain commas (the kernel prints bitmaps with %*pbl): a token
    # without "=" continues the previous value unless it is the bare `global_oom` keyword.
    values: dict[str, str] = {}
    global_oom = False
    last: str | None = None
    for token in body.split(","):
        token = token.strip()
        key, eq, value = token.partition("=")
        if eq and key.replace("_", "").isalnum():
            values[key] = value
            last = key
        elif token == "global_oom":
            global_oom = True
            last = None
        elif last is not None and token:
            values[last] = f"{values[last]},{token}"
    return _Summary(values=values, global_oom=global_oom)


def parse_oom_line(message: str) -> OomLine | None:
    """Classify one kernel message line as a part of an OOM episode; None for anything else."""
    text = message.strip()
    if not text:
        return None
    if text.startswith("oom-kill:"):
        summary = _summary(text[len("oom-kill:") :])
        return summary if (summary.values or summary.global_oom) else None
    if "invoked oom-killer:" in text:
        m = _INVOKED.match(text)
        if m is None:
            return None
        rest = m.group("rest")
        gfp = _GFP.search(rest)
        order = _ORDER.search(rest)
        return _Invoked(
            task=m.group("task"),
            gfp_mask=gfp.group(1) if gfp else None,
            order=int(order.group(1)) if order else None,
        )
    if "Killed process" in text:
        m = _KILLED.match(text)
        if m is None:
            return None
        stats = _stats(m.group("rest"))
        if m.group("uid") is not None:
            stats.setdefault("UID", int(m.group("uid")))
        return _Killed(reason=m.group("reason"), pid=int(m.group("pid")), task=m.group("task"), stats=stats)
    if "or sacrifice child" in text:
        m = _SACRIFICE.match(text)
        if m is None:
            return None
        return _Sacrifice(
            reason=m.group("reason"),
            pid=int(m.group("pid")),
            task=m.group("task"),
            score=int(m.group("score")),
        )
    if text.startswith("oom_reaper:"):
        m = _REAPED.match(text)
        if m is None:
            return None
        return _Reaped(pid=int(m.group("pid")), task=m.group("task"), stats=_stats(m.group("rest")))
    if text.startswith("Task in "):
        m = _TASK_IN.match(text)
        return _TaskIn(task_memcg=m.group("task"), oom_memcg=m.group("memcg")) if m else None
    if text.startswith("Memory cgroup stats for "):
        m = _MEMCG_STATS.match(text)
        return _MemcgHint(cgroup=m.group("path")) if m else None
    if text.startswith("mem_cgroup_out_of_memory"):  # a call-trace frame (leading space stripped)
        return _MemcgHint(cgroup=None)
    return None


# --- episode assembly ---------------------------------------------------------------------------


@dataclass
class _Episode:
    lines: list[str] = field(default_factory=list)
    invoked: _Invoked | None = None
    summary: _Summary | None = None
    task_in: _TaskIn | None = None
    sacrifice: _Sacrifice | None = None
    memcg_hint: bool = False
    memcg_stats_path: str | None = None

    @property
    def has_victim(self) -> bool:
        return self.sacrifice is not None or (self.summary is not None and "pid" in self.summary.values)


def _scope(
    constraint: str | None, global_oom: bool, oom_memcg: str | None, reason: str | None, memcg_hint: bool
) -> OomScope:
    by_constraint = {
        "CONSTRAINT_NONE": OomScope.GLOBAL,
        "CONSTRAINT_MEMCG": OomScope.CGROUP,
        "CONSTRAINT_CPUSET": OomScope.CPUSET,
        "CONSTRAINT_MEMORY_POLICY": OomScope.MEMPOLICY,
    }
    if constraint in by_constraint:
        return by_constraint[constraint]
    if oom_memcg or memcg_hint or (reason or "").lower().startswith("memory cgroup"):
        return OomScope.CGROUP
    if global_oom or (reason or "").startswith("Out of memory"):
        return OomScope.GLOBAL
    return OomScope.UNKNOWN


def _int(value: str | None) -> int | None:
    return int(value) if value is not None and value.lstrip("-").isdigit() else None


def _build(ep: _Episode, killed: _Killed | None, seq: int | None, ts: int | None) -> OomEvent:
    values = ep.summary.values if ep.summary else {}
    global_oom = ep.summary.global_oom if ep.summary else False
    reason = (killed.reason if killed else None) or (ep.sacrifice.reason if ep.sacrifice else None)
    oom_memcg = (
        values.get("oom_memcg") or (ep.task_in.oom_memcg if ep.task_in else None) or ep.memcg_stats_path
    )
    task_memcg = values.get("task_memcg") or (ep.task_in.task_memcg if ep.task_in else None)
    constraint = values.get("constraint")
    stats = killed.stats if killed else {}
    if killed is not None:
        pid: int | None = killed.pid
        task: str | None = killed.task
    elif ep.sacrifice is not None:
        pid, task = ep.sacrifice.pid, ep.sacrifice.task
    else:
        pid, task = _int(values.get("pid")), values.get("task")
    uid = stats.get("UID", _int(values.get("uid")))
    return OomEvent(
        kind=OomEventKind.KILL,
        scope=_scope(constraint, global_oom, oom_memcg, reason, ep.memcg_hint),
        constraint=constraint,
        pid=pid,
        task=task,
        anon_rss_bytes=stats.get("anon-rss"),
        file_rss_bytes=stats.get("file-rss"),
        shmem_rss_bytes=stats.get("shmem-rss"),
        total_vm_bytes=stats.get("total-vm"),
        uid=uid,
        oom_score_adj=stats.get("oom_score_adj"),
        score=ep.sacrifice.score if ep.sacrifice else None,
        oom_memcg=oom_memcg,
        task_memcg=task_memcg,
        cpuset=values.get("cpuset"),
        trigger_task=ep.invoked.task if ep.invoked else None,
        gfp_mask=ep.invoked.gfp_mask if ep.invoked else None,
        order=ep.invoked.order if ep.invoked else None,
        reason=reason,
        seq=seq,
        ts_usec=ts,
        lines=tuple(ep.lines),
    )


@dataclass
class OomAssembler:
    """Fold kernel records into OOM events, in order. Pure state machine, no clock.

    An event is emitted as soon as its `Killed process` line arrives (that is the kill; waiting for
    anything later would only add latency). An episode whose header named a victim but whose kill
    line never came is emitted when the next episode starts, or by `flush()`.
    """

    remember: int = 64  # recent kills, so that a later oom_reaper line inherits scope and cgroup
    _episode: _Episode | None = None
    _recent: OrderedDict[int, OomEvent] = field(default_factory=OrderedDict)

    def feed(self, record: KmsgRecord) -> list[OomEvent]:
        return self.feed_message(record.message, seq=record.seq, ts_usec=record.ts_usec)

    def feed_message(
        self, message: str, *, seq: int | None = None, ts_usec: int | None = None
    ) -> list[OomEvent]:
        line = parse_oom_line(message)
        if line is None:
            return []
        out: list[OomEvent] = []
        if isinstance(line, _Invoked):
            out.extend(self.flush())
            self._episode = _Episode(invoked=line)
        elif isinstance(line, _Reaped):
            out.append(self._reaped(line, message, seq, ts_usec))
            return out
        ep = self._episode if self._episode is not None else _Episode()
        self._episode = ep
        ep.lines.append(message.strip())
        if isinstance(line, _Summary):
            ep.summary = line
        elif isinstance(line, _TaskIn):
            ep.task_in = line
        elif isinstance(line, _Sacrifice):
            ep.sacrifice = line
        elif isinstance(line, _MemcgHint):
            ep.memcg_hint = True
            ep.memcg_stats_path = ep.memcg_stats_path or line.cgroup
        elif isinstance(line, _Killed):
            event = _build(ep, line, seq, ts_usec)
            self._episode = None
            self._remember(event)
            out.append(event)
        return out

    @property
    def pending_has_victim(self) -> bool:
        """An episode named a victim and still waits for its kill line (see `flush`)."""
        return self._episode is not None and self._episode.has_victim

    def flush(self) -> list[OomEvent]:
        """Emit an episode that named a victim but has no kill line yet (e.g. at end of input)."""
        ep, self._episode = self._episode, None
        if ep is None or not ep.has_victim:
            return []
        event = _build(ep, None, None, None)
        self._remember(event)
        return [event]

    def _remember(self, event: OomEvent) -> None:
        if event.pid is None:
            return
        self._recent[event.pid] = event
        while len(self._recent) > self.remember:
            self._recent.popitem(last=False)

    def _reaped(self, line: _Reaped, message: str, seq: int | None, ts: int | None) -> OomEvent:
        kill = self._recent.get(line.pid)
        return OomEvent(
            kind=OomEventKind.REAPED,
            scope=kill.scope if kill else OomScope.UNKNOWN,
            constraint=kill.constraint if kill else None,
            pid=line.pid,
            task=line.task,
            anon_rss_bytes=line.stats.get("anon-rss"),
            file_rss_bytes=line.stats.get("file-rss"),
            shmem_rss_bytes=line.stats.get("shmem-rss"),
            oom_memcg=kill.oom_memcg if kill else None,
            task_memcg=kill.task_memcg if kill else None,
            seq=seq,
            ts_usec=ts,
            lines=(message.strip(),),
        )


def oom_events(records: Iterable[KmsgRecord]) -> list[OomEvent]:
    """All OOM events in a sequence of records (a saved dump, a test fixture)."""
    assembler = OomAssembler()
    out: list[OomEvent] = []
    for rec in records:
        out.extend(assembler.feed(rec))
    out.extend(assembler.flush())
    return out
