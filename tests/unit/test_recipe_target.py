"""The `MemAvailableBelowRecipeTarget` alert could never fire — nothing in production set
`appliance_launch_memory_available_target_bytes`. Launching (or adopting) now publishes the running
recipe's `expect.min_mem_available_gib` through the driver's injected `ControllerMetrics`,
clears it when the launch ends, and promtool fires the alert on what the controller exports.
The production wiring itself (controller/service.py `build`) is tested in test_service_metrics.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from controller.metrics import ControllerMetrics
from controller.runtime.base import EngineHandle, Provenance
from controller.service import engine_view
from controller.store import Store
from controller.supervisor.driver import Driver, DriverConfig
from controller.supervisor.host_memory_watch import HostWatchLink
from controller.supervisor.preflight import Preflight
from controller.supervisor.signals import Apply
from controller.watch.procreader import ProcReader
from controller.watch.recipe_target import GIB, recipe_mem_target
from controller.watch.sampler import HostSampler
from tests.unit.promtool_helpers import PROMTOOL, TARGET, assert_mem_target_alert_fires
from tests.unit.supervisor_helpers import (
    FakeClock,
    FakeEngine,
    FakePreflight,
    FakeProber,
    FakeRuntime,
    RecordingGateway,
    make_spec,
)

REPO = Path(__file__).resolve().parents[2]
TP4_HOST = REPO / "tests" / "fixtures" / "procfs" / "tp4_graph_host" / "proc"


def _targets(metrics: ControllerMetrics) -> dict[str, float]:
    for family in text_string_to_metric_families(metrics.render()[0].decode()):
        if family.name == TARGET:
            return {s.labels["recipe"]: s.value for s in family.samples}
    return {}


def _driver(tmp_path: Path, target_bytes: int | None) -> tuple[Driver, FakeRuntime, Store, HostWatchLink]:
    clock = FakeClock()
    runtime = FakeRuntime(clock)
    store = Store(tmp_path / "a.sqlite3")
    metrics = ControllerMetrics()
    metrics.set_mem_available_target("stale-recipe", 1)  # whatever was there before this launch
    link = HostWatchLink(store, HostSampler(ProcReader(TP4_HOST)), metrics=metrics)
    driver = Driver(runtimes={"process": runtime}, store=store, preflight=FakePreflight(make_spec()),
                    prober=FakeProber(runtime), gateway=RecordingGateway(), clock=clock,
                    config=DriverConfig(oom_settle_s=0, watch_exits=False), oom_events=link.oom_events,
                    metrics=metrics, mem_target=lambda name: target_bytes)
    link.engine = engine_view(driver)
    return driver, runtime, store, link


def test_the_target_is_the_recipes_expectation() -> None:
    target = recipe_mem_target(Preflight(recipes_dir=REPO / "recipes", appliance_home=REPO).recipe)
    assert target("cpu-smollm2") == int(0.5 * GIB)  # recipes/cpu-smollm2.yaml: min_mem_available_gib 0.5
    assert target("no-such-recipe") is None


async def test_launching_sets_the_target_gauge(tmp_path: Path) -> None:
    driver, _, _, _ = _driver(tmp_path, int(2.35 * GIB))
    driver.submit(Apply("test-recipe"))
    await driver.step()
    await driver.settle()
    assert _targets(driver.metrics) == {"test-recipe": float(int(2.35 * GIB))}


async def test_the_target_is_cleared_when_the_launch_ends(tmp_path: Path) -> None:
    driver, runtime, _, _ = _driver(tmp_path, int(2.35 * GIB))
    driver.submit(Apply("test-recipe"))
    await driver.step()
    await driver.settle()
    assert _targets(driver.metrics) == {"test-recipe": float(int(2.35 * GIB))}
    runtime.current().die(signal=9)  # no engine, no floor to compare MemAvailable with
    await driver.step()
    await driver.settle()
    assert driver.machine.launch is None
    assert _targets(driver.metrics) == {}


async def test_a_recipe_without_a_target_clears_the_gauge(tmp_path: Path) -> None:
    driver, _, _, _ = _driver(tmp_path, None)
    driver.submit(Apply("test-recipe"))
    await driver.step()
    await driver.settle()
    assert _targets(driver.metrics) == {}


async def test_adopting_sets_the_target_gauge(tmp_path: Path) -> None:
    driver, runtime, store, _ = _driver(tmp_path, 3 * GIB)
    spec = make_spec()
    handle = EngineHandle(launch_id="Lrunning", runtime="process", ref="777", recipe="test-recipe",
                          spec_hash=spec.spec_hash, started_at=1.0)
    runtime.engines["Lrunning"] = FakeEngine(handle, log="INFO Application startup complete.\n", healthy=True)
    store.create_launch("Lrunning", spec, "normal", Provenance(), 1.0)
    store.set_handle("Lrunning", handle, 1.0)
    await driver.adopt()
    assert _targets(driver.metrics) == {"test-recipe": float(3 * GIB)}


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (scripts/setup-system.sh)")
async def test_promtool_fires_on_what_the_controller_exports(tmp_path: Path) -> None:
    """End to end: launch → the watch samples a host whose MemAvailable (2.35 GiB, the TP=4 fixture)
    is under the recipe's 3 GiB → the two series the controller exports make the alert fire."""
    driver, _, _, link = _driver(tmp_path, 3 * GIB)
    driver.submit(Apply("test-recipe"))
    await driver.step()
    await driver.settle()
    link.on_sample(link.sampler.sample([1000]), None)
    assert_mem_target_alert_fires(tmp_path, driver.metrics.render()[0].decode(), "test-recipe")
