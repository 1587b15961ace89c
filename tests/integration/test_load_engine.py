"""How busy it is, on the REAL CPU engine behind a real gateway: a gateway process, a controller
(`appliance serve --gateway-url`, its load sampler scraping the gateway's control listener and the
engine's /metrics), a few chat completions through the gateway; then `appliance status --json`
carries the load (requests > 0, output tokens/s > 0, a TTFT, an uptime) and the console's Now page
in headless Chromium shows the figures with their sparklines and redraws them without a reload.

Assertions are on presence and sign, never on values or timings; the waits are liveness bounds.
The Now page's screenshot lands in build/console-screenshots/now-load.png.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions

from bench.hold_bench import GatewayProcess, gateway_process
from tests.integration.controller_harness import (
    REPO,
    TOKEN,
    Controller,
    engine_recipe,
    free_port,
    recipe_dirs,
    require_engine,
    serving,
)
from tests.integration.test_console_browser import Console, browser  # noqa: F401  (the fixture)

pytestmark = [pytest.mark.engine, pytest.mark.slow, pytest.mark.timeout(2400)]
RECIPE = "itest-load-smollm2"
SAMPLED_S = 120.0  # liveness: the sampler scrapes every 5 s


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Controller, GatewayProcess]]:
    require_engine()
    home, recipes = recipe_dirs(tmp_path_factory.mktemp("load"), "cpu-smollm2")
    engine_port = free_port()
    # eager: a real start with real metrics, without a cold compile on a loaded machine
    (recipes / f"{RECIPE}.yaml").write_text(
        engine_recipe(RECIPE, "cpu-smollm2", engine_port, engine={"mode": "eager"}))
    with gateway_process(home, free_port(), free_port()) as gw:
        c = Controller(home, recipes, free_port(), engine_port, recipe=RECIPE,
                       extra_args=("--gateway-url", gw.control_url))
        with serving(c):
            yield c, gw


def _complete(gw: GatewayProcess, model: str) -> None:
    body = json.dumps({"model": model, "max_tokens": 8,
                       "messages": [{"role": "user", "content": "Say hello."}]}).encode()
    req = urllib.request.Request(gw.url + "/v1/chat/completions", data=body, method="POST",
                                 headers={"Content-Type": "application/json",
                                          "Authorization": f"Bearer {gw.key}"})
    with urllib.request.urlopen(req, timeout=300) as resp:
        assert resp.status == 200
        assert json.loads(resp.read())["usage"]["completion_tokens"] > 0


def _status_json(c: Controller) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "controller.cli.main", "status", "--json", "--api", c.url],
                         capture_output=True, text=True, cwd=REPO, timeout=60, check=True)
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def test_status_and_the_now_page_show_the_load_of_the_real_engine(
    stack: tuple[Controller, GatewayProcess], browser: Any,  # noqa: F811
) -> None:
    c, gw = stack
    status = c.wait_ready()
    model = status["launch"]["served_model_name"]
    # The engine is scraped from its ready on, every few seconds: requests sent before its first scrape
    # would be in every later scrape's base (a rate cannot see what happened before it began).
    c.wait(lambda: (c.get("/load").get("sources") or {}).get("engine") == status["launch"]["id"], SAMPLED_S,
           "the sampler to scrape the ready engine")
    for _ in range(3):
        _complete(gw, model)

    seen: dict[str, Any] = {}

    def loaded() -> bool:
        s = _status_json(c)
        seen.update(s)
        now = (s.get("load") or {}).get("now") or {}
        return bool((now.get("requests") or 0) > 0 and (now.get("output_tokens_per_s") or 0) > 0)

    try:
        c.wait(loaded, SAMPLED_S, "status --json to show the requests")
    finally:
        load = seen.get("load") or {}
        print(json.dumps({k: load.get(k) for k in ("now", "errors", "uptime_s", "sources", "problems")},
                         indent=1))
        with urllib.request.urlopen(status["launch"]["engine_url"] + "/metrics", timeout=30) as resp:
            print("\n".join(line for line in resp.read().decode().splitlines()
                             if "time_to_first_token_seconds" in line and "_bucket" not in line))
    now = load["now"]
    assert now["requests_per_s"] > 0 and now["output_tokens_per_s"] > 0
    assert now["ttft_p50_s"] is not None and now["ttft_p50_s"] > 0
    assert now["tpot_p50_s"] is not None and now["tpot_p50_s"] > 0
    assert now["kv_cache_pct"] is not None and now["kv_cache_pct"] >= 0
    assert now["in_flight"] is not None and now["engine_waiting"] is not None
    assert load["uptime_s"] > 0 and load["sources"]["engine"] == status["launch"]["id"]
    assert load["sources"]["gateway"] == gw.control_url
    assert load["errors"]["server_5xx"] == 0
    assert load["problems"] == {"gateway": None, "engine": None}

    # The console's Now page: every figure with its sparkline, redrawn in place.
    ui = Console(browser, c.url)
    ui.go("/console/")
    ui.el("token").send_keys(TOKEN)
    ui.submit(ui.el("login"))
    ui.wait(lambda: ui.text("state") == "ready", 60, "the Now page")
    row = ui.el("load-requests_per_s")
    assert row.find_elements(By.CSS_SELECTOR, "svg.spark polyline"), "no sparkline drawn for req/s"
    assert row.find_element(By.CLASS_NAME, "figure").text != "—"
    assert len(browser.find_elements(By.CSS_SELECTOR, "#load svg.spark")) == 10
    browser.execute_script("document.getElementById('load').scrollIntoView()")
    ui.shot("now-load")
    first = ui.text("load-uptime")
    marker = browser.find_element(By.ID, "load-uptime")
    browser.execute_script("window.loadPageMark = 1")  # gone if the page were reloaded
    # the panel is swapped for a fresh rendering once per sample (console.js), without a reload
    ui.wait(lambda: ui.text("load-uptime") != first, 60, "the load panel to be redrawn")
    assert expected_conditions.staleness_of(marker)(browser)  # a new element: swapped, not reloaded
    assert browser.execute_script("return window.loadPageMark") == 1  # the same page, not a reload
    ui.shot("now-load-redrawn")
    ui.read_log()
    assert ui.errors == [], ui.errors
    assert Path(REPO / "build" / "console-screenshots" / "now-load.png").exists()
