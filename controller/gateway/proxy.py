"""Forwarding one OpenAI-compatible request to the current upstream, streaming the answer back.

The hot path, per request: scan headers once, check the key (a dict lookup and one sha256), read the
body, find a JSON body's top-level model (``jsonbody``: no full parse, no re-serialisation; large
bodies in a worker thread), pick the engine serving it (``engines``: a dict lookup on that name) and
its upstream, one request on a pooled connection of that engine (``upstream_client``). Per chunk:
one ``read``, two clock reads, two histogram observations when streaming, one ASGI ``send`` with
the bytes exactly as they arrived (no parsing, no re-framing, so the client receives byte for byte
what the engine sent).

When the client goes away, the request's task is cancelled: the upstream connection is then closed at
once, whether we were waiting for the first token or in the middle of a stream, and vLLM aborts the
generation when its socket closes. The gateway's protocol reports the lost connection through a hook
in the scope (``protocol.DISCONNECT_HOOK``); under another server a watcher task waits on ASGI
``receive`` for ``http.disconnect`` instead.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from time import perf_counter
from typing import Any

from controller.gateway.asgi import (
    JSON,
    BodyTooLarge,
    ClientGone,
    Headers,
    Receive,
    Scope,
    Send,
    read_body,
    send_bytes,
    send_error,
)
from controller.gateway.auth import AuthFailure, KeyCache
from controller.gateway.config import GatewayConfig
from controller.gateway.engines import DEFAULT, UNKNOWN_MODEL, Engine, Engines
from controller.gateway.hold.sse import wait_for_release
from controller.gateway.hop_headers import HOP_BY_HOP, end_to_end
from controller.gateway.jsonbody import BodyError, ModelNotFound, ModelRef, alias_model, read_model
from controller.gateway.keystore import KeyRecord
from controller.gateway.limits import KeyLimiter, LimitExceeded
from controller.gateway.metrics import GatewayMetrics
from controller.gateway.protocol import CLIENT_GONE, DISCONNECT_HOOK, DisconnectHook, client_closed
from controller.gateway.slot import NoSlot, NoSlotPolicy, Upstream
from controller.gateway.upstream_client import (
    BrokenResponse,
    ConnectRefused,
    ConnectTimeout,
    ReadTimeout,
    RefusedRequest,
    StaleConnection,
    UpstreamConnection,
    UpstreamFailure,
    UpstreamPool,
    may_retry,
)
from controller.gateway.usage.accounting import Accounting
from controller.gateway.usage.meter import (
    BodyMeter,
    Metering,
    RequestPlan,
    StreamMeter,
    StreamPlan,
    Usage,
    plan_request,
)
from controller.gateway.usage.ratelimit_headers import ratelimit_headers
from controller.gateway.usage.request import is_json_media_type, may_stream

log = logging.getLogger(__name__)

# Called with (request id, bytes exactly as received from upstream); tests use it to prove the
# passthrough is byte for byte.
Tee = Callable[[bytes, bytes], None]

STATUS_CLIENT_GONE = 499  # nginx's convention: the client closed the connection first

# Routes get their own metric label; anything else under /v1 is "/v1/other" (bounded cardinality).
KNOWN_ROUTES = frozenset(
    {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/models",
        "/v1/embeddings",
        "/v1/responses",
        "/v1/rerank",
        "/v1/score",
        "/v1/audio/transcriptions",
        "/v1/audio/translations",
    }
)

MODELS_ROUTE = "/v1/models"


def listing_cards(
    body: bytes, served_model: str | None, aliases: frozenset[str] = frozenset(),
    allowed: frozenset[str] | None = None,
) -> tuple[dict[str, Any], list[Any]] | None:
    """vLLM's `GET /v1/models` answer (the document, its cards) with each card's `root` (the model's
    absolute path on the engine's host) replaced by the served name (the card's own `id` when the
    gateway knows none), and after the served model's card one card per alias (the same fields, `id`
    the alias: the names the gateway accepts); only the cards of ``allowed`` names (a key limited to
    some models; their aliases too) when given. None for a body that is not such a listing."""
    try:
        data = json.loads(body)
        cards = data["data"]
        if not isinstance(cards, list):
            raise TypeError("data is not a list")
        listed: list[Any] = []
        for card in cards:
            if isinstance(card, dict) and "root" in card:
                card["root"] = served_model if served_model is not None else card.get("id")
            listed.append(card)
            if isinstance(card, dict) and served_model is not None and card.get("id") == served_model:
                listed += [{**card, "id": alias} for alias in sorted(aliases)]
        if allowed is not None:
            everything = served_model is not None and served_model in allowed
            listed = [c for c in listed if everything or (isinstance(c, dict) and c.get("id") in allowed)]
        data["data"] = listed
    except (ValueError, TypeError, KeyError):
        return None
    return data, listed


def models_listing(
    body: bytes, served_model: str | None, aliases: frozenset[str] = frozenset(),
    allowed: frozenset[str] | None = None,
) -> bytes | None:
    """``listing_cards`` as the bytes passed to the client; None for a body that is not a listing
    (compressed, not JSON), which is then not passed on."""
    read = listing_cards(body, served_model, aliases, allowed)
    return None if read is None else json.dumps(read[0], ensure_ascii=False).encode()


def down_cards(engine: Engine, allowed: frozenset[str] | None) -> list[dict[str, Any]]:
    """An engine without an upstream (or whose listing could not be read) in the merged listing:
    its claimed names, marked ``"ready": false``."""
    served = engine.served_model
    if served is None:
        return []
    names = [served, *sorted(engine.aliases)]
    if allowed is not None and served not in allowed:
        names = [n for n in names if n in allowed]
    return [{"id": n, "object": "model", "created": 0, "owned_by": "appliance", "root": served,
             "parent": None, "ready": False} for n in names]


def model_not_allowed(model: str) -> bytes:
    """OpenAI's error shape for a key limited to other models (403); names the requested model only."""
    shown = model if len(model) <= 256 else model[:256] + "…"
    return json.dumps({"error": {
        "message": f"This key may not use the model `{shown}`.",
        "type": "invalid_request_error", "param": "model", "code": "model_not_allowed",
    }}, ensure_ascii=False).encode()


