"""How busy the appliance is: load figures from a ring of gateway and engine scrapes (`load_scrape`).

`LoadRing` keeps the last ~15 minutes of samples (one gateway and one engine scrape each, either
may be missing); `LoadRing.report` answers `GET /load`: the figures of the last minute, the error
counts of the last five, and one point per sample for the sparklines (each the figures of the minute
before that sample). Rates are counter increases over the window's span; TTFT and TPOT quantiles
come from the engine's histogram increases over the same span; gauges are the newest sample's.

Figures and where they come from (gateway: `controller/gateway/metrics.py`; engine: vLLM's `vllm:*`):

- requests_per_s: the gateway's finished requests (the engine's successful ones when no gateway)
- output_tokens_per_s: `vllm:generation_tokens_total`
- ttft_p50_s / ttft_p99_s: `vllm:time_to_first_token_seconds`
- tpot_p50_s / tpot_p99_s: `vllm:request_time_per_output_token_seconds` (older vLLM:
  `vllm:time_per_output_token_seconds`)
- in_flight: the gateway's proxied requests running now; engine_running: `vllm:num_requests_running`
- engine_waiting: `vllm:num_requests_waiting`; gateway_held: requests the gateway holds (a switch)
  plus those waiting for an upstream slot
- kv_cache_pct: `vllm:kv_cache_usage_perc` (older vLLM: `vllm:gpu_cache_usage_perc`) × 100
- errors: requests answered 4xx (not 429, not 499), 429, 5xx, and 499 (the client went away)

A figure is None when its source did not answer or does not export it — never a made-up 0. A
window compares only scrapes of one source (the engine's launch id): after a switch the new engine's
counters start a new window instead of being read as a reset of the old one's.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from appliance.observe.load_scrape import (
    Hist,
    Scrape,
    gauge_mean,
    gauge_sum,
    histogram_increase,
    histogram_quantile,
    increase,
)

GW_REQUESTS = "appliance_gateway_requests_total"
GW_IN_FLIGHT = "appliance_gateway_in_flight_requests"
GW_QUEUE = "appliance_gateway_queue_waiting"
GW_HOLD = "appliance_gateway_hold_waiting"
GATEWAY_WANTED = (GW_REQUESTS, GW_IN_FLIGHT, GW_QUEUE, GW_HOLD)

E_TOKENS = "vllm:generation_tokens_total"
E_SUCCESS = "vllm:request_success_total"
E_TTFT = "vllm:time_to_first_token_seconds"
E_TPOT = ("vllm:request_time_per_output_token_seconds", "vllm:time_per_output_token_seconds")
E_RUNNING = "vllm:num_requests_running"
E_WAITING = "vllm:num_requests_waiting"
E_KV = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
ENGINE_WANTED = (E_TOKENS, E_SUCCESS, E_TTFT, *E_TPOT, E_RUNNING, E_WAITING, *E_KV)

WINDOW_S = 60.0  # "now": the figures of the last minute
ERRORS_WINDOW_S = 300.0  # "the last minutes": error counts over five
KEEP_S = 900.0  # the ring: the last fifteen minutes

FIGURES = ("requests_per_s", "output_tokens_per_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s",
           "in_flight", "engine_running", "engine_waiting", "gateway_held", "kv_cache_pct")


@dataclass(frozen=True)
class Sample:
    at: float
    gateway: Scrape | None
    engine: Scrape | None


@dataclass(frozen=True)
class Figures:
    requests: float | None = None  # finished requests in the window
    requests_per_s: float | None = None
    output_tokens_per_s: float | None = None
    ttft_p50_s: float | None = None
    ttft_p99_s: float | None = None
    tpot_p50_s: float | None = None
    tpot_p99_s: float | None = None
    in_flight: float | None = None
    engine_running: float | None = None
    engine_waiting: float | None = None
    gateway_held: float | None = None
    kv_cache_pct: float | None = None
    window_s: float | None = None  # the span the rates are over (shorter than asked just after a start)


@dataclass(frozen=True)
class Errors:
    window_s: float | None = None
    client_4xx: float | None = None  # 4xx but 429 and 499
    too_many_429: float | None = None
    server_5xx: float | None = None
    client_gone_499: float | None = None


def _base(samples: Sequence[Sample], end: int, pick: Callable[[Sample], Scrape | None],
          window_s: float) -> Scrape | None:
    """The oldest scrape of the same source as sample `end`'s within `window_s` before it."""
    last = pick(samples[end])
    if last is None:
        return None
    for s in samples[:end]:
        scrape = pick(s)
        if scrape is not None and scrape.source == last.source and scrape.at >= last.at - window_s:
            return scrape
    return None


def _first(scrape: Scrape | None, names: Sequence[str]) -> str | None:
    """The first of `names` the scrape exports (a figure's current name, then its older ones)."""
    if scrape is None:
        return None
    return next((n for n in names if n in scrape.values or n in scrape.histograms), None)


def _grew(old: Scrape | None, new: Scrape | None, name: str) -> float | None:
    if old is None or new is None or name not in new.values:
        return None
    return increase(old.values.get(name, {}), new.values[name])


def _hist(old: Scrape | None, new: Scrape | None, names: Sequence[str]) -> Hist | None:
    name = _first(new, names)
    if old is None or new is None or name is None or name not in new.histograms:
        return None
    return histogram_increase(old.histograms.get(name, {}), new.histograms[name])


