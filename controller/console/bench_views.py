"""What the Benchmarks pages show: the comparisons and benches `appliance bench | compare` stored.

Operators choose eager vs graph (DOMAIN §2) on this evidence: the gate's verdict and its reasons,
per-tier output tokens/s, failed requests, P99 TTFT/TPOT (DOMAIN §7). The data comes from the one
EvalStore create_app shares with the evaluation API (controller/evaluation/store.py); the figures
are computed by the result model itself (appliance/evaluation/bench_result.py), never re-derived here.
Blocking (SQLite): the routes call these in a worker thread.
"""

from __future__ import annotations

import statistics
from typing import Any

from markupsafe import Markup
from pydantic import ValidationError

from appliance.evaluation.bench_result import BenchResult, RequestRecord, TierResult
from appliance.evaluation.bench_tiers import SCALE_RULE, SEED_TIERS
from controller.console import charts
from controller.evaluation.store import EvalStore

LIST_LIMIT = 50  # newest comparisons and benches on the list page
PER_COMPARISON = 40  # benches of one compare: 2 arms × at most 10 rounds (router.CompareBody.rounds)
PER_LAUNCH = 20
TIER_NAMES = tuple(t.name for t in SEED_TIERS)  # the score's tiers, always all three (DOMAIN §7)
SEED_BOUNDS = {t.name: (t.lo, t.hi) for t in SEED_TIERS}


def rate(v: float | None) -> str:
    return "—" if v is None else f"{v:.2f}"


def ms(v: float | None) -> str:
    return "—" if v is None else f"{v:,.1f} ms"


def scaled(result: BenchResult) -> bool:
    """Tiers fitted into a short context (appliance/evaluation/bench_tiers.py): bounds differ from the
    seed's."""
    return any(SEED_BOUNDS.get(t.tier.name) != (t.tier.lo, t.tier.hi) for t in result.tiers)


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _tier_row(t: TierResult) -> dict[str, Any]:
    ok = [r for r in t.requests if r.ok]
    seed = SEED_BOUNDS.get(t.tier.name)
    return {
        "name": t.tier.name,
        "inputs": f"{t.tier.lo}–{t.tier.hi}",
        "seed_inputs": f"{seed[0]}–{seed[1]}" if seed and seed != (t.tier.lo, t.tier.hi) else None,
        "ok": len(ok),
        "failed": t.failed,
        "median_ttft": ms(_median([r.ttft_ms for r in ok if r.ttft_ms is not None])),
        "p99_ttft": ms(t.p99_ttft_ms),
        "p99_tpot": ms(t.p99_tpot_ms),
        "throughput": rate(t.output_throughput),
        "output_tokens": sum(r.output_tokens for r in ok),
        "duration_s": f"{t.duration_s:.1f} s",
        "concurrency": t.concurrency,
    }


def _tip(r: RequestRecord, value: float | None, what: str) -> str:
    if not r.ok:
        return f"request {r.index} ({r.input_tokens} input tokens) failed: {r.error or 'no error text'}"
    return (f"request {r.index}: {r.input_tokens} input tokens, {r.output_tokens} output tokens, "
            f"{what} {ms(value)}")


def _request_chart(result: BenchResult, what: str, field: str) -> Markup:
    strips = []
    for t in result.tiers:
        dots = []
        for r in t.requests:
            value: float | None = getattr(r, field) if r.ok else None
            if r.ok and value is None:
                continue  # an ok request without this figure (one output token has no TPOT)
            dots.append(charts.Dot(value, _tip(r, value, what)))
        strips.append(charts.Strip(f"{t.tier.name} ({t.tier.lo}–{t.tier.hi})", dots))
    return charts.strip_chart(strips, title=f"{what} per request of {result.id}")


def _tier_figures(result: BenchResult | None) -> list[str]:
    if result is None:
        return ["—"] * len(TIER_NAMES)
    by_tier = result.throughput_by_tier()
    return [rate(by_tier.get(name)) for name in TIER_NAMES]


