"""Several engines on one host (controller/supervisor/engine_set.py, alongside_admission.py): the API
starts an engine beside the running one, refuses one that would collide (name, port, RAM, cores) with
the engine in the way named, stops and restarts an engine by its model, lists every engine in
`GET /status` and in Prometheus' target file, and a restarted controller adopts them all."""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from controller import admin_token
from controller.api.app import create_app
from controller.api_context import ApiContext
from controller.gateway.control import ControlGateway
from controller.runtime.base import Provenance
from controller.service import ServiceConfig, build
from controller.supervisor.engine_set import EngineSet, Judged, slot_name
from controller.supervisor.gpu_memory_check import NothingReplaced
from controller.supervisor.machine import State
from controller.supervisor.preflight import Preflight
from controller.supervisor.signals import Stop
from tests.unit.engine_set_helpers import REPO, SetRig
from tests.unit.supervisor_helpers import FakeClock, FakeEngine, FakeRuntime, make_handle

TOKEN = "adm_test-token-not-secret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv(admin_token.HASH_ENV, raising=False)
    admin_token.write_hash(tmp_path, TOKEN)
    return tmp_path


@pytest.fixture
def rig(home: Path) -> SetRig:
    return SetRig(home)


@pytest.fixture
async def client(rig: SetRig) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=rig.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8090") as c:
        yield c


async def until(rig: SetRig, check: Any, polls: int = 20) -> None:
    for _ in range(polls):
        if check():
            return
        rig.healthy()
        await rig.step()
    assert check()


async def primary_ready(rig: SetRig, client: httpx.AsyncClient) -> None:
    assert (await client.post("/apply", json={"recipe": "cpu-smollm2"}, headers=AUTH)).status_code == 202
    await until(rig, lambda: rig.primary.view.state is State.READY)


async def beside_ready(rig: SetRig, client: httpx.AsyncClient, recipe: str = "cpu-beside",
                       model: str = "smollm2-b") -> dict[str, Any]:
    r = await client.post("/apply", json={"recipe": recipe, "alongside": True}, headers=AUTH)
    assert r.status_code == 202, r.text
    assert r.json()["model"] == model and r.json()["recipe"] == recipe
    await until(rig, lambda: model in rig.engines.alongside
                and rig.engines.alongside[model].view.state is State.READY)
    answer: dict[str, Any] = r.json()
    return answer


async def test_an_engine_applied_alongside_runs_beside_the_primary_with_its_own_gateway_slot(
    rig: SetRig, client: httpx.AsyncClient,
) -> None:
    await primary_ready(rig, client)
    accepted = await beside_ready(rig, client)
    primary, beside = rig.primary.view.launch, rig.engines.alongside["smollm2-b"].view.launch
    # Why it fits beside the primary, with the numbers: the answer says it.
    admitted = accepted["admitted"]
    assert admitted.startswith("host RAM: ")
    assert "CPU cores beside engine 'smollm2' (recipe cpu-smollm2)" in admitted
    assert primary is not None and beside is not None and primary.launch_id != beside.launch_id
    # The primary still serves its launch, told to the default slot once; the new engine has its own
    # slot (its link), pointed at its own port under its own model name.
    a = rig.gateways[None].upstream
    assert a is not None and a.url.endswith(":8000")
    assert rig.gateways[None].calls == [("point_to", primary.spec.base_url)]
    b = rig.gateways["smollm2-b"].upstream
    assert b is not None and b.url.endswith(":8001") and b.served_model == "smollm2-b"
    # Each launch has its own record; the second one is marked as started beside the primary.
    launches = (await client.get("/launches")).json()
    assert {row["recipe"] for row in launches} == {"cpu-smollm2", "cpu-beside"}
    record = (await client.get(f"/launches/{beside.launch_id}")).json()
    assert [e["data"] for e in record["events"] if e["kind"] == "alongside"] == [{"engine": "smollm2-b"}]
    status = (await client.get("/status")).json()
    assert status["state"] == "ready" and status["recipe"] == "cpu-smollm2"  # the shape it always had
    assert [(e["model"], e["recipe"], e["state"], e["port"], e["primary"]) for e in status["engines"]] == [
        ("smollm2", "cpu-smollm2", "ready", 8000, True), ("smollm2-b", "cpu-beside", "ready", 8001, False)]
    assert status["engines"][1]["launch_id"] == beside.launch_id
    assert status["engines"][1]["ready_s"] is not None and status["engines"][1]["diagnosis"] is None


