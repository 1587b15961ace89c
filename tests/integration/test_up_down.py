"""`appliance up` and `appliance down` for real: gateway + controller in the background, the CPU
engine started and followed to ready, a completion answered through the gateway with the key `up`
created, then everything stopped by PID.

Free ports and a temporary APPLIANCE_HOME keep it off the ports an operator's appliance uses; the
engine and its warm compile cache are the installed ones (see controller_harness.py).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

from controller.daemons import Daemon
from tests.integration.controller_harness import (
    RECIPE,
    REPO,
    engine_recipe,
    free_port,
    recipe_dirs,
    require_engine,
)

pytestmark = [pytest.mark.engine, pytest.mark.slow]


@pytest.mark.timeout(3600)  # a cold start on a busy shared 2-core machine can take many minutes
def test_up_starts_everything_and_down_stops_it_by_pid(tmp_path: Path) -> None:
    require_engine()
    home, recipes = recipe_dirs(tmp_path, "cpu-smollm2")
    # The same recipe name and cache inputs as test_controller_engine.py: one warm cache variant.
    (recipes / f"{RECIPE}.yaml").write_text(engine_recipe(RECIPE, "cpu-smollm2", free_port()))
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPLIANCE_ADMIN_TOKEN")}
    env.update(APPLIANCE_HOME=str(home), APPLIANCE_RECIPES=str(recipes))
    appliance = [sys.executable, "-m", "controller.cli.main"]
    port, gateway_port = free_port(), free_port()
    try:
        up = subprocess.run(
            [*appliance, "up", "--recipe", RECIPE, "--port", str(port),
             "--gateway-port", str(gateway_port)],
            env=env, cwd=REPO, capture_output=True, text=True, timeout=1800, check=False,
        )
        out = up.stdout
        assert up.returncode == 0, out + up.stderr
        assert re.search(r"export APPLIANCE_ADMIN_TOKEN=adm_\S+", out)  # shown once
        assert f"ready: {RECIPE} at http://127.0.0.1:" in out
        assert re.search(r"\[ *\d+\.\d+s\] .*weights loaded", out)  # the start was shown phase by phase
        # The answer line is JSON, made for parsing: the model's words (any quotes, any language;
        # greedy output differs between CPUs) are never what the test looks at.
        line = next((x for x in out.splitlines() if re.match(r"test +through the gateway: ", x)), None)
        assert line is not None, out
        answer = json.loads(line.split("through the gateway: ", 1)[1])
        assert answer["status"] == 200 and isinstance(answer["answer"], str), out
        assert answer["completion_tokens"] >= 1, out
        # The engine's own door: straight to the engine without its per-launch key → 401 (the
        # gateway path above used it); /health stays open for the probes.
        engine_url = re.search(r"engine +(http://127\.0\.0\.1:\d+)", out)
        assert engine_url, out
        assert _status_of(engine_url.group(1) + "/v1/models") == 401
        assert _status_of(engine_url.group(1) + "/health") == 200
        assert f"curl -s http://127.0.0.1:{gateway_port}/v1/chat/completions" in out
        controller_d, gateway_d = Daemon("controller", home / "run", home / "logs"), \
            Daemon("gateway", home / "run", home / "logs")
        controller, gateway = controller_d.process(), gateway_d.process()
        assert controller is not None and gateway is not None
        engines = [json_pid(p) for p in (home / "runs").glob("*/process.json")]
        assert engines and all(psutil.pid_exists(pid) for pid in engines)
    finally:
        down = subprocess.run([*appliance, "down"], env=env, cwd=REPO, capture_output=True, text=True,
                              timeout=300, check=False)
    assert down.returncode == 0, down.stdout + down.stderr
    assert "controller: stopped" in down.stdout and "gateway: stopped" in down.stdout
    assert not controller.is_running() and not gateway.is_running()
    assert not any(psutil.pid_exists(pid) for pid in engines)
    assert not (home / "run" / "gateway-control.token").exists()  # down leaves no control token


def json_pid(path: Path) -> int:
    return int(json.loads(path.read_text())["pid"])


def _status_of(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=30) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code