def model_allowed(allowed: frozenset[str] | None, engine: Engine, name: str | None) -> bool:
    """May a key limited to ``allowed`` models (None: all) send ``name`` (None: no model named) to
    ``engine``? Its served name allows its aliases too. A name the engine does not serve is let
    through to its 404."""
    if allowed is None:
        return True
    if name is not None and engine.served_model is not None and name not in engine.names:
        return True
    return (name is not None and name in allowed) or (
        engine.served_model is not None and engine.served_model in allowed)


# Never forwarded upstream: hop-by-hop headers (``hop_headers``: the fixed ones and any the client's
# Connection header names), the client's credentials, and headers we set.
_DROP_REQUEST = HOP_BY_HOP | {
    b"host",
    b"authorization",
    b"proxy-authorization",
    b"content-length",
    b"expect",
    b"x-request-id",
}
# Never passed back: hop-by-hop (uvicorn frames the body itself; and any the upstream's Connection
# header names) and the id we set.
_DROP_RESPONSE = HOP_BY_HOP | {b"x-request-id"}
_DROP_REQUEST_MODELS = _DROP_REQUEST | {b"accept-encoding"}
_REQUEST_ID_RE = re.compile(rb"^[A-Za-z0-9._:-]{1,128}$")
_CLOSE = (b"connection", b"close")


def route_label(path: str) -> str:
    return path if path in KNOWN_ROUTES else "/v1/other"


class _RequestState:
    """Why the request's task was cancelled (by us), and how far the response got."""

    __slots__ = ("finished", "reason", "response_started", "status", "task")

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self.task = task
        self.reason: str | None = None  # "client" (disconnected) or "drain" (deadline passed)
        self.finished = False
        self.response_started = False
        self.status = 0

    def abort(self) -> None:
        if not self.finished and self.reason is None:
            self.reason = "drain"
            self.task.cancel()

    def client_gone(self) -> None:
        # uvicorn also reports "disconnect" once our response is complete; only a real one counts.
        if not self.finished and self.reason is None:
            self.reason = "client"
            self.task.cancel()


