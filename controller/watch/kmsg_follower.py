"""Follow `/dev/kmsg` and report OOM kills as they happen (effectful; parsing in `appliance.observe.kmsg`).

The device hands out one record per `read()`, and each opener has its own position:

- opened at the start of the ring buffer; we seek to the end (`SEEK_END`) so old kills are not
  re-reported on every controller start, unless `from_start=True` (a post-mortem read);
- non-blocking reads: `EAGAIN` means "nothing new";
- `EPIPE` means records were overwritten before we read them (the ring wrapped while we were slow);
  the kernel moves us to the oldest record still there, and the sequence numbers show how many were
  lost — reported through `on_gap` (the metric `appliance_kmsg_lost_records_total`);
- `poll()`/epoll works on the device, so the asyncio driver is woken by the kernel, which is what
  keeps kill → event latency far under the 1 s goal (bench/oom_detect_latency.py).

Reading needs root (or CAP_SYSLOG with `kernel.dmesg_restrict=1`).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import select
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from appliance.observe.kmsg import KmsgRecord, OomAssembler, OomEvent, SeqGap, SequenceTracker, parse_record

log = logging.getLogger(__name__)

# A record is at most ~1 KiB of text plus its dictionary; the kernel refuses (EINVAL) a read
# buffer too small for the next record, so leave plenty.
_READ_SIZE = 16 * 1024
# An OOM header that named a victim but whose "Killed process" line never came (the victim was
# already exiting) is reported after this much silence.
STALE_EPISODE_S = 1.0


class KmsgOverrun(Exception):
    """Records were overwritten before they were read (EPIPE)."""


class KmsgSource(Protocol):
    """The seam tests replace: something that yields /dev/kmsg records one at a time."""

    def fileno(self) -> int: ...

    def read_record(self) -> bytes | None:
        """The next record, None when none is available now; raises KmsgOverrun on EPIPE."""
        ...

    def close(self) -> None: ...


class DevKmsg:
    """The real device (or any path with the same read semantics)."""

    def __init__(self, path: Path = Path("/dev/kmsg"), *, from_start: bool = False) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        if not from_start:
            os.lseek(self._fd, 0, os.SEEK_END)

    def fileno(self) -> int:
        return self._fd

    def read_record(self) -> bytes | None:
        try:
            return os.read(self._fd, _READ_SIZE)
        except BlockingIOError:
            return None
        except OSError as exc:
            if exc.errno == errno.EPIPE:
                raise KmsgOverrun(str(exc)) from exc
            raise

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class KmsgFollower:
    """Drain records, parse them, call back with OOM events (and gaps). Not thread-safe: drive it
    from one asyncio loop (`run`) or one thread (`run_blocking`)."""

    def __init__(
        self,
        source: KmsgSource,
        on_event: Callable[[OomEvent], None],
        *,
        on_gap: Callable[[SeqGap], None] | None = None,
        on_record: Callable[[KmsgRecord], None] | None = None,
    ) -> None:
        self.source = source
        self.on_event = on_event
        self.on_gap = on_gap
        self.on_record = on_record
        self.assembler = OomAssembler()
        self.sequence = SequenceTracker()
        self.records = 0
        self.overruns = 0
        self.unparsed = 0
        self.failed_events = 0  # events the consumer raised on (logged; the follow goes on)

    def drain(self) -> list[OomEvent]:
        """Read every record available now; returns (and calls back with) the OOM events."""
        events: list[OomEvent] = []
        while True:
            try:
                raw = self.source.read_record()
            except KmsgOverrun:
                self.overruns += 1  # the next record's sequence number tells how many were lost
                continue
            if raw is None:
                break
            rec = parse_record(raw)
            if rec is None:
                self.unparsed += 1
                continue
            self.records += 1
            gap = self.sequence.observe(rec.seq)
            if gap is not None:
                log.warning("kmsg: %d records lost before seq %d", gap.lost, gap.got)
                if self.on_gap is not None:
                    self.on_gap(gap)
            if self.on_record is not None:
                self.on_record(rec)
            for event in self.assembler.feed(rec):
                events.append(event)
                self._emit(event)
        return events

    def flush(self) -> list[OomEvent]:
        """Report an OOM episode that is still waiting for its kill line."""
        events = self.assembler.flush()
        for event in events:
            self._emit(event)
        return events

    def _emit(self, event: OomEvent) -> None:
        """A consumer that fails on one event (a store write) must not end the follow: the next OOM
        kill is as important as this one, and kmsg cannot be re-read (we keep no position)."""
        try:
            self.on_event(event)
        except Exception:
            self.failed_events += 1
            log.exception("kmsg: the OOM event of pid %s was not recorded; following goes on", event.pid)

    async def run(self, stop: asyncio.Event) -> None:
        """Follow until `stop` is set, woken by the kernel through the event loop's selector."""
        loop = asyncio.get_running_loop()
        readable = asyncio.Event()
        fd = self.source.fileno()
        loop.add_reader(fd, readable.set)
        try:
            self.drain()
            while not stop.is_set():
                stopper = asyncio.ensure_future(stop.wait())
                reader = asyncio.ensure_future(readable.wait())
                timeout = STALE_EPISODE_S if self.assembler.pending_has_victim else None
                done, pending = await asyncio.wait({stopper, reader}, timeout=timeout,
                                                   return_when=asyncio.FIRST_COMPLETED)
                for task in pending:
                    task.cancel()
                if not done:
                    self.flush()
                    continue
                readable.clear()
                self.drain()
        finally:
            loop.remove_reader(fd)

    def run_blocking(self, stop: threading.Event, poll_interval_s: float = 0.5) -> None:
        """The same loop for a dedicated thread (select.poll; wakes on data or every interval)."""
        poller = select.poll()
        poller.register(self.source.fileno(), select.POLLIN)
        self.drain()
        while not stop.is_set():
            timeout = STALE_EPISODE_S if self.assembler.pending_has_victim else poll_interval_s
            if poller.poll(int(timeout * 1000)):
                self.drain()
            elif self.assembler.pending_has_victim:
                self.flush()
