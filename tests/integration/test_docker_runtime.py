"""What only the Docker runtime has, against the real daemon (busybox image imported locally,
tests/integration/images.py): the container is created with exactly the spec's options and they take
effect, memlock=-1 or an operator hint, OOMKilled in a memory-limited container, a missing image.

What every runtime must do (start, the key, ports, logs, exit info, stop, adoption) is written once
in test_runtime_contract.py and runs against this runtime there.

Every container a test creates is removed by id in teardown. Launch ids are unique per test so that
containers other people run on the same daemon are never touched (adoption is filtered to ours).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import docker.errors
import httpx
import psutil
import pytest

from appliance.engine_secret import CONTAINER_KEY_PATH
from appliance.recipe.launch_spec import LaunchSpec, Mount, Ulimit
from appliance.runtimes.docker import WRAPPER_SCRIPT
from controller.runtime.base import (
    LABEL_INSTANCE,
    LABEL_LAUNCH_ID,
    LABEL_MANAGED,
    LABEL_RECIPE,
    LABEL_SPEC_HASH,
    EngineHandle,
    EngineRuntimeError,
    Runtime,
)
from controller.runtime.docker import DockerRuntime
from controller.runtime.ports import PortInUse
from controller.supervisor.launch_key import new_engine_key
from tests.integration.images import CPU_VLLM_IMAGE, busybox_image
from tests.integration.runtime_specs import docker_options, docker_spec

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
    # busybox has no Python for the key-redacting container wrapper: these tests are about the
    # container's options; the wrapper is tested in test_docker_log_redaction.py (an image with one).
    return DockerRuntime(client, kill_wait_s=30.0, redacting_wrapper=False)


def busybox_spec(image: str, script: str, **common: Any) -> LaunchSpec:
    return docker_spec(image, ("sh", "-c", script),
                       env={"ENGINE_MODE": "test", "WITH_SPACE": "a b", "EMPTY": ""}, **common)


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
    return docker_spec(
        image,
        ("sh", "-c", script),
        env={"ENGINE_MODE": "test", "WITH_SPACE": "a b", "EMPTY": ""},
        docker={
            "mounts": (Mount(source=str(data), target="/models/m", read_only=True),),
            "devices": ("/dev/zero:/dev/fakegpu:rwm",),
            "group_add": ("44",),  # numeric: busybox has no /etc/group
            "ipc_mode": "shareable",  # not the daemon default ("private"), so a dropped option would show
            "shm_size": "96m",
            "network_mode": "bridge",
            "security_opt": ("no-new-privileges",),
            "published_ports": {8000: _free_port()},
        },
        ulimits=ulimits,
        labels={"team": "serving"},
    )


def expected_host_config(spec: LaunchSpec, tmp_path: Path) -> dict[str, object]:
    host_port = docker_options(spec).published_ports[8000]
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
        with pytest.raises(EngineRuntimeError, match=r"memlock.*CAP_SYS_RESOURCE") as err:
            rt.start(spec, launch_id)
        assert "rlimit type 8" in str(err.value)
        left = rt.client.containers.list(all=True, filters={"label": f"{LABEL_LAUNCH_ID}={launch_id}"})
        assert left == []  # the container that failed to start was removed


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
    with pytest.raises(EngineRuntimeError, match=r"not present on this host.*never pulls.*images/README.md"):
        rt.start(spec, made.launch_id())


def test_a_held_published_port_is_refused_before_any_container(
    rt: DockerRuntime, image: str, made: Tracker
) -> None:
    # Bridge networking: the port to prove free is the published host port, not the engine's own
    # (the contract suite covers host networking, where the engine binds the host's port itself).
    host_port = _free_port()
    spec = busybox_spec(image, "sleep 300", docker={"network_mode": "bridge",
                                                    "published_ports": {8000: host_port}})
    launch_id = made.launch_id()
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", host_port))
        squatter.listen()
        held = rf"127\.0\.0\.1:{host_port} is already in use by pid {os.getpid()}\b"
        with pytest.raises(PortInUse, match=held):
            rt.start(spec, launch_id)
    assert rt.client.containers.list(all=True, filters={"label": f"{LABEL_LAUNCH_ID}={launch_id}"}) == []


def test_the_engine_key_file_reaches_an_image_without_run_and_only_the_engine_sees_it(
    rt: DockerRuntime, image: str, made: Tracker,
) -> None:
    """The key is a vLLM config file put into the created container (never the
    environment). busybox has no /run: the runtime creates it (the compose suite's exits-at-once
    image failed to start before)."""
    key = new_engine_key()
    spec = busybox_spec(image, f"cat {CONTAINER_KEY_PATH}; ls -ln {CONTAINER_KEY_PATH}; sleep 300")
    handle = rt.start(spec, made.launch_id(), key)
    made.container_ids.append(handle.ref)
    text = wait_for_log(rt, handle, "engine-key.yaml")
    assert f"api-key: {key}" in text and "-r--------" in text  # 0400, root (busybox runs as root)
    assert rt.read_engine_key(handle) == key
    attrs = rt.client.api.inspect_container(handle.ref)
    assert key not in json.dumps(attrs)  # not in Env, Cmd, Labels: only in the container's file
    assert attrs["Config"]["Cmd"][-2:] == ["--config", CONTAINER_KEY_PATH]


def test_adopt_ignores_another_appliance_instances_container(
    client: docker.DockerClient, image: str, made: Tracker, tmp_path: Path
) -> None:
    # Issue 23: two appliances (two APPLIANCE_HOMEs) on one daemon; each adopts only its own engines.
    theirs = DockerRuntime(client, kill_wait_s=30.0, instance_id=f"other-{uuid.uuid4().hex[:8]}",
                           redacting_wrapper=False)
    mine = DockerRuntime(client, kill_wait_s=30.0, instance_id=f"mine-{uuid.uuid4().hex[:8]}",
                         redacting_wrapper=False)
    spec = busybox_spec(image, "echo READY; sleep 300")
    launch_id = made.launch_id()
    handle = theirs.start(spec, launch_id)
    made.container_ids.append(handle.ref)
    assert handle.instance == theirs.instance_id
    labels = client.containers.get(handle.ref).labels
    assert labels[LABEL_INSTANCE] == theirs.instance_id
    assert launch_id not in [h.launch_id for h in mine.adopt()]
    adopted = [h for h in theirs.adopt() if h.launch_id == launch_id]
    assert [h.instance for h in adopted] == [theirs.instance_id]


# -- the engine key never in the daemon's log: the container wrapper -----------------------------

# Printed like vLLM 0.26.0's api_server at every launch (the key read from the launch's key config,
# `--config PATH` at the end of argv: $1 $2 of the script), once on stdout and once on stderr; then
# a line that must arrive while the engine still runs, and a TERM trap saying it was called.
VLLM026_SCRIPT = """
key=$(sed -n 's/^api-key: //p' "$2")
echo "INFO 12-02 03:00:00 [api_server.py:1477] non-default args: {'model': '/m', 'api_key': ['$key']}"
echo "warning on stderr, the key again: $key" >&2
trap 'echo "engine got TERM"; exit 7' TERM
echo "engine ready"
while :; do sleep 0.1; done
"""


@pytest.fixture(scope="module")
def python_image(client: docker.DockerClient) -> str:
    """An image with the engine's Python: the CPU engine's own (scripts/build-images.sh)."""
    try:
        client.images.get(CPU_VLLM_IMAGE)
    except docker.errors.ImageNotFound:
        pytest.skip(f"{CPU_VLLM_IMAGE} not built (the wrapper needs a Python): bash scripts/build-images.sh")
    return CPU_VLLM_IMAGE


def daemon_log(container: Any) -> tuple[str, list[dict[str, Any]]]:
    """The daemon's json-file log as it is on disk (LogPath; the tests run as root): its raw text
    and its records (one JSON object per line: log, stream, time)."""
    raw = Path(container.attrs["LogPath"]).read_text()
    return raw, [json.loads(line) for line in raw.splitlines() if line]


def vllm026_launch(rt: DockerRuntime, image: str, made: Tracker) -> tuple[str, EngineHandle, Any]:
    key = new_engine_key()
    spec = docker_spec(image, ("sh", "-c", VLLM026_SCRIPT, "engine"), env={},
                       docker={"network_mode": "none"})
    handle = rt.start(spec, made.launch_id(), key)
    made.container_ids.append(handle.ref)
    wait_for_log(rt, handle, "engine ready")
    return key, handle, rt.client.containers.get(handle.ref)


def test_the_daemon_log_on_disk_never_holds_the_engine_key(
    client: docker.DockerClient, python_image: str, made: Tracker
) -> None:
    """Issue 31 item 7 for the Docker runtime: the container's output reaches the daemon only
    through the wrapper's redaction — its json log file, `docker logs` and the runtime's own
    reading hold no key, stdout and stderr each keep their stream, a line arrives while the engine
    runs, `docker stop` gives the engine TERM (once), and the exit status recorded is the engine's."""
    rt = DockerRuntime(client, kill_wait_s=30.0)
    key, handle, container = vllm026_launch(rt, python_image, made)
    assert rt.inspect(handle).running  # "engine ready" came through while it runs: not held back
    raw, records = daemon_log(container)
    logs = container.logs(stdout=True, stderr=True).decode()
    for text in (raw, logs, rt.read_logs(handle, 0)[0]):
        assert key not in text
    by_stream = {s: "".join(r["log"] for r in records if r["stream"] == s) for s in ("stdout", "stderr")}
    assert "non-default args: {'model': '/m', 'api_key': '<redacted>'}\n" in by_stream["stdout"]
    assert "the key again: <redacted>" in by_stream["stderr"]
    assert "engine ready" in by_stream["stdout"]
    config = client.api.inspect_container(handle.ref)["Config"]
    assert [*config["Entrypoint"], *config["Cmd"]][:4] == ["python", "-I", "-S", WRAPPER_SCRIPT]  # PID 1
    assert rt.read_engine_key(handle) == key  # adoption reads the key file as before

    info = rt.stop(handle, grace_s=LIVENESS_S)
    assert (info.running, info.exit_code, info.signal) == (False, 7, None)  # the engine's own status
    text, _ = rt.read_logs(handle, 0)
    assert text.count("engine got TERM") == 1
    assert key not in daemon_log(container)[0]


