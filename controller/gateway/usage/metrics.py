"""The gateway's usage and quota metrics, registered in its registry (``GatewayMetrics.usage``).

Metrics (gateway registry; ``key_id`` is a key's public id, at most ``MAX_KEY_LABELS`` of them,
the rest as "other"):

- appliance_gateway_tokens_total (counter; key_id, kind=prompt|completion): tokens the engine
  reported for the key's requests
- appliance_gateway_key_requests_total (counter; key_id, outcome=ok|error): requests that reached
  accounting (authenticated); error = status ≥ 400 or the client left (499)
- appliance_gateway_quota_refused_total (counter; key_id): requests refused for a spent token quota
- appliance_gateway_usage_dropped_total (counter): requests whose usage was lost (pending queue full)
- appliance_gateway_usage_store_errors_total (counter): failed writes of the usage store
- appliance_gateway_usage_pending_rows (gauge): key × hour sums waiting to be written
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

PREFIX = "appliance_gateway_"
MAX_KEY_LABELS = 1000
OTHER = "other"


class UsageMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.tokens = Counter(PREFIX + "tokens", "Tokens the engine reported, by key and kind.",
                              ["key_id", "kind"], registry=r)
        self.key_requests = Counter(PREFIX + "key_requests", "Accounted requests by key and outcome.",
                                    ["key_id", "outcome"], registry=r)
        self.quota_refused = Counter(PREFIX + "quota_refused", "Requests refused for a spent token quota.",
                                     ["key_id"], registry=r)
        self.dropped = Counter(PREFIX + "usage_dropped", "Requests whose usage was lost (queue full).",
                               registry=r)
        self.store_errors = Counter(PREFIX + "usage_store_errors", "Failed writes of the usage store.",
                                    registry=r)
        self.pending = Gauge(PREFIX + "usage_pending_rows", "Key x hour usage sums not yet written.",
                             registry=r)
        # .labels() costs microseconds; the request path looks children up here.
        self._children: dict[str, tuple[Counter, Counter, Counter, Counter, Counter]] = {}

    def children(self, key_id: str) -> tuple[Counter, Counter, Counter, Counter, Counter]:
        """(prompt tokens, completion tokens, ok requests, error requests, quota refusals) of
        ``key_id``."""
        c = self._children.get(key_id)
        if c is None:
            label = key_id if len(self._children) < MAX_KEY_LABELS else OTHER
            c = self._children.get(label)
            if c is None:
                c = (self.tokens.labels(label, "prompt"), self.tokens.labels(label, "completion"),
                     self.key_requests.labels(label, "ok"), self.key_requests.labels(label, "error"),
                     self.quota_refused.labels(label))
                self._children[label] = c
            self._children[key_id] = c
        return c
