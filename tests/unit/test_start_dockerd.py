"""scripts/start-dockerd.sh and the PID files a dead daemon leaves behind.

A machine restored from a snapshot (CI's clean clone ran on one) keeps /var/run/docker.pid with
no daemon behind it, and dockerd then refuses to start ("pid file found, ensure docker is not
running"). The script must remove a PID file only when no process of the owning name holds it.

The seam is the script's PATH: `docker` and `dockerd` are stand-ins that behave like the real
ones on exactly this point (dockerd refuses while its PID file exists; docker answers once a
daemon is up). The real daemon is started by the same script at the top of `make test`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "start-dockerd.sh"

DOCKER = """#!/usr/bin/env bash
# answers `docker info` once the stand-in daemon has written its marker
[ "$1" = info ] && [ -f "$FAKE_DIR/up" ] && exit 0
exit 1
"""

DOCKERD = """#!/usr/bin/env bash
# like dockerd: refuses while its PID file exists, else writes it and runs
if [ -f "$DOCKERD_PIDFILE" ]; then
  echo "failed to start daemon: pid file found, ensure docker is not running or delete $DOCKERD_PIDFILE" >&2
  exit 1
fi
echo $$ > "$DOCKERD_PIDFILE"
touch "$FAKE_DIR/up"
exec sleep 30
"""


@pytest.fixture
def shims(tmp_path: Path) -> Iterator[tuple[dict[str, str], Path]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("docker", DOCKER), ("dockerd", DOCKERD)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "FAKE_DIR": str(tmp_path),
        "DOCKERD_PIDFILE": str(tmp_path / "docker.pid"),
        "CONTAINERD_PIDFILE": str(tmp_path / "containerd.pid"),
        "DOCKERD_LOG": str(tmp_path / "dockerd.log"),
        "APPLIANCE_DOCKERD_PIDFILE": str(tmp_path / "appliance-dockerd.pid"),
    }
    yield env, tmp_path
    # the stand-in daemon is stopped by the PID the script recorded, never by pattern
    recorded = tmp_path / "appliance-dockerd.pid"
    if recorded.exists():
        pid = int(recorded.read_text().strip())
        try:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _run(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=90, check=False
    )


def test_stale_pid_files_are_removed_and_the_daemon_starts(
    shims: tuple[dict[str, str], Path],
) -> None:
    env, tmp = shims
    (tmp / "docker.pid").write_text(str(_dead_pid()))
    (tmp / "containerd.pid").write_text(str(os.getpid()))  # alive, but not a containerd
    result = _run(env)
    assert result.returncode == 0, result.stderr
    assert "removing stale" in result.stdout
    assert f"removing stale {tmp / 'containerd.pid'}" in result.stdout
    assert "ready" in result.stdout
    assert not (tmp / "containerd.pid").exists()
    # the new daemon wrote its own PID file, which the script recorded for stopping by PID
    assert (tmp / "docker.pid").read_text().strip() == (
        (tmp / "appliance-dockerd.pid").read_text().strip()
    )


def test_without_the_cleanup_the_stand_in_refuses_like_dockerd(
    shims: tuple[dict[str, str], Path],
) -> None:
    """The stand-in is faithful on the point under test: a stale file stops it."""
    env, tmp = shims
    (tmp / "docker.pid").write_text(str(_dead_pid()))
    refused = subprocess.run(["dockerd"], env=env, capture_output=True, text=True, check=False)
    assert refused.returncode == 1
    assert "pid file found" in refused.stderr


def test_a_pid_file_held_by_a_live_daemon_is_kept(shims: tuple[dict[str, str], Path]) -> None:
    env, tmp = shims
    # a live process whose name is "dockerd": a copy of sleep under that name
    fake_daemon = tmp / "live" / "dockerd"
    fake_daemon.parent.mkdir()
    sleep = shutil.which("sleep")
    assert sleep is not None
    shutil.copy(sleep, fake_daemon)
    live = subprocess.Popen([str(fake_daemon), "30"])
    try:
        (tmp / "docker.pid").write_text(str(live.pid))
        result = _run(env)
        assert result.returncode == 1
        assert f"dockerd (pid {live.pid}" in result.stderr
        assert "does not answer" in result.stderr
        assert (tmp / "docker.pid").read_text() == str(live.pid)
        assert not (tmp / "up").exists()
    finally:
        live.kill()
        live.wait()
