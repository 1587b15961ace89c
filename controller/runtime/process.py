"""ProcessRuntime: the engine as a detached host process (the embedded CPU engine's runtime).

Layout of one launch, `runs_dir/<launch_id>/`:

- `engine.log`       stdout+stderr of the engine (and two `[appliance-shim]` lines: start, end)
- `engine.pid`       the PID we recorded: the shim's (see process_shim.py), which is also the PGID
- `process.json`     that PID's identity: create time and cmdline (guards against PID reuse)
- `handle.json`      the EngineHandle, so that `adopt()` finds the engine after a controller restart
- `exit_status.json` written by the shim when the engine ends: exit code and terminating signal
- `engine-key.yaml`  (0600) this launch's engine key as the vLLM config file it was given, for read-back
  on adoption; the engine itself reads the same text from `runs_dir/.engine-keys/<variant>.engine-key.yaml`,
  a path that is the same for every launch of the variant (appliance/engine_secret.py)

The run directory is 0700. vLLM 0.26.0 logs its arguments, the key among them: the shim writes the
engine's output into `engine.log` through a redactor (process_shim.py), so the log never holds it.

The engine is started in its own session (`start_new_session=True`), with stdin from /dev/null and
its output going (through the shim) to a file, so it has no pipe to the controller and no
controlling terminal: it survives the controller's death, and a restarted controller adopts it
instead of launching a second engine on a host that can hold only one (DOMAIN §3).

Exit codes follow the shell/docker convention: killed by signal N → `exit_code=128+N, signal=N`, so
one set of diagnosis rules ("exit 134" = SIGABRT, DOMAIN §5) covers both runtimes. Thanks to the shim
the status is known even for an adopted engine; it is unknown (`exit_code=None`) only if the shim
itself was SIGKILLed, or the run directory lost its status file.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pwd
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import psutil
from pydantic import BaseModel, ConfigDict, ValidationError

from appliance.engine_names import ENGINE_KEY_ENV
from appliance.engine_secret import KEY_FILE_NAME, key_from_config, stable_config_path, with_key_config
from appliance.engine_secret import config_yaml as key_config_yaml
from appliance.recipe.launch_spec import LaunchSpec
from appliance.runtimes.process import ProcessLaunch
from controller.engine_setup import package_versions
from controller.runtime.base import (
    LABEL_INSTANCE,
    LABEL_LAUNCH_ID,
    LABEL_MANAGED,
    LABEL_RECIPE,
    LABEL_SPEC_HASH,
    EngineHandle,
    EngineRuntimeError,
    ExitInfo,
    Provenance,
    ensure_cache_dirs,
)
from controller.runtime.log_offsets import read_log_file
from controller.runtime.ports import PortCheck, ensure_port_free
from controller.runtime.process_shim import NATURAL_EXIT_S, exit_code_of, group_members, signal_name
from controller.runtime.registry import RuntimeContext

log = logging.getLogger(__name__)

SHIM = Path(__file__).resolve().with_name("process_shim.py")
LOG_FILE = "engine.log"
PID_FILE = "engine.pid"
PROCESS_FILE = "process.json"
HANDLE_FILE = "handle.json"
STATUS_FILE = "exit_status.json"
KEYS_DIR = ".engine-keys"  # under runs_dir: the variants' key files, at stable paths
LEGACY_KEY_ENV = ENGINE_KEY_ENV  # where older controllers put the key: read back still
RUNTIME_TAG = "[appliance-runtime]"

# Used only when neither the spec nor the controller's own environment has them.
FALLBACK_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Start times are compared relative to boot (clock ticks since boot, 10 ms resolution): the epoch
# value psutil returns is "boot time + ticks", and the boot time moves whenever the wall clock is
# stepped (NTP, VM resume) — an engine must not become "not ours" because the clock was set.
START_TOLERANCE_S = 0.05
_LAUNCH_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class ProcessIdentity(BaseModel):
    """What makes a PID *ours*: alive alone is not enough, PIDs are reused."""

    model_config = ConfigDict(frozen=True)

    pid: int
    create_time: float  # seconds since the epoch (for people; compared only as a fallback)
    started_after_boot: float | None = None  # seconds after boot: what identifies the process
    cmdline: tuple[str, ...]
    labels: dict[str, str] = {}


def started_after_boot(proc: psutil.Process) -> float:
    """Seconds between boot and the process's creation: immune to wall-clock steps."""
    return proc.create_time() - psutil.boot_time()


