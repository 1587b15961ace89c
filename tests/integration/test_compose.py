"""The appliance as containers, end to end, with the real CPU vLLM engine in its own container.

One compose project (compose.yaml, its own volume, free ports, a temporary recipes directory and
Prometheus config) runs the controller, gateway and Prometheus containers. In order, sharing one
engine start:

1. every grant the containerised host watch needs is there (no "blind" warning at start-up), and
   bad input is refused in one sentence with nothing left running: a missing image, an image
   whose engine exits at once, the engine's port already taken;
2. the controller applies the Docker CPU recipe → the engine container (a sibling, labelled) is
   ready → a chat completion through the gateway container with a key → the compose Prometheus
   scrapes controller, gateway and engine as up; the gateway runs as uid 10001;
3. `docker kill` of the engine → diagnosed and relaunched by the containerised controller, and the
   relaunch is warm, proven from the log (compile cache hit: the caches live in the volume);
4. the controller container restarted → the running engine adopted, not duplicated;
5. the engine container given a memory limit and a process in it pushed over it → the kernel's
   cgroup OOM kill is seen by the containerised watch (/dev/kmsg) and attributed to the launch.

A controller container without the Docker socket says so in one sentence (a separate container).
Waits are liveness bounds, not speed assertions; the model's words are never compared.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import docker.errors
import psutil
import pytest

from controller import admin_token
from tests.integration.images import (
    APPLIANCE_IMAGE,
    BUILD_TIMEOUT_S,
    REPO,
    build_appliance_images,
    busybox_image,
)

pytestmark = [pytest.mark.docker, pytest.mark.engine, pytest.mark.slow]

TOKEN = "adm_compose-integration-test"
START_LIVENESS_S = 1500.0  # a cold start on a busy 2-core machine; ~90 s when quiet
RECIPE = "ctest-smollm2-docker"
PERSISTENT_VOLUME = "appliance-ctest-home"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _free_ports(n: int) -> list[int]:
    """`n` distinct free ports: every socket stays bound until all are picked (one at a time, the
    kernel may hand the same port out twice, and two of the stack's listeners would then share one)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]


def _compose_cmd() -> list[str]:
    if subprocess.run(["docker", "compose", "version"], capture_output=True, check=False).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    pytest.skip("neither `docker compose` nor `docker-compose` (bash scripts/setup-system.sh)")


def _http(method: str, url: str, body: dict[str, Any] | None = None, *, token: str | None = TOKEN,
          timeout: float = 30) -> Any:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        raw = resp.read()
        return json.loads(raw) if raw.strip().startswith((b"{", b"[")) else raw.decode()


def _until(what: str, check: Callable[[], Any], timeout_s: float, every_s: float = 2.0) -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except (OSError, urllib.error.URLError, ValueError) as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}; last: {last!r}")


@dataclass
class Stack:
    project: str
    env: dict[str, str]
    admin_port: int
    gateway_port: int
    prom_port: int
    engine_port: int
    recipes: Path
    compose: list[str]
    client: docker.DockerClient

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    def run(self, *args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = [*self.compose, "-p", self.project, "-f", str(REPO / "compose.yaml"), *args]
        proc = subprocess.run(cmd, cwd=REPO, env=self.env, capture_output=True, text=True,
                              timeout=timeout, check=False)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}")
        return proc

    def container(self, service: str) -> Any:
        cid = self.run("ps", "-q", service).stdout.strip()
        assert cid, f"no {service} container"
        return self.client.containers.get(cid)

    def status(self) -> dict[str, Any]:
        result: dict[str, Any] = _http("GET", f"{self.api}/status")
        return result

    def launch(self, launch_id: str) -> dict[str, Any]:
        result: dict[str, Any] = _http("GET", f"{self.api}/launches/{launch_id}")
        return result

    def engines(self, running_only: bool = True) -> list[Any]:
        return list(self.client.containers.list(
            all=not running_only, filters={"label": ["appliance.managed=true",
                                                     f"appliance.recipe={RECIPE}"]}))

    def apply(self, recipe: str) -> None:
        _http("POST", f"{self.api}/apply", {"recipe": recipe})

    def wait_ready(self, not_launch: str | None = None) -> dict[str, Any]:
        def ready() -> dict[str, Any] | None:
            s = self.status()
            if s["state"] == "failed":
                raise AssertionError(f"the controller gave up: {s}")
            launch = s.get("launch") or {}
            if s["state"] == "ready" and launch.get("id") != not_launch:
                return s
            return None

        result: dict[str, Any] = _until("the engine container to be ready", ready, START_LIVENESS_S, 3)
        return result

    def wait_failed(self, recipe: str) -> dict[str, Any]:
        def failed() -> dict[str, Any] | None:
            s = self.status()
            return s if s["state"] == "failed" and s["recipe"] == recipe else None

        result: dict[str, Any] = _until(f"{recipe} to fail", failed, 240, 1)
        return result

    def failure_text(self, recipe: str) -> str:
        """The status and the newest launch record of `recipe`, as text to search for the sentence."""
        rows = _http("GET", f"{self.api}/launches?limit=1&recipe={recipe}")
        record = self.launch(rows[0]["id"]) if rows else {}
        return json.dumps(self.status()) + json.dumps(record)

    def logs(self, service: str) -> str:
        return str(self.container(service).logs().decode(errors="replace"))


