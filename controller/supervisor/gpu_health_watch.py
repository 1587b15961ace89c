"""GPU health tied to the launches it concerns: card state sampled, kernel GPU events attributed.

- Every `interval_s` (10 s): every card's health (controller/watch/gpu_health.HealthReader) → metrics,
  `assess` findings → metrics and the console; NVML missing or failing → one event naming what is blind.
- Every kernel record (the kmsg follower's `on_record`): NVIDIA Xid and amdgpu lines
  (appliance/observe/gpu_events.py) → the card (PCI address → index from the last sample) → the
  launch (one of its cards, or one of its engine's pids) → metrics, the launch's timeline, and kept for
  the driver's exit diagnosis (`gpu_events`), as the OOM kills are (host_memory_watch.py).
- Fatal events are kept per card for admission (`findings`): a card that lost its bus or raised an
  uncontained ECC error is not launched on again without the operator hearing of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from appliance.observe.gpu_events import GpuEvent, GpuEventReader, attribute_card, launch_cards
from appliance.observe.gpu_health import CardHealth, HealthFinding, assess
from appliance.observe.kmsg import KmsgRecord
from controller.metrics import ControllerMetrics
from controller.supervisor.machine import Launch
from controller.watch.gpu_health import HEALTH_INTERVAL_S, HealthReader, cards_by_pci

log = logging.getLogger(__name__)

KEEP_ENDED_S = 120.0  # an event for a launch that just ended still finds it (as host_memory_watch.py)
RECENT_EVENTS = 20  # kernel GPU events the console shows


@dataclass(frozen=True)
class LaunchView:
    """What the link reads of the supervisor and tells it (wired in controller/service.py)."""

    launch: Callable[[], Launch | None]
    pids: Callable[[str], frozenset[int]]  # the engine's pids the host watch saw for a launch
    note: Callable[[str, str, str | None], None]  # an event (kind, message, launch id)


class GpuHealthLink:
    def __init__(self, reader: HealthReader | None = None, metrics: ControllerMetrics | None = None,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> None:
        self.reader = reader or HealthReader()
        self.metrics = metrics if metrics is not None else ControllerMetrics()
        self.clock = clock
        self.wall = wall
        self.view: LaunchView | None = None
        self.cards: list[CardHealth] = []
        self.card_findings: list[HealthFinding] = []
        self._events = GpuEventReader()
        self._by_launch: dict[str, list[GpuEvent]] = {}
        self._fatal_by_card: dict[int, list[GpuEvent]] = {}
        self._recent: dict[str, tuple[frozenset[int], float]] = {}  # launch id → (its cards, last seen)
        self._blind_said = False
        self._recent_events: deque[GpuEvent] = deque(maxlen=RECENT_EVENTS)

    # -- for the driver and admission

    def gpu_events(self, launch_id: str) -> list[GpuEvent]:
        return list(self._by_launch.get(launch_id, ()))

    def fatal_events(self, card: int) -> list[GpuEvent]:
        return list(self._fatal_by_card.get(card, ()))

    def acknowledge_reset(self, card: int) -> int:
        """The operator reset the card: its fatal events no longer refuse launches. How many there were."""
        cleared = len(self._fatal_by_card.pop(card, []))
        if cleared:
            self._note("gpu-reset", f"GPU {card}: reset acknowledged by the operator ({cleared} fatal "
                       "kernel event(s) no longer refuse it)", None)
            self.card_findings = [f for f in self.card_findings
                                  if not (f.card == card and f.check == "fatal-event")]
        return cleared

    @property
    def blind_note(self) -> str | None:
        return self.reader.blind_note

    @property
    def recent_events(self) -> Sequence[GpuEvent]:
        return tuple(self._recent_events)

    def findings(self, cards: frozenset[int] | None = None) -> list[HealthFinding]:
        """The last sample's findings, for `cards` (None: every card)."""
        return [f for f in self.card_findings if cards is None or f.card in cards]

    # -- card state

    def on_cards(self, cards: list[CardHealth]) -> None:
        self.cards = cards
        self.card_findings = [f for c in cards for f in assess(c, self._fatal_by_card.get(c.index, ()))]
        self.metrics.gpu_health.observe(cards, self.card_findings)
        note = self.reader.blind_note
        if note is not None and not self._blind_said:
            self._blind_said = True
            self._note("gpu-health-blind", note, None)

    async def run(self, stop: asyncio.Event, interval_s: float = HEALTH_INTERVAL_S) -> None:
        while not stop.is_set():
            try:
                self.on_cards(await asyncio.to_thread(self.reader.sample))
                for event in self._events.flush():  # an amdgpu line still waiting for its process line
                    self._on_event(event)
            except Exception:  # one bad sample must not end the watch
                log.exception("GPU health sample failed; the watch goes on")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=interval_s)

    # -- kernel events

    def on_record(self, record: KmsgRecord) -> None:
        for event in self._events.feed_message(record.message, seq=record.seq, ts_usec=record.ts_usec):
            self._on_event(event)

    def _on_event(self, raw: GpuEvent) -> None:
        event = attribute_card(raw, cards_by_pci(self.cards))
        self._recent_events.append(event)
        self.metrics.gpu_health.record_event(event, self.wall())
        if event.fatal and event.card is not None:
            self._fatal_by_card.setdefault(event.card, []).append(event)
        launch_id = self._launch_of(event)
        self._note("gpu-event", event.describe() + ("" if event.known else f" — {event.text[:200]}"),
                   launch_id)
        if launch_id is not None:
            self._by_launch.setdefault(launch_id, []).append(event)

    def _launch_of(self, event: GpuEvent) -> str | None:
        view = self.view
        now = self.clock()
        launch = view.launch() if view else None
        if launch is not None:
            self._recent[launch.launch_id] = (launch_cards(launch.spec.env), now)
        self._recent = {k: v for k, v in self._recent.items() if now - v[1] <= KEEP_ENDED_S}
        for launch_id, (cards, _) in self._recent.items():
            if event.pid is not None and view is not None and event.pid in view.pids(launch_id):
                return launch_id
            if event.card is not None and event.card in cards:
                return launch_id
        # One card on the host and one launch: the card is the launch's, whatever its index.
        if len(self.cards) == 1 and len(self._recent) == 1 and event.card == self.cards[0].index:
            return next(iter(self._recent))
        return None

    def _note(self, kind: str, message: str, launch_id: str | None) -> None:
        if self.view is not None:
            self.view.note(kind, message, launch_id)
        else:
            log.info("%s: %s", kind, message)
