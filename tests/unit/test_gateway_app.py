"""The ASGI app driven directly (no sockets): every answer the gateway gives before it forwards."""

from __future__ import annotations

import asyncio
import json
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import pytest

from controller.gateway.app import GatewayApp
from controller.gateway.auth import hash_admin_token
from controller.gateway.config import GatewayConfig, MetricsAccess
from controller.gateway.keystore import KeyStore

ADMIN = "admin-token-for-tests"


class Reply:
    def __init__(self) -> None:
        self.status = 0
        self.headers: dict[bytes, bytes] = {}
        self.body = b""
        self.done = asyncio.Event()

    def json(self) -> Any:
        return json.loads(self.body)


async def call(
    app: GatewayApp,
    method: str,
    path: str,
    body: bytes | list[bytes] = b"",
    headers: dict[str, str] | None = None,
    query: bytes = b"",
) -> Reply:
    reply = Reply()
    parts = body if isinstance(body, list) else [body]
    pending = list(parts)

    async def receive() -> dict[str, Any]:
        if pending:
            part = pending.pop(0)
            return {"type": "http.request", "body": part, "more_body": bool(pending)}
        await reply.done.wait()  # like uvicorn: "disconnect" only once the response is complete
        return {"type": "http.disconnect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            reply.status = message["status"]
            reply.headers = dict(message["headers"])
        else:
            reply.body += message.get("body", b"")
            if not message.get("more_body", False):
                reply.done.set()

    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "raw_path": path.encode(),
        "query_string": query,
        "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()],
    }
    await asyncio.wait_for(app(scope, receive, send), timeout=5)
    return reply


@pytest.fixture
def store(tmp_path: Path) -> KeyStore:
    return KeyStore(tmp_path / "keys.db")


def make_app(store: KeyStore, **kw: Any) -> GatewayApp:
    app = GatewayApp(GatewayConfig(keys_db=store.path, admin_token_sha256=hash_admin_token(ADMIN), **kw))
    app.keys.load(create=True)
    return app


def auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}", "content-type": "application/json"}


async def test_missing_and_invalid_keys_get_401_with_request_id(store: KeyStore) -> None:
    app = make_app(store, upstream_url="http://127.0.0.1:9")
    r = await call(app, "POST", "/v1/chat/completions", b"{}")
    assert r.status == 401 and r.json()["error"]["type"] == "authentication_error"
    assert len(r.headers[b"x-request-id"]) == 24
    r = await call(
        app,
        "POST",
        "/v1/chat/completions",
        b"{}",
        {"authorization": "Bearer sk-app-0123456789ab-" + "a" * 43, "x-request-id": "abc-1"},
    )
    assert r.status == 401 and r.headers[b"x-request-id"] == b"abc-1"


async def test_revoked_key_gets_401(store: KeyStore) -> None:
    record, key = store.create("a")
    store.revoke(record.id)
    app = make_app(store, upstream_url="http://127.0.0.1:9")
    r = await call(app, "GET", "/v1/models", headers=auth(key))
    assert r.status == 401 and "revoked" in r.json()["error"]["message"]


async def test_body_limit_413_by_header_and_by_bytes(store: KeyStore) -> None:
    _, key = store.create("a")
    app = make_app(store, upstream_url="http://127.0.0.1:9", max_body_bytes=100)
    r = await call(app, "POST", "/v1/completions", b"x" * 10, {**auth(key), "content-length": "101"})
    assert r.status == 413 and r.headers[b"connection"] == b"close"
    # No Content-Length (chunked upload): counted as it arrives.
    r = await call(app, "POST", "/v1/completions", [b"{" + b" " * 60, b" " * 60 + b"}"], auth(key))
    assert r.status == 413


async def test_malformed_json_400(store: KeyStore) -> None:
    _, key = store.create("a")
    app = make_app(store, upstream_url="http://127.0.0.1:9")
    r = await call(app, "POST", "/v1/chat/completions", b'{"model": "x",', auth(key))
    assert r.status == 400 and "malformed JSON" in r.json()["error"]["message"]
    r = await call(app, "POST", "/v1/chat/completions", b"\xff\xfe", auth(key))
    assert r.status == 400


async def test_no_slot_503_with_retry_after(store: KeyStore) -> None:
    _, key = store.create("a")
    app = make_app(store, retry_after_s=11)
    r = await call(app, "POST", "/v1/chat/completions", b"{}", auth(key))
    assert r.status == 503 and r.headers[b"retry-after"] == b"11"
    assert r.json()["error"]["type"] == "service_unavailable"


async def test_rate_limit_429_with_retry_after(store: KeyStore) -> None:
    _, key = store.create("a", rpm_limit=2)
    app = make_app(store)  # no slot: admitted requests end in 503, which still spends the rate
    statuses = [(await call(app, "POST", "/v1/completions", b"{}", auth(key))) for _ in range(3)]
    assert [r.status for r in statuses] == [503, 503, 429]
    assert int(statuses[2].headers[b"retry-after"]) >= 1


