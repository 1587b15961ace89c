"""The console's Now page lists the engines started beside the primary (model, recipe, state), each with
a Stop behind the same confirm + CSRF discipline as every console action."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from controller import admin_token
from controller.supervisor.machine import State
from tests.unit.engine_set_helpers import SetRig
from tests.unit.test_console import _form_token, login
from tests.unit.test_engine_set import AUTH, TOKEN, beside_ready, primary_ready, until


@pytest.fixture
def rig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SetRig:
    monkeypatch.delenv(admin_token.HASH_ENV, raising=False)
    admin_token.write_hash(tmp_path, TOKEN)
    return SetRig(tmp_path)


@pytest.fixture
async def client(rig: SetRig) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=rig.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8090") as c:
        yield c


async def test_the_now_page_lists_the_engines_beside_and_stops_one_after_a_confirm(
    rig: SetRig, client: httpx.AsyncClient,
) -> None:
    await primary_ready(rig, client)
    await login(client)
    assert 'id="beside"' not in (await client.get("/console/")).text  # one engine: nothing beside it
    await beside_ready(rig, client)
    now = (await client.get("/console/")).text
    assert 'id="beside"' in now and "<td>smollm2-b</td><td>cpu-beside</td>" in now
    assert 'href="/console/engine/stop?model=smollm2-b"' in now
    confirm = await client.get("/console/engine/stop", params={"model": "smollm2-b"})
    assert confirm.status_code == 200 and "requests for model smollm2-b get 404" in confirm.text
    assert _form_token(confirm.text, "model") == "smollm2-b"
    csrf = _form_token(confirm.text, "csrf")
    forged = await client.post("/console/engine/stop", data={"csrf": "forged", "model": "smollm2-b"})
    assert forged.status_code == 403 and rig.engines.alongside["smollm2-b"].view.state is State.READY
    unknown = await client.post("/console/engine/stop", data={"csrf": csrf, "model": "gpt-4o"})
    assert unknown.status_code == 404
    assert (await client.get("/console/engine/stop", params={"model": "gpt-4o"})).status_code == 404
    stopped = await client.post("/console/engine/stop", data={"csrf": csrf, "model": "smollm2-b"})
    assert stopped.status_code == 303
    await until(rig, lambda: "smollm2-b" not in rig.engines.alongside)
    assert rig.primary.view.state is State.READY  # the primary was not touched
    assert 'id="beside"' not in (await client.get("/console/")).text
    assert (await client.get("/status", headers=AUTH)).json()["state"] == "ready"


async def test_the_console_apply_and_restart_of_the_primary_keep_the_rules_of_the_api(
    rig: SetRig, client: httpx.AsyncClient,
) -> None:
    await primary_ready(rig, client)
    await beside_ready(rig, client)
    await login(client)
    csrf = _form_token((await client.get("/console/recipes/cpu-b-twin/apply")).text, "csrf")
    # A name an engine beside the primary serves: refused, as POST /apply refuses it.
    refused = await client.post("/console/recipes/cpu-b-twin/apply", data={"csrf": csrf})
    assert refused.status_code == 409 and "model name &#39;smollm2-b&#39; is served by engine" in refused.text
    assert rig.primary.view.state is State.READY and rig.primary.view.recipe == "cpu-smollm2"
    # A restart of the primary beside another engine drains first (the hold path), as the API's does.
    restarted = await client.post("/console/engine/restart", data={"csrf": csrf})
    assert restarted.status_code == 303 and rig.primary.view.state is State.DRAINING
