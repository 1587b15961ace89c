"""`appliance choose` against the real vLLM CPU engine, through a real controller, in FAST MODE.

The smallest real tournament: two CPU recipes narrowed with --recipes (the rest of the platform's
recipes are lines of the record, not tried), an eager baseline and a candidate whose context is half
the baseline's — as in test_evaluation_engine.py's compare, its long-tier requests fail mid-run, so
its gate ends at the first five (no re-runs, no candidate accuracy run: the shortest real gate).
The record's structure is asserted — every line with its status, the gate's steps in the stored
compare record, the champion and why, the host back on the recipe that was serving — never the
model's words or timings.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.integration.controller_harness import (
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

pytestmark = [pytest.mark.engine, pytest.mark.slow]
BASE, SHORT = "itest-choose-eager", "itest-choose-short"


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Controller]:
    require_engine()
    home, recipes = recipe_dirs(tmp_path_factory.mktemp("choose"), "cpu-smollm2", "cpu-smollm2-eager")
    engine_port = free_port()
    (recipes / f"{BASE}.yaml").write_text(engine_recipe(
        BASE, "cpu-smollm2-eager", engine_port, engine={"max_model_len": 1024},
        expect={"reproducibility": "bitwise"},
    ))
    # Half the baseline's context: the baseline-planned 16-32K tier cannot fit → its gate fails early.
    (recipes / f"{SHORT}.yaml").write_text(f"name: {SHORT}\nextends: {BASE}\nengine:\n  max_model_len: 512\n")
    with serving(Controller(home, recipes, free_port(), engine_port, recipe=BASE)) as c:
        yield c


def _cli(c: Controller, *args: str, timeout: float = 3000) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "APPLIANCE_HOME": str(c.home), "APPLIANCE_ADMIN_TOKEN": TOKEN,
           "APPLIANCE_RECIPES": str(c.recipes)}
    return subprocess.run([sys.executable, "-m", "controller.cli.main", *args, "--api", c.url], env=env,
                          cwd=REPO, capture_output=True, text=True, timeout=timeout)


@pytest.mark.timeout(3600)
def test_choose_in_fast_mode_gates_the_candidate_and_returns_to_the_baseline(controller: Controller) -> None:
    controller.wait_ready(START_LIVENESS_S)
    plan = _cli(controller, "choose", "--recipes", "itest-choose-*", "--baseline", BASE, "--fast",
                "--platform", "cpu", "--plan")
    assert plan.returncode == 0, plan.stderr
    assert "FAST MODE" in plan.stdout and "expected duration" in plan.stdout

    r = _cli(controller, "choose", "--recipes", "itest-choose-*", "--baseline", BASE, "--fast", "--platform",
             "cpu", "--yes", "--json", "--ready-timeout", "1500")
    assert r.returncode == 0, r.stderr + r.stdout
    record = json.loads(r.stdout)
    assert record["fast"] is True and record["state"] == "done", record
    lines = {x["recipe"]: x for x in record["lines"]}
    assert lines[BASE]["status"] == "baseline"
    cand = lines[SHORT]
    # the candidate was gated against the baseline: a stored compare, a verdict, a loss (its long tier failed)
    assert (cand["status"], cand["against"], cand["verdict"]) == ("lost", BASE, "reject"), cand
    assert cand["comparison_id"] and cand["took_s"] is not None and cand["eta_s"] is not None
    # the other recipes of the platform are lines too, each with why it was not tried
    for name in ("cpu-smollm2", "cpu-smollm2-eager"):
        assert lines[name]["status"] == "not-tried" and "pattern" in lines[name]["why"]
    assert (record["champion"], record["champion_verdict"]) == (BASE, None)
    assert record["champion_why"].startswith("the baseline")
    # the host is back on the recipe that was serving (no --promote)
    assert record["serving_before"] == BASE and record["restored"] == BASE and record["promoted"] is None
    status = controller.status()
    assert (status["state"], status["recipe"]) == ("ready", BASE)

    stored = {c["id"]: c for c in controller.get("/comparisons")}
    assert stored[cand["comparison_id"]]["verdict"] == "reject"
    md = _cli(controller, "choices", record["id"], "--markdown")
    assert md.returncode == 0 and "FAST MODE" in md.stdout and f"| {SHORT} |" in md.stdout
    listed = _cli(controller, "choices")
    assert record["id"] in listed.stdout and "FAST" in listed.stdout
