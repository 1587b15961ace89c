"""The gateway as one ASGI application: routing, lifespan, health and metrics.

/v1/...        authenticated, forwarded to the upstream of the engine serving the request's model
               (``proxy.py``, ``engines.py``)
/admin/...     the controller's handle on the engines' upstream slots (``admin.py``)
/healthz       the gateway process itself: 200 while it runs, ``{"status", "ready"}`` for anyone;
               the upstream, counts and keys only for observers (below)
/metrics       Prometheus text, the gateway's own registry (``metrics.py``): observers only

A path is routed, labelled and metered as the bytes that go upstream (``unroutable``): one the engine
could read as another route (percent-escapes, dot segments) is refused with 400.

Observers (``config.metrics_access``): by default clients on the loopback interface (Prometheus on
the host) and holders of the metrics or admin token; ``token``: token holders only; ``public``:
anyone. The metrics name key ids, per-key counts and the upstream URL, which a gateway listening on
0.0.0.0 must not hand to every network neighbour.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import sqlite3

from prometheus_client import CONTENT_TYPE_LATEST

from controller.gateway.admin import Admin, engine_view, upstream_view
from controller.gateway.asgi import Receive, Scope, Send, send_bytes, send_error, send_json
from controller.gateway.auth import AdminAuth, KeyCache
from controller.gateway.config import GatewayConfig, MetricsAccess
from controller.gateway.engines import DEFAULT, Engine, Engines
from controller.gateway.gc_pauses import settle_heap
from controller.gateway.hold.queue import Hold, bind_outcomes
from controller.gateway.keystore import KeyStore, KeyStoreError
from controller.gateway.limits import KeyLimiter
from controller.gateway.metrics import GatewayMetrics
from controller.gateway.proxy import Proxy, Tee
from controller.gateway.slot import Slot
from controller.gateway.usage.accounting import Accounting
from controller.gateway.usage.store import UsageStore

log = logging.getLogger(__name__)


class GatewayApp:
    def __init__(
        self,
        config: GatewayConfig,
        tee: Tee | None = None,
        metrics: GatewayMetrics | None = None,
        own_process: bool = False,
    ) -> None:
        self.config = config
        # The gateway's own process (``server.run``) tunes the collector for it (``gc_pauses``).
        self.own_process = own_process
        self.metrics = metrics or GatewayMetrics()
        self.keys = KeyCache(
            KeyStore(config.keys_db), refresh_s=config.key_refresh_s, max_stale_s=config.key_max_stale_s
        )
        self.metrics.key_info.source = self.keys.names  # read at each scrape
        # Each engine its own slot and hold, with the same bounds (``engines.py``).
        self.engines = Engines(
            lambda: Slot(config.no_slot_policy, config.queue_max, config.queue_timeout_s,
                         config.retry_after_s),
            lambda: Hold(config.hold_max, config.hold_per_key_max, config.hold_tick_s),
        )
        self.engines.on_create = self._wire
        self._default = self.engines.ensure(DEFAULT)
        if config.upstream_url:
            self.slot.set(config.upstream_url, config.served_model)
            self.engines.claim(self._default, config.served_model, frozenset())
        self.accounting = Accounting(
            UsageStore(config.usage_path),
            self.metrics.usage,
            flush_s=config.usage_flush_s,
            retention_days=config.usage_retention_days,
            max_pending=config.usage_max_pending,
            reserve=config.quota_reserve,
        )
        self.proxy = Proxy(config, self.keys, KeyLimiter(), self.engines, self.metrics, tee, self.accounting)
        # The hold series sum over the engines' holds.
        self.metrics.hold_waiting.set_function(lambda: sum(e.hold.waiting for e in self.engines))
        self.metrics.hold_active.set_function(lambda: 1 if any(e.hold.holding() for e in self.engines) else 0)
        admin_auth = AdminAuth(config.admin_token_sha256)
        self.admin = Admin(admin_auth, self.engines, self.metrics)
        self.admin.publish_ready()
        self._observer_auth = (admin_auth, AdminAuth(config.metrics_token_sha256))
        self._refresher: asyncio.Task[None] | None = None
        self._usage_writer: asyncio.Task[None] | None = None

    def _wire(self, engine: Engine) -> None:
        bind_outcomes(engine.hold, self.metrics)

        def upstream_set(upstream: object) -> None:
            if upstream is not None:
                engine.hold.release()  # the held requests go on to the new engine, in arrival order

        engine.slot.on_set = upstream_set

    def _default_engine(self) -> Engine:
        # The default engine (the one today's controller talks to); once removed, the last one.
        engine = self.engines.get(DEFAULT)
        if engine is not None:
            self._default = engine
        return self._default

    @property
    def slot(self) -> Slot:
        """The default engine's upstream slot."""
        return self._default_engine().slot

    @property
    def hold(self) -> Hold:
        """The default engine's hold."""
        return self._default_engine().hold

    async def startup(self) -> None:
        # Blocking read on purpose: the gateway must not accept requests before it knows the keys.
        # The only place a missing store is created (empty, 0600): later it must stay missing.
        self.keys.load(create=True)
        if self.keys.size == 0:
            log.warning(
                "key store %s has no keys: every /v1 request gets 401 until one is created "
                "(`appliance keys create --name NAME`)",
                self.config.keys_db,
            )
        self.metrics.keys_loaded.set_function(lambda: self.keys.size)
        self.accounting.restore()  # the day's quota is not reset by a restart
        await self.proxy.start()
        self._refresher = asyncio.create_task(self.keys.run_refresher())
        self._usage_writer = asyncio.create_task(self.accounting.run_writer())
        if self.own_process:
            frozen = settle_heap()
            self.metrics.gc_pauses.install()
            log.info("gateway started; %d long-lived objects kept out of garbage collection", frozen)

    async def shutdown(self) -> None:
        if self._refresher is not None:
            self._refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresher
            self._refresher = None
        if self._usage_writer is not None:
            await self.accounting.close(self._usage_writer)  # what the last requests used
            self._usage_writer = None
        await self.proxy.close()
        self.metrics.gc_pauses.remove()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            path: str = scope["path"]
            raw: bytes | None = scope.get("raw_path")
            refused = unroutable(raw if raw is not None else path.encode())
            if refused is not None:
                await send_error(send, 400, refused, "invalid_request_error")
                return
            if path.startswith("/v1/"):
                await self.proxy.handle(scope, receive, send)
            elif path == "/healthz":
                # Ready: some engine can answer (with several, one down leaves the others serving).
                ready = any(e.slot.current is not None for e in self.engines) and self.keys.fresh
                if not self._observer(scope):
                    await send_json(send, 200, {"status": "ok", "ready": ready})
                    return
                await send_json(
                    send,
                    200,
                    {
                        "status": "ok",
                        "ready": ready,
                        "upstream": upstream_view(self.slot.current),
                        "in_flight": self.slot.in_flight,
                        "queue_waiting": self.slot.waiting,
                        "hold": self.hold.view(),
                        "keys": self.keys.size,
                        "keys_fresh": self.keys.fresh,
                        "engines": {e.name: engine_view(e) for e in self.engines},
                    },
                )
            elif path == "/metrics":
                if not self._observer(scope):
                    await send_error(
                        send,
                        401,
                        "metrics need the metrics or admin token (Authorization: Bearer …)",
                        "authentication_error",
                        [(b"www-authenticate", b"Bearer")],
                    )
                    return
                await send_bytes(send, 200, self.metrics.render(), CONTENT_TYPE_LATEST.encode())
            elif path.startswith("/admin/"):
                await self.admin.handle(scope, receive, send)
            else:
                await send_error(send, 404, f"no route {path}", "not_found")
        elif kind == "lifespan":
            await self._lifespan(receive, send)
        # websockets are not served: uvicorn refuses them when the app returns without accepting.

    def _observer(self, scope: Scope) -> bool:
        """May this request see metrics and health details (see the module doc)?"""
        access = self.config.metrics_access
        if access is MetricsAccess.PUBLIC:
            return True
        if access is MetricsAccess.LOOPBACK and _is_loopback(scope.get("client")):
            return True
        authorization = next((v for k, v in scope["headers"] if k == b"authorization"), None)
        return any(auth.check(authorization) for auth in self._observer_auth)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.startup()
                except (OSError, sqlite3.Error, KeyStoreError) as exc:
                    await send({"type": "lifespan.startup.failed", "message": f"gateway start failed: {exc}"})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return


