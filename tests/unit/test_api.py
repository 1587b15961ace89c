"""The admin API: auth, every error code, bad bodies, concurrent apply, status, SSE.

The driver runs with a fake runtime/prober/gateway (the declared seams); the preflight is the
real one over the shipped recipes and the reference host's fixture tree (so `cpu-smollm2` really
renders and is really admitted).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import pytest
import uvicorn

from controller import admin_token
from controller.api.app import create_app
from controller.api_context import ApiContext
from controller.store import Store
from controller.supervisor.driver import Driver, DriverConfig
from controller.supervisor.events import EventLog
from controller.supervisor.host_seams import BesideFn, OnReady
from controller.supervisor.machine import State
from controller.supervisor.preflight import Preflight
from tests.unit.model_helpers import seed_model
from tests.unit.supervisor_helpers import FakeClock, FakeProber, FakeRuntime, RecordingGateway

REPO = Path(__file__).resolve().parents[2]
REFERENCE_HOST = REPO / "tests" / "fixtures" / "hosts" / "reference"
TOKEN = "adm_test-token-not-secret"


class Rig:
    def __init__(self, home: Path, recipes_dir: Path = REPO / "recipes",
                 on_ready: Callable[[FakeRuntime, EventLog], OnReady] | None = None,
                 beside: BesideFn | None = None) -> None:
        """`on_ready`: the ready hook made from the rig's runtime and event stream (as service.build
        makes it before the driver); `beside`: the blue/green check (None: every switch holds)."""
        self.clock = FakeClock()
        self.runtime = FakeRuntime(self.clock)
        self.store = Store(home / "appliance.sqlite3")
        seed_model(home)
        self.preflight = Preflight(
            recipes_dir=recipes_dir, appliance_home=home, facts_root=REFERENCE_HOST,
            generated_dir=home / "recipes-generated",
        )
        events = EventLog(self.store, self.clock)
        self.driver = Driver(
            runtimes={"process": self.runtime}, store=self.store, preflight=self.preflight,
            prober=FakeProber(self.runtime), gateway=RecordingGateway(), clock=self.clock,
            config=DriverConfig(poll_interval_s=1, probe_interval_s=1, oom_settle_s=0),
            events=events, on_ready=on_ready(self.runtime, events) if on_ready is not None else None,
            beside=beside,
        )
        self.app = create_app(ApiContext(self.driver, self.store, self.preflight, home, "cpu-smollm2"))

    async def step(self, seconds: float = 1.0) -> None:
        await self.driver.step()
        await self.driver.settle()
        self.clock.t += seconds


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv(admin_token.HASH_ENV, raising=False)
    admin_token.write_hash(tmp_path, TOKEN)
    return tmp_path


@pytest.fixture
def rig(home: Path) -> Rig:
    return Rig(home)


@pytest.fixture
async def client(rig: Rig) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=rig.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8090") as c:
        yield c


AUTH = {"Authorization": f"Bearer {TOKEN}"}
MUTATIONS = [
    ("POST", "/apply", {"recipe": "cpu-smollm2"}),
    ("POST", "/restart", None),
    ("POST", "/stop", None),
    ("POST", "/recipes/cpu-smollm2/plan", None),
]


async def test_reads_are_open_and_openapi_is_served(client: httpx.AsyncClient) -> None:
    for path in ("/healthz", "/status", "/recipes", "/launches", "/openapi.json", "/metrics"):
        r = await client.get(path)
        assert r.status_code == 200, path
    names = {r["name"] for r in (await client.get("/recipes")).json()}
    assert "cpu-smollm2" in names and "gfx906-base" not in names  # abstract bases are not applicable
    spec = (await client.get("/openapi.json")).json()
    assert {"/apply", "/status", "/events", "/launches/{launch_id}"} <= set(spec["paths"])
    assert "appliance_engine_state" in (await client.get("/metrics")).text


async def test_healthz_says_when_the_supervision_loop_stopped_coming_round(
    rig: Rig, client: httpx.AsyncClient,
) -> None:
    # Liveness, not just "HTTP answers": compose's healthcheck and a pod's livenessProbe read this.
    stop = asyncio.Event()
    stop.set()  # one pass of `run`: it marks the loop alive and returns
    await rig.driver.run(stop)
    r = await client.get("/healthz")
    assert r.status_code == 200 and r.json() == {"ok": True, "state": "idle"}
    rig.clock.t += 59  # within the 60 s floor (30 polls of 1 s)
    assert (await client.get("/healthz")).status_code == 200
    rig.clock.t += 2
    r = await client.get("/healthz")
    assert r.status_code == 503 and r.json()["ok"] is False
    assert "supervision loop last came round 61 s ago" in r.json()["problem"]


@pytest.mark.parametrize("how", ["deleted", "replaced"])
async def test_healthz_fails_when_the_launch_store_is_deleted_or_replaced(
    rig: Rig, client: httpx.AsyncClient, home: Path, how: str,
) -> None:
    # Issue 23: the controller went on writing to an unlinked SQLite file (all history lost at the
    # next restart) and /healthz stayed 200.
    assert (await client.get("/healthz")).status_code == 200
    db = home / "appliance.sqlite3"
    db.unlink()
    if how == "replaced":
        Store(home / "other.sqlite3").close()
        (home / "other.sqlite3").rename(db)
    await rig.step()  # the supervision loop notices it
    r = await client.get("/healthz")
    assert r.status_code == 503 and r.json()["ok"] is False
    assert f"was {how}" in r.json()["problem"] and str(db) in r.json()["problem"]
    status = (await client.get("/status")).json()
    assert status["store_problem"] is not None and f"was {how}" in status["store_problem"]
    kinds = []
    async with rig.driver.subscribe() as queue:
        rig.driver.recorder.store_problem = None  # said again (once per distinct problem): seen on the stream
        rig.driver.check_store()
        kinds = [queue.get_nowait()["kind"] for _ in range(queue.qsize())]
    assert kinds == ["store-lost"]


async def test_healthz_checks_the_store_even_without_a_supervision_step(
    rig: Rig, client: httpx.AsyncClient, home: Path,
) -> None:
    (home / "appliance.sqlite3").unlink()
    r = await client.get("/healthz")
    assert r.status_code == 503 and "was deleted" in r.json()["problem"]


@pytest.mark.parametrize(("method", "path", "body"), MUTATIONS)
async def test_mutations_need_the_admin_token(client: httpx.AsyncClient, method: str, path: str,
                                              body: dict[str, str] | None) -> None:
    missing = await client.request(method, path, json=body)
    assert missing.status_code == 401
    assert missing.headers["www-authenticate"] == "Bearer"
    wrong = await client.request(method, path, json=body, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 403
    basic = await client.request(method, path, json=body, headers={"Authorization": "Basic dXNlcjpwdw=="})
    assert basic.status_code == 401
    right = await client.request(method, path, json=body, headers=AUTH)
    assert right.status_code not in (401, 403)  # past auth (a restart with nothing applied is 409)


async def test_the_hash_can_come_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(admin_token.HASH_ENV, admin_token.hash_token("env-token"))
    rig = Rig(tmp_path)  # no hash file here
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=rig.app), base_url="http://[::1]") as c:
        assert (await c.post("/stop", headers={"Authorization": "Bearer env-token"})).status_code == 202
        assert (await c.post("/stop", headers=AUTH)).status_code == 403


async def test_no_configured_token_refuses_every_mutation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(admin_token.HASH_ENV, raising=False)
    rig = Rig(tmp_path)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=rig.app), base_url="http://[::1]") as c:
        r = await c.post("/stop", headers=AUTH)
    assert r.status_code == 403 and "no admin token configured" in r.json()["detail"]


async def test_unknown_things_are_404(client: httpx.AsyncClient) -> None:
    assert (await client.post("/apply", json={"recipe": "no-such-recipe"}, headers=AUTH)).status_code == 404
    assert (await client.post("/apply", json={"recipe": "gfx906-base"}, headers=AUTH)).status_code == 404
    assert (await client.get("/recipes/no-such-recipe")).status_code == 404
    assert (await client.post("/recipes/no-such-recipe/plan", headers=AUTH)).status_code == 404
    assert (await client.get("/launches/nope")).status_code == 404


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "recipe"),
        ({"recipe": 12}, "recipe"),
        ({"recipe": "Not A Name!"}, "recipe"),
        ({"recipe": "cpu-smollm2", "fresh_cache": "maybe"}, "fresh_cache"),
        ({"recipe": "cpu-smollm2", "blue_green": "sometimes"}, "blue_green"),
        # strict: never coerced ("true" and 1 were once taken as true)
        ({"recipe": "cpu-smollm2", "force": "true"}, "force"),
        ({"recipe": "cpu-smollm2", "fresh_cache": 1}, "fresh_cache"),
        ({"recipe": "cpu-smollm2", "forcefully": True}, "forcefully"),  # unknown fields (`force` is one now)
    ],
)
async def test_bad_bodies_are_422_naming_the_field(client: httpx.AsyncClient, body: dict[str, object],
                                                   field: str) -> None:
    r = await client.post("/apply", json=body, headers=AUTH)
    assert r.status_code == 422
    assert any(err["loc"][-1] == field for err in r.json()["detail"]), r.json()


async def test_a_body_that_is_not_json_is_422(client: httpx.AsyncClient) -> None:
    headers = {**AUTH, "Content-Type": "application/json"}
    r = await client.post("/apply", content=b"{not json", headers=headers)
    assert r.status_code == 422


async def test_concurrent_applies_get_one_202_and_one_409(rig: Rig, client: httpx.AsyncClient) -> None:
    first, second = await asyncio.gather(
        client.post("/apply", json={"recipe": "cpu-smollm2"}, headers=AUTH),
        client.post("/apply", json={"recipe": "cpu-smollm2"}, headers=AUTH),
    )
    assert sorted([first.status_code, second.status_code]) == [202, 409]
    await rig.driver.settle()
    assert len(rig.runtime.started) == 1


async def test_apply_during_a_start_is_409_and_status_shows_progress(
    rig: Rig, client: httpx.AsyncClient
) -> None:
    r = await client.post("/apply", json={"recipe": "cpu-smollm2"}, headers=AUTH)
    assert r.status_code == 202 and r.json()["state"] == "preflight"
    await rig.step(1)
    assert rig.driver.machine.state is State.STARTING
    rig.runtime.current().log = "INFO Loading weights took 0.82 seconds\n"
    for _ in range(3):
        await rig.step(60)
    conflict = await client.post("/apply", json={"recipe": "cpu-smollm2"}, headers=AUTH)
    assert conflict.status_code == 409 and "in progress" in conflict.json()["detail"]
    assert (await client.post("/restart", headers=AUTH)).status_code == 409
    status = (await client.get("/status")).json()
    assert status["state"] == "starting" and status["recipe"] == "cpu-smollm2"
    # cpu-smollm2 has a 600 s ready budget; ~181 s have passed.
    assert 0.25 < status["progress"] < 0.35
    assert status["launch"]["phase"] == "weights_loaded"
    rig.runtime.current().healthy = True
    await rig.step(1)
    status = (await client.get("/status")).json()
    assert status["state"] == "ready" and status["progress"] is None
    launches = (await client.get("/launches")).json()
    assert len(launches) == 1 and launches[0]["status"] == "ready"
    record = (await client.get(f"/launches/{launches[0]['id']}")).json()
    assert [p["name"] for p in record["phases"]] == ["weights_loaded"]
    assert record["interpreter"].endswith("/engine/venv/bin/python")


async def test_restart_with_nothing_applied_is_409(client: httpx.AsyncClient) -> None:
    r = await client.post("/restart", headers=AUTH)
    assert r.status_code == 409 and "nothing to restart" in r.json()["detail"]


async def test_plan_and_show_render_on_this_host_without_starting_anything(rig: Rig,
                                                                           client: httpx.AsyncClient) -> None:
    plan = (await client.post("/recipes/cpu-smollm2/plan", headers=AUTH)).json()
    assert plan["launchable"] is True and plan["admission"]["verdict"] in ("admit", "warn")
    assert plan["rendered"]["recipe"] == "cpu-smollm2"
    assert plan["cache_root"].startswith(str(rig.preflight.appliance_home))
    assert plan["cache_warnings"] == []  # a fresh root under a writable home is fine
    shown = (await client.get("/recipes/cpu-smollm2")).json()
    assert shown["recipe"]["name"] == "cpu-smollm2"
    assert shown["rendered"]["env"]["VLLM_USE_AOT_COMPILE"] == "0"
    assert rig.runtime.started == []


async def test_events_stream_state_changes_over_real_http(rig: Rig) -> None:
    config = uvicorn.Config(rig.app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        for _ in range(500):
            if server.started:
                break
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        seen: list[tuple[str, dict[str, object]]] = []
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as c, \
                c.stream("GET", "/events") as resp:
            assert resp.headers["content-type"].startswith("text/event-stream")
            kind = ""
            async for line in resp.aiter_lines():
                if line.startswith("event: "):
                    kind = line[7:]
                elif line.startswith("data: "):
                    seen.append((kind, json.loads(line[6:])))
                    if kind == "status":
                        posted = await c.post("/apply", json={"recipe": "cpu-smollm2"}, headers=AUTH)
                        assert posted.status_code == 202
                        await rig.driver.settle()
                    if kind == "state" and seen[-1][1]["state"] == "starting":
                        break
        kinds = [k for k, _ in seen]
        assert kinds[0] == "status"
        assert [d["state"] for k, d in seen if k == "state"] == ["preflight", "starting"]
        assert any(k == "event" and d["kind"] == "apply" for k, d in seen)
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, timeout=10)


async def test_apply_says_which_path_the_switch_takes(rig: Rig, client: httpx.AsyncClient) -> None:
    r = await client.post("/apply", json={"recipe": "cpu-smollm2"}, headers=AUTH)
    assert r.status_code == 202
    switch = r.json()["switch"]
    assert switch["path"] == "start"  # nothing serves yet
    assert switch["why"].startswith("start cpu-smollm2: no engine serves now")
    await rig.driver.settle()


async def test_restart_preflights_beside_the_serving_engine_unless_asked_without_blue_green(
    rig: Rig, client: httpx.AsyncClient
) -> None:
    assert (await client.post("/apply", json={"recipe": "cpu-smollm2"}, headers=AUTH)).status_code == 202
    await rig.step(1)
    rig.runtime.current().healthy = True
    await rig.step(1)
    assert rig.driver.machine.state is State.READY
    bad = await client.post("/restart", json={"blue_green": "no"}, headers=AUTH)
    assert bad.status_code == 422 and rig.driver.machine.state is State.READY
    # No body: the restart preflights while the engine serves (blue/green when it fits; this
    # controller has no blue/green check, so the answer says the hold, and why).
    r = await client.post("/restart", headers=AUTH)
    assert r.status_code == 202 and r.json()["state"] == "preflight"
    switch = r.json()["switch"]
    assert switch["path"] == "hold" and "this controller has no blue/green check" in switch["why"]
    for _ in range(4):
        await rig.step(1)
        if rig.driver.machine.state is State.STARTING:
            break
    rig.runtime.current().healthy = True
    for _ in range(4):
        await rig.step(1)
    assert rig.driver.machine.state is State.READY
    # Asked without blue/green: drained at once, the path said as such.
    r = await client.post("/restart", json={"blue_green": False}, headers=AUTH)
    assert r.status_code == 202 and r.json()["state"] == "draining"
    assert "asked without it (--no-blue-green)" in r.json()["switch"]["why"]
