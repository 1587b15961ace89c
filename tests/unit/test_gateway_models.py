"""Finding 8: the gateway serves only the model it fronts. A request naming another model is a 404 in
OpenAI's shape (never answered by whatever engine runs); the recipe's aliases are accepted, rewritten to
the served name, and listed in GET /v1/models. Run on asyncio's loop and on uvloop (the gateway's)."""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from aiohttp import web

from controller.gateway.app import GatewayApp
from controller.gateway.keystore import KeyStore
from controller.gateway.slot import NoSlotPolicy
from tests.unit.test_gateway_app import ADMIN, auth, call, make_app
from tests.unit.test_gateway_app import VLLM_MODELS as LISTING
from tests.unit.test_upstream_client import both_loops

NOT_FOUND = {"error": {"message": "The model `gpt-4o` does not exist or you do not have access to it.",
                       "type": "invalid_request_error", "param": "model", "code": "model_not_found"}}
JSON_TYPE = {"content-type": "application/json"}


class Engine:
    """A stand-in vLLM: records each completion body, answers the listing."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.url = ""

    async def chat(self, request: web.Request) -> web.Response:
        self.bodies.append(await request.read())
        return web.json_response({"object": "chat.completion", "choices": []})

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response(LISTING)


@asynccontextmanager
async def rig(**kw: object) -> AsyncIterator[tuple[GatewayApp, Engine, str]]:
    engine = Engine()
    upstream = web.Application()
    upstream.router.add_post("/v1/chat/completions", engine.chat)
    upstream.router.add_get("/v1/models", engine.models)
    runner = web.AppRunner(upstream)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    engine.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    with tempfile.TemporaryDirectory() as tmp:
        store = KeyStore(Path(tmp) / "keys.db")
        app = make_app(store, **kw)
        _, key = store.create("a")
        await app.startup()
        try:
            yield app, engine, key
        finally:
            await app.shutdown()
            await runner.cleanup()


async def put_upstream(app: GatewayApp, url: str, aliases: list[str]) -> dict[str, object]:
    body = json.dumps({"url": url, "served_model": "smollm2", "aliases": aliases, "drain_deadline_s": 0})
    r = await call(app, "PUT", "/admin/upstream", body.encode(), {"authorization": f"Bearer {ADMIN}"})
    assert r.status == 200, r.body
    upstream: dict[str, object] = r.json()["upstream"]
    return upstream


async def chat(app: GatewayApp, key: str, body: dict[str, object]) -> tuple[int, bytes]:
    r = await call(app, "POST", "/v1/chat/completions", json.dumps(body).encode(), {**auth(key), **JSON_TYPE})
    return r.status, r.body


@both_loops
async def test_an_unknown_model_is_a_404_and_aliases_are_rewritten_and_listed() -> None:
    async with rig() as (app, engine, key):
        up = await put_upstream(app, engine.url, ["smol", "small"])
        assert up["aliases"] == ["small", "smol"]
        status, body = await chat(app, key, {"model": "gpt-4o", "messages": []})
        assert (status, json.loads(body)) == (404, NOT_FOUND)
        assert engine.bodies == []  # never reached the engine
        assert (await chat(app, key, {"model": "smol", "messages": []}))[0] == 200
        assert json.loads(engine.bodies[-1])["model"] == "smollm2"
        assert (await chat(app, key, {"model": "smollm2", "messages": []}))[0] == 200
        assert engine.bodies[-1] == b'{"model": "smollm2", "messages": []}'  # untouched
        # No model member: forwarded as today, the engine decides.
        assert (await chat(app, key, {"messages": []}))[0] == 200
        assert engine.bodies[-1] == b'{"messages": []}'
        listing = await call(app, "GET", "/v1/models", headers=auth(key))
        cards = listing.json()["data"]
        assert [c["id"] for c in cards] == ["smollm2", "small", "smol"]
        assert all(c["root"] == "smollm2" and c["max_model_len"] == 2048 for c in cards)
        # The same engine re-asserted without aliases: the alias is now unknown (no drain needed).
        up = await put_upstream(app, engine.url, [])
        assert up["aliases"] == []
        status, body = await chat(app, key, {"model": "smol", "messages": []})
        assert status == 404 and json.loads(body)["error"]["code"] == "model_not_found"
        listing = await call(app, "GET", "/v1/models", headers=auth(key))
        assert [c["id"] for c in listing.json()["data"]] == ["smollm2"]


@both_loops
async def test_a_request_that_waited_for_an_upstream_is_checked_against_it() -> None:
    """No upstream when the request arrived (queued): the check happens where the upstream is known."""
    async with rig(no_slot_policy=NoSlotPolicy.QUEUE, queue_timeout_s=5.0) as (app, engine, key):
        refused = asyncio.create_task(chat(app, key, {"model": "gpt-4o", "messages": []}))
        aliased = asyncio.create_task(chat(app, key, {"model": "smol", "messages": []}))
        while app.slot.waiting < 2:
            await asyncio.sleep(0.01)
        await put_upstream(app, engine.url, ["smol"])
        status, body = await refused
        assert (status, json.loads(body)) == (404, NOT_FOUND)
        assert (await aliased)[0] == 200
        assert [json.loads(b)["model"] for b in engine.bodies] == ["smollm2"]
