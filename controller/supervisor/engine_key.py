"""The engine's own door: a secret API key per launch (issue 9).

The engine listens on loopback, but any local user could reach it there and bypass the gateway's
keys and limits. Each launch therefore gets a fresh random key, handed to vLLM in a 0600 config
file given with `--config` (appliance/engine_secret.py; issue 19: in `VLLM_API_KEY` it entered
vLLM 0.26.0's compile-cache hash and made every warm restart a full recompile) — never in argv (any
user can read `/proc/PID/cmdline`), never in the environment, never in a launch record, never
printed. Only the controller's readiness probe and the gateway (told with the upstream) know
it. The key also proves that the engine answering a probe is the one this launch started: an
engine left over from an earlier launch has another key and answers 401.

vLLM guards only its OpenAI paths with the key (`/v1`, `/v2`, `/inference`, `/cohere`); `/health`
and its other non-`/v1` routes stay open on loopback (see README "The engine's own door").
"""

from __future__ import annotations

import secrets

from appliance.engine_argv import flag_value
from appliance.engine_names import ENGINE_KEY_ENV as ENGINE_KEY_ENV
from appliance.launch_spec import LaunchSpec

_API_KEY_FLAG = "--api-key"


def new_engine_key() -> str:
    return "eng_" + secrets.token_urlsafe(32)


def recipe_key(spec: LaunchSpec) -> str | None:
    """A key the recipe itself sets (its env, or `--api-key` in argv, which vLLM prefers)."""
    own = flag_value(spec.argv, _API_KEY_FLAG)  # never a typed field: the key stays in argv alone
    return own if own is not None else spec.env.get(ENGINE_KEY_ENV) or None


def launch_key(spec: LaunchSpec) -> tuple[str, str | None]:
    """The key this launch's engine will accept, and the key the runtime must deliver to it (None
    when the recipe brings its own key: vLLM reads that one from the recipe's env or argv, and it
    is the same for every launch, so it moves no compile cache)."""
    own = recipe_key(spec)
    if own is not None:
        return own, None
    key = new_engine_key()
    return key, key


def bearer(key: str) -> str:
    return f"Bearer {key}"
