"""The warm-cache restart flow with the real CPU engine (ARCHITECTURE "Warm-cache restart").

A recipe with `expect.warm_restart: true`, applied with `fresh_cache` (its variant cache root is
emptied): the controller starts it cold, waits for ready, restarts it on the same root, and only the
second start is served. Both launches are recorded; the cold one's log shows a compile-cache miss,
the warm one's a hit (`fx graph cache hit` / `AOTAutograd cache hit`, visible with TORCH_LOGS on
those two loggers — docs/engine-cpu.md), and that is what the records say.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.test_controller_engine import (
    ENGINE,
    ENGINE_HOME,
    REPO,
    START_LIVENESS_S,
    Controller,
    _free_port,
)

pytestmark = [pytest.mark.engine, pytest.mark.slow]
WARM = "itest-warm-smollm2"


@pytest.fixture
def controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Controller]:
    from controller import engine_setup

    if not (ENGINE.engine_python.exists()
            and engine_setup.model_files_present(ENGINE.models / engine_setup.MODEL_DIR_NAME)):
        pytest.skip(f"the CPU engine is not installed under {ENGINE_HOME}")
    base = tmp_path_factory.mktemp("warm")
    home, recipes = base / "home", base / "recipes"
    home.mkdir()
    recipes.mkdir()
    (recipes / "cpu-smollm2.yaml").write_text((REPO / "recipes" / "cpu-smollm2.yaml").read_text())
    engine_port = _free_port()
    (recipes / f"{WARM}.yaml").write_text(
        f"name: {WARM}\nextends: cpu-smollm2\n"
        f"runtime:\n  kind: process\n  python: {ENGINE.engine_python}\n"
        f"model:\n  path: {ENGINE.models / engine_setup.MODEL_DIR_NAME}\n  served_name: smollm2\n"
        f"engine:\n  port: {engine_port}\n"
        f"cache:\n  root: {ENGINE_HOME / 'cache-tests'}\n"
        "env:\n  vars:\n"
        "    TORCH_LOGS: torch._inductor.codecache,torch._functorch._aot_autograd.autograd_cache\n"
        "expect:\n  ready_budget_s: 1500\n  stall_window_s: 600\n  warm_restart: true\n"
    )
    c = Controller(home, recipes, _free_port(), engine_port, recipe=None)
    c.start()
    try:
        yield c
    finally:
        try:
            c.post("/stop")
            c.wait(lambda: c.status()["state"] == "idle", 120, "the engine to stop")
        finally:
            c.stop()


@pytest.mark.timeout(3600)
def test_a_warm_restart_recipe_starts_cold_then_warm_and_records_both(controller: Controller) -> None:
    # Whatever the cache held before, start from an empty root: the flow must run cold → warm.
    controller.post("/apply", {"recipe": WARM, "fresh_cache": True})
    status = controller.wait_ready(START_LIVENESS_S)
    assert status["launch"]["kind"] == "warm"
    launches = controller.get(f"/launches?recipe={WARM}&limit=2")
    warm, cold = launches[0], launches[1]
    assert (cold["kind"], cold["status"], cold["cache"]) == ("cold-warmup", "stopped", "miss"), cold
    assert (warm["kind"], warm["status"], warm["cache"]) == ("warm", "ready", "hit"), warm
    assert cold["ready_s"] > 0 and warm["ready_s"] > 0
    events = [e["kind"] for e in controller.get(f"/launches/{cold['id']}")["events"]]
    assert "warmup-ready" in events
    assert "warm-restart-miss" not in [e["kind"] for e in controller.get(f"/launches/{warm['id']}")["events"]]
