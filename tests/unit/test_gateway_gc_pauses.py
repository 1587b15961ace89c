"""The gateway process's collector settings (``controller/gateway/gc_pauses.py``)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from controller.gateway.gc_pauses import PauseMeter, settle_heap


@pytest.fixture
def unfrozen() -> Iterator[None]:
    yield
    gc.unfreeze()  # give the test process its collector back


def test_settle_heap_freezes_what_survives_so_full_collections_skip_it(unfrozen: None) -> None:
    before = len(gc.get_objects())
    frozen = settle_heap()
    assert frozen == gc.get_freeze_count() > 0
    # What was frozen is no longer in any generation the collector walks.
    assert len(gc.get_objects()) < before - frozen // 2
    kept = [object() for _ in range(1000)]  # made after: still collected as usual, never frozen
    # At most what was frozen: a frozen object that loses its last reference is still freed (other
    # tests' threads did that in a full run: 489,919 of 489,972), but nothing new joins the frozen set.
    assert gc.get_freeze_count() <= frozen
    del kept


def test_pause_meter_observes_each_collection_by_generation() -> None:
    registry = CollectorRegistry()
    meter = PauseMeter(registry, "appliance_gateway_")
    meter.install()
    meter.install()  # once only
    try:
        assert gc.callbacks.count(meter) == 1
        gc.collect(2)
        gc.collect(0)
    finally:
        meter.remove()
    assert meter not in gc.callbacks

    def count(gen: str) -> float:
        value = registry.get_sample_value("appliance_gateway_gc_pause_seconds_count", {"generation": gen})
        return value or 0.0

    assert registry.get_sample_value("appliance_gateway_gc_frozen_objects") == gc.get_freeze_count()
    assert count("2") >= 1
    assert count("0") >= 1
    total = registry.get_sample_value("appliance_gateway_gc_pause_seconds_sum", {"generation": "2"})
    assert total is not None and total > 0