def _per_s(amount: float | None, span: float) -> float | None:
    return None if amount is None or span <= 0 else amount / span


def _gauge(scrape: Scrape | None, name: str) -> float | None:
    return gauge_sum(scrape.values.get(name)) if scrape is not None else None


def figures_at(samples: Sequence[Sample], end: int, window_s: float = WINDOW_S) -> Figures:
    """The figures of the `window_s` before sample `end`."""
    last = samples[end]
    gw, en = last.gateway, last.engine
    gw0 = _base(samples, end, lambda s: s.gateway, window_s)
    en0 = _base(samples, end, lambda s: s.engine, window_s)
    gw_span = gw.at - gw0.at if gw is not None and gw0 is not None else 0.0
    en_span = en.at - en0.at if en is not None and en0 is not None else 0.0
    requests, span = _grew(gw0, gw, GW_REQUESTS), gw_span
    if requests is None:  # no gateway in front: the engine's own count
        requests, span = _grew(en0, en, E_SUCCESS), en_span
    ttft = _hist(en0, en, (E_TTFT,))
    tpot = _hist(en0, en, E_TPOT)
    kv_name = _first(en, E_KV)
    kv = gauge_mean(en.values.get(kv_name)) if en is not None and kv_name is not None else None
    held = [v for v in (_gauge(gw, GW_HOLD), _gauge(gw, GW_QUEUE)) if v is not None]
    return Figures(
        requests=requests if span > 0 else None,
        requests_per_s=_per_s(requests, span),
        output_tokens_per_s=_per_s(_grew(en0, en, E_TOKENS), en_span),
        ttft_p50_s=histogram_quantile(0.5, ttft), ttft_p99_s=histogram_quantile(0.99, ttft),
        tpot_p50_s=histogram_quantile(0.5, tpot), tpot_p99_s=histogram_quantile(0.99, tpot),
        in_flight=_gauge(gw, GW_IN_FLIGHT),
        engine_running=_gauge(en, E_RUNNING),
        engine_waiting=_gauge(en, E_WAITING),
        gateway_held=sum(held) if held else None,
        kv_cache_pct=kv * 100 if kv is not None else None,
        window_s=max(gw_span, en_span) or None,
    )


def _status_class(status: str) -> str | None:
    if status == "429":
        return "too_many_429"
    if status == "499":
        return "client_gone_499"
    if status.startswith("4"):
        return "client_4xx"
    if status.startswith("5"):
        return "server_5xx"
    return None


def errors_at(samples: Sequence[Sample], end: int, window_s: float = ERRORS_WINDOW_S) -> Errors:
    """The gateway's error answers in the `window_s` before sample `end`, by class."""
    gw = samples[end].gateway
    gw0 = _base(samples, end, lambda s: s.gateway, window_s)
    if gw is None or gw0 is None or GW_REQUESTS not in gw.values:
        return Errors()
    old = gw0.values.get(GW_REQUESTS, {})
    counts = {"client_4xx": 0.0, "too_many_429": 0.0, "server_5xx": 0.0, "client_gone_499": 0.0}
    by_class: dict[str, dict[Any, float]] = {}
    for k, v in gw.values[GW_REQUESTS].items():
        cls = _status_class(dict(k).get("status", ""))
        if cls is not None:
            by_class.setdefault(cls, {})[k] = v
    for cls, series in by_class.items():
        counts[cls] = increase({k: old.get(k, 0.0) for k in series}, series) or 0.0
    return Errors(window_s=gw.at - gw0.at, **counts)


@dataclass
class LoadRing:
    """The last `keep_s` of samples and, per sample, the figures of the minute before it."""

    keep_s: float = KEEP_S
    samples: deque[Sample] = field(default_factory=deque)
    points: deque[Figures] = field(default_factory=deque)

    def add(self, sample: Sample) -> None:
        self.samples.append(sample)
        while self.samples and self.samples[0].at < sample.at - self.keep_s:
            self.samples.popleft()
        # The point is computed once, as the sample arrives (a report then costs no recomputation).
        self.points.append(figures_at(list(self.samples), len(self.samples) - 1))
        while len(self.points) > len(self.samples):
            self.points.popleft()

    def report(self) -> dict[str, Any]:
        """`GET /load`'s figures: now, errors, and a series per figure for the sparklines."""
        if not self.samples:
            return {"sampled_at": None, "now": asdict(Figures()), "errors": asdict(Errors()), "series": {},
                    "sources": {}}
        samples = list(self.samples)
        last = samples[-1]
        series: dict[str, list[tuple[float, float | None]]] = {
            name: [(s.at, getattr(p, name)) for s, p in zip(samples, self.points, strict=True)]
            for name in FIGURES
        }
        return {
            "sampled_at": last.at,
            "now": asdict(self.points[-1]),
            "errors": asdict(errors_at(samples, len(samples) - 1)),
            "series": series,
            "sources": {"gateway": last.gateway.source if last.gateway else None,
                        "engine": last.engine.source if last.engine else None},
        }


def counts(report: Mapping[str, Any]) -> str:
    """One line of error counts for a report (`appliance status`)."""
    e = report.get("errors") or {}
    if e.get("window_s") is None:
        return "—"
    return (f"4xx {e['client_4xx']:.0f} · 429 {e['too_many_429']:.0f} · 5xx {e['server_5xx']:.0f} · "
            f"client gone {e['client_gone_499']:.0f} in the last {e['window_s'] / 60:.0f} min")
