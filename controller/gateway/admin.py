"""The gateway's admin surface, used by the controller's supervisor (see ``control.py``).

Engines are named slots (``engines.py``). Every call takes an optional ``"engine": str`` (in the body
for PUT/POST, ``?engine=`` for GET/DELETE); absent means ``"default"``, so a controller that runs one
engine and names none works unchanged.

    GET  /admin/upstream[?engine=X]
         → {"upstream", "in_flight", "queue_waiting", "hold"} of that engine's slot; without
         ``engine``: the default slot's, plus ``"engines": {name: {the same four}}`` for every slot.
         404 for an engine that does not exist.
    PUT  /admin/upstream   {"engine": str, "url": str|null, "served_model": str|null, "aliases": [str],
                            "drain_deadline_s": float, "retry_after_s": int|null}
         acts on that engine's slot only (created if new): its new requests go to ``url`` at once (or
         get 503/queue when null); the call returns after requests on its previous upstream ended or
         were aborted at the deadline. The engine claims ``served_model`` and ``aliases`` (kept while
         ``url`` is null; a null ``served_model`` keeps the names it had): a request's ``model`` is
         routed to the engine claiming it. A name claimed by another engine → 409 naming that engine,
         and nothing changes.
         With ``"url": null`` and a ``"hold": {"reason", "wait_s", "expected_ready_s"}``, that engine's
         new requests are held (``hold/queue.py``) instead of refused, until its next upstream is set;
         with ``"url": null`` and no hold, its held requests get 503 with ``"detail"`` (why: the
         diagnosis' one line, "stopped") at once, and so do its new ones. Other engines keep answering.
    DELETE /admin/upstream?engine=X[&drain_deadline_s=S]
         removes the slot: its names answer 404 from now, its held requests get 503, its in-flight
         requests drain as for a switch to null (aborted at the deadline, 30 s by default).
    PUT  /admin/hold       {"engine", "reason", "wait_s", "expected_ready_s"}: renew that engine's
         hold (a later estimate, a fresh lease); 409 while it has an upstream, 404 if no such engine.
    POST /admin/drain      {"engine", "deadline_s": float, "abort": bool}
         waits for every in-flight request of that engine (without ``engine``: of every engine), up to
         the deadline; aborts the rest if asked.

Routing (``proxy.py``): with one engine every request goes to it, as before (a ``model`` it does not
serve is a 404). With several: the body's ``model`` → the engine claiming it; a name none claims →
404 ``model_not_found``; no ``model`` → 400 (which engine is meant cannot be told). ``GET /v1/models``
then merges every engine's listing: each engine with an upstream is asked; one without (or one that
does not answer) is listed from its claimed names, its cards marked ``"ready": false``.

Every call needs ``Authorization: Bearer <admin token>``; the gateway knows only the token's
sha256 (``APPLIANCE_ADMIN_TOKEN_SHA256``) and compares in constant time.
"""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any, TypeVar
from urllib.parse import parse_qs

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
from controller.gateway.engines import DEFAULT, Engine, Engines
from controller.gateway.hold.queue import MAX_WAIT_S, HoldPlan
from controller.gateway.metrics import GatewayMetrics
from controller.gateway.slot import DrainResult, Upstream

_ADMIN_BODY_LIMIT = 64 * 1024
M = TypeVar("M", bound=BaseModel)
# An engine's name: chosen by the controller, shown in admin answers and logs.
EngineName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]


class HoldRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str = Field(min_length=1, max_length=200)
    wait_s: float = Field(gt=0, le=MAX_WAIT_S)
    expected_ready_s: float | None = Field(default=None, ge=0, le=86400)

    def plan(self) -> HoldPlan:
        return HoldPlan(self.reason, self.wait_s, self.expected_ready_s)


class HoldRenewal(HoldRequest):
    engine: EngineName = DEFAULT


class UpstreamRequest(BaseModel):
    # hide_input: a 422 quotes the error, and the rejected input may be the engine key.
    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    engine: EngineName = DEFAULT
    url: str | None
    served_model: str | None = Field(default=None, min_length=1, max_length=256)
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

    # None: every engine.
    engine: EngineName | None = None
    deadline_s: float = Field(default=30.0, ge=0, le=3600)
    abort: bool = False


class _Query(BaseModel):
    """``?engine=…&drain_deadline_s=…`` of a GET or DELETE."""

    model_config = ConfigDict(extra="forbid")

    engine: EngineName | None = None
    drain_deadline_s: float = Field(default=30.0, ge=0, le=3600)


def upstream_view(up: Upstream | None) -> dict[str, Any] | None:
    if up is None:
        return None
    return {"url": up.url, "served_model": up.served_model, "aliases": sorted(up.aliases),
            "generation": up.generation}


def engine_view(engine: Engine) -> dict[str, Any]:
    return {"upstream": upstream_view(engine.slot.current), "in_flight": engine.slot.in_flight,
            "queue_waiting": engine.slot.waiting, "hold": engine.hold.view()}


def sum_drains(results: list[DrainResult]) -> DrainResult:
    return DrainResult(
        drained=all(r.drained for r in results), aborted=sum(r.aborted for r in results),
        remaining=sum(r.remaining for r in results), waited_s=max((r.waited_s for r in results), default=0.0),
    )


