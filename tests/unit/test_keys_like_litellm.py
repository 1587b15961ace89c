"""Keys like LiteLLM's: `appliance keys update` by name or a unique id prefix (an ambiguous one exits 2
with the candidates), limits edited in the console (a form behind the CSRF token), and "last used" per
key computed from the usage store (the last hour a key sent a request in; no column on the keys)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import typer
from fastapi import FastAPI
from typer.testing import CliRunner

from controller.api.keys import keys_router
from controller.cli import keys_cmd
from controller.cli.key_ref import KeyRefError, resolve
from controller.gateway.keystore import KeyStore
from controller.gateway.usage.store import HOUR_S, HourUsage, UsageStore, hour_of
from controller.settings import Paths
from tests.unit.test_console import client, csrf_of, home, login, rig  # noqa: F401  (fixtures)

ROWS: list[dict[str, Any]] = [
    {"id": "abc111aaaaaa", "name": "svc", "revoked": None},
    {"id": "abc222bbbbbb", "name": "batch", "revoked": None},
    {"id": "def333cccccc", "name": "old", "revoked": 5.0},
    {"id": "fed444dddddd", "name": "old", "revoked": None},
]


# -- which key is meant


@pytest.mark.parametrize(("ref", "expected"), [
    ("abc111aaaaaa", "abc111aaaaaa"),  # an exact id
    ("batch", "abc222bbbbbb"),  # a name
    ("old", "fed444dddddd"),  # a name reused after its first key was revoked: the live one
    ("abc1", "abc111aaaaaa"),  # a prefix only one id has
    ("def", "def333cccccc"),  # a revoked key's prefix still names it (its limits are still readable)
])
def test_a_key_is_named_by_id_name_or_unique_prefix(ref: str, expected: str) -> None:
    assert resolve(ref, ROWS) == expected


def test_an_ambiguous_prefix_names_its_candidates() -> None:
    with pytest.raises(KeyRefError) as exc:
        resolve("abc", ROWS)
    assert "2 keys have ids starting 'abc'" in str(exc.value)
    assert [c["id"] for c in exc.value.candidates] == ["abc111aaaaaa", "abc222bbbbbb"]


def test_a_short_or_unknown_ref_names_no_key() -> None:
    with pytest.raises(KeyRefError, match="at least 3 characters"):
        resolve("ab", ROWS)
    with pytest.raises(KeyRefError, match="no key with the id or name 'nobody'"):
        resolve("nobody", ROWS)


def test_two_live_keys_with_one_name_are_ambiguous() -> None:
    rows = [*ROWS, {"id": "999aaaaaaaaa", "name": "svc", "revoked": None}]
    with pytest.raises(KeyRefError, match="2 keys are named 'svc'"):
        resolve("svc", rows)


# -- the command


@pytest.fixture
def keyfile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, list[str]]]:
    """A key store with two keys whose ids share their first three characters."""
    ids = iter(["abc111aaaaaa", "abc222bbbbbb"])
    monkeypatch.setattr("controller.gateway.keystore.secrets.token_hex", lambda n: next(ids))
    path = tmp_path / "keys.sqlite3"
    store = KeyStore(path)
    made = [store.create("svc")[0].id, store.create("batch", rpm_limit=10)[0].id]
    monkeypatch.undo()
    yield path, made


def _cli(*args: str) -> tuple[int, str, str]:
    app = typer.Typer()
    keys_cmd.register(app)
    out = CliRunner().invoke(app, ["keys", *args])
    return out.exit_code, out.stdout, out.stderr


def test_keys_update_by_name_and_by_prefix(keyfile: tuple[Path, list[str]]) -> None:
    path, (svc, batch) = keyfile
    code, out, _ = _cli("update", "svc", "--rpm", "30", "--keys", str(path))
    assert code == 0 and f"updated {svc} (svc): rpm_limit=30" in out
    code, out, _ = _cli("update", "abc2", "--tpm", "1000", "--keys", str(path))
    assert code == 0 and batch in out
    limits = {r.id: (r.rpm_limit, r.tpm_limit) for r in KeyStore(path).list()}
    assert limits == {svc: (30, None), batch: (10, 1000)}


def test_keys_update_with_an_ambiguous_prefix_exits_2_with_the_candidates(
    keyfile: tuple[Path, list[str]],
) -> None:
    path, (svc, batch) = keyfile
    code, _, err = _cli("update", "abc", "--rpm", "5", "--keys", str(path))
    assert code == 2
    assert "2 keys have ids starting 'abc'" in err and f"{svc} (svc)" in err and f"{batch} (batch)" in err
    assert [r.rpm_limit for r in KeyStore(path).list()] == [None, 10]  # nothing changed
    code, _, err = _cli("update", "nobody", "--rpm", "5", "--keys", str(path))
    assert code == 2 and "no key with the id or name 'nobody'" in err


def test_keys_list_shows_the_hour_a_key_was_last_used(keyfile: tuple[Path, list[str]]) -> None:
    path, (svc, batch) = keyfile
    now = time.time()
    UsageStore(path.with_name("usage.sqlite3")).write({
        (svc, hour_of(now - 3 * HOUR_S)): HourUsage(requests=2, prompt_tokens=10),
        (svc, hour_of(now - HOUR_S)): HourUsage(requests=1, prompt_tokens=3),
        (batch, hour_of(now)): HourUsage(requests=0),  # an hour with no request is no use
    })
    code, out, _ = _cli("list", "--keys", str(path), "--json")
    rows = {r["id"]: r["last_used"] for r in json.loads(out)}
    assert code == 0 and rows == {svc: hour_of(now - HOUR_S), batch: None}
    code, out, _ = _cli("list", "--keys", str(path))
    assert "LAST USED (HOUR)" in out
    assert time.strftime("%Y-%m-%d %H:%M", time.localtime(hour_of(now - HOUR_S))) in out


# -- the API and the console


async def test_get_keys_says_when_each_key_was_last_used(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "keys.sqlite3")
    used, idle = store.create("used")[0].id, store.create("idle")[0].id
    hour = hour_of(time.time())
    UsageStore(tmp_path / "usage.sqlite3").write({(used, hour): HourUsage(requests=4)})
    app = FastAPI()
    app.include_router(keys_router(lambda: None, store=store))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as c:
        body = (await c.get("/keys")).json()
    assert {k["id"]: k["last_used"] for k in body} == {used: hour, idle: None}


async def test_limits_are_edited_in_the_console_behind_csrf(client: httpx.AsyncClient, home: Path) -> None:  # noqa: F811
    store = KeyStore(Paths(home).keys_db)
    key = store.create("svc", rpm_limit=60, tpm_limit=5000)[0].id
    UsageStore(Paths(home).keys_db.with_name("usage.sqlite3")).write(
        {(key, hour_of(time.time())): HourUsage(requests=1)})
    await login(client)
    page = (await client.get("/console/keys")).text
    assert f'action="/console/keys/{key}/limits"' in page and 'value="60"' in page
    assert "(that hour)" in page  # last used
    form = {"rpm_limit": "120", "max_concurrent": "4", "tpm_limit": "", "tpd_limit": "90000"}
    forged = await client.post(f"/console/keys/{key}/limits", data={**form, "csrf": "forged"})
    assert forged.status_code == 403
    assert store.list()[0].rpm_limit == 60  # nothing changed
    r = await client.post(f"/console/keys/{key}/limits", data={**form, "csrf": await csrf_of(client)})
    assert r.status_code == 303 and r.headers["location"] == "/console/keys?notice=limits"
    record = store.list()[0]
    limits = (record.rpm_limit, record.max_concurrent, record.tpm_limit, record.tpd_limit)
    assert limits == (120, 4, None, 90000)
    bad = await client.post(f"/console/keys/{key}/limits",
                            data={**form, "rpm_limit": "-1", "csrf": await csrf_of(client)})
    assert bad.status_code == 422 and "whole number" in bad.text
    assert store.list()[0].rpm_limit == 120
    gone = await client.post("/console/keys/000000000000/limits",
                             data={**form, "csrf": await csrf_of(client)})
    assert gone.status_code == 404
