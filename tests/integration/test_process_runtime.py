"""What only the process runtime has, against real processes: its run directory and PID identity,
the exact environment rule, the shim (one TERM to the group, leftovers reaped, the engine dies with
its shim, the status of an engine that outlived its controller), PID-reuse guards — with the small
fake engine (tests/fixtures/engines/fake_engine.py) — and the one real vLLM CPU engine case.

What every runtime must do (start, the key, ports, logs, exit info, stop, adoption) is written once
in test_runtime_contract.py and runs against this runtime there.

Waits below are liveness bounds (how long to wait for a line before calling it a failure), never
speed assertions.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from appliance.recipe.launch_spec import LaunchSpec
from controller.runtime.base import EngineHandle, EngineRuntimeError, Runtime
from controller.runtime.ports import port_is_free
from controller.runtime.process import HANDLE_FILE, PID_FILE, PROCESS_FILE, ProcessRuntime
from tests.integration.runtime_specs import process_spec, with_argv

REPO = Path(__file__).resolve().parents[2]
FAKE_ENGINE = REPO / "tests" / "fixtures" / "engines" / "fake_engine.py"
ENGINE_PYTHON = Path("/var/lib/appliance/engine/venv/bin/python")
ENGINE_MODEL = Path("/var/lib/appliance/models/smollm2-135m-instruct")
LIVENESS_S = 60.0


def fake_spec(*args: str, env: dict[str, str] | None = None, **extra: object) -> LaunchSpec:
    return process_spec((sys.executable, str(FAKE_ENGINE), *args),
                        env={"FAKE_ENGINE": "1"} if env is None else env, **extra)


def wait_for_log(rt: Runtime, handle: EngineHandle, pattern: str, timeout_s: float = LIVENESS_S) -> str:
    """Poll read_logs (the supervisor's way) until `pattern` appears; return all text so far."""
    text, offset = "", 0
    deadline = time.monotonic() + timeout_s
    while True:
        chunk, offset = rt.read_logs(handle, offset)
        text += chunk
        if re.search(pattern, text):
            return text
        if time.monotonic() > deadline:
            raise AssertionError(f"{pattern!r} not in the log after {timeout_s} s; log so far:\n{text}")
        info = rt.inspect(handle)
        if not info.running and not chunk:
            files = sorted(p.name for p in Path(handle.log_path or ".").parent.iterdir())
            raise AssertionError(f"engine ended ({info}; run dir {files}) before {pattern!r}; log:\n{text}")
        time.sleep(0.05)


def ready_pids(text: str) -> tuple[int, list[int]]:
    match = re.search(r"READY pid=(\d+) workers=\[([\d, ]*)\]", text)
    assert match, text
    workers = [int(w) for w in match.group(2).split(",") if w.strip()]
    return int(match.group(1)), workers


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture
def runs(tmp_path: Path) -> Iterator[Path]:
    runs_dir = tmp_path / "runs"
    yield runs_dir
    # Teardown by recorded PID, through the runtime: stop whatever a test left running.
    cleanup = ProcessRuntime(runs_dir, orphan_grace_s=1.0, kill_wait_s=5.0)
    for handle in cleanup.adopt():
        cleanup.stop(handle, grace_s=1.0)


@pytest.fixture
def rt(runs: Path) -> ProcessRuntime:
    return ProcessRuntime(runs, orphan_grace_s=1.0, kill_wait_s=5.0)


def test_run_directory_identity_and_process_group(rt: ProcessRuntime, runs: Path) -> None:
    handle = rt.start(fake_spec("--workers", "2"), "launch-1")
    text = wait_for_log(rt, handle, r"READY")
    engine_pid, workers = ready_pids(text)

    run_dir = runs / "launch-1"
    assert (run_dir / PID_FILE).read_text().strip() == handle.ref
    assert EngineHandle.model_validate_json((run_dir / HANDLE_FILE).read_text()) == handle
    identity = json.loads((run_dir / PROCESS_FILE).read_text())
    shim = psutil.Process(int(handle.ref))
    assert identity["create_time"] == pytest.approx(shim.create_time(), abs=0.05)
    assert identity["started_after_boot"] == pytest.approx(shim.create_time() - psutil.boot_time(), abs=0.05)
    assert identity["cmdline"] == shim.cmdline()
    assert os.getpgid(shim.pid) == shim.pid and os.getsid(shim.pid) == shim.pid  # own session + group
    assert os.getpgid(engine_pid) == shim.pid

    pids = rt.engine_pids(handle)
    assert engine_pid in pids and set(workers) <= set(pids)  # the whole group, workers included
    assert shim.pid not in pids
    _, end = rt.read_logs(handle, 0)
    assert end == (run_dir / "engine.log").stat().st_size  # the log is the run directory's file


def test_environment_is_exactly_the_spec_plus_path_and_home(rt: ProcessRuntime, tmp_path: Path) -> None:
    dump = tmp_path / "env.json"
    spec = fake_spec("--dump-env", str(dump), env={"FAKE_ENGINE": "1", "VLLM_LOGGING_LEVEL": "INFO"})
    handle = rt.start(spec, "env-1")
    wait_for_log(rt, handle, r"READY")
    expected = {**spec.env, "PATH": os.environ["PATH"], "HOME": os.environ["HOME"]}
    assert json.loads(dump.read_text()) == expected

    # A spec that sets PATH and HOME itself gets exactly its own values.
    dump2 = tmp_path / "env2.json"
    own = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "X": "y"}
    handle2 = rt.start(fake_spec("--dump-env", str(dump2), env=own), "env-2")
    wait_for_log(rt, handle2, r"READY")
    assert json.loads(dump2.read_text()) == own


