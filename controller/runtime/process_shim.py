"""The engine shim: the small parent the process runtime puts between itself and the engine.

Run as a script (`python -I process_shim.py --status FILE [--orphan-grace S] -- CMD...`), never
imported by the controller. It exists for three reasons:

1. **Exit status of an adopted engine.** After a controller restart the engine is no longer the
   controller's child, and the exit status of a non-child is unknowable on Linux (waitpid only works
   for children). The shim *is* the engine's parent, so it always sees the status and writes it to
   `--status` as JSON (`exit_code` in the shell/docker convention — 128+N when killed by signal N —
   and `signal`). The shim's PID is the one recorded in the PID file, so "the PID is alive" means
   "the engine has not ended yet".
2. **One TERM per process, to the whole engine.** A TERM (or INT/HUP/QUIT/USR1/USR2) sent to the
   shim is relayed to its whole process group, like Ctrl-C in a terminal: vLLM's API server, engine
   core and TP workers each get the signal exactly once (the shim ignores its own copy while it
   relays). `kill <pid from engine.pid>` by an operator therefore stops the engine the same way the
   controller does.
3. **No orphans.** When the engine's main process ends, any process left in the group (a stuck TP
   worker still holding host memory or VRAM) gets TERM, a grace period, then KILL — DOMAIN §7:
   "TERM, wait for VRAM release, then KILL", by PID, never by pattern. On a host that can hold only
   one engine (DOMAIN §3), a leftover worker would make the next launch OOM.
4. **No key in the log file.** The engine's stdout and stderr are a pipe the shim copies into the
   log (the shim's own stdout) through `engine_secret.StreamRedactor`: vLLM 0.26.0 prints its
   non-default args, `'api_key': ['eng_…']`, at every start, and the raw `runs/ID/engine.log` kept
   it. The keys are the one in `--key-file` (the launch's key config), a recipe's own `--api-key`
   in the command and `VLLM_API_KEY` in the environment, and the appliance's key shape.
5. **The engine dies with its shim.** The engine's main process is started with a parent-death
   signal (`PR_SET_PDEATHSIG` = TERM, set between fork and exec): if the shim itself is SIGKILLed,
   the kernel TERMs the engine, and vLLM's own TERM handler takes its engine core and workers down
   (a killed shim once left the vLLM server orphaned on its port, answering the next launch's
   probes). The runtime ends whatever is left of the group when it sees the shim gone.

The status is written as soon as the engine's main process ends — before the orphans are reaped —
so that the controller learns of a death at once (it takes the engine out of the gateway), and the
file is rewritten with `"complete": true` once the group is empty.

The shim runs with `-I` (isolated mode), so the engine's PYTHONPATH/PYTHONHOME in its environment do
not affect it; it passes the environment it was exec'd with to the engine unchanged.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import IO

import psutil

# Run as a script with -I (no PYTHONPATH, no script directory on sys.path): the redaction rules are
# the appliance's own (appliance/engine_secret.py), from the tree this file is part of.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from appliance.engine_names import ENGINE_KEY_ENV
from appliance.engine_redact import argv_keys
from appliance.engine_secret import (
    StreamRedactor,
    key_from_config,
)

RELAYED_SIGNALS = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)
EXEC_FAILED = 127  # the shell's code for "command not found / not executable"
SHIM_TAG = "[appliance-shim]"
NATURAL_EXIT_S = 3.0
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
PARENT_DEATH_SIGNAL = signal.SIGTERM  # vLLM's TERM handler stops its engine core and workers too


LOG_FD = 1  # the shim's stdout is the engine log file
_LOG_LOCK = threading.Lock()  # the pump's lines and the shim's own never interleave mid-line
PIPE_CHUNK = 64 * 1024
# After the engine's main process ended: how long its last output may take to reach the log before
# the shim says how it ended (a worker still holding the pipe must not delay the status for long).
LAST_OUTPUT_WAIT_S = 1.0


def _write_log(data: bytes) -> None:
    with _LOG_LOCK:
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(LOG_FD, view):]
            except OSError:
                return  # a full disk or a closed log must not stop the pipe from draining


def _say(msg: str) -> None:
    # Goes to the engine log (the shim's stdout is the log file): the log alone tells how it ended.
    _write_log(f"{SHIM_TAG} {msg}\n".encode())


def engine_keys(key_file: Path | None, command: Sequence[str], env: dict[str, str]) -> list[str]:
    """Every key the engine may print: its key config file's, a recipe's own `--api-key` values
    (`--api-key K` and `--api-key=K`) and `VLLM_API_KEY`."""
    keys: list[str] = []
    if key_file is not None:
        try:
            key = key_from_config(key_file.read_text())
        except OSError:
            key = None
        if key:
            keys.append(key)
    keys += argv_keys(command)
    if env.get(ENGINE_KEY_ENV):
        keys.append(env[ENGINE_KEY_ENV])
    return keys


def pump(source: IO[bytes], redactor: StreamRedactor) -> None:
    """Copy the engine's output into the log, redacted, until every writer of the pipe is gone."""
    fd = source.fileno()
    while True:
        try:
            chunk = os.read(fd, PIPE_CHUNK)
        except InterruptedError:  # pragma: no cover  (PEP 475 retries; kept for clarity)
            continue
        if not chunk:
            break
        _write_log(redactor.feed(chunk))
    _write_log(redactor.flush())
    source.close()


