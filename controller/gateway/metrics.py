"""The gateway's Prometheus metrics: names here are what the Grafana dashboards query.

All names start with ``appliance_gateway_`` and live in the gateway's own registry (not the global
one), so a test or a second gateway in one process gets clean counters. Keys appear only as their
public id (``key_id`` label), never the key; unauthenticated requests carry ``key_id="none"``.

Metric (type; labels): meaning

- appliance_gateway_requests_total (counter; route, status, key_id, model): finished requests;
  status 499 means the client went away first
- appliance_gateway_request_duration_seconds (histogram; route, model): request arrival → last
  byte sent
- appliance_gateway_ttft_seconds (histogram; route, model): streaming only, request arrival → first
  body byte from upstream
- appliance_gateway_inter_token_seconds (histogram; route, model): streaming only, gap between body
  chunks as they arrive (TCP may merge events, so this can exceed the engine's per-token gap)

``model`` is the served name of the engine that took the request (``engines.Engine.label``: only the
configured engines' names, whatever the client wrote, an alias included), or ``unknown`` for a
request no engine took (a 404 for an unknown name, a 401, a 400 before routing): bounded.
- appliance_gateway_in_flight_requests (gauge): proxied requests running now
- appliance_gateway_in_flight_streams (gauge): of those, streaming (text/event-stream) responses
- appliance_gateway_queue_waiting (gauge): requests waiting for an upstream slot
- appliance_gateway_upstream_errors_total (counter; kind): connect, connect_timeout, disconnect,
  read_timeout, broken_stream, refused_request (a header the gateway adds cannot be written: nothing
  was sent)
- appliance_gateway_upstream_retries_total (counter; idempotent): requests sent again on a fresh
  connection after a pooled one closed before answering; idempotent="no" only when
  ``retry_stale_non_idempotent`` is on
- appliance_gateway_upstream_ready (gauge): 1 when every engine's upstream slot is set
- appliance_gateway_model_ready (gauge; model): per engine, 1 when its upstream slot is set
- appliance_gateway_upstream_switches_total (counter): upstream changes through the admin surface
- appliance_gateway_drain_aborted_total (counter): requests cut off at a drain deadline
- appliance_gateway_keys_loaded (gauge): keys in the gateway's cache (revoked ones included)
- appliance_gateway_key_info (gauge; key_id, name): 1 per key in that cache, its name (``key_info``)
- appliance_gateway_gc_pause_seconds (histogram; generation): the process's garbage collection
  pauses (``gc_pauses``; observed in the gateway's own process only)
- appliance_gateway_gc_frozen_objects (gauge): start-up objects kept out of collection (``gc_pauses``)
- usage per key, token quotas and the usage store: ``usage.metrics``

The hold's series (``hold.bind_metrics`` wires them to the hold: requests held while the controller
switches engines):

- appliance_gateway_hold_active (gauge): 1 while a hold is on
- appliance_gateway_hold_waiting (gauge): requests held now
- appliance_gateway_hold_requests_total (counter; outcome): released, timed_out, dropped (the client
  went away), full (refused at once), failed (the switch failed: 503 with its reason)
- appliance_gateway_hold_wait_seconds (histogram): how long held requests waited, whatever the outcome
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable
from itertools import accumulate

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from controller.gateway.gc_pauses import PauseMeter
from controller.gateway.key_info import KeyInfo
from controller.gateway.upstream_client import IDEMPOTENT_METHODS
from controller.gateway.usage.metrics import UsageMetrics

PREFIX = "appliance_gateway_"

# Buckets from sub-millisecond (a synthetic upstream's first byte) to minutes (a long prefill on
# the reference host: TTFT at 8K input tokens is seconds, recipe C's queue can add more).
TTFT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
# Decode on the reference host is 47–134 ms per token (DOMAIN §2); the CPU engine is faster.
ITL_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1, 2.5, 10)
E2E_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)

# What became of a held request (``hold.Outcome``), and how long holds last: from a blink (released as
# it arrived) to the longest sensible hold (a cold start's few minutes).
HOLD_OUTCOMES = ("released", "timed_out", "dropped", "full", "failed")
HOLD_BUCKETS = (0.1, 0.5, 1, 2.5, 5, 10, 20, 30, 45, 60, 90, 120, 180, 300, 600)

UPSTREAM_ERROR_KINDS = (
    "connect", "connect_timeout", "disconnect", "read_timeout", "broken_stream", "refused_request"
)


_ROUTE_MODEL = ("route", "model")


class RouteSeries:
    """One label set of a ``LoopHistogram``: bucket counts (non-cumulative) and the sum."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.total = 0.0

    def observe(self, value: float) -> None:
        # bisect_left: the first bucket whose upper bound is >= value, i.e. Prometheus' "le".
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value


