"""The operator console without a browser: log-in, session expiry, CSRF, CSP, keys, apply, charts.

The app is the real controller app (controller/api/app.py's create_app, which includes the console)
over the rig of test_api.py: a real preflight over the shipped recipes and the reference host's
fixture tree, a driver with the declared fakes for runtime/prober/gateway. Sessions get a fake
clock where expiry is tested.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from appliance.observe.kmsg import OomEvent, OomEventKind, OomScope
from appliance.observe.procfs import MemInfo
from controller import admin_token
from controller.console import charts
from controller.console.auth import COOKIE, LoginThrottle, Sessions
from controller.console.routes import console_router
from controller.console.routes.pages import CSP
from controller.console.views import _phase_bars, safe_next
from controller.gateway.keystore import KeyStore
from controller.settings import Paths
from controller.store import LaunchRecord, PhaseRecord
from controller.supervisor.machine import State
from controller.watch.history import HostHistory
from controller.watch.sampler import HostSample
from tests.unit.test_api import TOKEN, Rig

PAGES = ["/console/", "/console/recipes", "/console/recipes/cpu-smollm2",
         "/console/recipes/cpu-smollm2/apply", "/console/launches", "/console/memory", "/console/keys",
         "/console/benchmarks"]


class Clock:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv(admin_token.HASH_ENV, raising=False)
    monkeypatch.setenv("APPLIANCE_HOME", str(tmp_path))
    admin_token.write_hash(tmp_path, TOKEN)
    return tmp_path


@pytest.fixture
def rig(home: Path) -> Rig:
    return Rig(home)


@pytest.fixture
async def client(rig: Rig) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=rig.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
        yield c


def _form_token(html: str, name: str) -> str:
    found = re.search(rf'name="{name}" value="([^"]+)"', html)
    assert found, f"no {name} in the page"
    return found.group(1)


async def login(c: httpx.AsyncClient, token: str = TOKEN) -> httpx.Response:
    page = await c.get("/console/login")
    form = {"token": token, "form_token": _form_token(page.text, "form_token"), "next": "/console/keys"}
    return await c.post("/console/login", data=form)


async def csrf_of(c: httpx.AsyncClient) -> str:
    return _form_token((await c.get("/console/keys")).text, "csrf")


async def test_every_page_needs_a_login(client: httpx.AsyncClient) -> None:
    for path in PAGES:
        r = await client.get(path)
        assert r.status_code == 303, path
        assert r.headers["location"].startswith("/console/login?next=" + path.rstrip("/").split("?")[0][:9])
    assert (await client.get("/console/events")).status_code == 401
    # a state-changing form without a session changes nothing either
    r = await client.post("/console/keys", data={"name": "x", "csrf": "x"})
    assert r.status_code == 303 and "/console/login" in r.headers["location"]


async def test_wrong_token_is_refused_with_a_message_and_no_cookie(client: httpx.AsyncClient) -> None:
    r = await login(client, "adm_wrong")
    assert r.status_code == 401
    assert "wrong admin token" in r.text
    assert COOKIE not in r.headers.get("set-cookie", "")
    assert (await client.get("/console/")).status_code == 303


async def test_login_sets_a_strict_httponly_expiring_cookie(client: httpx.AsyncClient) -> None:
    r = await login(client)
    assert r.status_code == 303 and r.headers["location"] == "/console/keys"
    cookie = r.headers["set-cookie"].lower()
    for attribute in ("httponly", "samesite=strict", "max-age=28800", "path=/console"):
        assert attribute in cookie, attribute
    assert TOKEN.lower() not in cookie


async def test_pages_render_with_a_strict_csp_and_never_show_the_token(client: httpx.AsyncClient) -> None:
    await login(client)
    for path in PAGES:
        r = await client.get(path)
        assert r.status_code == 200, (path, r.text[:500])
        assert r.headers["content-security-policy"] == CSP
        assert "'unsafe-inline'" not in CSP and "script-src 'self'" in CSP
        assert r.headers["x-frame-options"] == "DENY" and r.headers["cache-control"] == "no-store"
        assert TOKEN not in r.text
        # nothing the CSP would block: no inline script body, no inline style attribute or element
        assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", r.text), path
        assert " style=" not in r.text and "<style" not in r.text, path
    recipes = (await client.get("/console/recipes")).text
    assert "gfx906-b-tp4-eager" in recipes and "verdict-" in recipes  # admission shown per recipe
    js = await client.get("/console/static/console.js")
    assert js.status_code == 200 and js.headers["content-type"].startswith("text/javascript")
    # a source file that exists beside static/ (routes.py was one until the routes became a package)
    assert (await client.get("/console/static/../auth.py")).status_code == 404


async def test_recipe_diff_and_unknown_recipe(client: httpx.AsyncClient) -> None:
    await login(client)
    pair = {"a": "gfx906-b-tp4-eager", "b": "gfx906-c-tp4-graph-piecewise"}
    r = await client.get("/console/recipes", params=pair)
    assert r.status_code == 200 and "engine.mode" in r.text and "Compile inputs" in r.text
    assert (await client.get("/console/recipes", params={"a": "nope", "b": "cpu-smollm2"})).status_code == 404
    assert (await client.get("/console/recipes/nope/apply")).status_code == 404


async def test_forged_or_missing_csrf_changes_nothing(client: httpx.AsyncClient, home: Path) -> None:
    await login(client)
    for token in ("forged", ""):
        r = await client.post("/console/keys", data={"name": "svc", "csrf": token})
        assert r.status_code == 403
        assert "nothing was changed" in r.text
    assert KeyStore(Paths(home).keys_db).list() == []
    r = await client.post("/console/recipes/cpu-smollm2/apply", data={"csrf": "forged"})
    assert r.status_code == 403


async def test_a_key_is_shown_once_and_can_be_revoked(client: httpx.AsyncClient, home: Path) -> None:
    await login(client)
    form = {"name": "svc", "rpm_limit": "60", "csrf": await csrf_of(client)}
    r = await client.post("/console/keys", data=form)
    assert r.status_code == 201
    key = re.search(r'id="new-key">([^<]+)<', r.text)
    assert key, r.text
    store = KeyStore(Paths(home).keys_db)
    (record,) = store.list()
    assert record.name == "svc" and record.rpm_limit == 60
    listing = await client.get("/console/keys")
    assert key.group(1) not in listing.text and "new-key" not in listing.text
    r = await client.post(f"/console/keys/{record.id}/revoke", data={"csrf": await csrf_of(client)})
    assert r.status_code == 303 and r.headers["location"] == "/console/keys?notice=revoked"
    assert store.list()[0].revoked is not None
    form = {"name": "x", "rpm_limit": "zero", "csrf": await csrf_of(client)}
    bad = await client.post("/console/keys", data=form)
    assert bad.status_code == 422 and "whole number" in bad.text and len(store.list()) == 1


async def test_apply_confirms_then_a_second_apply_is_refused_and_changes_nothing(
    client: httpx.AsyncClient, rig: Rig
) -> None:
    await login(client)
    confirm = await client.get("/console/recipes/cpu-smollm2/apply")
    assert "confirm-apply" in confirm.text and "Nothing is running" in confirm.text
    csrf = _form_token(confirm.text, "csrf")
    assert rig.driver.machine.state is State.IDLE
    r = await client.post("/console/recipes/cpu-smollm2/apply", data={"csrf": csrf})
    assert r.status_code == 303 and r.headers["location"] == "/console/?notice=applied"
    assert rig.driver.machine.state is State.PREFLIGHT and rig.driver.machine.recipe == "cpu-smollm2"
    token = rig.driver.machine.token
    again = await client.post("/console/recipes/cuda-generic/apply", data={"csrf": csrf})
    assert again.status_code == 409
    assert "start is in progress" in again.text and "Nothing was changed" in again.text
    machine = rig.driver.machine
    assert machine.recipe == "cpu-smollm2" and machine.token == token  # the first apply goes on
    now = await client.get("/console/?notice=applied")
    assert "Apply accepted" in now.text and 'id="progress"' in now.text


async def test_an_expired_session_sends_back_to_login_with_the_reason(rig: Rig, home: Path) -> None:
    clock = Clock()
    app = FastAPI()
    app.include_router(console_router(_ctx(rig, home),
                                      sessions=Sessions(home, ttl_s=60, clock=clock)))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as c:
        assert (await login(c)).status_code == 303
        assert (await c.get("/console/keys")).status_code == 200
        clock.t += 61
        r = await c.get("/console/keys")
        assert r.status_code == 303 and "expired" in r.headers["location"]
        page = await c.get(r.headers["location"])
        assert "your session expired" in page.text
        # a form posted with the stale session changes nothing
        r = await c.post("/console/keys", data={"name": "late", "csrf": "whatever"})
        assert r.status_code == 303
    assert KeyStore(Paths(home).keys_db).list() == []


async def test_rotating_the_admin_token_ends_sessions(client: httpx.AsyncClient, home: Path) -> None:
    await login(client)
    admin_token.write_hash(home, "adm_new")
    r = await client.get("/console/")
    assert r.status_code == 303 and "token%20changed" in r.headers["location"]


async def test_the_login_form_token_must_be_ours(client: httpx.AsyncClient) -> None:
    r = await client.post("/console/login", data={"token": TOKEN, "form_token": "forged"})
    assert r.status_code == 403 and "expired" in r.text
    assert COOKIE not in r.headers.get("set-cookie", "")


async def test_logout_ends_the_session(client: httpx.AsyncClient) -> None:
    await login(client)
    csrf = await csrf_of(client)
    stolen = client.cookies.get(COOKIE)
    r = await client.post("/console/logout", data={"csrf": csrf})
    assert r.status_code == 303
    client.cookies.set(COOKIE, stolen or "", path="/console")
    assert (await client.get("/console/")).status_code == 303  # the old cookie is dead server-side


def test_next_is_only_a_console_path() -> None:
    assert safe_next("/console/keys") == "/console/keys"
    for evil in ("https://evil.example/console/", "//evil.example/console/", "/other", "/console//x"):
        assert safe_next(evil) == "/console/"


def _sample(avail_gib: float) -> HostSample:
    gib = 2**30
    meminfo = MemInfo(mem_total_bytes=32 * gib, mem_free_bytes=0, mem_available_bytes=int(avail_gib * gib),
                      swap_total_bytes=4 * gib, swap_free_bytes=3 * gib)
    return HostSample(at=0.0, meminfo=meminfo, swaps=(), pressure=None, swappiness=60)


def test_host_history_is_bounded_and_marks_only_kills() -> None:
    clock = Clock()
    history = HostHistory(maxlen=3, clock=clock)
    for i in range(5):
        clock.t += 1
        history.record(_sample(10 + i))
    points = history.points()
    assert len(points) == 3 and [p.mem_available_bytes // 2**30 for p in points] == [12, 13, 14]
    assert points[0].swap_used_bytes == 2**30
    assert history.points(since=clock.t) == [points[-1]]
    history.record_oom(OomEvent(kind=OomEventKind.KILL, scope=OomScope.GLOBAL, task="VLLM::Worker", pid=7))
    history.record_oom(OomEvent(kind=OomEventKind.REAPED, scope=OomScope.GLOBAL, pid=7))
    assert [(m.task, m.pid) for m in history.ooms()] == [("VLLM::Worker", 7)]


def test_charts_escape_text_and_fold_long_series() -> None:
    svg = charts.line_chart(
        [charts.Series("<script>x</script>", [(float(t), float(t % 7)) for t in range(100_000)], fold=min)],
        title="t & <b>", markers=[charts.Marker(500.0, "OOM <kill>")], hlines=[charts.HLine(3.0, "target")],
    )
    assert "<script>" not in svg and "&lt;script&gt;" in svg and "t &amp; &lt;b&gt;" in svg
    assert svg.count(",") < 2_000  # one point per pixel column, not 100,000
    assert "stroke-dasharray" in svg and "OOM &lt;kill&gt;" in svg
    empty = charts.line_chart([charts.Series("a", [])], title="none")
    assert "no samples yet" in empty


def test_waterfall_bars_run_from_one_phase_to_the_next() -> None:
    record = LaunchRecord(
        id="l", recipe="r", spec_hash="h", kind="cold", runtime="process", status="ready", created_at=0.0,
        ready_s=100.0, cache="miss", exit_code=None, exit_signal=None, oom_killed=None, diagnosis_code=None,
        mem_available_min_bytes=None, swap_peak_bytes=None, argv=[], env={}, image=None, image_id=None,
        image_digest=None, interpreter=None, packages={}, handle=None, started_at=0.0, ready_at=100.0,
        ended_at=None, diagnosis=None, log_tail=None, oom=[], events=[],
        phases=[PhaseRecord(name="weights_loading", at=0, elapsed_s=5, detail=""),
                PhaseRecord(name="compile_cache_miss", at=0, elapsed_s=30, detail="fx graph cache miss"),
                PhaseRecord(name="compile_cache_miss", at=0, elapsed_s=31, detail="again"),
                PhaseRecord(name="kv_cache", at=0, elapsed_s=80, detail="")],
    )
    bars = _phase_bars(record)
    assert [(b.label, b.start, b.end) for b in bars] == [
        ("loading weights", 5, 30), ("compile cache miss", 30, 80), ("KV cache sized", 80, 100)]
    assert bars[1].color == "#dc2626"
    svg = charts.waterfall(bars, title="w")
    assert svg.count('class="bar"') == 3


def _ctx(rig: Rig, home: Path):  # type: ignore[no-untyped-def]
    from controller.api_context import ApiContext

    return ApiContext(rig.driver, rig.store, rig.preflight, home, "cpu-smollm2")


async def test_a_form_body_is_read_only_after_the_session_check_and_only_when_small(
    client: httpx.AsyncClient, home: Path
) -> None:
    big = {"name": "x" * 20_000, "csrf": "whatever"}
    r = await client.post("/console/keys", data=big)
    assert r.status_code == 303 and "/console/login" in r.headers["location"]  # no session: body unread
    await login(client)
    r = await client.post("/console/keys", data={**big, "csrf": await csrf_of(client)})
    assert r.status_code == 413 and "nothing was changed" in r.text
    long_field = {"name": "y" * 600, "csrf": await csrf_of(client)}
    assert (await client.post("/console/keys", data=long_field)).status_code == 422
    assert KeyStore(Paths(home).keys_db).list() == []


async def test_the_status_stream_sends_snapshots_until_the_session_ends(rig: Rig, home: Path) -> None:
    import asyncio

    sessions = Sessions(home)
    app = FastAPI()
    app.include_router(console_router(_ctx(rig, home), sessions=sessions))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as c:
        await login(c)

        async def end_sessions_soon() -> None:
            await asyncio.sleep(1.5)
            for live in list(sessions._live.values()):
                sessions.logout(live)

        ender = asyncio.create_task(end_sessions_soon())
        r = await asyncio.wait_for(c.get("/console/events"), timeout=30)
        await ender
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert r.headers["content-security-policy"] == CSP
    events = [block for block in r.text.split("\n\n") if block]
    assert events[0].startswith("event: status\ndata: ") and '"state": "idle"' in events[0]
    assert events[-1].startswith("event: ended")  # the page then goes to the log-in form


async def test_a_broken_recipe_directory_is_a_page_not_a_traceback(
    client: httpx.AsyncClient, rig: Rig, tmp_path: Path
) -> None:
    broken = tmp_path / "broken-recipes"
    broken.mkdir()
    (broken / "bad.yaml").write_text("name: bad\nplatform: [unclosed\n")
    rig.preflight.recipes_dir = broken
    await login(client)
    for path in ("/console/recipes", "/console/recipes/bad", "/console/recipes/bad/apply"):
        r = await client.get(path)
        assert r.status_code == 500, path
        assert "problem-title" in r.text and r.headers["content-security-policy"] == CSP


def test_the_host_watch_feeds_the_console_history(home: Path) -> None:
    from controller.store import Store
    from controller.supervisor.host_memory_watch import HostWatchLink
    from controller.watch.history import HOST_HISTORY

    link = HostWatchLink(Store(home / "watch.sqlite3"))
    before = HOST_HISTORY.points()[-1:] if len(HOST_HISTORY) else []
    link.on_sample(_sample(7.0), None)
    latest = HOST_HISTORY.points()[-1]
    assert latest not in before and latest.mem_available_bytes == 7 * 2**30
    link.on_oom(OomEvent(kind=OomEventKind.KILL, scope=OomScope.GLOBAL, task="stress", pid=99))
    assert HOST_HISTORY.ooms()[-1].task == "stress"


async def test_a_recorded_launch_shows_in_the_table_with_its_waterfall_and_memory(
    rig: Rig, home: Path
) -> None:
    import time as _time

    from controller.runtime.base import Provenance
    from tests.unit.supervisor_helpers import make_handle, make_spec

    now = _time.time()
    store = rig.store
    store.create_launch("L1", make_spec("cpu-smollm2"), "normal", Provenance(), now - 100)
    store.set_handle("L1", make_handle("L1", "cpu-smollm2", started_at=now - 100), now - 100)
    store.add_phase("L1", "process_started", now - 99, 1.0)
    store.add_phase("L1", "compile_cache_hit", now - 60, 40.0, "fx graph cache hit for key abc")
    store.add_phase("L1", "api_up", now - 20, 80.0)
    store.set_cache("L1", "hit")
    store.mark_ready("L1", now - 20, 80.0)
    store.add_event("oom-kill", "global OOM kill: x", now - 50, "L1")
    store.update_compile_cache("L1", {  # why a miss, named on the page
        "seen": {"cache_hash": "f100a03e45", "aot_path": "/c/aot/model"}, "previous_launch": "L0",
        "miss": {"reason": "flag", "details": ["flag --max-model-len changed"], "compared_with": "L0"},
        "warnings": ["cache root /c is not writable: every start compiles, nothing is kept"]})
    clock = Clock()
    clock.t = now - 90
    history = HostHistory(clock=clock)
    for _ in range(30):
        clock.t += 2
        history.record(_sample(8.0))
    app = FastAPI()
    app.include_router(console_router(_ctx(rig, home), history=history))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as c:
        await login(c)
        table = (await c.get("/console/launches")).text
        assert 'id="launch-L1"' in table and "warm (hit)" in table and "fx graph cache hit" in table
        page = (await c.get("/console/launches/L1")).text
        assert page.count('class="bar"') == 3  # process started, compile cache hit, API up
        assert "compile cache hit" in page and "<polyline" in page and ">OOM kill<" in page
        assert "<code>f100a03e45</code>" in page
        assert "<strong>flag</strong>: flag --max-model-len changed" in page
        assert "cache root /c is not writable" in page and 'href="/console/launches/L0"' in page
        assert (await c.get("/console/launches/nope")).status_code == 404
        memory = (await c.get("/console/memory?minutes=15")).text
        assert "start cpu-smollm2" in memory and "<polyline" in memory


async def test_the_now_page_shows_a_real_gateways_upstream_and_in_flight(
    client: httpx.AsyncClient, rig: Rig, home: Path
) -> None:
    import asyncio
    import socket

    from controller.gateway import control
    from controller.gateway.config import GatewayConfig
    from controller.gateway.control import ControlGateway
    from controller.gateway.server import build_server

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    token = admin_token.write_gateway_token(home / "run")
    server, _ = build_server(GatewayConfig(keys_db=home / "keys.sqlite3", port=port,
                                           admin_token_sha256=admin_token.hash_token(token)))
    serving = asyncio.create_task(server.serve())
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(100):
            if server.started:
                break
            await asyncio.sleep(0.05)
        rig.driver.gateway = ControlGateway(url, token)
        await login(client)
        page = (await client.get("/console/")).text
        assert "none: new requests get 503" in page and 'id="gateway-in-flight">0' in page
        await control.set_upstream(url, token, "http://127.0.0.1:18000", "smollm2", drain_deadline_s=0)
        page = (await client.get("/console/")).text
        assert 'id="gateway-upstream">http://127.0.0.1:18000<' in page
        assert token not in page  # the gateway's control token stays on the server
    finally:
        server.should_exit = True
        await serving


def test_the_live_view_carries_the_eta_its_bar_each_phase_against_its_history_and_the_stall() -> None:
    from controller.console.views import live_view
    from tests.unit.test_apply_cli import ETA, _starting

    live = live_view(_starting(ETA))
    assert live["eta_text"] == "past the usual ready time of ~38 s by 67 s (warm; 37–40 s over 3 launches)"
    assert live["stall"] == "likely stalled: torch.compile 95 s, usually 18 s"
    assert live["eta_pct"] == 100.0  # 105 s against the usual 38 s: the bar is full
    assert live["phases"] == [
        {"label": "loading weights · 8 s, usually 8 s", "done": True, "current": False},
        {"label": "torch.compile · 95 s, usually 18 s", "done": False, "current": True},
        {"label": "KV cache sized · usually 7 s", "done": False, "current": False},
        {"label": "API up", "done": False, "current": False},
    ]
    early = live_view(_starting(dict(ETA, elapsed_s=19.0, stall=None)))
    assert (early["eta_pct"], early["stall"]) == (50.0, None)
    plain = live_view(_starting(None))
    assert (plain["eta_text"], plain["stall"], plain["eta_pct"]) == (None, None, None)
    assert plain["phases"] == [{"label": "loading weights", "done": True, "current": False}]


async def test_the_now_page_shows_the_eta_and_a_likely_stall(
    client: httpx.AsyncClient, rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.unit.test_apply_cli import ETA, _starting

    snapshot = {**rig.driver.status(), **_starting(ETA)}
    monkeypatch.setattr(rig.driver, "status", lambda: snapshot)
    await login(client)
    page = (await client.get("/console/")).text
    assert ('<span id="eta-text" data-live="eta_text">past the usual ready time of ~38 s by 67 s '
            "(warm; 37–40 s over 3 launches)</span>") in page
    assert '<progress id="eta-bar" max="100" value="100.0"></progress>' in page
    assert 'data-live="stall">likely stalled: torch.compile 95 s, usually 18 s</p>' in page
    assert '<li class="current">torch.compile · 95 s, usually 18 s</li>' in page


# ---- issue 23 item 10: failed log-ins logged (never the token), counted, slowed; 404s secured ----


class Sleeps:
    """The throttle's sleep: records each delay and advances the fake clock by it (no wall time)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)
        self.clock.t += seconds