def test_without_the_wrapper_the_daemon_log_holds_the_key(
    client: docker.DockerClient, python_image: str, made: Tracker
) -> None:
    """The control: the same launch with the wrapper switched off leaves the key in the daemon's
    json log on disk — what the test above would see if the wrapper did nothing."""
    rt = DockerRuntime(client, kill_wait_s=30.0, redacting_wrapper=False)
    key, handle, container = vllm026_launch(rt, python_image, made)
    assert key in daemon_log(container)[0]
    rt.stop(handle, grace_s=LIVENESS_S)


def test_an_image_without_python_is_refused_saying_why(
    client: docker.DockerClient, image: str, made: Tracker
) -> None:
    """busybox has no `python` (and no /run: the wrapper's files and the key file are put there
    anyway): the start fails naming the wrapper, and no container is left behind."""
    rt = DockerRuntime(client, kill_wait_s=30.0)
    launch_id = made.launch_id()
    with pytest.raises(EngineRuntimeError, match=r"no `python` on PATH.*key-redacting wrapper"):
        rt.start(busybox_spec(image, "echo never"), launch_id, new_engine_key())
    assert client.containers.list(all=True, filters={"label": f"{LABEL_LAUNCH_ID}={launch_id}"}) == []


ENGINE_MODEL = Path("/var/lib/appliance/models/smollm2-135m-instruct")


