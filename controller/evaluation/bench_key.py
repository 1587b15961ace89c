"""The running launch's engine API key, for a bench/fingerprint/compare run from the CLI.

Every launch has a secret key (in a 0600 vLLM config file, appliance/engine_secret.py)
that the controller's probes and the gateway send. A CLI run against the controller's engine reads
it back from where the runtime put it — the same source an adopting controller uses
(`Runtime.read_engine_key`) — which only the engine's user (or root) can read. Anyone else benches
through the gateway with a client key (`--engine-url GATEWAY --key KEY`).
"""

from __future__ import annotations

from typing import Any

from controller.runtime.registry import engine_key_of


def read_engine_key(launch: dict[str, Any]) -> str | None:
    """`launch`: the `launch` object of the controller's /status (runtime, ref). None when unknown."""
    ref = launch.get("ref")
    if not ref:
        return None
    try:
        return engine_key_of(str(launch.get("runtime") or ""), str(ref))
    except (ValueError, ImportError):  # unknown kind, or its SDK is not on this host
        return None