def test_source_files_are_sourced_before_the_engine(rt: ProcessRuntime, tmp_path: Path) -> None:
    env_sh = tmp_path / "platform env.sh"  # a space: the wrapper must quote it
    env_sh.write_text("export FROM_SOURCED_FILE=dtk\n")
    dump = tmp_path / "env.json"
    handle = rt.start(fake_spec("--dump-env", str(dump), source_files=(str(env_sh),)), "src-1")
    text = wait_for_log(rt, handle, r"READY")
    assert json.loads(dump.read_text())["FROM_SOURCED_FILE"] == "dtk"
    engine_pid, _ = ready_pids(text)
    assert engine_pid in rt.engine_pids(handle)  # `exec "$@"`: bash became the engine


def test_the_shim_says_in_the_log_how_the_engine_ended(rt: ProcessRuntime) -> None:
    handle = rt.start(fake_spec("--exit", "3"), "exit-3")
    info = rt.wait(handle, LIVENESS_S)
    assert (info.running, info.exit_code, info.oom_killed) == (False, 3, None)  # no OOM record here
    assert "[appliance-shim] engine" in wait_for_log(rt, handle, r"ended: exit code 3")


def test_processes_left_behind_by_the_engine_are_reaped(rt: ProcessRuntime) -> None:
    # The main process exits on TERM, its two workers ignore TERM: a stuck TP worker holding memory.
    handle = rt.start(fake_spec("--workers", "2", "--worker-ignores-term"), "orphans")
    wait_for_log(rt, handle, r"worker \d+ ready[\s\S]*worker \d+ ready")
    _, workers = ready_pids(wait_for_log(rt, handle, r"READY"))
    info = rt.stop(handle, grace_s=LIVENESS_S)
    assert (info.running, info.exit_code) == (False, 0)
    assert not any(alive(w) for w in workers)
    text, _ = rt.read_logs(handle, 0)
    assert "2 process(es) left in its group" in text


_CONTROLLER = """
import sys
from pathlib import Path
from appliance.recipe.launch_spec import LaunchSpec
from controller.runtime.process import ProcessRuntime
spec = LaunchSpec.model_validate_json(sys.argv[2])
handle = ProcessRuntime(Path(sys.argv[1])).start(spec, "survivor")
print(handle.model_dump_json(), flush=True)
sys.stdin.read()  # wait here until the test kills us
"""


