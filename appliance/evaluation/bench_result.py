"""What a benchmark run records, and the statistics over it. Pure data + arithmetic.

DOMAIN §7: record output_throughput, p99_ttft_ms, p99_tpot_ms, failed, output_lens and each
generated text — tokens/s alone misleads when output lengths change. Every request is kept, so a
result can be re-gated later (appliance/evaluation/gate.py works on these records only).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, Field, SerializerFunctionWrapHandler, model_serializer

from appliance.evaluation.accuracy import AccuracyResult
from appliance.evaluation.bench_tiers import SEED_TIERS, Tier, weighted_score


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolation percentile (numpy's default, what `vllm bench serve` reports)."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


class RequestRecord(BaseModel):
    tier: str
    index: int
    input_tokens: int
    output_tokens: int = 0
    ttft_ms: float | None = None
    tpot_ms: float | None = None  # (latency - ttft) / (output_tokens - 1); None for one token
    latency_ms: float | None = None
    text: str = ""
    ok: bool
    error: str | None = None


class TierResult(BaseModel):
    tier: Tier
    requests: list[RequestRecord]
    duration_s: float = Field(ge=0)
    concurrency: int = Field(ge=1)

    @property
    def failed(self) -> int:
        return sum(1 for r in self.requests if not r.ok)

    @property
    def output_lens(self) -> list[int]:
        return [r.output_tokens for r in self.requests]

    @property
    def output_throughput(self) -> float:
        """Output tokens/s of the successful requests over the tier's wall time."""
        if self.duration_s <= 0:
            return 0.0
        return sum(r.output_tokens for r in self.requests if r.ok) / self.duration_s

    @property
    def p99_ttft_ms(self) -> float | None:
        return percentile([r.ttft_ms for r in self.requests if r.ok and r.ttft_ms is not None], 99)

    @property
    def p99_tpot_ms(self) -> float | None:
        return percentile([r.tpot_ms for r in self.requests if r.ok and r.tpot_ms is not None], 99)

    def length_distribution(self, limit: int | None = None) -> dict[str, object]:
        """The output lengths of the successful requests: n, min, median, mean, max, and how many
        ran into `limit` (the request's max_tokens: stopped by the cap, not by EOS)."""
        return length_distribution([r.output_tokens for r in self.requests if r.ok], limit)

    def summary(self) -> dict[str, object]:
        return {
            "tier": self.tier.name,
            "inputs": f"{self.tier.lo}-{self.tier.hi}",
            "requests": len(self.requests),
            "failed": self.failed,
            "output_throughput": round(self.output_throughput, 3),
            "p99_ttft_ms": _round(self.p99_ttft_ms),
            "p99_tpot_ms": _round(self.p99_tpot_ms),
            "output_lens": self.output_lens,
        }


def length_distribution(lens: Sequence[int], limit: int | None = None) -> dict[str, object]:
    if not lens:
        return {"n": 0}
    out: dict[str, object] = {
        "n": len(lens),
        "min": min(lens),
        "median": statistics.median(lens),
        "mean": round(statistics.fmean(lens), 1),
        "max": max(lens),
    }
    if limit is not None:
        out["at_cap"] = sum(1 for n in lens if n >= limit)
        out["cap"] = limit
    return out


class SingleStream(BaseModel):
    """DOMAIN §7 single-stream protocol (S9–S14): decode median ms/token (n ≥ 5), TTFT at two
    prompt lengths, conc=8 tokens/s; always the same client."""

    decode_ms_samples: list[float]
    ttft_ms_by_input: dict[int, float]
    conc8_tokens_per_s: float | None
    failed: int = 0

    @property
    def decode_ms_median(self) -> float | None:
        return statistics.median(self.decode_ms_samples) if self.decode_ms_samples else None


