"""Kernel-path and deployment proof, as the launch record keeps it (DOMAIN §7).

The supervisor records one `kernel-proof` event per launch at ready (which declared log markers
appeared, which declared file checksums matched); a bench or compare reads it back from the launch
record so that a missing marker or a mismatch fails the gate.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from appliance.bench_result import ProofResult

PROOF_EVENT = "kernel-proof"


def proof_from_events(events: Iterable[dict[str, Any]]) -> ProofResult:
    """The latest `kernel-proof` event of a launch record; empty when the recipe declares nothing."""
    latest: dict[str, Any] | None = None
    for event in events:
        if event.get("kind") == PROOF_EVENT:
            latest = event.get("data") or {}
    if latest is None:
        return ProofResult()
    return ProofResult(
        markers=dict(latest.get("markers") or {}), checksums=dict(latest.get("checksums") or {})
    )
