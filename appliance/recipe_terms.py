"""The recipe's terms a runtime plug-in uses at run time: the `Platform` a recipe names and the lint
`Finding` a plug-in's `lint` returns. A leaf (it imports only pydantic and the standard library).

Why here and not in appliance/recipe/: `recipe_model.py` and `lint.py` build on the runtime registry
(the recipe's `runtime:` union, each kind's lint rules), and the registry imports the plug-ins; a
plug-in that took these from those modules closed a circle through the registry. Both modules
re-export them, so `appliance.recipe.recipe_model.Platform` and `appliance.recipe.lint.Finding` are
these same classes.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict


class Platform(StrEnum):
    GFX906 = "gfx906"  # Hygon Z100 / AMD GCN 5.1 (DOMAIN §1)
    CUDA = "cuda"
    CPU = "cpu"


Severity = Literal["error", "warning", "info"]


class Finding(BaseModel):
    model_config = ConfigDict(frozen=True)

    rule: str
    severity: Severity
    message: str
    field: str
    fact: str
