"""DockerRuntime against the real daemon (busybox image imported locally, tests/integration/images.py).

Every container a test creates is removed by id in teardown. Launch ids are unique per test so that
containers other people run on the same daemon are never touched (adoption is filtered to ours).
"""

from __future__ import annotations

import re
import signal
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import docker.errors
import psutil
import pytest

from appliance.launch_spec import LaunchSpec, Mount, Ulimit
from controller.runtime import make_runtime
from controller.runtime.base import (
    LABEL_LAUNCH_ID,
    LABEL_MANAGED,
    LABEL_RECIPE,
    LABEL_SPEC_HASH,
    EngineHandle,
    Runtime,
    RuntimeError_,
)
from controller.runtime.docker_rt import DockerRuntime
from tests.integration.images import busybox_image

pytestmark = pytest.mark.docker

LIVENESS_S = 60.0
CAP_SYS_RESOURCE = 24


@pytest.fixture(scope="module")
def client() -> Iterator[docker.DockerClient]:
    try:
        c = docker.from_env()
        c.ping()
    except docker.errors.DockerException as exc:
        pytest.skip(f"no Docker daemon ({exc}): start one with `bash scripts/start-dockerd.sh`")
    yield c
    c.close()


@pytest.fixture(scope="module")
def image(client: docker.DockerClient) -> str:
    return busybox_image(client)


class Tracker:
    """Launch ids handed out by a test, and the ids of the containers made for them."""

    def __init__(self, client: docker.DockerClient) -> None:
        self.client = client
        self.launch_ids: list[str] = []
        self.container_ids: list[str] = []

    def launch_id(self) -> str:
        launch_id = f"t{uuid.uuid4().hex[:12]}"
        self.launch_ids.append(launch_id)
        return launch_id

    def remove_all(self) -> None:
        for launch_id in self.launch_ids:  # also containers created by a start() that then failed
            label: dict[str, str | list[str] | bool] = {"label": f"{LABEL_LAUNCH_ID}={launch_id}"}
            for c in self.client.containers.list(all=True, filters=label):
                if c.id not in self.container_ids:
                    self.container_ids.append(str(c.id))
        for cid in self.container_ids:
            try:
                self.client.containers.get(cid).remove(force=True)
            except docker.errors.NotFound:
                continue


@pytest.fixture
def made(client: docker.DockerClient) -> Iterator[Tracker]:
    tracker = Tracker(client)
    yield tracker
    tracker.remove_all()


@pytest.fixture
def rt(client: docker.DockerClient) -> DockerRuntime:
    return DockerRuntime(client, kill_wait_s=30.0)


def busybox_spec(image: str, script: str, **extra: object) -> LaunchSpec:
    fields: dict[str, object] = {
        "recipe": "busybox-engine",
        "spec_hash": "00112233aabbccdd",
        "platform": "cpu",
        "runtime": "docker",
        "image": image,
        "argv": ("sh", "-c", script),
        "env": {"ENGINE_MODE": "test", "WITH_SPACE": "a b", "EMPTY": ""},
        "port": 8000,
        "served_model_name": "fake",
        "cache_root": "/cache",
        "ready_budget_s": 60,
        "stall_window_s": 60,
    }
    fields.update(extra)
    return LaunchSpec.model_validate(fields)