class BenchData:
    def __init__(self, evals: EvalStore) -> None:
        self.evals = evals

    # -- list page

    def index_view(self) -> dict[str, Any]:
        benches = []
        for row in self.evals.benchmarks(LIST_LIMIT):
            result = self._readable(row["id"])
            benches.append({
                **row, "tiers": _tier_figures(result), "score": rate(row["score"]),
                "scaled": result is not None and scaled(result), "unreadable": result is None,
            })
        comparisons = [self._comparison_row(c) for c in self.evals.comparisons(LIST_LIMIT)]
        latest = self.latest_by_recipe()
        chart = None
        if latest:
            legend = [r.recipe for r in latest]
            groups = [charts.BarGroup(name, [r.throughput_by_tier().get(name) for r in latest])
                      for name in TIER_NAMES]
            chart = charts.grouped_bars(groups, legend, y_format=lambda v: f"{charts.tick_number(v)} tok/s",
                                        title="output tokens/s per tier, latest bench per recipe")
        return {"benches": benches, "comparisons": comparisons, "chart": chart,
                "latest": [{"recipe": r.recipe, "id": r.id, "when": r.finished_at, "scaled": scaled(r)}
                           for r in latest],
                "tier_names": TIER_NAMES}

    def _comparison_row(self, c: dict[str, Any]) -> dict[str, Any]:
        benches = list(reversed(self.evals.benchmarks(PER_COMPARISON, comparison_id=c["id"])))  # round order
        return {**c,
                "baseline_benches": [b["id"] for b in benches if b["recipe"] == c["baseline"]],
                "candidate_benches": [b["id"] for b in benches if b["recipe"] == c["candidate"]]}

    def latest_by_recipe(self) -> list[BenchResult]:
        """The newest bench of each recipe, by recipe name (so eager and graph sit side by side)."""
        out = []
        for _recipe, latest in sorted(self.evals.latest_by_recipe().items()):
            result = self._readable(latest["id"]) if "id" in latest else None  # fingerprint-only: none
            if result is not None:
                out.append(result)
        return out

    def _readable(self, bench_id: str) -> BenchResult | None:
        """The stored result, or None where its JSON no longer fits the model (a row written by
        another version): the list shows the row's columns with dashes rather than failing."""
        try:
            return self.evals.benchmark(bench_id)
        except ValidationError:
            return None

    def for_launch(self, launch_id: str) -> list[dict[str, Any]]:
        return [{**row, "score": rate(row["score"])}
                for row in self.evals.benchmarks(PER_LAUNCH, launch_id=launch_id)]

    # -- one comparison

    def comparison_view(self, comparison_id: str) -> dict[str, Any] | None:
        """Both arms side by side per tier and per gate step, the texts that differ and the accuracy
        items that flipped (DOMAIN §7). None for an unknown id; ValidationError for an unreadable row."""
        found = self.evals.comparison(comparison_id)
        if found is None:
            return None
        info, gate = found
        rows = list(reversed(self.evals.benchmarks(PER_COMPARISON, comparison_id=comparison_id)))
        runs = [r for r in (self._readable(row["id"]) for row in rows) if r is not None]
        base = [r for r in runs if r.recipe == info["baseline"]]
        cand = [r for r in runs if r.recipe == info["candidate"]]
        score = next((s for s in gate.steps if s.name == "score"), None)
        rep = (score.evidence.get("representative_runs") or {}) if score else {}
        b = next((r for r in base if r.id == rep.get("baseline")), base[0] if base else None)
        c = next((r for r in cand if r.id == rep.get("candidate")), cand[0] if cand else None)
        tiers = []
        for name in TIER_NAMES:
            bt, ct = (b.tier(name) if b else None), (c.tier(name) if c else None)
            tiers.append({"name": name, "baseline": _tier_row(bt) if bt else None,
                          "candidate": _tier_row(ct) if ct else None})
        differing = []
        if b and c:
            texts = {(q.tier, q.index): q for t in b.tiers for q in t.requests}
            for t in c.tiers:
                for q in t.requests:
                    other = texts.get((q.tier, q.index))
                    if other is not None and other.text != q.text:
                        differing.append({"tier": q.tier, "index": q.index, "baseline": other.text,
                                          "candidate": q.text,
                                          "lens": (other.output_tokens, q.output_tokens)})
        acc = next((s for s in gate.steps if s.name == "accuracy"), None)
        return {
            "info": info, "gate": gate, "tiers": tiers, "differing": differing,
            "baseline_run": b, "candidate_run": c,
            "baseline_runs": [r.id for r in base], "candidate_runs": [r.id for r in cand],
            "flipped": (acc.evidence.get("flipped") or []) if acc else [],
            "accuracy": acc.evidence if acc and acc.evidence else None,
        }

    # -- one bench

    def bench_view(self, bench_id: str) -> dict[str, Any] | None:
        """None for an unknown id; pydantic's ValidationError (a ValueError) for an unreadable row."""
        result = self.evals.benchmark(bench_id)
        if result is None:
            return None
        ss = result.single_stream
        single = None
        if ss is not None:
            single = {
                "decode": ms(ss.decode_ms_median), "samples": len(ss.decode_ms_samples),
                "ttft_by_input": [(n, ms(v)) for n, v in sorted(ss.ttft_ms_by_input.items())],
                "conc8": rate(ss.conc8_tokens_per_s), "failed": ss.failed,
            }
        proof = None
        if result.proof.markers or result.proof.checksums:
            proof = {"markers": sorted(result.proof.markers.items()),
                     "checksums": sorted(result.proof.checksums.items()),
                     "problems": result.proof.problems}
        row = next(iter(self.evals.benchmarks(1, bench_id=result.id)), None)
        return {
            "r": result, "score": rate(result.score), "failed": result.failed,
            "p99_ttft": ms(result.p99_ttft_ms), "p99_tpot": ms(result.p99_tpot_ms),
            "tiers": [_tier_row(t) for t in result.tiers],
            "scaled": scaled(result), "scale_rule": SCALE_RULE,
            "single": single, "proof": proof,
            "comparison_id": row["comparison_id"] if row else None,
            "settings": result.settings, "cards": result.cards,
            "failures": [(t.tier.name, r.index, r.error or "no error text")
                         for t in result.tiers for r in t.requests if not r.ok],
            "ttft_chart": _request_chart(result, "TTFT", "ttft_ms"),
            "latency_chart": _request_chart(result, "latency", "latency_ms"),
        }
