"""ProcessRuntime pieces that need no engine: the environment rule, log offsets, the PID-identity
guard (checked against this test process itself), the shim's pure helpers, and start() refusals."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import psutil
import pytest

from appliance.recipe.launch_spec import LaunchSpec
from controller.runtime.base import EngineHandle, EngineRuntimeError, ExitInfo
from controller.runtime.log_offsets import decode_from, read_log_file, slice_log
from controller.runtime.process import (
    FALLBACK_PATH,
    HANDLE_FILE,
    PROCESS_FILE,
    STATUS_FILE,
    ProcessIdentity,
    ProcessRuntime,
    engine_env,
    started_after_boot,
)
from controller.runtime.process_shim import exit_code_of, parse_args
from tests.unit.spec_helpers import launch_spec


def spec(**extra: object) -> LaunchSpec:
    fields: dict[str, object] = {
        "recipe": "cpu-smollm2",
        "spec_hash": "0123456789abcdef",
        "argv": (sys.executable, "-c", "pass"),
        "env": {"A": "1"},
        "served_model_name": "smollm2",
        "cache_root": "/tmp",
        **extra,
    }
    return launch_spec("process", {"python": sys.executable}, **fields)


# -- environment ---------------------------------------------------------------------------------


def test_engine_env_adds_only_path_and_home() -> None:
    parent = {"PATH": "/p", "HOME": "/h", "SECRET": "x", "VLLM_LOGGING_LEVEL": "DEBUG"}
    assert engine_env({"A": "1"}, parent) == {"A": "1", "PATH": "/p", "HOME": "/h"}


def test_engine_env_spec_values_win_and_fallbacks_exist() -> None:
    assert engine_env({"PATH": "/mine", "HOME": "/me"}, {"PATH": "/p", "HOME": "/h"}) == {
        "PATH": "/mine",
        "HOME": "/me",
    }
    env = engine_env({}, {})
    assert env["PATH"] == FALLBACK_PATH
    assert env["HOME"]  # from the password database


# -- log offsets ---------------------------------------------------------------------------------


def test_decode_never_splits_a_utf8_character() -> None:
    data = "ok ✓".encode()  # ✓ is 3 bytes
    text, offset = decode_from(data[:-1], 100)
    assert (text, offset) == ("ok ", 103)  # the partial ✓ is left for the next poll
    rest, offset2 = decode_from(data[3:], offset)
    assert (rest, offset2) == ("✓", 106)


def test_invalid_bytes_are_replaced_not_raised() -> None:
    assert decode_from(b"a\xffb\n", 0) == ("a\ufffdb\n", 4)


def test_read_log_file_offsets(tmp_path: Path) -> None:
    path = tmp_path / "engine.log"
    assert read_log_file(path, 0) == ("", 0)  # not created yet
    path.write_bytes(b"line 1\nline 2\n")
    assert read_log_file(path, 0) == ("line 1\nline 2\n", 14)
    assert read_log_file(path, 7) == ("line 2\n", 14)
    assert read_log_file(path, 14) == ("", 14)
    path.write_bytes(b"new\n")  # truncated/replaced: start again
    assert read_log_file(path, 14) == ("new\n", 4)


def test_slice_log() -> None:
    blob = b"a\nb\n"
    assert slice_log(blob, 2) == ("b\n", 4)
    assert slice_log(blob, 99) == ("a\nb\n", 4)


# -- the shim's helpers ------------------------------------------------------------------------------


def test_exit_code_convention_matches_docker() -> None:
    assert exit_code_of(0) == (0, None)
    assert exit_code_of(3) == (3, None)
    assert exit_code_of(-6) == (134, 6)  # SIGABRT, DOMAIN §5
    assert exit_code_of(-9) == (137, 9)
    # An engine that *exits* with 137 or 255 (a wrapper shell passing its child's status on) was not
    # killed by a signal: only a negative returncode is one (a mutant reading codes > 128 as signals
    # survived the suite).
    assert exit_code_of(137) == (137, None)
    assert exit_code_of(255) == (255, None)
    assert exit_code_of(129) == (129, None)


def test_shim_args() -> None:
    args = parse_args(["--status", "/r/s.json", "--orphan-grace", "2", "--", "python", "-m", "x", "--flag"])
    assert (args.status, args.orphan_grace, args.command) == (
        Path("/r/s.json"),
        2.0,
        ["python", "-m", "x", "--flag"],
    )
    with pytest.raises(SystemExit):
        parse_args(["--status", "/r/s.json", "--"])


# -- identity: PID reuse ---------------------------------------------------------------------------


def _me() -> ProcessIdentity:
    proc = psutil.Process()
    return ProcessIdentity(
        pid=proc.pid,
        create_time=proc.create_time(),
        started_after_boot=started_after_boot(proc),
        cmdline=tuple(proc.cmdline()),
    )


def test_live_process_requires_same_start_and_cmdline() -> None:
    me = _me()
    assert ProcessRuntime._live_process(me) is not None
    reused = me.model_copy(update={"started_after_boot": (me.started_after_boot or 0) - 5})
    assert ProcessRuntime._live_process(reused) is None
    assert ProcessRuntime._live_process(me.model_copy(update={"cmdline": ("python", "other")})) is None


def test_a_wall_clock_step_does_not_disown_the_engine() -> None:
    # The epoch create time moves with the clock (boot time = now - uptime); the start after boot does not.
    me = _me()
    assert (
        ProcessRuntime._live_process(me.model_copy(update={"create_time": me.create_time + 3600})) is not None
    )


def test_identity_recorded_without_boot_relative_start_falls_back_to_epoch() -> None:
    me = _me().model_copy(update={"started_after_boot": None})
    assert ProcessRuntime._live_process(me) is not None
    assert ProcessRuntime._live_process(me.model_copy(update={"create_time": me.create_time - 5})) is None


def _record(runs: Path, launch_id: str, identity: ProcessIdentity) -> EngineHandle:
    run_dir = runs / launch_id
    run_dir.mkdir(parents=True)
    handle = EngineHandle(
        launch_id=launch_id,
        runtime="process",
        ref=str(identity.pid),
        recipe="r",
        spec_hash="h",
        log_path=str(run_dir / "engine.log"),
        started_at=identity.create_time,
    )
    (run_dir / HANDLE_FILE).write_text(handle.model_dump_json())
    (run_dir / PROCESS_FILE).write_text(identity.model_dump_json())
    return handle


def test_adopt_finds_the_recorded_live_process_only(tmp_path: Path) -> None:
    me = _me()
    live = _record(tmp_path, "live", me)
    _record(
        tmp_path, "reused", me.model_copy(update={"started_after_boot": (me.started_after_boot or 0) - 5})
    )
    (tmp_path / "garbage").mkdir()
    (tmp_path / "garbage" / HANDLE_FILE).write_text("{not json")
    assert ProcessRuntime(tmp_path).adopt() == [live]


def test_ended_engine_status_comes_from_the_shim_file(tmp_path: Path) -> None:
    me = _me()
    handle = _record(
        tmp_path, "ended", me.model_copy(update={"started_after_boot": (me.started_after_boot or 0) - 5})
    )
    rt = ProcessRuntime(tmp_path)
    assert rt.inspect(handle) == ExitInfo(running=False)  # no status file: unknowable for a non-child
    (tmp_path / "ended" / STATUS_FILE).write_text(json.dumps({"exit_code": 137, "signal": 9}))
    assert rt.inspect(handle) == ExitInfo(running=False, exit_code=137, signal=9)
    assert rt.engine_pids(handle) == [] and rt.cpu_seconds(handle) == 0.0


def test_identity_file_must_agree_with_the_handle(tmp_path: Path) -> None:
    me = _me()
    handle = _record(tmp_path, "l", me)
    rt = ProcessRuntime(tmp_path)
    with pytest.raises(EngineRuntimeError, match="records pid"):
        rt.inspect(handle.model_copy(update={"ref": str(me.pid + 1)}))


# -- start refusals (nothing is spawned) -----------------------------------------------------------


def test_start_refuses_docker_specs_bad_ids_missing_programs_and_workdirs(tmp_path: Path) -> None:
    rt = ProcessRuntime(tmp_path)
    with pytest.raises(EngineRuntimeError, match="'docker' runtime"):
        rt.start(launch_spec("docker", {"image": "x"}), "l1")
    with pytest.raises(EngineRuntimeError, match="safe directory name"):
        rt.start(spec(), "../escape")
    with pytest.raises(EngineRuntimeError, match=r"not an executable.*appliance engine setup"):
        rt.start(spec(argv=("/no/such/venv/bin/python", "-m", "vllm")), "l1")
    with pytest.raises(EngineRuntimeError, match="workdir"):
        rt.start(spec(workdir=str(tmp_path / "nope")), "l1")
    assert list(tmp_path.iterdir()) == []


def test_adopt_takes_only_this_instances_engines(tmp_path: Path) -> None:
    # Issue 23: each runtime adopts only the engines its own appliance instance launched.
    me = _me()
    mine = _record(tmp_path, "mine", me)
    (tmp_path / "mine" / HANDLE_FILE).write_text(
        mine.model_copy(update={"instance": "i-a"}).model_dump_json())
    theirs = _record(tmp_path, "theirs", me)
    (tmp_path / "theirs" / HANDLE_FILE).write_text(
        theirs.model_copy(update={"instance": "i-b"}).model_dump_json())
    assert [h.launch_id for h in ProcessRuntime(tmp_path, instance_id="i-a").adopt()] == ["mine"]
    assert [h.launch_id for h in ProcessRuntime(tmp_path, instance_id="i-b").adopt()] == ["theirs"]


def test_the_instance_id_is_made_once_and_kept(tmp_path: Path) -> None:
    from controller.settings import Paths, instance_id

    first = instance_id(Paths(tmp_path / "a"))
    assert first and instance_id(Paths(tmp_path / "a")) == first
    assert instance_id(Paths(tmp_path / "b")) != first


def test_the_recorded_error_is_the_exits_reason(tmp_path: Path) -> None:
    # Issue 23: the runtime's own note on a killed shim reaches the diagnosis through ExitInfo.reason.
    me = _me()
    handle = _record(
        tmp_path, "ended", me.model_copy(update={"started_after_boot": (me.started_after_boot or 0) - 5})
    )
    why = "the engine's shim (pid 1) was killed (killed by signal 9 (SIGKILL))"
    (tmp_path / "ended" / STATUS_FILE).write_text(json.dumps(
        {"exit_code": None, "signal": None, "ended_at": 0.0, "error": why, "complete": True}))
    info = ProcessRuntime(tmp_path).inspect(handle)
    assert (info.running, info.exit_code, info.reason) == (False, None, why)
