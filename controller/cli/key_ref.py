"""Which key an operator means: `appliance keys update` takes a key's id, its name, or a prefix of
its id that only one key has (as LiteLLM's key management does); anything else names the
candidates instead of guessing.

Order: an exact id; then an exact name among the keys not revoked (a revoked key's name may have been
reused); then an id prefix. Two keys that match the same way are ambiguous.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# A one- or two-character prefix picks a key by accident more often than on purpose (ids are hex).
MIN_PREFIX = 3


class KeyRefError(Exception):
    """`ref` names no key, or more than one: the message says which, `candidates` lists them."""

    def __init__(self, message: str, candidates: Sequence[Mapping[str, Any]] = ()) -> None:
        super().__init__(message)
        self.candidates = list(candidates)


def _label(row: Mapping[str, Any]) -> str:
    return f"{row['id']} ({row['name']}{', revoked' if row.get('revoked') else ''})"


def resolve(ref: str, rows: Sequence[Mapping[str, Any]]) -> str:
    """The id of the one key `ref` names, from the keys' rows (`id`, `name`, `revoked`)."""
    if any(r["id"] == ref for r in rows):
        return ref
    named = [r for r in rows if r["name"] == ref and not r.get("revoked")]
    if len(named) == 1:
        return str(named[0]["id"])
    if len(named) > 1:
        raise KeyRefError(f"{len(named)} keys are named {ref!r}: give the id", named)
    prefixed = [r for r in rows if len(ref) >= MIN_PREFIX and str(r["id"]).startswith(ref)]
    if len(prefixed) == 1:
        return str(prefixed[0]["id"])
    if len(prefixed) > 1:
        raise KeyRefError(f"{len(prefixed)} keys have ids starting {ref!r}: give more of the id", prefixed)
    short = f" (an id prefix needs at least {MIN_PREFIX} characters)" if len(ref) < MIN_PREFIX else ""
    raise KeyRefError(f"no key with the id or name {ref!r}{short}; `appliance keys list --all` "
                      "lists them")


def candidate_lines(exc: KeyRefError) -> list[str]:
    return [f"  {_label(r)}" for r in exc.candidates]
