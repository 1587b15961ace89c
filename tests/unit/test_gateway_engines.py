"""Several engines behind one gateway: named slots (``engines.py``), routed by the body's ``model``.
Two stand-in engines on free loopback ports; every case on asyncio's loop and on uvloop."""

from __future__ import annotations

import asyncio
import json
import re
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from aiohttp import web

from controller.gateway.app import GatewayApp
from controller.gateway.keystore import KeyStore
from tests.unit.test_gateway_app import ADMIN, auth, call, make_app
from tests.unit.test_upstream_client import both_loops

ADMIN_H = {"authorization": f"Bearer {ADMIN}"}
JSON_TYPE = {"content-type": "application/json"}


class Engine:
    """A stand-in vLLM serving one model: records each body; /v1/completions waits for ``go``."""

    def __init__(self, served: str) -> None:
        self.served = served
        self.bodies: list[bytes] = []
        self.url = ""
        self.go = asyncio.Event()
        self.slow_started = asyncio.Event()

    async def chat(self, request: web.Request) -> web.Response:
        self.bodies.append(await request.read())
        return web.json_response({"object": "chat.completion", "served_by": self.served})

    async def slow(self, request: web.Request) -> web.Response:
        self.bodies.append(await request.read())
        self.slow_started.set()
        await self.go.wait()
        return web.json_response({"object": "text_completion", "served_by": self.served})

    async def tokenize(self, request: web.Request) -> web.Response:
        self.bodies.append(await request.read())
        return web.json_response({"tokens": [1], "served_by": self.served})

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{
            "id": self.served, "object": "model", "created": 1, "owned_by": "vllm",
            "root": f"/models/{self.served}", "parent": None, "max_model_len": 2048}]})


@asynccontextmanager
async def engines(*served: str) -> AsyncIterator[list[Engine]]:
    runners: list[web.AppRunner] = []
    found = []
    try:
        for name in served:
            engine = Engine(name)
            upstream = web.Application()
            upstream.router.add_post("/v1/chat/completions", engine.chat)
            upstream.router.add_post("/v1/completions", engine.slow)
            upstream.router.add_post("/v1/embeddings", engine.tokenize)
            upstream.router.add_get("/v1/models", engine.models)
            runner = web.AppRunner(upstream)
            await runner.setup()
            runners.append(runner)
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            engine.url = f"http://127.0.0.1:{port}"
            found.append(engine)
        yield found
    finally:
        for engine in found:
            engine.go.set()
        for runner in runners:
            await runner.cleanup()


@asynccontextmanager
async def rig(**kw: Any) -> AsyncIterator[tuple[GatewayApp, Engine, Engine, KeyStore, str]]:
    """A gateway with two engines: "a" serving alpha (alias a1), "b" serving beta (alias b1)."""
    async with engines("alpha", "beta") as (alpha, beta):
        with tempfile.TemporaryDirectory() as tmp:
            store = KeyStore(Path(tmp) / "keys.db")
            app = make_app(store, **kw)
            _, key = store.create("k")
            await app.startup()
            try:
                await put(app, {"engine": "a", "url": alpha.url, "served_model": "alpha", "aliases": ["a1"]})
                await put(app, {"engine": "b", "url": beta.url, "served_model": "beta", "aliases": ["b1"]})
                # The default slot of a gateway started without an upstream: today's controller's.
                assert (await call(app, "DELETE", "/admin/upstream", headers=ADMIN_H,
                                   query=b"engine=default")).status == 200
                yield app, alpha, beta, store, key
            finally:
                await app.shutdown()


async def put(app: GatewayApp, body: dict[str, Any], status: int = 200) -> dict[str, Any]:
    r = await call(app, "PUT", "/admin/upstream", json.dumps({"drain_deadline_s": 0, **body}).encode(),
                   ADMIN_H)
    assert r.status == status, r.body
    out: dict[str, Any] = r.json()
    return out


