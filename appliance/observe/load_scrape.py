"""One scrape of a Prometheus exposition, and the counter and histogram arithmetic over two of them.

The controller samples the gateway's and the engine's `/metrics` every few seconds
(`controller/watch/load_sampler.py`) to say how busy the appliance is without a Prometheus
(`appliance status`, the console's Now page). The text is parsed by prometheus_client's own parser;
what is kept is only the series a load figure needs (`parse(..., wanted=...)`), by sample name.

The arithmetic follows Prometheus' own, so a figure here and a dashboard's agree:

- `increase`: a counter that went down was reset (the process restarted) and counts from zero again,
  as `rate()` does. A series absent from the older scrape of the same process counts from zero: the
  gateway creates its labelled children lazily (the first 429 creates `status="429"`), and its first
  appearance is one request, not nothing.
- `histogram_quantile`: Prometheus' interpolation inside the bucket the rank falls in, the lowest
  bucket starting at 0, a rank in the +Inf bucket answered with the highest finite bound.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

LabelKey = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Hist:
    """One histogram series: ascending upper bounds (the last +Inf) and cumulative counts."""

    bounds: tuple[float, ...]
    counts: tuple[float, ...]

    @property
    def count(self) -> float:
        return self.counts[-1] if self.counts else 0.0


@dataclass(frozen=True)
class Scrape:
    """What one `/metrics` answered. `source` names the process (the gateway's URL, the engine's
    launch id): counters are compared only between scrapes of one source."""

    source: str
    at: float
    values: Mapping[str, Mapping[LabelKey, float]]  # counters and gauges, by sample name
    histograms: Mapping[str, Mapping[LabelKey, Hist]]  # by family name (no `_bucket`)


def _key(labels: Mapping[str, str]) -> LabelKey:
    return tuple(sorted((k, v) for k, v in labels.items() if k != "le"))


def parse(text: str, source: str, at: float, wanted: Iterable[str]) -> Scrape:
    """The `wanted` series of an exposition: counter samples by their full name (`…_total`), gauges
    by theirs, histograms by family name. Raises ValueError on text the parser refuses."""
    names = frozenset(wanted)
    values: dict[str, dict[LabelKey, float]] = {}
    buckets: dict[str, dict[LabelKey, list[tuple[float, float]]]] = {}
    for family in text_string_to_metric_families(text):
        if family.type == "histogram":
            if family.name not in names:
                continue
            series = buckets.setdefault(family.name, {})
            for s in family.samples:
                if s.name.endswith("_bucket"):
                    series.setdefault(_key(s.labels), []).append((float(s.labels["le"]), s.value))
            continue
        # A declared family with no sample yet (a labelled counter nothing has counted) is zero, not
        # missing: the sample name of a counter is the family's plus `_total`.
        declared = family.name + "_total" if family.type == "counter" else family.name
        if declared in names:
            values.setdefault(declared, {})
        for s in family.samples:
            if s.name in names:
                values.setdefault(s.name, {})[_key(s.labels)] = s.value
    histograms = {
        name: {k: Hist(tuple(b for b, _ in sorted(pairs)), tuple(c for _, c in sorted(pairs)))
               for k, pairs in series.items()}
        for name, series in buckets.items()
    }
    return Scrape(source, at, values, histograms)


def increase(old: Mapping[LabelKey, float] | None, new: Mapping[LabelKey, float] | None) -> float | None:
    """How much a counter (summed over its series) grew from `old` to `new`; None when the newer
    scrape does not have it at all. A series that went down was reset: its new value is the growth."""
    if new is None or old is None:
        return None
    total = 0.0
    for k, v in new.items():
        prev = old.get(k, 0.0)
        total += v - prev if v >= prev else v
    return total


def _hist_delta(old: Hist | None, new: Hist) -> Hist:
    if old is None or old.bounds != new.bounds or new.count < old.count:
        return new  # new since the older scrape, or reset: everything it holds happened since
    return Hist(new.bounds, tuple(n - o for n, o in zip(new.counts, old.counts, strict=True)))


def histogram_increase(old: Mapping[LabelKey, Hist] | None,
                       new: Mapping[LabelKey, Hist] | None) -> Hist | None:
    """The observations between two scrapes, summed over series that share the bounds (the first
    series' bounds decide; a series with other bounds is left out rather than mixed in)."""
    if new is None or old is None or not new:
        return None
    deltas = [_hist_delta(old.get(k), h) for k, h in sorted(new.items())]
    bounds = deltas[0].bounds
    same = [d for d in deltas if d.bounds == bounds]
    return Hist(bounds, tuple(sum(col) for col in zip(*(d.counts for d in same), strict=True)))


def histogram_quantile(q: float, hist: Hist | None) -> float | None:
    """Prometheus' histogram_quantile over one (delta) histogram; None when it holds no observation."""
    if hist is None or not hist.bounds or hist.count <= 0 or not math.isinf(hist.bounds[-1]):
        return None
    rank = q * hist.count
    b = next(i for i, c in enumerate(hist.counts) if c >= rank)
    if b == len(hist.bounds) - 1:
        # In the +Inf bucket: no upper edge to interpolate to, the highest finite bound is the answer.
        return hist.bounds[-2] if len(hist.bounds) > 1 else None
    end = hist.bounds[b]
    if b == 0:
        if end <= 0:
            return end
        start, below = 0.0, 0.0
    else:
        start, below = hist.bounds[b - 1], hist.counts[b - 1]
    inside = hist.counts[b] - below
    if inside <= 0:
        return end
    return start + (end - start) * (rank - below) / inside


def gauge_sum(series: Mapping[LabelKey, float] | None) -> float | None:
    return None if series is None or not series else sum(series.values())


def gauge_mean(series: Mapping[LabelKey, float] | None) -> float | None:
    return None if series is None or not series else sum(series.values()) / len(series)
