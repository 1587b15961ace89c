"""Container runtime checks (DOMAIN §3): cgroup version/driver, and no memory limit above the engine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from appliance.runtimes.base import Placement
from host_setup.commands import CommandResult
from host_setup.container_runtime import docker_info_via, plan_runtime, read_runtime_state
from host_setup.fixture_commands import FixtureCommands
from host_setup.model import Finding, HostSetupError, Severity
from tests.fixtures.host_setup.tree import Host, make_host, set_text

PLACEMENT = {"docker": Placement.LOCAL_DAEMON, "process": Placement.LOCAL_PROCESS}


@pytest.fixture
def host(tmp_path: Path) -> Host:
    return make_host(tmp_path)


def check(
    host: Host, info: dict[str, Any] | None = None, runtime: str = "docker", own: int | None = None
) -> list[Finding]:
    state = read_runtime_state(
        host.root, PLACEMENT[runtime], (lambda: info) if info else None, own
    )
    return plan_runtime(state, no_limit_required=True)


def by(items: list[Finding], severity: Severity) -> list[str]:
    return [f.message for f in items if f.severity is severity]


def test_docker_info_gives_version_and_driver(host: Host) -> None:
    items = check(host, {"CgroupVersion": "2", "CgroupDriver": "systemd"})
    assert "docker: cgroup v2, systemd (docker info)" in by(items, Severity.INFO)
    assert by(items, Severity.OK) == [
        "the engine container gets no memory limit (none in the launch, none on /system.slice)"
    ]
    assert any("counts page cache" in m for m in by(items, Severity.INFO))


def test_a_limit_on_the_slice_containers_go_to_is_a_warning(host: Host) -> None:
    set_text(host.root, "/sys/fs/cgroup/system.slice/memory.max", f"{32 * 1024**3}\n")
    (warning,) = [
        f
        for f in check(host, {"CgroupVersion": "2", "CgroupDriver": "systemd"})
        if f.severity is Severity.WARN
    ]
    assert "created under /system.slice, limited to 32.00 GiB" in warning.message
    assert "MemoryMax" in warning.fix and "page cache" in warning.why


def test_cgroup_v1_cgroupfs_reads_the_docker_parent(host: Host) -> None:
    (host.root.sys / "fs/cgroup/cgroup.controllers").unlink()
    set_text(
        host.root, "/sys/fs/cgroup/memory/docker/memory.limit_in_bytes", "9223372036854771712\n"
    )  # "none"
    items = check(host)
    assert "docker: cgroup v1, cgroupfs (/sys/fs/cgroup, daemon.json)" in by(items, Severity.INFO)
    assert by(items, Severity.WARN) == []
    set_text(host.root, "/sys/fs/cgroup/memory/docker/memory.limit_in_bytes", f"{16 * 1024**3}\n")
    assert any("/docker, limited to 16.00 GiB" in m for m in by(check(host), Severity.WARN))


def test_the_daemon_json_driver_and_cgroup_parent_are_honoured(host: Host) -> None:
    set_text(
        host.root,
        "/etc/docker/daemon.json",
        json.dumps({"exec-opts": ["native.cgroupdriver=cgroupfs"], "cgroup-parent": "/engines"}),
    )
    set_text(host.root, "/sys/fs/cgroup/engines/memory.max", f"{48 * 1024**3}\n")
    items = check(host)
    assert "docker: cgroup v2, cgroupfs (/sys/fs/cgroup, daemon.json)" in by(items, Severity.INFO)
    assert any("/engines, limited to 48.00 GiB" in m for m in by(items, Severity.WARN))


def test_docker_info_failing_falls_back_to_the_files_and_says_so(host: Host) -> None:
    def broken() -> dict[str, Any]:
        raise HostSetupError("Cannot connect to the Docker daemon at unix:///var/run/docker.sock")

    state = read_runtime_state(host.root, Placement.LOCAL_DAEMON, broken, None)
    assert (state.cgroup_version, state.cgroup_driver) == (2, "systemd")
    items = plan_runtime(state, True)
    assert any("Cannot connect to the Docker daemon" in m for m in by(items, Severity.WARN))


def test_a_process_engine_inherits_the_controllers_cgroup_limit(host: Host) -> None:
    items = check(host, runtime="process", own=32 * 1024**3)
    assert by(items, Severity.WARN) == [
        "the controller runs in a cgroup limited to 32.00 GiB; the engine process inherits it"
    ]
    assert by(check(host, runtime="process", own=None), Severity.WARN) == []


def test_docker_info_goes_through_the_command_seam(host: Host) -> None:
    runner = FixtureCommands(
        host.root,
        canned={
            "docker": CommandResult(("docker",), 0, '{"CgroupVersion":"1","CgroupDriver":"cgroupfs"}', "")
        },
    )
    assert docker_info_via(runner)() == {"CgroupVersion": "1", "CgroupDriver": "cgroupfs"}
    assert runner.calls == [("docker", "info", "--format", "{{json .}}")]
