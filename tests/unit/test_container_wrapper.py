"""The Docker runtime's container wrapper (controller/runtime/container_wrapper.py), run here as the
container runs it — a script under `python -I -S` — around small shell "engines": output redacted
per stream and passed on line by line while the engine runs, TERM/INT relayed once, the engine's
exit status (128+N for signal N) as its own, the exec'd environment unchanged. Plus the pure pieces
it imports (appliance/engine_redact.py) and the files and arguments the runtime gives the container.

The real container (the daemon's json log on disk, `docker stop`) is in
tests/integration/test_docker_runtime.py.
"""

from __future__ import annotations

import io
import os
import select
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from appliance.engine_redact import REDACTED, argv_keys, config_key
from appliance.engine_secret import CONTAINER_KEY_PATH, config_yaml
from appliance.recipe.launch_spec import LaunchSpec
from appliance.runtimes.docker import (
    ENGINE_PYTHON,
    WRAPPER_MODULES,
    WRAPPER_ROOT,
    WRAPPER_SCRIPT,
    container_kwargs,
    wrapped_argv,
)
from controller.runtime import container_wrapper
from controller.runtime.docker import _wrapper_tar
from controller.supervisor.launch_key import new_engine_key
from tests.unit.test_runtime_docker import FakeClient, gfx906_spec, runtime

REPO = Path(__file__).resolve().parents[2]
WRAPPER = REPO / "controller" / "runtime" / "container_wrapper.py"
OUT_WAIT_S = 30.0  # a bound on waiting for output, never a timing assertion


