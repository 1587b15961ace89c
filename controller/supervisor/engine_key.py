"""The engine's own door: a secret API key per launch.

The engine listens on loopback, but any local user could reach it there and bypass the gateway's
keys and limits. Each launch therefore gets a fresh random key, handed to vLLM in a 0600 config
file given with `--config` (appliance/engine_secret.py; in `VLLM_API_KEY` it entered
vLLM 0.26.0's compile-cache hash and made every warm restart a full recompile) — never in argv (any
user can read `/proc/PID/cmdline`), never in the environment, never in a launch record, never
printed. Only the controller's readiness probe and the gateway (told with the upstream) know
it. The key also proves that the engine answering a probe is the one this launch started: an
engine left over from an earlier launch has another key and answers 401.

vLLM guards only its OpenAI paths with the key (`/v1`, `/v2`, `/inference`, `/cohere`); `/health`
and its other non-`/v1` routes stay open on loopback (see README "The engine's own door").

The pure half (the key a recipe brings itself, the bearer header) is appliance/recipe/engine_key.py,
where the runtimes reach it too.
"""

from __future__ import annotations

import secrets

from appliance.recipe.engine_key import recipe_key
from appliance.recipe.launch_spec import LaunchSpec


def new_engine_key() -> str:
    return "eng_" + secrets.token_urlsafe(32)


def launch_key(spec: LaunchSpec) -> tuple[str, str | None]:
    """The key this launch's engine will accept, and the key the runtime must deliver to it (None
    when the recipe brings its own key: vLLM reads that one from the recipe's env or argv, and it
    is the same for every launch, so it moves no compile cache)."""
    own = recipe_key(spec)
    if own is not None:
        return own, None
    key = new_engine_key()
    return key, key
