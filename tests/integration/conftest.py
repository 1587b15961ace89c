"""Every integration module leaves no engine behind.

Only this pytest run's engines count (a process, or an ancestor, naming a path under its base
directory), so a second suite on the same host is left alone. A CPU engine left running by one module
takes a core from the next: on a 2-core CI machine a blue/green start beside a serving engine then
starves (a start with no CPU for its stall window is failed as stalled). So each module's engines —
the vLLM processes, the process runtime's shims and the appliance-managed containers — are listed
before it and after it; one still there after is a leak: it is killed by PID (or removed by id) so
the next module starts clean, and the module errors with what it left, so the leak is fixed where it
was made.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator

import psutil
import pytest

from appliance.engine_names import LABEL_MANAGED

ENGINE_MARKERS = ("vllm.entrypoints", "process_shim.py", "container_wrapper")


def _engine_processes(base: str) -> dict[int, str]:
    """This run's engine processes: those whose own command line or an ancestor's names a path under
    this pytest run's base directory (the shim's `--status` file is in the test's APPLIANCE_HOME). An
    engine of another run on the same host (a second clone's suite) is never counted, nor killed."""
    found: dict[int, str] = {}
    for proc in psutil.process_iter(["pid", "name", "cmdline"]):
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue  # ended, waiting for its parent to reap it
            name = proc.info["name"] or ""
            cmdline = " ".join(proc.info["cmdline"] or [])
            if not (name.startswith("VLLM::") or any(marker in cmdline for marker in ENGINE_MARKERS)):
                continue
            if not any(base in " ".join(p.cmdline()) for p in (proc, *proc.parents())):
                continue
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        found[proc.info["pid"]] = (name if name.startswith("VLLM::") else cmdline)[:120]
    return found


def _managed_containers() -> dict[str, str]:
    try:
        import docker

        client = docker.from_env(timeout=10)
        try:
            return {str(c.id): str(c.name) for c in client.containers.list(filters={"label": LABEL_MANAGED})}
        finally:
            client.close()
    except Exception:  # noqa: BLE001 - no daemon here: nothing of ours can be running in it
        return {}


@pytest.fixture(autouse=True, scope="module")
def no_engine_left_behind(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    base = str(tmp_path_factory.getbasetemp())
    before_pids, before_containers = set(_engine_processes(base)), set(_managed_containers())
    yield
    # An engine stopped at the end of a test may still be exiting: a leak is one still there after 30 s.
    deadline = time.monotonic() + 30
    while True:
        left = {pid: what for pid, what in _engine_processes(base).items() if pid not in before_pids}
        if not left or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    containers = {cid: name for cid, name in _managed_containers().items() if cid not in before_containers}
    if not left and not containers:
        return
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if containers:
        import docker

        client = docker.from_env(timeout=30)
        try:
            for cid in containers:
                client.containers.get(cid).remove(force=True)
        finally:
            client.close()
    pytest.fail(f"the module left engines running (killed now): processes {sorted(left.values())}, "
                f"containers {sorted(containers.values())}")