async def test_failed_logins_are_logged_counted_and_slowed_per_address(
        rig: Rig, home: Path, caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    sleeps = Sleeps(clock)
    app = FastAPI()
    app.include_router(console_router(_ctx(rig, home), sessions=Sessions(home, clock=clock),
                                      throttle=LoginThrottle(clock=clock, sleep=sleeps)))
    metrics = rig.driver.metrics
    guess = "adm_guess-that-must-never-be-logged"
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app, client=("10.0.0.7", 4000)),
                                 base_url="http://127.0.0.1") as c:
        with caplog.at_level(logging.WARNING, logger="controller.console.routes"):
            for _ in range(3):  # the first three are free: answered at once
                assert (await login(c, guess)).status_code == 401
            assert sleeps.delays == []
            fourth = await login(c, guess)  # the fourth is answered after 1 s
            assert fourth.status_code == 401 and "wrong admin token" in fourth.text
            assert fourth.headers["content-security-policy"] == CSP
            assert sleeps.delays == [1.0]
            assert (await login(c, guess)).status_code == 401  # the fifth after 2 s
            assert sleeps.delays == [1.0, 2.0]
        assert metrics.value("appliance_console_login_failures_total", {"reason": "refused"}) == 3
        assert metrics.value("appliance_console_login_failures_total", {"reason": "throttled"}) == 2
        lines = [rec.getMessage() for rec in caplog.records]
        assert any("10.0.0.7" in line and "wrong admin token" in line and "4 failures in a row" in line
                   for line in lines), lines
        assert not any(guess in line or TOKEN in line for line in lines)
        # The right token logs in at once (no delay, no 429), and clears the address's count.
        r = await login(c)
        assert r.status_code == 303 and COOKIE in r.headers["set-cookie"]
        assert sleeps.delays == [1.0, 2.0]
        for _ in range(3):
            assert (await login(c, guess)).status_code == 401
        assert sleeps.delays == [1.0, 2.0]
    # another address is not slowed by this one's failures
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app, client=("10.0.0.8", 4000)),
                                 base_url="http://127.0.0.1") as other:
        assert (await login(other)).status_code == 303