@pytest.mark.engine
@pytest.mark.slow
def test_real_cpu_vllm_engine_in_its_image_starts_answers_and_stops_under_the_wrapper(
    client: docker.DockerClient, python_image: str, made: Tracker, tmp_path: Path
) -> None:
    """vLLM 0.32 (the cpu-vllm image) through the Docker runtime with the wrapper as PID 1: ready,
    answers with the launch's key, its start-up lines reach the log while it starts, the key is in
    no log, a stop is a clean TERM shutdown (not the daemon's KILL)."""
    if not (ENGINE_MODEL / "config.json").exists():
        pytest.skip(f"model not converted ({ENGINE_MODEL}/config.json missing): run `appliance engine setup`")
    port = _free_port()
    cache = tmp_path / "vllm-cache"
    cache.mkdir()
    spec = docker_spec(
        python_image,
        ("python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/model",
         "--served-model-name", "smollm2", "--max-model-len", "2048", "--dtype", "bfloat16",
         "--enforce-eager",  # about the runtime, not the compile cache: skip compiling
         "--host", "127.0.0.1", "--port", str(port)),
        env={"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CACHE_ROOT": str(cache), "VLLM_LOGGING_LEVEL": "INFO",
             "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"},
        docker={"network_mode": "host", "ipc_mode": "host",
                "mounts": (Mount(source=str(ENGINE_MODEL), target="/model", read_only=True),
                           Mount(source=str(cache), target=str(cache)))},
        port=port, cache_root=str(cache),
    )
    rt = DockerRuntime(client, kill_wait_s=30.0)
    key = new_engine_key()
    handle = rt.start(spec, made.launch_id(), key)
    made.container_ids.append(handle.ref)
    try:
        wait_for_log(rt, handle, r"Application startup complete", timeout_s=900)
        auth = {"Authorization": f"Bearer {key}"}
        assert httpx.get(f"{spec.base_url}/v1/models", timeout=30).status_code == 401
        answer = httpx.post(f"{spec.base_url}/v1/chat/completions", headers=auth, timeout=120, json={
            "model": "smollm2", "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": 8, "temperature": 0}).json()
        assert answer["usage"]["completion_tokens"] >= 1
        pids = rt.engine_pids(handle)
        assert len(pids) >= 3  # the wrapper (PID 1), the API server, its engine core
        pid1 = int(client.api.inspect_container(handle.ref)["State"]["Pid"])
        assert pid1 in pids and psutil.Process(pid1).cmdline()[:4] == ["python", "-I", "-S", WRAPPER_SCRIPT]
    finally:
        info = rt.stop(handle, grace_s=60)
    assert not info.running
    assert info.exit_code != 137 and info.signal in (None, int(signal.SIGTERM)), info  # TERM, not KILL
    raw, records = daemon_log(client.containers.get(handle.ref))
    assert key not in raw
    assert any("non-default args" in r["log"] for r in records)
