"""The real-engine controller harness the integration tests share.

One real controller process (`appliance serve`, as `appliance up` runs it) with a temporary
`APPLIANCE_HOME` and recipe directory, driven over its HTTP API; recipes that extend a shipped one
with the engine `appliance engine setup` installed, a free port and the persistent test cache root
(<engine home>/cache-tests: only the first run on a machine pays a cold compile). Teardown never
leaves an engine behind: stopped through the API, then by the PID its run directory recorded.
Waits are liveness bounds, never speed assertions.
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
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from controller import admin_token
from controller.settings import Paths, default_home

REPO = Path(__file__).resolve().parents[2]
ENGINE_HOME = default_home()  # where `appliance engine setup` installed the engine
ENGINE = Paths(ENGINE_HOME)
TOKEN = "adm_integration-test"
START_LIVENESS_S = 1500.0  # a cold start on a busy 2-core machine; ~90 s when quiet
RECIPE = "itest-smollm2"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_json(method: str, url: str, body: dict[str, Any] | None = None, timeout: float = 30) -> Any:
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
    extra_args: tuple[str, ...] = ()  # more `appliance serve` options (e.g. --gateway-url URL)

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
             "--no-docker", "--no-kmsg", "--log-level", "warning", *self.extra_args],
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
        return http_json("GET", self.url + path)

    def post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        return http_json("POST", self.url + path, body)

    def status(self) -> dict[str, Any]:
        result: dict[str, Any] = self.get("/status")
        return result

    def wait(self, predicate: Any, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"the controller exited ({self.proc.returncode}) waiting for {what}:\n"
                                     + self.log_tail() + "\nnewest engine log:\n" + self.engine_log_tail())
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}\n" + self.report())
            time.sleep(1.0)

    def report(self) -> str:
        """What a failed wait shows, the most telling part last (CI keeps only the tail of a failure):
        the controller's log, the newest engine log, the newest launches, then the status."""
        status = self.safe_status()
        try:
            launches = [{k: row.get(k) for k in ("id", "status", "ready_s", "diagnosis_code", "exit_signal")}
                        for row in self.get("/launches?limit=4")]
        except (urllib.error.URLError, OSError) as exc:
            launches = [{"error": repr(exc)}]
        brief = status if not isinstance(status, dict) else {
            k: status.get(k) for k in ("state", "recipe", "failures", "last_diagnosis", "blue_green")
        } | {k: (status.get("launch") or {}).get(k) for k in ("id", "phase", "probe_error", "runtime_note")}
        return (f"controller log:\n{self.log_tail()}\nnewest engine log:\n{self.engine_log_tail()}\n"
                f"launches (newest first): {launches}\nstatus: {brief}")

    def engine_log_tail(self, lines: int = 15) -> str:
        runs = sorted((self.home / "runs").glob("*/engine.log"))
        if not runs:
            return "(none)"
        text = runs[-1].read_text(errors="replace").splitlines()[-lines:]
        return f"{runs[-1].parent.name}:\n" + "\n".join(line[:240] for line in text)

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


def require_engine() -> None:
    """Skip when `appliance engine setup` has not installed the CPU engine and its model here."""
    from controller import engine_setup

    if not (ENGINE.engine_python.exists()
            and engine_setup.model_files_present(ENGINE.models / engine_setup.MODEL_DIR_NAME)):
        pytest.skip(f"the CPU engine is not installed under {ENGINE_HOME} (`appliance engine setup`)")


def recipe_dirs(base: Path, *shipped: str) -> tuple[Path, Path]:
    """`base/home` and `base/recipes`, the latter holding copies of the shipped recipes named."""
    home, recipes = base / "home", base / "recipes"
    home.mkdir(parents=True)
    recipes.mkdir(parents=True)
    for name in shipped:
        (recipes / f"{name}.yaml").write_text((REPO / "recipes" / f"{name}.yaml").read_text())
    return home, recipes


def engine_recipe(name: str, extends: str, engine_port: int, **sections: dict[str, Any]) -> str:
    """A recipe extending `extends` on the installed engine (process runtime, the installed model,
    `engine_port`, the persistent test cache root, a ready budget for a loaded 2-core machine);
    `sections` are merged into the recipe's sections of the same name (engine, expect, env...)."""
    from controller import engine_setup

    recipe: dict[str, Any] = {
        "name": name,
        "extends": extends,
        "runtime": {"kind": "process", "python": str(ENGINE.engine_python)},
        "model": {"path": str(ENGINE.models / engine_setup.MODEL_DIR_NAME), "served_name": "smollm2"},
        "engine": {"port": engine_port},
        "cache": {"root": str(ENGINE_HOME / "cache-tests")},
        "expect": {"ready_budget_s": 1500, "stall_window_s": 600},
    }
    for section, values in sections.items():
        recipe.setdefault(section, {}).update(values)
    return yaml.safe_dump(recipe, sort_keys=False)


@contextmanager
def serving(c: Controller) -> Iterator[Controller]:
    """Start the controller; at the end stop its engine through the API (restarting the controller
    if a test left it stopped), stop the controller, and kill by PID any engine still running."""
    c.start()
    try:
        yield c
    finally:
        try:
            if c.proc is None:
                c.start()
            c.post("/stop")
            c.wait(lambda: c.status()["state"] == "idle", 120, "the engine to stop")
        finally:
            c.stop()
            for run in (c.home / "runs").glob("*/engine.pid"):
                pid = json.loads((run.parent / "process.json").read_text()).get("pid")
                if pid and psutil.pid_exists(int(pid)):
                    os.killpg(int(pid), signal.SIGKILL)
