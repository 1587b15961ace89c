"""`GET /metrics` of every engine of the host: the primary's registry, with the per-engine families of
each engine beside it merged in.

Each engine beside the primary records into a `ControllerMetrics` of its own (engine_set.py): one
shared registry would let its launch clear the primary's per-launch series (`begin_launch` clears
whole families). The exposition puts them back together: for every family in
`controller.metrics.PER_ENGINE_FAMILIES`, the primary's samples exactly as its registry has them (the
dashboards and alerts read them so), then each engine's beside it with a `model` label, its served
model name. One family per name, so one HELP and one TYPE: the text format refuses a family twice.
The host-wide families come from the primary's registry alone (the engines beside it hold them at
their zero values, which would duplicate the host's). An engine that left the set is gone from the
next scrape.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from controller.metrics import PER_ENGINE_FAMILIES, ControllerMetrics
from controller.supervisor.engine_set import EngineSet

MODEL_LABEL = "model"  # as on the engine's own scrape target (scrape_targets.py) and the gateway's series

Beside = Callable[[], Iterable[tuple[str, ControllerMetrics]]]  # (served model name, its registry) now


class EngineSetMetrics(Collector):
    """The primary's families, each per-engine one with the engines beside it merged in, in a registry
    of their own (collected at each scrape: engines join and leave the set)."""

    def __init__(self, primary: ControllerMetrics, beside: Beside) -> None:
        self._primary = primary
        self._beside = beside
        self.registry = CollectorRegistry(auto_describe=False)  # no describe(): nothing read at register
        self.registry.register(self)

    def collect(self) -> Iterator[Metric]:
        extra: dict[str, list[Sample]] = {}
        described: dict[str, Metric] = {}  # a family the primary's registry would lack keeps its HELP
        for model, metrics in self._beside():
            for family in metrics.registry.collect():
                if family.name not in PER_ENGINE_FAMILIES:
                    continue
                described.setdefault(family.name, family)
                extra.setdefault(family.name, []).extend(
                    s._replace(labels={**s.labels, MODEL_LABEL: model}) for s in family.samples)
        for family in self._primary.registry.collect():
            yield _merged(family, extra.pop(family.name, []))
        for name, samples in extra.items():
            yield _merged(described[name], samples)

    def render(self) -> tuple[bytes, str]:
        """The exposition body and its content type, for `GET /metrics`."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def _merged(family: Metric, more: list[Sample]) -> Metric:
    if not more:
        return family
    merged = Metric(family.name, family.documentation, family.type, family.unit)
    merged.samples = [*family.samples, *more]
    return merged


def engine_set_metrics(engines: EngineSet) -> EngineSetMetrics:
    """The exposition of `engines`: the primary's registry and, keyed by its served model name, the
    registry of each engine beside it now."""
    return EngineSetMetrics(engines.primary.metrics,
                            lambda: [(name, d.metrics) for name, d in list(engines.alongside.items())])
