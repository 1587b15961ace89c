"""Usage recorded per key AND model: the gateway's record (the served name of the engine that took
the request, "unknown" for one no engine took), `appliance usage --by model`, the CSV's model column
(neutralised as every cell), and ``GET /usage?by=model``."""

from __future__ import annotations

import csv
import io
import json
import time
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from controller.api.usage import usage_router
from controller.cli.main import _register, app
from controller.gateway.keystore import KeyStore
from controller.gateway.usage.store import HourUsage, UsageStore, hour_of
from tests.unit.test_gateway_engines import chat, rig
from tests.unit.test_gateway_keys_api import require_admin
from tests.unit.test_upstream_client import both_loops


@both_loops
async def test_the_gateway_records_usage_per_key_and_model() -> None:
    async with rig() as (app_, _, _, _, key):
        for model in ("alpha", "a1", "beta", "gpt-4o"):
            await chat(app_, key, model)
        assert await app_.accounting.flush()
        rows = UsageStore(app_.config.usage_path).query()
        assert {r.model: r.requests for r in rows} == {"alpha": 2, "beta": 1, "unknown": 1}
        assert {r.model: r.errors for r in rows}["unknown"] == 1


def _seed(tmp_path: Path) -> tuple[KeyStore, str]:
    store = KeyStore(tmp_path / "keys.sqlite3")
    alice, _ = store.create("alice")
    h = hour_of(time.time()) - 3600
    UsageStore(tmp_path / "usage.sqlite3").write({
        (alice.id, h): HourUsage(requests=1, prompt_tokens=1, completion_tokens=1),  # before models: ""
        (alice.id, "alpha", h): HourUsage(requests=2, prompt_tokens=10, completion_tokens=5),
        (alice.id, "=cmd|calc", h): HourUsage(requests=1, prompt_tokens=3, completion_tokens=3),
    })
    return store, alice.id


def test_appliance_usage_by_model_and_the_csv_model_column(tmp_path: Path) -> None:
    _register()
    store, _ = _seed(tmp_path)
    run = CliRunner().invoke
    r = run(app, ["usage", "--keys", str(store.path), "--by", "model", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert {t["model"]: t["total_tokens"] for t in out["totals"]} == {"": 2, "alpha": 15, "=cmd|calc": 6}
    assert {r["model"] for r in out["rows"]} == {"", "alpha", "=cmd|calc"}
    r = run(app, ["usage", "--keys", str(store.path), "--csv"])
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert r.stdout.splitlines()[0].endswith(",duration_s,model")
    assert sorted(row["model"] for row in rows) == ["", "'=cmd|calc", "alpha"]  # neutralised as today
    r = run(app, ["usage", "--keys", str(store.path), "--by", "model"])
    assert r.exit_code == 0 and "MODEL" in r.stdout and "per model:" in r.stdout
    assert run(app, ["usage", "--keys", str(store.path), "--by", "hour"]).exit_code == 2


def test_get_usage_by_model(tmp_path: Path) -> None:
    store, _ = _seed(tmp_path)
    api = FastAPI()
    api.include_router(usage_router(require_admin, keys=store))
    c = TestClient(api)
    h = {"Authorization": "Bearer ok"}
    out = c.get("/usage", params={"by": "model"}, headers=h).json()
    assert out["by"] == "model"
    assert {t["model"]: t["requests"] for t in out["totals"]} == {"": 1, "alpha": 2, "=cmd|calc": 1}
    by_key = c.get("/usage", headers=h).json()
    assert [t["key_name"] for t in by_key["totals"]] == ["alice"] and by_key["totals"][0]["requests"] == 4
    assert c.get("/usage", params={"by": "hour"}, headers=h).status_code == 422


@pytest.mark.parametrize("model", ["", "alpha"])
def test_a_row_says_its_model(tmp_path: Path, model: str) -> None:
    store = UsageStore(tmp_path / "u.sqlite3")
    store.write({("k", model, 0): HourUsage(requests=1)})
    assert [r.as_dict()["model"] for r in store.query()] == [model]