async def test_login_right_token_at_once_after_wrong_ones_from_the_same_address(
        rig: Rig, home: Path) -> None:
    """Finding 17: four wrong tokens from 127.0.0.1 used to lock the operator out (the right token
    got 429 for up to 300 s). The throttle holds back wrong answers; a right token is never refused."""
    clock = Clock()
    sleeps = Sleeps(clock)
    throttle = LoginThrottle(clock=clock)
    throttle.sleep = sleeps
    app = FastAPI()
    app.include_router(console_router(_ctx(rig, home), sessions=Sessions(home, clock=clock),
                                      throttle=throttle))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app, client=("127.0.0.1", 4000)),
                                 base_url="http://127.0.0.1") as c:
        for _ in range(4):
            assert (await login(c, "wrong")).status_code == 401
        clock.t = 1_000_000.0  # the right token comes while the last failure is still being held back
        r = await login(c)
        assert r.status_code == 303, r.status_code
        for _ in range(14):  # up to the 300 s cap
            assert (await login(c, "wrong")).status_code == 401
        assert sleeps.delays[-1] == 300.0
        waited = len(sleeps.delays)
        assert (await login(c)).status_code == 303
        assert len(sleeps.delays) == waited  # the right token was not held back


def test_throttle_holds_back_failures_and_queues_parallel_ones() -> None:
    clock = Clock()
    throttle = LoginThrottle(clock=clock, free=3, max_wait_s=300.0)
    # Failures in sequence (each waiting for its answer): 0, 0, 0, then 1, 2, 4 s …
    decisions = []
    for _ in range(6):
        count, delay = throttle.failed("a")
        decisions.append((count, delay))
        clock.t += delay
    assert decisions == [(1, 0.0), (2, 0.0), (3, 0.0), (4, 1.0), (5, 2.0), (6, 4.0)]
    # Failures sent together queue behind each other: each answer comes after the previous one's.
    throttle.succeeded("a")
    together = [throttle.failed("a")[1] for _ in range(7)]
    assert together == [0.0, 0.0, 0.0, 1.0, 3.0, 7.0, 15.0]
    many = [throttle.failed("a")[1] for _ in range(20)]
    assert max(many) == 300.0 and many[-1] == 300.0  # capped
    # Another address is on its own count; a success clears only its own.
    assert throttle.failed("b") == (1, 0.0)
    throttle.succeeded("a")
    assert throttle.failed("a") == (1, 0.0)


