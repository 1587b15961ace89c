"""DockerRuntime without a daemon: the create arguments (dict equality, docker-py style), the State →
ExitInfo mapping, and error translation through the injected client (the declared seam)."""

from __future__ import annotations

from typing import Any

import docker
import docker.errors
import docker.models.containers
import pydantic
import pytest
import requests

from appliance.recipe.launch_spec import LaunchSpec, Mount, Ulimit
from controller.runtime import make_runtime
from controller.runtime.base import EngineHandle, EngineRuntimeError, ExitInfo
from controller.runtime.docker import (
    DockerRuntime,
    _parse_docker_time,
    container_create_kwargs,
    exit_info,
)
from controller.runtime.ports import PortInUse
from tests.unit.spec_helpers import with_runtime

GFX906_IMAGE = "registry.local/vllm-gfx906:0.18-dtk26.04"


def gfx906_spec(**extra: Any) -> LaunchSpec:
    """Shaped like recipe C (DOMAIN §2): sourced env files, TP=4 devices, memlock unlimited."""
    fields: dict[str, Any] = {
        "recipe": "qwen27b-tp4-graph",
        "spec_hash": "abcdef0123456789",
        "platform": "gfx906",
        "runtime": "docker",
        "image": GFX906_IMAGE,
        "argv": (
            "python",
            "-c",
            "import torch; from vllm.entrypoints.cli.main import main; main()",
            "serve",
            "/m",
        ),
        "source_files": ("/opt/dtk/env.sh", "/src/tools/dcu/env.sh"),
        "env": {"HIP_VISIBLE_DEVICES": "0,1,2,3", "VLLM_LOGGING_LEVEL": "INFO"},
        "mounts": (
            Mount(source="/data/models/q27", target="/m", read_only=True),
            Mount(source="/c", target="/c"),
        ),
        "devices": ("/dev/kfd", "/dev/dri"),
        "group_add": ("video", "render"),
        "ipc_mode": "host",
        "shm_size": "16g",
        "network_mode": "bridge",
        "security_opt": ("seccomp=unconfined",),
        "ulimits": (
            Ulimit(name="memlock", soft=-1, hard=-1),
            Ulimit(name="stack", soft=67108864, hard=67108864),
        ),
        "published_ports": {8000: 8000},
        "labels": {"team": "serving"},
        "port": 8000,
        "served_model_name": "qwen3.8-27b",
        "cache_root": "/c/vllm",
        "ready_budget_s": 2700,
        "stall_window_s": 600,
    }
    fields.update(extra)
    return LaunchSpec.model_validate(fields)


def test_create_kwargs_are_exactly_the_spec() -> None:
    kwargs = container_create_kwargs(gfx906_spec(), "L1")
    assert kwargs == {
        "image": GFX906_IMAGE,
        "name": "appliance-L1",
        "entrypoint": ["bash"],
        "command": [
            "-c",
            '. /opt/dtk/env.sh && . /src/tools/dcu/env.sh && exec "$@"',
            "engine",
            "python",
            "-c",
            "import torch; from vllm.entrypoints.cli.main import main; main()",
            "serve",
            "/m",
        ],
        "environment": {"HIP_VISIBLE_DEVICES": "0,1,2,3", "VLLM_LOGGING_LEVEL": "INFO"},
        "labels": {
            "team": "serving",
            "appliance.managed": "true",
            "appliance.launch_id": "L1",
            "appliance.recipe": "qwen27b-tp4-graph",
            "appliance.spec_hash": "abcdef0123456789",
        },
        "volumes": ["/data/models/q27:/m:ro", "/c:/c:rw"],
        "devices": ["/dev/kfd", "/dev/dri"],
        "group_add": ["video", "render"],
        "security_opt": ["seccomp=unconfined"],
        "ulimits": [
            {"Name": "memlock", "Soft": -1, "Hard": -1},
            {"Name": "stack", "Soft": 67108864, "Hard": 67108864},
        ],
        "restart_policy": {"Name": "no"},
        "detach": True,
        "ipc_mode": "host",
        "shm_size": "16g",
        "network_mode": "bridge",
        "ports": {"8000/tcp": ("127.0.0.1", 8000)},
    }


def test_never_a_memory_limit() -> None:
    # DOMAIN §3: a cgroup limit counts page cache and killed TP=4; `--memory=0` later means "unchanged".
    kwargs = container_create_kwargs(gfx906_spec(), "L1")
    assert not {"mem_limit", "memswap_limit", "mem_reservation", "kernel_memory"} & kwargs.keys()


