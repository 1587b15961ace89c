"""The path of a planned switch and the gateway's hold across it (hold_plan.py, gateway/hold/queue.py).

Owns what the driver used to keep beside the machine for a switch: the bound the current hold
promised (a renewal never shortens it) and when it is renewed next; which path a switch takes
(blue/green beside the serving engine when `beside` says it fits, else drain, stop and start under a
hold), said as `switch-path` events and in `switch_plan` for the apply/restart answers; and the
drain and blue/green switch themselves, with what they cut (`drained`/`switched` events, metrics).
The driver submits what follows (`Drained`); this never touches the machine, it reads it.

Per engine: one gateway slot (its `GatewaySync`), one machine (its `MachineView`), its launch runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import replace
from typing import Any

from appliance.recipe.launch_port import on_port
from controller.supervisor import status_view
from controller.supervisor.blue_green import CHECK_ERRORS, Fit, moved
from controller.supervisor.gateway_link import HoldPlan
from controller.supervisor.gateway_sync import GatewaySync
from controller.supervisor.hold_plan import HoldPolicy, expected_ready_s, switch_view
from controller.supervisor.hold_plan import plan as hold_plan
from controller.supervisor.host_seams import HostSeams
from controller.supervisor.launch_run import LaunchRuns
from controller.supervisor.machine import State
from controller.supervisor.machine_view import MachineView
from controller.supervisor.signals import DrainGateway, PreflightOk, SwitchUpstream


class HoldKeeper:
    def __init__(self, host: HostSeams, view: MachineView, runs: LaunchRuns, gateway_sync: GatewaySync,
                 policy: HoldPolicy) -> None:
        self._host = host
        self._view = view
        self._runs = runs
        self._sync = gateway_sync
        self._policy = policy
        self._next_renewal = 0.0
        self._floor_s = 0.0  # the bound the current hold promised (renewals never shorten it)

    def begin(self, reason: str) -> HoldPlan:
        """The hold to begin now: its bound from the target's history."""
        self._floor_s = 0.0
        self._next_renewal = self._host.clock.now() + self._policy.renew_s
        plan = hold_plan(reason, self.expected_ready_s(), self._policy)
        self._floor_s = plan.wait_s
        return plan

    def expected_ready_s(self) -> float | None:
        """Seconds until the engine being switched to is expected ready (None: no history)."""
        m, now = self._view.machine, self._host.clock.now()
        launch = m.launch
        if m.state is State.STARTING and launch is not None:
            expected = status_view.eta(launch, self._runs.get(launch.launch_id), now)
            if expected is not None and expected.remaining_s is not None:
                return max(0.0, expected.remaining_s)
        spec = m.pending.spec if m.pending is not None else (launch.spec if launch is not None else None)
        recipe = spec.recipe if spec is not None else m.recipe
        if recipe is None:
            return None
        history = self._host.store.ready_history(recipe, spec.spec_hash if spec is not None else "")
        ready = expected_ready_s(history, spec.spec_hash if spec is not None else None)
        if ready is None:
            return None
        if m.state is State.BACKOFF and m.backoff_until is not None:
            ready += max(0.0, m.backoff_until - now)
        return ready

    def renewal(self) -> Coroutine[Any, Any, None] | None:
        """While a switch goes on, the gateway's next estimate and fresh lease, when one is due (a hold
        the controller stops renewing lapses: a dead controller leaves nobody waiting long)."""
        reason = self._sync.holding
        now = self._host.clock.now()
        if reason is None or self._view.state in (State.READY, State.IDLE, State.FAILED):
            return None
        if now < self._next_renewal:
            return None
        self._next_renewal = now + self._policy.renew_s
        plan = hold_plan(reason, self.expected_ready_s(), self._policy, floor_s=self._floor_s)
        self._floor_s = plan.wait_s
        return self._sync.renew_hold(plan, now)

    def switch_plan(self, recipe: str, spec_hash: str | None = None, *,
                    drain_first: bool = False) -> dict[str, object]:
        """Which path a switch to `recipe` (an apply, or a restart: the serving recipe) takes now and
        why, with the numbers (hold_plan.switch_view); `drain_first`: asked without blue/green (it
        always drains first)."""
        history = self._host.store.ready_history(recipe, spec_hash or "")
        expected = expected_ready_s(history, spec_hash)
        m = self._view.machine
        launch = m.launch
        ready = m.state is State.READY and launch is not None and m.old is None
        serving = launch.spec.recipe if ready and launch is not None else None
        plan = hold_plan("restart" if serving == recipe else f"switching to {recipe}", expected,
                         self._policy)
        fit: Fit | None = None
        beside = self._host.beside
        if ready and not drain_first and beside is not None and launch is not None and launch.handle:
            try:
                fit = beside(recipe, None, launch.spec, launch.handle)
            except CHECK_ERRORS as exc:  # a preview: the switch itself decides again
                fit = Fit(False, f"the blue/green check failed ({exc})")
        return switch_view(serving, recipe, plan, len(history), fit)

    def status(self) -> dict[str, Any] | None:
        """The gateway's hold during a switch, for the status: reason, bound, requests held (None
        until the gateway said), seconds to the expected ready time."""
        view = self._sync.hold_view
        if view is None or self._sync.holding is None or self._view.state is State.READY:
            return None
        ready_in = view.get("ready_in_s")
        at = view.get("at")
        if isinstance(ready_in, int | float) and isinstance(at, int | float):
            ready_in = max(0.0, ready_in - (self._host.clock.now() - at))
        return {"reason": view["reason"], "wait_s": view["wait_s"], "waiting": view["waiting"],
                "ready_in_s": None if ready_in is None else round(float(ready_in), 1)}

    def blue_green_status(self) -> dict[str, Any] | None:
        """The other engine of a blue/green switch: still serving (the new one starts beside it) or
        being drained and stopped (the gateway routes to the new one). None: one engine."""
        m = self._view.machine
        if m.old is None:
            return None
        return {"old_launch_id": m.old.launch_id, "old_recipe": m.old.spec.recipe,
                "old_url": m.old.spec.base_url, "old": "stopping" if m.switched else "serving"}

    # ------------------------------------------------------------------------------------------
    # The switch itself

    async def blue_green(self, ok: PreflightOk) -> PreflightOk:
        """The launch moved to a free port and marked `beside` when it fits beside the serving engine
        (blue_green.py); unchanged otherwise (the switch then holds)."""
        m = self._view.machine
        serving = m.launch
        beside, note = self._host.beside, self._host.events.note
        if (beside is None or not m.blue_green or m.state is not State.PREFLIGHT or ok.token != m.token
                or serving is None or serving.handle is None or m.old is not None):
            return ok
        if (not m.force and serving.spec.recipe == ok.spec.recipe
                and on_port(ok.spec, serving.spec.port).spec_hash == serving.spec.spec_hash):
            return ok  # the very launch that serves: the machine answers "unchanged"
        cold = ok.empty_cache_first is not None or ok.cache_empty
        try:
            fit = await asyncio.to_thread(beside, ok.spec.recipe, cold, serving.spec, serving.handle)
        except CHECK_ERRORS as exc:  # the check is an optimisation: a failed look means the hold path
            note("switch-path", f"hold: the blue/green check failed ({exc})", ok.launch_id,
                 {"path": "hold"})
            return ok
        data: dict[str, object] = {"path": "blue_green" if fit.fits else "hold", **fit.numbers}
        if not fit.fits:
            note("switch-path", f"hold, not blue/green: {fit.why}", ok.launch_id, data)
            return ok
        note("switch-path", f"blue/green: {fit.why}", ok.launch_id, data)
        return replace(ok, spec=moved(ok.spec, fit), beside=True)

    async def switch(self, action: SwitchUpstream) -> None:
        """Blue/green: point the gateway at the new engine and let the old one's requests finish (the
        driver then has the old one stopped)."""
        result = await self._sync.switch(action.launch_id, action.base_url, action.served_model_name,
                                         action.deadline_s)
        cut = result.aborted if result is not None else 0
        self._host.metrics.record_switch("blue_green", cut)
        said = ("" if result is None else
                f"; {cut} in-flight request(s) on the old engine cut at the drain deadline of "
                f"{action.deadline_s:g} s" if cut else f"; the old engine's requests finished in "
                f"{result.waited_s:.1f} s")
        self._host.events.note(
            "switched", f"blue/green: the gateway routes to {action.base_url}{said}; stopping the "
            "old engine", action.launch_id,
            {"path": "blue_green", "cut": cut, "old_launch_id": action.old_id,
             "waited_s": None if result is None else round(result.waited_s, 3)})

    async def drain(self, action: DrainGateway) -> None:
        """Drain the gateway before a stop, under a hold when the stop is a planned switch."""
        hold = self.begin(action.hold) if action.hold is not None else None
        path = "hold" if hold is not None else "stop"
        note = self._host.events.note
        if hold is not None:
            note("switch-path", f"{hold.reason}: drain, stop, start; the gateway holds new requests "
                 f"meanwhile (each up to {hold.wait_s:g} s)", action.launch_id,
                 {"path": path, "wait_s": hold.wait_s, "expected_ready_s": hold.expected_ready_s})
        m = self._view.machine
        result = await self._sync.drain(action.launch_id, action.deadline_s, m.policy.retry_after_s, hold,
                                        self._host.clock.now())
        cut = result.aborted if result is not None else 0
        self._host.metrics.record_switch(path, cut)
        if result is not None:
            said = (f"{cut} in-flight request(s) cut at the drain deadline of {action.deadline_s:g} s"
                    if cut else f"in-flight requests finished in {result.waited_s:.1f} s")
            note("drained", f"drained before the stop: {said}", action.launch_id,
                 {"cut": cut, "waited_s": round(result.waited_s, 3), "path": path})
