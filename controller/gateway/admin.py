"""The gateway's admin surface, used by the controller's supervisor (see ``control.py``).

    GET  /admin/upstream   → the current upstream
    PUT  /admin/upstream   {"url": str|null, "served_model": str|null, "aliases": [str],
                            "drain_deadline_s": float, "retry_after_s": int|null}
         new requests go to ``url`` at once (or get 503/queue when null); the call returns after
         requests on the previous upstream ended or were aborted at the deadline.
         With ``"url": null`` and a ``"hold": {"reason", "wait_s", "expected_ready_s"}``, new
         requests are held (``hold/queue.py``) instead of refused, until the next upstream is set; with
         ``"url": null`` and no hold, any held requests get 503 with ``"detail"`` (why: the
         diagnosis' one line, "stopped") at once.
    PUT  /admin/hold       {"reason", "wait_s", "expected_ready_s"}: renew the hold (a later
         estimate, a fresh lease); 409 while an upstream is set.
    POST /admin/drain      {"deadline_s": float, "abort": bool}
         waits for every in-flight request, up to the deadline; aborts the rest if asked.

Every call needs ``Authorization: Bearer <admin token>``; the gateway knows only the token's
sha256 (``APPLIANCE_ADMIN_TOKEN_SHA256``) and compares in constant time.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from appliance.recipe.key_chars import key_problem
from controller.gateway.asgi import (
    BodyTooLarge,
    ClientGone,
    Receive,
    Scope,
    Send,
    read_body,
    send_error,
    send_json,
)
from controller.gateway.auth import AdminAuth
from controller.gateway.hold.queue import MAX_WAIT_S, Hold, HoldPlan
from controller.gateway.metrics import GatewayMetrics
from controller.gateway.slot import Slot, Upstream

_ADMIN_BODY_LIMIT = 64 * 1024
M = TypeVar("M", bound=BaseModel)


class HoldRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str = Field(min_length=1, max_length=200)
    wait_s: float = Field(gt=0, le=MAX_WAIT_S)
    expected_ready_s: float | None = Field(default=None, ge=0, le=86400)

    def plan(self) -> HoldPlan:
        return HoldPlan(self.reason, self.wait_s, self.expected_ready_s)


class UpstreamRequest(BaseModel):
    # hide_input: a 422 quotes the error, and the rejected input may be the engine key.
    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    url: str | None
    served_model: str | None = None
    # Other names for the served model that clients may use (the recipe's `model.aliases`).
    aliases: list[Annotated[str, Field(min_length=1, max_length=256)]] = Field(default_factory=list,
                                                                                max_length=64)
    drain_deadline_s: float = Field(default=30.0, ge=0, le=3600)
    retry_after_s: int | None = Field(default=None, ge=1, le=3600)
    # The engine's own API key: sent upstream as the bearer token; never shown back.
    api_key: str | None = Field(default=None, min_length=1, max_length=512, repr=False)
    # Only with url null: hold new requests while the controller switches engines on purpose.
    hold: HoldRequest | None = None
    # Only with url null and no hold: why there is no engine (held requests are answered with it).
    detail: str | None = Field(default=None, max_length=1000)

    @field_validator("url")
    @classmethod
    def _http_url(cls, v: str | None) -> str | None:
        if v is not None and not (v.startswith("http://") or v.startswith("https://")):
            raise ValueError("url must start with http:// or https://")
        return v

    @field_validator("api_key")
    @classmethod
    def _key_fits_a_header(cls, v: str | None) -> str | None:
        # Sent raw as `Authorization: Bearer KEY` on every proxied request: a CR/LF would inject
        # headers (appliance/recipe/key_chars.py). The message names the rule, never the key.
        problem = key_problem(v) if v is not None else None
        if problem is not None:
            raise ValueError(problem)
        return v


class DrainRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    deadline_s: float = Field(default=30.0, ge=0, le=3600)
    abort: bool = False


def upstream_view(up: Upstream | None) -> dict[str, Any] | None:
    if up is None:
        return None
    return {"url": up.url, "served_model": up.served_model, "aliases": sorted(up.aliases),
            "generation": up.generation}


class Admin:
    def __init__(
        self, auth: AdminAuth, slot: Slot, metrics: GatewayMetrics, hold: Hold | None = None
    ) -> None:
        self.auth = auth
        self.slot = slot
        self.metrics = metrics
        self.hold = hold or Hold()

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self.auth.enabled:
            await send_error(
                send, 403, "admin surface disabled: set APPLIANCE_ADMIN_TOKEN_SHA256", "permission_error"
            )
            return
        authorization = next((v for k, v in scope["headers"] if k == b"authorization"), None)
        if not self.auth.check(authorization):
            await send_error(
                send, 401, "invalid admin token", "authentication_error", [(b"www-authenticate", b"Bearer")]
            )
            return
        path, method = scope["path"], scope["method"]
        if path == "/admin/upstream" and method == "GET":
            await send_json(
                send,
                200,
                {
                    "upstream": upstream_view(self.slot.current),
                    "in_flight": self.slot.in_flight,
                    "queue_waiting": self.slot.waiting,
                    "hold": self.hold.view(),
                },
            )
        elif path == "/admin/hold" and method == "PUT":
            renew = await self._parse(receive, send, HoldRequest)
            if renew is None:
                return
            if self.slot.current is not None:
                await send_error(send, 409, "an upstream is set: nothing to hold for", "conflict")
                return
            self.hold.begin(renew.plan())
            await send_json(send, 200, {"hold": self.hold.view()})
        elif path == "/admin/upstream" and method == "PUT":
            put = await self._parse(receive, send, UpstreamRequest)
            if put is not None:
                if put.url is not None and (put.hold is not None or put.detail is not None):
                    await send_error(send, 422, "hold and detail go with url null only",
                                     "invalid_request_error")
                    return
                if put.url is None and put.hold is not None:
                    self.hold.begin(put.hold.plan())  # before the drain: new arrivals wait from now
                elif put.url is None:
                    self.hold.fail(put.detail or "no engine is ready: it was stopped")
                up, result = await self.slot.switch(
                    put.url, put.served_model, put.drain_deadline_s, put.retry_after_s,
                    upstream_key=put.api_key, aliases=put.aliases,
                )
                self.metrics.switches.inc()
                self.metrics.upstream_ready.set(1 if up is not None else 0)
                self.metrics.drain_aborted.inc(result.aborted)
                await send_json(send, 200, {"upstream": upstream_view(up), **result.as_dict(),
                                            "hold": self.hold.view()})
        elif path == "/admin/drain" and method == "POST":
            drain = await self._parse(receive, send, DrainRequest)
            if drain is not None:
                result = await self.slot.drain(drain.deadline_s, drain.abort)
                self.metrics.drain_aborted.inc(result.aborted)
                await send_json(send, 200, result.as_dict())
        else:
            await send_error(send, 404, f"no admin route {method} {path}", "not_found")

    @staticmethod
    async def _parse(receive: Receive, send: Send, model: type[M]) -> M | None:
        try:
            raw = await read_body(receive, _ADMIN_BODY_LIMIT)
            return model.model_validate(json.loads(raw or b"{}"))
        except ValidationError as exc:  # before ValueError: it is one
            await send_error(send, 422, str(exc), "invalid_request_error")
        except ValueError as exc:
            await send_error(send, 400, f"malformed JSON body: {exc}", "invalid_request_error")
        except BodyTooLarge:
            await send_error(send, 413, "admin request body too large", "invalid_request_error")
        except ClientGone:
            pass  # nobody to answer
        return None
