"""What the Choices pages show: the decision records `appliance choose` wrote (controller/evaluation/
choices.py), each with every candidate's admission numbers, gate and verdict, links to the compare
records, the champion and why, what was not tried and why, and the per-tier throughput of the runs
the gates measured, drawn like the Benchmarks pages (charts.py). The figures are the stored results'
own (appliance/evaluation/bench_result.py), never re-derived. Blocking (SQLite): routes call these
in a worker thread.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from appliance.evaluation.bench_result import BenchResult
from appliance.evaluation.tournament import (
    DEFAULT_BENCH_S,
    DEFAULT_READY_S,
    ChoiceRecord,
    Line,
    line_why,
    promotion_refusal,
    sla_summary,
)
from controller.console import charts
from controller.console.bench_views import TIER_NAMES, rate
from controller.evaluation.choice_store import ChoiceStore
from controller.evaluation.store import EvalStore

LIST_LIMIT = 50
GATED = ("won", "lost")


def _secs(s: float | None) -> str:
    if s is None:
        return "—"
    return f"{s / 60:.1f} min" if s >= 120 else f"{s:.0f} s"


def _line_row(x: Line) -> dict[str, Any]:
    return {
        "recipe": x.recipe, "stage": x.stage, "status": x.status, "why": line_why(x), "mode": x.mode or "—",
        "admission": x.admission or "—",
        "margin": "—" if x.margin_gib is None else f"{x.margin_gib:.2f} GiB",
        "numbers": [(k, v) for k, v in sorted(x.numbers.items()) if k != "margin_gib" and v is not None],
        "against": x.against, "verdict": x.verdict, "comparison_id": x.comparison_id,
        "reasons": x.reasons, "took": _secs(x.took_s),
        "eta": _secs(x.eta_s) + (" (default: no history)" if x.eta_from_history is False else ""),
        "point": ", ".join(f"{k}={v}" for k, v in x.point.items()),
        "sweep_of": x.sweep_of,
    }


def summary_row(r: ChoiceRecord) -> dict[str, Any]:
    return {"id": r.id, "state": r.state, "platform": r.platform, "pattern": r.pattern,
            "champion": r.champion, "baseline": r.baseline, "fast": r.fast, "started_at": r.started_at,
            "tried": sum(x.status in (*GATED, "failed-start", "error", "stale") for x in r.lines),
            "sweep": bool(r.sweep), "promoted": r.promoted}


def plan_rows(record: ChoiceRecord) -> list[dict[str, Any]]:
    return [_line_row(x) for x in record.lines]


def eta_source(record: ChoiceRecord) -> str:
    """Where the plan's expected duration comes from, said honestly: history, defaults, or both."""
    known = [x.eta_from_history for x in record.lines if x.eta_from_history is not None]
    if not known:
        return "nothing to run"
    if all(known):
        return "from this host's launch history (cold/warm ready times and bench times per variant)"
    if not any(known):
        return ("from the defaults (no launch or bench of these variants on this host yet: "
                f"{DEFAULT_READY_S:.0f} s a start, {DEFAULT_BENCH_S:.0f} s a bench)")
    return (f"{sum(known)} of {len(known)} arms from this host's launch history, the rest from the defaults "
            f"({DEFAULT_READY_S:.0f} s a start, {DEFAULT_BENCH_S:.0f} s a bench)")


class ChoiceData:
    def __init__(self, records: ChoiceStore, evals: EvalStore) -> None:
        self.records, self.evals = records, evals

    def index_view(self) -> list[dict[str, Any]]:
        return [summary_row(r) for r in self.records.list(LIST_LIMIT)]

    def record(self, choice_id: str) -> ChoiceRecord | None:
        return self.records.get(choice_id)

    def choice_view(self, choice_id: str) -> dict[str, Any] | None:
        """None for an unknown id."""
        record = self.records.get(choice_id)
        if record is None:
            return None
        rows = plan_rows(record)
        return {
            "r": record,
            "sweep_rows": [x for x in rows if x["stage"] == "sweep"],
            "rows": [x for x in rows if x["stage"] == "tournament"],
            "grid": "; ".join(f"{k}={','.join(str(v) for v in vs)}" for k, vs in record.sweep.items()),
            "eta": _secs(record.eta_s), "budget": _secs(record.budget_s),
            "took": _secs(record.ended_at - record.started_at) if record.ended_at else None,
            "not_tried": [x for x in rows if x["status"] in ("not-tried", "refused", "stale")],
            "chart": self._chart(record),
            "promotion_refusal": promotion_refusal(record),
            "sla": sla_summary(record),
        }

    def _chart(self, record: ChoiceRecord) -> Any:
        """Output tokens/s per tier of each gated recipe's run and of the champion it met (the first
        measured round of each), as the Benchmarks page draws its latest benches."""
        runs: dict[str, BenchResult] = {}
        for x in record.lines:
            if x.status not in GATED or not x.comparison_id:
                continue
            for row in reversed(self.evals.benchmarks(40, comparison_id=x.comparison_id)):
                if row["recipe"] in runs:
                    continue
                try:
                    found = self.evals.benchmark(str(row["id"]))
                except ValidationError:
                    found = None  # a row another version wrote: left out of the chart, the table has it
                if found is not None:
                    runs[row["recipe"]] = found
        if not runs:
            return None
        legend = list(runs)
        groups = [charts.BarGroup(name, [runs[r].throughput_by_tier().get(name) for r in legend])
                  for name in TIER_NAMES]
        return charts.grouped_bars(groups, legend, y_format=lambda v: f"{charts.tick_number(v)} tok/s",
                                   title=f"output tokens/s per tier, the runs of choice {record.id}")


def figures(result: BenchResult) -> list[str]:
    by_tier = result.throughput_by_tier()
    return [rate(by_tier.get(name)) for name in TIER_NAMES]
