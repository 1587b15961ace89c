"""The Runtime contract (controller/runtime/base.py), written once and run against every runtime
in the controller's registry whose engine runs on this host (its plug-in's `traits.placement` is
LOCAL_PROCESS or LOCAL_DAEMON: today the process and Docker runtimes). A remote-placed kind (a
cluster runtime) cannot start an engine here: it has a recorded-response suite of its own instead
(RECORDED_SUITES), and `test_every_registered_kind_is_under_the_contract_or_a_recorded_suite`
keeps a new kind from escaping both.

The engine is a stand-in (tests/fixtures/engines/standin) that speaks vLLM's HTTP surface and its
API-key check and ends on request; its LaunchSpec is rendered by the real `render()` from a recipe
(tests/integration/runtime_specs.py), so each runtime runs exactly what `appliance recipes render`
would show. What only one runtime has (the process shim's run directory and parent-death signal,
docker's create options, OOMKilled, missing images) stays in test_process_runtime.py and
test_docker_runtime.py; the real vLLM engine runs in test_process_runtime.py.

Checks that only read a running engine share one stand-in per kind (the `served` fixture); every
check that ends an engine starts its own. Waits are liveness bounds (how long before calling it a
failure), never speed assertions.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import signal
import socket
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from appliance.engine_secret import KEY_FILE_NAME
from appliance.recipe.launch_spec import LaunchSpec
from appliance.runtimes.base import Placement
from appliance.runtimes.registry import PLUGINS
from controller.runtime import KINDS, make_runtime
from controller.runtime.base import (
    LABEL_LAUNCH_ID,
    EngineHandle,
    EngineRuntimeError,
    ExitInfo,
    Runtime,
    host_cache_dirs,
)
from controller.runtime.ports import PortInUse, port_is_free
from controller.runtime.registry import RUNTIMES, engine_key_of
from controller.supervisor.launch_key import new_engine_key
from tests.integration.images import APPLIANCE_IMAGE
from tests.integration.runtime_specs import SERVED_NAME, STANDIN_KINDS, standin_spec

LIVENESS_S = 60.0
KEY_NAME = "VLLM_API_KEY"  # where the key must NOT be; README "The engine's own door"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_holder_pid(port: int) -> int | None:
    """The host PID listening on 127.0.0.1:`port` (the engine's server process)."""
    for conn in psutil.net_connections(kind="inet"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
            return int(conn.pid)
    return None


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class ProcessSide:
    """What the contract checks look at beside the Runtime protocol, for the process runtime: its
    run directory (`runs/<launch id>/`)."""

    image = None

    def __init__(self, runs: Path) -> None:
        self.runs = runs

    def records(self, handle: EngineHandle) -> str:
        """The run directory's files and the shim's command line (the shim is not an engine PID)."""
        run_dir = self.runs / handle.launch_id
        # Not the key's own file (where it belongs), nor the raw engine log (vLLM 0.26.0 logs the key
        # it read, as the stand-in does: the consumers redact it, appliance/engine_secret.py).
        texts = [p.read_text(errors="replace") for p in sorted(run_dir.iterdir())
                 if p.is_file() and p.name not in (KEY_FILE_NAME, "engine.log")]
        with contextlib.suppress(psutil.NoSuchProcess):
            texts.append(" ".join(psutil.Process(int(handle.ref)).cmdline()))
        return "\n".join(texts)

    def created(self, launch_id: str) -> bool:
        return (self.runs / launch_id).exists()

    def cleanup(self, rt: Runtime, launch_ids: list[str]) -> None:
        for handle in rt.adopt():  # by the PID files in this test's own runs directory
            rt.stop(handle, grace_s=1.0)


class DockerSide:
    """The same for the Docker runtime: the daemon's containers, found by their launch-id label
    (never others' containers on the same daemon)."""

    def __init__(self, runs: Path) -> None:
        import docker
        import docker.errors

        try:
            self.client = docker.from_env()
            self.client.ping()
        except docker.errors.DockerException as exc:
            pytest.skip(f"no Docker daemon ({exc}): start one with `bash scripts/start-dockerd.sh`")
        try:
            self.client.images.get(APPLIANCE_IMAGE)
        except docker.errors.ImageNotFound:
            pytest.skip(f"{APPLIANCE_IMAGE} not built (the stand-in needs its Python): "
                        "bash scripts/build-images.sh")
        self.image = APPLIANCE_IMAGE

    def _containers(self, launch_id: str) -> list[Any]:
        label: dict[str, str | list[str] | bool] = {"label": f"{LABEL_LAUNCH_ID}={launch_id}"}
        return list(self.client.containers.list(all=True, filters=label))

    def records(self, handle: EngineHandle) -> str:
        attrs = self.client.api.inspect_container(handle.ref)  # the environment too
        return json.dumps(attrs)

    def created(self, launch_id: str) -> bool:
        return bool(self._containers(launch_id))

    def cleanup(self, rt: Runtime, launch_ids: list[str]) -> None:
        import docker.errors

        for launch_id in launch_ids:
            for container in self._containers(launch_id):
                with contextlib.suppress(docker.errors.NotFound):
                    container.remove(force=True)
        self.client.close()


SIDES: dict[str, type[ProcessSide] | type[DockerSide]] = {"process": ProcessSide, "docker": DockerSide}


class Harness:
    """One runtime kind and what its tests need: specs rendered for it, unique launch ids, the
    per-launch key, and cleanup of everything started (by PID file / container id, never by
    pattern)."""

    def __init__(self, kind: str, tmp_path: Path) -> None:
        self.kind = kind
        self.home = tmp_path / "home"  # APPLIANCE_HOME: the cache roots render pins live here
        self.runs = self.home / "runs"
        self.side = SIDES[kind](self.runs)
        self.key = new_engine_key()
        self.launch_ids: list[str] = []

    def runtime(self) -> Runtime:
        """A new runtime object each call (through the registry): what a restarted controller has."""
        return make_runtime(self.kind, self.runs)

    def spec(self, **env: str) -> LaunchSpec:
        return standin_spec(self.kind, self.home, free_port(), image=self.side.image, env=env)

    def launch_id(self) -> str:
        launch_id = f"contract-{uuid.uuid4().hex[:12]}"
        self.launch_ids.append(launch_id)
        return launch_id

    def start(
        self, rt: Runtime, spec: LaunchSpec | None = None, **env: str
    ) -> tuple[LaunchSpec, EngineHandle]:
        """Start the stand-in with the per-launch key and wait until it answers /health."""
        spec = spec or self.spec(**env)
        handle = rt.start(spec, self.launch_id(), engine_key=self.key)
        wait_healthy(rt, handle, spec)
        return spec, handle

    def get(self, spec: LaunchSpec, path: str, *, key: str | None = "") -> httpx.Response:
        return httpx.get(spec.base_url + path, headers=self._auth(key), timeout=10)

    def post(
        self, spec: LaunchSpec, path: str, body: dict[str, Any], *, key: str | None = ""
    ) -> httpx.Response:
        return httpx.post(spec.base_url + path, json=body, headers=self._auth(key), timeout=30)

    def _auth(self, key: str | None) -> dict[str, str]:
        key = self.key if key == "" else key
        return {} if key is None else {"Authorization": f"Bearer {key}"}

    def records(self, handle: EngineHandle) -> str:
        """Everything the runtime keeps about a launch besides the engine's own environment."""
        return self.side.records(handle)

    def created(self, launch_id: str) -> bool:
        """Whether anything was made for `launch_id` (a run directory, a container)."""
        return self.side.created(launch_id)

    def cleanup(self) -> None:
        self.side.cleanup(self.runtime(), self.launch_ids)


# Where an engine runs on this host, so the contract can start one here.
LOCAL_PLACEMENTS = frozenset({Placement.LOCAL_PROCESS, Placement.LOCAL_DAEMON})
# Remote-placed kinds → their suite against recorded API responses (the contract's stand-in
# cannot reach another node from here).
RECORDED_SUITES: dict[str, str] = {"kubernetes": "tests/unit/test_runtime_kubernetes.py"}
REPO = Path(__file__).resolve().parents[2]


def _placement(kind: str) -> Placement | None:
    plugin = PLUGINS.get(kind)  # the pure half: a kind missing there is caught by the test below
    return None if plugin is None else plugin.traits.placement


CONTRACT_KINDS: tuple[str, ...] = tuple(k for k in KINDS if _placement(k) in LOCAL_PLACEMENTS)


def _kinds() -> list[Any]:
    """The contract's kinds, with the markers their stand-in needs (docker: a daemon). A local kind
    with no stand-in gets none here and fails its cases (and the test below says why)."""
    return [pytest.param(kind, marks=[getattr(pytest.mark, m) for m in STANDIN_KINDS.get(kind, ())])
            for kind in CONTRACT_KINDS]


def test_every_registered_kind_is_under_the_contract_or_a_recorded_suite() -> None:
    """A kind whose engine runs here is in the contract, with a stand-in launch and a side to look
    at; any other kind is remote-placed and has its recorded-response suite, which tests its own
    effectful module. So a new runtime cannot end up tested by neither."""
    for kind in KINDS:
        placement = _placement(kind)
        assert placement is not None, f"{kind} is in the controller registry but has no pure plug-in"
        if kind in CONTRACT_KINDS:
            assert kind in STANDIN_KINDS, f"local runtime {kind} has no stand-in launch (runtime_specs.py)"
            assert kind in SIDES, f"local runtime {kind} has no contract side (SIDES)"
            continue
        assert placement is Placement.REMOTE, f"{kind} ({placement}) is neither local nor remote"
        suite = RECORDED_SUITES.get(kind)
        assert suite is not None, f"remote runtime {kind} is not in the contract and has no recorded suite"
        module = RUNTIMES[kind].module
        assert f"from {module} import" in (REPO / suite).read_text(), f"{suite} does not test {module}"


@pytest.fixture(params=_kinds())
def h(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    kind = str(request.param)
    harness = Harness(kind, tmp_path)
    try:
        yield harness
    finally:
        harness.cleanup()


def wait_healthy(rt: Runtime, handle: EngineHandle, spec: LaunchSpec) -> None:
    """Poll /health (the supervisor's first probe) while the engine runs."""
    deadline = time.monotonic() + LIVENESS_S
    while True:
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(spec.base_url + "/health", timeout=2).status_code == 200:
                return
        info = rt.inspect(handle)
        if not info.running or time.monotonic() > deadline:
            log, _ = rt.read_logs(handle, 0)
            raise AssertionError(f"the stand-in did not become healthy ({info}); its log:\n{log}")
        time.sleep(0.05)


def wait_for_log(rt: Runtime, handle: EngineHandle, pattern: str, offset: int = 0) -> tuple[str, int]:
    """Poll read_logs from `offset` until `pattern` appears; the text read and the new offset."""
    text = ""
    deadline = time.monotonic() + LIVENESS_S
    while True:
        chunk, offset = rt.read_logs(handle, offset)
        text += chunk
        if re.search(pattern, text):
            return text, offset
        if time.monotonic() > deadline:
            raise AssertionError(f"{pattern!r} not in the log after {LIVENESS_S} s; read so far:\n{text}")
        time.sleep(0.05)


def outcome(info: ExitInfo) -> tuple[bool, int | None, int | None]:
    return info.running, info.exit_code, info.signal


# -- one running engine per kind: what reading it proves --------------------------------------------


@dataclass
class Served:
    """A stand-in started once per kind for the checks that only look at a running engine."""

    h: Harness
    rt: Runtime
    spec: LaunchSpec
    handle: EngineHandle
    cache_dirs_before_start: list[bool]  # whether each host cache dir existed before start()
    controller_log: str  # what the controller's own loggers said while starting it


@pytest.fixture(scope="module", params=_kinds())
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    h = Harness(str(request.param), tmp_path_factory.mktemp(f"served-{request.param}"))
    try:
        rt = h.runtime()
        spec = h.spec()
        before = [d.exists() for d in host_cache_dirs(spec)]
        captured = io.StringIO()
        handler = logging.StreamHandler(captured)
        handler.setLevel(logging.DEBUG)
        root = logging.getLogger()
        level = root.level
        root.addHandler(handler)
        root.setLevel(logging.DEBUG)
        try:
            spec, handle = h.start(rt, spec)
        finally:
            root.removeHandler(handler)
            root.setLevel(level)
        yield Served(h, rt, spec, handle, before, captured.getvalue())
    finally:
        h.cleanup()


def test_start_runs_the_rendered_command_and_answers(served: Served) -> None:
    h, rt, spec, handle = served.h, served.rt, served.spec, served.handle
    assert (handle.runtime, handle.recipe, handle.spec_hash) == (rt.name, spec.recipe, spec.spec_hash)
    assert rt.name == h.kind
    assert handle.launch_id == h.launch_ids[0]
    assert rt.inspect(handle).running
    assert rt.wait(handle, 0.1).running  # a wait that times out says "still running"

    info = h.get(spec, "/standin/info").json()
    # Exactly the rendered command (`python -m MODULE ARGS`: sys.argv[0] is the module's file), and
    # the key's config file at the variant's one path (appliance/engine_secret.py).
    assert info["argv"][1:-2] == list(spec.argv[3:])
    assert info["argv"][-2] == "--config" and info["argv"][-1].endswith(KEY_FILE_NAME)
    assert spec.argv[1:3] == ("-m", "vllm.entrypoints.openai.api_server")
    assert {k: info["env"].get(k) for k in spec.env} == spec.env  # every variable, exactly
    models = h.get(spec, "/v1/models").json()
    assert [m["id"] for m in models["data"]] == [SERVED_NAME]
    answer = h.post(spec, "/v1/chat/completions", {"model": SERVED_NAME, "messages": []}).json()
    assert answer["usage"]["completion_tokens"] >= 1


def test_the_key_is_only_in_the_engine_environment(served: Served) -> None:
    h, rt, spec, handle = served.h, served.rt, served.spec, served.handle
    # The engine has it (and enforces it), and the runtime reads it back (after an adoption, too).
    assert h.get(spec, "/v1/models", key=None).status_code == 401
    assert h.get(spec, "/v1/models", key="not-the-key").status_code == 401
    assert h.get(spec, "/v1/models").status_code == 200
    assert rt.read_engine_key(handle) == h.key
    assert h.runtime().read_engine_key(handle) == h.key
    assert engine_key_of(handle.runtime, handle.ref) == h.key  # the CLI's reader, by ref
    # ...and nothing else does: not argv, not the environment (vLLM 0.26.0 hashes
    # VLLM_API_KEY into its compile-cache key), not the runtime's records.
    pids = rt.engine_pids(handle)
    assert pids
    for pid in pids:
        proc = psutil.Process(pid)
        assert h.key not in " ".join(proc.cmdline())
        if h.kind == "process":  # a container's processes: their environment is the record's Env
            assert h.key not in json.dumps(proc.environ()) and KEY_NAME not in proc.environ()
    assert h.key not in h.records(handle)
    assert h.key not in handle.model_dump_json()
    assert h.key not in spec.model_dump_json()
    # The stand-in logs its arguments with the key, as vLLM 0.26.0 does. Every local kind redacts it
    # as it is written, so no file on disk holds it: the process runtime's shim writes engine.log
    # through the redaction, the Docker runtime's container wrapper (PID 1) hands the daemon's json
    # log only redacted output.
    raw = rt.read_logs(handle, 0)[0]
    assert "non-default args" in raw and "'api_key': '<redacted>'" in raw
    assert h.key not in raw
    assert served.controller_log  # the runtime did log its start; the key was not in it
    assert h.key not in served.controller_log


def test_engine_pids_hold_its_port_and_cpu_seconds_count_its_work(served: Served) -> None:
    h, rt, spec, handle = served.h, served.rt, served.spec, served.handle
    holder = port_holder_pid(spec.port)
    pids = rt.engine_pids(handle)
    assert holder is not None and holder in pids
    assert all(psutil.pid_exists(pid) for pid in pids)

    before = rt.cpu_seconds(handle)
    h.post(spec, "/standin/burn", {"cpu_s": 0.5})
    after = rt.cpu_seconds(handle)
    assert after - before >= 0.45  # CPU time the engine spent, not wall time (10 ms ticks)


def test_a_port_held_by_another_process_is_refused_naming_it(h: Harness) -> None:
    rt = h.runtime()
    spec = h.spec()
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", spec.port))
        squatter.listen()
        launch_id = h.launch_id()
        held = rf"127\.0\.0\.1:{spec.port} is already in use by pid {os.getpid()}\b"
        with pytest.raises(PortInUse, match=held):
            rt.start(spec, launch_id, engine_key=h.key)
        assert not h.created(launch_id)  # refused before anything was made


def test_a_port_held_by_the_previous_engine_is_refused_naming_it(served: Served) -> None:
    # The usual holder: the previous engine, still running.
    h, rt, spec, handle = served.h, served.rt, served.spec, served.handle
    holder = port_holder_pid(spec.port)
    assert holder in rt.engine_pids(handle)
    second = h.launch_id()
    with pytest.raises(PortInUse, match=rf"in use by pid {holder}\b"):
        rt.start(spec, second, engine_key=h.key)
    assert not h.created(second)
    assert rt.inspect(handle).running  # the refusal did not touch the running engine


def test_cache_dirs_exist_before_the_engine_starts(served: Served) -> None:
    h, spec = served.h, served.spec
    dirs = host_cache_dirs(spec)
    assert len(dirs) == len(spec.cache_dirs()) == 4  # VLLM_CACHE_ROOT, inductor, triton, TMPDIR
    assert served.cache_dirs_before_start == [False] * 4  # start() made them...
    assert all(d.is_dir() for d in dirs)
    # ...before the engine ran: it saw its TMPDIR in place (tempfile falls back to /tmp silently).
    assert h.get(spec, "/standin/info").json()["tmpdir"] == spec.env["TMPDIR"]


# -- logs ----------------------------------------------------------------------------------------


def test_logs_are_read_by_byte_offset(served: Served) -> None:
    h, rt, spec, handle = served.h, served.rt, served.spec, served.handle
    first, end = wait_for_log(rt, handle, r"startup complete")
    # Lines of earlier requests (the stand-in logs each one) can reach a container's log a moment
    # later (the daemon's log driver is asynchronous): read on until the log has settled.
    quiet = 0
    for _ in range(100):
        more, later = rt.read_logs(handle, end)
        if more:
            first, end, quiet = first + more, later, 0
        else:
            quiet += 1
        if quiet >= 3:  # unchanged over three reads 0.2 s apart
            break
        time.sleep(0.2)
    assert "standin: héllo wörld ✓\n" in first
    assert "a line on stderr\n" in first  # stderr goes to the same log
    assert end == len(first.encode())
    assert rt.read_logs(handle, end) == ("", end)  # nothing new

    h.post(spec, "/standin/log", {"text": "later ✓ line"})
    more, new_end = wait_for_log(rt, handle, r"later ✓ line\n", offset=end)
    assert new_end == end + len(more.encode())
    whole, whole_end = rt.read_logs(handle, 0)
    assert (whole, whole_end) == (first + more, new_end)
    # From any line boundary: the rest, and the same end.
    cut = whole.index("standin: héllo")
    assert rt.read_logs(handle, len(whole[:cut].encode())) == (whole[cut:], new_end)
    assert h.runtime().read_logs(handle, end) == (more, new_end)  # a fresh runtime reads the same


# -- how an engine ends --------------------------------------------------------------------------


def _die(h: Harness, spec: LaunchSpec, how: str) -> None:
    if how == "killed":  # from outside, like the kernel's OOM killer
        holder = port_holder_pid(spec.port)
        assert holder is not None
        os.kill(holder, signal.SIGKILL)
        return
    path, body = {
        "clean-exit": ("/standin/exit", {"code": 0}),
        "crash": ("/standin/exit", {"code": 3}),
        "abort": ("/standin/signal", {"signal": int(signal.SIGABRT)}),
    }[how]
    with contextlib.suppress(httpx.TransportError):  # it may end before the answer arrives
        h.post(spec, path, body)


@pytest.mark.parametrize(
    ("how", "expected"),
    [
        ("clean-exit", (False, 0, None)),
        ("crash", (False, 3, None)),
        # DOMAIN §5: importing vllm before torch dies with SIGABRT, "exit 134"; docker reports a
        # signal death as 128+N, and the process runtime follows that convention.
        ("abort", (False, 134, int(signal.SIGABRT))),
        ("killed", (False, 137, int(signal.SIGKILL))),
    ],
)
def test_the_death_is_seen_with_how_it_ended(
    h: Harness, how: str, expected: tuple[bool, int | None, int | None]
) -> None:
    rt = h.runtime()
    spec, handle = h.start(rt)
    _die(h, spec, how)
    # wait() returns when the engine ended (event-driven in the process runtime, the daemon's state
    # in docker): assert on what it says, never on how long it took.
    info = rt.wait(handle, LIVENESS_S)
    assert outcome(info) == expected
    assert outcome(rt.inspect(handle)) == expected
    fresh = h.runtime()  # a restarted controller knows how it ended, too
    assert outcome(fresh.inspect(handle)) == expected
    # Stopping the dead returns its status, once nothing of it is left (the supervisor's way after a
    # death) — and then it is not adopted. (Before that stop the process runtime still adopts an
    # ended engine whose shim is reaping: test_process_runtime.py's xfail.)
    assert outcome(fresh.stop(handle, grace_s=1.0)) == expected
    assert handle.launch_id not in [x.launch_id for x in fresh.adopt()]
    assert rt.engine_pids(handle) == []
    assert rt.cpu_seconds(handle) == 0.0


def test_stop_sends_term_and_returns_the_engine_exit_code(h: Harness) -> None:
    rt = h.runtime()
    spec, handle = h.start(rt, STANDIN_TERM_EXIT="7")
    info = rt.stop(handle, grace_s=LIVENESS_S)
    assert outcome(info) == (False, 7, None)
    text, _ = rt.read_logs(handle, 0)
    assert text.count("got signal 15") == 1  # TERM, once
    assert rt.engine_pids(handle) == []
    assert port_is_free("127.0.0.1", spec.port)
    assert outcome(rt.stop(handle, grace_s=1.0)) == (False, 7, None)  # again: the same status


def test_stop_escalates_to_kill_when_term_is_ignored(h: Harness) -> None:
    rt = h.runtime()
    spec, handle = h.start(rt, STANDIN_IGNORE_TERM="1")
    holder = port_holder_pid(spec.port)
    assert holder is not None
    info = rt.stop(handle, grace_s=1.0)
    assert outcome(info) == (False, 137, int(signal.SIGKILL))
    assert not alive(holder)
    assert port_is_free("127.0.0.1", spec.port)


# -- adoption --------------------------------------------------------------------------------------


def test_a_fresh_runtime_adopts_the_running_engine_only(h: Harness) -> None:
    rt = h.runtime()
    spec, handle = h.start(rt, STANDIN_TERM_EXIT="5")
    ended_spec, ended = h.start(rt)
    _die(h, ended_spec, "clean-exit")
    assert not rt.wait(ended, LIVENESS_S).running
    assert outcome(rt.stop(ended, grace_s=1.0)) == (False, 0, None)  # as the supervisor does

    fresh = h.runtime()  # a controller restart: nothing shared but the PID files / the daemon
    ours = [x for x in fresh.adopt() if x.launch_id in h.launch_ids]
    assert [x.launch_id for x in ours] == [handle.launch_id]
    adopted = ours[0]
    assert adopted.model_dump(exclude={"started_at"}) == handle.model_dump(exclude={"started_at"})
    assert adopted.spec_hash == spec.spec_hash
    assert adopted.started_at == pytest.approx(handle.started_at, abs=1e-3)

    assert fresh.inspect(adopted).running
    assert fresh.read_engine_key(adopted) == h.key
    assert fresh.engine_pids(adopted) == rt.engine_pids(handle)
    assert "startup complete" in fresh.read_logs(adopted, 0)[0]
    # Not its child (process) / not its client (docker), yet the exit code is known.
    assert outcome(fresh.stop(adopted, grace_s=LIVENESS_S)) == (False, 5, None)
    assert handle.launch_id not in [x.launch_id for x in fresh.adopt()]
    assert outcome(rt.inspect(handle)) == (False, 5, None)


# -- start refusals --------------------------------------------------------------------------------


def test_a_launch_id_is_used_once(h: Harness) -> None:
    rt = h.runtime()
    spec, handle = h.start(rt)
    _die(h, spec, "clean-exit")
    assert not rt.wait(handle, LIVENESS_S).running
    with pytest.raises(EngineRuntimeError):
        rt.start(h.spec(), handle.launch_id, engine_key=h.key)
    assert outcome(rt.inspect(handle)) == (False, 0, None)  # the record of the first is intact


def test_make_runtime_gives_a_runtime_for_the_kind(h: Harness) -> None:
    rt = h.runtime()
    assert isinstance(rt, Runtime)
    assert rt.name == h.kind
