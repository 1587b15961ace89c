"""How the supervisor tells the gateway which engine slot is ready (or that there is none).

The gateway is a separate process (a controller restart must not drop a stream); its admin
surface takes `PUT /admin/upstream` (switch, draining the old slot) and `POST /admin/drain`;
its one client, `ControlGateway`, is controller/gateway/control.py. This module is the
supervisor's side: the `GatewayLink` protocol that client meets. Without a gateway (tests,
`serve --no-gateway`) the link is a no-op. Gateway errors never stop the supervisor: the engine is
still supervised, and the failure is reported as an event.

The gateway keeps its slot in memory only: a gateway restarted under a running controller starts
with no upstream and answers 503 until told again. `current()` (`GET /admin/upstream`, cheap) lets
the driver see that while its engine is ready and re-send the upstream.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from controller.gateway.control import DrainResult as DrainResult
from controller.gateway.control import GatewayControlError

# Re-exported: the GatewayLink protocol's own type (what `current()` answers).
from controller.gateway.control import GatewayUpstream as GatewayUpstream
from controller.gateway.hold.queue import HoldPlan as HoldPlan


def same_upstream(current: GatewayUpstream | None, url: str, served_model: str,
                  aliases: Sequence[str] = ()) -> bool:
    """Does the gateway route to this engine, under these names? (It strips a trailing slash from the
    URL it stores.)"""
    return (current is not None and current.url.rstrip("/") == url.rstrip("/")
            and current.served_model == served_model and current.aliases == frozenset(aliases))


class GatewayLink(Protocol):
    async def point_to(
        self, url: str, served_model: str, api_key: str | None = None, aliases: Sequence[str] = ()
    ) -> None:
        """New requests go to this engine, with `Authorization: Bearer <api_key>` (the engine's
        per-launch key, engine_key.py) instead of the client's own header. `aliases`: other names
        clients may use for the served model (the gateway answers 404 for any other)."""
        ...

    async def switch(
        self, url: str, served_model: str, api_key: str | None, deadline_s: float,
        aliases: Sequence[str] = (),
    ) -> DrainResult | None:
        """Blue/green: new requests go to this engine at once; return once the requests running on the
        previous one ended (or were cut at the deadline), saying how many were cut (None: not known)."""
        ...

    async def drain(
        self, deadline_s: float, retry_after_s: float, hold: HoldPlan | None = None
    ) -> DrainResult | None:
        """No slot for new requests (held, with `hold`); return once in-flight ones ended (or were cut
        at the deadline), saying how many were cut (None: not known)."""
        ...

    async def clear(
        self, retry_after_s: float, hold: HoldPlan | None = None, detail: str | None = None
    ) -> None:
        """No slot: new requests held (`hold`: a start follows), else 503 + Retry-After at once, and
        requests still held answered with `detail`."""
        ...

    async def renew_hold(self, hold: HoldPlan) -> dict[str, Any] | None:
        """A later ready estimate, and a fresh lease for the hold (it lapses without one); answers
        the gateway's view of it (`waiting`: how many requests it holds), None if not known."""
        ...

    async def current(self) -> GatewayUpstream | None:
        """The gateway's upstream now (None: no slot, e.g. a gateway that just restarted)."""
        ...


class NoGateway:
    """No gateway process: remembers what it was told, so `current()` never asks for a re-send."""

    def __init__(self) -> None:
        self._upstream: GatewayUpstream | None = None

    async def point_to(
        self, url: str, served_model: str, api_key: str | None = None, aliases: Sequence[str] = ()
    ) -> None:
        self._upstream = GatewayUpstream(url, served_model, frozenset(aliases))

    async def switch(
        self, url: str, served_model: str, api_key: str | None, deadline_s: float,
        aliases: Sequence[str] = (),
    ) -> DrainResult | None:
        self._upstream = GatewayUpstream(url, served_model, frozenset(aliases))
        return None

    async def drain(
        self, deadline_s: float, retry_after_s: float, hold: HoldPlan | None = None
    ) -> DrainResult | None:
        self._upstream = None
        return None

    async def clear(
        self, retry_after_s: float, hold: HoldPlan | None = None, detail: str | None = None
    ) -> None:
        self._upstream = None

    async def renew_hold(self, hold: HoldPlan) -> dict[str, Any] | None:
        return None

    async def current(self) -> GatewayUpstream | None:
        return self._upstream


GatewayError = GatewayControlError