@pytest.mark.parametrize(("recipe", "words"), [
    ("cpu-smollm2", ["recipe 'cpu-smollm2' is what engine 'smollm2'", "appliance restart --model smollm2"]),
    ("cpu-samename", ["model name 'smollm2' is served by engine 'smollm2' (recipe cpu-smollm2)",
                      "appliance stop --model smollm2"]),
    ("cpu-sameport", ["port 8000 is engine 'smollm2' (recipe cpu-smollm2)'s",
                      "appliance stop --model smollm2"]),
    ("cpu-busyport", ["port 8006 is in use on this host"]),
    ("cpu-bigmem", ["host RAM:", "engine 'smollm2' (recipe cpu-smollm2)", "appliance stop --model smollm2"]),
    ("cpu-samecores", ["CPU cores beside engine 'smollm2' (recipe cpu-smollm2)", "would share cores",
                       "appliance stop --model smollm2"]),
])
async def test_a_start_beside_that_would_collide_is_refused_naming_the_engine_in_the_way(
    rig: SetRig, client: httpx.AsyncClient, recipe: str, words: list[str],
) -> None:
    await primary_ready(rig, client)
    started = len(rig.runtime.started)
    r = await client.post("/apply", json={"recipe": recipe, "alongside": True}, headers=AUTH)
    assert r.status_code == 409, r.text
    for word in words:
        assert word in r.json()["detail"]
    assert rig.engines.alongside == {} and len(rig.runtime.started) == started
    assert rig.primary.view.state is State.READY


async def test_a_start_beside_an_engine_still_starting_is_refused_until_it_is_ready(
    rig: SetRig, client: httpx.AsyncClient,
) -> None:
    assert (await client.post("/apply", json={"recipe": "cpu-smollm2"}, headers=AUTH)).status_code == 202
    await rig.step()
    assert rig.primary.view.state is State.STARTING
    r = await client.post("/apply", json={"recipe": "cpu-beside", "alongside": True}, headers=AUTH)
    assert r.status_code == 409 and "engine 'smollm2' (recipe cpu-smollm2) is starting" in r.json()["detail"]
    await until(rig, lambda: rig.primary.view.state is State.READY)
    r = await client.post("/apply", json={"recipe": "cpu-beside", "alongside": True}, headers=AUTH)
    assert r.status_code == 202