def wait_for_log(rt: Runtime, handle: EngineHandle, pattern: str, timeout_s: float = LIVENESS_S) -> str:
    text, offset = "", 0
    deadline = time.monotonic() + timeout_s
    while True:
        chunk, offset = rt.read_logs(handle, offset)
        text += chunk
        if re.search(pattern, text):
            return text
        if time.monotonic() > deadline:
            raise AssertionError(f"{pattern!r} not in the log after {timeout_s} s; log so far:\n{text}")
        time.sleep(0.1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def full_spec(image: str, tmp_path: Path, script: str, ulimits: tuple[Ulimit, ...]) -> LaunchSpec:
    """Every option the LaunchSpec has, set to a non-default value so that a dropped one shows."""
    data = tmp_path / "model"
    data.mkdir(exist_ok=True)
    (data / "weights.txt").write_text("weights\n")
    return busybox_spec(
        image,
        script,
        mounts=(Mount(source=str(data), target="/models/m", read_only=True),),
        devices=("/dev/zero:/dev/fakegpu:rwm",),
        group_add=("44",),  # numeric: busybox has no /etc/group
        ipc_mode="shareable",  # not the daemon default ("private"), so a dropped option would show
        shm_size="96m",
        network_mode="bridge",
        security_opt=("no-new-privileges",),
        ulimits=ulimits,
        published_ports={8000: _free_port()},
        labels={"team": "serving"},
    )


def expected_host_config(spec: LaunchSpec, tmp_path: Path) -> dict[str, object]:
    host_port = spec.runtime.published_ports[8000]  # type: ignore[attr-defined]
    return {
        "Ulimits": [{"Name": u.name, "Soft": u.soft, "Hard": u.hard} for u in spec.ulimits],
        "Memory": 0,  # DOMAIN §3: created without a memory limit
        "MemorySwap": 0,
        "RestartPolicy": {"Name": "no", "MaximumRetryCount": 0},
        "IpcMode": "shareable",
        "ShmSize": 96 * 1024 * 1024,
        "PortBindings": {"8000/tcp": [{"HostIp": "127.0.0.1", "HostPort": str(host_port)}]},
        "Devices": [
            {"PathOnHost": "/dev/zero", "PathInContainer": "/dev/fakegpu", "CgroupPermissions": "rwm"}
        ],
        "GroupAdd": ["44"],
        "Binds": [f"{tmp_path / 'model'}:/models/m:ro"],
        "SecurityOpt": ["no-new-privileges"],
        "NetworkMode": "bridge",
    }


def check_inspect(attrs: dict[str, object], spec: LaunchSpec, launch_id: str, tmp_path: Path) -> None:
    host_config = attrs["HostConfig"]
    config = attrs["Config"]
    assert isinstance(host_config, dict) and isinstance(config, dict)
    expected = expected_host_config(spec, tmp_path)
    assert {k: host_config[k] for k in expected} == expected
    assert sorted(config["Env"]) == sorted(f"{k}={v}" for k, v in spec.env.items())  # busybox has no ENV
    assert config["Labels"] == {
        "team": "serving",
        LABEL_MANAGED: "true",
        LABEL_LAUNCH_ID: launch_id,
        LABEL_RECIPE: spec.recipe,
        LABEL_SPEC_HASH: spec.spec_hash,
    }
    assert [attrs["Path"], *attrs["Args"]] == list(spec.command())  # type: ignore[misc]


def daemon_can_lift_memlock() -> bool:
    """Whether dockerd may set memlock=-1 in a container: it needs CAP_SYS_RESOURCE (or an unlimited
    hard limit already). Found by reading the daemon's /proc entries (never signalled)."""
    for proc in psutil.process_iter(["name"]):
        if proc.info["name"] == "dockerd":
            status = Path(f"/proc/{proc.pid}/status").read_text()
            cap_eff = int(re.search(r"^CapEff:\s*([0-9a-f]+)", status, re.M).group(1), 16)  # type: ignore[union-attr]
            _, hard = proc.rlimit(psutil.RLIMIT_MEMLOCK)
            return bool(cap_eff >> CAP_SYS_RESOURCE & 1) or hard == psutil.RLIM_INFINITY
    pytest.skip("dockerd process not visible from here: cannot tell whether memlock=-1 is allowed")


def test_created_container_has_exactly_the_spec_options(
    rt: DockerRuntime, image: str, made: Tracker, tmp_path: Path
) -> None:
    # memlock=-1 as production needs (DOMAIN §3); create() only, so this runs on any daemon.
    spec = full_spec(image, tmp_path, "echo hi", (Ulimit(name="memlock", soft=-1, hard=-1),))
    launch_id = made.launch_id()
    container = rt.create(spec, launch_id)
    made.container_ids.append(str(container.id))
    container.reload()
    check_inspect(container.attrs, spec, launch_id, tmp_path)
    assert container.name == f"appliance-{launch_id}"


def test_launch_runs_with_the_spec_options(
    rt: DockerRuntime, image: str, made: Tracker, tmp_path: Path
) -> None:
    script = (
        "echo ENV:$ENGINE_MODE:$WITH_SPACE:; cat /models/m/weights.txt; ls /dev/fakegpu; "
        "grep -E '^(Groups|NoNewPrivs)' /proc/self/status; grep 'open files' /proc/self/limits; "
        "echo READY; sleep 300"
    )
    spec = full_spec(image, tmp_path, script, (Ulimit(name="nofile", soft=2048, hard=4096),))
    launch_id = made.launch_id()
    handle = rt.start(spec, launch_id)
    made.container_ids.append(handle.ref)
    assert (handle.runtime, handle.launch_id, handle.recipe, handle.spec_hash) == (
        "docker",
        launch_id,
        spec.recipe,
        spec.spec_hash,
    )
    text = wait_for_log(rt, handle, r"READY")
    attrs = rt.client.api.inspect_container(handle.ref)
    check_inspect(attrs, spec, launch_id, tmp_path)
    # ... and the options took effect inside the container:
    assert "ENV:test:a b:" in text
    assert "weights\n" in text
    assert "/dev/fakegpu" in text
    assert re.search(r"Groups:.*\b44\b", text)
    assert re.search(r"NoNewPrivs:\s*1", text)
    assert re.search(r"Max open files\s+2048\s+4096", text)
    assert rt.inspect(handle).running
    assert handle.started_at == pytest.approx(time.time(), abs=120)


def test_memlock_unlimited_runs_or_fails_with_an_operator_hint(
    rt: DockerRuntime, image: str, made: Tracker
) -> None:
    spec = busybox_spec(
        image,
        "grep 'locked memory' /proc/self/limits; sleep 300",
        ulimits=(Ulimit(name="memlock", soft=-1, hard=-1),),
    )
    launch_id = made.launch_id()
    if daemon_can_lift_memlock():
        handle = rt.start(spec, launch_id)
        made.container_ids.append(handle.ref)
        assert re.search(r"Max locked memory\s+unlimited\s+unlimited", wait_for_log(rt, handle, "locked"))
    else:
        # Measured here: dockerd without CAP_SYS_RESOURCE → "error setting rlimit type 8".
        with pytest.raises(RuntimeError_, match=r"memlock.*CAP_SYS_RESOURCE") as err:
            rt.start(spec, launch_id)
        assert "rlimit type 8" in str(err.value)
        left = rt.client.containers.list(all=True, filters={"label": f"{LABEL_LAUNCH_ID}={launch_id}"})
        assert left == []  # the container that failed to start was removed


def test_logs_stream_by_offset(rt: DockerRuntime, image: str, made: Tracker) -> None:
    # stdout and stderr are separate pipes into the daemon: their order is only defined across a pause.
    script = (
        "echo first; sleep 0.3; echo to-stderr >&2; sleep 0.3; "
        "echo 'ünïcödé ✓'; echo second; echo DONE; sleep 300"
    )
    handle = rt.start(busybox_spec(image, script), made.launch_id())
    made.container_ids.append(handle.ref)
    text = wait_for_log(rt, handle, r"DONE")
    assert text == "first\nto-stderr\nünïcödé ✓\nsecond\nDONE\n"
    whole, end = rt.read_logs(handle, 0)
    assert whole == text and end == len(text.encode())
    assert rt.read_logs(handle, end) == ("", end)
    first_len = len(b"first\n")
    assert rt.read_logs(handle, first_len) == (text[len("first\n") :], end)


def test_exit_code_and_signal(rt: DockerRuntime, image: str, made: Tracker) -> None:
    handle = rt.start(busybox_spec(image, "exit 3"), made.launch_id())
    made.container_ids.append(handle.ref)
    info = rt.wait(handle, LIVENESS_S)
    assert (info.running, info.exit_code, info.signal, info.oom_killed) == (False, 3, None, False)

    # PID 1 ignores signals it has no handler for, so the abort happens in a child (`; exit $?` keeps
    # busybox from exec'ing it as PID 1); the shell then
    # exits 128+6 like docker reports any signal death (DOMAIN §5: SIGABRT = "exit 134").
    handle = rt.start(busybox_spec(image, "sh -c 'kill -ABRT $$'; exit $?"), made.launch_id())
    made.container_ids.append(handle.ref)
    info = rt.wait(handle, LIVENESS_S)
    assert (info.running, info.exit_code, info.signal) == (False, 134, int(signal.SIGABRT))


def test_stop_with_term_handled(rt: DockerRuntime, image: str, made: Tracker) -> None:
    script = "trap 'echo got TERM; exit 7' TERM; echo READY; while true; do sleep 0.2; done"
    handle = rt.start(busybox_spec(image, script), made.launch_id())
    made.container_ids.append(handle.ref)
    wait_for_log(rt, handle, r"READY")
    info = rt.stop(handle, grace_s=LIVENESS_S)
    assert (info.running, info.exit_code, info.signal, info.oom_killed) == (False, 7, None, False)
    assert "got TERM" in rt.read_logs(handle, 0)[0]
    assert rt.engine_pids(handle) == []


def test_stop_escalates_to_kill(rt: DockerRuntime, image: str, made: Tracker) -> None:
    script = "trap '' TERM; echo READY; while true; do sleep 0.2; done"
    handle = rt.start(busybox_spec(image, script), made.launch_id())
    made.container_ids.append(handle.ref)
    wait_for_log(rt, handle, r"READY")
    info = rt.stop(handle, grace_s=1.0)
    assert (info.running, info.exit_code, info.signal) == (False, 137, int(signal.SIGKILL))


def test_adopted_by_label_from_a_new_runtime(rt: DockerRuntime, image: str, made: Tracker) -> None:
    ticking = busybox_spec(image, "echo READY; while true; do echo tick; sleep 0.5; done")
    handle = rt.start(ticking, made.launch_id())
    made.container_ids.append(handle.ref)
    wait_for_log(rt, handle, r"tick")
    ended = rt.start(busybox_spec(image, "exit 0"), made.launch_id())
    made.container_ids.append(ended.ref)
    rt.wait(ended, LIVENESS_S)

    restarted = DockerRuntime()  # a fresh client too: nothing shared with the first runtime
    ours = [h for h in restarted.adopt() if h.launch_id in made.launch_ids]
    assert [h.ref for h in ours] == [handle.ref]  # the ended one is not adopted
    assert ours[0].model_dump(exclude={"started_at"}) == handle.model_dump(exclude={"started_at"})
    assert ours[0].started_at == pytest.approx(handle.started_at, abs=1e-3)

    pids = restarted.engine_pids(handle)
    state_pid = rt.client.api.inspect_container(handle.ref)["State"]["Pid"]
    assert pids[0] == state_pid or state_pid in pids
    assert all(psutil.pid_exists(p) for p in pids)
    assert restarted.cpu_seconds(handle) >= 0.0
    assert not restarted.stop(handle, grace_s=1.0).running


def test_memory_hog_in_a_memory_limited_container_is_oom_killed(
    rt: DockerRuntime, client: docker.DockerClient, image: str, made: Tracker
) -> None:
    # Only this test has a memory limit (LaunchSpec never does): the low-level SDK, 32 MiB, no swap.
    launch_id = made.launch_id()
    container = client.containers.run(
        image,
        ["tail", "/dev/zero"],  # MEASURED.md: tail on /dev/zero grows until the cgroup OOM killer fires
        detach=True,
        mem_limit="32m",
        memswap_limit="32m",
        labels={LABEL_LAUNCH_ID: launch_id},
    )
    made.container_ids.append(str(container.id))
    handle = EngineHandle(
        launch_id=launch_id,
        runtime="docker",
        ref=str(container.id),
        recipe="hog",
        spec_hash="-",
        started_at=0.0,
    )
    info = rt.wait(handle, LIVENESS_S)
    assert info.oom_killed is True
    assert (info.running, info.exit_code, info.signal) == (False, 137, int(signal.SIGKILL))


def test_missing_image_is_an_operator_error(rt: DockerRuntime, made: Tracker) -> None:
    spec = busybox_spec("appliance-test/never-built:nope", "true")
    with pytest.raises(RuntimeError_, match=r"not present on this host.*never pulls.*images/README.md"):
        rt.start(spec, made.launch_id())


def test_make_runtime_docker(tmp_path: Path) -> None:
    rt = make_runtime("docker", tmp_path)
    assert isinstance(rt, DockerRuntime) and isinstance(rt, Runtime)