def engine_env(spec_env: dict[str, str], parent_env: dict[str, str] | None = None) -> dict[str, str]:
    """Exactly the spec's environment, plus PATH and HOME when the spec lacks them.

    Why those two: the sourcing wrapper (`bash -c '. env.sh && exec "$@"'`) and every tool the engine
    runs (torch inductor calls the C++ compiler on the CPU build) are found through PATH; and torch,
    Triton and Hugging Face place their default caches under $HOME — without it they fail or write
    to `/`. Nothing else leaks in from the controller: a stray variable changes the engine (DOMAIN §2
    "missing one causes trouble", and an extra one does too — e.g. DEBUG logging changes the AOT key).
    """
    parent = os.environ if parent_env is None else parent_env
    env = dict(spec_env)
    if "PATH" not in env:
        env["PATH"] = parent.get("PATH") or FALLBACK_PATH
    if "HOME" not in env:
        env["HOME"] = parent.get("HOME") or _home_of_current_user()
    return env


def _home_of_current_user() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_dir
    except KeyError:  # a UID with no passwd entry (some containers): "/" rather than no HOME at all
        return "/"


def _same_start(proc: psutil.Process, identity: ProcessIdentity) -> bool:
    if identity.started_after_boot is not None:
        return abs(started_after_boot(proc) - identity.started_after_boot) <= START_TOLERANCE_S
    # recorded by an older version: the epoch value is all there is
    return abs(proc.create_time() - identity.create_time) <= START_TOLERANCE_S


def _pid_taken(ref: str, identity: ProcessIdentity | None) -> bool:
    """The shim's PID belongs to another process now. Not when it is the shim's own zombie: a shim
    killed after its controller was (an adopted engine) is reaped by its new parent, not by us, and
    until then `pid_exists` is true — that once made an adopted engine's killed shim an exit without
    a reason ("unknown")."""
    try:
        proc = psutil.Process(int(ref))
        own_zombie = (identity is not None and proc.status() == psutil.STATUS_ZOMBIE
                      and _same_start(proc, identity))
    except (ValueError, psutil.NoSuchProcess):
        return False
    return not own_zombie  # anything else living there is not ours to write notes about


def _signal_all(procs: list[psutil.Process], sig: int) -> None:
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.send_signal(sig)


def _describe_returncode(returncode: int) -> str:
    code, sig = exit_code_of(returncode)
    return f"killed by signal {sig} ({signal_name(sig)})" if sig else f"exit code {code}"


def _key_in(run_dir: Path) -> str | None:
    try:
        return key_from_config((run_dir / KEY_FILE_NAME).read_text())
    except OSError:
        return None


def _write_status(path: Path, exit_code: int | None, sig: int | None, error: str, *, complete: bool) -> None:
    payload = {"exit_code": exit_code, "signal": sig, "ended_at": time.time(), "error": error,
               "complete": complete}
    _write_atomic(path, json.dumps(payload) + "\n")