class LoopHistogram(Collector):
    """A histogram with labels (the gateway's: ``route`` and ``model``), observed without locks.

    ``prometheus_client.Histogram.observe`` takes two locks and walks the buckets in Python
    (~3 µs); the inter-token histogram is observed once per streamed chunk, so that is a few
    percent of the gateway's CPU. The gateway observes and renders on its one event-loop thread,
    so plain integer updates are enough. Exposed exactly like a client_python histogram
    (``_bucket{le=…}``, ``_sum``, ``_count``), minus the ``_created`` series."""

    def __init__(self, name: str, documentation: str, buckets: tuple[float, ...],
                 labelnames: tuple[str, ...] = ("route",)) -> None:
        self.name = name
        self.documentation = documentation
        self.bounds = tuple(float(b) for b in buckets)
        self.labelnames = list(labelnames)
        self._series: dict[tuple[str, ...], RouteSeries] = {}

    def labels(self, *values: str) -> RouteSeries:
        series = self._series.get(values)
        if series is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name} takes labels {self.labelnames}")
            series = self._series[values] = RouteSeries(self.bounds)
        return series

    def collect(self) -> Iterable[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        les = [repr(b) for b in self.bounds] + ["+Inf"]  # what client_python prints for these bounds
        for labels, series in list(self._series.items()):
            cumulative = list(accumulate(series.counts))
            family.add_metric(list(labels), list(zip(les, cumulative, strict=True)), series.total)
        yield family

    def describe(self) -> Iterable[Metric]:
        yield HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            PREFIX + "requests",
            "Finished requests by route, HTTP status, key id and model.",
            ["route", "status", "key_id", "model"],
            registry=r,
        )
        self.duration = LoopHistogram(
            PREFIX + "request_duration_seconds",
            "End-to-end time from request arrival to the last byte sent.",
            E2E_BUCKETS,
            _ROUTE_MODEL,
        )
        self.ttft = LoopHistogram(
            PREFIX + "ttft_seconds",
            "Streaming responses: request arrival to the first body byte from upstream.",
            TTFT_BUCKETS,
            _ROUTE_MODEL,
        )
        self.inter_token = LoopHistogram(
            PREFIX + "inter_token_seconds",
            "Streaming responses: gap between body chunks as they arrive.",
            ITL_BUCKETS,
            _ROUTE_MODEL,
        )
        for h in (self.duration, self.ttft, self.inter_token):
            r.register(h)
        self.in_flight = Gauge(PREFIX + "in_flight_requests", "Proxied requests running now.", registry=r)
        self.in_flight_streams = Gauge(
            PREFIX + "in_flight_streams", "Streaming (text/event-stream) responses running now.", registry=r
        )
        self.queue_waiting = Gauge(
            PREFIX + "queue_waiting", "Requests waiting for an upstream slot.", registry=r
        )
        self.upstream_errors = Counter(
            PREFIX + "upstream_errors", "Upstream failures by kind.", ["kind"], registry=r
        )
        self.upstream_retries = Counter(
            PREFIX + "upstream_retries",
            "Requests sent again after a pooled upstream connection closed before answering.",
            ["idempotent"],
            registry=r,
        )
        self._retry_children: dict[bool, Counter] = {
            True: self.upstream_retries.labels("yes"), False: self.upstream_retries.labels("no")
        }
        self.upstream_ready = Gauge(
            PREFIX + "upstream_ready", "1 when every engine's upstream slot is set.", registry=r)
        self.model_ready = Gauge(
            PREFIX + "model_ready", "Per engine (by served model): 1 when its upstream slot is set.",
            ["model"], registry=r)
        self.switches = Counter(
            PREFIX + "upstream_switches", "Upstream changes through the admin surface.", registry=r
        )
        self.drain_aborted = Counter(
            PREFIX + "drain_aborted", "Requests cut off at a drain deadline.", registry=r
        )
        self.keys_loaded = Gauge(PREFIX + "keys_loaded", "Keys in the gateway's cache.", registry=r)
        self.key_info = KeyInfo()  # key names for the dashboards' key_id legends (key_info.py)
        r.register(self.key_info)
        self.gc_pauses = PauseMeter(r, PREFIX)
        self.usage = UsageMetrics(r)
        self.hold_active = Gauge(
            PREFIX + "hold_active", "1 while a hold is on (the controller is switching engines).", registry=r
        )
        self.hold_waiting = Gauge(
            PREFIX + "hold_waiting", "Requests held while the engine is being switched.", registry=r
        )
        self.hold_requests = Counter(
            PREFIX + "hold_requests",
            "Held requests by outcome: released, timed_out, dropped, full (refused at once), failed "
            "(the switch failed).",
            ["outcome"],
            registry=r,
        )
        for outcome in HOLD_OUTCOMES:
            self.hold_requests.labels(outcome)  # zeros from the first scrape, so that rate() works
        self.hold_wait = Histogram(
            PREFIX + "hold_wait_seconds", "How long held requests waited, whatever the outcome.",
            buckets=HOLD_BUCKETS, registry=r,
        )
        for kind in UPSTREAM_ERROR_KINDS:
            self.upstream_errors.labels(kind)  # export zeros so rate() works from the first scrape
        # .labels() costs a few microseconds; the hot path looks children up in these dicts.
        self._req_children: dict[tuple[str, str, str, str], Counter] = {}
        self._route_children: dict[tuple[str, str], tuple[RouteSeries, RouteSeries, RouteSeries]] = {}

    def count_upstream_retry(self, method: bytes) -> None:
        self._retry_children[method in IDEMPOTENT_METHODS].inc()

    def count_request(self, route: str, status: int, key_id: str, model: str = "unknown") -> None:
        k = (route, str(status), key_id, model)
        child = self._req_children.get(k)
        if child is None:
            child = self._req_children[k] = self.requests.labels(*k)
        child.inc()

    def route_histograms(
        self, route: str, model: str = "unknown"
    ) -> tuple[RouteSeries, RouteSeries, RouteSeries]:
        """(duration, ttft, inter_token) series for ``route`` and ``model`` (a bounded label: see
        the module doc)."""
        hs = self._route_children.get((route, model))
        if hs is None:
            hs = self._route_children[(route, model)] = (
                self.duration.labels(route, model),
                self.ttft.labels(route, model),
                self.inter_token.labels(route, model),
            )
        return hs

    def render(self) -> bytes:
        return generate_latest(self.registry)
