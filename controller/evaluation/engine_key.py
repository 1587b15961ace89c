"""The running launch's engine API key, for a bench/fingerprint/compare run from the CLI.

Issue 9 gave every launch a secret key (`VLLM_API_KEY`, in the engine's environment only) that the
controller's probes and the gateway send. A CLI run against the controller's engine reads it back
from the engine's own environment — the same source an adopting controller uses
(`Runtime.engine_env_value`) — which only the engine's user (or root) can read. Anyone else benches
through the gateway with a client key (`--engine-url GATEWAY --key KEY`).
"""

from __future__ import annotations

from typing import Any

from controller.runtime.registry import env_value_of
from controller.supervisor.engine_key import ENGINE_KEY_ENV


def read_engine_key(launch: dict[str, Any]) -> str | None:
    """`launch`: the `launch` object of the controller's /status (runtime, ref). None when unknown."""
    ref = launch.get("ref")
    if not ref:
        return None
    try:
        return env_value_of(str(launch.get("runtime") or ""), str(ref), ENGINE_KEY_ENV)
    except (ValueError, ImportError):  # unknown kind, or its SDK is not on this host (issue 12)
        return None
