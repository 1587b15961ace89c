"""The console's log view, Stop / Restart, the Now page's one-truth state line and memory headroom,
the charts' round ticks, non-overlapping marker labels and told-apart OOM kills, and the Recipes
page's layout (collapsed checks, a greyed Apply on a refused recipe, findings counted by severity,
the diff at the top, wide tables scrolling inside their cards).

The rig is test_console.py's (the real controller app over test_api.py's fakes).
"""

from __future__ import annotations

import html
import math
import re
import time
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from appliance.recipe.launch_spec import LaunchSpec
from controller.console import charts
from controller.console.routes import console_router
from controller.console.views import ConsoleData, live_view, memory_line, oom_markers, state_line
from controller.runtime.base import EngineHandle, Provenance
from controller.supervisor.blue_green import Fit
from controller.supervisor.machine import State
from controller.watch.history import HostHistory, OomMark
from tests.unit import test_console as _console
from tests.unit.supervisor_helpers import FakeEngine, make_handle, make_spec
from tests.unit.test_api import TOKEN, Rig
from tests.unit.test_console import _ctx, _form_token, _sample, login

home, rig, client = _console.home, _console.rig, _console.client

GIB = 2**30
KEY = "sk-engine-key-never-shown"


def _launch_with_log(rig: Rig, launch_id: str, log: str) -> None:
    now = time.time()
    rig.store.create_launch(launch_id, make_spec("cpu-smollm2"), "normal", Provenance(), now - 10)
    handle = make_handle(launch_id, "cpu-smollm2", started_at=now - 10)
    rig.store.set_handle(launch_id, handle, now - 10)
    rig.runtime.engines[launch_id] = FakeEngine(handle, log=log, running=False)


# ---- the log view of a launch