class Admin:
    def __init__(self, auth: AdminAuth, engines: Engines, metrics: GatewayMetrics) -> None:
        self.auth = auth
        self.engines = engines
        self.metrics = metrics

    def publish_ready(self) -> None:
        """``upstream_ready``: 1 when every engine has an upstream (one engine: as before);
        ``model_ready``: per engine, by its served name."""
        engines = list(self.engines)
        self.metrics.upstream_ready.set(1 if engines and all(e.slot.current for e in engines) else 0)
        self.metrics.model_ready.clear()
        for e in engines:
            self.metrics.model_ready.labels(e.label).set(1 if e.slot.current is not None else 0)

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
        if path == "/admin/upstream" and method in ("GET", "DELETE"):
            query = await self._query(scope, send)
            if query is None:
                return
            if method == "DELETE":
                await self._delete(send, query.engine or DEFAULT, query.drain_deadline_s)
                return
            if query.engine is not None:
                engine = await self._engine(send, query.engine)
                if engine is not None:
                    await send_json(send, 200, engine_view(engine))
                return
            default = self.engines.get(DEFAULT)
            view = (engine_view(default) if default is not None else
                    {"upstream": None, "in_flight": 0, "queue_waiting": 0, "hold": None})
            await send_json(send, 200, {**view, "engines": {e.name: engine_view(e) for e in self.engines}})
        elif path == "/admin/hold" and method == "PUT":
            renew = await self._parse(receive, send, HoldRenewal)
            if renew is None:
                return
            engine = await self._engine(send, renew.engine)
            if engine is None:
                return
            if engine.slot.current is not None:
                await send_error(send, 409, "an upstream is set: nothing to hold for", "conflict")
                return
            engine.hold.begin(renew.plan())
            await send_json(send, 200, {"hold": engine.hold.view()})
        elif path == "/admin/upstream" and method == "PUT":
            put = await self._parse(receive, send, UpstreamRequest)
            if put is not None:
                await self._put(send, put)
        elif path == "/admin/drain" and method == "POST":
            drain = await self._parse(receive, send, DrainRequest)
            if drain is None:
                return
            if drain.engine is None:
                targets = list(self.engines)
            else:
                one = await self._engine(send, drain.engine)
                if one is None:
                    return
                targets = [one]
            result = sum_drains(list(await asyncio.gather(
                *(e.slot.drain(drain.deadline_s, drain.abort) for e in targets))))
            self.metrics.drain_aborted.inc(result.aborted)
            await send_json(send, 200, result.as_dict())
        else:
            await send_error(send, 404, f"no admin route {method} {path}", "not_found")

    async def _put(self, send: Send, put: UpstreamRequest) -> None:
        if put.url is not None and (put.hold is not None or put.detail is not None):
            await send_error(send, 422, "hold and detail go with url null only", "invalid_request_error")
            return
        aliases = frozenset(put.aliases)
        conflict = self.engines.conflict(put.engine, put.served_model, aliases)
        if conflict is not None:
            # Checked before anything changes: one model name, one engine.
            name, other = conflict
            await send_error(send, 409, f"model name {name!r} is served by engine {other!r}", "conflict")
            return
        engine = self.engines.ensure(put.engine)
        if put.served_model is not None:
            self.engines.claim(engine, put.served_model, aliases)
        if put.url is None and put.hold is not None:
            engine.hold.begin(put.hold.plan())  # before the drain: new arrivals wait from now
        elif put.url is None:
            engine.hold.fail(put.detail or "no engine is ready: it was stopped")
            engine.slot.detail = put.detail
        if put.url is not None or put.hold is not None:
            engine.slot.detail = None
        up, result = await engine.slot.switch(
            put.url, put.served_model, put.drain_deadline_s, put.retry_after_s,
            upstream_key=put.api_key, aliases=put.aliases,
        )
        self.metrics.switches.inc()
        self.publish_ready()
        self.metrics.drain_aborted.inc(result.aborted)
        await send_json(send, 200, {"upstream": upstream_view(up), **result.as_dict(),
                                    "hold": engine.hold.view()})

    async def _delete(self, send: Send, name: str, deadline_s: float) -> None:
        engine = self.engines.remove(name)  # its names answer 404 from now on
        if engine is None:
            await send_error(send, 404, f"no engine {name!r}", "not_found")
            return
        engine.hold.fail(f"engine {name!r} was removed")
        engine.slot.detail = f"engine {name!r} was removed"
        _, result = await engine.slot.switch(None, None, deadline_s)
        if engine.pool is not None:  # its idle connections would otherwise stay open for good
            await engine.pool.close()
            engine.pool = None
        self.metrics.switches.inc()
        self.publish_ready()
        self.metrics.drain_aborted.inc(result.aborted)
        await send_json(send, 200, {"removed": name, **result.as_dict()})

    async def _engine(self, send: Send, name: str) -> Engine | None:
        engine = self.engines.get(name)
        if engine is None:
            await send_error(send, 404, f"no engine {name!r}", "not_found")
        return engine

    @staticmethod
    async def _query(scope: Scope, send: Send) -> _Query | None:
        raw = parse_qs(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        try:
            return _Query.model_validate({k: v[-1] for k, v in raw.items()})
        except ValidationError as exc:
            await send_error(send, 422, str(exc), "invalid_request_error")
            return None

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
