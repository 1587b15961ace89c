"""The engine key's pure half: the key a recipe brings itself, and how a caller presents a key. Pure.

Below both the supervisor (controller/supervisor/engine_key.py makes a fresh key per launch; its
readiness probe presents it) and the runtimes (controller/runtime/kubernetes.py delivers a
recipe's own key): neither imports the other for it. How the key reaches vLLM is
appliance/engine_secret.py.
"""

from __future__ import annotations

from appliance.launch_spec import LaunchSpec

ENGINE_KEY_ENV = "VLLM_API_KEY"
_API_KEY_FLAG = "--api-key"


def recipe_key(spec: LaunchSpec) -> str | None:
    """A key the recipe itself sets (its env, or `--api-key` in argv, which vLLM prefers)."""
    argv = list(spec.argv)
    for i, arg in enumerate(argv):
        if arg == _API_KEY_FLAG and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(_API_KEY_FLAG + "="):
            return arg.split("=", 1)[1]
    return spec.env.get(ENGINE_KEY_ENV) or None


def bearer(key: str) -> str:
    return f"Bearer {key}"
