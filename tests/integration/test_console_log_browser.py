"""The console's engine log page in a real headless Chromium (issue 36 item 5): HTTP access lines
hidden by default, shown by the toggle, a download link, and Follow hiding the access lines it
appends too (the page's script applies the server's own pattern to whole lines, across chunks).
And the Restart and Stop confirm pages saying the consequence (item 4).

No engine: the real console app over test_api.py's fakes, served by uvicorn on a free port. The
screenshots land in build/console-screenshots/ (gitignored) as test artefacts.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn

from controller import admin_token
from controller.supervisor.machine import State
from controller.supervisor.signals import Apply
from tests.integration.controller_harness import free_port
from tests.integration.test_console_browser import SHOTS, Console, browser
from tests.unit.test_api import TOKEN, Rig
from tests.unit.test_console_controls import _launch_with_log

pytestmark = [pytest.mark.slow]
_ = browser  # the fixture, imported for pytest

SCRAPE = 'INFO:     127.0.0.1:42144 - "GET /metrics HTTP/1.1" 200 OK\n'
START = "(APIServer pid=1) INFO 12-01 10:00:00 [api_server.py:1] Starting vLLM server\n"


async def _ready(rig: Rig) -> None:
    """Drive the fake engine to ready (before the server starts: one event loop at a time)."""
    assert rig.driver.submit(Apply("cpu-smollm2")) is None
    await rig.step(1)
    rig.runtime.current().healthy = True
    for _ in range(3):
        await rig.step(20)
    assert rig.driver.machine.state is State.READY


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
           ) -> Iterator[tuple[Rig, str]]:
    monkeypatch.delenv(admin_token.HASH_ENV, raising=False)
    monkeypatch.setenv("APPLIANCE_HOME", str(tmp_path))
    admin_token.write_hash(tmp_path, TOKEN)
    rig = Rig(tmp_path)
    if getattr(request, "param", None) == "ready":
        asyncio.run(_ready(rig))
    _launch_with_log(rig, "L1", START + SCRAPE * 40 + "the last vLLM line\n")
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(rig.app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "the console did not start"
        time.sleep(0.1)
    try:
        yield rig, f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_the_log_page_hides_access_lines_toggles_them_and_follow_keeps_hiding_them(
    served: tuple[Rig, str], browser: object
) -> None:
    rig, base = served
    ui = Console(browser, base)  # type: ignore[arg-type]
    ui.go("/console/login")
    ui.el("token").send_keys(TOKEN)
    ui.submit(ui.el("login"))
    ui.go("/console/launches/L1/log")
    log = ui.text("log")
    assert "Starting vLLM server" in log and "the last vLLM line" in log and "GET /metrics" not in log
    assert "40 hidden" in ui.text("access-hidden")
    assert ui.el("log-download").get_attribute("href").endswith("/console/launches/L1/log/download")
    ui.shot("log-access-hidden")

    # Follow: an access line split across two polls, then a vLLM line; only the vLLM line appears
    ui.el("follow").click()
    ui.wait(lambda: ui.text("follow-state").startswith("following"), 30, "following")
    engine = rig.runtime.engines["L1"]
    engine.log += 'INFO:     127.0.0.1:1 - "GET /hea'
    time.sleep(2.5)  # one poll of the page (every 2 s) reads the unfinished line
    engine.log += 'lth HTTP/1.1" 200 OK\n' + "(APIServer pid=1) INFO 12-01 10:01:00 [x] a new vLLM line\n"
    ui.wait(lambda: "a new vLLM line" in ui.text("log"), 30, "the followed line")
    assert "GET /health" not in ui.text("log") and "GET /hea" not in ui.text("log")
    ui.shot("log-followed")

    ui.submit(ui.el("access-toggle"))
    shown = ui.text("log")
    assert shown.count("GET /metrics") == 40 and "GET /health" in shown
    assert ui.text("access-toggle") == "Hide HTTP access lines"
    ui.shot("log-access-shown")
    ui.read_log()
    assert not ui.errors, ui.errors
    assert SHOTS.is_dir()


@pytest.mark.parametrize("served", ["ready"], indirect=True)
def test_restart_and_stop_confirm_pages_say_the_consequence(
    served: tuple[Rig, str], browser: object
) -> None:
    _, base = served
    ui = Console(browser, base)  # type: ignore[arg-type]
    ui.go("/console/login")
    ui.el("token").send_keys(TOKEN)
    ui.submit(ui.el("login"))
    ui.go("/console/engine/restart")
    assert ui.text("switch-path").startswith("Path: hold.")
    eta = ui.text("restart-eta")
    assert "Hold bound: each new request waits up to" in eta and "Expected ready in ~" in eta
    ui.shot("engine-restart-confirm")
    ui.go("/console/engine/stop")
    assert "Clients get 503 + Retry-After from the gateway until the next Apply or Restart" in ui.text(
        "stop-consequence")
    assert ui.text("in-flight").startswith("Requests in flight now")
    ui.shot("engine-stop-confirm")
    ui.read_log()
    assert not ui.errors, ui.errors
