"""The compile-cache root of a recipe variant. Pure.

DOMAIN §2/§4 (S8 §5.4, S11m): with no fixed `VLLM_CACHE_ROOT` every start compiles a new
"vintage" and the token stream is a lottery; one cache root per recipe variant, each switch value
its own subdirectory. So the key covers exactly the inputs that change compiled artifacts — image,
interpreter, model, devices, every engine flag except where it listens, every environment value,
the sourced files and the launch wrapper — and nothing an operator edits for humans (`why`,
`description`, `notes`), nor expectations, host requirements or the admission memory model: a
comment change must not throw away a 230 s warm start (S14c) and cost a 352 s cold one.

Computed on the recipe as written (before ${APPLIANCE_HOME} is substituted), so the key is the
same on every host; the root directory itself lives under the host's cache root.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from appliance.host_facts import HostFacts
from appliance.recipe_model import DockerRuntime, Recipe

# Engine fields that only say where the API listens, or why: they never reach the compiler.
_NOT_COMPILE_INPUTS = frozenset({"host", "port", "why"})


def cache_key_inputs(recipe: Recipe) -> dict[str, Any]:
    """The recipe values the key is computed from (shown by `appliance plan`)."""
    runtime: dict[str, Any]
    if isinstance(recipe.runtime, DockerRuntime):
        runtime = {"kind": "docker", "image": recipe.runtime.image, "digest": recipe.runtime.digest}
    else:
        runtime = {"kind": "process", "python": recipe.runtime.python}
    engine = {k: v for k, v in recipe.engine.model_dump(mode="json").items() if k not in _NOT_COMPILE_INPUTS}
    return {
        "platform": recipe.platform.value,
        "runtime": runtime,
        "model": {"path": recipe.model.path, "host_path": recipe.model.host_path},
        "devices": list(recipe.devices) if recipe.devices is not None else None,
        "engine": engine,
        "env": {name: var.value for name, var in sorted(recipe.env.vars.items())},
        "source_files": list(recipe.env.source_files),
        "torch_first_wrapper": recipe.env.torch_first_wrapper,
    }


def cache_key(recipe: Recipe) -> str:
    """12 hex chars of sha256 over `cache_key_inputs` (canonical JSON)."""
    blob = json.dumps(cache_key_inputs(recipe), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def variant_cache_root(recipe: Recipe, facts: HostFacts) -> str:
    """`<cache.root>/<recipe name>-<key>`: readable, and distinct per variant."""
    base = facts.expand(recipe.cache.root).rstrip("/")
    return f"{base}/{recipe.name}-{cache_key(recipe)}"
