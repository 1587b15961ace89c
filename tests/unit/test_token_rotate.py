"""`appliance token rotate` for a lost admin token, and the controller's port opening on the console
(issue 36 item 8). The running controller reads the token's hash on every request, so a rotation
takes effect at once: the old token is refused, the new one works, console sessions end."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from controller import admin_token
from controller.cli import main
from tests.unit import test_console as _console
from tests.unit.test_api import TOKEN, Rig
from tests.unit.test_console import login

home, rig = _console.home, _console.rig

if not main.app.registered_commands and not main.app.registered_groups:
    main._register()


@pytest.fixture
async def client(rig: Rig) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=rig.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
        yield c


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_rotate_prints_a_new_token_once_and_the_running_controller_takes_it_at_once(
    client: httpx.AsyncClient, home: Path
) -> None:
    await login(client)
    assert (await client.get("/console/keys")).status_code == 200
    # an admin-only read: past the token check, an unknown launch is a 404
    assert (await client.get("/launches/nope/log", headers=_bearer(TOKEN))).status_code == 404

    result = CliRunner().invoke(main.app, ["token", "rotate"])
    assert result.exit_code == 0, result.output
    line = result.stdout.strip()
    assert line.startswith(f"export {admin_token.TOKEN_ENV}=adm_") and len(result.stdout.splitlines()) == 1
    new = line.split("=", 1)[1]
    assert new not in admin_token.hash_file(home).read_text()  # only its hash is stored
    assert "shown once" in result.stderr and new not in result.stderr

    assert (await client.get("/launches/nope/log", headers=_bearer(TOKEN))).status_code == 403
    assert (await client.get("/launches/nope/log", headers=_bearer(new))).status_code == 404
    # the console session opened with the old token ends
    r = await client.get("/console/keys")
    assert r.status_code == 303 and "/console/login" in r.headers["location"]

    again = json.loads(CliRunner().invoke(main.app, ["token", "rotate", "--json"]).stdout)
    assert again["replaced"] is True and again["token"] != new
    assert (await client.get("/launches/nope/log", headers=_bearer(new))).status_code == 403


def test_rotate_refuses_when_the_environment_holds_the_hash(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = admin_token.hash_file(home).read_text()
    monkeypatch.setenv(admin_token.HASH_ENV, admin_token.hash_token("adm_from-env"))
    result = CliRunner().invoke(main.app, ["token", "rotate"])
    assert result.exit_code == 1 and admin_token.HASH_ENV in result.stderr and result.stdout == ""
    assert admin_token.hash_file(home).read_text() == before


async def test_the_controllers_root_opens_the_console(client: httpx.AsyncClient) -> None:
    r = await client.get("/")
    assert r.status_code == 307 and r.headers["location"] == "/console/"
