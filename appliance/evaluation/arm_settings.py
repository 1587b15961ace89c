"""What must not differ between the two arms of a compare, and the cards each ran on. Pure.

DOMAIN §7 (seed 004 §1): between arms nothing else may change — not `max_num_seqs`,
`max_num_batched_tokens`, the sampling parameters or the max output tokens — and results from
different cards must not be mixed (cards 0/1 vs 2/3 differ by ~16 %, power caps 280 vs 250 W).
A compare refuses arms that differ in a forbidden field unless the operator names the field
(`--allow-diff FIELD`: the difference is then the point of the comparison, and it is recorded and
flagged); arms on different cards are never gated against each other.
"""

from __future__ import annotations

from typing import Any

# Seed 004 §1 lists the model weights and structure first: a different model path or declared checksum
# between arms is refused like the rest (`--allow-diff model` when the weights are the point).
FORBIDDEN_FIELDS = ("model", "max_num_seqs", "max_num_batched_tokens", "sampling", "output_limits")
ENGINE_DEFAULT = "the engine's default"


class ArmsDiffer(ValueError):
    """The arms differ in a field that must be equal: no comparison."""


def settings_of(
    recipe: dict[str, Any] | None,
    *,
    output_tokens: int,
    ignore_eos: bool,
    logged: dict[str, int] | None = None,
) -> dict[str, Any]:
    """The forbidden-to-differ settings of an arm: the model (path and declared checksum), the
    scheduling limits, its sampling overrides next to the client's (temperature 0, the same client for
    both arms) and the output limits the requests carry.

    `logged`: the limits the engine itself stated in its log (a launch's proof). They are the
    effective values and win over the recipe's; where neither says, the value is
    ENGINE_DEFAULT — never None, which read like "the same" for two engines whose defaults differ
    (vLLM's depend on the card's memory and the world size). `limits_source` says where each came from."""
    engine = (recipe or {}).get("engine") or {}
    model = (recipe or {}).get("model") or {}
    overrides = engine.get("override_generation_config") or {}
    limits: dict[str, Any] = {}
    source: dict[str, str] = {}
    for name in ("max_num_seqs", "max_num_batched_tokens"):
        if logged and name in logged:
            limits[name], source[name] = logged[name], "engine log"
        elif engine.get(name) is not None:
            limits[name], source[name] = engine[name], "recipe"
        else:
            limits[name], source[name] = ENGINE_DEFAULT, "not stated (vLLM logs its default only at DEBUG)"
    return {
        "model": {"path": model.get("path"), "checksum": model.get("checksum")},
        **limits,
        "limits_source": source,
        "sampling": {"temperature": 0.0, "engine_overrides": overrides},
        "output_limits": {"max_tokens": output_tokens, "ignore_eos": ignore_eos},
    }


def cards_of(recipe: dict[str, Any] | None, read: dict[str, Any] | None = None) -> dict[str, Any]:
    """The cards an arm ran on: platform and device indices from the recipe, and what the host could
    read about them (`read`: names, power caps; absent where unreadable)."""
    r = recipe or {}
    devices = r.get("devices")
    return {
        "platform": r.get("platform"),
        "devices": list(devices) if devices is not None else None,
        **(read or {}),
    }


def differences(baseline: dict[str, Any], candidate: dict[str, Any]) -> dict[str, list[Any]]:
    """Forbidden fields whose values differ: field → [baseline, candidate]."""
    return {
        f: [baseline.get(f), candidate.get(f)]
        for f in FORBIDDEN_FIELDS
        if baseline.get(f) != candidate.get(f)
    }


def check(
    baseline: dict[str, Any], candidate: dict[str, Any], allow: frozenset[str] | set[str] = frozenset()
) -> dict[str, list[Any]]:
    """The allowed differences (to record); raises ArmsDiffer on any other."""
    unknown = sorted(set(allow) - set(FORBIDDEN_FIELDS))
    if unknown:
        raise ArmsDiffer(
            f"--allow-diff {', '.join(unknown)}: not a field; one of {', '.join(FORBIDDEN_FIELDS)}"
        )
    diffs = differences(baseline, candidate)
    refused = {f: v for f, v in diffs.items() if f not in allow}
    if refused:
        shown = "; ".join(f"{f}: {b!r} vs {c!r}" for f, (b, c) in refused.items())
        raise ArmsDiffer(
            f"the arms differ in what must stay equal between them (DOMAIN §7): {shown}. "
            f"Pass --allow-diff {' --allow-diff '.join(refused)} if that difference is the point of "
            "the comparison"
        )
    return diffs


def card_mismatch(baseline: dict[str, Any], candidate: dict[str, Any]) -> str | None:
    """Why two arms' cards are not the same cards (None when they are, or when neither names any)."""
    keys = ("platform", "devices", "names", "power_caps_w")
    diff = [k for k in keys if baseline.get(k) != candidate.get(k)]
    if not diff:
        return None
    return "; ".join(f"{k}: {baseline.get(k)!r} vs {candidate.get(k)!r}" for k in diff)