async def test_health_metrics_and_404(store: KeyStore) -> None:
    app = make_app(store, upstream_url="http://127.0.0.1:9", served_model="m")
    observer = {"authorization": f"Bearer {ADMIN}"}
    r = await call(app, "GET", "/healthz", headers=observer)
    assert r.status == 200 and r.json()["upstream"]["url"] == "http://127.0.0.1:9"
    await call(app, "GET", "/v1/models")  # a 401, counted
    r = await call(app, "GET", "/metrics", headers=observer)
    text = r.body.decode()
    assert r.status == 200
    # The model label is "unknown" for a request no engine took: a 401 here.
    assert ('appliance_gateway_requests_total{key_id="none",model="unknown",route="/v1/models",'
            'status="401"} 1.0') in text
    assert "appliance_gateway_upstream_ready 1.0" in text
    assert (await call(app, "GET", "/nope")).status == 404


async def call_from(app: GatewayApp, path: str, client: tuple[str, int] | None, token: str | None) -> Reply:
    """A GET as a client at ``client`` (None: no address, like a Unix socket)."""
    reply = Reply()

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            reply.status = message["status"]
        else:
            reply.body += message.get("body", b"")

    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    scope = {"type": "http", "method": "GET", "path": path, "raw_path": path.encode(), "query_string": b"",
             "headers": headers, "client": client}
    await app(scope, receive, send)
    return reply


@pytest.mark.parametrize(
    ("access", "client", "token", "observer"),
    [
        (MetricsAccess.LOOPBACK, ("10.1.2.3", 5000), None, False),  # the default, from the network
        (MetricsAccess.LOOPBACK, ("10.1.2.3", 5000), "wrong", False),
        (MetricsAccess.LOOPBACK, ("10.1.2.3", 5000), ADMIN, True),
        (MetricsAccess.LOOPBACK, ("10.1.2.3", 5000), "metrics-secret", True),
        (MetricsAccess.LOOPBACK, ("127.0.0.1", 5000), None, True),  # Prometheus on the host
        (MetricsAccess.LOOPBACK, ("::1", 5000), None, True),
        (MetricsAccess.LOOPBACK, None, None, False),
        (MetricsAccess.TOKEN, ("127.0.0.1", 5000), None, False),
        (MetricsAccess.TOKEN, ("127.0.0.1", 5000), "metrics-secret", True),
        (MetricsAccess.PUBLIC, ("10.1.2.3", 5000), None, True),
    ],
)
async def test_metrics_and_health_details_only_for_observers(
    store: KeyStore, access: MetricsAccess, client: tuple[str, int] | None, token: str | None, observer: bool
) -> None:
    record, key = store.create("a")
    app = make_app(store, metrics_access=access, metrics_token_sha256=hash_admin_token("metrics-secret"))
    r = await call(app, "GET", "/v1/models", headers=auth(key))  # no slot yet: a 503 under the key's id
    assert r.status == 503
    app.slot.set("http://10.0.0.5:8000", None)
    metrics = await call_from(app, "/metrics", client, token)
    health = await call_from(app, "/healthz", client, token)
    assert health.status == 200 and health.json()["status"] == "ok" and health.json()["ready"] is True
    if observer:
        assert metrics.status == 200 and record.id.encode() in metrics.body
        assert health.json()["upstream"]["url"] == "http://10.0.0.5:8000"
    else:
        assert metrics.status == 401 and record.id.encode() not in metrics.body
        assert set(health.json()) == {"status", "ready"}
        assert b"10.0.0.5" not in health.body


async def test_admin_closed_without_hash(store: KeyStore) -> None:
    app = GatewayApp(GatewayConfig(keys_db=store.path))
    r = await call(app, "GET", "/admin/upstream", headers={"authorization": f"Bearer {ADMIN}"})
    assert r.status == 403


async def test_admin_upstream_and_drain(store: KeyStore) -> None:
    app = make_app(store)
    assert (
        await call(app, "GET", "/admin/upstream", headers={"authorization": "Bearer wrong"})
    ).status == 401
    h = {"authorization": f"Bearer {ADMIN}"}
    r = await call(app, "PUT", "/admin/upstream", json.dumps({"url": "ftp://x"}).encode(), h)
    assert r.status == 422
    r = await call(app, "PUT", "/admin/upstream", b"{not json", h)
    assert r.status == 400
    r = await call(
        app,
        "PUT",
        "/admin/upstream",
        json.dumps(
            {"url": "http://127.0.0.1:8000/", "served_model": "smollm2", "drain_deadline_s": 1}
        ).encode(),
        h,
    )
    assert r.status == 200 and r.json()["upstream"]["url"] == "http://127.0.0.1:8000" and r.json()["drained"]
    got = (await call(app, "GET", "/admin/upstream", headers=h)).json()
    assert got["upstream"]["served_model"] == "smollm2"
    r = await call(app, "POST", "/admin/drain", json.dumps({"deadline_s": 0.1}).encode(), h)
    assert r.status == 200 and r.json()["drained"] is True
    r = await call(app, "PUT", "/admin/upstream", json.dumps({"url": None, "retry_after_s": 9}).encode(), h)
    assert r.status == 200 and r.json()["upstream"] is None
    assert app.slot.retry_after_s == 9


