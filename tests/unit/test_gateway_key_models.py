"""Keys limited to some models: the store (schema v3), `appliance keys create/update --models`, the
admin API's ``models`` field, and the gateway's 403 ``model_not_allowed`` and filtered listing."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from controller.api.keys import keys_router
from controller.gateway.keystore import KeyStore, KeyStoreError
from tests.unit.test_gateway_app import auth, call, make_app
from tests.unit.test_gateway_cli import app as cli_app
from tests.unit.test_gateway_engines import chat, engines, put, rig
from tests.unit.test_gateway_keys_api import require_admin
from tests.unit.test_upstream_client import both_loops


def not_allowed(model: str) -> dict[str, object]:
    return {"error": {"message": f"This key may not use the model `{model}`.",
                      "type": "invalid_request_error", "param": "model", "code": "model_not_allowed"}}


def test_the_store_keeps_a_keys_models(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "k.db")
    record, _ = store.create("svc", models=["beta", "alpha", "beta"])
    assert record.models == frozenset({"alpha", "beta"})
    assert store.get(record.id).as_dict()["models"] == ["alpha", "beta"]
    assert store.update(record.id, {}, ["gamma"]).models == frozenset({"gamma"})
    assert store.update(record.id, {"rpm_limit": 5}).models == frozenset({"gamma"})  # left as it was
    assert store.update(record.id, {}, None).models is None  # every model again
    for bad in ([], [""], ["x" * 257], ["a\nb"], [f"m{i}" for i in range(65)]):
        with pytest.raises(KeyStoreError):
            store.create("bad", models=bad)
    assert [r.name for r in store.list()] == ["svc"]


def test_keys_create_and_update_take_models(tmp_path: Path) -> None:
    db = str(tmp_path / "k.db")
    runner = CliRunner()
    r = runner.invoke(cli_app(), ["keys", "create", "--name", "svc", "--models", "alpha, beta",
                                  "--keys", db, "--json"])
    assert r.exit_code == 0, r.output
    created = json.loads(r.stdout)
    assert created["models"] == ["alpha", "beta"]
    r = runner.invoke(cli_app(), ["keys", "update", created["id"], "--models", "gamma", "--keys", db])
    assert r.exit_code == 0 and "models=gamma" in r.stdout
    assert KeyStore(Path(db)).get(created["id"]).models == frozenset({"gamma"})
    listed = runner.invoke(cli_app(), ["keys", "list", "--keys", db]).stdout
    assert "MODELS" in listed and "gamma" in listed
    r = runner.invoke(cli_app(), ["keys", "update", created["id"], "--all-models", "--keys", db])
    assert r.exit_code == 0 and "models=all" in r.stdout
    assert KeyStore(Path(db)).get(created["id"]).models is None
    r = runner.invoke(cli_app(), ["keys", "update", created["id"], "--models", " , ", "--keys", db])
    assert r.exit_code != 0


def test_the_admin_api_takes_models(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "k.db")
    app = FastAPI()
    app.include_router(keys_router(require_admin, store=store))
    c, h = TestClient(app), {"Authorization": "Bearer ok"}
    r = c.post("/keys", json={"name": "svc", "models": ["alpha"]}, headers=h)
    assert r.status_code == 201 and r.json()["models"] == ["alpha"]
    key_id = r.json()["id"]
    assert c.post("/keys", json={"name": "x", "models": []}, headers=h).status_code == 422
    assert c.post("/keys", json={"name": "x", "models": "alpha"}, headers=h).status_code == 422
    r = c.patch(f"/keys/{key_id}", json={"rpm_limit": 3}, headers=h)
    assert r.json()["models"] == ["alpha"]  # left out: unchanged
    r = c.patch(f"/keys/{key_id}", json={"models": None}, headers=h)
    assert r.status_code == 200 and r.json()["models"] is None
    assert c.get("/keys", headers=h).json()[0]["models"] is None


@both_loops
async def test_a_key_limited_to_a_model_gets_403_for_another_and_sees_only_its_own() -> None:
    async with rig() as (app, _, beta, store, _):
        _, key = store.create("beta only", models=["beta"])
        app.keys.load()
        status, body = await chat(app, key, "alpha")
        assert (status, body) == (403, not_allowed("alpha"))
        status, body = await chat(app, key, "a1")  # an alias of another model: refused, named as asked
        assert (status, body) == (403, not_allowed("a1"))
        assert (await chat(app, key, "b1"))[1]["served_by"] == "beta"  # its model's alias is allowed
        assert (await chat(app, key, "gpt-4o"))[0] == 404  # unknown stays unknown
        listing = (await call(app, "GET", "/v1/models", headers=auth(key))).json()["data"]
        assert [c["id"] for c in listing] == ["beta", "b1"]
        assert len(beta.bodies) == 1
        text = (await call(app, "GET", "/metrics", headers={"authorization": "Bearer admin-token-for-tests"}))
        assert 'model="unknown",route="/v1/chat/completions",status="403"' in text.body.decode()


@both_loops
async def test_one_engine_a_key_for_another_model_is_refused_and_lists_nothing() -> None:
    async with engines("smollm2") as (engine,):
        with tempfile.TemporaryDirectory() as tmp:
            store = KeyStore(Path(tmp) / "keys.db")
            app = make_app(store)
            _, other = store.create("other", models=["qwen"])
            _, mine = store.create("mine", models=["smollm2"])
            await app.startup()
            try:
                await put(app, {"url": engine.url, "served_model": "smollm2", "aliases": ["smol"]})
                assert (await chat(app, other, "smollm2")) == (403, not_allowed("smollm2"))
                # No model named: the one engine's model is what it would use.
                assert (await chat(app, other, None)) == (403, not_allowed("smollm2"))
                listing = (await call(app, "GET", "/v1/models", headers=auth(other))).json()["data"]
                assert listing == []
                assert (await chat(app, mine, "smol"))[0] == 200
                listing = (await call(app, "GET", "/v1/models", headers=auth(mine))).json()["data"]
                assert [c["id"] for c in listing] == ["smollm2", "smol"]
            finally:
                await app.shutdown()