async def test_two_starts_beside_at_once_are_judged_one_after_the_other(
    rig: SetRig, client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Both bind core 3: whichever is judged second must see the first in the set and be refused. The
    judge runs in a worker thread: each judge here waits (up to 2 s) for the other to begin, so without
    the lock both are judged against a set that holds neither and both start."""
    await primary_ready(rig, client)
    judge = rig.engines.judge
    begun: list[threading.Event] = [threading.Event(), threading.Event()]

    def slow_judge(recipe: str) -> Judged:
        mine = 0 if recipe == "cpu-beside" else 1
        begun[mine].set()
        begun[1 - mine].wait(timeout=2.0)
        return judge(recipe)

    monkeypatch.setattr(rig.engines, "judge", slow_judge)
    first, second = await asyncio.gather(
        client.post("/apply", json={"recipe": "cpu-beside", "alongside": True}, headers=AUTH),
        client.post("/apply", json={"recipe": "cpu-beside-c", "alongside": True}, headers=AUTH),
    )
    assert sorted([first.status_code, second.status_code]) == [202, 409], (first.text, second.text)
    assert len(rig.engines.alongside) == 1


async def test_a_compare_or_a_choice_is_refused_while_engines_run_beside_the_primary(
    rig: SetRig, client: httpx.AsyncClient,
) -> None:
    """They switch the primary through recipes whose names and ports nobody checked against the engines
    beside it, and would measure beside their load: refused, naming them and how to stop them."""
    await primary_ready(rig, client)
    await beside_ready(rig, client)
    started = len(rig.runtime.started)
    for path, body in (("/compare", {"baseline": "cpu-smollm2", "candidate": "cpu-beside-c"}),
                       ("/choices", {"recipes": "cpu-*"})):
        r = await client.post(path, json=body, headers=AUTH)
        assert r.status_code == 409, (path, r.text)
        assert "engines run beside it (smollm2-b)" in r.json()["detail"]
        assert "appliance stop --model smollm2-b" in r.json()["detail"]
    assert len(rig.runtime.started) == started and rig.primary.view.state is State.READY


async def test_the_second_start_beside_counts_both_running_engines(
    rig: SetRig, client: httpx.AsyncClient,
) -> None:
    await primary_ready(rig, client)
    await beside_ready(rig, client)
    # cpu-beside-c binds core 3 as cpu-beside does: it is cpu-beside's engine that is in the way.
    r = await client.post("/apply", json={"recipe": "cpu-beside-c", "alongside": True}, headers=AUTH)
    assert r.status_code == 409
    assert "CPU cores beside engine 'smollm2-b' (recipe cpu-beside)" in r.json()["detail"]
    assert "appliance stop --model smollm2-b" in r.json()["detail"]


async def test_stop_by_model_stops_that_engine_alone_and_removes_it_from_the_set(
    rig: SetRig, client: httpx.AsyncClient,
) -> None:
    await primary_ready(rig, client)
    await beside_ready(rig, client)
    beside = rig.engines.alongside["smollm2-b"]
    launch = beside.view.launch
    assert launch is not None
    r = await client.post("/stop", json={"model": "smollm2-b"}, headers=AUTH)
    assert r.status_code == 202 and r.json()["model"] == "smollm2-b"
    await until(rig, lambda: "smollm2-b" not in rig.engines.alongside)
    assert rig.runtime.stopped == [launch.launch_id]
    assert rig.removed == ["smollm2-b"]  # its gateway slot goes: its model answers 404 from now on
    assert rig.primary.view.state is State.READY and rig.gateways[None].upstream is not None
    assert [e["model"] for e in (await client.get("/status")).json()["engines"]] == ["smollm2"]
    record = (await client.get(f"/launches/{launch.launch_id}")).json()
    assert record["status"] == "stopped"
    # Its name is free again: the same recipe starts beside the primary once more.
    await beside_ready(rig, client)


async def test_stop_and_restart_of_an_unknown_model_are_404_naming_the_known_ones(
    rig: SetRig, client: httpx.AsyncClient,
) -> None:
    await primary_ready(rig, client)
    await beside_ready(rig, client)
    for path in ("/stop", "/restart"):
        r = await client.post(path, json={"model": "gpt-4o"}, headers=AUTH)
        assert r.status_code == 404
        assert r.json()["detail"] == "no engine serves model 'gpt-4o'; serving: smollm2, smollm2-b"
    assert rig.primary.view.state is State.READY
    assert rig.engines.alongside["smollm2-b"].view.state is State.READY


async def test_stop_by_the_primary_model_and_without_a_model_stop_the_primary_only(
    rig: SetRig, client: httpx.AsyncClient,
) -> None:
    await primary_ready(rig, client)
    await beside_ready(rig, client)
    assert (await client.post("/stop", json={"model": "smollm2"}, headers=AUTH)).status_code == 202
    await until(rig, lambda: rig.primary.view.state is State.IDLE)
    assert rig.engines.alongside["smollm2-b"].view.state is State.READY
    assert (await client.post("/stop", headers=AUTH)).status_code == 202  # the primary, as always


async def test_restart_by_model_restarts_that_engine_and_leaves_the_primary_serving(
    rig: SetRig, client: httpx.AsyncClient,
) -> None:
    await primary_ready(rig, client)
    await beside_ready(rig, client)
    beside = rig.engines.alongside["smollm2-b"]
    first = beside.view.launch
    primary = rig.primary.view.launch
    assert first is not None and primary is not None
    r = await client.post("/restart", json={"model": "smollm2-b"}, headers=AUTH)
    assert r.status_code == 202 and r.json()["model"] == "smollm2-b"
    await until(rig, lambda: beside.view.state is State.READY and beside.view.launch is not None
                and beside.view.launch.launch_id != first.launch_id)
    assert first.launch_id in rig.runtime.stopped and primary.launch_id not in rig.runtime.stopped
    assert rig.primary.view.launch == primary and rig.primary.view.state is State.READY


async def test_prometheus_targets_list_every_engine_written_from_the_set(
    rig: SetRig, client: httpx.AsyncClient,
) -> None:
    path = rig.home / "prometheus" / "engines.json"
    await primary_ready(rig, client)
    await beside_ready(rig, client)
    a, b = rig.primary.view.launch, rig.engines.alongside["smollm2-b"].view.launch
    assert a is not None and b is not None
    assert json.loads(path.read_text()) == [
        {"targets": ["127.0.0.1:8000"], "labels": {"recipe": "cpu-smollm2", "launch": a.launch_id,
                                                   "model": "smollm2"}},
        {"targets": ["127.0.0.1:8001"], "labels": {"recipe": "cpu-beside", "launch": b.launch_id,
                                                   "model": "smollm2-b"}},
    ]
    # A transition of the primary's rewrites the file with the other engine still in it.
    assert (await client.post("/stop", headers=AUTH)).status_code == 202
    await until(rig, lambda: rig.primary.view.state is State.IDLE)
    assert [g["labels"]["model"] for g in json.loads(path.read_text())] == ["smollm2-b"]
    assert (await client.post("/stop", json={"model": "smollm2-b"}, headers=AUTH)).status_code == 202
    await until(rig, lambda: not rig.engines.alongside)
    assert json.loads(path.read_text()) == []


async def test_a_restarted_controller_adopts_every_engine_each_by_its_own_driver(
    rig: SetRig, client: httpx.AsyncClient, home: Path,
) -> None:
    await primary_ready(rig, client)
    await beside_ready(rig, client)
    a, b = rig.primary.view.launch, rig.engines.alongside["smollm2-b"].view.launch
    assert a is not None and b is not None
    # The next controller: the same store and engines, new drivers. The engine beside the primary is
    # the newest: without its mark the primary would take it and stop the older one (adoption.py).
    rig.store.close()
    runtime = FakeRuntime(rig.clock, engines=rig.runtime.engines, keys=rig.runtime.keys)
    after = SetRig(home, clock=rig.clock, runtime=runtime)
    await after.engines.adopt()
    assert runtime.stopped == []
    adopted_a, beside = after.primary.view.launch, after.engines.alongside["smollm2-b"]
    assert adopted_a is not None and adopted_a.launch_id == a.launch_id
    assert beside.view.launch is not None and beside.view.launch.launch_id == b.launch_id
    await until(after, lambda: after.primary.view.state is State.READY and beside.view.state is State.READY)
    assert after.gateways["smollm2-b"].upstream is not None
    assert after.gateways["smollm2-b"].upstream.url.endswith(":8001")
    assert [e["model"] for e in after.engines.entries()] == ["smollm2", "smollm2-b"]


async def test_a_controller_of_one_engine_refuses_a_start_beside_it(home: Path) -> None:
    rig = SetRig(home)
    app = create_app(ApiContext(rig.primary, rig.store, rig.preflight, home, "cpu-smollm2"))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8090") as c:
        r = await c.post("/apply", json={"recipe": "cpu-beside", "alongside": True}, headers=AUTH)
        assert r.status_code == 409 and "runs one engine" in r.json()["detail"]
        status = (await c.get("/status")).json()
        assert status["engines"] == []


def test_service_build_gives_each_engine_beside_the_primary_its_own_slot_metrics_and_gpu_view(
    tmp_path: Path,
) -> None:
    admin_token.write_gateway_token(tmp_path / "run")
    cfg = ServiceConfig(home=tmp_path, recipes_dir=REPO / "recipes", docker=False,
                        gateway_url="http://127.0.0.1:9")
    svc = build(cfg, runtimes={"process": FakeRuntime(FakeClock())})
    assert svc.engines.primary is svc.driver and svc.engines.supports_alongside
    primary_link = svc.driver.gateway
    assert isinstance(primary_link, ControlGateway) and primary_link.engine is None
    beside = svc.engines.add("smollm2-b")
    link = beside.gateway
    assert isinstance(link, ControlGateway) and link.engine == "smollm2-b"
    assert beside.engine_name == "smollm2-b"
    # The host's seams are the primary's; the metrics registry is its own (GET /metrics merges it in),
    # the target file is the one file of the host, and its preflight never counts a running engine's
    # share of a card as free (nothing is stopped before it starts).
    assert beside.store is svc.store and beside.host.runtimes == svc.driver.host.runtimes
    assert beside.host.events is svc.driver.host.events and beside.prober is svc.prober
    assert beside.metrics is not svc.metrics
    assert beside.scrape_targets is svc.driver.scrape_targets
    assert isinstance(beside.preflight, Preflight)
    assert isinstance(beside.preflight.gpu_memory, NothingReplaced)
    assert beside.host.beside is None  # its restart drains and starts: no blue/green beside itself
    # The host watch attributes OOM kills and marks launch records for it too; `engine` stays the primary.
    assert [view.note for view in svc.watch.beside()] == [beside.note]
    assert svc.watch.engine is not None and svc.watch.engine.note == svc.driver.note


async def test_the_set_runs_each_engine_loop_and_stops_them_with_the_controller(
    rig: SetRig, client: httpx.AsyncClient,
) -> None:
    await primary_ready(rig, client)
    stop = asyncio.Event()
    runner = asyncio.create_task(rig.engines.run(stop))
    await asyncio.sleep(0)
    beside = rig.engines.add("smollm2-b")  # added while the set runs: its loop starts at once
    await asyncio.sleep(0)
    assert beside.loop_alive_at is not None and rig.primary.loop_alive_at is not None
    beside.submit(Stop())  # idle with nothing launched: removed by the set's next look (a poll: 1 s)
    for _ in range(500):
        if not rig.engines.alongside:
            break
        await asyncio.sleep(0.01)
    assert rig.engines.alongside == {} and rig.removed == ["smollm2-b"]
    stop.set()
    await asyncio.wait_for(runner, timeout=5)


@pytest.mark.parametrize(("recipe", "words"), [
    ("cpu-b-twin", "model name 'smollm2-b' is served by engine 'smollm2-b' (recipe cpu-beside), beside the "
                   "primary engine; stop it first: `appliance stop --model smollm2-b`"),
    ("cpu-b-port", "port 8001 is engine 'smollm2-b' (recipe cpu-beside)'s, beside the primary engine"),
])
async def test_the_primary_may_not_switch_to_a_name_or_port_an_engine_beside_it_holds(
    rig: SetRig, client: httpx.AsyncClient, recipe: str, words: str,
) -> None:
    await primary_ready(rig, client)
    await beside_ready(rig, client)
    r = await client.post("/apply", json={"recipe": recipe}, headers=AUTH)
    assert r.status_code == 409 and words in r.json()["detail"]
    assert rig.primary.view.state is State.READY and rig.primary.view.recipe == "cpu-smollm2"


async def test_the_primary_switches_by_the_hold_path_while_engines_run_beside_it(
    rig: SetRig, client: httpx.AsyncClient,
) -> None:
    await primary_ready(rig, client)
    assert (await client.post("/restart", headers=AUTH)).status_code == 202
    # Alone: a preflight while it serves, then blue/green when it fits, as always.
    assert rig.primary.view.state is State.PREFLIGHT and rig.primary.machine.blue_green is True
    await until(rig, lambda: rig.primary.view.state is State.READY)
    await beside_ready(rig, client)
    assert (await client.post("/restart", headers=AUTH)).status_code == 202
    # Beside another engine: drain first (the hold path); its fit would not count the other engine.
    assert rig.primary.view.state is State.DRAINING


def test_a_model_name_the_gateway_would_not_take_as_an_engine_name_gets_a_slot_it_takes() -> None:
    assert slot_name("smollm2-b") == "smollm2-b"
    odd = slot_name("Qwen/Qwen3-8B")
    assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", odd) and odd.startswith("Qwen-Qwen3-8B-")
    assert slot_name("Qwen/Qwen3-8B") != slot_name("Qwen:Qwen3-8B")  # never one slot for two names
    assert len(slot_name("x/" + "y" * 200)) <= 64


async def test_a_start_beside_a_primary_that_runs_nothing_is_refused(
    rig: SetRig, client: httpx.AsyncClient,
) -> None:
    r = await client.post("/apply", json={"recipe": "cpu-beside", "alongside": True}, headers=AUTH)
    assert r.status_code == 409
    assert r.json()["detail"] == ("the primary engine runs nothing (state idle): apply cpu-beside without "
                                  "--alongside, as the primary engine")
    assert rig.engines.alongside == {}


async def test_of_two_running_engines_beside_the_primary_under_one_name_the_newer_is_adopted(
    rig: SetRig, client: httpx.AsyncClient, home: Path,
) -> None:
    await primary_ready(rig, client)
    await beside_ready(rig, client)
    b = rig.engines.alongside["smollm2-b"].view.launch
    assert b is not None and b.handle is not None
    # A leftover of an earlier controller: an older engine marked as started beside the primary, under
    # the same model name (the gateway routes a name to one engine, so one of them has to go).
    older = make_handle("Lolder", recipe="cpu-beside", started_at=b.handle.started_at - 100)
    older = older.model_copy(update={"instance": "i-test"})
    rig.store.create_launch("Lolder", b.spec, "normal", Provenance(), older.started_at)
    rig.store.set_handle("Lolder", older, older.started_at)
    rig.store.add_event("alongside", "started beside the other engines", older.started_at, "Lolder")
    rig.runtime.engines["Lolder"] = FakeEngine(older)
    rig.store.close()
    after = SetRig(home, clock=rig.clock, runtime=rig.runtime)
    await after.engines.adopt()
    beside = after.engines.alongside["smollm2-b"]
    assert beside.view.launch is not None and beside.view.launch.launch_id == b.launch_id
    assert rig.runtime.stopped == ["Lolder"]
    record = after.store.get_launch("Lolder")
    assert record is not None and record.status == "stopped"
    assert any(e.kind == "adopt-extra" for e in record.events)


def _stub(state: State, platform: str | None) -> Any:
    """A driver as primary_blue_green reads it: its view's state and launch spec platform."""
    launch = None if platform is None else SimpleNamespace(spec=SimpleNamespace(platform=platform))
    return SimpleNamespace(view=SimpleNamespace(state=state, launch=launch))


@pytest.mark.parametrize(("beside", "expected"), [
    ([], True),
    ([(State.READY, "cuda")], True),  # the card's free memory and MemAvailable count it
    ([(State.READY, "cuda"), (State.READY, "rocm")], True),
    ([(State.READY, "cpu")], False),  # cores: the CPU fit compares with the primary's own engine only
    ([(State.READY, "cuda"), (State.READY, "cpu")], False),
    ([(State.STARTING, "cuda")], False),  # its peak and port are not known yet
    ([(State.PREFLIGHT, None)], False),
])
def test_the_primary_may_go_blue_green_beside_ready_gpu_engines_only(
    beside: list[tuple[State, str | None]], expected: bool,
) -> None:
    engines = EngineSet(_stub(State.READY, "cuda"))
    engines.alongside = {f"m{i}": _stub(state, platform) for i, (state, platform) in enumerate(beside)}
    assert engines.primary_blue_green() is expected
    assert engines.primary_blue_green(asked=False) is False


async def test_healthz_names_an_engine_beside_the_primary_whose_supervision_stopped(
    rig: SetRig, client: httpx.AsyncClient,
) -> None:
    """Liveness covers every engine's loop: one beside the primary that stops coming round is a 503
    naming it, as the primary's own is."""
    await primary_ready(rig, client)
    await beside_ready(rig, client)
    beside = rig.engines.alongside["smollm2-b"]
    rig.primary.loop_alive_at = beside.loop_alive_at = rig.clock.now()
    assert (await client.get("/healthz")).status_code == 200
    rig.clock.t += 600
    rig.primary.loop_alive_at = rig.clock.now()  # the primary's loop still comes round
    r = await client.get("/healthz")
    assert r.status_code == 503
    problem = r.json()["problem"]
    assert problem.startswith("engine 'smollm2-b': the supervision loop last came round 600 s ago")