def _write_recipes(into: Path, engine_port: int) -> None:
    into.mkdir()
    for f in (REPO / "recipes").glob("*.yaml"):
        shutil.copy(f, into / f.name)
    # The shipped Docker recipe on a free port, with the start budget of a busy shared machine.
    (into / f"{RECIPE}.yaml").write_text(
        f"name: {RECIPE}\nextends: cpu-smollm2-docker\nengine:\n  port: {engine_port}\n"
        "expect:\n  ready_budget_s: 1500\n  stall_window_s: 600\n")
    # Bad input, one recipe each.
    (into / "ctest-missing-image.yaml").write_text(
        "name: ctest-missing-image\nextends: cpu-smollm2-docker\n"
        "runtime:\n  image: appliance/no-such-image:0\n")
    (into / "ctest-exits-at-once.yaml").write_text(
        f"name: ctest-exits-at-once\nextends: cpu-smollm2-docker\nengine:\n  port: {engine_port}\n"
        "runtime:\n  image: appliance-test/exits-at-once:latest\n")


def _prometheus_config(path: Path, admin: int, gateway_control: int) -> None:
    text = (REPO / "monitoring" / "prometheus" / "prometheus.yml").read_text()
    # The gateway is scraped on its control listener. The engine is not named: the controller
    # container writes it (its port included) into the prometheus-targets volume (file_sd).
    for old, new in (("127.0.0.1:8090", admin), ("127.0.0.1:8081", gateway_control)):
        assert old in text
        text = text.replace(old, f"127.0.0.1:{new}")
    path.write_text(text)


def _exits_at_once_image(client: docker.DockerClient) -> None:
    """An image whose `python` exits at once (busybox has no such applet: exit 127)."""
    base = busybox_image(client)
    c = client.containers.create(base, entrypoint=["sh", "-c", "ln -s /bin/busybox /bin/python"])
    try:
        c.start()
        c.wait(timeout=30)
        c.commit(repository="appliance-test/exits-at-once", tag="latest")
    finally:
        c.remove(force=True)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as exc:
        pytest.skip(f"no Docker daemon ({exc}): start one with `bash scripts/start-dockerd.sh`")
    compose = _compose_cmd()
    took, out = build_appliance_images()
    print(f"\n[compose] images ready in {took:.1f} s\n{out}")
    _exits_at_once_image(client)
    tmp = tmp_path_factory.mktemp("compose")
    ports = _free_ports(5)
    admin, gateway, prom, engine, gateway_control = ports
    _write_recipes(tmp / "recipes", engine)
    _prometheus_config(tmp / "prometheus.yml", admin, gateway_control)
    project = f"ctest{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        # One volume kept across runs (like test_controller_engine's cache root): the model is
        # converted once and only the first run on a machine pays the cold compile.
        "APPLIANCE_VOLUME": PERSISTENT_VOLUME,
        "APPLIANCE_ADMIN_PORT": str(admin),
        "APPLIANCE_GATEWAY_PORT": str(gateway),
        "APPLIANCE_GATEWAY_CONTROL_PORT": str(gateway_control),
        "PROMETHEUS_PORT": str(prom),
        "APPLIANCE_RECIPES_DIR": str(tmp / "recipes"),
        "APPLIANCE_PROMETHEUS_CONFIG": str(tmp / "prometheus.yml"),
        "APPLIANCE_ADMIN_TOKEN_SHA256": admin_token.hash_token(TOKEN),
    }
    s = Stack(project, env, admin, gateway, prom, engine, tmp / "recipes", compose, client)
    try:
        t0 = time.monotonic()
        s.run("run", "--rm", "model-setup", timeout=900)
        print(f"[compose] model-setup (GGUF → HF folder in the volume): {time.monotonic() - t0:.1f} s")
        s.run("up", "-d", "controller", "gateway", "prometheus")
        _until("the controller container's API", lambda: _http("GET", f"{s.api}/healthz"), 120, 1)
        yield s
    finally:
        for c in client.containers.list(all=True, filters={"label": "appliance.managed=true"}):
            if str(c.labels.get("appliance.recipe", "")).startswith("ctest-"):
                c.remove(force=True)
        s.run("down", "--remove-orphans", check=False)
        for volume in ("prometheus-data", "prometheus-targets"):
            with contextlib.suppress(docker.errors.NotFound):
                client.volumes.get(f"{project}_{volume}").remove(force=True)


