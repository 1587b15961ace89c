"""A real kernel OOM kill, seen by the watchers and attached to the right launch.

Only memory-limited containers are used (`--memory 32m` with busybox `tail /dev/zero`, as in
MEASURED.md): a *cgroup* OOM touches nothing outside the container. Never a global OOM on a shared
machine. Needs root (to read /dev/kmsg) and a Docker daemon (`bash scripts/start-dockerd.sh`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Iterator

import docker
import pytest
from docker.models.containers import Container

from appliance.observe.kmsg import OomEvent, OomEventKind, OomScope
from appliance.observe.oom_attribution import LaunchTarget, MatchKind, attribute_oom, diagnose_oom
from controller.metrics import ControllerMetrics
from controller.watch.cgroup_witness import CgroupOomWitness, resolve_oom_file
from controller.watch.kmsg_follower import DevKmsg, KmsgFollower
from controller.watch.procreader import ProcReader
from tests.integration.images import busybox_image

# The controller metrics this test exports (one registry of its own, as the controller builds).
metrics = ControllerMetrics()

pytestmark = [pytest.mark.docker, pytest.mark.timeout(180)]

# The hog waits for a go file so that the test can read its pid and cgroup before the kill.
WAIT_THEN = "while [ ! -e /tmp/go ]; do sleep 0.05; done; "


@pytest.fixture(scope="module")
def client() -> Iterator[docker.DockerClient]:
    if not os.access("/dev/kmsg", os.R_OK):
        pytest.skip("/dev/kmsg is not readable (needs root or CAP_SYSLOG)")
    try:
        c = docker.from_env()
        c.ping()
    except docker.errors.DockerException as exc:
        pytest.skip(f"no Docker daemon ({exc}); run `bash scripts/start-dockerd.sh`")
    yield c
    c.close()


@pytest.fixture
def container_factory(client: docker.DockerClient) -> Iterator[list[Container]]:
    made: list[Container] = []
    yield made
    for c in made:  # by id: only what this test created
        with contextlib.suppress(docker.errors.NotFound):
            c.remove(force=True)


def _hog(client: docker.DockerClient, made: list[Container], script: str,
         ) -> Container:
    image = busybox_image(client)
    c = client.containers.run(
        image, ["sh", "-c", script], detach=True, mem_limit="32m", memswap_limit="32m",
        labels={"appliance.test": "oom-watch"},
    )
    made.append(c)
    for _ in range(100):
        c.reload()
        if c.attrs["State"]["Running"] and c.attrs["State"]["Pid"]:
            return c
        time.sleep(0.05)
    raise AssertionError(f"container {c.id} did not start: {c.attrs['State']}")


def _cgroup_kills() -> float:
    value = metrics.value("appliance_oom_kills_total", {"constraint": "cgroup"})
    assert value is not None
    return value


def _release(c: Container) -> None:
    code, out = c.exec_run(["sh", "-c", ": > /tmp/go"])
    assert code == 0, out


async def _follow_until(follower: KmsgFollower, events: list[OomEvent], pid: int, timeout_s: float) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(follower.run(stop))
    try:
        deadline = time.monotonic() + timeout_s
        while not any(e.pid == pid and e.kind is OomEventKind.KILL for e in events):
            if time.monotonic() > deadline:
                raise AssertionError(f"no OOM kill of pid {pid} within {timeout_s} s; saw {events}")
            await asyncio.sleep(0.02)
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)


def test_container_limit_oom_is_seen_parsed_and_attributed(
    client: docker.DockerClient, container_factory: list[Container]
) -> None:
    # `exec` makes the hog the container's init: its host pid is State.Pid, known before the kill.
    c = _hog(client, container_factory, WAIT_THEN + "exec tail /dev/zero")
    pid = c.attrs["State"]["Pid"]
    sampled_cgroup = ProcReader().memory_cgroup(pid)
    assert sampled_cgroup == f"/docker/{c.id}"  # cgroup v1, cgroupfs driver (MEASURED.md)

    events: list[OomEvent] = []
    source = DevKmsg()  # seeks to the end: only records after this point
    follower = KmsgFollower(source, events.append)
    try:
        kills_before = _cgroup_kills()
        _release(c)
        asyncio.run(_follow_until(follower, events, pid, timeout_s=30))
    finally:
        source.close()

    kill = next(e for e in events if e.pid == pid and e.kind is OomEventKind.KILL)
    assert kill.scope is OomScope.CGROUP
    assert kill.constraint == "CONSTRAINT_MEMCG"
    assert kill.task == "tail"
    assert kill.oom_memcg == kill.task_memcg == f"/docker/{c.id}"
    assert kill.anon_rss_bytes is not None and 20 * 2**20 < kill.anon_rss_bytes <= 32 * 2**20

    launches = [
        LaunchTarget(launch_id="unrelated", container_id="0" * 64, pids=frozenset({1})),
        LaunchTarget(launch_id="hog-launch", recipe="test", container_id=c.id),
    ]
    hit = attribute_oom(kill, launches)
    assert hit is not None
    assert (hit.launch.launch_id, hit.matched_by) == ("hog-launch", MatchKind.CONTAINER_ID)
    # Attribution by the pids sampled before the kill works too (process runtime launches).
    by_pid = attribute_oom(kill.model_copy(update={"task_memcg": None, "oom_memcg": None, "cpuset": None}),
                           [LaunchTarget(launch_id="p", pids=frozenset({pid}))])
    assert by_pid is not None and by_pid.matched_by is MatchKind.PID

    diagnosis = diagnose_oom(kill, phase="weights_loading", launch_id=hit.launch.launch_id)
    assert diagnosis.title == "container memory limit"
    assert f"/docker/{c.id}" in diagnosis.detail

    metrics.record_oom_event(kill)
    assert _cgroup_kills() == kills_before + 1

    c.wait(timeout=30)
    c.reload()
    assert c.attrs["State"]["OOMKilled"] is True  # docker's own verdict agrees


def test_cgroup_counter_witnesses_a_kill_inside_a_surviving_container(
    client: docker.DockerClient, container_factory: list[Container]
) -> None:
    # The hog is a child of sh, so the container (and its cgroup) survives the kill.
    c = _hog(client, container_factory, WAIT_THEN + "tail /dev/zero; sleep 60")
    init_pid = c.attrs["State"]["Pid"]
    oom_file = resolve_oom_file(container_id=c.id)
    assert oom_file is not None and oom_file.version == 1
    witness = CgroupOomWitness(oom_file)
    assert witness.baseline == 0

    events: list[OomEvent] = []
    source = DevKmsg()
    follower = KmsgFollower(source, events.append)
    try:
        _release(c)
        deadline = time.monotonic() + 30
        while not [e for e in events if e.kind is OomEventKind.KILL]:
            assert time.monotonic() < deadline, "no OOM kill seen in 30 s"
            follower.drain()
            time.sleep(0.02)
    finally:
        source.close()

    (kill,) = [e for e in events if e.kind is OomEventKind.KILL]
    assert kill.task == "tail" and kill.pid != init_pid
    assert kill.task_memcg == f"/docker/{c.id}"
    assert c.id is not None
    short_id = c.id[:12]  # as `docker ps` prints it
    assert attribute_oom(kill, [LaunchTarget(launch_id="l", container_id=short_id)]) is not None
    deadline = time.monotonic() + 10
    seen = 0
    while seen == 0 and time.monotonic() < deadline:
        seen += witness.poll() or 0
        time.sleep(0.05)
    assert seen == 1
    c.reload()
    assert c.attrs["State"]["Running"]  # sh survived; only the hog was killed


def test_follower_starts_at_the_end_unless_asked_for_old_records(client: docker.DockerClient) -> None:
    # A probe record written to /dev/kmsg (root may write) marks "now".
    probe = f"appliance-test seek probe {os.getpid()}-{time.monotonic_ns()}"
    at_end = DevKmsg()
    from_start = DevKmsg(from_start=True)
    try:
        fd = os.open("/dev/kmsg", os.O_WRONLY)
        try:
            os.write(fd, f"<6>{probe}\n".encode())
        finally:
            os.close(fd)
        seen_end: list[str] = []
        seen_start: list[str] = []
        KmsgFollower(at_end, lambda e: None, on_record=lambda r: seen_end.append(r.message)).drain()
        KmsgFollower(from_start, lambda e: None, on_record=lambda r: seen_start.append(r.message)).drain()
    finally:
        at_end.close()
        from_start.close()
    # The end reader sees the probe and only what was logged after opening (other tests may log);
    # the start reader also sees everything still in the ring buffer before it.
    assert probe in seen_end and probe in seen_start
    assert seen_start.index(probe) > seen_end.index(probe)
    assert len(seen_start) > len(seen_end)