def test_ports_publish_address_is_configurable_and_host_network_publishes_nothing() -> None:
    assert container_create_kwargs(gfx906_spec(), "L1", "0.0.0.0")["ports"] == {"8000/tcp": ("0.0.0.0", 8000)}
    assert "ports" not in container_create_kwargs(gfx906_spec(network_mode="host"), "L1")


def test_minimal_spec_leaves_daemon_defaults_alone() -> None:
    spec = gfx906_spec(
        source_files=(),
        mounts=(),
        devices=(),
        group_add=(),
        ipc_mode=None,
        shm_size=None,
        network_mode=None,
        security_opt=(),
        ulimits=(),
        published_ports={},
        labels={},
        workdir="/work",
    )
    kwargs = container_create_kwargs(spec, "L2")
    assert kwargs["entrypoint"] == ["python"]
    assert kwargs["command"] == [
        "-c",
        "import torch; from vllm.entrypoints.cli.main import main; main()",
        "serve",
        "/m",
    ]
    assert kwargs["working_dir"] == "/work"
    assert not {"ipc_mode", "shm_size", "network_mode", "ports"} & kwargs.keys()


@pytest.mark.parametrize(
    ("gpus", "request_"),
    [
        ("all", {"Driver": "", "Count": -1, "DeviceIDs": [], "Capabilities": [["gpu"]], "Options": {}}),
        ("2", {"Driver": "", "Count": 2, "DeviceIDs": [], "Capabilities": [["gpu"]], "Options": {}}),
        (
            "device=0,3",
            {"Driver": "", "Count": 0, "DeviceIDs": ["0", "3"], "Capabilities": [["gpu"]], "Options": {}},
        ),
    ],
)
def test_nvidia_gpus_become_a_device_request(gpus: str, request_: dict[str, Any]) -> None:
    kwargs = container_create_kwargs(gfx906_spec(platform="cuda", gpus=gpus), "L1")
    assert kwargs["device_requests"] == [request_]
    assert "device_requests" not in container_create_kwargs(gfx906_spec(), "L1")
    with pytest.raises(EngineRuntimeError, match="--gpus syntax"):
        container_create_kwargs(gfx906_spec(gpus="many"), "L1")


def test_spec_without_image_or_bad_launch_id_is_rejected() -> None:
    # A docker launch without an image cannot even be built (LaunchSpec.runtime is DockerLaunch).
    with pytest.raises(pydantic.ValidationError, match=r"runtime\.docker\.image"):
        gfx906_spec(image=None)
    with pytest.raises(EngineRuntimeError, match="container name"):
        container_create_kwargs(gfx906_spec(), "a/b")


def state(status: str, oom: bool = False, code: int = 0) -> dict[str, Any]:
    return {"Status": status, "Running": status == "running", "OOMKilled": oom, "ExitCode": code}


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        (state("running"), ExitInfo(running=True, oom_killed=False)),
        # A TP worker killed by the cgroup OOM killer while PID 1 lives: already visible.
        (state("running", oom=True), ExitInfo(running=True, oom_killed=True)),
        (state("exited"), ExitInfo(running=False, exit_code=0, oom_killed=False)),
        (state("exited", code=3), ExitInfo(running=False, exit_code=3, oom_killed=False)),
        (state("exited", code=134), ExitInfo(running=False, exit_code=134, signal=6, oom_killed=False)),
        (
            state("exited", oom=True, code=137),
            ExitInfo(running=False, exit_code=137, signal=9, oom_killed=True),
        ),
        (state("exited", code=255), ExitInfo(running=False, exit_code=255, oom_killed=False)),
        (state("created"), ExitInfo(running=False, oom_killed=False)),  # never started: no exit code
    ],
)
def test_exit_info_from_state(state: dict[str, Any], expected: ExitInfo) -> None:
    assert exit_info(state) == expected


def test_docker_timestamps_with_nanoseconds() -> None:
    assert _parse_docker_time("2026-11-29T07:21:40.84406198Z") == pytest.approx(
        1795936900.844061, abs=1e-6
    )  # truncated to µs
    assert _parse_docker_time("2026-11-29T07:21:40Z") == 1795936900.0
    with pytest.raises(ValueError):
        _parse_docker_time("yesterday")


# -- error translation through a fake client -------------------------------------------------------


