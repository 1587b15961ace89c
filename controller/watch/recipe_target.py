"""The running recipe's MemAvailable floor, for the `MemAvailableBelowRecipeTarget` alert.

The alert compares `appliance_host_memory_available_bytes` with
`appliance_launch_memory_available_target_bytes{recipe}`; nothing in production used to set the
target, so the alert could never fire. The supervisor's driver asks this (its `mem_target` seam) when a
launch starts or an engine is adopted and sets the gauge through the injected `ControllerMetrics`
(cleared when the launch ends); this turns the recipe's `expect.min_mem_available_gib` (DOMAIN §3:
the bar recipe C met was min MemAvailable 2.35 GiB) into bytes.
"""

from __future__ import annotations

from collections.abc import Callable

from appliance.recipe.recipe_loader import RecipeError
from appliance.recipe.recipe_model import Recipe

GIB = 1024**3


def mem_available_target_bytes(recipe: Recipe) -> int | None:
    gib = recipe.expect.min_mem_available_gib
    return None if gib is None else int(gib * GIB)


def recipe_mem_target(load: Callable[[str], Recipe]) -> Callable[[str], int | None]:
    """`load(name)` → Recipe (the preflight's loader); a recipe that no longer loads has no target
    (the launch itself already went through preflight)."""

    def target(name: str) -> int | None:
        try:
            return mem_available_target_bytes(load(name))
        except (LookupError, RecipeError, OSError):
            return None

    return target
