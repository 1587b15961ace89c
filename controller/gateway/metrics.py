"""The gateway's Prometheus metrics: names here are what the Grafana dashboards query.

All names start with ``appliance_gateway_`` and live in the gateway's own registry (not the global
one), so a test or a second gateway in one process gets clean counters. Keys appear only as their
public id (``key_id`` label), never the key; unauthenticated requests carry ``key_id="none"``.

Metric (type; labels): meaning

- appliance_gateway_requests_total (counter; route, status, key_id): finished requests;
  status 499 means the client went away first
- appliance_gateway_request_duration_seconds (histogram; route): request arrival → last byte sent
- appliance_gateway_ttft_seconds (histogram; route): streaming only, request arrival → first body
  byte from upstream
- appliance_gateway_inter_token_seconds (histogram; route): streaming only, gap between body
  chunks as they arrive (TCP may merge events, so this can exceed the engine's per-token gap)
- appliance_gateway_in_flight_requests (gauge): proxied requests running now
- appliance_gateway_in_flight_streams (gauge): of those, streaming (text/event-stream) responses
- appliance_gateway_queue_waiting (gauge): requests waiting for an upstream slot
- appliance_gateway_upstream_errors_total (counter; kind): connect, connect_timeout, disconnect,
  read_timeout, broken_stream
- appliance_gateway_upstream_ready (gauge): 1 when an upstream slot is set
- appliance_gateway_upstream_switches_total (counter): upstream changes through the admin surface
- appliance_gateway_drain_aborted_total (counter): requests cut off at a drain deadline
- appliance_gateway_keys_loaded (gauge): keys in the gateway's cache (revoked ones included)
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

PREFIX = "appliance_gateway_"

# Buckets from sub-millisecond (a synthetic upstream's first byte) to minutes (a long prefill on
# the reference host: TTFT at 8K input tokens is seconds, recipe C's queue can add more).
TTFT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
# Decode on the reference host is 47–134 ms per token (DOMAIN §2); the CPU engine is faster.
ITL_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1, 2.5, 10)
E2E_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)

UPSTREAM_ERROR_KINDS = ("connect", "connect_timeout", "disconnect", "read_timeout", "broken_stream")


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            PREFIX + "requests",
            "Finished requests by route, HTTP status and key id.",
            ["route", "status", "key_id"],
            registry=r,
        )
        self.duration = Histogram(
            PREFIX + "request_duration_seconds",
            "End-to-end time from request arrival to the last byte sent.",
            ["route"],
            buckets=E2E_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            PREFIX + "ttft_seconds",
            "Streaming responses: request arrival to the first body byte from upstream.",
            ["route"],
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.inter_token = Histogram(
            PREFIX + "inter_token_seconds",
            "Streaming responses: gap between body chunks as they arrive.",
            ["route"],
            buckets=ITL_BUCKETS,
            registry=r,
        )
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
        self.upstream_ready = Gauge(PREFIX + "upstream_ready", "1 when an upstream slot is set.", registry=r)
        self.switches = Counter(
            PREFIX + "upstream_switches", "Upstream changes through the admin surface.", registry=r
        )
        self.drain_aborted = Counter(
            PREFIX + "drain_aborted", "Requests cut off at a drain deadline.", registry=r
        )
        self.keys_loaded = Gauge(PREFIX + "keys_loaded", "Keys in the gateway's cache.", registry=r)
        for kind in UPSTREAM_ERROR_KINDS:
            self.upstream_errors.labels(kind)  # export zeros so rate() works from the first scrape
        # .labels() costs a few microseconds; the hot path looks children up in these dicts.
        self._req_children: dict[tuple[str, str, str], Counter] = {}
        self._route_children: dict[str, tuple[Histogram, Histogram, Histogram]] = {}

    def count_request(self, route: str, status: int, key_id: str) -> None:
        k = (route, str(status), key_id)
        child = self._req_children.get(k)
        if child is None:
            child = self._req_children[k] = self.requests.labels(*k)
        child.inc()

    def route_histograms(self, route: str) -> tuple[Histogram, Histogram, Histogram]:
        """(duration, ttft, inter_token) children for ``route``."""
        hs = self._route_children.get(route)
        if hs is None:
            hs = self._route_children[route] = (
                self.duration.labels(route),
                self.ttft.labels(route),
                self.inter_token.labels(route),
            )
        return hs

    def render(self) -> bytes:
        return generate_latest(self.registry)
