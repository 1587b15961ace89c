"""The reproducibility fingerprint: hashes of token streams and what their differences mean. Pure.

DOMAIN §2 (S14b/S14d/S14e): eager B is bitwise identical across restarts (12/12) *if batch
composition is fixed*; even eager diverged at token 6 between conc=2 and serial; graph C differs
across restarts (12/12 prompts) — warming the cache does not make it reproducible. So a fingerprint
fixes the prompt set, temperature 0, max_num_seqs and concurrency, and compares three ways:

- repeats: the same prompts sent again, serially, to the same engine;
- batch: serial vs concurrent sends;
- restarts: this launch vs an earlier launch of the same recipe and cache root.

The measured class is the strongest variation seen: varies-across-restarts >
varies-across-batch > bitwise-reproducible (with repeats differing counted as
varies-across-restarts' worse cousin, `nondeterministic`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from enum import StrEnum

from pydantic import BaseModel, Field


class Measured(StrEnum):
    BITWISE = "bitwise-reproducible"
    VARIES_ACROSS_BATCH = "varies-across-batch"
    VARIES_ACROSS_RESTARTS = "varies-across-restarts"
    NONDETERMINISTIC = "nondeterministic"  # differs between identical serial repeats


def stream_hash(token_ids: Sequence[int]) -> str:
    """sha256 of one token stream (ids as compact JSON: unambiguous, language-neutral)."""
    return hashlib.sha256(json.dumps(list(token_ids), separators=(",", ":")).encode()).hexdigest()


def set_hash(stream_hashes: Sequence[str]) -> str:
    """sha256 over the streams' hashes in prompt order: one value per prompt set."""
    return hashlib.sha256("\n".join(stream_hashes).encode()).hexdigest()


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first token where two streams differ (length difference counts); None if equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


class Comparison(BaseModel):
    """Two runs of the same prompt set: which prompts differ and where they first diverge."""

    identical: bool
    differing: dict[int, int] = Field(default_factory=dict)  # prompt index → first divergent token

    @property
    def first_divergence(self) -> int | None:
        return min(self.differing.values()) if self.differing else None


def compare_runs(a: Sequence[Sequence[int]], b: Sequence[Sequence[int]]) -> Comparison:
    if len(a) != len(b):
        raise ValueError(f"runs of different prompt sets ({len(a)} vs {len(b)} prompts)")
    differing = {
        i: d for i, (x, y) in enumerate(zip(a, b, strict=True)) if (d := first_divergence(x, y)) is not None
    }
    return Comparison(identical=not differing, differing=differing)


class Fingerprint(BaseModel):
    prompt_set: str
    max_tokens: int
    max_num_seqs: int | None
    concurrency: int
    serial_set_hash: str
    concurrent_set_hash: str
    stream_hashes: list[str]
    repeats: Comparison
    batch: Comparison
    restarts: Comparison | None = None  # None: no earlier launch on the same cache root to compare
    restart_reference: str | None = None  # the earlier launch id compared against

    @property
    def measured(self) -> Measured:
        return classify(self.repeats, self.batch, self.restarts)


def classify(repeats: Comparison, batch: Comparison, restarts: Comparison | None) -> Measured:
    if not repeats.identical:
        return Measured.NONDETERMINISTIC
    if restarts is not None and not restarts.identical:
        return Measured.VARIES_ACROSS_RESTARTS
    if not batch.identical:
        return Measured.VARIES_ACROSS_BATCH
    return Measured.BITWISE


class DeclaredCheck(BaseModel):
    declared: str
    measured: Measured
    restarts_measured: bool
    mismatch: bool
    finding: str


def check_declared(declared: str, fp: Fingerprint) -> DeclaredCheck:
    """The recipe's `expect.reproducibility` against the measurement.

    A mismatch is the dangerous direction only: a recipe declared `bitwise` whose stream changed
    across restarts or between identical repeats (quality work relies on it, DOMAIN §2 policy).
    Batch variation does not contradict `bitwise` (B is bitwise only with a fixed batch
    composition). A `varies-across-restarts` recipe measured identical is conservative, reported
    but not a mismatch. Without a restart comparison, `bitwise` is unproven, not contradicted.
    """
    measured = fp.measured
    restarts = fp.restarts is not None
    if declared == "bitwise":
        if measured is Measured.NONDETERMINISTIC:
            return DeclaredCheck(
                declared=declared,
                measured=measured,
                restarts_measured=restarts,
                mismatch=True,
                finding=f"declared bitwise, but identical serial repeats differ "
                f"(first divergent token {fp.repeats.first_divergence})",
            )
        if measured is Measured.VARIES_ACROSS_RESTARTS:
            assert fp.restarts is not None
            return DeclaredCheck(
                declared=declared,
                measured=measured,
                restarts_measured=restarts,
                mismatch=True,
                finding=f"declared bitwise, but the stream changed across restarts vs launch "
                f"{fp.restart_reference} (first divergent token "
                f"{fp.restarts.first_divergence})",
            )
        note = "" if restarts else " (across restarts not measured yet: run again after a restart)"
        return DeclaredCheck(
            declared=declared,
            measured=measured,
            restarts_measured=restarts,
            mismatch=False,
            finding=f"declared bitwise, measured {measured.value}{note}",
        )
    if measured is Measured.BITWISE and restarts:
        finding = (
            f"declared {declared}, measured bitwise-reproducible across restarts (conservative declaration)"
        )
    else:
        finding = f"declared {declared}, measured {measured.value}"
    return DeclaredCheck(
        declared=declared, measured=measured, restarts_measured=restarts, mismatch=False, finding=finding
    )
