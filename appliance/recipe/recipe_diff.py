"""Field-by-field difference of two merged recipes (`appliance recipes diff`, the console's diff).

Pure: the recipes are already loaded (appliance/recipe/recipe_loader.py); the CLI and the console only
format what `diff_recipes` returns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from appliance.engine_secret import redact_recipe_data
from appliance.recipe.cache_key import cache_key, cache_key_inputs
from appliance.recipe.recipe_model import Recipe


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """Nested mappings as one level of dotted keys (`engine.max_model_len`); an empty mapping, a
    list or a scalar is a leaf."""
    if isinstance(data, dict) and data:
        out: dict[str, Any] = {}
        for k, v in data.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: data}


@dataclass(frozen=True)
class RecipeDiff:
    """(field, value in a, value in b) for every field that differs, sorted by field, and whether the
    two recipes share their compile inputs (and so a compile cache)."""

    changes: list[tuple[str, Any, Any]]
    same_compile_inputs: bool
    keys: tuple[str, str]


def diff_recipes(a: Recipe, b: Recipe) -> RecipeDiff:
    # shown by the CLI and the console: a recipe's own engine key or token never appears in a diff
    fa = flatten(redact_recipe_data(a.model_dump(mode="json")))
    fb = flatten(redact_recipe_data(b.model_dump(mode="json")))
    changes = [(k, fa.get(k), fb.get(k)) for k in sorted(set(fa) | set(fb)) if fa.get(k) != fb.get(k)]
    return RecipeDiff(changes=changes, same_compile_inputs=cache_key_inputs(a) == cache_key_inputs(b),
                      keys=(cache_key(a), cache_key(b)))