async def test_console_404_pages_carry_the_security_headers(client: httpx.AsyncClient) -> None:
    for path in ("/console/no-such-page", "/console/static/nope.js", "/console/recipes/x/y/z"):
        r = await client.get(path)
        assert r.status_code == 404, path
        assert r.headers["content-security-policy"] == CSP, path
        assert r.headers["x-frame-options"] == "DENY" and r.headers["x-content-type-options"] == "nosniff"
        assert r.headers["cache-control"] == "no-store" and r.headers["referrer-policy"] == "no-referrer"
    await login(client)
    assert (await client.get("/console/keys")).status_code == 200  # the catch-all shadows no page


def test_the_now_page_shows_a_failed_launch_s_log_tail() -> None:
    from controller.console import views

    live = views.live_view({"state": "failed", "failed_log_tail": ["INFO a", "OSError: Repo id must be"]})
    assert live["log_tail"] == "INFO a\nOSError: Repo id must be"
    assert views.live_view({"state": "ready"})["log_tail"] == ""
    now = (Path(views.__file__).parent / "templates" / "now.html").read_text()
    assert 'data-live="log_tail"' in now and 'id="log-tail"' in now
    js = (Path(views.__file__).parent / "static" / "console.js").read_text()
    assert "log_tail" in js and 'getElementById("log-tail")' in js