@pytest.mark.parametrize("bad", ["\r\nX-Injected: 1", "\n", "\x00", "\x1b", " ", "\x7f", "\u00e9"])
async def test_admin_refuses_an_engine_key_that_cannot_go_in_a_header(store: KeyStore, bad: str) -> None:
    # The key is sent raw as the upstream `Authorization: Bearer KEY`: CR/LF would inject headers.
    app = make_app(store)
    h = {"authorization": f"Bearer {ADMIN}"}
    secret = "eng_0123456789abcdef"
    body = {"url": "http://127.0.0.1:9/", "served_model": "m", "api_key": secret + bad + "x"}
    r = await call(app, "PUT", "/admin/upstream", json.dumps(body).encode(), h)
    assert r.status == 422 and b"api_key" in r.body and b"only visible ASCII" in r.body
    assert secret.encode() not in r.body  # the answer never quotes the key back
    assert app.slot.current is None  # nothing was switched
    body["api_key"] = secret + "~!#$%&'*+-.^_`|"  # every visible ASCII character is fine
    r = await call(app, "PUT", "/admin/upstream", json.dumps(body).encode(), h)
    assert r.status == 200


def test_loop_histogram_exposes_like_client_python() -> None:
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    from controller.gateway.metrics import LoopHistogram

    buckets = (0.001, 0.01, 0.1, 1, 10)
    ours_registry, theirs_registry = CollectorRegistry(), CollectorRegistry()
    ours = LoopHistogram("x_seconds", "help text", buckets)
    ours_registry.register(ours)
    theirs = Histogram("x_seconds", "help text", ["route"], buckets=buckets, registry=theirs_registry)
    for route, value in [("a", 0.0005), ("a", 0.001), ("a", 0.05), ("b", 3.0), ("a", 99.0), ("b", 10.0)]:
        ours.labels(route).observe(value)
        theirs.labels(route).observe(value)

    def lines(registry: CollectorRegistry) -> set[str]:
        return {line for line in generate_latest(registry).decode().splitlines() if "_created" not in line}

    assert lines(ours_registry) == lines(theirs_registry)


# ---- issue 23 item 10: /v1/models does not tell key holders where the weights lie ----------------

VLLM_MODELS = {"object": "list", "data": [{
    "id": "smollm2", "object": "model", "created": 1, "owned_by": "vllm",
    "root": "/var/lib/appliance/models/smollm2-135m-instruct", "parent": None, "max_model_len": 2048,
    "permission": [{"id": "modelperm-1", "object": "model_permission"}]}]}


@pytest.mark.parametrize(("served", "payload", "status"), [
    ("smollm2", VLLM_MODELS, 200), (None, VLLM_MODELS, 200), ("smollm2", "not json", 502)])
async def test_models_listing_shows_the_served_name_not_the_model_path(
        store: KeyStore, served: str | None, payload: object, status: int) -> None:
    from aiohttp import web

    seen: dict[str, str | None] = {}

    async def models(request: web.Request) -> web.Response:
        seen["accept-encoding"] = request.headers.get("Accept-Encoding")
        if isinstance(payload, str):
            return web.Response(text=payload, content_type="application/json")
        return web.json_response(payload)

    upstream = web.Application()
    upstream.router.add_get("/v1/models", models)
    runner = web.AppRunner(upstream)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    _, key = store.create("a")
    app = make_app(store)
    await app.startup()
    try:
        app.slot.set(f"http://127.0.0.1:{port}", served)
        r = await call(app, "GET", "/v1/models", headers={**auth(key), "accept-encoding": "gzip"})
        assert r.status == status, r.body
        assert b"/var/lib/appliance" not in r.body
        if status == 200:
            card = r.json()["data"][0]
            assert card["root"] == "smollm2" and card["id"] == "smollm2" and card["max_model_len"] == 2048
            assert int(r.headers[b"content-length"]) == len(r.body)
            assert seen["accept-encoding"] is None
    finally:
        await app.shutdown()
        await runner.cleanup()


async def test_a_key_created_after_the_gateway_loaded_the_store_is_not_a_401(store: KeyStore) -> None:
    app = make_app(store)  # the store is loaded; the once-a-second refresher has not run since
    _, key = store.create("fresh")  # what POST /keys does
    r = await call(app, "GET", "/v1/models", headers=auth(key))
    assert r.status == 503, r.body  # past authentication: no engine yet, not "invalid API key"


async def test_metrics_name_every_key_by_id_for_the_dashboards_legends(store: KeyStore) -> None:
    live, _ = store.create("team-a batch")
    gone, _ = store.create("old app")
    store.revoke(gone.id)
    app = make_app(store, upstream_url="http://127.0.0.1:9")
    r = await call(app, "GET", "/metrics", headers={"authorization": f"Bearer {ADMIN}"})
    text = r.body.decode()
    assert f'appliance_gateway_key_info{{key_id="{live.id}",name="team-a batch"}} 1.0' in text
    # revoked keys keep their name: their past traffic is still on the dashboards
    assert f'appliance_gateway_key_info{{key_id="{gone.id}",name="old app"}} 1.0' in text
    assert "sk-app-" not in text  # the id only, never a key
