"""Keeps the gateway's one upstream slot in step with the supervisor (the driver's gateway role).

The driver's actions call `drain`, `point_to` (with the machine's SetUpstream: the ready slot's URL
and served model, LaunchSpec.base_url) and `clear`; while ready, `check` (every
`check_interval_s`) re-sends the upstream when the gateway routes elsewhere or nowhere — a gateway
restarted under a running controller has no slot and answers 503 until told again. Every call
runs under one lock, so a periodic check never undoes a drain or clear that overtook it. A failed
call is an event for the operator, never an exception for the supervisor.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

from controller.supervisor.gateway_link import DrainResult, GatewayError, GatewayLink, HoldPlan, same_upstream
from controller.supervisor.machine import Launch

NoteFn = Callable[[str, str, str | None, Mapping[str, object] | None], None]


class GatewaySync:
    def __init__(
        self,
        gateway: GatewayLink,
        *,
        ready_launch: Callable[[], Launch | None],
        engine_key: Callable[[str], str | None],
        note: NoteFn,
        check_interval_s: float,
    ) -> None:
        self.gateway = gateway
        self._ready_launch = ready_launch  # the current launch while the supervisor is ready, else None
        self._engine_key = engine_key
        self._note = note
        self.check_interval_s = check_interval_s
        self._lock = asyncio.Lock()
        self._checking = False
        self._next_check = 0.0
        self._unreachable = False
        # The reason of the hold the gateway was last told to keep (None: none); renewed while a
        # switch goes on, so that the gateway's lease does not lapse (controller/gateway/hold/queue.py).
        self.holding: str | None = None
        # What the status shows of it: reason, bound, requests held (None until the gateway said),
        # seconds to the expected ready time (as of `at`, the controller's clock).
        self.hold_view: dict[str, Any] | None = None

    def _held(self, hold: HoldPlan | None, now: float | None = None) -> None:
        self.holding = hold.reason if hold is not None else None
        self.hold_view = None if hold is None else {
            "reason": hold.reason, "wait_s": hold.wait_s, "waiting": None,
            "ready_in_s": hold.expected_ready_s, "at": now}

    async def drain(self, launch_id: str, deadline_s: float, retry_after_s: float,
                    hold: HoldPlan | None = None, now: float | None = None) -> DrainResult | None:
        async with self._lock:
            self._held(hold, now)
            try:
                return await self.gateway.drain(deadline_s, retry_after_s, hold)
            except GatewayError as exc:
                self._note("gateway-error", f"drain: {exc}", launch_id, None)
                return None

    async def renew_hold(self, plan: HoldPlan, now: float | None = None) -> None:
        """A later estimate and a fresh lease, while the hold is still ours to renew."""
        async with self._lock:
            if self.holding != plan.reason:
                return  # cleared, pointed or given another reason meanwhile
            try:
                view = await self.gateway.renew_hold(plan)
                waiting = view.get("waiting") if view is not None else None
                self.hold_view = {"reason": plan.reason, "wait_s": plan.wait_s,
                                  "waiting": waiting if isinstance(waiting, int) else None,
                                  "ready_in_s": plan.expected_ready_s, "at": now}
            except GatewayError as exc:
                if exc.status != 409:  # 409: an upstream is set (it raced us); nothing to hold for
                    self._note("gateway-error", f"hold renewal: {exc}", None, None)

    async def point_to(self, launch_id: str, url: str, served_model: str, what: str = "point_to") -> None:
        async with self._lock:
            launch = self._ready_launch()
            if launch is None or launch.launch_id != launch_id:
                return  # it stopped being ready before we got here
            self._held(None)
            try:
                await self.gateway.point_to(url, served_model, self._engine_key(launch_id),
                                            launch.spec.served_model_aliases)
            except GatewayError as exc:
                self._note("gateway-error", f"{what}: {exc}", launch_id, None)

    async def switch(self, launch_id: str, url: str, served_model: str,
                     deadline_s: float) -> DrainResult | None:
        """Blue/green: new requests go to this ready engine at once; returns once the requests still
        running on the previous one ended (or were cut at the deadline)."""
        async with self._lock:
            launch = self._ready_launch()
            if launch is None or launch.launch_id != launch_id:
                return None  # it stopped being ready before we got here
            self._held(None)
            try:
                return await self.gateway.switch(url, served_model, self._engine_key(launch_id), deadline_s,
                                                 launch.spec.served_model_aliases)
            except GatewayError as exc:
                self._note("gateway-error", f"switch: {exc}", launch_id, None)
                return None

    async def clear(self, retry_after_s: float, reason: str, hold: HoldPlan | None = None,
                    detail: str | None = None, now: float | None = None) -> None:
        async with self._lock:
            self._held(hold, now)
            try:
                await self.gateway.clear(retry_after_s, hold, detail)
            except GatewayError as exc:
                self._note("gateway-error", f"clear ({reason}): {exc}", None, None)

    def check_due(self, now: float) -> bool:
        """Whether a check should start now (then it is counted as started: one at a time)."""
        if self._checking or now < self._next_check:
            return False
        self._checking = True
        self._next_check = now + self.check_interval_s
        return True

    async def check(self, launch: Launch) -> None:
        """Re-send the upstream when the gateway routes elsewhere or nowhere (it restarted, or the
        point_to at ready time failed). Under the lock: a drain or clear is never undone."""
        try:
            async with self._lock:
                current = self._ready_launch()
                if current is not None and current.launch_id == launch.launch_id:
                    await self._reassert_upstream(launch)
        finally:
            self._checking = False

    async def _reassert_upstream(self, launch: Launch) -> None:
        spec = launch.spec
        url, model, aliases = spec.base_url, spec.served_model_name, spec.served_model_aliases
        try:
            found = await self.gateway.current()
            if not same_upstream(found, url, model, aliases):
                await self.gateway.point_to(url, model, self._engine_key(launch.launch_id), aliases)
        except GatewayError as exc:
            if not self._unreachable:  # said once per outage, not every check
                self._unreachable = True
                self._note("gateway-error", f"upstream check: {exc}", launch.launch_id, None)
            return
        if self._unreachable:
            self._unreachable = False
            self._note("gateway-reachable", "the gateway answers again", launch.launch_id, None)
        if not same_upstream(found, url, model, aliases):
            was = {"url": found.url, "served_model": found.served_model} if found else None
            routed = found.url if found else "nothing"
            self._note("gateway-upstream-restored",
                       f"the gateway routed to {routed}: upstream {url} sent again", launch.launch_id,
                       {"found": was, "url": url, "served_model": model})