def test_the_now_page_says_what_the_gateway_holds_during_a_switch() -> None:
    from controller.console import views

    hold = {"reason": "restart", "wait_s": 75.0, "waiting": 3, "ready_in_s": 34.6}
    live = views.live_view({"state": "starting", "hold": hold})
    assert live["hold_text"] == "holding 3 requests (restart), each up to 75 s; ready in ~35 s"
    assert views.live_view({"state": "ready", "hold": None})["hold_text"] == ""
    unknown = views.live_view({"state": "draining", "hold": {**hold, "waiting": None, "ready_in_s": None}})
    assert unknown["hold_text"] == "holding new requests (restart), each up to 75 s"
    now = (Path(views.__file__).parent / "templates" / "now.html").read_text()
    assert 'data-live="hold_text"' in now


def test_the_now_page_names_the_other_engine_of_a_blue_green_switch() -> None:
    from controller.console import views

    bg = {"old_launch_id": "L1", "old_recipe": "cpu-smollm2", "old_url": "http://127.0.0.1:8000",
          "old": "serving"}
    live = views.live_view({"state": "starting", "blue_green": bg})
    assert live["blue_green_text"] == "blue/green: cpu-smollm2 serves while the new engine starts beside it"
    stopping = views.live_view({"state": "ready", "blue_green": {**bg, "old": "stopping"}})
    assert stopping["blue_green_text"] == "blue/green: switched; cpu-smollm2 is being drained and stopped"
    assert views.live_view({"state": "ready", "blue_green": None})["blue_green_text"] == ""
    now = (Path(views.__file__).parent / "templates" / "now.html").read_text()
    assert 'data-live="blue_green_text"' in now
