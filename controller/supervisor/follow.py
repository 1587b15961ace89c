"""Following one engine's log: whole lines into the PhaseTracker, the tail kept for the diagnosis.

The runtime hands out log text by byte offset (`Runtime.read_logs`); a read can end in the middle
of a line, so the partial line is kept until its newline arrives. tqdm progress bars redraw with
`\\r` and no newline for minutes (graph capture, DOMAIN §4), so a partial line that has grown is
also shown to the tracker — the tracker ignores a redraw without progress.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from appliance.observe.engine_facts import EngineFactsReader
from appliance.observe.log_phases import PhaseEvent, PhaseTracker
from appliance.observe.phase_record import PhaseRecorder
from appliance.observe.rank_logs import RankTracker

TAIL_LINES = 200  # what the diagnosis and the launch record keep of the log
_MAX_PARTIAL = 64 * 1024  # a "line" longer than this is cut (a tqdm bar redrawn for an hour)


@dataclass
class LogFollower:
    launch_id: str
    started_at: float  # for the elapsed time of each phase
    offset: int = 0
    tracker: PhaseTracker = field(default_factory=PhaseTracker)
    recorder: PhaseRecorder = field(default_factory=PhaseRecorder)  # which events the record keeps
    facts: EngineFactsReader = field(default_factory=EngineFactsReader)  # engine facts for the record
    ranks: RankTracker = field(default_factory=RankTracker)  # per-rank phases and deaths (TP > 1)
    facts_changed: bool = False
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    _partial: str = ""
    _partial_fed: int = 0  # how much of the partial line the tracker has already seen

    def feed(self, text: str, new_offset: int, now: float) -> list[PhaseEvent]:
        """Text read from `self.offset` up to `new_offset`; returns the phase events it produced."""
        self.offset = new_offset
        if not text:
            return []
        data = self._partial + text
        lines = data.split("\n")
        self._partial = lines.pop()
        events: list[PhaseEvent] = []
        for i, line in enumerate(lines):
            # The first complete line may have been shown to the tracker in part already (its
            # \r-terminated redraws): give it the rest only.
            start = self._partial_fed if i == 0 else 0
            events.extend(self.tracker.feed(line[start:], now))
            if self.facts.feed(_last_segment(line)):
                self.facts_changed = True
            self.ranks.feed(_last_segment(line), now)
            self.tail.append(_last_segment(line))
        if lines:
            self._partial_fed = 0
        if len(self._partial) > _MAX_PARTIAL:
            cut = len(self._partial) - _MAX_PARTIAL
            self._partial = self._partial[cut:]
            self._partial_fed = max(0, self._partial_fed - cut)
        # A line still being redrawn: show the tracker its completed (\r-terminated) segments.
        done = self._partial.rfind("\r") + 1
        if done > self._partial_fed:
            events.extend(self.tracker.feed(self._partial[self._partial_fed:done], now))
            self._partial_fed = done
        return events

    def tail_lines(self) -> tuple[str, ...]:
        lines = list(self.tail)
        if self._partial.strip():
            lines.append(_last_segment(self._partial))
        return tuple(lines)

    def tail_text(self, max_lines: int = 60) -> str:
        return "\n".join(self.tail_lines()[-max_lines:])


def _last_segment(line: str) -> str:
    """What a terminal would show of a line with `\\r` redraws: its last non-empty segment."""
    if "\r" not in line:
        return line
    segments = [s for s in line.split("\r") if s.strip()]
    return segments[-1] if segments else ""
