"""Which phase events a launch record keeps, and the label each one carries. Pure.

Seen on the H200: a cold start stored 51 phase events — every graph-capture step, the
same ``capturing graphs round 1: 51/51`` ten times in one millisecond (the label was the tracker's
state *after* the whole poll, not the event's own), ``process started`` twice (the API server's
version line, then the engine core's ``Initializing a V1 LLM engine`` 20 s later), and the
weights-loading event labelled "weights loaded" (same cause: both weight lines arrived in one poll).

The rule: the record keeps the *first* event of each phase; of graph capture it keeps the first and
the completed step of each bar of each round (DOMAIN §4: the default mode captures in two rounds, and which
round a start died in matters); each kept event is labelled from itself. Every event still counts as
progress for the stall watch — only the record is coalesced.
"""

from __future__ import annotations

from appliance.observe.log_phases import PHASE_LABELS, Phase, PhaseEvent


def event_label(event: PhaseEvent) -> str:
    """The event's own label, e.g. ``loading weights`` or ``capturing graphs round 2: 19/51 (FULL)``."""
    if event.phase is Phase.GRAPH_CAPTURE and event.n is not None:
        text = f"{PHASE_LABELS[event.phase]} round {event.round or 1}: {event.n}/{event.total}"
        return f"{text} ({event.label})" if event.label else text
    return PHASE_LABELS[event.phase]


class PhaseRecorder:
    """Feed every event of one launch in order; `keep` says whether it gets a row in the record."""

    def __init__(self) -> None:
        self._seen: set[tuple[str, int, str, str]] = set()

    def keep(self, event: PhaseEvent) -> bool:
        if event.phase is Phase.GRAPH_CAPTURE:
            # One round holds a PIECEWISE and a FULL bar (the seed counts the pass, not the
            # bar), so first/done are kept per bar of the round: where a start died stays visible.
            rnd, bar = event.round or 1, event.label or ""
            if (event.phase.value, rnd, bar, "first") not in self._seen:
                self._seen.add((event.phase.value, rnd, bar, "first"))
                return True
            if event.n is not None and event.n == event.total:
                key = (event.phase.value, rnd, bar, "done")
                if key not in self._seen:
                    self._seen.add(key)
                    return True
            return False
        key = (event.phase.value, 0, "", "")
        if key in self._seen:
            return False
        self._seen.add(key)
        return True