@pytest.fixture
def key_file(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    key = new_engine_key()
    path = tmp_path / "engine-key.yaml"
    path.write_text(config_yaml(key))
    yield path, key


def start(script: str, *args: str, key_file: Path | None = None,
          env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """The wrapper around `sh -c SCRIPT engine ARGS...`, as the container runs it (-I -S)."""
    key = ["--key-file", str(key_file)] if key_file is not None else []
    return subprocess.Popen(
        [sys.executable, "-I", "-S", str(WRAPPER), *key, "--", "sh", "-c", script, "engine", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env if env is not None else {"PATH": os.defpath},
    )


def read_until(stream: object, needle: bytes) -> bytes:
    """What `stream` (a pipe) gave until `needle` appeared; fails after OUT_WAIT_S without it."""
    fd = stream.fileno()  # type: ignore[attr-defined]
    seen = b""
    deadline = time.monotonic() + OUT_WAIT_S
    while needle not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"{needle!r} not seen; got {seen!r}"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 65536)
            assert chunk, f"stream ended before {needle!r}; got {seen!r}"
            seen += chunk
    return seen


# -- what it passes on ------------------------------------------------------------------------------


def test_stdout_and_stderr_are_redacted_each_on_its_own_stream(key_file: tuple[Path, str]) -> None:
    """The key file's key (in vLLM 0.26's args line), a recipe's own `--api-key` and VLLM_API_KEY."""
    path, key = key_file
    own = "recipe-own-key-0123456789"
    script = ("key=$(sed -n 's/^api-key: //p' \"$1\"); "
              "echo \"non-default args: {'model': '/m', 'api_key': ['$key']}\"; "
              "echo \"stderr: $3 and $VLLM_API_KEY\" >&2")
    env = {"PATH": os.defpath, "VLLM_API_KEY": "env-key-9876543210"}
    proc = start(script, str(path), "--api-key", own, key_file=path, env=env)
    out, err = proc.communicate(timeout=OUT_WAIT_S)
    assert proc.returncode == 0
    assert out == f"non-default args: {{'model': '/m', 'api_key': '{REDACTED}'}}\n".encode()
    assert err == f"stderr: {REDACTED} and {REDACTED}\n".encode()
    assert key.encode() not in out + err


def test_a_line_is_passed_on_before_the_engine_ends(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    proc = start('echo "loading weights"; while [ ! -e "$1" ]; do sleep 0.05; done; echo done', str(gate))
    seen = read_until(proc.stdout, b"loading weights\n")
    assert proc.poll() is None
    gate.touch()
    out, _ = proc.communicate(timeout=OUT_WAIT_S)
    assert seen + out == b"loading weights\ndone\n" and proc.returncode == 0


# -- signals and the exit status --------------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_reaches_the_engine_once_and_its_exit_code_is_the_wrappers(sig: signal.Signals) -> None:
    name = sig.name.removeprefix("SIG")
    proc = start(f'trap \'echo "got {name}"; exit 7\' {name}; echo ready; while :; do sleep 0.05; done')
    read_until(proc.stdout, b"ready\n")
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=OUT_WAIT_S)
    assert out.count(f"got {name}".encode()) == 1
    assert proc.returncode == 7


def test_a_signal_death_is_128_plus_n() -> None:
    proc = start("kill -ABRT $$")
    _, err = proc.communicate(timeout=OUT_WAIT_S)
    assert proc.returncode == 128 + signal.SIGABRT
    assert b"killed by signal 6: exit code 134" in err


def test_an_engine_killed_from_outside_is_137() -> None:
    proc = start("echo $$; while :; do sleep 0.05; done")
    pid = int(read_until(proc.stdout, b"\n").strip())
    os.kill(pid, signal.SIGKILL)
    proc.communicate(timeout=OUT_WAIT_S)
    assert proc.returncode == 137


def test_a_missing_engine_is_127_saying_why() -> None:
    proc = subprocess.Popen([sys.executable, "-I", "-S", str(WRAPPER), "--", "/nonexistent/engine"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, err = proc.communicate(timeout=OUT_WAIT_S)
    assert proc.returncode == 127 and b"could not start the engine" in err


def test_the_engine_gets_the_environment_the_wrapper_was_execd_with() -> None:
    """No LC_CTYPE added (PEP 538 coerces a C locale in the wrapper's own os.environ)."""
    env = {"PATH": os.defpath, "LC_ALL": "", "LANG": "C", "A_VAR": "a b"}
    proc = start("env | sort", env=env)
    out, _ = proc.communicate(timeout=OUT_WAIT_S)
    names = {line.split("=", 1)[0] for line in out.decode().splitlines()}
    assert "LC_CTYPE" not in names and "A_VAR=a b" in out.decode().splitlines()


# -- the pure pieces --------------------------------------------------------------------------------


# Generated keys get fixed ids: a random id differs between collections (pytest-xdist's workers
# must collect the same tests), and a key does not belong in a test name.
@pytest.mark.parametrize("key", [pytest.param(new_engine_key(), id=f"generated-{i}") for i in range(20)] + [
    "plain-key_0123", "-starts-with-dash", "has'quote", "a:b#c", "'quoted'", "!bang", "yes", "~", "null1",
    "%percent", "@at", "`tick", "{brace}", "[list]", "*star", "&amp", "key:", "?q", "|bar", ">gt",
])
def test_the_stdlib_reader_agrees_with_yaml_on_every_key_file_config_yaml_writes(key: str) -> None:
    text = config_yaml(key)
    assert yaml.safe_load(text) == {"api-key": key}
    assert config_key(text) == key


def test_the_stdlib_reader_refuses_what_it_cannot_read() -> None:
    assert config_key("") is None
    assert config_key('api-key: "escaped\\x41"\n') is None
    assert config_key("other: x\n") is None


def test_argv_keys() -> None:
    assert argv_keys(["vllm", "--api-key", "k1", "--api-key=k2", "--port", "1", "--api-key"]) == ["k1", "k2"]


# -- what the runtime gives the container ------------------------------------------------------------


def test_the_wrapped_command_sources_first_then_runs_the_wrapper_in_the_engines_python() -> None:
    spec = gfx906_spec()
    kwargs = container_kwargs(spec, "L1", key_file=True, wrapped=True)
    engine = (*spec.argv, "--config", CONTAINER_KEY_PATH)
    wrapper = (ENGINE_PYTHON, "-I", "-S", WRAPPER_SCRIPT, "--key-file", CONTAINER_KEY_PATH, "--", *engine)
    sourced = spec.command()[:4]  # bash -c '. env && exec "$@"' engine
    assert kwargs["entrypoint"] == ["bash"]
    assert (*kwargs["entrypoint"], *kwargs["command"]) == (*sourced, *wrapper)
    assert {k: v for k, v in kwargs.items() if k not in ("entrypoint", "command")} == {
        k: v for k, v in container_kwargs(spec, "L1").items() if k not in ("entrypoint", "command")}


def test_without_sourced_files_the_wrapper_is_pid_1_and_without_a_key_it_reads_none() -> None:
    spec: LaunchSpec = gfx906_spec(source_files=())
    kwargs = container_kwargs(spec, "L1", wrapped=True)
    assert kwargs["entrypoint"] == [ENGINE_PYTHON]
    assert kwargs["command"] == ["-I", "-S", WRAPPER_SCRIPT, "--", *spec.argv]
    assert wrapped_argv(spec.argv, key_file=False) == (ENGINE_PYTHON, *kwargs["command"])


def _members(data: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: m for m in tar.getmembers()}


def test_the_wrapper_tar_holds_the_script_and_its_modules_readable_by_anyone_writable_by_none() -> None:
    data = _wrapper_tar()
    members = _members(data)
    top = WRAPPER_ROOT.rsplit("/", 1)[1]
    files = {f"{top}/{m.replace('.', '/')}.py" for m in WRAPPER_MODULES} | {f"{top}/appliance/__init__.py"}
    assert {n for n, m in members.items() if m.isfile()} == files
    assert all(m.mode == 0o444 and m.uid == 0 for m in members.values() if m.isfile())
    assert all(m.mode == 0o755 for m in members.values() if m.isdir())
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        script = tar.extractfile(f"{top}/controller/runtime/container_wrapper.py")
        assert script is not None and script.read() == WRAPPER.read_bytes()
    assert f"/run/{top}/controller/runtime/container_wrapper.py" == WRAPPER_SCRIPT


def test_the_wrapper_tar_extracted_runs_on_its_own(tmp_path: Path) -> None:
    """Only what the tar holds: the script finds its modules two levels up (as in the container)."""
    with tarfile.open(fileobj=io.BytesIO(_wrapper_tar())) as tar:
        tar.extractall(tmp_path, filter="data")
    script = tmp_path / WRAPPER_ROOT.rsplit("/", 1)[1] / "controller" / "runtime" / "container_wrapper.py"
    key = new_engine_key()
    done = subprocess.run([sys.executable, "-I", "-S", str(script), "--", "echo", f"key {key}"],
                          capture_output=True, timeout=OUT_WAIT_S, check=False, cwd=tmp_path)
    assert (done.returncode, done.stdout) == (0, f"key {REDACTED}\n".encode()), done.stderr


def test_the_runtime_puts_the_wrapper_in_before_the_start_also_into_an_image_without_run() -> None:
    for has_run, where in ((True, "/run"), (False, "/")):
        client = FakeClient(has_run=has_run)
        runtime(client).start(gfx906_spec(), "L1", engine_key=new_engine_key())
        container = client.containers.made[0]
        paths = [path for path, _ in container.archives]
        assert paths == [where, where]  # the wrapper, then the key file; before start (the fake checks)
        names = set(_members(container.archives[0][1]))
        assert (f"run/{WRAPPER_SCRIPT.removeprefix('/run/')}" in names) is (not has_run)
        command = client.containers.created_with[0]["command"]
        assert WRAPPER_SCRIPT in command and command[-2:] == ["--config", CONTAINER_KEY_PATH]


def test_the_wrapper_is_off_only_when_asked_and_then_nothing_is_put_for_it() -> None:
    client = FakeClient()
    rt = runtime(client)
    rt.redacting_wrapper = False
    rt.start(gfx906_spec(), "L1")
    assert client.containers.made[0].archives == []
    assert WRAPPER_SCRIPT not in client.containers.created_with[0]["command"]


def test_an_image_without_python_is_refused_naming_the_wrapper() -> None:
    import docker.errors

    from controller.runtime.base import EngineRuntimeError

    error = docker.errors.APIError("400 Client Error", explanation=(
        'failed to create task for container: failed to create shim task: OCI runtime create failed: '
        'runc create failed: unable to start container process: exec: "python": executable file not found '
        'in $PATH: unknown'))
    client = FakeClient(start_error=error)
    with pytest.raises(EngineRuntimeError, match=r"no `python` on PATH.*key-redacting wrapper"):
        runtime(client).start(gfx906_spec(source_files=()), "L1")
    assert client.containers.made[0].removed


def test_exit_code_of_a_raw_wait_status() -> None:
    assert container_wrapper.exit_code_of(0) == 0
    assert container_wrapper.exit_code_of(signal.SIGKILL) == 128 + signal.SIGKILL  # a raw wait status
