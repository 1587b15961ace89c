"""The console's GPU health panel (Now and Host memory pages): each card's state in one line, what
admission would say of it, and the latest kernel GPU events. Read from the GPU health watch that the
apply preflight also reads (controller/supervisor/gpu_health_watch.py, through `Preflight.gpu`)."""

from __future__ import annotations

import time
from typing import Any

from appliance.observe.gpu_health import assess, card_line, verdict_of
from controller.supervisor.preflight import GpuHealthSource


def gpu_health_view(source: GpuHealthSource | None, now: float | None = None) -> dict[str, Any]:
    if source is None:
        return {"watched": False, "cards": [], "events": [], "blind": "the GPU health watch is not running"}
    cards = []
    for card in source.cards:
        findings = assess(card, source.fatal_events(card.index))
        cards.append({"index": card.index, "line": card_line(card), "verdict": verdict_of(findings),
                      "findings": [f.message for f in findings]})
    events = [{"text": e.describe(), "fatal": e.fatal, "side": e.side.value, "known": e.known,
               "raw": e.text[:240]} for e in reversed(source.recent_events)]
    return {"watched": True, "cards": cards, "events": events, "blind": source.blind_note,
            "at": now if now is not None else time.time()}
