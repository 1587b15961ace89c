"""Background processes started by `appliance up` (controller, gateway): PID files, start, stop.

DOMAIN §7: long-running services run under nohup with PID and log files; cleanup kills by PID
(TERM, wait, then KILL), never by a broad pattern. A PID file here is JSON with the process's
create time and command line, so a reused PID is never mistaken for ours.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

CREATE_TIME_TOLERANCE_S = 0.05
# Right after exec the kernel can report an empty /proc/PID/cmdline for a live process (seen here
# under load: 5 of 30 fresh starts). PID + create time already identify the process; the command
# line is a second check, so an empty one is re-read briefly and then not held against it.
CMDLINE_SETTLE_TRIES = 20
CMDLINE_SETTLE_STEP_S = 0.025


def _settled_cmdline(proc: psutil.Process) -> list[str]:
    for _ in range(CMDLINE_SETTLE_TRIES):
        cmdline = proc.cmdline()
        if cmdline:
            return cmdline
        time.sleep(CMDLINE_SETTLE_STEP_S)
    return []


@dataclass(frozen=True)
class Daemon:
    name: str  # "controller" | "gateway"
    run_dir: Path  # PID files
    log_dir: Path

    @property
    def pid_file(self) -> Path:
        return self.run_dir / f"{self.name}.pid"

    @property
    def log_file(self) -> Path:
        return self.log_dir / f"{self.name}.log"

    def process(self) -> psutil.Process | None:
        """Our process if it is alive (and really ours: same create time and command line)."""
        try:
            data = json.loads(self.pid_file.read_text())
            if not isinstance(data, dict):
                # A bare number (written by hand, or by another tool) proves nothing about whose
                # process it is: never signal it (processes are stopped by a PID we can prove ours).
                return None
            proc = psutil.Process(int(data["pid"]))
            if abs(proc.create_time() - float(data["create_time"])) > CREATE_TIME_TOLERANCE_S:
                return None
            if proc.status() == psutil.STATUS_ZOMBIE or _settled_cmdline(proc) not in (data["argv"], []):
                return None
            return proc
        except (FileNotFoundError, ValueError, KeyError, TypeError,
                psutil.NoSuchProcess, psutil.AccessDenied):
            return None

    def start(self, argv: list[str], env: dict[str, str]) -> psutil.Process:
        """Start detached (own session, stdin /dev/null, output appended to the log file)."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with self.log_file.open("ab") as log, open(os.devnull, "rb") as devnull:
            log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} starting: {' '.join(argv)}\n".encode())
            log.flush()
            child = subprocess.Popen(argv, stdin=devnull, stdout=log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True, close_fds=True)
        proc = psutil.Process(child.pid)
        tmp = self.pid_file.with_name(self.pid_file.name + ".tmp")
        tmp.write_text(json.dumps({"pid": child.pid, "create_time": proc.create_time(), "argv": argv}))
        os.replace(tmp, self.pid_file)
        return proc

    def stop(self, grace_s: float = 30.0) -> bool:
        """TERM, wait up to grace_s, then KILL — by PID. Returns whether something was running."""
        proc = self.process()
        if proc is None:
            self.pid_file.unlink(missing_ok=True)
            return False
        try:
            proc.terminate()
            try:
                proc.wait(timeout=grace_s)
            except psutil.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        except psutil.NoSuchProcess:
            pass
        self.pid_file.unlink(missing_ok=True)
        return True

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""