def test_engine_survives_the_controller_being_killed(runs: Path) -> None:
    spec = fake_spec("--term-exit", "9")
    controller = subprocess.Popen(
        [sys.executable, "-c", _CONTROLLER, str(runs), spec.model_dump_json()],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert controller.stdout is not None
        handle = EngineHandle.model_validate_json(controller.stdout.readline())
        rt = ProcessRuntime(runs)
        wait_for_log(rt, handle, r"READY")
    finally:
        controller.kill()  # SIGKILL: the controller gets no chance to clean up
        controller.wait()
    assert rt.adopt() == [handle]
    assert rt.inspect(handle).running
    info = rt.stop(handle, grace_s=LIVENESS_S)
    assert (info.running, info.exit_code) == (False, 9)


def _gone(pids: list[int], timeout_s: float = LIVENESS_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while any(alive(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_killing_the_shim_takes_the_engine_down_and_frees_its_port(rt: ProcessRuntime) -> None:
    """`kill -9` of the shim once left the vLLM server running, reparented to init and
    holding its port; every relaunch then failed with `Address already in use`."""
    port = _free_port()
    spec = fake_spec("--workers", "1", "--listen", str(port), port=port)
    handle = rt.start(spec, "shim-killed")
    main, workers = ready_pids(wait_for_log(rt, handle, r"READY"))
    assert not port_is_free("127.0.0.1", port)

    os.kill(int(handle.ref), signal.SIGKILL)
    # The kernel TERMs the engine's main process when its shim dies (parent-death signal): the
    # runtime is not even asked yet.
    assert _gone([main]), "the engine outlived its shim"
    info = rt.wait(handle, LIVENESS_S)
    # Ended, and not recorded as the engine's "exit 137": that was the shim's status, not its engine's.
    assert (info.running, info.exit_code) == (False, None)
    # ... and the runtime's own words say why, for the diagnosis (issue 23), now and on a later look.
    assert info.reason is not None and f"shim (pid {handle.ref}) was killed" in info.reason
    assert "SIGKILL" in info.reason and rt.inspect(handle).reason == info.reason
    assert _gone(workers), "a worker outlived its shim and engine"  # the runtime ended the group
    assert port_is_free("127.0.0.1", port)
    text, _ = rt.read_logs(handle, 0)
    assert "the shim (pid" in text and "ended without recording" in text

    again = rt.start(spec, "relaunch")  # the port is ours again
    wait_for_log(rt, again, r"READY")
    assert not rt.stop(again, grace_s=LIVENESS_S).running


def test_killing_the_shim_of_an_adopted_engine_is_diagnosable_not_unknown(runs: Path) -> None:
    """Issue 23's fix (the runtime's "shim was killed" note as the exit reason) held only for an
    engine this runtime started: for an adopted one the dead shim was still a zombie (its parent, not
    this runtime, reaps it), its PID counted as "taken by another process", and the exit had no
    reason: the launch was recorded "unknown"."""
    spec = fake_spec("--workers", "1")
    controller = subprocess.Popen(  # the controller that started it, killed: the engine is adopted
        [sys.executable, "-c", _CONTROLLER, str(runs), spec.model_dump_json()],
        cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert controller.stdout is not None
    handle = EngineHandle.model_validate_json(controller.stdout.readline())
    rt = ProcessRuntime(runs, orphan_grace_s=1.0, kill_wait_s=5.0)
    main, workers = ready_pids(wait_for_log(rt, handle, r"READY"))
    assert rt.adopt() == [handle]
    try:
        os.kill(int(handle.ref), signal.SIGKILL)
        assert _gone([main]), "the engine outlived its shim"
        # Its parent (the old controller, stopped here) has not reaped it: a zombie, as under any
        # parent that is slow to reap (an init that is busy, a container's PID 1 that never does).
        assert psutil.Process(int(handle.ref)).status() == psutil.STATUS_ZOMBIE
        info = rt.wait(handle, LIVENESS_S)
        assert (info.running, info.exit_code) == (False, None)
        assert info.reason is not None and f"shim (pid {handle.ref}) was killed" in info.reason, info
        assert rt.inspect(handle).reason == info.reason  # and on every later look (the status file)
        assert _gone(workers), "a worker outlived its shim and engine"
    finally:
        controller.kill()
        controller.wait()


def test_the_engine_death_is_reported_before_its_leftovers_are_reaped(runs: Path) -> None:
    """The supervisor hears of a death at once (it takes the engine out of the gateway); the shim
    still reaps what the engine left, and stop() waits for that."""
    rt = ProcessRuntime(runs, orphan_grace_s=LIVENESS_S, kill_wait_s=5.0)
    handle = rt.start(fake_spec("--workers", "1", "--worker-ignores-term"), "leftovers")
    main, workers = ready_pids(wait_for_log(rt, handle, r"READY"))
    os.kill(main, signal.SIGKILL)
    info = rt.wait(handle, LIVENESS_S)
    assert (info.running, info.exit_code, info.signal) == (False, 137, 9)
    assert alive(workers[0])  # ignores TERM: the shim's grace is still running
    # stop() returns only once nothing of the engine is left (here: KILL after its own grace).
    assert rt.stop(handle, grace_s=1.0).exit_code == 137
    assert not alive(workers[0])


@pytest.mark.parametrize("field", ["started_after_boot", "cmdline"])
def test_pid_reuse_is_not_adopted_nor_signalled(rt: ProcessRuntime, runs: Path, field: str) -> None:
    handle = rt.start(fake_spec(), "reused")
    wait_for_log(rt, handle, r"READY")
    identity_path = runs / "reused" / PROCESS_FILE
    identity = json.loads(identity_path.read_text())
    # What the files would say if the engine had died and its PID gone to another process.
    identity[field] = identity[field] - 1000 if field == "started_after_boot" else ["/usr/bin/something-else"]
    identity_path.write_text(json.dumps(identity))

    try:
        restarted = ProcessRuntime(runs)
        assert restarted.adopt() == []
        assert not restarted.inspect(handle).running
        restarted.stop(handle, grace_s=1.0)  # must not signal the (still running) process
        assert rt.inspect(handle).running
    finally:
        # The files no longer identify it, so the fixture's adopt() cannot: stop it through `rt`,
        # which still holds the real identity (and the Popen).
        assert not rt.stop(handle, grace_s=5.0).running


def test_a_missing_engine_venv_is_an_operator_error(rt: ProcessRuntime, runs: Path) -> None:
    missing = with_argv(fake_spec(), ("/nonexistent/engine/venv/bin/python", "-m", "vllm"))
    with pytest.raises(EngineRuntimeError, match="appliance engine setup"):
        rt.start(missing, "missing")
    assert not (runs / "missing").exists()


def test_an_ended_engine_is_not_adopted_while_its_shim_reaps_leftovers(runs: Path) -> None:
    rt = ProcessRuntime(runs, orphan_grace_s=LIVENESS_S, kill_wait_s=5.0)
    handle = rt.start(fake_spec("--workers", "1", "--worker-ignores-term"), "reaping")
    main, workers = ready_pids(wait_for_log(rt, handle, r"READY"))
    try:
        os.kill(main, signal.SIGKILL)
        assert not rt.wait(handle, LIVENESS_S).running
        restarted = ProcessRuntime(runs)
        assert not restarted.inspect(handle).running
        adopted = restarted.adopt()
        # The case at hand: the shim is still there, reaping the worker that ignores TERM (it gets
        # KILL only after orphan_grace_s); were it gone, adopt() would skip the handle anyway.
        assert alive(int(handle.ref))
        assert [h.launch_id for h in adopted] == []
    finally:
        rt.stop(handle, grace_s=1.0)
        assert not alive(workers[0])


# -- the real CPU vLLM engine -------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# A fake engine that prints its keys the ways vLLM does: 0.26.0's non-default args line, an argv
# echo, stderr, and one key cut in two writes (flushed, with a pause between) across a pipe read.
_PRINTS_KEYS = """
import sys, time
own = sys.argv[sys.argv.index("--api-key") + 1]
config = open(sys.argv[sys.argv.index("--config") + 1]).read()  # as vLLM gets the launch's key
key = config.split(":", 1)[1].strip().strip("'")
print(f"INFO non-default args: {{'api_key': ['{key}'], 'port': 8000}}", flush=True)
print(f"INFO argv: serve /m --api-key {own} --port 8000", file=sys.stderr, flush=True)
sys.stdout.write("split: " + key[:7]); sys.stdout.flush(); time.sleep(0.3)
sys.stdout.write(key[7:] + " end\\n"); sys.stdout.flush()
sys.stdout.write("no newline at the end " + key); sys.stdout.flush()
"""


def test_no_file_under_the_launch_dir_holds_the_engine_key(rt: ProcessRuntime, runs: Path) -> None:
    key = "not-the-eng-shape-Zq93kdLmw0"  # only the key file says it is a key: no pattern matches it
    own = "recipe-own-key-8Hq2mZ0pLx"  # a recipe's own --api-key, in the command
    spec = process_spec((sys.executable, "-c", _PRINTS_KEYS, "--api-key", own), env={})
    handle = rt.start(spec, "keys-1", engine_key=key)
    text = wait_for_log(rt, handle, r"\[appliance-shim\] engine \(pid \d+\) ended")
    assert rt.wait(handle, LIVENESS_S).exit_code == 0
    # The lines are there, each key replaced (the split one too, and the unterminated last line).
    assert "'api_key': '<redacted>'" in text and "--api-key <redacted> --port" in text
    assert "split: <redacted> end" in text and "no newline at the end <redacted>" in text
    assert own.encode() not in (runs / "keys-1" / "engine.log").read_bytes()  # (argv, by the recipe's choice)
    # The engine ended: its key files are gone too, so no file at all holds the key.
    files = [path for path in runs.rglob("*") if path.is_file()]
    assert any(path.name == "engine.log" for path in files)
    for path in files:
        assert key.encode() not in path.read_bytes(), path


def test_a_stopped_launch_keeps_no_engine_key_file(rt: ProcessRuntime, runs: Path) -> None:
    key = "eng_" + "k" * 43
    handle = rt.start(fake_spec(), "stopped-1", engine_key=key)
    wait_for_log(rt, handle, r"READY")
    holding = sorted(p.relative_to(runs) for p in runs.rglob("*")
                     if p.is_file() and key.encode() in p.read_bytes())
    assert len(holding) == 2, holding  # its run dir's (read back on adoption) and the variant's (--config)
    assert rt.read_engine_key(handle) == key
    assert not rt.stop(handle, grace_s=LIVENESS_S).running
    assert [p for p in runs.rglob("*") if p.is_file() and key.encode() in p.read_bytes()] == []


@pytest.mark.engine
@pytest.mark.slow
def test_real_cpu_vllm_engine_starts_answers_is_adopted_and_stops(runs: Path, tmp_path: Path) -> None:
    if not ENGINE_PYTHON.exists():
        pytest.skip(f"CPU engine not installed ({ENGINE_PYTHON} missing): run `appliance engine setup`")
    if not (ENGINE_MODEL / "config.json").exists():
        pytest.skip(f"model not converted ({ENGINE_MODEL}/config.json missing): run `appliance engine setup`")
    port = _free_port()
    spec = process_spec(
        (
            str(ENGINE_PYTHON),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(ENGINE_MODEL),
            "--served-model-name",
            "smollm2",
            "--max-model-len",
            "2048",
            "--dtype",
            "bfloat16",
            "--enforce-eager",  # this test is about the runtime, not the compile cache: skip compiling
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ),
        env={
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache"),
            "VLLM_LOGGING_LEVEL": "INFO",  # DOMAIN §2: never DEBUG
            "PYTHONUNBUFFERED": "1",
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
        },
        recipe="cpu-smollm2-test",
        spec_hash="feedfacecafebeef",
        port=port,
        served_model_name="smollm2",
        cache_root=str(tmp_path / "vllm-cache"),
        ready_budget_s=900,
        stall_window_s=600,
    )
    rt = ProcessRuntime(runs, orphan_grace_s=10.0)
    handle = rt.start(spec, "real-engine")
    try:
        wait_for_log(rt, handle, r"Application startup complete", timeout_s=900)
        with urllib.request.urlopen(f"{spec.base_url}/health", timeout=30) as resp:
            assert resp.status == 200
        body = json.dumps(
            {
                "model": "smollm2",
                "messages": [{"role": "user", "content": "What is the capital of France?"}],
                "max_tokens": 16,
                "temperature": 0,
            }
        ).encode()
        request = urllib.request.Request(
            f"{spec.base_url}/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=120) as resp:
            answer = json.load(resp)
        # A completion was produced; its words are the model's business (they differ between CPUs).
        assert isinstance(answer["choices"][0]["message"]["content"], str)
        assert answer["usage"]["completion_tokens"] >= 1

        pids = rt.engine_pids(handle)
        assert len(pids) >= 2  # API server + engine core
        assert rt.cpu_seconds(handle) > 0
        assert ProcessRuntime(runs).adopt() == [handle]
    finally:
        info = rt.stop(handle, grace_s=60)
    assert not info.running
    assert info.signal in (None, int(signal.SIGTERM)), info  # a clean TERM shutdown, not a KILL
    assert not any(alive(pid) for pid in pids)
