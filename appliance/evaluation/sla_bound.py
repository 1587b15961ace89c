"""The operator's latency bound for a choice (`appliance choose --sla ttft=2000,tpot=80`).

The gate's own SLA rule is relative (appliance/evaluation/gate.py: a candidate's per-tier P99 TTFT and
TPOT within 1.5 × the champion's, seed 004). An operator also has an absolute bound — what vLLM's
`benchmarks/auto_tune` and the `vllm-tuner` package optimise under ("throughput with P99 latency under
X ms"). Here it narrows the tournament, it never replaces the gate: a candidate whose gate is a win but
whose measured P99 breaks the bound in some tier does not become champion (its line says so), and a
champion over the bound (the baseline, which no gate judges) is named in the record and is not promoted.

What is measured: per tier, the median over an arm's runs in the gate (the re-runs) of that run's P99 —
the same "median of re-runs" the gate itself reads. A tier with no successful request has no P99: that
is a breach (nothing shows the bound held), never a pass. Pure: bench results in, sentences out.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from statistics import median

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from appliance.evaluation.bench_result import BenchResult

# The CLI's short names → the fields (ms). `--sla ttft=2000,tpot=80`.
SHORT = {"ttft": "ttft_p99_ms", "tpot": "tpot_p99_ms"}
_ITEM = re.compile(r"^\s*([a-z_0-9]+)\s*=\s*([0-9]+(?:\.[0-9]+)?)\s*(ms)?\s*$")


class SlaInputError(ValueError):
    """A malformed --sla (the message names the part and the rule)."""


class SlaBound(BaseModel):
    """P99 bounds in milliseconds, per tier; at least one."""

    model_config = ConfigDict(extra="forbid", strict=True)

    ttft_p99_ms: float | None = Field(default=None, gt=0, le=3_600_000)
    tpot_p99_ms: float | None = Field(default=None, gt=0, le=60_000)

    @model_validator(mode="after")
    def _one_at_least(self) -> SlaBound:
        if self.ttft_p99_ms is None and self.tpot_p99_ms is None:
            raise ValueError("an SLA names at least one bound: ttft_p99_ms or tpot_p99_ms (milliseconds)")
        return self

    def words(self) -> str:
        parts = []
        if self.ttft_p99_ms is not None:
            parts.append(f"P99 TTFT ≤ {self.ttft_p99_ms:g} ms")
        if self.tpot_p99_ms is not None:
            parts.append(f"P99 TPOT ≤ {self.tpot_p99_ms:g} ms")
        return ", ".join(parts) + " in every tier"


def parse_sla(text: str) -> SlaBound:
    """`ttft=2000,tpot=80` (milliseconds; `ms` may follow a number) → SlaBound, or SlaInputError
    naming the part and the rule."""
    values: dict[str, float] = {}
    for part in [p for p in text.split(",") if p.strip()] or [text]:
        m = _ITEM.match(part.lower())
        if m is None:
            raise SlaInputError(f"--sla: {part.strip()!r} is not NAME=MILLISECONDS (e.g. ttft=2000,tpot=80)")
        name, number = m.group(1), float(m.group(2))
        field = SHORT.get(name, name if name in SHORT.values() else None)
        if field is None:
            raise SlaInputError(f"--sla: unknown bound {name!r} (known: {', '.join(SHORT)})")
        if field in values:
            raise SlaInputError(f"--sla: {name} named twice")
        values[field] = number
    try:
        return SlaBound.model_validate(values)
    except ValidationError as exc:  # as appliance/settings.py words it: the field, then pydantic's rule
        err = exc.errors()[0]
        where = ".".join(str(x) for x in err["loc"]) or "sla"
        raise SlaInputError(f"--sla: {where}: {err['msg'].removeprefix('Value error, ')}") from None


def measured(runs: Sequence[BenchResult]) -> dict[str, dict[str, float | None]]:
    """tier → {"ttft_p99_ms", "tpot_p99_ms"}: the median over `runs` of each run's P99 (None: no run
    of that tier had a successful request)."""
    out: dict[str, dict[str, float | None]] = {}
    names = [t.tier.name for t in runs[0].tiers] if runs else []
    for name in names:
        row: dict[str, float | None] = {}
        for field, of in (("ttft_p99_ms", "p99_ttft_ms"), ("tpot_p99_ms", "p99_tpot_ms")):
            values = [v for run in runs if (t := run.tier(name)) is not None
                      and (v := getattr(t, of)) is not None]
            row[field] = median(values) if values else None
        out[name] = row
    return out


def breaches(bound: SlaBound, runs: Sequence[BenchResult]) -> list[str]:
    """Each tier and bound the runs break, as a sentence; [] when every tier holds the bound. No runs
    at all is a breach too (nothing was measured)."""
    if not runs:
        return ["no run was measured"]
    out: list[str] = []
    for tier, row in measured(runs).items():
        for field, label in (("ttft_p99_ms", "P99 TTFT"), ("tpot_p99_ms", "P99 TPOT")):
            limit = getattr(bound, field)
            if limit is None:
                continue
            value = row[field]
            if value is None:
                out.append(f"{label} in {tier}: not measured (no successful request), bound {limit:g} ms")
            elif value > limit:
                out.append(f"{label} in {tier}: {value:.1f} ms > {limit:g} ms")
    return out
