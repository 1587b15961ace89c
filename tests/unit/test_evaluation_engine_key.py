"""A CLI bench reads the launch's engine key back from the engine's environment (issue 9's
per-launch key: the engine's /v1 answers 401 without it)."""

from __future__ import annotations

import os
import subprocess
import sys

from controller.evaluation.bench import LaunchInfo
from controller.evaluation.engine_key import read_engine_key
from controller.supervisor.engine_key import ENGINE_KEY_ENV


def test_the_key_is_read_from_the_process_runtimes_shim_environment() -> None:
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
