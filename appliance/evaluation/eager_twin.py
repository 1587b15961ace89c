"""Which recipe's token streams stand for an arm in the gate's token-stream steps. Pure.

Seed 000 §一.6 S14d: "graph 只作延迟/吞吐口径，绝不进入任何依赖 token 流的门禁/SLA" — a graph arm is
measured for latency and throughput only and never enters a gate that reads the token stream; §一.7:
its text is never used for quality or accuracy (2.4 % of prompt pairs matched across restarts on
gfx906). So an arm whose recipe declares `expect.reproducibility: varies-across-restarts` and does
not run eager gets its smoke length, length hold and accuracy evidence from its **eager twin**: a
recipe with the same weights (`model.path`), dtype, platform and sampling (the engine's generation
overrides and reasoning parser), running `mode: eager`. An eager arm is its own twin, whatever its
declared reproducibility (on CUDA eager is declared varies until measured: it is still the path the
seed uses for quality).

The twin is the recipe's declaration (`expect.eager_twin`), checked against those fields, or else
derived: the compare's other arm when it qualifies (no extra switch), otherwise the first
qualifying recipe by name. None qualifies → the compare is refused with the reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

VARIES = "varies-across-restarts"
SAME = ("platform", "model", "dtype", "sampling", "reasoning_parser")


class NoEagerTwin(ValueError):
    """An arm whose text varies across restarts has no eager twin: its token-stream gates cannot run."""


@dataclass(frozen=True)
class Twin:
    recipe: str  # whose token streams stand for the arm (the arm itself when it needs no twin)
    how: str  # "own", "declared" or "derived"
    why: str


def _engine(doc: Mapping[str, Any]) -> Mapping[str, Any]:
    return doc.get("engine") or {}


def _expect(doc: Mapping[str, Any]) -> Mapping[str, Any]:
    return doc.get("expect") or {}


def is_eager(doc: Mapping[str, Any]) -> bool:
    return _engine(doc).get("mode") == "eager"


def needs_twin(doc: Mapping[str, Any]) -> bool:
    return _expect(doc).get("reproducibility") == VARIES and not is_eager(doc)


def identity(doc: Mapping[str, Any]) -> dict[str, Any]:
    """What a twin must share: the weights, dtype, platform and sampling."""
    engine = _engine(doc)
    return {
        "platform": doc.get("platform"),
        "model": (doc.get("model") or {}).get("path"),
        "dtype": engine.get("dtype"),
        "sampling": engine.get("override_generation_config") or {},
        "reasoning_parser": engine.get("reasoning_parser"),
    }


def mismatch(arm: Mapping[str, Any], twin: Mapping[str, Any]) -> list[str]:
    """Why `twin` cannot stand for `arm` (empty: it can)."""
    out = [] if is_eager(twin) else [f"mode {_engine(twin).get('mode')!r}, not eager"]
    a, t = identity(arm), identity(twin)
    out += [f"{k} {t[k]!r} vs {a[k]!r}" for k in SAME if a[k] != t[k]]
    return out


def resolve(
    name: str, doc: Mapping[str, Any], recipes: Mapping[str, Mapping[str, Any]], prefer: str | None = None
) -> Twin:
    """The twin of recipe `name` among `recipes` (name → document); `prefer`: the other arm."""
    if not needs_twin(doc):
        why = "runs eager" if is_eager(doc) else "its text does not vary across restarts"
        return Twin(recipe=name, how="own", why=why)
    declared = _expect(doc).get("eager_twin")
    if declared:
        twin = recipes.get(declared)
        if twin is None:
            raise NoEagerTwin(f"{name} declares expect.eager_twin {declared!r}, which is not a recipe here")
        problems = mismatch(doc, twin)
        if problems:
            shown = "; ".join(problems)
            raise NoEagerTwin(f"{name} declares expect.eager_twin {declared!r}, which differs: {shown}")
        return Twin(recipe=declared, how="declared", why=f"declared in {name}'s expect.eager_twin")
    order = ([prefer] if prefer is not None and prefer in recipes else []) + sorted(
        r for r in recipes if r != prefer
    )
    for other in order:
        if other != name and not mismatch(doc, recipes[other]):
            return Twin(recipe=other, how="derived",
                        why="derived: same model, dtype, platform and sampling, mode eager")
    raise NoEagerTwin(
        f"{name} declares reproducibility {VARIES} and runs {_engine(doc).get('mode')!r}: its token stream "
        "never feeds a gate (seed 000 §一.6 S14d), and no eager recipe with the same model, dtype, platform "
        "and sampling is there to stand for it — declare one in expect.eager_twin or add an eager recipe"
    )
