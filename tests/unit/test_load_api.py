"""`GET /load` and `appliance status` with load: the controller's load sampler
(controller/watch/load_sampler.py) wired as service.build wires it (`ready_engine`), over recorded
exposition text (a real vLLM answer and the gateway's own rendering) served by a fake fetch; the CLI
against a controller answering those reports."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import typer
from typer.testing import CliRunner

from controller import admin_token
from controller.api.app import create_app
from controller.api_context import ApiContext
from controller.cli import api_cmd
from controller.cli.load_lines import load_lines, sparkline
from controller.gateway.metrics import GatewayMetrics
from controller.service import ready_engine
from controller.watch.load_sampler import LoadSampler
from tests.unit.test_api import AUTH, TOKEN, Rig

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "engine_logs" / "vllm_metrics.txt"
GATEWAY = "http://127.0.0.1:9"  # never dialled: the fake fetch answers
TOKENS = 'vllm:generation_tokens_total{engine="0",model_name="smollm2"}'


class Exporters:
    """What the gateway's and the engine's /metrics answer now (recorded text, edited as load goes)."""

    def __init__(self) -> None:
        self.gateway = GatewayMetrics()
        self.engine_text = FIXTURE.read_text()
        self.asked: list[str] = []
        self.engine_down = False

    def tokens(self, n: float) -> None:
        self.engine_text = re.sub("^" + re.escape(TOKENS) + r" \S+$", f"{TOKENS} {n}", self.engine_text,
                                  flags=re.M)

    async def fetch(self, url: str) -> str:
        self.asked.append(url)
        if url.startswith(GATEWAY):
            return self.gateway.render().decode()
        if self.engine_down:
            raise OSError("connection refused")
        return self.engine_text


@pytest.fixture
def exporters() -> Exporters:
    return Exporters()


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv(admin_token.HASH_ENV, raising=False)
    admin_token.write_hash(tmp_path, TOKEN)
    return tmp_path


@pytest.fixture
def loaded(home: Path, exporters: Exporters) -> tuple[Rig, LoadSampler]:
    rig = Rig(home)
    sampler = LoadSampler(GATEWAY, ready_engine(rig.driver), fetch=exporters.fetch, clock=rig.clock.now)
    rig.app = create_app(ApiContext(rig.driver, rig.store, rig.preflight, home, "cpu-smollm2", load=sampler))
    return rig, sampler


@pytest.fixture
async def client(loaded: tuple[Rig, LoadSampler]) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=loaded[0].app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8090") as c:
        yield c


async def _ready(rig: Rig, client: httpx.AsyncClient) -> None:
    assert (await client.post("/apply", json={"recipe": "cpu-smollm2"}, headers=AUTH)).status_code == 202
    await rig.step(1)
    rig.runtime.current().healthy = True
    await rig.step(1)
    assert rig.driver.view.state.value == "ready"


async def test_load_before_any_sample_and_without_an_engine(
    loaded: tuple[Rig, LoadSampler], client: httpx.AsyncClient, exporters: Exporters,
) -> None:
    _, sampler = loaded
    body = (await client.get("/load")).json()
    assert body["sampled_at"] is None and body["uptime_s"] is None and body["state"] == "idle"
    await sampler.sample_once()
    body = (await client.get("/load")).json()
    # idle: the gateway is sampled, no engine is asked for its metrics
    assert all(u.startswith(GATEWAY) for u in exporters.asked)
    assert body["sources"] == {"gateway": GATEWAY, "engine": None}
    assert body["now"]["in_flight"] == 0.0 and body["now"]["output_tokens_per_s"] is None


async def test_load_of_a_ready_engine_through_the_api(
    loaded: tuple[Rig, LoadSampler], client: httpx.AsyncClient, exporters: Exporters,
) -> None:
    rig, sampler = loaded
    await _ready(rig, client)
    await sampler.sample_once()
    rig.clock.t += 5
    for _ in range(10):
        exporters.gateway.count_request("/v1/chat/completions", 200, "k1")
    exporters.gateway.count_request("/v1/chat/completions", 429, "k1")
    exporters.tokens(58.0)  # 50 more output tokens
    await sampler.sample_once()
    body = (await client.get("/load")).json()
    launch = rig.driver.view.ready_launch()
    assert launch is not None and body["sources"]["engine"] == launch.launch_id
    assert any(u == launch.spec.base_url.rstrip("/") + "/metrics" for u in exporters.asked)
    now = body["now"]
    assert now["requests"] == 11.0 and now["requests_per_s"] == pytest.approx(11 / 5)
    assert now["output_tokens_per_s"] == pytest.approx(10.0)
    assert body["errors"]["too_many_429"] == 1.0 and body["errors"]["server_5xx"] == 0.0
    assert launch.ready_at is not None and body["ready_at"] == launch.ready_at
    assert body["uptime_s"] == pytest.approx(rig.clock.now() - launch.ready_at) and body["uptime_s"] >= 5
    assert len(body["series"]["requests_per_s"]) == 2


async def test_an_engine_that_does_not_answer_is_said_and_the_gateway_still_sampled(
    loaded: tuple[Rig, LoadSampler], client: httpx.AsyncClient, exporters: Exporters,
) -> None:
    rig, sampler = loaded
    await _ready(rig, client)
    exporters.engine_down = True
    await sampler.sample_once()
    body = (await client.get("/load")).json()
    assert "connection refused" in body["problems"]["engine"]
    assert body["sources"] == {"gateway": GATEWAY, "engine": None}
    assert body["now"]["kv_cache_pct"] is None and body["now"]["in_flight"] == 0.0


# -- appliance status

cli_app = typer.Typer()
api_cmd.register(cli_app)


def test_load_lines_say_what_was_not_measured() -> None:
    lines = "\n".join(load_lines({"sampled_at": 1.0, "now": {"requests_per_s": 2.0}, "errors": {},
                                  "series": {}, "uptime_s": None, "problems": {"engine": "HTTP 500"}}))
    assert "2.00 req/s" in lines and "— output tok/s" in lines and "(engine not sampled: HTTP 500)" in lines
    assert sparkline([(0, 0.0), (1, None), (2, 4.0)]) == "▁ █"


class _Controller:
    """/status and /load as a controller answers them; counts the /status calls."""

    def __init__(self, load: dict[str, Any] | None) -> None:
        self.calls = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/status":
                    outer.calls += 1
                    body, code = {"state": "ready", "recipe": "cpu-smollm2", "launch": None}, 200
                elif self.path == "/load" and load is not None:
                    body, code = load, 200
                else:
                    body, code = {"detail": "Not Found"}, 404
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def report() -> dict[str, Any]:
    return {"sampled_at": 10.0, "interval_s": 5.0, "state": "ready", "uptime_s": 3725.0,
            "now": {"requests": 12.0, "requests_per_s": 0.2, "output_tokens_per_s": 31.5, "in_flight": 1.0,
                    "window_s": 60.0, "ttft_p50_s": 0.12, "ttft_p99_s": 1.5},
            "errors": {"window_s": 300.0, "client_4xx": 1.0, "too_many_429": 0.0, "server_5xx": 2.0,
                       "client_gone_499": 0.0},
            "series": {"requests_per_s": [[5.0, 0.1], [10.0, 0.2]]}, "problems": {}}


@pytest.fixture
def controller(report: dict[str, Any]) -> Iterator[_Controller]:
    c = _Controller(report)
    yield c
    c.server.shutdown()
    c.server.server_close()


def test_status_shows_the_load_and_json_carries_it(controller: _Controller, report: dict[str, Any]) -> None:
    runner = CliRunner()
    out = runner.invoke(cli_app, ["status", "--api", controller.url])
    assert out.exit_code == 0, out.output
    assert "0.20 req/s · 31.5 output tok/s (last 60 s)" in out.output
    assert "TTFT p50 120 ms p99 1.50 s" in out.output
    assert "4xx 1 · 429 0 · 5xx 2" in out.output and "ready for 1 h 02 min" in out.output
    js = runner.invoke(cli_app, ["status", "--json", "--api", controller.url])
    assert js.exit_code == 0 and json.loads(js.output)["load"] == report


def test_status_of_a_controller_without_load_still_answers() -> None:
    c = _Controller(None)
    try:
        out = CliRunner().invoke(cli_app, ["status", "--json", "--api", c.url])
        assert out.exit_code == 0 and json.loads(out.output)["load"] is None
    finally:
        c.server.shutdown()
        c.server.server_close()


def test_status_watch_redraws_until_interrupted(controller: _Controller,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    naps: list[float] = []

    def sleep(seconds: float) -> None:
        naps.append(seconds)
        if len(naps) >= 3:
            raise KeyboardInterrupt

    monkeypatch.setattr("controller.cli.api_cmd.time.sleep", sleep)
    out = CliRunner().invoke(cli_app, ["status", "--watch", "--every", "7", "--api", controller.url])
    assert out.exit_code == 0, out.output
    assert controller.calls == 3 and naps == [7.0, 7.0, 7.0]
    assert out.output.count("req/s ·") == 3
    lines = CliRunner().invoke(cli_app, ["status", "--watch", "--json", "--api", controller.url])
    # the patched sleep interrupts at once now: one JSON line, then Ctrl-C ends it
    assert lines.exit_code == 0 and len(lines.output.splitlines()) == 1
    assert json.loads(lines.output)["load"]["now"]["requests"] == 12.0


# -- the console's Now page


async def test_the_now_page_shows_each_figure_with_a_sparkline_and_the_fragment_redraws_it(
    loaded: tuple[Rig, LoadSampler], client: httpx.AsyncClient, exporters: Exporters,
) -> None:
    from tests.unit.test_console import login

    rig, sampler = loaded
    assert (await client.get("/console/load")).status_code == 401  # no session, no figures
    await login(client)
    await _ready(rig, client)
    await sampler.sample_once()
    rig.clock.t += 5
    for _ in range(4):
        exporters.gateway.count_request("/v1/completions", 200, "k1")
    exporters.gateway.count_request("/v1/completions", 503, "k1")
    exporters.tokens(108.0)
    await sampler.sample_once()
    page = (await client.get("/console/")).text
    assert 'id="load" data-load-url="/console/load"' in page
    row = re.search(r'<tr id="load-output_tokens_per_s">.*?</tr>', page, re.S)
    assert row is not None and '<td class="figure">20.0</td>' in row.group(0)
    assert row.group(0).count("<svg") == 1 and "<polyline" in row.group(0)
    assert page.count('class="spark"') == 10  # one per figure
    assert "5xx 1" in page and "rates over the last 5 s" in page
    # a measured zero is 0 (what nobody measured reads —: test_load_lines_say_what_was_not_measured)
    held = re.search(r'<tr id="load-gateway_held">.*?</tr>', page, re.S)
    assert held is not None and '<td class="figure">0</td>' in held.group(0)
    fragment = await client.get("/console/load")
    assert fragment.status_code == 200 and fragment.text.count('class="spark"') == 10
    assert "content-security-policy" in fragment.headers


def test_a_sparkline_with_one_point_or_none_says_so() -> None:
    from controller.console.charts import sparkline as svg_spark

    assert "no data yet" in svg_spark([], title="x")
    assert "no data yet" in svg_spark([(1.0, 3.0)], title="x")
    drawn = svg_spark([(0.0, 1.0), (5.0, None), (10.0, 2.0), (15.0, 0.0)], title="x")
    assert drawn.count("<polyline") == 2  # split at the gap
