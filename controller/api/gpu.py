"""GPU health routes of the controller's admin API (controller/supervisor/gpu_health_watch.py's view).

- ``GET /gpu``: every card's health, what admission would say of it, the latest kernel GPU events and
  what the watch cannot see.
- ``POST /gpu/{index}/reset``: the operator says the card was reset (`nvidia-smi -r`, a reboot): its
  fatal kernel events stop refusing launches on it. The kernel does not say when a card was reset, so
  a fatal event refuses the card until someone who did the reset says so (or the controller restarts).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from fastapi import APIRouter, Depends, HTTPException, Path, status

from appliance.observe.gpu_events import GpuEvent
from appliance.observe.gpu_health import CardHealth, assess, verdict_of


class GpuHealthApi(Protocol):
    @property
    def cards(self) -> Sequence[CardHealth]: ...

    @property
    def blind_note(self) -> str | None: ...

    @property
    def recent_events(self) -> Sequence[GpuEvent]: ...

    def fatal_events(self, card: int) -> list[GpuEvent]: ...

    def acknowledge_reset(self, card: int) -> int: ...


def gpu_status(source: GpuHealthApi) -> dict[str, Any]:
    cards = []
    for card in source.cards:
        findings = assess(card, source.fatal_events(card.index))
        cards.append({**card.model_dump(mode="json"), "verdict": verdict_of(findings),
                      "findings": [f.model_dump(mode="json") for f in findings]})
    return {"cards": cards,
            "events": [{**e.model_dump(mode="json"), "describe": e.describe()} for e in source.recent_events],
            "blind": source.blind_note}


def gpu_router(require_admin: Callable[..., Any], source: GpuHealthApi) -> APIRouter:
    router = APIRouter(prefix="/gpu", tags=["gpu"])

    @router.get("")
    def status_of_cards() -> dict[str, Any]:
        return gpu_status(source)

    @router.post("/{index}/reset", dependencies=[Depends(require_admin)])
    def reset_done(index: int = Path(ge=0, le=255, description="The card's index (GET /gpu).")
                   ) -> dict[str, Any]:
        if index not in {c.index for c in source.cards}:
            known = sorted(c.index for c in source.cards)
            raise HTTPException(status.HTTP_404_NOT_FOUND,
                                f"index: no GPU {index} on this host (cards: {known or 'none read'})")
        return {"gpu": index, "cleared_fatal_events": source.acknowledge_reset(index)}

    return router