def write_status(
    path: Path, exit_code: int | None, sig: int | None, error: str | None = None, *, complete: bool = True
) -> None:
    """Atomically write the engine's exit status (tmp + rename: a reader never sees half a file).
    `complete` is False while processes the engine left behind are still being reaped."""
    payload = {
        "exit_code": exit_code, "signal": sig, "ended_at": time.time(), "error": error, "complete": complete,
    }
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload) + "\n")
    os.replace(tmp, path)


def group_members(pgid: int, exclude: int) -> list[psutil.Process]:
    """Live (non-zombie) processes of process group `pgid`, except `exclude`."""
    members: list[psutil.Process] = []
    for proc in psutil.process_iter():
        if proc.pid == exclude:
            continue
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                members.append(proc)
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue  # exited while we looked: not a member any more
    return members


def _wait_gone(pgid: int, me: int, timeout_s: float) -> list[psutil.Process]:
    # Polls instead of psutil.wait_procs: a dead orphan stays a zombie until init reaps it (which can
    # take seconds here), and wait_procs would count that zombie as alive.
    deadline = time.monotonic() + timeout_s
    while True:
        left = group_members(pgid, me)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.1)


def reap_orphans(pgid: int, me: int, grace_s: float) -> None:
    """TERM what is left of the engine's process group, wait `grace_s`, then KILL (by PID).

    Helpers that end by themselves once the main process is gone (multiprocessing's resource
    tracker, workers watching their parent) get a short moment first, so only real stragglers are
    signalled and reported."""
    left = _wait_gone(pgid, me, min(NATURAL_EXIT_S, grace_s))
    if not left:
        return
    _say(
        f"engine main process ended; {len(left)} process(es) left in its group: "
        f"TERM, then KILL after {grace_s:g} s"
    )
    for proc in left:
        try:
            proc.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            continue
    left = _wait_gone(pgid, me, grace_s)
    for proc in left:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            continue
    left = _wait_gone(pgid, me, 5.0)
    if left:
        _say(f"processes still alive after KILL: {[p.pid for p in left]}")


def die_with_parent(parent_pid: int, sig: int = PARENT_DEATH_SIGNAL) -> None:
    """In the engine child, between fork and exec: ask the kernel for `sig` when the shim dies.

    The setting survives exec (not of set-uid programs) and belongs to the child, so it holds even
    when the shim is SIGKILLed. If the shim died before the call, the signal would never come:
    then the child signals itself."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return  # never fail the launch over it: the runtime still ends the group (process.py)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), sig)


def exit_code_of(returncode: int) -> tuple[int, int | None]:
    """Popen returncode → (exit code in the shell/docker convention, terminating signal or None)."""
    if returncode < 0:
        return 128 - returncode, -returncode
    return returncode, None


def signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:  # real-time signals have no name
        return f"SIG{sig}"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="process_shim", description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument("--status", type=Path, required=True, help="where to write the exit status JSON")
    parser.add_argument(
        "--orphan-grace", type=float, default=10.0, help="seconds leftover processes get after TERM"
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
    me = os.getpid()
    pgid = os.getpgrp()
    child: subprocess.Popen[bytes] | None = None
    pending: list[int] = []

    def relay(signum: int, _frame: FrameType | None) -> None:
        if child is None:
            pending.append(signum)  # arrived before the engine exists; relayed right after the spawn
            return
        # Ignore our own copy while signalling the group, so that the shim survives to record the
        # status and every other member gets the signal exactly once.
        previous = signal.signal(signum, signal.SIG_IGN)
        try:
            os.killpg(pgid, signum)
        finally:
            signal.signal(signum, previous)

    for relayed in RELAYED_SIGNALS:
        signal.signal(relayed, relay)

    try:
        # The environment we were exec'd with, not os.environ: under a C locale Python coerces
        # LC_CTYPE=C.UTF-8 into its own os.environ at start-up (PEP 538), which the engine would
        # inherit — and its environment must be exactly the spec's.
        exec_env = psutil.Process().environ()
        redactor = StreamRedactor(engine_keys(args.key_file, args.command, exec_env))
        child = subprocess.Popen(
            args.command, stdin=subprocess.DEVNULL, env=exec_env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,  # through the redactor into the log
            # The shim is single-threaded, so a preexec_fn is safe here.
            preexec_fn=lambda: die_with_parent(me),
        )
    except OSError as exc:
        _say(f"could not start the engine: {exc}")
        write_status(args.status, EXEC_FAILED, None, error=str(exc))
        return EXEC_FAILED
    assert child.stdout is not None  # stdout=PIPE
    copier = threading.Thread(target=pump, args=(child.stdout, redactor), name="log-pump", daemon=True)
    copier.start()
    for signum in pending:
        relay(signum, None)

    returncode = child.wait()  # PEP 475: retried after each relayed signal
    copier.join(LAST_OUTPUT_WAIT_S)  # its last words before the shim's (unless a worker holds the pipe)
    code, sig = exit_code_of(returncode)
    how = f"killed by signal {sig} ({signal_name(sig)})" if sig else f"exit code {code}"
    _say(f"engine (pid {child.pid}) ended: {how}")
    # First word to the controller now (it takes the engine out of the gateway); the final status
    # once the group is empty (a relaunch waits for that: one engine per host, DOMAIN §3).
    write_status(args.status, code, sig, complete=False)
    reap_orphans(pgid, me, args.orphan_grace)
    copier.join(LAST_OUTPUT_WAIT_S)  # the group is gone: what its members wrote is in the log
    write_status(args.status, code, sig)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
