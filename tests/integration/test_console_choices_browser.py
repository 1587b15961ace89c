"""The console's Choices pages in a real headless browser against a real controller process.

test_console_browser.py's Chromium/Selenium rig (Debian's chromium and chromedriver, nothing
downloaded) and its page helper, over a controller started with nothing applied: decision records are
written into its launch store through the real choice store, with real stored runs for the chart, so
no engine starts. In order: the list; one record (the table, the links to the compare records, the
chart, what was not tried); Promote's confirm page (then Cancel: nothing applied); a champion pending
the full run, whose promotion is refused with the reason; "Start a choice" from the form to the plan
with its ETA under the confirm dialog (then Cancel: nothing started); the browser logged no error.
Screenshots land in build/console-screenshots/choices-*.png (gitignored) as test artefacts.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from appliance.evaluation.gate import decide
from controller.evaluation.choice_store import ChoiceStore
from controller.evaluation.store import EvalStore
from tests.integration.controller_harness import (
    TOKEN,
    Controller,
    engine_recipe,
    free_port,
    recipe_dirs,
    require_engine,
    serving,
)
from tests.integration.test_console_browser import Console, browser
from tests.unit.test_console_benchmarks import _bench
from tests.unit.test_console_choices import _record

pytestmark = [pytest.mark.slow]
webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402

__all__ = ["browser"]  # the fixture, shared with test_console_browser.py


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Controller]:
    require_engine()  # its files only: the plan admits recipes on the installed engine; none starts
    home, recipes = recipe_dirs(tmp_path_factory.mktemp("choices"), "cpu-smollm2", "cpu-smollm2-eager")
    for name, extends in (("itest-ch-eager", "cpu-smollm2-eager"), ("itest-ch-graph", "cpu-smollm2")):
        (recipes / f"{name}.yaml").write_text(engine_recipe(name, extends, free_port()))
    with serving(Controller(home, recipes, free_port(), free_port(), recipe=None)) as c:
        evals = EvalStore(c.home / "appliance.sqlite3")
        base = _bench("b-base", "cpu-smollm2", 1_700_000_010.0, durations=(16, 32, 64))
        cand = _bench("b-cand", "cpu-smollm2-eager", 1_700_000_020.0)
        evals.add_comparison("cmp-1", [base], [cand], decide(base, cand))
        evals.close()
        store = ChoiceStore(c.home / "appliance.sqlite3")
        for record in (_record("choice-a"), _record("choice-pending", verdict="accept-pending-full")):
            assert store.claim(record.model_copy(update={"state": "running"})) is None
            store.save(record)
        store.close()
        yield c


@pytest.mark.timeout(600)
def test_the_choices_pages_in_a_real_browser(controller: Controller, browser: WebDriver) -> None:
    ui = Console(browser, controller.url)
    ui.go("/console/choices")
    ui.el("token").send_keys(TOKEN)
    ui.submit(ui.el("login"))
    ui.go("/console/choices")
    assert "choice-a" in ui.text("choices") and "FAST MODE" in ui.text("choices")
    ui.shot("choices-list")

    ui.submit(ui.d.find_element(By.LINK_TEXT, "choice-a"))
    assert "Champion: cpu-smollm2-eager" in ui.text("champion")
    assert ui.el("tournament").find_element(By.CLASS_NAME, "comparison-link").text == "cmp-1"
    assert ui.el("choice-chart").find_element(By.TAG_NAME, "svg").is_displayed()
    assert "cpu-tp2 (not-tried)" in ui.text("not-tried")
    ui.shot("choices-record")

    ui.submit(ui.el("promote"))
    assert "Promote cpu-smollm2-eager?" in ui.text("confirm-dialog")
    assert ui.el("promote-form").find_element(By.NAME, "csrf").get_attribute("value")
    ui.shot("choices-promote-confirm")
    ui.submit(ui.el("cancel"))
    assert controller.status()["state"] == "idle"  # nothing applied without the confirmation

    ui.go("/console/choices/choice-pending")
    assert "needs the full run" in ui.text("promote-refused")
    ui.go("/console/choices/choice-pending/promote")
    assert "compare --full" in ui.text("promote-refused")
    ui.shot("choices-promote-refused")

    ui.go("/console/choices/new")
    recipes = ui.el("f-recipes")
    recipes.clear()
    recipes.send_keys("itest-ch-*")
    ui.el("f-platform").find_element(By.CSS_SELECTOR, "option[value='cpu']").click()
    ui.el("f-sweep").send_keys("max_num_seqs=4,8")
    ui.submit(ui.el("show-plan"))
    assert "Expected duration" in ui.text("plan-eta")
    assert ui.el("plan-itest-ch-eager.sweep.mns8").is_displayed()
    assert "planned" in ui.text("plan-itest-ch-graph.sweep.mns8")
    ui.shot("choices-start-confirm")
    ui.submit(ui.el("cancel"))
    assert controller.get("/choices") and len(controller.get("/choices")) == 2  # nothing started
    ui.read_log()
    assert ui.errors == []
