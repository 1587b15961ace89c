"""When the host sampler reads the expensive sources. A pure decision over (clock, MemAvailable, launch).

The controller was measured idle beside a ready engine at 7.9% of a core, nearly all of it in
`Path.read_text` of /proc files from the once-a-second host sample: finding the engine's process tree
(every /proc/<pid>/stat on the host, twice) and each engine process's `smaps_rollup` (the kernel walks
every VMA of a 4–7 GiB worker to produce it). The cheap sources — `/proc/meminfo`, `/proc/pressure/
memory`, `/proc/swaps` — are single small files and stay on the 1 s cadence, so MemAvailable's
low-water mark and the `MemAvailableBelowRecipeTarget` alert see exactly what they saw before, and
kernel OOM kills arrive from `/dev/kmsg` independently of any sampling.

The per-process read (tree + smaps_rollup) happens only when it can change an answer:

- **a new launch** (or the first sample): the pids OOM attribution needs, and the first RssAnon;
- **while the engine starts**: DOMAIN §3 — the peak is the warm-up right after KV allocation and
  peak − steady is only 4–1469 MiB, so per-worker RssAnon is sampled every second through start-up;
- **MemAvailable moved** by `mem_move_bytes` since the last per-process read: something's memory
  changed, and the per-process figures say whose (a ready engine's anonymous memory is flat,
  S14d: 0.4 GB swapped after start);
- **a slow cadence** (`full_every_s`) otherwise, so the per-process gauges and peaks never go stale
  for long (a swapped-out worker coming back, a new worker pid).

`ALWAYS` is the old policy (every sample reads everything), kept for `bench/controller_idle.py` and
for tests that want every figure fresh.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

MIB = 1024 * 1024


class FullReason(StrEnum):
    """Why a sample read the per-process sources (None from `due` = it did not)."""

    ALWAYS = "always"
    NEW_LAUNCH = "new_launch"
    STARTING = "starting"
    MEM_MOVED = "mem_available_moved"
    CADENCE = "cadence"


@dataclass(frozen=True)
class SamplingPolicy:
    # Slow cadence of the per-process read when nothing moves. 30 s: two Prometheus scrapes at the
    # default 15 s interval; far below the minutes a steady engine's RssAnon takes to drift.
    full_every_s: float = 30.0
    # 256 MiB: under one tenth of the smallest margin that mattered (recipe C's 2.35 GiB min, DOMAIN §3),
    # and well above the noise of page cache churn on an idle host.
    mem_move_bytes: int = 256 * MIB
    read_processes_always: bool = False


ALWAYS = SamplingPolicy(read_processes_always=True)


class ProcessSampleSchedule:
    """Remembers the last per-process read and answers `due(...)` for the next sample."""

    def __init__(self, policy: SamplingPolicy | None = None) -> None:
        self.policy = policy or SamplingPolicy()
        self.last_full_at: float | None = None
        self.last_full_available: int | None = None
        self.last_launch: str | None = None

    def due(self, now: float, mem_available_bytes: int, launch: str | None,
            starting: bool) -> FullReason | None:
        """Whether this sample reads the per-process sources, and why; None = reuse the last read."""
        p = self.policy
        if p.read_processes_always:
            return FullReason.ALWAYS
        if launch is None:
            return None  # no engine: no process tree to read
        if self.last_full_at is None or launch != self.last_launch:
            return FullReason.NEW_LAUNCH
        if starting:
            return FullReason.STARTING
        if self.last_full_available is not None and \
                abs(mem_available_bytes - self.last_full_available) >= p.mem_move_bytes:
            return FullReason.MEM_MOVED
        if now - self.last_full_at >= p.full_every_s:
            return FullReason.CADENCE
        return None

    def done(self, now: float, mem_available_bytes: int, launch: str | None) -> None:
        """A per-process read was made at `now` with this MemAvailable."""
        self.last_full_at = now
        self.last_full_available = mem_available_bytes
        self.last_launch = launch
