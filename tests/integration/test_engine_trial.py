"""bench.engine_trial (the cold-vs-warm measuring harness behind MEASURED.md) on the stand-in.

The harness starts the rendered default recipe once, times /health to ready, probes /v1/models and
a chat, and stops the engine by PID. The real engine's cold→warm proof is the warm-restart test
(tests/integration/test_warm_restart.py, one pair of real starts through the controller); here the
seam is `engine_cpu.launch_spec`: the stand-in engine's recipe, rendered by the real `render()` with
the trial's cache root, so every step of the harness runs for real in seconds.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from appliance.recipe.launch_spec import LaunchSpec
from appliance.recipe.recipe_loader import parse_recipes
from appliance.recipe.render import render
from bench import engine_cpu, engine_trial
from tests.integration.runtime_specs import RECIPE_NAME, SERVED_NAME, facts, standin_recipe


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import yaml

    def launch_spec(cache_root: Path | None = None, *, port: int | None = None, **_: object) -> LaunchSpec:
        assert port is not None
        text = yaml.safe_dump(standin_recipe("process", port), sort_keys=False)
        recipe = parse_recipes({f"{RECIPE_NAME}.yaml": text})[RECIPE_NAME]
        return render(recipe, facts(tmp_path / "home"),
                      cache_root=str(cache_root) if cache_root is not None else None)

    monkeypatch.setattr(engine_cpu, "launch_spec", launch_spec)


@pytest.mark.usefixtures("standin")
def test_a_trial_starts_times_probes_and_stops_the_engine_by_pid(tmp_path: Path) -> None:
    cache, log, metrics = tmp_path / "c", tmp_path / "trial" / "cold.log", tmp_path / "metrics.txt"
    result = engine_trial.run_trial(cache, log, _free_port(), {"TRIAL_MARK": "1"}, metrics, budget=60)
    assert result.get("ready_seconds") is not None, log.read_text()[-2000:]
    assert result["models_status"] == 200 and result["chat_status"] == 200
    assert isinstance(result["models_body"], dict)
    assert [m["id"] for m in result["models_body"]["data"]] == [SERVED_NAME]
    assert result["env"] == {"TRIAL_MARK": "1"}
    # the spec's cache directories were created under the trial's root before the start
    assert (cache / "tmp").is_dir() and (cache / "inductor").is_dir()
    argv = result["argv"]
    assert isinstance(argv, list) and argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    # stopped by the PID it recorded: every process gone, the pid file removed
    pids = result["pids"]
    assert isinstance(pids, list) and pids
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not log.with_suffix(".pid").exists()
    assert log.read_text()  # the engine's output was kept


@pytest.mark.usefixtures("standin")
def test_an_engine_that_exits_before_ready_is_reported_with_its_code(tmp_path: Path) -> None:
    port = _free_port()
    with socket.socket() as holder:  # the port is taken: the engine cannot bind and exits
        holder.bind(("127.0.0.1", port))
        holder.listen()
        result = engine_trial.run_trial(tmp_path / "c", tmp_path / "x.log", port, {}, None, budget=60)
    assert result["ready_seconds"] is None
    assert result.get("exit_code") not in (None, 0)
