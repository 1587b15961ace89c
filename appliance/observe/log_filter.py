"""Which engine log lines a reader wants: without the HTTP access lines, since a time, matching a pattern.

Once Prometheus scrapes, most of a vLLM log is uvicorn's access lines (`INFO:     127.0.0.1:50412 -
"GET /metrics HTTP/1.1" 200 OK`, one per scrape and per probe), so `appliance logs` and the console
hide them unless asked. vLLM's own lines carry a stamp without a year (`INFO 12-01 10:34:51 [...]`) in
the engine's local time; a line without one (an access line, a traceback's continuation) takes the
stamp of the line before it, and lines before the first stamp take the first stamp (they were written
no later than it).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta

# uvicorn's access log format (`%s - "%s %s HTTP/%s" %d`), optionally behind vLLM's process prefix
# `(APIServer pid=N) `; the client may be host:port, [v6]:port or a unix socket path.
ACCESS_LINE = re.compile(r'^(?:\(\w+ pid=\d+\) )?INFO:\s+\S+ - "[A-Z]+ \S* HTTP/[0-9.]+" \d{3}\b')
# vLLM's logger stamp: level, then MM-DD HH:MM:SS.
STAMP = re.compile(r"^(?:\(\w+ pid=\d+\) )?[A-Z]+ (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d) ")
DURATION = re.compile(r"^(\d+)([smhd])$")
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
HALF_YEAR = timedelta(days=183)


class SinceError(ValueError):
    """A `--since` value that is neither a duration nor a time; `str(exc)` says what is accepted."""


def is_access_line(line: str) -> bool:
    return ACCESS_LINE.match(line) is not None


def parse_since(value: str, now: datetime) -> datetime:
    """`30s`, `10m`, `2h`, `1d` (before `now`), `HH:MM[:SS]` (today) or `MM-DD HH:MM[:SS]` (this
    year), all in the engine log's local time."""
    text = value.strip()
    if m := DURATION.match(text):
        return now - timedelta(seconds=int(m[1]) * UNITS[m[2]])
    formats = (("%H:%M:%S", False), ("%H:%M", False), ("%m-%d %H:%M:%S", True), ("%m-%d %H:%M", True))
    for fmt, dated in formats:
        try:
            # 2000 is a leap year, so 02-29 parses; the year is set right after
            t = datetime.strptime(f"2000-{text}" if dated else text, f"%Y-{fmt}" if dated else fmt)
        except ValueError:
            continue
        if dated:
            return t.replace(year=now.year)
        return now.replace(hour=t.hour, minute=t.minute, second=t.second, microsecond=0)
    raise SinceError(f"--since {value!r}: give a duration (30s, 10m, 2h, 1d) or a time in the log's "
                     "clock (HH:MM, HH:MM:SS, MM-DD HH:MM)")


def line_stamp(line: str, near: datetime) -> datetime | None:
    """The line's vLLM stamp as a datetime in the year that puts it nearest `near` (stamps have no year)."""
    m = STAMP.match(line)
    if m is None:
        return None
    month, day, hour, minute, second = (int(g) for g in m.groups())
    try:
        t = datetime(near.year, month, day, hour, minute, second)
    except ValueError:  # 02-29 outside a leap year: not a stamp this reader can place
        return None
    if t - near > HALF_YEAR:
        return t.replace(year=near.year - 1)
    if near - t > HALF_YEAR:
        return t.replace(year=near.year + 1)
    return t


@dataclass(frozen=True)
class LogFilter:
    """What to keep. `since` is compared with the lines' own stamps; `grep` is a compiled pattern."""

    access: bool = False
    since: datetime | None = None
    grep: re.Pattern[str] | None = None

    def keep(self, line: str) -> bool:
        if not self.access and is_access_line(line):
            return False
        return self.grep is None or self.grep.search(line) is not None

    def lines(self, lines: Iterable[str]) -> list[str]:
        return list(self._since(lines)) if self.since is not None else [x for x in lines if self.keep(x)]

    def _since(self, lines: Iterable[str]) -> Iterator[str]:
        assert self.since is not None
        pending: list[str] = []  # lines before the first stamp: they take it
        current: datetime | None = None
        for line in lines:
            stamp = line_stamp(line, self.since)
            if stamp is not None:
                current = stamp
                if pending:
                    if current >= self.since:
                        yield from (x for x in pending if self.keep(x))
                    pending = []
            if current is None:
                pending.append(line)
            elif current >= self.since and self.keep(line):
                yield line
        # A log with no stamp at all: nothing to place by time, so nothing is left out by --since.
        yield from (x for x in pending if self.keep(x))


class LineFollower:
    """Whole lines out of a followed log's chunks (a chunk may end inside a line), filtered."""

    def __init__(self, keep: LogFilter) -> None:
        self.filter = keep
        self.partial = ""
        self.last_stamp_ok: bool | None = None  # is the latest stamped line at or after `since`?

    def feed(self, chunk: str) -> list[str]:
        text = self.partial + chunk
        whole, _, self.partial = text.rpartition("\n")
        if not whole and "\n" not in text:
            return []
        out = []
        for line in whole.split("\n"):
            if self.filter.since is not None:
                stamp = line_stamp(line, self.filter.since)
                if stamp is not None:
                    self.last_stamp_ok = stamp >= self.filter.since
                if self.last_stamp_ok is False:
                    continue
            if self.filter.keep(line):
                out.append(line)
        return out
