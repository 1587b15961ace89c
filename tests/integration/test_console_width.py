"""The Launches and Benchmarks tables fit a 1366 px screen, in headless Chromium.

No engine: the console of a controller with the unit tests' fakes (tests/unit/test_api.py's Rig),
served by uvicorn on a free loopback port, with launches whose ids are as long as real ones
(timestamp, a long recipe name, a suffix), their cache outcome in words, and the benchmark
fixtures of tests/unit/test_console_benchmarks.py. A table fits when it needs no horizontal
scrolling inside its card and the page none either. Screenshots land in build/console-screenshots/.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn

from controller import admin_token
from tests.integration.controller_harness import REPO, free_port
from tests.unit.test_api import TOKEN, Rig
from tests.unit.test_console_benchmarks import _store
from tests.unit.test_console_controls import _launch_with_log

pytestmark = [pytest.mark.slow]

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402

SHOTS = REPO / "build" / "console-screenshots"
WIDTH = 1366  # the most common laptop screen


@pytest.fixture
def console(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("APPLIANCE_HOME", str(tmp_path))
    monkeypatch.delenv(admin_token.HASH_ENV, raising=False)
    admin_token.write_hash(tmp_path, TOKEN)
    rig = Rig(tmp_path)
    for i in range(4):
        launch_id = f"20261202T03162{i}-gfx906-c-tp4-graph-piecewise-bc7c8{i}"
        _launch_with_log(rig, launch_id, "")
        rig.store.add_phase(launch_id, "compile_cache_miss", 0.0, 30.0,
                            "[rank0]:I1201 12:00:00.123000 fx graph cache miss for key fabc1234567890")
        rig.store.set_cache(launch_id, "miss")
        rig.store.update_compile_cache(launch_id, {"miss": {"reason": "cold_first" if i else "env",
                                                            "details": []}})
    _store(rig)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(rig.app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "the console did not start"
        time.sleep(0.1)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    chromium, chromedriver = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not chromedriver:
        pytest.skip("Debian's chromium and chromium-driver are not installed (scripts/setup-system.sh)")
    os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager must not try to download anything
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                f"--window-size={WIDTH},900", "--disable-extensions"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=chromedriver))
    driver.set_page_load_timeout(60)
    SHOTS.mkdir(parents=True, exist_ok=True)
    try:
        yield driver
    finally:
        driver.quit()


def _overflow(browser: WebDriver, table_id: str) -> tuple[int, int, int, int]:
    """(table width, its card's room, page width, window width) in CSS pixels."""
    widths = browser.execute_script(
        "const t = document.getElementById(arguments[0]);"
        "return [t.scrollWidth, t.parentElement.clientWidth, document.documentElement.scrollWidth,"
        " window.innerWidth];", table_id)
    return widths[0], widths[1], widths[2], widths[3]


def test_launches_and_benchmarks_tables_fit_1366_px(console: str, browser: WebDriver) -> None:
    browser.get(console + "/console/login")
    browser.find_element(By.ID, "token").send_keys(TOKEN)
    browser.find_element(By.ID, "login").click()
    deadline = time.monotonic() + 30
    while browser.get_cookie("appliance_console") is None:
        assert time.monotonic() < deadline, "no session after log-in"
        time.sleep(0.2)
    for path, table in (("/console/launches", "launches"), ("/console/benchmarks", "benches"),
                        ("/console/benchmarks", "comparisons")):
        browser.get(console + path)
        browser.find_element(By.ID, table).location_once_scrolled_into_view  # noqa: B018  (scrolls it in)
        browser.save_screenshot(str(SHOTS / f"width-{WIDTH}-{table}.png"))
        table_w, room, page_w, window_w = _overflow(browser, table)
        print(path, table, {"table": table_w, "room": room, "page": page_w, "window": window_w})
        assert table_w <= room, f"#{table} needs {table_w} px in {room} px: it scrolls sideways at {WIDTH} px"
        assert page_w <= window_w, f"{path} is {page_w} px wide in a {window_w} px window"
