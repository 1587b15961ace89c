"""The container wrapper: PID 1 of every engine container the Docker runtime starts.

Run as a script inside the container (`python -I -S container_wrapper.py [--key-file PATH] -- CMD...`,
after the platform env files are sourced, so `python` is the engine's own interpreter:
appliance/runtimes/docker.py `wrapped_argv`), never imported by the controller. The runtime copies
it, appliance/engine_redact.py and appliance/engine_names.py into the created container (under
`WRAPPER_ROOT`, the same layout as the source tree) before the start, the way it puts the key file.

Why: a container's stdout and stderr go to the Docker daemon's own json log
(/var/lib/docker/containers/ID/ID-json.log), a file on disk. vLLM 0.26.0 (and the gfx906 image's
0.18/0.2x base) prints its non-default args, `'api_key': ['eng_…']`, at every launch, so that file
held the engine key. The wrapper runs the engine with its stdout and stderr on pipes and copies each
through `engine_redact.StreamRedactor` to its own stdout and stderr: the daemon only ever sees
redacted output. The keys are the one in `--key-file` (the launch's key config), a recipe's own
`--api-key` in the command and `VLLM_API_KEY` in the environment, and the appliance's key shape.

What it keeps as it was without it (the engine as PID 1):

- **Signals.** `docker stop` sends TERM to PID 1, which has no default signal handlers: TERM, INT,
  HUP, QUIT, USR1 and USR2 are relayed to the engine's main process, once — what the engine got
  when it was PID 1 itself (vLLM's TERM handler takes its engine core and workers down).
- **Exit status.** The wrapper exits with the engine's status, 128+N when a signal N ended it (the
  shell's and Docker's convention, as the process shim writes it), so `docker inspect`'s State —
  and exit diagnosis, which reads it — says what the engine did. A KILL after the stop timeout
  kills the wrapper (137) and the kernel then kills the whole PID namespace, as before.
- **Streams and timing.** stdout stays stdout and stderr stays stderr; every line is written the
  moment its end arrives (progress lines appear while the engine starts), nothing is held longer.
- **The environment** the engine gets is the one the wrapper was exec'd with (/proc/self/environ),
  not Python's os.environ, which PEP 538 may have added LC_CTYPE to.

As PID 1 it also reaps the orphans the kernel re-parents to it. `-S` (no site-packages, no `.pth`):
the gfx906 image's torch-first `.pth` would import torch into the wrapper; only the standard
library is used here, and nothing newer than Python 3.8 (an engine image's interpreter).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from types import FrameType
from typing import IO

# Run as a script with -I -S: the redaction rules come from the tree this file is part of (the
# source tree, or the copy under WRAPPER_ROOT in the container, laid out the same way).
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from appliance.engine_names import ENGINE_KEY_ENV
from appliance.engine_redact import StreamRedactor, argv_keys, config_key

RELAYED_SIGNALS = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)
EXEC_FAILED = 127  # the shell's code for "command not found / not executable"
TAG = "[appliance-wrapper]"
PIPE_CHUNK = 64 * 1024
# After the engine's main process ended: how long its last output may take to come through (a
# worker still holding the pipe must not keep the container alive).
LAST_OUTPUT_WAIT_S = 1.0


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except OSError:
            return  # a gone log reader must not stop the pipe from draining


def say(msg: str) -> None:
    write_all(2, f"{TAG} {msg}\n".encode())


def exec_environment() -> dict[bytes, bytes]:
    """The environment this process was exec'd with (see the module docstring)."""
    try:
        raw = Path("/proc/self/environ").read_bytes()
    except OSError:
        return dict(os.environb)
    env: dict[bytes, bytes] = {}
    for item in raw.split(b"\0"):
        name, sep, value = item.partition(b"=")
        if sep and name:
            env[name] = value
    return env


def engine_keys(key_file: Path | None, command: list[str], env: Mapping[bytes, bytes]) -> list[str]:
    """Every key the engine may print: its key config file's, a recipe's own `--api-key` values and
    `VLLM_API_KEY`."""
    keys: list[str] = []
    if key_file is not None:
        try:
            key = config_key(key_file.read_text())
        except OSError as exc:
            say(f"cannot read the key file {key_file}: {exc.strerror}; redacting by the key's shape only")
            key = None
        if key:
            keys.append(key)
    keys += argv_keys(command)
    own = env.get(ENGINE_KEY_ENV.encode())
    if own:
        keys.append(own.decode("utf-8", "surrogateescape"))
    return keys


def pump(source: IO[bytes], fd: int, redactor: StreamRedactor) -> None:
    """Copy one of the engine's streams to `fd`, redacted, until every writer of the pipe is gone."""
    while True:
        chunk = os.read(source.fileno(), PIPE_CHUNK)
        if not chunk:
            break
        write_all(fd, redactor.feed(chunk))
    write_all(fd, redactor.flush())
    source.close()


def exit_code_of(status: int) -> int:
    """A wait status → the exit code in the shell/Docker convention (128+N for signal N). The W*
    macros rather than os.waitstatus_to_exitcode: an image's python may predate 3.9."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def wait_for(pid: int) -> int:
    """Wait for `pid`, reaping every other child on the way (PID 1 inherits the container's
    orphans); its raw wait status."""
    while True:
        try:
            done, status = os.waitpid(-1, 0)  # PEP 475: retried after each relayed signal
        except ChildProcessError:  # pragma: no cover  (the engine is our child until we reap it)
            return 0
        if done == pid:
            return status


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="container_wrapper", description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument(
        "--key-file", type=Path, default=None, help="the launch's engine key config: its key is redacted"
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the engine command")
    args = parser.parse_args(argv)
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if not args.command:
        parser.error("no engine command given (expected `-- CMD...`)")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    child: subprocess.Popen[bytes] | None = None
    ended = False
    pending: list[int] = []

    def relay(signum: int, _frame: FrameType | None) -> None:
        if child is None:
            pending.append(signum)  # arrived before the engine exists; relayed right after the spawn
            return
        if not ended:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signum)

    for relayed in RELAYED_SIGNALS:
        signal.signal(relayed, relay)

    env = exec_environment()
    keys = engine_keys(args.key_file, args.command, env)
    pumps: list[threading.Thread] = []
    try:
        child = subprocess.Popen(args.command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except OSError as exc:
        say(f"could not start the engine: {exc}")
        return EXEC_FAILED
    for stream, fd in ((child.stdout, 1), (child.stderr, 2)):
        assert stream is not None  # PIPE
        thread = threading.Thread(target=pump, args=(stream, fd, StreamRedactor(keys)), daemon=True)
        thread.start()
        pumps.append(thread)
    for signum in pending:
        relay(signum, None)

    status = wait_for(child.pid)
    ended = True
    code = exit_code_of(status)
    child.returncode = code  # reaped here, not by Popen (which must not wait for it again)
    for thread in pumps:
        thread.join(LAST_OUTPUT_WAIT_S)  # its last words before ours (unless a worker holds the pipe)
    if os.WIFSIGNALED(status):
        say(f"engine (pid {child.pid}) killed by signal {os.WTERMSIG(status)}: exit code {code}")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
