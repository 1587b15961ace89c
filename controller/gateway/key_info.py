"""`appliance_gateway_key_info{key_id, name} 1`: the name of every key the gateway knows.

The per-key series carry only the public `key_id` (never the key); a dashboard joins this info
metric to show the operator's name for it (`* on(key_id) group_left(name) appliance_gateway_key_info`).
Read from the gateway's key cache at each scrape, so a renamed, new or revoked key shows at once;
revoked keys stay listed, because their past traffic still needs a name. Bounded by the key store.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

NAME = "appliance_gateway_key_info"
HELP = "1 for every key the gateway knows (revoked ones included): its public id and its name."


def _family() -> GaugeMetricFamily:
    return GaugeMetricFamily(NAME, HELP, labels=["key_id", "name"])


class KeyInfo(Collector):
    """Collects from `source` (key id → name); none bound yet: no samples."""

    def __init__(self) -> None:
        self.source: Callable[[], Mapping[str, str]] | None = None

    def describe(self) -> Iterator[Metric]:
        yield _family()

    def collect(self) -> Iterator[Metric]:
        family = _family()
        if self.source is not None:
            for key_id, name in sorted(self.source().items()):
                family.add_metric([key_id, name], 1.0)
        yield family