def _blind_warnings(text: str) -> list[str]:
    return [line for line in text.splitlines() if "WARNING" in line and (
        "is not watched" in line or "will not be seen" in line or "cannot be read" in line
        or "invisible" in line or "neither started nor adopted" in line)]


@pytest.mark.timeout(BUILD_TIMEOUT_S + 600)
def test_grants_present_and_bad_input_is_one_sentence_with_nothing_left(stack: Stack) -> None:
    assert _blind_warnings(stack.logs("controller")) == []

    stack.apply("ctest-missing-image")
    stack.wait_failed("ctest-missing-image")
    text = stack.failure_text("ctest-missing-image")
    assert "image 'appliance/no-such-image:0' is not present on this host" in text and "never pulls" in text
    assert stack.client.containers.list(
        all=True, filters={"label": "appliance.recipe=ctest-missing-image"}) == []

    # The engine's port taken on the host: refused before any container exists.
    with socket.socket() as held:
        held.bind(("127.0.0.1", stack.engine_port))
        held.listen()
        stack.apply(RECIPE)
        stack.wait_failed(RECIPE)
        text = stack.failure_text(RECIPE)
        assert f"port 127.0.0.1:{stack.engine_port} is already in use" in text, text
    assert stack.engines(running_only=False) == []

    # An image whose entrypoint exits at once: the exit is diagnosed, nothing keeps running.
    stack.apply("ctest-exits-at-once")
    launch_id = _until("a launch of the exiting image", lambda: (
        (stack.status().get("launch") or {}).get("id") if stack.status()["recipe"] == "ctest-exits-at-once"
        else None), 60, 1)
    record = _until("its exit to be recorded", lambda: (
        r if (r := stack.launch(launch_id))["exit_code"] is not None else None), 120, 1)
    assert record["exit_code"] == 127 and record["diagnosis"], record
    print(f"[compose] exits at once: {record['diagnosis']}")
    _http("POST", f"{stack.api}/stop")
    _until("no running container of the exiting image", lambda: stack.client.containers.list(
        filters={"label": "appliance.recipe=ctest-exits-at-once"}) == [], 60, 1)


@pytest.mark.timeout(START_LIVENESS_S + 300)
def test_controller_applies_the_docker_recipe_and_the_gateway_answers(stack: Stack) -> None:
    stack.apply(RECIPE)
    s = stack.wait_ready()
    launch = s["launch"]
    cache = stack.launch(launch["id"])["cache"]
    print(f"[compose] engine container ready: {launch['ready_s']} s (cache {cache})")
    [engine] = stack.engines()
    assert engine.name == f"appliance-{launch['id']}" and engine.labels["appliance.launch_id"] == launch["id"]
    assert engine.attrs["HostConfig"]["Memory"] == 0  # DOMAIN §3: never a memory limit
    # A key through the admin API, a completion through the gateway container.
    key = _http("POST", f"{stack.api}/keys", {"name": "compose-test"})["key"]
    answer = _until("a completion through the gateway", lambda: _http(
        "POST", f"http://127.0.0.1:{stack.gateway_port}/v1/chat/completions",
        {"model": "smollm2", "max_tokens": 8, "temperature": 0,
         "messages": [{"role": "user", "content": "What is the capital of France?"}]}, token=key), 120)
    assert answer["choices"][0]["message"]["content"].strip(), answer
    # The gateway process runs as uid 10001 (host PID of the container's PID 1).
    gw_pid = int(stack.container("gateway").attrs["State"]["Pid"])
    assert psutil.Process(gw_pid).uids().real == 10001

    def all_up() -> dict[str, str] | None:
        data = _http("GET", f"http://127.0.0.1:{stack.prom_port}/api/v1/targets", token=None)
        health = {t["labels"]["job"]: t["health"] for t in data["data"]["activeTargets"]}
        return health if set(health.values()) == {"up"} and len(health) == 3 else None

    print(f"[compose] prometheus targets: {_until('prometheus to scrape all three targets', all_up, 90)}")

    # compose.yaml's healthchecks run in the containers against GET /healthz (the controller's is
    # liveness: the supervision loop comes round), so `docker compose ps` can say "unhealthy".
    def healthy() -> dict[str, str] | None:
        health = {name: (stack.container(name).attrs["State"].get("Health") or {}).get("Status", "")
                  for name in ("controller", "gateway")}
        return health if set(health.values()) == {"healthy"} else None

    _until("the controller's and the gateway's healthchecks to pass", healthy, 150, 3)


