"""The running launch's engine API key, for a bench/fingerprint/compare run from the CLI.

Issue 9 gave every launch a secret key (`VLLM_API_KEY`, in the engine's environment only) that the
controller's probes and the gateway send. A CLI run against the controller's engine reads it back
from the engine's own environment — the same source an adopting controller uses
(`Runtime.engine_env_value`) — which only the engine's user (or root) can read. Anyone else benches
through the gateway with a client key (`--engine-url GATEWAY --key KEY`).
"""

from __future__ import annotations

from typing import Any

import psutil

from controller.supervisor.engine_key import ENGINE_KEY_ENV


def read_engine_key(launch: dict[str, Any]) -> str | None:
    """`launch`: the `launch` object of the controller's /status (runtime, ref). None when unknown."""
    ref = launch.get("ref")
    if not ref:
        return None
    if launch.get("runtime") == "docker":
        return _container_env(str(ref))
    try:  # the process runtime: ref is the shim's PID; the shim carries the engine's environment
        return psutil.Process(int(ref)).environ().get(ENGINE_KEY_ENV)
    except (ValueError, psutil.Error):
        return None


def _container_env(container_id: str) -> str | None:
    try:
        import docker  # optional: a host without the SDK runs only the process runtime (issue 12)
    except ImportError:
        return None
    try:
        env = docker.from_env().containers.get(container_id).attrs["Config"]["Env"] or []
    except docker.errors.DockerException:
        return None
    prefix = ENGINE_KEY_ENV + "="
    return next((e[len(prefix):] for e in env if e.startswith(prefix)), None)
