"""The controller's metrics as production wires them: `controller.service.build` constructs
one `ControllerMetrics` and hands it to the driver, the host watch and the API; a launch or an
adoption of a recipe publishes its MemAvailable target on the `GET /metrics` text, the end of the
launch clears it, and promtool fires `ApplianceMemAvailableBelowRecipeTarget` on that text.

Only the engine runtime is faked, at its declared seam (`build(cfg, runtimes=...)`); the recipes,
the preflight, the store, the watch and the API are the real ones."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from controller.runtime.base import EngineHandle, Provenance
from controller.service import Service, ServiceConfig, build
from controller.supervisor.driver import DriverConfig
from controller.supervisor.machine import State
from controller.supervisor.signals import Apply
from controller.watch.procreader import ProcReader
from controller.watch.recipe_target import GIB
from controller.watch.sampler import HostSampler
from tests.unit.model_helpers import seed_model
from tests.unit.promtool_helpers import AVAILABLE, PROMTOOL, TARGET, assert_mem_target_alert_fires
from tests.unit.supervisor_helpers import FakeClock, FakeEngine, FakeRuntime, make_spec

REPO = Path(__file__).resolve().parents[2]
TP4_HOST = REPO / "tests" / "fixtures" / "procfs" / "tp4_graph_host" / "proc"  # MemAvailable 2.35 GiB
RECIPE = "cpu-smollm2"
TARGET_GIB = 3.0  # above the fixture host's 2.35 GiB MemAvailable: the alert must fire


def _recipes(tmp_path: Path) -> Path:
    """The shipped recipes, with cpu-smollm2's floor raised above the fixture host's MemAvailable."""
    out = tmp_path / "recipes"
    shutil.copytree(REPO / "recipes", out)
    path = out / f"{RECIPE}.yaml"
    text = path.read_text()
    assert "min_mem_available_gib: 0.5" in text
    path.write_text(text.replace("min_mem_available_gib: 0.5", f"min_mem_available_gib: {TARGET_GIB}"))
    return out


def _service(tmp_path: Path) -> tuple[Service, FakeRuntime]:
    runtime = FakeRuntime(FakeClock())
    seed_model(tmp_path / "home")
    cfg = ServiceConfig(home=tmp_path / "home", recipes_dir=_recipes(tmp_path), docker=False,
                        watch_host=False, watch_kmsg=False,
                        driver=DriverConfig(oom_settle_s=0, watch_exits=False))
    return build(cfg, runtimes={"process": runtime}), runtime


async def _metrics_text(svc: Service) -> str:
    transport = httpx.ASGITransport(app=svc.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        res = await client.get("/metrics")
    assert res.status_code == 200
    return res.text


def _series(text: str, name: str) -> dict[str, float]:
    for family in text_string_to_metric_families(text):
        if family.name == name:
            return {s.labels.get("recipe", ""): s.value for s in family.samples}
    return {}


async def _until(svc: Service, done: Callable[[], bool], steps: int = 20) -> None:
    for _ in range(steps):
        if done():
            return
        await svc.driver.step()
        await svc.driver.settle()
    assert done(), f"state {svc.driver.machine.state}"


async def test_an_adopted_engine_publishes_its_recipes_target_on_metrics(tmp_path: Path) -> None:
    svc, runtime = _service(tmp_path)
    assert _series(await _metrics_text(svc), TARGET) == {}  # no engine, no floor
    spec = make_spec(recipe=RECIPE)
    handle = EngineHandle(launch_id="Lrunning", runtime="process", ref="777", recipe=RECIPE,
                          spec_hash=spec.spec_hash, started_at=1.0)
    runtime.engines["Lrunning"] = FakeEngine(handle, log="INFO Application startup complete.\n", healthy=True)
    svc.store.create_launch("Lrunning", spec, "normal", Provenance(), 1.0)
    svc.store.set_handle("Lrunning", handle, 1.0)
    await svc.driver.adopt()
    assert svc.driver.machine.launch is not None and svc.driver.machine.launch.launch_id == "Lrunning"
    assert _series(await _metrics_text(svc), TARGET) == {RECIPE: TARGET_GIB * GIB}
    # The engine dies: the launch ended, and so did its floor (the alert cannot fire for nothing).
    runtime.engines["Lrunning"].die(signal=9)
    await _until(svc, lambda: svc.driver.machine.launch is None)
    assert _series(await _metrics_text(svc), TARGET) == {}
    svc.store.close()


async def _launched_under_target(tmp_path: Path) -> str:
    """Launch through the real preflight; the service's own host watch samples a host whose
    MemAvailable is under the target (the TP=4 fixture host). → the `GET /metrics` text."""
    svc, runtime = _service(tmp_path)
    svc.driver.submit(Apply(RECIPE))
    await svc.driver.settle()
    assert svc.driver.machine.state is State.STARTING, svc.driver.status()["last_diagnosis"]
    assert len(runtime.started) == 1
    svc.watch.on_sample(HostSampler(ProcReader(TP4_HOST)).sample([1000]), None)
    text = await _metrics_text(svc)
    svc.store.close()
    return text


async def test_a_launch_publishes_its_recipes_target_on_metrics(tmp_path: Path) -> None:
    text = await _launched_under_target(tmp_path)
    assert _series(text, TARGET) == {RECIPE: TARGET_GIB * GIB}
    assert _series(text, AVAILABLE)[""] < TARGET_GIB * GIB


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (scripts/setup-system.sh)")
async def test_promtool_fires_the_alert_on_the_services_metrics(tmp_path: Path) -> None:
    assert_mem_target_alert_fires(tmp_path, await _launched_under_target(tmp_path), RECIPE)


