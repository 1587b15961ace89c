"""The operator console in a real headless browser against a real controller and the real CPU engine.

Debian's `chromium` driven by Selenium through Debian's `chromedriver` (both from
scripts/setup-system.sh; nothing is downloaded at test time). One controller process
(`appliance serve`, the harness of test_controller_engine.py: free ports, a temp APPLIANCE_HOME) and
ONE engine start for the whole test, in this order:

1. the console asks for a log-in; a wrong token is refused with a message; the right one lets in;
2. a recipe is applied through the confirm dialog (the preflight plan, then "Start ...");
3. the Now page's progress bar moves while the engine starts (server-sent status, no reload);
4. an apply while that start is in progress is refused with a clear message and changes nothing;
5. the engine gets ready; the launch appears in the history with its phase waterfall and the
   host-memory picture; the Host memory page draws its samples;
6. a gateway key is created (shown once), a forged CSRF token changes nothing, the key is revoked;
7. the browser's console logged no error, except the network lines of the refusals above.

Screenshots of every page land in build/console-screenshots/ (gitignored) as test artefacts.
Waits are liveness bounds, not speed assertions.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from controller.evaluation.store import EvalStore
from tests.integration.controller_harness import (
    RECIPE,
    REPO,
    START_LIVENESS_S,
    TOKEN,
    Controller,
    engine_recipe,
    free_port,
    recipe_dirs,
    require_engine,
    serving,
)
from tests.unit.test_console_benchmarks import _bench

pytestmark = [pytest.mark.engine, pytest.mark.slow]

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402
from selenium.webdriver.support import expected_conditions  # noqa: E402
from selenium.webdriver.support.wait import WebDriverWait  # noqa: E402

OTHER = "itest-other"
SHOTS = REPO / "build" / "console-screenshots"
# The network lines Chrome logs for a page answered with the refusal status this test provokes.
EXPECTED_REFUSALS = ("status of 401", "status of 403", "status of 409")


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Controller]:
    require_engine()
    home, recipes = recipe_dirs(tmp_path_factory.mktemp("console"), "cpu-smollm2")
    engine_port = free_port()
    # As test_controller_engine: the shipped recipe on a free port, the installed engine, but eager
    # (no torch.compile): the console needs a real start with real phases, not a cold compile that
    # takes 15+ minutes on a loaded shared machine.
    (recipes / f"{RECIPE}.yaml").write_text(
        engine_recipe(RECIPE, "cpu-smollm2", engine_port, engine={"mode": "eager"})
    )
    # The recipe the refused apply names: if it were ever accepted, it would still use a free port.
    (recipes / f"{OTHER}.yaml").write_text(
        f"name: {OTHER}\nextends: {RECIPE}\nengine:\n  port: {free_port()}\n")
    # recipe=None: the browser applies it
    with serving(Controller(home, recipes, free_port(), engine_port, recipe=None)) as c:
        yield c


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    chromium, chromedriver = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not chromedriver:
        pytest.skip("Debian's chromium and chromium-driver are not installed (scripts/setup-system.sh)")
    os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager must not try to download anything
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,1400", "--disable-extensions"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=chromedriver))
    driver.set_page_load_timeout(60)
    SHOTS.mkdir(parents=True, exist_ok=True)
    try:
        yield driver
    finally:
        driver.quit()


class Console:
    def __init__(self, driver: WebDriver, base: str) -> None:
        self.d = driver
        self.base = base
        self.errors: list[dict[str, Any]] = []

    def go(self, path: str) -> None:
        self.d.get(self.base + path)

    def el(self, element_id: str) -> Any:
        return self.d.find_element(By.ID, element_id)

    def text(self, element_id: str) -> str:
        return str(self.el(element_id).text)

    def submit(self, element: Any) -> None:
        """Click something that loads a new page, and return once that page has loaded.

        A click returns as soon as Chrome has dispatched it; a form post or a link only *schedules*
        the navigation, so reading the next page at once can still find the old one (CI stop 18:
        the log-in refusal's `#error` was looked up on the log-in form it replaces). The old
        document's root going stale is the sign that the new one has replaced it.
        """
        old_root = self.d.find_element(By.TAG_NAME, "html")
        element.click()
        WebDriverWait(self.d, 60).until(expected_conditions.staleness_of(old_root))
        WebDriverWait(self.d, 60).until(
            lambda d: d.execute_script("return document.readyState") == "complete")

    def shot(self, name: str) -> None:
        self.d.save_screenshot(str(SHOTS / f"{name}.png"))

    def wait(self, predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if predicate():
                    return
            except (NoSuchElementException, StaleElementReferenceException):
                pass  # the page is being replaced: ask again
            if time.monotonic() > deadline:
                self.shot("timeout")
                raise AssertionError(f"timed out waiting for {what} on {self.d.current_url}")
            time.sleep(0.5)

    def read_log(self, expected: tuple[str, ...] = ()) -> None:
        """Collect SEVERE browser-console entries, except the refusals this step provoked."""
        # Chromium's driver has get_log; selenium's WebDriver type does not declare it.
        for entry in self.d.get_log("browser"):  # type: ignore[attr-defined]
            if entry["level"] != "SEVERE":
                continue
            if any(e in entry["message"] for e in expected):
                continue
            self.errors.append(entry)


@pytest.mark.timeout(3600)  # a cold start on a loaded 2-core machine took more than 15 min
def test_console_in_a_real_browser(controller: Controller, browser: WebDriver) -> None:
    ui = Console(browser, controller.url)

    # 1. log-in: every page needs it; a wrong token is refused with words, the right one lets in.
    ui.go("/console/")
    assert "/console/login" in browser.current_url
    ui.el("token").send_keys("adm_wrong-token")
    ui.submit(ui.el("login"))
    assert "wrong admin token" in ui.text("error")
    assert browser.get_cookie("appliance_console") is None
    ui.shot("login-refused")
    ui.read_log(expected=("status of 401",))
    ui.el("token").send_keys(TOKEN)
    ui.submit(ui.el("login"))
    ui.wait(lambda: ui.text("state") == "idle", 30, "the Now page after log-in")
    cookie = browser.get_cookie("appliance_console")
    assert cookie is not None and cookie["httpOnly"] and cookie["sameSite"] == "Strict" and "expiry" in cookie
    assert TOKEN not in browser.page_source
    ui.read_log()

    # 2. apply through the confirm dialog: the plan first, then the confirmation.
    ui.go("/console/recipes")
    assert ui.el(f"recipe-{RECIPE}").find_element(By.CLASS_NAME, "verdict").text == "admit"
    ui.shot("recipes")
    ui.submit(ui.el(f"apply-{RECIPE}"))
    dialog = ui.el("confirm-dialog")
    assert f"Apply {RECIPE}?" in dialog.text and "Admission on this host" in dialog.text
    ui.shot("apply-confirm")
    assert controller.status()["state"] == "idle"  # nothing happens before the confirmation
    ui.submit(ui.el("confirm-apply"))
    ui.wait(lambda: "Apply accepted" in ui.text("notice"), 30, "the applied notice")
    ui.read_log()

    # 3. the progress bar moves by itself (server-sent status snapshots; no reload).
    ui.wait(lambda: ui.text("state") in ("starting", "ready"), 300, "the engine to start")
    seen: list[float] = []

    def progressed() -> bool:
        if ui.text("state") == "ready":
            return True
        seen.append(float(ui.el("progress").get_attribute("value") or 0))
        return len(set(seen)) >= 3 and seen == sorted(seen)

    ui.wait(progressed, 300, "the progress bar to advance")
    assert ui.text("state") == "starting", f"ready before the bar was seen moving: {seen}"
    assert len(set(seen)) >= 3, seen
    assert "% of the ready budget" in ui.text("progress-text")
    ui.shot("now-starting")

    # 4. an apply while the start is in progress: refused in words, nothing changed.
    before = controller.status()
    assert before["state"] == "starting"
    ui.go(f"/console/recipes/{OTHER}/apply")
    ui.submit(ui.el("confirm-apply"))
    assert ui.text("problem-title") == "Not applied"
    message = ui.text("problem-message")
    assert "in progress" in message and "Nothing was changed" in message
    ui.shot("apply-refused")
    after = controller.status()
    assert after["recipe"] == RECIPE and after["launch"]["id"] == before["launch"]["id"]
    ui.read_log(expected=("status of 409",))
    ui.go("/console/")

    # 5. ready; the launch with its waterfall and memory picture.
    ui.wait(lambda: ui.text("state") == "ready", START_LIVENESS_S, "the engine to be ready")
    assert "ready in" in ui.text("progress-text")
    assert float(ui.el("progress").get_attribute("value") or 0) == 100.0
    assert len(browser.find_elements(By.CSS_SELECTOR, "#phases li.done")) >= 3  # the steps it went through
    ui.shot("now-ready")
    launch_id = controller.status()["launch"]["id"]
    ui.go("/console/launches")
    row = ui.el(f"launch-{launch_id}")
    assert RECIPE in row.text and "ready" in row.text
    ui.shot("launches")
    ui.submit(row.find_element(By.LINK_TEXT, launch_id))
    waterfall = ui.el("waterfall").find_element(By.TAG_NAME, "svg")
    assert len(waterfall.find_elements(By.CSS_SELECTOR, "rect.bar")) >= 2
    assert ui.el("launch-memory").find_elements(By.TAG_NAME, "polyline")
    ui.shot("launch")
    # the launch's engine log: its tail, and Follow (the current launch's log follows by itself)
    ui.submit(ui.el("log-link"))
    ui.wait(lambda: len(ui.text("log")) > 0, 30, "the engine log")
    ui.wait(lambda: ui.text("follow-state").startswith("following"), 30, "the log to be followed")
    ui.shot("log")
    ui.go("/console/memory")
    assert ui.el("memory-chart").find_elements(By.TAG_NAME, "polyline")
    assert ui.el("memory-chart").find_elements(By.CSS_SELECTOR, "line.marker")  # the launch boundaries
    ui.shot("memory")
    ui.read_log()

    # 5b. benchmarks: the empty state, then a stored bench (written by the real EvalStore into the
    # controller's database, as `appliance bench` does) in the list, its chart and its own page.
    ui.go("/console/benchmarks")
    assert "appliance bench" in ui.text("no-benchmarks")
    bench = _bench("browser-bench", RECIPE, time.time(), durations=(8, 16, 32))
    EvalStore(controller.home / "appliance.sqlite3").add_benchmark(bench)
    ui.go("/console/benchmarks")
    assert len(ui.el("bench-chart").find_elements(By.CSS_SELECTOR, "rect.gbar")) == 3  # a bar per tier
    row = ui.el("bench-browser-bench")
    assert RECIPE in row.text
    ui.shot("benchmarks")
    ui.submit(row.find_element(By.LINK_TEXT, "browser-bench"))
    assert len(browser.find_elements(By.CSS_SELECTOR, "#tiers tr.tier-row")) == 3
    assert len(browser.find_elements(By.CSS_SELECTOR, "circle.dot")) >= 15  # every request of 3 tiers
    ui.shot("benchmark")
    ui.read_log()

    # 6. keys: created and shown once, a forged CSRF token changes nothing, revoked.
    ui.go("/console/keys")
    ui.el("key-name").send_keys("browser-test")
    ui.submit(ui.el("create"))
    key = ui.text("new-key")
    assert key.startswith("sk-")
    ui.shot("key-created")
    ui.go("/console/keys")
    assert key not in browser.page_source
    rows = browser.find_elements(By.CSS_SELECTOR, "tr.key-row")
    assert len(rows) == 1
    browser.execute_script("document.querySelector('#create-key input[name=csrf]').value = 'forged';")
    ui.el("key-name").send_keys("forged")
    ui.submit(ui.el("create"))
    assert ui.text("problem-title") == "Form expired or forged"
    ui.read_log(expected=("status of 403",))
    ui.go("/console/keys")
    assert len(browser.find_elements(By.CSS_SELECTOR, "tr.key-row")) == 1
    revoke = browser.find_element(By.CSS_SELECTOR, "button[id^=revoke-]")
    revoke.click()
    # The script asks before revoking; wait for its dialog rather than assume the click raised it already.
    WebDriverWait(browser, 30).until(expected_conditions.alert_is_present()).accept()
    ui.wait(lambda: "Key revoked" in ui.text("notice"), 30, "the revoked notice")
    assert "revoked" in browser.find_element(By.CSS_SELECTOR, "tr.key-row").text
    ui.shot("keys")
    ui.go("/console/")
    ui.shot("now")
    ui.read_log()

    # 6b. Stop through its confirm page: the engine drains and stops, the controller goes idle.
    ui.submit(ui.el("stop"))
    assert "Drain and stop" in ui.text("confirm-stop")
    ui.submit(ui.el("confirm-stop"))
    ui.wait(lambda: "Stop accepted" in ui.text("notice"), 30, "the stop notice")
    ui.wait(lambda: controller.status()["state"] == "idle", 120, "the engine to stop")
    ui.read_log()

    # 7. no console errors anywhere (CSP violations, script errors, failed loads).
    assert ui.errors == [], ui.errors
    assert {"recipes.png", "apply-confirm.png", "now-ready.png", "launches.png", "launch.png", "memory.png",
            "benchmarks.png", "benchmark.png", "key-created.png", "keys.png"} <= {
        p.name for p in SHOTS.glob("*.png")}