class Proxy:
    def __init__(
        self,
        config: GatewayConfig,
        keys: KeyCache,
        limiter: KeyLimiter,
        engines: Engines,
        metrics: GatewayMetrics,
        tee: Tee | None = None,
        accounting: Accounting | None = None,
    ) -> None:
        self.config = config
        self.accounting = accounting
        self.keys = keys
        self.limiter = limiter
        self.engines = engines
        self.metrics = metrics
        self.tee = tee
        self._started = False
        # Large JSON bodies are inspected here, off the event loop. Its own two threads: a burst of
        # large bodies must neither take every core nor starve the key store's refresh thread.
        self._body_pool: ThreadPoolExecutor | None = None

    async def start(self) -> None:
        self._started = True
        self._body_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="gateway-body")

    def pool_for(self, engine: Engine) -> UpstreamPool:
        """The engine's own connection pool (each engine its own bound), made on first use."""
        pool = engine.pool
        if pool is None:
            # Bytes pass through as the engine encoded them (nothing is decompressed), and no header
            # the client did not send is invented: the request upstream is the client's.
            pool = engine.pool = UpstreamPool(
                connect_timeout_s=self.config.connect_timeout_s,
                idle_timeout_s=self.config.idle_timeout_s,
                keepalive_s=self.config.upstream_keepalive_s,
                limit=self.config.pool_limit,
            )
        return pool

    def _retry_after_s(self) -> int:
        """Retry-After for an answer given before any engine was chosen."""
        engine = self.engines.only or self.engines.get(DEFAULT)
        return engine.slot.retry_after_s if engine is not None else self.config.retry_after_s

    async def close(self) -> None:
        self._started = False
        for engine in self.engines:
            if engine.pool is not None:
                await engine.pool.close()
                engine.pool = None
        if self._body_pool is not None:
            self._body_pool.shutdown(wait=False, cancel_futures=True)
            self._body_pool = None

    async def _read_model(self, body: bytes) -> ModelRef:
        """The JSON body's model name (``jsonbody.read_model``); ``BodyError`` if it cannot be accepted."""
        depth = self.config.max_json_depth
        if len(body) <= self.config.inline_json_bytes or self._body_pool is None:
            return read_model(body, depth)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._body_pool, read_model, body, depth)

    async def _aliased(self, ref: ModelRef, upstream: Upstream | None) -> bytes:
        """``ref``'s body for ``upstream`` (model aliased; ``ModelRef.aliased``)."""
        if upstream is None:
            return ref.body
        if len(ref.body) <= self.config.inline_json_bytes or self._body_pool is None:
            return ref.aliased(upstream.served_model, upstream.aliases)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._body_pool, ref.aliased, upstream.served_model, upstream.aliases)

    async def _prepare_body(self, body: bytes, upstream: Upstream | None) -> bytes:
        """The JSON body to forward to ``upstream`` (model aliased); ``BodyError`` if it cannot be
        accepted, ``ModelNotFound`` if it names a model ``upstream`` does not serve."""
        depth = self.config.max_json_depth
        served, aliases = ((upstream.served_model, upstream.aliases) if upstream is not None
                           else (None, frozenset[str]()))
        if len(body) <= self.config.inline_json_bytes or self._body_pool is None:
            return alias_model(body, served, depth, aliases)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._body_pool, alias_model, body, served, depth, aliases)

    async def _plan_request(self, body: bytes, path: str) -> RequestPlan:
        """What the meter reads of a JSON body (``usage.meter.plan_request``: whether the engine
        will stream it, read as the engine reads it) and the body asking the engine for usage."""
        if len(body) <= self.config.inline_json_bytes or self._body_pool is None:
            return plan_request(body, path)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._body_pool, plan_request, body, path)

    def _rate_headers(self, key: KeyRecord) -> Headers:
        """``x-ratelimit-*``: where a key with limits stands now."""
        tokens = self.accounting.quotas.standing(key) if self.accounting is not None else None
        return ratelimit_headers(tokens, self.limiter.standing(key))

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        t0 = perf_counter()
        route = route_label(scope["path"])
        authorization: bytes | None = None
        request_id: bytes | None = None
        content_type: bytes | None = b""
        content_types = 0
        content_length: bytes | None = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                authorization = value
            elif name == b"x-request-id":
                if _REQUEST_ID_RE.match(value):
                    request_id = value
            elif name == b"content-type":
                content_type = value
                content_types += 1
            elif name == b"content-length":
                content_length = value
        if content_types > 1:
            content_type = None  # ambiguous: refused once the key is known (``_read_and_forward``)
        if request_id is None:
            request_id = os.urandom(12).hex().encode()
        rid = (b"x-request-id", request_id)

        key = await self.keys.authenticate_fresh(authorization)
        if isinstance(key, AuthFailure):
            if key is AuthFailure.UNAVAILABLE:
                retry = (b"retry-after", str(self._retry_after_s()).encode())
                await send_error(send, 503, key.value, "service_unavailable", [rid, retry])
                self.metrics.count_request(route, 503, "none")
                return
            # Close: an anonymous client gets no keep-alive connection to hold (nor a body to
            # trickle into it after the answer).
            await send_error(
                send,
                401,
                key.value,
                "authentication_error",
                [rid, (b"www-authenticate", b"Bearer"), _CLOSE],
            )
            self.metrics.count_request(route, 401, "none")
            return
        metering = Metering(quota=key.tpm_limit is not None or key.tpd_limit is not None)
        # Recorded whatever ends the request (an exception, a shutdown's cancellation): the engine
        # may have worked for it, and a path that skips the record would be a path that is free.
        status = 500
        try:
            status = await self._admitted(
                scope, receive, send, key, route, request_id, content_type, content_length, t0, metering
            )
        finally:
            if self.accounting is not None:
                self.accounting.record(
                    key, status, metering.usage, perf_counter() - t0, metering.reserved, metering.model)
        self.metrics.count_request(route, status, key.id, metering.model)
        self.metrics.route_histograms(route, metering.model)[0].observe(perf_counter() - t0)

    async def _admitted(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        key: KeyRecord,
        route: str,
        request_id: bytes,
        content_type: bytes | None,
        content_length: bytes | None,
        t0: float,
        metering: Metering,
    ) -> int:
        rid = (b"x-request-id", request_id)
        if self.accounting is not None:
            # Before the body is read: a key whose token quota is spent costs nothing more.
            refused = self.accounting.admit(key)
            if refused is not None:
                await send_error(
                    send,
                    429,
                    refused.reason,
                    "rate_limit_error",
                    [rid, (b"retry-after", str(refused.retry_after_s).encode()),
                     *self._rate_headers(key)],
                )
                return 429
        # The key's concurrency and rate count from the head: a request whose body is still on the
        # way holds its lease (before, 20 connections of a key limited to 1 trickled bodies at once).
        lease = self.limiter.try_acquire(key)
        if isinstance(lease, LimitExceeded):
            await send_error(
                send,
                429,
                lease.reason,
                "rate_limit_error",
                [rid, (b"retry-after", str(lease.retry_after_s).encode()), _CLOSE],
            )
            return 429
        try:
            return await self._read_and_forward(
                scope, receive, send, key, route, request_id, content_type, content_length, t0, metering
            )
        finally:
            lease.release()

    async def _read_and_forward(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        key: KeyRecord,
        route: str,
        request_id: bytes,
        content_type: bytes | None,
        content_length: bytes | None,
        t0: float,
        metering: Metering,
    ) -> int:
        rid = (b"x-request-id", request_id)
        if content_type is None:
            # Content-Type is a singleton field (RFC 9110 §8.3). With two, the gateway (the last)
            # and the engine (Starlette's ``headers.get``: the first) read different types: a body
            # sent as `application/json` then `text/plain` skipped the model check and the stream's
            # usage request here, yet the engine parsed and streamed it. Close: the body is unread.
            await send_error(send, 400, "more than one Content-Type header", "invalid_request_error",
                             [rid, _CLOSE])
            return 400
        limit = self.config.max_body_bytes
        too_large = f"request body larger than {limit} bytes"
        if content_length is not None and content_length.isdigit() and int(content_length) > limit:
            # Close: the unread body would otherwise sit in the connection.
            await send_error(send, 413, too_large, "invalid_request_error", [rid, _CLOSE])
            return 413
        try:
            async with asyncio.timeout(self.config.body_timeout_s):
                body = await read_body(receive, limit)
        except BodyTooLarge:
            await send_error(send, 413, too_large, "invalid_request_error", [rid, _CLOSE])
            return 413
        except ClientGone:
            return STATUS_CLIENT_GONE
        except TimeoutError:
            # Close: the rest of the body may still be on its way.
            await send_error(
                send,
                408,
                f"request body not received within {self.config.body_timeout_s:g} s",
                "invalid_request_error",
                [rid, _CLOSE],
            )
            return 408

        # The model is read once (``read_model``); the engine claiming it is a dict lookup; the body is
        # checked and aliased for that engine's upstream as it is now (``_forward`` redoes it in the
        # rare case that the upstream changed while the request waited for one).
        served: Upstream | None = None
        ref: ModelRef | None = None
        # As the engine reads it (``usage.request.is_json_media_type``): any case, parameters.
        json_body = bool(body) and is_json_media_type(content_type)
        if json_body:
            try:
                ref = await self._read_model(body)
            except BodyError as exc:
                if content_type:
                    await send_error(send, 400, str(exc), "invalid_request_error", [rid])
                    return 400
                json_body = False  # no Content-Type and not JSON: passed on as it came
        name = ref.name if ref is not None else None
        engine = self.engines.only  # one engine: every request goes to it, as before
        if engine is None:
            if route == MODELS_ROUTE and scope["method"] == "GET":
                return await self._merged_listing(send, request_id, key)
            if not self.engines:
                await send_error(send, 503, "no engine is configured", "service_unavailable",
                                 [rid, (b"retry-after", str(self.config.retry_after_s).encode())])
                return 503
            if name is None:
                await send_error(send, 400, "several models are served here: name one in the JSON "
                                 "body's `model`", "invalid_request_error", [rid])
                return 400
            engine = self.engines.serving(name)
            if engine is None:
                await send_bytes(send, 404, ModelNotFound(name).body(), JSON, [rid])
                return 404
        listing = route == MODELS_ROUTE and scope["method"] == "GET"  # filtered, never refused
        if not listing and not model_allowed(key.models, engine, name):
            await send_bytes(send, 403, model_not_allowed(name or engine.label), JSON, [rid])
            return 403
        if ref is not None:
            served = engine.slot.current
            try:
                body = await self._aliased(ref, served)
            except BodyError as exc:
                if content_type:
                    await send_error(send, 400, str(exc), "invalid_request_error", [rid])
                    return 400
                json_body = False  # no Content-Type and not JSON: passed on as it came
            except ModelNotFound as exc:
                await send_bytes(send, 404, exc.body(), JSON, [rid])
                return 404
        metering.model = engine.label
        if self.accounting is not None:
            if json_body:
                metering.body = body
                if may_stream(body) or self.accounting.reserve_tokens:
                    planned = await self._plan_request(body, scope["path"])
                    body, metering.facts, metering.plan = planned.body, planned.facts, planned.stream
                    metering.body = body
            taken = self.accounting.reserve(key, metering.facts)
            if isinstance(taken, LimitExceeded):
                await send_error(
                    send,
                    429,
                    taken.reason,
                    "rate_limit_error",
                    [rid, (b"retry-after", str(taken.retry_after_s).encode()), *self._rate_headers(key)],
                )
                return 429
            metering.reserved = taken

        if key.rpm_limit is not None or metering.quota:
            metering.headers = self._rate_headers(key)
        return await self._forward(
            scope, receive, send, route, request_id, body, json_body, served, t0, metering, key.id,
            engine, key.models,
        )

    async def _merged_listing(self, send: Send, request_id: bytes, key: KeyRecord) -> int:
        """``GET /v1/models`` with several engines: every engine's cards, in engine-name order. An
        engine with an upstream is asked (its listing rewritten as for one engine); one without, or
        one whose listing cannot be had within the connect timeout, is listed from its claimed names
        (``down_cards``: ``"ready": false``), so that one engine down never hides the others."""
        rid = (b"x-request-id", request_id)
        engines = sorted(self.engines, key=lambda e: e.name)
        listings = await asyncio.gather(*(self._engine_cards(e, request_id, key.models) for e in engines))
        cards = [card for listing in listings for card in listing]
        body = json.dumps({"object": "list", "data": cards}, ensure_ascii=False).encode()
        if self.tee is not None:
            self.tee(request_id, body)
        await send_bytes(send, 200, body, JSON, [rid])
        return 200

    async def _engine_cards(self, engine: Engine, request_id: bytes,
                            allowed: frozenset[str] | None) -> list[Any]:
        upstream = engine.slot.current
        if upstream is None:
            return down_cards(engine, allowed)
        headers: Headers = [(b"accept", b"application/json"), (b"x-request-id", request_id)]
        if upstream.authorization is not None:
            headers.append((b"authorization", upstream.authorization.encode("latin-1")))
        pool = self.pool_for(engine)
        resp: UpstreamConnection | None = None
        try:
            async with asyncio.timeout(self.config.connect_timeout_s):
                resp = await pool.request(pool.origin(upstream.url), b"GET", MODELS_ROUTE.encode(),
                                          headers, b"")
                raw = await resp.read_all() if resp.status == 200 else b""
        except (TimeoutError, UpstreamFailure, OSError) as exc:
            log.warning("request %s: engine %s's model listing: %r", request_id.decode(), engine.name, exc)
            raw = b""
        finally:
            if resp is not None:
                resp.release()  # pooled only when read to the end
        read = listing_cards(raw, upstream.served_model, upstream.aliases, allowed) if raw else None
        return read[1] if read is not None else down_cards(engine, allowed)

    async def _forward(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        route: str,
        request_id: bytes,
        body: bytes,
        json_body: bool,
        served: Upstream | None,
        t0: float,
        metering: Metering,
        key_id: str,
        engine: Engine,
        allowed: frozenset[str] | None,
    ) -> int:
        task = asyncio.current_task()
        assert task is not None
        state = _RequestState(task)
        hook: DisconnectHook | None = scope.get(DISCONNECT_HOOK)
        watcher: asyncio.Task[None] | None = None
        if hook is not None:
            if hook[0] is CLIENT_GONE:
                return STATUS_CLIENT_GONE  # the connection was lost before this request got here
            hook[0] = state.client_gone
        else:
            watcher = asyncio.create_task(self._watch(receive, state))
        rid = (b"x-request-id", request_id)
        entry = None
        state_send = send
        slot = engine.slot
        try:
            upstream = slot.current
            if upstream is None and engine.hold.holding():
                # While the controller switches this engine on purpose, its requests wait here.
                held, send, answered = await wait_for_release(
                    engine.hold, slot, send, scope, key_id, body, request_id)
                if held is None:
                    return answered
                if send is not state_send:  # the event stream was started while it waited
                    state.response_started, state.status = True, 200
                upstream = held
            if upstream is None:
                queued = slot.policy is NoSlotPolicy.QUEUE
                if queued:
                    self.metrics.queue_waiting.inc()
                try:
                    got = await slot.acquire()
                finally:
                    if queued:
                        self.metrics.queue_waiting.dec()
                if isinstance(got, NoSlot):
                    await send_error(
                        send,
                        503,
                        got.reason,
                        "service_unavailable",
                        [rid, (b"retry-after", str(got.retry_after_s).encode())],
                    )
                    return 503
                upstream = got
            if json_body and upstream.served_model is not None and (
                    served is None or (upstream.served_model, upstream.aliases)
                    != (served.served_model, served.aliases)):
                # The names this upstream serves: an alias becomes its served name, any other is a 404.
                try:
                    body = await self._prepare_body(body, upstream)
                except ModelNotFound as exc:
                    metering.model = UNKNOWN_MODEL
                    await send_bytes(send, 404, exc.body(), JSON, [rid])
                    return 404
            entry = slot.track(upstream, state.abort)
            self.metrics.in_flight.inc()
            return await self._exchange(
                scope, send, route, request_id, body, upstream, state, t0, metering,
                engine, allowed,
            )
        except asyncio.CancelledError:
            metering.settle()  # left before the engine's count reached us: its estimate
            if state.reason is None:
                raise  # not ours (server shutdown): let it propagate
            task.uncancel()
            if state.reason == "client":
                return STATUS_CLIENT_GONE
            # Drain deadline passed. Before the response started we can still say why.
            if not state.response_started:
                await send_error(
                    send,
                    503,
                    "request aborted: the engine is being switched",
                    "service_unavailable",
                    [rid, (b"retry-after", str(slot.retry_after_s).encode())],
                )
                return 503
            return state.status  # the response stays incomplete: uvicorn closes the connection
        except RuntimeError:
            # uvloop raises on a write to a transport it has closed (a reset) before the protocol's
            # connection_lost ran: the client is gone, as if it had been reported.
            if not client_closed(scope):
                raise
            return STATUS_CLIENT_GONE
        finally:
            state.finished = True
            if watcher is not None:
                watcher.cancel()
            elif hook is not None:
                hook[0] = None
            if entry is not None:
                slot.untrack(entry)
                self.metrics.in_flight.dec()

    @staticmethod
    async def _rest_of_body(resp: UpstreamConnection, meter: BodyMeter) -> None:
        """The client left while a non-streamed answer was arriving: the engine had finished it
        (vLLM sends the body once generated), so its usage is at its end. Read it, briefly."""
        task = asyncio.current_task()
        assert task is not None
        task.uncancel()
        try:
            async with asyncio.timeout(1.0):
                while chunk := await resp.read():
                    meter.feed(chunk)
                    if resp.at_end:
                        break
        except (TimeoutError, UpstreamFailure, OSError):
            pass
        meter.finish()

    async def _last_usage(self, resp: UpstreamConnection, meter: StreamMeter) -> None:
        """The client left mid-stream: tell the engine (half-close: vLLM takes the end of its input
        for a disconnect and aborts) and read, briefly, what it had already sent, so that the last
        running total the engine reported is the one counted. Never longer than a second."""
        task = asyncio.current_task()
        assert task is not None
        task.uncancel()
        if not resp.write_eof():
            return
        try:
            async with asyncio.timeout(1.0):
                while chunk := await resp.read():
                    meter.feed(chunk)
        except (TimeoutError, UpstreamFailure, OSError):
            pass

    @staticmethod
    async def _usage_before_head(
        state: _RequestState, plan: StreamPlan, usage: Usage, resp: UpstreamConnection
    ) -> None:
        """The client left a planned stream before the engine's head came (during the prefill): as
        ``_last_usage`` does mid-stream, half-close (vLLM aborts) and read, at most a second, what
        the engine still sends: with continuous usage stats asked for, an answer it had begun
        carries its running totals, which then win over ``Metering.settle``'s estimate."""
        if state.reason != "client":
            return  # a drain deadline or a shutdown: nobody waits for a count
        task = asyncio.current_task()
        assert task is not None
        task.uncancel()
        if not resp.write_eof():
            return
        try:
            async with asyncio.timeout(1.0):
                await resp.head()
                if resp.content_type.split(b";", 1)[0].strip() != b"text/event-stream":
                    return
                meter = StreamMeter(plan, usage)
                while chunk := await resp.read():
                    meter.feed(chunk)
        except (TimeoutError, UpstreamFailure, OSError):
            pass

    @staticmethod
    async def _watch(receive: Receive, state: _RequestState) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        state.client_gone()

    @staticmethod
    def _upstream_headers(
        headers: Headers,
        request_id: bytes,
        authorization: str | None = None,
        drop: frozenset[bytes] = _DROP_REQUEST,
    ) -> Headers:
        # uvicorn hands header names lower-cased, values as sent (its parser refused CR/LF in them).
        out = end_to_end(headers, drop)
        out.append((b"x-request-id", request_id))
        if authorization is not None:  # the engine's own key (built once per upstream switch)
            out.append((b"authorization", authorization.encode("latin-1")))
        return out

    async def _exchange(
        self,
        scope: Scope,
        send: Send,
        route: str,
        request_id: bytes,
        body: bytes,
        upstream: Upstream,
        state: _RequestState,
        t0: float,
        metering: Metering | None,
        engine: Engine,
        allowed: frozenset[str] | None,
    ) -> int:
        assert self._started, "gateway not started (lifespan did not run)"
        pool = self.pool_for(engine)
        rid = (b"x-request-id", request_id)
        target: bytes = scope.get("raw_path") or scope["path"].encode()
        if scope["query_string"]:
            target += b"?" + scope["query_string"]
        # The listing is rewritten: plain JSON only, so the client's Accept-Encoding stays here.
        drop = _DROP_REQUEST_MODELS if route == MODELS_ROUTE else _DROP_REQUEST
        headers = self._upstream_headers(scope["headers"], request_id, upstream.authorization, drop)
        method = scope["method"].encode("ascii")
        errors = self.metrics.upstream_errors
        resp: UpstreamConnection | None = None
        on_cancel = None
        if metering is not None:
            metering.sent = True  # from here the engine may work for it: settle() charges then
            if metering.plan is not None:
                # A planned stream whose client leaves during the prefill: the engine's own count,
                # if it sends one, is charged rather than the estimate (``_usage_before_head``).
                on_cancel = partial(self._usage_before_head, state, metering.plan, metering.usage)
        for attempt in (1, 2):
            try:
                resp = await pool.request(
                    pool.origin(upstream.url), method, target, headers, body, on_cancel
                )
                break
            except StaleConnection:
                # A pooled connection closed before a byte of the answer came back. The upstream
                # may still have started on the request: sent again only where a repeat is harmless
                # (``upstream_client.may_retry``: idempotent methods, or the operator's setting).
                retry = attempt == 1 and may_retry(method, self.config.retry_stale_non_idempotent)
                if retry:
                    self.metrics.count_upstream_retry(method)
                else:
                    errors.labels("disconnect").inc()
                    await send_error(
                        send,
                        502,
                        f"upstream {upstream.url} closed the connection before answering",
                        "upstream_error",
                        [rid],
                    )
                    return 502
            except ConnectRefused as exc:
                # Nothing listens: the engine died, and the controller is taking it out of the slot
                # The client should come back, as for "no engine": 503 + Retry-After.
                errors.labels("connect").inc()
                await send_error(
                    send,
                    503,
                    f"cannot connect to upstream {upstream.url}: {exc.os_error}",
                    "service_unavailable",
                    [rid, (b"retry-after", str(engine.slot.retry_after_s).encode())],
                )
                return 503
            except ConnectTimeout:
                errors.labels("connect_timeout").inc()
                await send_error(
                    send,
                    502,
                    f"connecting to upstream {upstream.url} timed out after "
                    f"{self.config.connect_timeout_s:g} s",
                    "upstream_error",
                    [rid],
                )
                return 502
            except ReadTimeout:
                errors.labels("read_timeout").inc()
                await send_error(
                    send,
                    504,
                    f"upstream {upstream.url} sent nothing for {self.config.idle_timeout_s:g} s",
                    "upstream_error",
                    [rid],
                )
                return 504
            except BrokenResponse as exc:
                errors.labels("disconnect").inc()
                await send_error(
                    send, 502, f"upstream {upstream.url} request failed: {exc}", "upstream_error", [rid]
                )
                return 502
            except RefusedRequest as exc:
                # A header the gateway itself adds (the engine key) cannot be written: nothing was
                # sent. The message names the field, never its value.
                errors.labels(RefusedRequest.kind).inc()
                log.error("request %s: %s", request_id.decode(), exc)
                await send_error(send, 502, f"the gateway {exc}", "upstream_error", [rid])
                return 502
        assert resp is not None
        complete = False
        is_stream = False
        try:
            out_headers: Headers = end_to_end(resp.headers, _DROP_RESPONSE)
            out_headers.append(rid)
            if metering is not None:
                out_headers += metering.headers
            # Media types are case-insensitive (RFC 9110 §8.3.1): the answer says what it is, what
            # the gateway planned notwithstanding.
            is_stream = resp.content_type.split(b";", 1)[0].strip().lower() == b"text/event-stream"
            if route == MODELS_ROUTE and scope["method"] == "GET" and resp.status == 200 and not is_stream:
                # vLLM's model card says where the weights lie on the engine's host (`root`): every
                # key holder would read it. Buffered (a few hundred bytes) and rewritten.
                listing = models_listing(await resp.read_all(), upstream.served_model, upstream.aliases,
                                         allowed)
                if listing is None:
                    await send_error(send, 502, f"upstream {upstream.url} sent a model listing the gateway "
                                     "cannot read", "upstream_error", [rid])
                    complete = True
                    return 502
                out_headers = [(k, v) for k, v in out_headers
                               if k.lower() not in (b"content-length", b"content-encoding")]
                out_headers.append((b"content-length", str(len(listing)).encode()))
                await send({"type": "http.response.start", "status": resp.status, "headers": out_headers})
                state.response_started = True
                state.status = resp.status
                if self.tee is not None:
                    self.tee(request_id, listing)
                complete = True
                state.finished = True
                await send({"type": "http.response.body", "body": listing, "more_body": False})
                return resp.status
            meter: StreamMeter | None = None
            if is_stream and metering is not None:
                stream_plan = metering.stream_plan(scope["path"])
                if stream_plan is None:
                    # A stream the gateway did not plan for and cannot count, for a key whose
                    # quota must hold: refused, never served unmetered. Closing it aborts it.
                    is_stream = False
                    metering.settle()
                    await send_error(send, 502, "the engine answered with an event stream the gateway "
                                     "cannot meter; refused for a key with a token quota",
                                     "upstream_error", [rid])
                    return 502
                meter = StreamMeter(stream_plan, metering.usage)
            await send({"type": "http.response.start", "status": resp.status, "headers": out_headers})
            state.response_started = True
            state.status = resp.status
            tee = self.tee
            if is_stream:
                self.metrics.in_flight_streams.inc()
                _, ttft, itl = self.metrics.route_histograms(route, engine.label)
                try:
                    # The first read waits out the prefill: a client leaving then is metered too.
                    chunk = await resp.read()
                    last = perf_counter()
                    if chunk:
                        ttft.observe(last - t0)
                    while chunk:
                        if tee is not None:
                            tee(request_id, chunk)
                        if meter is not None:
                            chunk = meter.feed(chunk)
                        if resp.at_end:
                            # The last bytes and the end of the stream in one write (uvicorn appends
                            # the terminating chunk): a syscall less per stream.
                            if meter is not None:
                                chunk += meter.flush()
                            complete = state.finished = True
                            await send({"type": "http.response.body", "body": chunk, "more_body": False})
                            return resp.status
                        if chunk:
                            await send({"type": "http.response.body", "body": chunk, "more_body": True})
                        chunk = await resp.read()
                        now = perf_counter()
                        if chunk:
                            itl.observe(now - last)
                        last = now
                    if meter is not None and (rest := meter.flush()):
                        await send({"type": "http.response.body", "body": rest, "more_body": True})
                except asyncio.CancelledError:
                    if meter is not None and state.reason == "client":
                        await self._last_usage(resp, meter)
                    raise
            else:
                body_meter = BodyMeter(metering.usage) if metering is not None else None
                try:
                    while chunk := await resp.read():
                        if tee is not None:
                            tee(request_id, chunk)
                        if body_meter is not None:
                            body_meter.feed(chunk)
                        if resp.at_end:  # the usual case: the whole answer came at once
                            if body_meter is not None:
                                body_meter.finish()
                            complete = state.finished = True
                            await send({"type": "http.response.body", "body": chunk, "more_body": False})
                            return resp.status
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
                except asyncio.CancelledError:
                    if body_meter is not None and state.reason == "client":
                        await self._rest_of_body(resp, body_meter)
                    raise
                if body_meter is not None:
                    body_meter.finish()
            complete = True
            state.finished = True
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return resp.status
        except ReadTimeout:
            errors.labels("read_timeout").inc()
            log.warning(
                "request %s: upstream idle for %g s mid-response, closing",
                request_id.decode(),
                self.config.idle_timeout_s,
            )
            return resp.status
        except UpstreamFailure as exc:
            errors.labels("broken_stream").inc()
            log.warning("request %s: upstream response broke off: %r", request_id.decode(), exc)
            return resp.status
        finally:
            if is_stream:
                self.metrics.in_flight_streams.dec()
            if complete:
                resp.release()
            else:
                # Never pool a half-read connection; closing it is what tells vLLM to abort.
                resp.close()
