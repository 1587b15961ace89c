"""A containerised controller (compose.yaml) starts the engine as a sibling container: the bind
sources it computes are paths in its own mount namespace and must become the daemon's host paths."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from appliance.recipe.launch_spec import LaunchSpec, Mount
from controller.runtime.docker import (
    DockerRuntime,
    container_create_kwargs,
    own_container_id,
    translate_source,
)

CID = "3f" * 32
MOUNTINFO_IN_CONTAINER = f"""\
1046 873 0:52 / / rw,relatime master:304 - overlay overlay rw,lowerdir=/var/lib/docker/overlay2/l/X
1050 1046 254:0 /var/lib/docker/volumes/appliance-home/_data /var/lib/appliance rw,relatime - ext4 /dev/vda rw
1051 1046 254:0 /var/lib/docker/containers/{CID}/resolv.conf /etc/resolv.conf rw,relatime - ext4 /dev/vda rw
1052 1046 254:0 /var/lib/docker/containers/{CID}/hostname /etc/hostname rw,relatime - ext4 /dev/vda rw
"""
MOUNTINFO_ON_HOST = "22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
HOST_MOUNTS = [
    ("/var/lib/appliance", "/var/lib/docker/volumes/appliance-home/_data"),
    ("/var/run/docker.sock", "/var/run/docker.sock"),
]


def test_own_container_id_from_mountinfo() -> None:
    assert own_container_id(MOUNTINFO_IN_CONTAINER) == CID
    assert own_container_id(MOUNTINFO_ON_HOST) is None


def test_paths_under_a_volume_become_the_volumes_host_path() -> None:
    vol = "/var/lib/docker/volumes/appliance-home/_data"
    assert translate_source("/var/lib/appliance/models/m", HOST_MOUNTS) == f"{vol}/models/m"
    assert translate_source("/var/lib/appliance", HOST_MOUNTS) == vol
    # a sibling path that merely shares the prefix is not under the mount
    assert translate_source("/var/lib/appliance-other/x", HOST_MOUNTS) == "/var/lib/appliance-other/x"
    assert translate_source("/opt/models", HOST_MOUNTS) == "/opt/models"
    assert translate_source("/var/lib/appliance/x", []) == "/var/lib/appliance/x"  # on a host


def test_longest_mount_wins() -> None:
    mounts = [("/a", "/h/a"), ("/a/b", "/h/b")]
    assert translate_source("/a/b/c", mounts) == "/h/b/c"
    assert translate_source("/a/c", mounts) == "/h/a/c"


def spec() -> LaunchSpec:
    return LaunchSpec.model_validate({
        "recipe": "cpu-smollm2-docker", "spec_hash": "0123456789abcdef", "platform": "cpu",
        "runtime": "docker", "image": "appliance/cpu-vllm:0.32.0", "argv": ("python", "-m", "x"),
        "port": 8000, "served_model_name": "smollm2", "cache_root": "/var/lib/appliance/cache/v",
        "ready_budget_s": 600, "stall_window_s": 300, "network_mode": "host", "env": {},
        "mounts": (Mount(source="/var/lib/appliance/models/m", target="/models/m", read_only=True),
                   Mount(source="/var/lib/appliance/cache/v", target="/var/lib/appliance/cache/v")),
    })


def test_create_kwargs_bind_the_host_paths_at_the_paths_the_engine_expects() -> None:
    vol = "/var/lib/docker/volumes/appliance-home/_data"
    kwargs = container_create_kwargs(spec(), "L1", host_mounts=HOST_MOUNTS)
    assert kwargs["volumes"] == [f"{vol}/models/m:/models/m:ro",
                                 f"{vol}/cache/v:/var/lib/appliance/cache/v:rw"]
    assert container_create_kwargs(spec(), "L1")["volumes"] == [
        "/var/lib/appliance/models/m:/models/m:ro",
        "/var/lib/appliance/cache/v:/var/lib/appliance/cache/v:rw"]


class _Api:
    def __init__(self) -> None:
        self.asked: list[str] = []

    def inspect_container(self, ref: str) -> dict[str, Any]:
        self.asked.append(ref)
        return {"Mounts": [
            {"Type": "volume", "Destination": "/var/lib/appliance",
             "Source": "/var/lib/docker/volumes/appliance-home/_data"},
            {"Type": "tmpfs", "Destination": "/run", "Source": ""},
        ]}


class _Client:
    def __init__(self) -> None:
        self.api = _Api()


def test_runtime_looks_up_its_own_mounts_once(tmp_path: Path) -> None:
    client = _Client()
    rt = DockerRuntime(client)  # type: ignore[arg-type]  # a fake at the declared seam
    rt.mountinfo = tmp_path / "mountinfo"
    rt.mountinfo.write_text(MOUNTINFO_IN_CONTAINER)
    expected = [("/var/lib/appliance", "/var/lib/docker/volumes/appliance-home/_data")]
    assert rt.host_mounts() == expected
    assert rt.host_mounts() == expected
    assert client.api.asked == [CID]


def test_runtime_on_a_host_translates_nothing(tmp_path: Path) -> None:
    client = _Client()
    rt = DockerRuntime(client)  # type: ignore[arg-type]
    rt.mountinfo = tmp_path / "mountinfo"
    rt.mountinfo.write_text(MOUNTINFO_ON_HOST)
    assert rt.host_mounts() == []
    assert client.api.asked == []


def test_host_network_engine_port_taken_is_refused_before_anything_is_created() -> None:
    import socket

    import pytest

    from controller.runtime.base import EngineRuntimeError

    class NoCreate:
        def __getattr__(self, name: str) -> Any:
            raise AssertionError(f"the daemon must not be asked anything ({name})")

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        s = spec().model_copy(update={"port": port, "host": "127.0.0.1"})
        with pytest.raises(EngineRuntimeError, match=rf"^port 127.0.0.1:{port} is already in use"):
            DockerRuntime(NoCreate()).start(s, "L1")  # type: ignore[arg-type]