class ProofResult(BaseModel):
    """Kernel-path and deployment proof (DOMAIN §7): which declared markers appeared, which
    declared checksums matched. Empty when the recipe declares none."""

    markers: dict[str, bool] = Field(default_factory=dict)
    checksums: dict[str, bool] = Field(default_factory=dict)
    forbidden: dict[str, bool] = Field(default_factory=dict)  # must-not-appear marker → seen
    # The scheduler limits the engine logged (appliance/observe/launch_proof.engine_limits).
    engine_limits: dict[str, int] = Field(default_factory=dict)
    # Seed 004 §7's deployment check (controller/evaluation/deployment.py): whether the recipe
    # declared one, and the `deployment-proof` record (facts, versions, problems) once it landed.
    deployment_declared: bool = False
    deployment: dict[str, Any] | None = None

    @model_serializer(mode="wrap")
    def _omit_no_deployment(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # A result without a deployment check dumps exactly as before (stored results, fixtures).
        data: dict[str, Any] = handler(self)
        if not self.deployment_declared:
            data.pop("deployment_declared", None)
        if self.deployment is None:
            data.pop("deployment", None)
        return data

    @property
    def problems(self) -> list[str]:
        out = [f"log marker not seen: {m!r}" for m, seen in self.markers.items() if not seen]
        out += [f"checksum mismatch: {p}" for p, ok in self.checksums.items() if not ok]
        out += [f"must-not-appear marker seen: {m!r}" for m, seen in self.forbidden.items() if seen]
        if self.deployment is not None:
            out += [f"deployment: {p}" for p in self.deployment.get("problems") or []]
        elif self.deployment_declared:
            out.append("deployment: the declared deployment check has no result on the launch "
                       "(the probe had not landed or could not be recorded)")
        return out


class SmokeResult(BaseModel):
    """DOMAIN §7 (seed 004 §5.3): the first 8–16K request alone, before any measurement — it must
    succeed, the engine must still answer after it, and the engine log must show no new error line
    since the arm became ready. Only for crashes, never for performance."""

    request: RequestRecord
    alive_after: bool
    new_error_lines: list[str] = Field(default_factory=list)
    log_checked: bool = True  # False: the engine log could not be read (then it proves nothing)


class BenchResult(BaseModel):
    id: str
    launch_id: str | None
    recipe: str
    spec_hash: str | None
    cache_vintage: str | None  # "cold" / "warm" (the launch's compile-cache outcome miss / hit)
    cache_root: str | None
    engine_url: str
    prompt_set: str  # appliance.evaluation.prompts.PROMPT_SET_VERSION
    tier_rule: str  # TierPlan.describe(): how the seed tiers were fitted into the context
    output_tokens: int
    ignore_eos: bool
    tiers: list[TierResult]
    single_stream: SingleStream | None = None
    proof: ProofResult = Field(default_factory=ProofResult)
    started_at: float
    finished_at: float
    # DOMAIN §7: between arms nothing else may change (max_num_seqs, max_num_batched_tokens, sampling,
    # output limits) and cards must not be mixed: both are recorded with every result.
    settings: dict[str, object] = Field(default_factory=dict)
    cards: dict[str, object] = Field(default_factory=dict)
    # DOMAIN §7 (seed 004 §11): warm-up requests sent before measuring, recorded and discarded.
    warmup: list[RequestRecord] = Field(default_factory=list)
    smoke: SmokeResult | None = None
    accuracy: AccuracyResult | None = None
    # Absolute per-tier SLO targets declared by the recipe (tier → ttft_ms / tpot_ms), for goodput.
    slo: dict[str, dict[str, float]] = Field(default_factory=dict)
    # "standard" (each tier's declared max output, stop at EOS), "full" (the same at 100 prompts per
    # tier), "fast" (a small fixed cap: tests only, never a verdict to stake a recipe on); None for a
    # record from before modes were recorded. `output_limits`: tier → the max_tokens its requests had.
    mode: str | None = None
    output_limits: dict[str, int] = Field(default_factory=dict)
    # Why this arm was not benched (the compare stopped early after a failed proof or smoke); then
    # `tiers` is empty and every later step is skipped .
    stopped: str | None = None

    @property
    def failed(self) -> int:
        return sum(t.failed for t in self.tiers) + (self.single_stream.failed if self.single_stream else 0)

    def throughput_by_tier(self) -> dict[str, float]:
        return {t.tier.name: t.output_throughput for t in self.tiers}

    @property
    def missing_tiers(self) -> list[str]:
        have = {t.tier.name for t in self.tiers}
        return [t.name for t in SEED_TIERS if t.name not in have]

    @property
    def score(self) -> float:
        """The seed's weighted score. A tier this run lacks counts 0 tokens/s: never a pass (the gate
        fails a run with a missing tier by name; `missing_tiers`), and never an exception that would
        leave a compare without a verdict."""
        return weighted_score({**{t: 0.0 for t in self.missing_tiers}, **self.throughput_by_tier()})

    def length_distribution(self) -> dict[str, dict[str, object]]:
        """Per tier and over all tiers: the output-length distribution of the measured requests."""
        out = {t.tier.name: t.length_distribution(self.output_limits.get(t.tier.name)) for t in self.tiers}
        lens = [r.output_tokens for t in self.tiers for r in t.requests if r.ok]
        caps = set(self.output_limits.values())
        out["all"] = length_distribution(lens, caps.pop() if len(caps) == 1 else None)
        return out

    def tier(self, name: str) -> TierResult | None:
        return next((t for t in self.tiers if t.tier.name == name), None)

    @property
    def total_output_tokens(self) -> int:
        return sum(r.output_tokens for t in self.tiers for r in t.requests if r.ok)

    def all_ttft_ms(self) -> list[float]:
        return [r.ttft_ms for t in self.tiers for r in t.requests if r.ok and r.ttft_ms is not None]

    def all_tpot_ms(self) -> list[float]:
        return [r.tpot_ms for t in self.tiers for r in t.requests if r.ok and r.tpot_ms is not None]

    @property
    def p99_ttft_ms(self) -> float | None:
        return percentile(self.all_ttft_ms(), 99)

    @property
    def p99_tpot_ms(self) -> float | None:
        return percentile(self.all_tpot_ms(), 99)

    def summary(self) -> dict[str, object]:
        ss = self.single_stream
        return {
            "id": self.id,
            "recipe": self.recipe,
            "launch_id": self.launch_id,
            "spec_hash": self.spec_hash,
            "cache_vintage": self.cache_vintage,
            "cache_root": self.cache_root,
            "score": round(self.score, 3),
            "failed": self.failed,
            "p99_ttft_ms": _round(self.p99_ttft_ms),
            "p99_tpot_ms": _round(self.p99_tpot_ms),
            "tier_rule": self.tier_rule,
            "prompt_set": self.prompt_set,
            "mode": self.mode,
            "output_limits": self.output_limits,
            "output_lengths": self.length_distribution(),
            "missing_tiers": self.missing_tiers,
            "stopped": self.stopped,
            "tiers": [t.summary() for t in self.tiers],
            "decode_ms_median": _round(ss.decode_ms_median) if ss else None,
            "ttft_ms_by_input": ss.ttft_ms_by_input if ss else None,
            "conc8_tokens_per_s": _round(ss.conc8_tokens_per_s) if ss else None,
            "proof_problems": self.proof.problems,
            "settings": self.settings,
            "cards": self.cards,
            "warmup_discarded": len(self.warmup),
            "smoke": None if self.smoke is None else {
                "ok": self.smoke.request.ok,
                "output_tokens": self.smoke.request.output_tokens,
                "alive_after": self.smoke.alive_after,
                "new_error_lines": self.smoke.new_error_lines,
            },
            "accuracy": None if self.accuracy is None else self.accuracy.summary(),
            "goodput": goodput_summary(self),
        }


def goodput_summary(
    r: BenchResult, slo: dict[str, dict[str, float]] | None = None
) -> dict[str, dict[str, object] | None]:
    """Goodput as `vllm bench serve` defines it: the requests meeting every SLO target (TTFT, TPOT),
    per second of the tier's wall time, and their share. Targets are per tier; without any for a
    tier its goodput is not computed (None)."""
    targets = slo if slo is not None else r.slo
    out: dict[str, dict[str, object] | None] = {}
    for t in r.tiers:
        target = targets.get(t.tier.name)
        if not target:
            out[t.tier.name] = None
            continue
        good = [q for q in t.requests if q.ok and _meets(q, target)]
        out[t.tier.name] = {
            "good": len(good),
            "requests": len(t.requests),
            "share": round(len(good) / len(t.requests), 4) if t.requests else None,
            "goodput_rps": round(len(good) / t.duration_s, 4) if t.duration_s > 0 else None,
            "targets": target,
        }
    return out


def _meets(q: RequestRecord, target: dict[str, float]) -> bool:
    ttft, tpot = target.get("ttft_ms"), target.get("tpot_ms")
    if ttft is not None and (q.ttft_ms is None or q.ttft_ms > ttft):
        return False
    # One-token outputs have no TPOT: vLLM counts them as meeting the TPOT target.
    return not (tpot is not None and q.tpot_ms is not None and q.tpot_ms > tpot)


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 3)