class FakeContainer:
    def __init__(self, start_error: Exception | None, *, has_run: bool = True) -> None:
        self.start_error = start_error
        self.removed = False
        self.started = False
        self.has_run = has_run  # an image without /run (busybox) answers NotFound for it
        self.archives: list[tuple[str, bytes]] = []  # (path, tar) uploaded before the start
        self.name = "appliance-L1"
        self.id = "c0ffee"
        self.short_id = "c0ffee"
        self.attrs: dict[str, Any] = {"State": {"StartedAt": "2026-11-29T07:21:40.5Z"}}

    def put_archive(self, path: str, data: bytes) -> bool:
        assert not self.started, "files go in before the start"
        if path == "/run" and not self.has_run:
            raise docker.errors.NotFound("Could not find the file /run in container appliance-L1")
        self.archives.append((path, data))
        return True

    def start(self) -> None:
        self.started = True
        if self.start_error is not None:
            raise self.start_error

    def reload(self) -> None:
        pass

    def remove(self, force: bool = False) -> None:
        self.removed = force


class FakeImages:
    def __init__(self, present: bool) -> None:
        self.present = present

    def get(self, name: str) -> object:
        if not self.present:
            raise docker.errors.ImageNotFound(f"No such image: {name}")
        return object()


class FakeContainers:
    def __init__(self, start_error: Exception | None, has_run: bool = True) -> None:
        self.made: list[FakeContainer] = []
        self.created_with: list[dict[str, Any]] = []
        self.start_error = start_error
        self.has_run = has_run

    def create(self, **kwargs: Any) -> FakeContainer:
        assert "mem_limit" not in kwargs
        self.created_with.append(kwargs)
        self.made.append(FakeContainer(self.start_error, has_run=self.has_run))
        return self.made[-1]

    def get(self, ref: str) -> FakeContainer:
        raise requests.exceptions.ConnectionError("daemon went away")


class FakeClient:
    def __init__(
        self, image_present: bool = True, start_error: Exception | None = None, has_run: bool = True
    ) -> None:
        self.images = FakeImages(image_present)
        self.containers = FakeContainers(start_error, has_run)


class PortsAsked:
    """The runtime's port-check seam: records what it was asked, answers "free" unless told which
    (host, port) is taken. Never the host's real ports: these specs publish 8000, which a running
    appliance beside the suite holds (its engine's default port)."""

    def __init__(self, taken: tuple[str, int] | None = None) -> None:
        self.asked: list[tuple[str, int]] = []
        self.taken = taken

    def __call__(self, host: str, port: int) -> None:
        self.asked.append((host, port))
        if (host, port) == self.taken:
            raise PortInUse(host, port, "pid 4242 (python -m vllm.entrypoints.openai.api_server)")


def runtime(client: FakeClient, ports: PortsAsked | None = None) -> DockerRuntime:
    # a fake at the declared seam (the client), and the port check replaced (its own seam)
    return DockerRuntime(client, port_check=ports or PortsAsked())  # type: ignore[arg-type]


def test_missing_image_says_build_it_never_pull() -> None:
    client = FakeClient(image_present=False)
    with pytest.raises(EngineRuntimeError, match=r"not present on this host.*never pulls.*images/README.md"):
        runtime(client).start(gfx906_spec(), "L1")
    assert client.containers.made == []


def test_start_failure_removes_the_container_and_explains() -> None:
    error = docker.errors.APIError(
        "500 Server Error", explanation="error setting rlimits for ready process: error setting rlimit type 8"
    )
    client = FakeClient(start_error=error)
    with pytest.raises(EngineRuntimeError, match=r"rlimit type 8.*memlock.*CAP_SYS_RESOURCE"):
        runtime(client).start(gfx906_spec(), "L1")
    assert client.containers.made[0].removed


def test_successful_start_returns_the_handle() -> None:
    handle = runtime(FakeClient()).start(gfx906_spec(), "L1")
    assert handle == EngineHandle(
        launch_id="L1",
        runtime="docker",
        ref="c0ffee",
        recipe="qwen27b-tp4-graph",
        spec_hash="abcdef0123456789",
        started_at=_parse_docker_time("2026-11-29T07:21:40.5Z"),
    )


def test_start_proves_the_published_host_ports_free_through_the_seam() -> None:
    ports = PortsAsked()
    runtime(FakeClient(), ports).start(gfx906_spec(), "L1")
    assert ports.asked == [("127.0.0.1", 8000)]  # the published host port, on the publish address
    ports = PortsAsked()
    runtime(FakeClient(), ports).start(gfx906_spec(network_mode="host", published_ports={}), "L1")
    assert ports.asked == [("127.0.0.1", 8000)]  # host network: the engine's own host and port


