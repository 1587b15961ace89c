"""Runtime kind → its pure half. Adding a runtime is one line in `PLUGINS` (and one in
controller/runtime/registry.py for its effectful half).

From the plug-ins this builds the discriminated unions of the recipe's `runtime:` section
(appliance/recipe/recipe_model.py) and of LaunchSpec's `runtime:` sub-model
(appliance/recipe/launch_spec.py), and collects the `render --format` outputs every kind adds
(appliance/recipe/formats.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any, Union

from pydantic import Field

from appliance.runtimes import docker, process
from appliance.runtimes.base import Format, LaunchRuntime, RuntimePlugin, RuntimeSection
from appliance.runtimes.k8s import kubernetes

if TYPE_CHECKING:
    from appliance.recipe.launch_spec import LaunchSpec
    from appliance.recipe.recipe_model import Recipe

_ALL: tuple[RuntimePlugin, ...] = (
    docker.PLUGIN,
    process.PLUGIN,
    kubernetes.PLUGIN,
)
PLUGINS: Mapping[str, RuntimePlugin] = {p.kind: p for p in _ALL}
KINDS: tuple[str, ...] = tuple(PLUGINS)


def plugin(kind: str) -> RuntimePlugin:
    try:
        return PLUGINS[kind]
    except KeyError:
        raise ValueError(f"unknown runtime kind {kind!r}; expected one of {', '.join(KINDS)}") from None


def for_recipe(recipe: Recipe) -> RuntimePlugin:
    return plugin(recipe.runtime.kind)


def for_spec(spec: LaunchSpec) -> RuntimePlugin:
    return plugin(spec.runtime.kind)


def _union(models: list[type[Any]]) -> Any:
    # A discriminated union needs two members; with one plug-in it is just that model.
    if len(models) == 1:
        return models[0]
    return Annotated[Union[tuple(models)], Field(discriminator="kind")]  # noqa: UP007 — built at runtime


def section_union() -> Any:
    """The recipe's `runtime:` field type: every kind's section, discriminated by `kind`."""
    return _union([p.section for p in PLUGINS.values()])


def launch_union() -> Any:
    """LaunchSpec's `runtime:` field type: every kind's launch sub-model, discriminated by `kind`."""
    return _union([p.launch for p in PLUGINS.values()])


def formats() -> dict[str, Format]:
    """Every plug-in's render formats, by name (a name two plug-ins claim is a programming error)."""
    out: dict[str, Format] = {}
    for p in PLUGINS.values():
        for name, fmt in p.formats.items():
            if name in out:
                raise RuntimeError(f"render format {name!r} is claimed by two runtime plug-ins")
            out[name] = fmt
    return out


def lint_rule_ids() -> tuple[str, ...]:
    """The rule ids every plug-in's `lint` may emit (appliance/recipe/lint.py RULE_IDS)."""
    return tuple(rule for p in PLUGINS.values() for rule in p.lint_rules)


def launch_field_names() -> set[str]:
    """Every field any kind's launch sub-model has (the flat fields of an old launch record)."""
    return {name for p in PLUGINS.values() for name in p.launch.model_fields if name != "kind"}


__all__ = [
    "KINDS",
    "PLUGINS",
    "LaunchRuntime",
    "RuntimePlugin",
    "RuntimeSection",
    "for_recipe",
    "for_spec",
    "formats",
    "launch_field_names",
    "launch_union",
    "lint_rule_ids",
    "plugin",
    "section_union",
]
