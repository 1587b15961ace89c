"""How long the gateway holds new requests while the supervisor switches the engine on purpose.

The gateway's hold (controller/gateway/hold/queue.py) is bounded per request by ``wait_s``; by default it
comes from the variant's own history: its expected ready time (the median of earlier launches that
reached ready, warm ones first: a planned restart reuses the compile cache, ARCHITECTURE "Warm-cache
restart") plus a margin for the drain, the stop and the preflight, capped. Without any history, the
cap. A configured ``wait_s`` replaces the estimate. MEASURED.md: a warm CPU restart left the gateway
without an engine for ~40–75 s, so the cap (300 s) leaves room for a cold start of the small model
while never holding a client for longer than a few minutes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from statistics import median

from appliance.observe.ready_eta import PastLaunch, StartState
from controller.supervisor.blue_green import Fit
from controller.supervisor.gateway_link import HoldPlan


@dataclass(frozen=True)
class HoldPolicy:
    wait_s: float | None = None  # a fixed bound per held request; None: from the history (below)
    margin_s: float = 30.0  # added to the expected ready time: drain, stop, preflight, variance
    cap_s: float = 300.0  # the longest bound the history may give (and the bound without history)
    renew_s: float = 5.0  # how often the estimate and the gateway's lease are renewed during a switch


def expected_ready_s(history: Sequence[PastLaunch], spec_hash: str | None) -> float | None:
    """The median ready time of earlier launches: warm ones of this spec, else warm ones of the
    recipe, else any of this spec, else any (None: no history)."""
    warm = [h for h in history if h.start is StartState.WARM]
    for pool in (warm, history):
        same = [h.ready_s for h in pool if spec_hash is not None and h.spec_hash == spec_hash]
        if same:
            return float(median(same))
        if pool:
            return float(median(h.ready_s for h in pool))
    return None


def plan(reason: str, expected_s: float | None, policy: HoldPolicy, floor_s: float = 0.0) -> HoldPlan:
    """The hold for a switch expected to be ready in ``expected_s`` (None: unknown); ``floor_s``: a
    bound already promised (a renewal never shortens it)."""
    if policy.wait_s is not None:
        wait = policy.wait_s
    elif expected_s is None:
        wait = policy.cap_s
    else:
        wait = min(policy.cap_s, max(0.0, expected_s) + policy.margin_s)
    wait = max(wait, floor_s, 1.0)
    return HoldPlan(reason, round(wait, 1), None if expected_s is None else round(max(0.0, expected_s), 1))


def switch_view(serving: str | None, target: str, hold: HoldPlan, launches: int,
                fit: Fit | None = None) -> dict[str, object]:
    """Which path a switch to ``target`` takes and why, with the numbers (apply/restart answers, the
    console's confirm page): blue/green when the new launch fits beside the serving one (``fit``,
    blue_green.py), else drain, stop and start while the gateway holds new requests across the gap."""
    basis = (f"expected ready in ~{hold.expected_ready_s:g} s from {launches} earlier launch"
             f"{'' if launches == 1 else 'es'} of {target}" if hold.expected_ready_s is not None
             else f"no earlier launch of {target} reached ready")
    if serving is None:
        why = (f"start {target}: no engine serves now, so there is nothing to drain or to switch from "
               f"({basis})")
        return {"path": "start", "why": why, "wait_s": None, "expected_ready_s": hold.expected_ready_s,
                "launches": launches}
    numbers = dict(fit.numbers) if fit is not None else None
    if fit is not None and fit.fits:
        why = (f"blue/green: start {target} beside {serving} on port {fit.port} ({basis}); the gateway "
               f"keeps routing to {serving} until {target} is ready, then switches to it with no hold, "
               f"and {serving} is drained and stopped. If {target} fails, {serving} keeps serving. "
               f"It fits: {fit.why}")
        return {"path": "blue_green", "why": why, "wait_s": None, "expected_ready_s": hold.expected_ready_s,
                "launches": launches, "fit": numbers}
    capped = "" if hold.expected_ready_s is not None else ": the bound is the cap"
    not_beside = (f"Not blue/green: {fit.why}" if fit is not None else
                  "Not blue/green: asked without it (--no-blue-green), or this controller has no "
                  "blue/green check")
    why = (f"drain {serving} (in-flight requests finish), stop it, start {target}; the gateway holds new "
           f"requests meanwhile, each up to {hold.wait_s:g} s ({basis}{capped}), then 503 + Retry-After. "
           f"{not_beside}")
    return {"path": "hold", "why": why, "wait_s": hold.wait_s, "expected_ready_s": hold.expected_ready_s,
            "launches": launches, "fit": numbers}