async def test_the_log_page_shows_the_redacted_tail_and_follow_goes_on_from_its_offset(
    client: httpx.AsyncClient, rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = "".join(f"early line {i}\n" for i in range(10_000))  # ~150 KB: more than the tail shown
    _launch_with_log(rig, "L1", first + f"Traceback: engine died, api_key={KEY}\n")
    monkeypatch.setattr(rig.driver, "engine_key", lambda launch_id: KEY if launch_id == "L1" else None)
    await login(client)
    page = await client.get("/console/launches/L1/log")
    assert page.status_code == 200
    assert "Traceback: engine died" in page.text and KEY not in page.text
    assert "early line 0\n" not in page.text and "early line 9999" in page.text  # the end, not the start
    assert "the end of the log only" in page.text
    url = re.search(r'data-log-url="([^"]+)" data-offset="(\d+)"', page.text)
    assert url and url.group(1) == "/console/launches/L1/log.txt"
    offset = int(url.group(2))
    rig.runtime.engines["L1"].log += "a new line\n"
    more = await client.get(url.group(1), params={"offset": offset})
    assert more.status_code == 200 and more.text == "a new line\n"
    assert int(more.headers["x-next-offset"]) == offset + len("a new line\n")
    assert (await client.get("/console/launches/nope/log")).status_code == 404
    assert (await client.get("/console/launches/nope/log.txt")).status_code == 404
    # the launch page links its log
    assert 'href="/console/launches/L1/log"' in (await client.get("/console/launches/L1")).text
    # the API's own log endpoint reads the same path (and redacts the same key), for the admin only
    api = await client.get("/launches/L1/log", headers={"Authorization": f"Bearer {TOKEN}"})
    assert api.status_code == 200 and "Traceback" in api.text and KEY not in api.text


async def test_the_follow_endpoint_needs_a_session(client: httpx.AsyncClient, rig: Rig) -> None:
    _launch_with_log(rig, "L1", "hello\n")
    assert (await client.get("/console/launches/L1/log.txt")).status_code == 401
    r = await client.get("/console/launches/L1/log")
    assert r.status_code == 303 and "/console/login" in r.headers["location"]
    # The API's log endpoint needs the admin token: the engine log holds every client's request line
    # (vLLM's access log, query strings included). A console session is not a bearer token.
    access = 'INFO:     127.0.0.1:50412 - "GET /v1/models?api_key=client-secret HTTP/1.1" 200 OK\n'
    rig.runtime.engines["L1"].log += access
    for headers, refused in (({}, 401), ({"Authorization": "Bearer wrong"}, 403)):
        r = await client.get("/launches/L1/log", headers=headers)
        assert r.status_code == refused and "client-secret" not in r.text
    await login(client)
    r = await client.get("/launches/L1/log")
    assert r.status_code == 401 and "client-secret" not in r.text
    r = await client.get("/launches/L1/log", headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200 and r.text == "hello\n" + access


SCRAPE = 'INFO:     127.0.0.1:42144 - "GET /metrics HTTP/1.1" 200 OK\n'


async def test_the_log_page_hides_access_lines_by_default_and_offers_the_whole_log_for_download(
    client: httpx.AsyncClient, rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # issue 36 item 5: once Prometheus scrapes, the log is mostly access lines
    body = "(APIServer pid=1) INFO 12-01 10:00:00 [x] Starting vLLM server\n" + SCRAPE * 50 + "the end\n"
    _launch_with_log(rig, "L1", body + f"api_key={KEY}\n")
    monkeypatch.setattr(rig.driver, "engine_key", lambda launch_id: KEY if launch_id == "L1" else None)
    await login(client)
    page = (await client.get("/console/launches/L1/log")).text
    assert "Starting vLLM server" in page and "the end" in page and "GET /metrics" not in page
    assert 'id="access-hidden">(50 hidden)' in page
    assert 'href="/console/launches/L1/log?access=1"' in page
    # the follow script gets the server's own pattern, to hide access lines in what it appends
    pattern = re.search(r'data-access-pattern="([^"]+)"', page)
    assert pattern and re.match(html.unescape(pattern.group(1)), SCRAPE)
    shown = (await client.get("/console/launches/L1/log", params={"access": "1"})).text
    assert shown.count("GET /metrics") == 50 and "data-access-pattern" not in shown
    assert 'href="/console/launches/L1/log">Hide HTTP access lines' in shown
    # the download: every line, redacted, as a file
    assert 'href="/console/launches/L1/log/download"' in page
    got = await client.get("/console/launches/L1/log/download")
    assert got.status_code == 200
    assert got.text.startswith(body) and KEY not in got.text
    assert got.headers["content-disposition"] == 'attachment; filename="L1.log"'
    assert (await client.get("/console/launches/nope/log/download")).status_code == 404
    client.cookies.clear()
    assert (await client.get("/console/launches/L1/log/download")).status_code == 401


# ---- Stop / Restart with the same confirm + CSRF discipline as Apply


async def test_stop_and_restart_are_confirmed_and_need_the_csrf_token(
    client: httpx.AsyncClient, rig: Rig
) -> None:
    r = await client.post("/console/engine/stop", data={"csrf": "x"})
    assert r.status_code == 303 and "/console/login" in r.headers["location"]  # no session: nothing
    await login(client)
    confirm = await client.get("/console/engine/restart")
    assert confirm.status_code == 200 and 'id="confirm-restart"' in confirm.text
    csrf = _form_token(confirm.text, "csrf")
    # nothing applied yet: the machine refuses and the page says so
    refused = await client.post("/console/engine/restart", data={"csrf": csrf})
    assert refused.status_code == 409 and "nothing to restart" in refused.text
    applied = await client.post("/console/recipes/cpu-smollm2/apply", data={"csrf": csrf})
    assert applied.status_code == 303 and rig.driver.machine.state is State.PREFLIGHT
    assert (await client.post("/console/engine/stop", data={"csrf": "forged"})).status_code == 403
    assert rig.driver.machine.state is State.PREFLIGHT  # a forged form changed nothing
    stop_page = await client.get("/console/engine/stop")
    assert 'id="confirm-stop"' in stop_page.text and "Drain and stop" in stop_page.text
    stopped = await client.post("/console/engine/stop", data={"csrf": csrf})
    assert stopped.status_code == 303 and stopped.headers["location"] == "/console/?notice=stopping"
    assert rig.driver.machine.state is State.IDLE
    restarted = await client.post("/console/engine/restart", data={"csrf": csrf})
    assert restarted.status_code == 303 and restarted.headers["location"] == "/console/?notice=restarting"
    assert rig.driver.machine.state is State.PREFLIGHT and rig.driver.machine.recipe == "cpu-smollm2"
    now = (await client.get("/console/?notice=restarting")).text
    assert "Restart accepted" in now and 'href="/console/engine/stop"' in now
    assert (await client.get("/console/engine/explode")).status_code == 404


async def test_restart_and_stop_confirm_pages_say_the_consequence(
    client: httpx.AsyncClient, rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # issue 36 item 4: Restart shows its path, the hold bound and the ETA from history; Stop says
    # clients get 503 until the next apply, and how many requests are in flight now
    await login(client)
    csrf = _form_token((await client.get("/console/engine/restart")).text, "csrf")
    assert (await client.post("/console/recipes/cpu-smollm2/apply", data={"csrf": csrf})).status_code == 303
    await rig.step(1)
    rig.runtime.current().healthy = True
    for _ in range(3):
        await rig.step(20)
    assert rig.driver.machine.state is State.READY
    page = (await client.get("/console/engine/restart")).text
    path = re.search(r'id="switch-path"><strong>Path: (\w+)\.</strong>', page)
    assert path and path.group(1) == "hold"  # a restart drains first
    eta = re.search(r'id="restart-eta">Hold bound: each new request waits up to ([\d.]+) s\. '
                    r"Expected ready in ~([\d.]+) s \(from 1 earlier launch\)", page)
    assert eta, page
    launch = rig.driver.view.launch
    assert launch is not None
    plan = rig.driver.switch_plan("cpu-smollm2", launch.spec.spec_hash)
    assert float(eta.group(1)) == plan["wait_s"] and float(eta.group(2)) == plan["expected_ready_s"]

    stop = (await client.get("/console/engine/stop")).text
    assert "Clients get 503 + Retry-After from the gateway until the next Apply or Restart" in stop
    assert "Requests in flight now: unknown." in stop  # the test gateway does not count them

    async def counting(self: ConsoleData) -> dict[str, object]:
        return {"attached": True, "upstream": "http://e", "in_flight": 3, "note": None}

    monkeypatch.setattr(ConsoleData, "gateway", counting)
    stop = (await client.get("/console/engine/stop")).text
    assert "3 requests in flight now: they finish before the engine stops." in stop


# ---- the Now page: one truth for the state line, current MemAvailable and headroom


def _crashed(state: str, wait: float | None, cache: str | None = None) -> dict[str, object]:
    return {"state": state, "recipe": "r", "failures": 1, "max_failures": 5, "backoff_remaining_s": wait,
            "last_diagnosis": {"summary": "engine exited with code 1", "hint": "see its log"},
            "progress": None, "last_apply": None, "eta": None,
            "launch": {"id": "L2", "kind": "normal", "elapsed_s": None, "ready_budget_s": 600,
                       "ready_s": None, "describe": None, "cache": cache, "phases": []}}


def test_the_state_line_never_says_starting_and_not_starting_at_once() -> None:
    # a retry under way after a crash (the machine keeps the stale backoff deadline, 0 s away)
    line = state_line(_crashed("starting", 0.0, cache="hit"))
    assert "not starting" not in line["progress_text"] and line["progress_text"].startswith("starting")
    assert "next try" not in line["retry_text"] and "this start is a retry" in line["retry_text"]
    assert line["cache_text"] == "hit: a warm start"
    waiting = state_line(_crashed("backoff", 4.2))
    assert waiting["progress_text"] == "backing off after a failure: next try in 4 s"
    assert waiting["retry_text"] == "1 of 5 failures before giving up; next try in 4 s"
    assert "next try in" not in state_line(_crashed("backoff", -1.0))["retry_text"]
    assert state_line(_crashed("failed", None))["retry_text"] == "1 of 5 failures: gave up"
    assert state_line({"state": "idle"}) == {"progress_text": "idle: no engine running", "retry_text": "",
                                             "cache_text": "—"}


def test_memory_headroom_is_against_the_recipes_target() -> None:
    above = memory_line({"available": 20 * GIB, "total": 32 * GIB, "age_s": 1.0, "target": 16 * GIB})
    assert above == {"memory_text": "20.00 GiB of 32.00 GiB",
                     "headroom_text": "4.00 GiB above the recipe's target of ≥ 16.00 GiB"}
    below = memory_line({"available": 10 * GIB, "total": 32 * GIB, "age_s": 30.0, "target": 16 * GIB})
    assert below["headroom_text"] == "6.00 GiB BELOW the recipe's target of ≥ 16.00 GiB"
    assert "the last sample is 30 s old" in below["memory_text"]
    assert live_view({"state": "idle"}, {"available": 10 * GIB, "total": 32 * GIB, "age_s": 0,
                                         "target": 16 * GIB})["headroom_low"] is True
    assert memory_line(None)["memory_text"] == "no host sample yet"
    assert "states no MemAvailable target" in memory_line(
        {"available": GIB, "total": GIB, "age_s": 0, "target": None})["headroom_text"]


async def test_the_now_page_after_a_crash_derives_every_label_from_one_status(
    rig: Rig, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    snapshot = _crashed("starting", 0.0, cache="hit")
    monkeypatch.setattr(rig.driver, "status", lambda: snapshot)
    history = HostHistory(clock=time.time)
    history.record(_sample(12.0))
    monkeypatch.setattr(ConsoleData, "_target_bytes", lambda self, name: 8 * GIB)
    app = FastAPI()
    app.include_router(console_router(_ctx(rig, home), history=history))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as c:
        await login(c)
        page = (await c.get("/console/")).text
    assert "not starting" not in page and "next try in 0 s" not in page
    assert 'id="cache" data-live="cache">hit: a warm start<' in page
    assert 'id="mem-now" data-live="memory_text">12.00 GiB of 32.00 GiB<' in page
    assert "4.00 GiB above the recipe&#39;s target of ≥ 8.00 GiB" in page
    assert 'href="/console/launches/L2/log"' in page and 'href="/console/engine/restart"' in page


async def test_the_warm_restart_flow_is_not_read_as_this_starts_warmth(
    client: httpx.AsyncClient, rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    snapshot = {**_crashed("starting", None, cache="hit"), "recipe": "cpu-smollm2"}
    monkeypatch.setattr(rig.driver, "status", lambda: snapshot)
    await login(client)
    page = (await client.get("/console/")).text
    assert "<dt>Warm restart</dt><dd>no</dd>" not in page
    assert 'id="warm-restart-flow">off: no extra warm-up start' in page


# ---- charts: round ticks, labels that never overlap, another process's OOM kill drawn apart


def test_nice_ticks_are_one_two_or_five_times_a_power_of_ten() -> None:
    assert charts.nice_ticks(23.6) == [0, 5, 10, 15, 20, 25]  # not 5.9, 11.8, ...
    assert charts.nice_ticks(10.0) == [0, 2, 4, 6, 8, 10]  # not 2.5, 5, 7.5
    assert charts.nice_ticks(62.8) == [0, 10, 20, 30, 40, 50, 60, 70]
    assert charts.nice_ticks(0.33) == [0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35]
    assert charts.nice_ticks(0.0) == [0, 1.0]
    for top in (0.7, 3.3, 17.0, 999.0, 12_345.0):
        ticks = charts.nice_ticks(top)
        step = ticks[1]
        mantissa = step / 10 ** math.floor(math.log10(step))
        assert round(mantissa, 6) in (1, 2, 5) and ticks[-1] >= top and len(ticks) <= 8, top
    assert charts.tick_number(0.1 + 0.2) == "0.3" and charts.gib_tick(5 * GIB) == "5 GiB"


def _tick_labels(svg: str) -> list[str]:
    return re.findall(r'class="tick">([^<]+)</text>', svg)


def test_memory_and_psi_axes_read_round_values() -> None:
    points = [(float(t), 23.6 * GIB) for t in range(10)]
    svg = charts.line_chart([charts.Series("MemAvailable", points)], title="m", y_max=23.6 * GIB,
                            y_format=charts.gib_tick, y_unit=GIB)
    labels = _tick_labels(svg)
    assert {"0 GiB", "5 GiB", "25 GiB"} <= set(labels) and not any("5.9" in t or "11.8" in t for t in labels)
    psi = charts.line_chart([charts.Series("PSI", [(0.0, 1.0), (1.0, 3.0)])], title="p", y_max=10.0,
                            y_format=lambda v: f"{charts.tick_number(v)} %")
    assert [t for t in _tick_labels(psi) if t.endswith("%")] == ["0 %", "2 %", "4 %", "6 %", "8 %", "10 %"]


def test_labels_are_staggered_and_one_with_no_room_is_left_out() -> None:
    spans = [(0.0, 50.0), (10.0, 60.0), (20.0, 70.0), (30.0, 80.0), (100.0, 150.0)]
    assert charts.place_labels(spans) == [0, 1, 2, None, 0]
    assert charts.place_labels([(50.0, 90.0), (0.0, 40.0)]) == [0, 0]  # order given, not sorted
    # five markers within a few pixels: at most three labels, each in its own row
    markers = [charts.Marker(100.0 + i, f"start recipe-{i}") for i in range(5)]
    svg = charts.line_chart([charts.Series("a", [(0.0, 1.0), (1000.0, 1.0)])], title="t", markers=markers)
    rows = re.findall(r'<text x="[\d.]+" y="([\d.]+)" text-anchor="start" fill="#6b7280" class="label">', svg)
    assert len(rows) == 3 and len(set(rows)) == 3
    assert svg.count('class="marker"') == 5  # every line is still drawn, its label in its tooltip


def test_another_processs_oom_kill_is_grey_with_a_legend() -> None:
    ooms = [OomMark(10.0, "global", "VLLM::Worker", 7), OomMark(20.0, "global", "stress", 99)]
    engine, other = oom_markers(ooms, {7})
    assert (engine.color, engine.label) == (charts.OOM_ENGINE, "OOM kill VLLM::Worker")
    assert (other.color, other.label) == (charts.OOM_OTHER, "OOM kill stress (not the engine)")
    from controller.console.views import _memory_chart

    svg = _memory_chart([], "m", (0.0, 30.0), [engine, other], None)
    assert "engine OOM kill" in svg and "another process&#39;s OOM kill" in svg


# ---- the Recipes page


async def test_the_recipes_page_collapses_checks_greys_refused_apply_and_counts_by_severity(
    client: httpx.AsyncClient,
) -> None:
    await login(client)
    page = (await client.get("/console/recipes")).text
    refused = re.search(r'<tr id="recipe-cuda-generic">.*?</tr>', page, re.S)
    assert refused
    row = refused.group(0)
    assert 'class="button disabled" aria-disabled="true"' in row
    assert 'href="/console/recipes/cuda-generic/apply"' not in row
    assert "refused: gpus: 0 nvidia GPU(s)" in row
    assert '<details class="checks">' in row  # the check messages are collapsed
    admitted = re.search(r'<tr id="recipe-cpu-smollm2-eager">.*?</tr>', page, re.S)
    assert admitted
    assert 'href="/console/recipes/cpu-smollm2-eager/apply"' in admitted.group(0)
    assert "1 info" in admitted.group(0) and "warning" not in admitted.group(0)  # an info is not a warning
    detail = (await client.get("/console/recipes/cuda-generic")).text
    assert 'id="apply-disabled"' in detail and 'href="/console/recipes/cuda-generic/apply"' not in detail


async def test_the_recipe_diff_is_at_the_top(client: httpx.AsyncClient) -> None:
    await login(client)
    pair = {"a": "gfx906-b-tp4-eager", "b": "gfx906-c-tp4-graph-piecewise"}
    r = await client.get("/console/recipes", params=pair)
    assert r.status_code == 200
    assert r.text.index('id="diff-table"') < r.text.index('<table id="recipes">')


async def test_wide_tables_scroll_inside_their_cards(client: httpx.AsyncClient, rig: Rig) -> None:
    _launch_with_log(rig, "L1", "")
    await login(client)
    launches = (await client.get("/console/launches")).text
    assert '<div class="table-scroll"><table id="launches">' in launches
    css = (await client.get("/console/static/console.css")).text
    assert re.search(r"\.table-scroll \{[^}]*overflow-x: auto", css)
    bench_template = (Path(charts.__file__).parent / "templates" / "benchmarks.html").read_text()
    assert '<div class="table-scroll"><table id="benches">' in bench_template
    assert '<div class="table-scroll"><table id="comparisons">' in bench_template


async def test_the_recipe_diff_shows_both_cache_keys(client: httpx.AsyncClient) -> None:
    # Both keys were once blank on this page.
    await login(client)
    pair = {"a": "gfx906-b-tp4-eager", "b": "gfx906-c-tp4-graph-piecewise"}
    page = (await client.get("/console/recipes", params=pair)).text
    keys = re.search(r"cache keys ([0-9a-f]+) / ([0-9a-f]+)\)", page)
    assert keys, "the diff names no cache keys"
    assert len(keys.group(1)) >= 8 and len(keys.group(2)) >= 8 and keys.group(1) != keys.group(2)


async def test_the_restart_confirm_page_says_same_card_blue_green_with_the_numbers(home: Path) -> None:
    why = ("same-card blue/green: GPU 0 free now 96.20 GiB − need 42.63 GiB (0.3 × 140.40 GiB + 0.51 GiB "
           "CUDA context) = 53.57 GiB, ≥ the margin 4.00 GiB")

    def fits(name: str, cold: bool | None, serving: LaunchSpec, handle: EngineHandle) -> Fit:
        return Fit(True, why, {"gpu_placement": "same_card", "gpu0_free_gib": 96.2}, 8001)

    rig = Rig(home, beside=fits)
    transport = httpx.ASGITransport(app=rig.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
        await login(c)
        csrf = _form_token((await c.get("/console/engine/restart")).text, "csrf")
        assert (await c.post("/console/recipes/cpu-smollm2/apply", data={"csrf": csrf})).status_code == 303
        await rig.step(1)
        rig.runtime.current().healthy = True
        await rig.step(1)
        assert rig.driver.machine.state is State.READY
        page = html.unescape((await c.get("/console/engine/restart")).text)
    path = re.search(r'id="switch-path"><strong>Path: (\w+)\.</strong>', page)
    assert path and path.group(1) == "blue_green"
    assert why in page and "starts <strong>beside it</strong>" in page
    assert "a running engine is drained and stopped" not in page
