"""How the supervisor tells the gateway which engine slot is ready (or that there is none).

The gateway is a separate process (a controller restart must not drop a stream); its admin
surface takes `PUT /admin/upstream` (switch, draining the old slot) and `POST /admin/drain`
(controller/gateway/control.py). Without a gateway (tests, `serve --no-gateway`) the link is a
no-op. Gateway errors never stop the supervisor: the engine is still supervised, and the failure
is reported as an event.
"""

from __future__ import annotations

from typing import Protocol

from controller.gateway import control


class GatewayLink(Protocol):
    async def point_to(self, url: str, served_model: str) -> None:
        """New requests go to this engine."""
        ...

    async def drain(self, deadline_s: float, retry_after_s: float) -> None:
        """No slot for new requests; return once in-flight ones ended (or were cut at the deadline)."""
        ...

    async def clear(self, retry_after_s: float) -> None:
        """No slot: 503 + Retry-After for new requests, at once."""
        ...


class NoGateway:
    async def point_to(self, url: str, served_model: str) -> None:
        return None

    async def drain(self, deadline_s: float, retry_after_s: float) -> None:
        return None

    async def clear(self, retry_after_s: float) -> None:
        return None


class ControlGateway:
    """The real gateway, through its admin surface. `token` is the gateway's control token."""

    def __init__(self, url: str, token: str) -> None:
        self.url = url
        self._token = token

    async def point_to(self, url: str, served_model: str) -> None:
        await control.set_upstream(self.url, self._token, url, served_model, drain_deadline_s=0.0)

    async def drain(self, deadline_s: float, retry_after_s: float) -> None:
        await control.set_upstream(
            self.url, self._token, None, None, drain_deadline_s=deadline_s, retry_after_s=_secs(retry_after_s)
        )

    async def clear(self, retry_after_s: float) -> None:
        await control.set_upstream(
            self.url, self._token, None, None, drain_deadline_s=0.0, retry_after_s=_secs(retry_after_s)
        )


def _secs(value: float) -> int:
    return max(1, round(value))


GatewayError = control.GatewayControlError