def _write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    """Created with `mode` from the first byte (a key file is never readable by others, not even
    between a write and a chmod), then renamed over `path`."""
    tmp = path.with_name(path.name + ".tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, mode)  # umask may have taken bits away; never adds any the caller did not ask for
    os.replace(tmp, path)


def make(ctx: RuntimeContext) -> ProcessRuntime:
    """The registry's factory (controller/runtime/registry.py)."""
    return ProcessRuntime(ctx.runs_dir, instance_id=ctx.instance_id)


class ProcessRuntime:
    """Runs LaunchSpecs of kind `process` as detached, adoptable host processes."""

    name = "process"

    def __init__(
        self,
        runs_dir: Path,
        *,
        orphan_grace_s: float = 10.0,
        kill_wait_s: float = 10.0,
        python: str = sys.executable,
        instance_id: str | None = None,
        port_check: PortCheck = ensure_port_free,
    ) -> None:
        """`orphan_grace_s`: how long processes left behind by an ended engine get after TERM (shim).
        `kill_wait_s`: how long to wait for the shim to record the status after the engine got KILL.
        `python`: the interpreter that runs the shim (the controller's own; it needs only psutil).
        `port_check`: proves the engine's port free before the start (PortInUse otherwise); a seam
        so that tests do not depend on what holds the host's real ports."""
        self.runs_dir = runs_dir
        self._port_check = port_check
        # This appliance's id (LABEL_INSTANCE in the identity labels and the handle); adopt() takes
        # only engines recorded with it. None: unscoped.
        self.instance_id = instance_id
        self._orphan_grace_s = orphan_grace_s
        self._kill_wait_s = kill_wait_s
        self._python = python
        self._children: dict[str, subprocess.Popen[bytes]] = {}  # launch_id → shim we spawned
        self._identities: dict[str, ProcessIdentity] = {}

    # -- start ---------------------------------------------------------------------------------

    def start(self, spec: LaunchSpec, launch_id: str, engine_key: str | None = None) -> EngineHandle:
        """`engine_key` (the per-launch engine API key) reaches vLLM in a 0600 config file at the
        variant's stable path (`--config`, appliance/engine_secret.py): never argv, the environment,
        the launch record or a log."""
        if not isinstance(spec.runtime, ProcessLaunch):
            raise EngineRuntimeError(
                f"recipe {spec.recipe!r} renders for the {spec.kind!r} runtime, not 'process'"
            )
        if not _LAUNCH_ID.match(launch_id):
            raise EngineRuntimeError(f"launch id {launch_id!r} is not a safe directory name ([A-Za-z0-9._-])")
        env = engine_env(spec.env)
        command = self.engine_command(spec, with_key=engine_key is not None)
        if shutil.which(command[0], path=env["PATH"]) is None:
            raise EngineRuntimeError(
                f"cannot start {spec.recipe!r}: {command[0]!r} is not an executable file "
                f"(for the embedded CPU engine, run `appliance engine setup` first)"
            )
        if spec.workdir is not None and not Path(spec.workdir).is_dir():
            raise EngineRuntimeError(
                f"cannot start {spec.recipe!r}: workdir {spec.workdir} is not a directory"
            )
        ensure_cache_dirs(spec)
        self._end_leftovers()
        self._port_check(spec.host, spec.port)
        run_dir = self.runs_dir / launch_id
        try:
            self.runs_dir.mkdir(parents=True, exist_ok=True)
            run_dir.mkdir(mode=0o700, exist_ok=False)
        except FileExistsError:
            raise EngineRuntimeError(f"launch id {launch_id!r} was already used: {run_dir} exists") from None
        if engine_key is not None:
            text = key_config_yaml(engine_key)
            _write_atomic(run_dir / KEY_FILE_NAME, text, mode=0o600)
            self._key_path(spec).parent.mkdir(mode=0o700, exist_ok=True)
            _write_atomic(self._key_path(spec), text, mode=0o600)
        log_path = run_dir / LOG_FILE
        shim_cmd = (
            self._python,
            "-I",  # isolated: the engine's PYTHONPATH/PYTHONHOME must not change the shim
            str(SHIM),
            "--status",
            str(run_dir / STATUS_FILE),
            "--orphan-grace",
            str(self._orphan_grace_s),
            # The shim redacts this key from the engine's output before it reaches engine.log.
            *(("--key-file", str(run_dir / KEY_FILE_NAME)) if engine_key is not None else ()),
            "--",
            *command,
        )
        with log_path.open("ab") as log_file:
            try:
                child = subprocess.Popen(
                    shim_cmd,
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=spec.workdir or run_dir,
                    start_new_session=True,  # own session + process group (PGID = PID); no terminal
                    close_fds=True,
                )
            except OSError as exc:
                raise EngineRuntimeError(f"cannot start the engine shim with {self._python}: {exc}") from exc
        try:
            shim_proc = psutil.Process(child.pid)
            create_time, after_boot = shim_proc.create_time(), started_after_boot(shim_proc)
        except psutil.NoSuchProcess:
            # Unreachable while unreaped (a zombie still answers); kept so that a start never fails
            # after the engine was launched. inspect() reports how it ended.
            create_time, after_boot = time.time(), None
        labels = {
            **spec.labels,
            LABEL_MANAGED: "true",
            LABEL_LAUNCH_ID: launch_id,
            LABEL_RECIPE: spec.recipe,
            LABEL_SPEC_HASH: spec.spec_hash,
            **({LABEL_INSTANCE: self.instance_id} if self.instance_id is not None else {}),
        }
        identity = ProcessIdentity(
            pid=child.pid,
            create_time=create_time,
            started_after_boot=after_boot,
            cmdline=shim_cmd,
            labels=labels,
        )
        handle = EngineHandle(
            launch_id=launch_id,
            runtime=self.name,
            ref=str(child.pid),
            recipe=spec.recipe,
            spec_hash=spec.spec_hash,
            log_path=str(log_path),
            started_at=create_time,
            instance=self.instance_id,
        )
        _write_atomic(run_dir / PROCESS_FILE, identity.model_dump_json(indent=2) + "\n")
        _write_atomic(run_dir / PID_FILE, f"{child.pid}\n")
        _write_atomic(run_dir / HANDLE_FILE, handle.model_dump_json(indent=2) + "\n")
        self._children[launch_id] = child
        self._identities[launch_id] = identity
        log.info("started %s (launch %s) as pid %d, log %s", spec.recipe, launch_id, child.pid, log_path)
        return handle

    def _end_leftovers(self) -> None:
        """Before a launch: nothing of an earlier engine may remain (one engine per host, DOMAIN §3).
        A shim still reaping what its ended engine left gets its grace; the group of a shim that was
        killed is ended here. A running engine is not touched (the port check reports it)."""
        if not self.runs_dir.is_dir():
            return
        for handle_path in self.runs_dir.glob(f"*/{HANDLE_FILE}"):
            try:
                handle = EngineHandle.model_validate_json(handle_path.read_text())
                status = self._status(handle)
                if status is not None and status.get("complete", True):
                    self._forget_key(handle)  # a launch that ended before key files were removed
                    continue  # ended and fully reaped (older shims wrote one status, at the end)
                if self._shim(handle) is not None:
                    if status is not None:  # main ended, leftovers being reaped
                        self._wait_gone(handle, NATURAL_EXIT_S + self._orphan_grace_s + self._kill_wait_s)
                    continue
                self._end_orphaned_group(handle, self._orphan_grace_s)
                if status is None:
                    self.inspect(handle)  # records how it ended
            except (OSError, ValidationError, EngineRuntimeError) as exc:
                log.warning("skipping %s: %s", handle_path, exc)

    def _key_path(self, spec: LaunchSpec) -> Path:
        return self._variant_key_path(spec.recipe, spec.spec_hash)

    def _variant_key_path(self, recipe: str, spec_hash: str) -> Path:
        return Path(stable_config_path(str(self.runs_dir / KEYS_DIR), f"{recipe}-{spec_hash[:12]}"))

    def _forget_key(self, handle: EngineHandle) -> None:
        """The engine ended: its key files go (vLLM read its config at start; nothing reads the key
        of an ended launch). Stopped launches once kept theirs, valid-looking secrets on disk. The
        variant's stable file goes only while it still holds this launch's key: a newer launch of
        the same variant (blue/green) may have written its own there."""
        own = self._run_dir(handle) / KEY_FILE_NAME
        try:
            text = own.read_text()
        except FileNotFoundError:
            return
        except OSError as exc:
            log.warning("launch %s: cannot read its ended engine's key file: %s", handle.launch_id, exc)
            return
        shared = self._variant_key_path(handle.recipe, handle.spec_hash)
        with contextlib.suppress(OSError):
            if shared.read_text() == text:
                shared.unlink()
        own.unlink(missing_ok=True)

    def engine_command(self, spec: LaunchSpec, *, with_key: bool) -> tuple[str, ...]:
        """The engine's argv exactly as started: the spec's, plus `--config KEYFILE` when the
        appliance delivers the key (the same path for every launch of the variant)."""
        command = spec.command()
        if not with_key:
            return command
        try:
            return with_key_config(command, str(self._key_path(spec)))
        except ValueError as exc:
            raise EngineRuntimeError(f"cannot start {spec.recipe!r}: {exc}") from None

    def provenance(self, spec: LaunchSpec) -> Provenance:
        """The engine's own interpreter and package versions (ProvenanceSource), found with the
        engine's own environment (PYTHONPATH included): where its packages really live (a vLLM under
        PYTHONPATH is what runs, not the venv's)."""
        python = spec.runtime.engine_python()
        if python is None:
            return Provenance()
        env = engine_env(spec.env)
        found = shutil.which(python, path=env.get("PATH"))
        versions = package_versions(Path(found), env) if found else {}
        return Provenance(interpreter=found or python, packages=versions)

    def engine_exec(
        self, spec: LaunchSpec, handle: EngineHandle, argv: Sequence[str], timeout_s: float
    ) -> tuple[int | None, str]:
        """Run `argv` on this host with the engine's environment (EngineExec), from the temporary
        directory (seed 004 §7: `cd /tmp`, so no working directory shadows the engine's packages)."""
        try:
            proc = subprocess.run(
                list(argv), env=engine_env(spec.env), cwd=tempfile.gettempdir(), capture_output=True,
                text=True, errors="replace", timeout=timeout_s, check=False, stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout or b""
            return None, out.decode(errors="replace") if isinstance(out, bytes) else out
        except OSError as exc:
            raise EngineRuntimeError(f"cannot run {argv[0]!r}: {exc}") from exc
        return proc.returncode, proc.stdout + proc.stderr

    @staticmethod
    def engine_key_of(ref: str) -> str | None:
        """The key of the engine whose shim is pid `ref`, for a CLI without a runtime object
        (controller/evaluation/bench_key.py): the run directory is the parent of the shim's
        `--status` file. None when unreadable (another user's engine, gone)."""
        try:
            proc = psutil.Process(int(ref))
            cmdline = proc.cmdline()
            if "--status" in cmdline[:-1]:
                key = _key_in(Path(cmdline[cmdline.index("--status") + 1]).parent)
                if key is not None:
                    return key
            return proc.environ().get(LEGACY_KEY_ENV)
        except (ValueError, psutil.Error):
            return None

    def read_engine_key(self, handle: EngineHandle) -> str | None:
        """The running engine's key (for a controller that adopted it after a restart), from the
        launch's own copy of its key file; an engine started by an older controller has it in its
        environment. Readable only by the engine's own user (or root)."""
        shim = self._shim(handle)
        if shim is None:
            return None
        key = _key_in(self._run_dir(handle))
        if key is not None:
            return key
        try:
            return shim.environ().get(LEGACY_KEY_ENV)
        except (psutil.AccessDenied, psutil.NoSuchProcess):
            return None

    # -- identity ------------------------------------------------------------------------------

    def _run_dir(self, handle: EngineHandle) -> Path:
        return self.runs_dir / handle.launch_id

    def _identity(self, handle: EngineHandle) -> ProcessIdentity | None:
        cached = self._identities.get(handle.launch_id)
        if cached is not None:
            return cached
        path = self._run_dir(handle) / PROCESS_FILE
        try:
            identity = ProcessIdentity.model_validate_json(path.read_text())
        except FileNotFoundError:
            return None
        except ValidationError as exc:
            raise EngineRuntimeError(
                f"{path} is unreadable, cannot tell whether pid {handle.ref} is ours: {exc}"
            ) from exc
        if str(identity.pid) != handle.ref:
            raise EngineRuntimeError(f"{path} records pid {identity.pid} but the handle says {handle.ref}")
        self._identities[handle.launch_id] = identity
        return identity

    @staticmethod
    def _live_process(identity: ProcessIdentity) -> psutil.Process | None:
        """The recorded process if it is still running AND is the same process (not a reused PID):
        same start time (relative to boot) and same cmdline."""
        try:
            proc = psutil.Process(identity.pid)
            if not _same_start(proc, identity):
                return None  # PID reused by another process
            if proc.status() == psutil.STATUS_ZOMBIE:
                return None  # ended; its parent (init after a controller restart) has not reaped it yet
            cmdline = proc.cmdline()
            # Empty in two short windows: while exec is still setting up the new image (Popen has
            # returned, the argument area is not mapped yet) and while the process exits (its memory
            # is gone, it is not a zombie yet). With the same start time it is ours in both.
            if cmdline and tuple(cmdline) != identity.cmdline:
                return None
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            return None
        return proc

    def _shim(self, handle: EngineHandle) -> psutil.Process | None:
        identity = self._identity(handle)
        return None if identity is None else self._live_process(identity)

    @staticmethod
    def _engine_processes(shim: psutil.Process) -> list[psutil.Process]:
        """The engine's processes: the shim's descendants plus anything else still in its group
        (a worker whose parent died is re-parented to init but stays in the group). Not the shim."""
        found: dict[int, psutil.Process] = {}
        try:
            for proc in shim.children(recursive=True):
                found[proc.pid] = proc
        except psutil.NoSuchProcess:
            pass  # the shim just ended; its group members below are still worth listing
        for proc in group_members(shim.pid, exclude=shim.pid):
            found.setdefault(proc.pid, proc)
        return [found[pid] for pid in sorted(found)]

    # -- state ---------------------------------------------------------------------------------

    def _status(self, handle: EngineHandle) -> dict[str, object] | None:
        """The shim's status file: written when the engine's main process ended (`complete` false
        while leftovers are reaped), rewritten once the group is empty."""
        status_path = self._run_dir(handle) / STATUS_FILE
        try:
            status = json.loads(status_path.read_text())
        except FileNotFoundError:
            return None
        except json.JSONDecodeError as exc:
            raise EngineRuntimeError(f"{status_path} is corrupt: {exc}") from exc
        return status if isinstance(status, dict) else None

    @staticmethod
    def _info(status: dict[str, object]) -> ExitInfo:
        """The recorded end; `error` (the shim's or this runtime's own words: an exec that failed,
        a shim that was killed) is the ExitInfo's reason, for the diagnosis."""
        code, sig, error = status.get("exit_code"), status.get("signal"), status.get("error")
        return ExitInfo(
            running=False,
            exit_code=code if isinstance(code, int) else None,
            signal=sig if isinstance(sig, int) else None,
            reason=error if isinstance(error, str) and error else None,
        )

    def _ended(self, handle: EngineHandle, shim_returncode: int | None) -> ExitInfo:
        self._forget_key(handle)
        status = self._status(handle)
        if status is not None:
            return self._info(status)
        # No status: the shim itself was killed (SIGKILL, OOM killer) before its engine ended. Its
        # own exit code is not the engine's ("exited 137" was once recorded while the engine
        # still served). The engine got TERM from the kernel (parent-death signal); whatever is left
        # of the group is ended here, and the run directory says what happened.
        if shim_returncode is None and _pid_taken(handle.ref, self._identity(handle)):
            return ExitInfo(running=False)  # its PID belongs to another process now: nothing to say
        how = "" if shim_returncode is None else f" ({_describe_returncode(shim_returncode)})"
        left = self._orphaned_group(handle)
        self._runtime_note(
            handle,
            f"the shim (pid {handle.ref}) ended without recording the engine's status{how}; "
            f"{len(left)} process(es) left in its group: TERM, then KILL after {self._orphan_grace_s:g} s",
        )
        _signal_all(left, signal.SIGTERM)
        error = f"the engine's shim (pid {handle.ref}) was killed{how}"
        _write_status(self._run_dir(handle) / STATUS_FILE, None, None, error, complete=not left)
        if left:
            self._kill_later(handle)
        return ExitInfo(running=False, reason=error)  # the diagnosis reads it (shim_killed)

    def inspect(self, handle: EngineHandle) -> ExitInfo:
        """Running until the engine's main process ended (the shim may still be reaping what it
        left behind: `start` and `stop` wait for that, the supervisor need not)."""
        child = self._children.get(handle.launch_id)
        if child is not None:
            returncode = child.poll()  # also reaps it
            if returncode is not None:
                return self._ended(handle, returncode)
        elif self._shim(handle) is None:
            return self._ended(handle, None)
        status = self._status(handle)
        if status is None:
            return ExitInfo(running=True)
        self._forget_key(handle)  # the engine's main process ended (the shim may still be reaping)
        return self._info(status)

    def wait(self, handle: EngineHandle, timeout_s: float) -> ExitInfo:
        """Block until the engine's main process ends (or `timeout_s`). Not a poll loop: it sleeps
        on pidfds of the shim and of the engine's main process, so a death is seen at once."""
        deadline = time.monotonic() + max(timeout_s, 0.0)
        while True:
            info = self.inspect(handle)
            left = deadline - time.monotonic()
            if not info.running or left <= 0:
                return info
            self._sleep_on_exit(handle, min(left, 5.0))

    def _sleep_on_exit(self, handle: EngineHandle, timeout_s: float) -> None:
        fds = self._exit_fds(handle)
        if not fds:
            time.sleep(min(timeout_s, 0.02))  # a short poll (no pidfd, or a moment of transition)
            return
        try:
            ready, _, _ = select.select(fds, [], [], timeout_s)
        finally:
            for fd in fds:
                os.close(fd)
        if ready:
            # A process ended; the shim writes the status a moment after it reaped the engine.
            time.sleep(0.01)

    def _exit_fds(self, handle: EngineHandle) -> list[int]:
        """pidfds of the shim and of the engine's main process (its child), identity-checked after
        opening so that a reused PID is never watched."""
        shim = self._shim(handle)
        if shim is None or not hasattr(os, "pidfd_open"):
            return []
        try:
            children = shim.children()
        except psutil.NoSuchProcess:
            return []
        if not children:
            return []  # the engine is not started yet, or just reaped: its status is moments away
        watched = [shim, *children]
        fds: list[int] = []
        for proc in watched:
            try:
                fd = os.pidfd_open(proc.pid)
            except OSError:
                continue  # ended meanwhile: the next inspect sees it
            fds.append(fd)
        if self._shim(handle) is None:  # the shim's PID could have been reused before we opened it
            for fd in fds:
                os.close(fd)
            return []
        return fds

    def _wait_gone(self, handle: EngineHandle, timeout_s: float) -> ExitInfo:
        """Wait until the shim ended (it ends after the engine's leftovers): nothing of it remains."""
        deadline = time.monotonic() + timeout_s
        child = self._children.get(handle.launch_id)
        if child is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=max(timeout_s, 0.0))
            return self.inspect(handle) if child.poll() is not None else ExitInfo(running=True)
        delay = 0.02
        while self._shim(handle) is not None:
            if time.monotonic() >= deadline:
                return ExitInfo(running=True)
            time.sleep(delay)
            delay = min(delay * 2, 0.25)
        return self._ended(handle, None)

    # -- a shim that died before its engine ----------------------------------------------------

    def _orphaned_group(self, handle: EngineHandle) -> list[psutil.Process]:
        """What is left of a dead shim's process group. Its PGID is the shim's PID, which the kernel
        does not hand out again while the group has members; members created before the shim are
        not ours (belt and braces against a reused PID)."""
        identity = self._identity(handle)
        if identity is None:
            return []
        try:
            leader = psutil.Process(identity.pid)
            if leader.status() != psutil.STATUS_ZOMBIE or not _same_start(leader, identity):
                return []  # a live leader: not an orphaned group (or the PID is another process's)
        except psutil.NoSuchProcess:
            pass  # the shim is gone: a group with its id can only be what it left
        out: list[psutil.Process] = []
        for proc in group_members(identity.pid, exclude=identity.pid):
            try:
                if identity.started_after_boot is not None:
                    if started_after_boot(proc) + START_TOLERANCE_S < identity.started_after_boot:
                        continue
                elif proc.create_time() + START_TOLERANCE_S < identity.create_time:
                    continue
            except psutil.NoSuchProcess:
                continue
            out.append(proc)
        return out

    def _kill_later(self, handle: EngineHandle) -> None:
        def kill() -> None:
            left = self._orphaned_group(handle)
            if left:
                self._runtime_note(handle, f"KILL to {[p.pid for p in left]} (still alive after TERM)")
                _signal_all(left, signal.SIGKILL)
            with contextlib.suppress(OSError):
                status = self._status(handle) or {}
                _write_status(self._run_dir(handle) / STATUS_FILE, None, None,
                              str(status.get("error") or ""), complete=True)

        timer = threading.Timer(self._orphan_grace_s, kill)
        timer.daemon = True
        timer.start()

    def _end_orphaned_group(self, handle: EngineHandle, grace_s: float) -> bool:
        """TERM, wait `grace_s`, KILL what is left of a dead shim's group. True when none is left."""
        left = self._orphaned_group(handle)
        if not left:
            return True
        _signal_all(left, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while left and time.monotonic() < deadline:
            time.sleep(0.05)
            left = self._orphaned_group(handle)
        _signal_all(left, signal.SIGKILL)
        deadline = time.monotonic() + self._kill_wait_s
        while left and time.monotonic() < deadline:
            time.sleep(0.05)
            left = self._orphaned_group(handle)
        return not left

    def _runtime_note(self, handle: EngineHandle, message: str) -> None:
        """A line in the engine log, so that the launch's own evidence says what the runtime did."""
        log.warning("launch %s: %s", handle.launch_id, message)
        path = Path(handle.log_path) if handle.log_path else self._run_dir(handle) / LOG_FILE
        with contextlib.suppress(OSError), path.open("a") as f:
            f.write(f"{RUNTIME_TAG} {message}\n")

    # -- stop ----------------------------------------------------------------------------------

    def stop(self, handle: EngineHandle, grace_s: float) -> ExitInfo:
        """TERM via the shim (which relays it once to every process of the group), wait `grace_s`,
        then KILL the engine's processes by PID, then the shim if it has not recorded the status.
        Returns once nothing of the engine is left (or everything was KILLed)."""
        shim = self._shim(handle)  # identity-checked: a reused PID is never signalled
        if shim is None:
            info = self.inspect(handle)
            self._end_orphaned_group(handle, grace_s)
            return info
        try:
            shim.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            return self._wait_gone(handle, self._kill_wait_s)
        info = self._wait_gone(handle, grace_s)
        if not info.running:
            return info
        log.warning("launch %s did not stop within %.0f s of TERM: KILL", handle.launch_id, grace_s)
        # KILL the engine but not the shim, so that the shim reaps it and records "signal 9".
        _signal_all(self._engine_processes(shim), signal.SIGKILL)
        info = self._wait_gone(handle, self._kill_wait_s)
        if not info.running:
            return info
        log.warning(
            "launch %s: shim %d still alive after KILL of the engine: KILL its group",
            handle.launch_id,
            shim.pid,
        )
        with contextlib.suppress(ProcessLookupError):  # everything ended in between
            os.killpg(shim.pid, signal.SIGKILL)  # the shim leads its own group: PGID == its PID
        return self._wait_gone(handle, self._kill_wait_s)

    # -- logs, adoption, accounting ------------------------------------------------------------

    def read_logs(self, handle: EngineHandle, offset: int) -> tuple[str, int]:
        path = Path(handle.log_path) if handle.log_path else self._run_dir(handle) / LOG_FILE
        return read_log_file(path, offset)

    def adopt(self) -> list[EngineHandle]:
        """Running engines recorded under runs_dir: shim PID alive with the same create time and
        cmdline, and no exit status written yet (the engine's main process has not ended)."""
        handles: list[EngineHandle] = []
        if not self.runs_dir.is_dir():
            return handles
        for handle_path in sorted(self.runs_dir.glob(f"*/{HANDLE_FILE}")):
            try:
                handle = EngineHandle.model_validate_json(handle_path.read_text())
            except (OSError, ValidationError) as exc:
                log.warning("skipping %s: unreadable handle (%s)", handle_path, exc)
                continue
            if handle.runtime != self.name or handle_path.parent.name != handle.launch_id:
                continue
            # An unlabelled handle in our own runs directory was written by an older controller of this
            # APPLIANCE_HOME: ours. Another instance's id here is not.
            if self.instance_id is not None and handle.instance not in (None, self.instance_id):
                log.info("skipping %s: launched by appliance instance %s, not this one (%s)",
                         handle_path, handle.instance or "(none)", self.instance_id)
                continue
            try:
                # A live shim alone is not a running engine: once the engine's main process ended
                # the shim writes its status and stays to reap what the engine left (inspect() calls
                # that ended). Runtime.adopt returns engines still running, as docker's
                # status=running filter does; start() waits out such a shim (_end_leftovers).
                running = self._shim(handle) is not None and self._status(handle) is None
            except EngineRuntimeError as exc:
                log.warning("skipping %s: %s", handle_path, exc)
                continue
            if running:
                handles.append(handle)
        return sorted(handles, key=lambda h: h.started_at)

    def engine_pids(self, handle: EngineHandle) -> list[int]:
        shim = self._shim(handle)
        return [] if shim is None else [p.pid for p in self._engine_processes(shim)]

    def cpu_seconds(self, handle: EngineHandle) -> float:
        """User+system CPU of the engine's processes, including children they already reaped (so the
        total does not drop when a worker exits)."""
        shim = self._shim(handle)
        if shim is None:
            return 0.0
        total = 0.0
        for proc in self._engine_processes(shim):
            try:
                t = proc.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += t.user + t.system + t.children_user + t.children_system
        return total


engine_key_of = ProcessRuntime.engine_key_of  # the registry's by-ref reader (controller/runtime/registry.py)