def unroutable(raw_path: bytes) -> str | None:
    """Why a request path is refused (400), or None.

    The proxy forwards the raw path byte for byte but routes and labels on uvicorn's decoded one,
    and the route decides what is metered: ``/v1/%63hat/completions`` is /v1/chat/completions to the
    gateway's router and to the engine (Starlette decodes too), but another server (or a later
    change that routes on the raw bytes) reads another route; ``/v1/models/../x`` is under /v1 to
    the gateway and /v1/x to a server that normalises dot segments. Refusing both keeps one meaning:
    with neither in it, the decoded path is the raw path, so what is routed is what goes upstream.
    No OpenAI route needs an escape in its path (ids are [A-Za-z0-9_-]); the query string is free.
    """
    if b"%" in raw_path:
        return "percent-encoded request paths are not accepted"
    if any(segment in (b".", b"..") for segment in raw_path.split(b"/")):
        return "dot segments ('.', '..') in request paths are not accepted"
    return None


def _is_loopback(client: object) -> bool:
    """``scope["client"]`` is (host, port) for TCP; None (a Unix socket, tests) is not trusted."""
    if not isinstance(client, tuple | list) or not client:
        return False
    try:
        return ipaddress.ip_address(str(client[0])).is_loopback
    except ValueError:
        return False
