"""The engine key's pure half: the key a recipe brings itself, and how a caller presents a key. Pure.

Below both the supervisor (controller/supervisor/engine_key.py makes a fresh key per launch; its
readiness probe presents it) and the runtimes (controller/runtime/kubernetes.py delivers a
recipe's own key): neither imports the other for it. How the key reaches vLLM is
appliance/engine_secret.py.
"""

from __future__ import annotations

from appliance.engine_argv import flag_value
from appliance.engine_names import ENGINE_KEY_ENV as ENGINE_KEY_ENV
from appliance.recipe.launch_spec import LaunchSpec

_API_KEY_FLAG = "--api-key"


def recipe_key(spec: LaunchSpec) -> str | None:
    """A key the recipe itself sets (its env, or `--api-key` in argv, which vLLM prefers)."""
    own = flag_value(spec.argv, _API_KEY_FLAG)  # never a typed field: the key stays in argv alone
    return own if own is not None else spec.env.get(ENGINE_KEY_ENV) or None


def bearer(key: str) -> str:
    return f"Bearer {key}"
