"""Admission tells the truth about now: a cluster recipe on a controller with no cluster is refused as
"needs a cluster" (the plan, the apply, the Recipes page), and the plan of the recipe serving now says
so and predicts a restart from MemAvailable plus what that engine holds
(appliance/recipe/running_plan.py), not from an empty host."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from appliance.recipe.admission import Admission, Check
from appliance.recipe.running_plan import running_plan
from controller import admin_token
from controller.supervisor.machine import State
from tests.unit.test_api import AUTH, TOKEN, Rig
from tests.unit.test_console import login

K8S = "gfx906-b-tp4-eager-k8s"
NO_CLUSTER = "kubernetes runtime unavailable: no kubeconfig and not in a cluster"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv(admin_token.HASH_ENV, raising=False)
    admin_token.write_hash(tmp_path, TOKEN)
    return tmp_path


@pytest.fixture
def rig(home: Path) -> Rig:
    rig = Rig(home)
    # as service.build sets it: the runtimes this controller has, and why the others are missing
    rig.preflight.runtime_kinds = frozenset({"process"})
    rig.preflight.runtime_gaps = {"kubernetes": NO_CLUSTER}
    return rig


@pytest.fixture
async def client(rig: Rig) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=rig.app),
                                 base_url="http://127.0.0.1:8090") as c:
        yield c


# -- a cluster recipe without a cluster


async def test_the_plan_of_a_cluster_recipe_without_a_cluster_says_it_needs_one(
        client: httpx.AsyncClient) -> None:
    plan = (await client.post(f"/recipes/{K8S}/plan", headers=AUTH)).json()
    assert plan["admission"]["verdict"] == "admit"  # the node's needs are not this host's to judge...
    assert plan["launchable"] is False  # ...but this controller cannot start it
    assert plan["refusals"][0]["summary"] == f"needs a cluster: {NO_CLUSTER}"


async def test_applying_it_is_refused_before_anything_is_stopped(rig: Rig, client: httpx.AsyncClient) -> None:
    assert (await client.post("/apply", json={"recipe": K8S}, headers=AUTH)).status_code == 202
    await rig.step(1)
    status = (await client.get("/status")).json()
    assert status["last_apply"]["outcome"] == "refused"
    assert status["last_apply"]["failure"]["summary"].startswith("needs a cluster")
    assert rig.runtime.started == []


async def test_the_recipes_page_says_needs_a_cluster_with_no_live_apply(client: httpx.AsyncClient) -> None:
    await login(client)
    default = (await client.get("/console/recipes")).text
    assert f'id="recipe-{K8S}"' not in default  # refused here: hidden until asked for
    page = (await client.get("/console/recipes", params={"refused": "shown"})).text
    row = re.search(rf'<tr id="recipe-{K8S}">.*?</tr>', page, re.S)
    assert row is not None
    assert '<span class="verdict verdict-refuse">needs a cluster</span>' in row.group(0)
    assert f'href="/console/recipes/{K8S}/apply"' not in row.group(0) and "aria-disabled" in row.group(0)


async def test_a_controller_that_has_the_runtime_admits_it(rig: Rig, client: httpx.AsyncClient) -> None:
    rig.preflight.runtime_kinds = frozenset({"process", "kubernetes"})
    plan = (await client.post(f"/recipes/{K8S}/plan", headers=AUTH)).json()
    assert not [r for r in plan["refusals"] if "cluster" in r["summary"]]


# -- the plan of the recipe serving now


async def _serve(rig: Rig, client: httpx.AsyncClient, recipe: str = "cpu-smollm2") -> None:
    assert (await client.post("/apply", json={"recipe": recipe}, headers=AUTH)).status_code == 202
    await rig.step(1)
    rig.runtime.current().healthy = True
    await rig.step(1)
    assert rig.driver.view.state is State.READY


async def test_the_plan_of_the_running_recipe_predicts_from_memavailable_plus_its_engine(
    rig: Rig, client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("controller.api_context.serving_footprint", lambda runtimes, handle: 1.5)
    await _serve(rig, client)
    plan = (await client.post("/recipes/cpu-smollm2/plan", headers=AUTH)).json()
    running = plan["running"]
    launch = rig.driver.view.ready_launch()
    assert launch is not None and running["launch_id"] == launch.launch_id
    assert running["engine_gib"] == 1.5
    assert running["available_gib"] == pytest.approx(running["mem_available_gib"] + 1.5, abs=0.01)
    assert running["predicted_min_mem_available_gib"] == pytest.approx(
        running["available_gib"] - running["demand_gib"], abs=0.01)
    # the old figure came from MemTotal, as if nothing ran; this one never exceeds what a restart has
    assert running["predicted_min_mem_available_gib"] < running["available_gib"]
    assert "is running now" in running["text"]
    shown = (await client.get("/recipes/cpu-smollm2")).json()
    assert shown["running"]["launch_id"] == launch.launch_id
    other = (await client.post("/recipes/cpu-smollm2-eager/plan", headers=AUTH)).json()
    assert other["running"] is None


async def test_no_running_plan_while_idle(client: httpx.AsyncClient) -> None:
    assert (await client.post("/recipes/cpu-smollm2/plan", headers=AUTH)).json()["running"] is None


def _admission(demand: float | None) -> Admission:
    numbers: dict[str, float | int | str | None] = {} if demand is None else {"demand_gib": demand}
    return Admission(recipe="r", verdict="admit", checks=(
        Check(name="memory-peak-warm", verdict="admit", message="", numbers=numbers, fact=""),))


def test_running_plan_numbers_and_verdict() -> None:
    p = running_plan(_admission(6.0), "L1", mem_available_gib=19.65, engine_gib=4.0, cold=False,
                     target_gib=12.0)
    assert (p.available_gib, p.predicted_min_mem_available_gib, p.verdict) == (23.65, 17.65, "admit")
    under = running_plan(_admission(6.0), "L1", mem_available_gib=10.0, engine_gib=4.0, cold=False,
                         target_gib=12.0)
    assert under.verdict == "warn" and "under the recipe's bar" in under.text


def test_running_plan_without_a_measure_or_a_model_says_so() -> None:
    p = running_plan(_admission(6.0), "L1", mem_available_gib=19.65, engine_gib=None, cold=False,
                     target_gib=0)
    assert p.available_gib == 19.65 and "could not be measured" in p.text and "a floor" in p.text
    q = running_plan(_admission(None), "L1", mem_available_gib=19.65, engine_gib=2.0, cold=False,
                     target_gib=0)
    assert q.predicted_min_mem_available_gib is None and q.verdict == "warn" and "no memory model" in q.text


def test_appliance_plan_of_the_running_recipe_says_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import typer
    from typer.testing import CliRunner

    from controller.api_client import API_ENV
    from controller.cli import recipes_cmd

    running = running_plan(_admission(1.0), "L7", mem_available_gib=3.0, engine_gib=1.25, cold=False,
                           target_gib=0.5).model_dump(mode="json")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"running": running if self.path == "/recipes/cpu-smollm2" else None}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv(API_ENV, f"http://127.0.0.1:{server.server_address[1]}")
    app = typer.Typer()
    recipes_cmd.register(app)
    try:
        out = CliRunner().invoke(app, ["plan", "cpu-smollm2"])
        assert f"running now: {running['text']}" in out.output, out.output
        js = CliRunner().invoke(app, ["plan", "cpu-smollm2", "--json"])
        assert json.loads(js.output)["running"] == running
        other = CliRunner().invoke(app, ["plan", "cpu-smollm2-eager"])
        assert "running now" not in other.output
    finally:
        server.shutdown()
        server.server_close()


async def test_the_console_plan_of_the_running_recipe_says_it_runs(
    rig: Rig, client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("controller.api_context.serving_footprint", lambda runtimes, handle: 2.0)
    await _serve(rig, client)
    await login(client)
    page = (await client.get("/console/recipes/cpu-smollm2/apply")).text
    assert 'id="running-plan"' in page and "is running now" in page
    assert "what the engine holds 2.00 GiB" in page
    assert 'id="running-plan"' not in (await client.get("/console/recipes/cpu-smollm2-eager")).text