async def post(app: GatewayApp, key: str, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    r = await call(app, "POST", path, json.dumps(body).encode(), {**auth(key), **JSON_TYPE})
    return r.status, json.loads(r.body) if r.body else None


async def chat(app: GatewayApp, key: str, model: str | None) -> tuple[int, Any]:
    body: dict[str, Any] = {"messages": []}
    if model is not None:
        body["model"] = model
    return await post(app, key, "/v1/chat/completions", body)


def model_not_found(model: str) -> dict[str, Any]:
    return {"error": {"message": f"The model `{model}` does not exist or you do not have access to it.",
                      "type": "invalid_request_error", "param": "model", "code": "model_not_found"}}


@both_loops
async def test_requests_go_to_the_engine_serving_their_model() -> None:
    async with rig() as (app, alpha, beta, _, key):
        assert (await chat(app, key, "alpha"))[1]["served_by"] == "alpha"
        assert (await chat(app, key, "a1"))[1]["served_by"] == "alpha"
        assert json.loads(alpha.bodies[-1])["model"] == "alpha"  # the alias rewritten for its engine
        assert (await chat(app, key, "b1"))[1]["served_by"] == "beta"
        assert json.loads(beta.bodies[-1])["model"] == "beta"
        status, body = await chat(app, key, "gpt-4o")
        assert (status, body) == (404, model_not_found("gpt-4o"))
        assert (len(alpha.bodies), len(beta.bodies)) == (2, 1)  # the unknown name reached neither
        # No model: with two engines the gateway cannot tell which one is meant.
        status, body = await chat(app, key, None)
        assert status == 400 and "`model`" in body["error"]["message"]
        status, body = await post(app, key, "/v1/embeddings", {"prompt": "hi"})
        assert status == 400
        named = await post(app, key, "/v1/embeddings", {"model": "beta", "prompt": "hi"})
        assert named[1]["served_by"] == "beta"


@both_loops
async def test_the_listing_merges_every_engine() -> None:
    async with rig() as (app, _, _, _, key):
        r = await call(app, "GET", "/v1/models", headers=auth(key))
        assert r.status == 200
        cards = r.json()["data"]
        assert [c["id"] for c in cards] == ["alpha", "a1", "beta", "b1"]
        assert [c["root"] for c in cards] == ["alpha", "alpha", "beta", "beta"]  # never the weights' path
        assert all(c["max_model_len"] == 2048 for c in cards)  # asked from each engine


@both_loops
async def test_a_name_another_engine_serves_is_a_409_and_nothing_changes() -> None:
    async with rig() as (app, alpha, beta, _, key):
        before = (await call(app, "GET", "/admin/upstream", headers=ADMIN_H)).json()["engines"]
        for claim in ({"served_model": "alpha"}, {"served_model": "gamma", "aliases": ["a1"]}):
            r = await call(app, "PUT", "/admin/upstream", json.dumps(
                {"engine": "b", "url": alpha.url, "drain_deadline_s": 0, **claim}).encode(), ADMIN_H)
            assert r.status == 409
            assert "engine 'a'" in r.json()["error"]["message"]
        # A new engine claiming a taken name is refused too, and not created.
        r = await call(app, "PUT", "/admin/upstream", json.dumps(
            {"engine": "c", "url": beta.url, "served_model": "beta"}).encode(), ADMIN_H)
        assert r.status == 409 and "engine 'b'" in r.json()["error"]["message"]
        after = (await call(app, "GET", "/admin/upstream", headers=ADMIN_H)).json()["engines"]
        assert after == before
        assert (await chat(app, key, "beta"))[1]["served_by"] == "beta"
        assert (await chat(app, key, "a1"))[1]["served_by"] == "alpha"


@both_loops
async def test_an_engine_that_died_answers_503_with_its_diagnosis_while_the_other_serves() -> None:
    async with rig() as (app, _, _, _, key):
        diagnosis = "the engine exited: killed by the kernel's OOM killer (RSS 7.1 GiB)"
        await put(app, {"engine": "a", "url": None, "detail": diagnosis, "retry_after_s": 7})
        r = await call(app, "POST", "/v1/chat/completions", json.dumps({"model": "a1"}).encode(),
                       {**auth(key), **JSON_TYPE})
        assert r.status == 503 and r.json()["error"]["message"] == diagnosis
        assert r.headers[b"retry-after"] == b"7"
        assert (await chat(app, key, "beta"))[1]["served_by"] == "beta"
        assert (await chat(app, key, "gpt-4o"))[0] == 404  # still routed by name: not a 503
        cards = (await call(app, "GET", "/v1/models", headers=auth(key))).json()["data"]
        assert [(c["id"], c.get("ready", True)) for c in cards] == [
            ("alpha", False), ("a1", False), ("beta", True), ("b1", True)]
        view = (await call(app, "GET", "/admin/upstream", headers=ADMIN_H, query=b"engine=a")).json()
        assert view["upstream"] is None
        # The metrics say which model is down.
        text = (await call(app, "GET", "/metrics", headers=ADMIN_H)).body.decode()
        assert 'appliance_gateway_model_ready{model="alpha"} 0.0' in text
        assert 'appliance_gateway_model_ready{model="beta"} 1.0' in text
        assert "appliance_gateway_upstream_ready 0.0" in text


@both_loops
async def test_a_hold_holds_only_its_engine() -> None:
    async with rig() as (app, alpha, _, _, key):
        hold = {"reason": "warm restart", "wait_s": 30}
        await put(app, {"engine": "a", "url": None, "hold": hold})
        held = asyncio.create_task(chat(app, key, "alpha"))
        a, b = app.engines.get("a"), app.engines.get("b")
        assert a is not None and b is not None
        while a.hold.waiting < 1:
            await asyncio.sleep(0.01)
        # The other engine keeps answering meanwhile, and has no hold.
        assert (await chat(app, key, "beta"))[1]["served_by"] == "beta"
        assert not b.hold.holding() and b.hold.waiting == 0
        # Renewing the hold of an engine that serves is a 409; of one that does not exist, 404.
        renew = json.dumps({"engine": "b", **hold}).encode()
        assert (await call(app, "PUT", "/admin/hold", renew, ADMIN_H)).status == 409
        renew = json.dumps({"engine": "zz", **hold}).encode()
        assert (await call(app, "PUT", "/admin/hold", renew, ADMIN_H)).status == 404
        renew = json.dumps({"engine": "a", **hold}).encode()
        assert (await call(app, "PUT", "/admin/hold", renew, ADMIN_H)).status == 200
        assert not held.done()
        await put(app, {"engine": "a", "url": alpha.url, "served_model": "alpha", "aliases": ["a1"]})
        assert (await held)[1]["served_by"] == "alpha"


@both_loops
async def test_delete_drains_an_engine_and_its_names_answer_404_afterwards() -> None:
    async with rig() as (app, _, beta, _, key):
        running = asyncio.create_task(post(app, key, "/v1/completions", {"model": "beta", "prompt": "x"}))
        await beta.slow_started.wait()
        removed = app.engines.get("b")
        assert removed is not None and removed.pool is not None
        r = await call(app, "DELETE", "/admin/upstream", headers=ADMIN_H,
                       query=b"engine=b&drain_deadline_s=0")
        assert removed.pool is None  # its connections closed with it
        assert r.status == 200 and r.json()["removed"] == "b" and r.json()["aborted"] == 1
        status, body = await running
        assert status == 503 and "aborted" in body["error"]["message"]
        assert (await chat(app, key, "b1")) == (404, model_not_found("b1"))
        assert (await call(app, "GET", "/admin/upstream", headers=ADMIN_H, query=b"engine=b")).status == 404
        again = await call(app, "DELETE", "/admin/upstream", headers=ADMIN_H, query=b"engine=b")
        assert again.status == 404
        # One engine left: a request without a model goes to it, as with one engine always.
        assert (await chat(app, key, None))[1]["served_by"] == "alpha"
        view = (await call(app, "GET", "/admin/upstream", headers=ADMIN_H)).json()
        assert list(view["engines"]) == ["a"] and view["upstream"] is None  # no default slot now


@both_loops
async def test_drain_acts_on_the_named_engine_or_on_all() -> None:
    async with rig() as (app, alpha, beta, _, key):
        slow_a = asyncio.create_task(post(app, key, "/v1/completions", {"model": "alpha"}))
        slow_b = asyncio.create_task(post(app, key, "/v1/completions", {"model": "beta"}))
        await alpha.slow_started.wait()
        await beta.slow_started.wait()
        drain = {"engine": "b", "deadline_s": 0, "abort": True}
        r = await call(app, "POST", "/admin/drain", json.dumps(drain).encode(), ADMIN_H)
        assert r.json()["aborted"] == 1
        assert (await slow_b)[0] == 503
        assert not slow_a.done()
        r = await call(app, "POST", "/admin/drain", json.dumps({"deadline_s": 0, "abort": True}).encode(),
                       ADMIN_H)
        assert r.json()["aborted"] == 1
        assert (await slow_a)[0] == 503


@both_loops
async def test_the_model_label_is_bounded_to_served_names() -> None:
    async with rig() as (app, _, _, _, key):
        for model in ("a1", "alpha", "beta", "x" * 300, "made-up-1", "made-up-2"):
            await chat(app, key, model)
        await chat(app, key, None)
        text = (await call(app, "GET", "/metrics", headers=ADMIN_H)).body.decode()
        labels = set(re.findall(r'appliance_gateway_(?:requests_total|request_duration_seconds_count)\{[^}]*'
                                r'model="([^"]*)"', text))
        assert labels == {"alpha", "beta", "unknown"}
        assert re.search(r'requests_total\{key_id="[^"]+",model="alpha",route="/v1/chat/completions",'
                         r'status="200"\} 2.0', text)
        assert re.search(r'requests_total\{key_id="[^"]+",model="unknown",route="/v1/chat/completions",'
                         r'status="404"\} 3.0', text)


@both_loops
async def test_the_default_engine_is_what_an_unnamed_admin_call_means() -> None:
    """Today's controller names no engine: its calls act on "default", as before."""
    async with engines("smollm2") as (engine,):
        with tempfile.TemporaryDirectory() as tmp:
            store = KeyStore(Path(tmp) / "keys.db")
            app = make_app(store)
            _, key = store.create("k")
            await app.startup()
            try:
                await put(app, {"url": engine.url, "served_model": "smollm2"})
                view = (await call(app, "GET", "/admin/upstream", headers=ADMIN_H)).json()
                assert view["upstream"]["url"] == engine.url and list(view["engines"]) == ["default"]
                assert (await call(app, "GET", "/admin/upstream", headers=ADMIN_H,
                                   query=b"engine=default")).json()["upstream"]["url"] == engine.url
                # One engine: no model needed, as before.
                assert (await post(app, key, "/v1/embeddings", {"prompt": "x"}))[1]["served_by"] == "smollm2"
                assert (await call(app, "GET", "/admin/upstream", headers=ADMIN_H,
                                   query=b"engine=bad%20name")).status == 422
            finally:
                await app.shutdown()
