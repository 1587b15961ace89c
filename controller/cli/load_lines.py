"""`appliance status`'s load lines: how busy the appliance is, from `GET /load` (the controller's
sampled gateway and engine figures, appliance/observe/load_figures.py). A figure nobody measured
reads `—`, never 0."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from appliance.observe.load_figures import counts

SPARK = "▁▂▃▄▅▆▇█"


def _n(v: float | None, digits: int = 1) -> str:
    return "—" if v is None else f"{v:.{digits}f}"


def _secs(v: float | None) -> str:
    if v is None:
        return "—"
    return f"{v * 1000:.0f} ms" if v < 1 else f"{v:.2f} s"


def uptime(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    s = int(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {(s % 3600) // 60:02d} min"


def sparkline(points: Sequence[Sequence[Any]], width: int = 30) -> str:
    """The last `width` points as block characters scaled to their own maximum; a gap is a space."""
    ys = [p[1] for p in points[-width:]]
    top = max((y for y in ys if y is not None), default=None)
    if top is None:
        return ""
    return "".join(" " if y is None else SPARK[0] if top <= 0 else SPARK[min(7, int(y / top * 7.999))]
                   for y in ys)


def load_lines(report: Mapping[str, Any]) -> list[str]:
    now = report.get("now") or {}
    series = report.get("series") or {}
    if report.get("sampled_at") is None:
        return ["load:       no sample yet (the controller samples every few seconds)"]
    window = now.get("window_s")
    over = f"(last {window:.0f} s)" if window else "(one sample so far: rates need two)"
    out = [
        f"load:       {_n(now.get('requests_per_s'), 2)} req/s · {_n(now.get('output_tokens_per_s'))} output "
        f"tok/s {over}",
        f"  trend:    req/s {sparkline(series.get('requests_per_s', []))}  "
        f"tok/s {sparkline(series.get('output_tokens_per_s', []))}",
        f"latency:    TTFT p50 {_secs(now.get('ttft_p50_s'))} p99 {_secs(now.get('ttft_p99_s'))} · "
        f"TPOT p50 {_secs(now.get('tpot_p50_s'))} p99 {_secs(now.get('tpot_p99_s'))}",
        f"in flight:  {_n(now.get('in_flight'), 0)} through the gateway, {_n(now.get('engine_running'), 0)} "
        f"running in the engine · queued {_n(now.get('engine_waiting'), 0)} in the engine, "
        f"{_n(now.get('gateway_held'), 0)} held by the gateway",
        f"KV cache:   {_n(now.get('kv_cache_pct'))} %",
        f"errors:     {counts(report)}",
        f"uptime:     {'—' if report.get('uptime_s') is None else 'ready for ' + uptime(report['uptime_s'])}",
    ]
    for which, problem in (report.get("problems") or {}).items():
        if problem:
            out.append(f"  ({which} not sampled: {problem})")
    return out
