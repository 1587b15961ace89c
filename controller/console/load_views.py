"""The Now page's load panel: each figure of `GET /load` (controller/api_context.load_view) as a row
with its value now and a sparkline of the last ~15 minutes (charts.sparkline). A figure nobody
measured reads `—`, never 0."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from markupsafe import Markup

from controller.console.charts import PALETTE, sparkline

EMPTY = "—"


def _rate(v: float) -> str:
    return f"{v:.2f}" if v < 10 else f"{v:.1f}"


def _latency(v: float) -> str:
    return f"{v * 1000:.0f} ms" if v < 1 else f"{v:.2f} s"


def _count(v: float) -> str:
    return f"{v:.0f}"


def _pct(v: float) -> str:
    return f"{v:.1f} %"


# (figure, label, format, what it is): the order of the panel's rows
ROWS: tuple[tuple[str, str, Callable[[float], str], str], ...] = (
    ("requests_per_s", "Requests / s", _rate, "finished requests through the gateway"),
    ("output_tokens_per_s", "Output tokens / s", _rate, "tokens the engine generated"),
    ("ttft_p50_s", "TTFT p50", _latency, "time to first token, median"),
    ("ttft_p99_s", "TTFT p99", _latency, "time to first token, 99th percentile"),
    ("tpot_p50_s", "TPOT p50", _latency, "time per output token, median"),
    ("tpot_p99_s", "TPOT p99", _latency, "time per output token, 99th percentile"),
    ("in_flight", "In flight", _count, "requests the gateway is proxying now"),
    ("engine_waiting", "Queued in the engine", _count, "requests vLLM has not scheduled yet"),
    ("gateway_held", "Held by the gateway", _count, "requests held across a switch or waiting for a slot"),
    ("kv_cache_pct", "KV cache", _pct, "of the engine's KV-cache blocks in use"),
)


def _uptime(seconds: float | None) -> str:
    if seconds is None:
        return "not ready"
    s = int(seconds)
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    days, rest = divmod(s, 86400)
    text = f"{rest // 3600} h {(rest % 3600) // 60:02d} min"
    return f"{days} d {text}" if days else text


def _errors(e: Mapping[str, Any]) -> str:
    if e.get("window_s") is None:
        return EMPTY
    return (f"4xx {e['client_4xx']:.0f} · 429 {e['too_many_429']:.0f} · 5xx {e['server_5xx']:.0f} · "
            f"client went away {e['client_gone_499']:.0f} (last {e['window_s'] / 60:.0f} min)")


def load_panel(report: Mapping[str, Any]) -> dict[str, Any]:
    """What `_load.html` shows: rows (label, value, sparkline), the error counts, the uptime since
    ready, the window the rates are over, and why a source was not sampled."""
    now = report.get("now") or {}
    series = report.get("series") or {}
    rows: list[dict[str, Any]] = []
    for i, (key, label, fmt, what) in enumerate(ROWS):
        value = now.get(key)
        points = [(float(x), None if y is None else float(y)) for x, y in series.get(key, [])]
        rows.append({
            "key": key, "label": label, "what": what,
            "value": EMPTY if value is None else fmt(float(value)),
            "spark": Markup(sparkline(points, title=f"{label}, last {len(points)} samples",
                                      color=PALETTE[i % len(PALETTE)])),
        })
    window = now.get("window_s")
    problems = [f"{which}: {why}" for which, why in (report.get("problems") or {}).items() if why]
    return {
        "rows": rows,
        "errors": _errors(report.get("errors") or {}),
        "uptime": _uptime(report.get("uptime_s")),
        "window": (f"rates over the last {window:.0f} s" if window
                   else "rates need two samples" if report.get("sampled_at") is not None
                   else "no sample yet"),
        "interval_s": report.get("interval_s"),
        "problems": problems,
        "gateway_attached": report.get("gateway_attached", False),
    }
