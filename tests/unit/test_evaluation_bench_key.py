"""A CLI bench reads the launch's engine key back from where the runtime put it (the
per-launch key: the engine's /v1 answers 401 without it): now the launch's key file in
its run directory (found through the shim's `--status` argument), before that the environment."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from appliance.engine_secret import KEY_FILE_NAME, config_yaml
from appliance.recipe.engine_key import ENGINE_KEY_ENV
from controller.evaluation.bench import LaunchInfo
from controller.evaluation.bench_key import read_engine_key


def test_the_key_is_read_from_the_launchs_key_file_next_to_the_shims_status(tmp_path: Path) -> None:
    run_dir = tmp_path / "L1"
    run_dir.mkdir()
    (run_dir / KEY_FILE_NAME).write_text(config_yaml("eng_from_the_file"))
    shim = subprocess.Popen(
        [sys.executable, "-c", "import sys; print('up', flush=True); sys.stdin.read()",
         "--status", str(run_dir / "exit_status.json")],
        env={**os.environ, ENGINE_KEY_ENV: "eng_not_this_one"},
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert shim.stdout is not None
        assert shim.stdout.readline() == "up\n"
        assert read_engine_key({"runtime": "process", "ref": str(shim.pid)}) == "eng_from_the_file"
    finally:
        shim.kill()
        shim.communicate()


def test_the_key_of_an_engine_started_before_issue_19_is_read_from_the_shim_environment() -> None:
    env = {**os.environ, ENGINE_KEY_ENV: "eng_test_secret"}
    # Popen returns once the child's execve has closed its close-on-exec fds, but the kernel sets
    # the new image's environment bounds a moment later: until then /proc/PID/environ reads empty
    # (the key "missing"). The child's first line is written by its own code, after execve ended.
    shim = subprocess.Popen(
        [sys.executable, "-c", "import sys; print('up', flush=True); sys.stdin.read()"],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert shim.stdout is not None
        assert shim.stdout.readline() == "up\n"
        assert read_engine_key({"runtime": "process", "ref": str(shim.pid)}) == "eng_test_secret"
    finally:
        shim.kill()
        shim.communicate()
    assert read_engine_key({"runtime": "process", "ref": str(shim.pid)}) is None  # gone: unknown
    assert read_engine_key({"runtime": "process", "ref": None}) is None


def test_the_key_never_shows_in_a_launch_infos_repr() -> None:
    info = LaunchInfo(launch_id="L1", recipe="r", spec_hash=None, cache_vintage=None, cache_root=None,
                      engine_url="http://127.0.0.1:1", engine_key="eng_test_secret")
    assert "eng_test_secret" not in repr(info)