def test_a_taken_port_refuses_the_start_before_the_daemon_is_asked() -> None:
    client = FakeClient()
    with pytest.raises(PortInUse, match=r"127.0.0.1:8000 is already in use by pid 4242"):
        runtime(client, PortsAsked(taken=("127.0.0.1", 8000))).start(gfx906_spec(), "L1")
    assert client.containers.made == []


def test_daemon_gone_is_an_operator_error() -> None:
    handle = EngineHandle(
        launch_id="L1", runtime="docker", ref="c0ffee", recipe="r", spec_hash="h", started_at=0
    )
    with pytest.raises(EngineRuntimeError, match=r"daemon is not reachable.*start-dockerd"):
        runtime(FakeClient()).inspect(handle)


def test_no_daemon_at_all_is_an_operator_error(tmp_path: Any) -> None:
    # A real client on a socket nobody listens on (version pinned so that construction does not connect).
    client = docker.DockerClient(base_url=f"unix://{tmp_path}/no-daemon.sock", version="1.41")
    with pytest.raises(EngineRuntimeError, match=r"daemon is not reachable"):
        DockerRuntime(client).adopt()


def test_daemon_down_at_first_use_is_an_operator_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    # No client injected: the runtime connects lazily (from the environment) on first use.
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-daemon.sock")
    with pytest.raises(EngineRuntimeError, match=r"cannot connect to the daemon.*not reachable.*DOCKER_HOST"):
        DockerRuntime().adopt()


def test_unknown_network_at_create_is_an_operator_error() -> None:
    client = FakeClient()

    def create(**kwargs: Any) -> FakeContainer:
        raise docker.errors.NotFound("404", explanation="network appliance-net not found")

    client.containers.create = create  # type: ignore[method-assign]
    with pytest.raises(
        EngineRuntimeError, match="create container appliance-L1 failed: network appliance-net not found"
    ):
        runtime(client).start(gfx906_spec(network_mode="appliance-net"), "L1")


def test_wrong_runtime_kind_is_rejected() -> None:
    with pytest.raises(EngineRuntimeError, match="'process' runtime, not 'docker'"):
        runtime(FakeClient()).start(with_runtime(gfx906_spec(), "process", python="python"), "L1")


def test_make_runtime_rejects_unknown_kinds(tmp_path: Any) -> None:
    with pytest.raises(ValueError, match="unknown runtime kind 'podman'"):
        make_runtime("podman", tmp_path)


# -- the exec seam (seed 004 §7's deployment probe runs in the engine's container) -----------------


class ExecContainer(FakeContainer):
    def __init__(self, exit_code: int, output: bytes) -> None:
        super().__init__(None)
        self.exit_code, self.output = exit_code, output
        self.execs: list[list[str]] = []

    def exec_run(self, cmd: list[str], **kwargs: Any) -> Any:
        self.execs.append(cmd)
        return docker.models.containers.ExecResult(self.exit_code, self.output)


class ExecContainers(FakeContainers):
    def __init__(self, container: ExecContainer | None) -> None:
        super().__init__(None)
        self.container = container

    def get(self, ref: str) -> FakeContainer:
        if self.container is None:
            raise docker.errors.NotFound(f"No such container: {ref}")
        return self.container


def _exec_client(container: ExecContainer | None) -> FakeClient:
    client = FakeClient()
    client.containers = ExecContainers(container)
    return client


def _handle() -> EngineHandle:
    return EngineHandle(launch_id="L1", runtime="docker", ref="c0ffee", recipe="r", spec_hash="h",
                        log_path="", started_at=0.0)


def test_engine_exec_runs_in_the_container_bounded_by_timeout_and_returns_its_output() -> None:
    container = ExecContainer(0, b"APPLIANCE-DEPLOYMENT {}\n")
    code, out = runtime(_exec_client(container)).engine_exec(
        gfx906_spec(), _handle(), ["python", "-c", "print(1)"], 119.5)
    assert (code, out) == (0, "APPLIANCE-DEPLOYMENT {}\n")
    assert container.execs == [["timeout", "-k", "5", "120", "python", "-c", "print(1)"]]


def test_engine_exec_reports_a_timeout_and_a_gone_container() -> None:
    code, _ = runtime(_exec_client(ExecContainer(124, b""))).engine_exec(gfx906_spec(), _handle(), ["x"], 5)
    assert code is None
    with pytest.raises(EngineRuntimeError, match="cannot exec in container c0ffee"):
        runtime(_exec_client(None)).engine_exec(gfx906_spec(), _handle(), ["x"], 5)