@pytest.mark.timeout(START_LIVENESS_S + 300)
def test_engine_killed_is_diagnosed_and_relaunched_warm(stack: Stack) -> None:
    before = stack.status()["launch"]["id"]
    [engine] = stack.engines()
    engine.kill()
    s = stack.wait_ready(not_launch=before)
    killed = stack.launch(before)
    assert killed["exit_code"] == 137 and killed["diagnosis"], killed
    new = stack.launch(s["launch"]["id"])
    print(f"[compose] killed: {killed['diagnosis']}; relaunch ready in {new['ready_s']} s, "
          f"cache {new['cache']}")
    assert new["cache"] == "hit", new  # the warm start, proven from the engine's log
    assert len(stack.engines()) == 1


def test_controller_restart_adopts_the_engine(stack: Stack) -> None:
    before = stack.status()["launch"]
    stack.run("restart", "controller")
    _until("the restarted controller", lambda: _http("GET", f"{stack.api}/healthz"), 120, 1)
    s = _until("the adopted engine to be ready", lambda: (
        st if (st := stack.status())["state"] == "ready" else None), 300, 2)
    assert s["launch"]["id"] == before["id"] and s["launch"]["ref"] == before["ref"], (before, s)
    assert [c.id for c in stack.engines()] == [before["ref"]]  # adopted, not duplicated
    assert _blind_warnings(stack.logs("controller")) == []


def test_cgroup_oom_kill_in_the_engine_container_is_seen_and_attributed(stack: Stack) -> None:
    launch_id = stack.status()["launch"]["id"]
    [engine] = stack.engines()
    usage_file = Path(f"/sys/fs/cgroup/memory/docker/{engine.id}/memory.usage_in_bytes")
    usage = int(usage_file.read_text()) if usage_file.exists() else 2 << 30
    limit = usage + (256 << 20)
    # Deliberately what the appliance never does (DOMAIN §3): a memory limit, then a process in the
    # container that outgrows it, so that the kernel's cgroup OOM killer picks it (the largest).
    engine.update(mem_limit=limit, memswap_limit=limit)
    # oom_score_adj 1000: the kernel picks the hog, not the engine core (which is larger).
    hog = engine.exec_run(["sh", "-c", "echo 1000 > /proc/self/oom_score_adj && exec python -c "
                           "'b = bytearray(3 << 30); import time; time.sleep(60)'"])
    assert hog.exit_code == 137, hog

    def attributed() -> list[dict[str, Any]] | None:
        oom = stack.launch(launch_id)["oom"]
        return oom or None

    [event, *_] = _until("the OOM kill attributed to the launch", attributed, 60, 1)
    print(f"[compose] OOM record: {event}")
    assert event["scope"] == "cgroup" and event["matched_by"] == "container_id", event
    assert re.fullmatch(r"python3?(\.\d+)?", event["task"] or ""), event


def test_controller_without_the_docker_socket_says_so() -> None:
    client = docker.from_env()
    port = _free_port()
    c = client.containers.run(APPLIANCE_IMAGE, ["controller"], detach=True, network_mode="host",
                              environment={"APPLIANCE_ADMIN_PORT": str(port),
                                           "APPLIANCE_GATEWAY_TOKEN_WAIT_S": "0"})
    try:
        _until("the socketless controller", lambda: _http("GET", f"http://127.0.0.1:{port}/healthz"), 120, 1)
        logs = c.logs().decode(errors="replace")
        lines = [ln for ln in logs.splitlines() if "no Docker socket at /var/run/docker.sock" in ln]
        assert len(lines) == 1 and "can be neither started nor adopted" in lines[0], logs
    finally:
        c.remove(force=True)
