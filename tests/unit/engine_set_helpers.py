"""A controller with several engines on one host, faked only at the declared seams (runtime, prober,
clock, gateway links): the real preflight over a recipe directory holding `cpu-smollm2` and recipes
that start beside it, on the reference host's fixture tree. Shared by the engine set's, the API's and
the adoption tests."""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from controller.api.app import create_app
from controller.api_context import ApiContext
from controller.store import Store
from controller.supervisor.driver import Driver, DriverConfig
from controller.supervisor.engine_set import EngineSet
from controller.supervisor.events import EventLog
from controller.supervisor.preflight import Preflight
from controller.supervisor.scrape_targets import ScrapeTargets
from tests.unit.model_helpers import seed_model
from tests.unit.supervisor_helpers import FakeClock, FakeProber, FakeRuntime, RecordingGateway

REPO = Path(__file__).resolve().parents[2]
REFERENCE_HOST = REPO / "tests" / "fixtures" / "hosts" / "reference"
CPUS = 4  # cpu-smollm2's worker (VLLM_CPU_OMP_THREADS_BIND=auto) binds cores 0-2 of 4


def beside_recipe(name: str, served: str, port: int, cores: str | None = "3",
                  worker_gib: float | None = None) -> dict[str, object]:
    """A recipe extending cpu-smollm2 under another served name and port, its worker on `cores`."""
    data: dict[str, object] = {"name": name, "extends": "cpu-smollm2", "description": f"{served} beside",
                               "model": {"served_name": served}, "engine": {"port": port}}
    if cores is not None:
        data["env"] = {"vars": {"VLLM_CPU_OMP_THREADS_BIND": {"value": cores, "why": "disjoint cores"}}}
    if worker_gib is not None:
        data["memory"] = {"worker_anon_gib_graph": worker_gib}
    return data


RECIPES = {
    "cpu-beside": beside_recipe("cpu-beside", "smollm2-b", 8001),
    "cpu-beside-c": beside_recipe("cpu-beside-c", "smollm2-c", 8002, cores="3"),
    "cpu-sameport": beside_recipe("cpu-sameport", "smollm2-p", 8000),
    "cpu-samename": beside_recipe("cpu-samename", "smollm2", 8003),
    "cpu-samecores": beside_recipe("cpu-samecores", "smollm2-k", 8004, cores=None),
    "cpu-bigmem": beside_recipe("cpu-bigmem", "smollm2-m", 8005, worker_gib=400.0),
    "cpu-busyport": beside_recipe("cpu-busyport", "smollm2-u", 8006),
    "cpu-b-twin": beside_recipe("cpu-b-twin", "smollm2-b", 8007),
    "cpu-b-port": beside_recipe("cpu-b-port", "smollm2-q", 8001),
}


def write_recipes(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "recipes" / "cpu-smollm2.yaml", folder / "cpu-smollm2.yaml")
    for name, data in RECIPES.items():
        (folder / f"{name}.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return folder


class SetRig:
    def __init__(self, home: Path, *, busy_ports: frozenset[int] = frozenset({8006}),
                 clock: FakeClock | None = None, runtime: FakeRuntime | None = None) -> None:
        self.home = home
        self.clock = clock or FakeClock()
        self.runtime = runtime or FakeRuntime(self.clock)
        self.store = Store(home / "appliance.sqlite3")
        seed_model(home)
        self.preflight = Preflight(recipes_dir=write_recipes(home / "recipes"), appliance_home=home,
                                   facts_root=REFERENCE_HOST, generated_dir=home / "recipes-generated")
        self.events = EventLog(self.store, self.clock)
        self.targets = ScrapeTargets(home / "prometheus" / "engines.json")
        self.gateways: dict[str | None, RecordingGateway] = {None: RecordingGateway()}
        self.prober = FakeProber(self.runtime)
        self.primary = self.driver(None)
        self.removed: list[str] = []

        async def remove_slot(gone: Driver) -> None:
            assert gone.engine_name is not None
            self.removed.append(gone.engine_name)

        self.engines = EngineSet(self.primary, self.driver, plan=self.preflight.plan, remove_slot=remove_slot,
                                 is_free=lambda host, port: port not in busy_ports, cpus=CPUS)
        self.app = create_app(ApiContext(self.primary, self.store, self.preflight, home, "cpu-smollm2",
                                         engines=self.engines))

    def driver(self, model: str | None) -> Driver:
        """The primary (None) or the factory's driver for an engine beside it: its own gateway link."""
        gateway = self.gateways.setdefault(model, RecordingGateway())
        return Driver(runtimes={"process": self.runtime}, store=self.store, preflight=self.preflight,
                      prober=self.prober, gateway=gateway, clock=self.clock,
                      config=DriverConfig(poll_interval_s=1, probe_interval_s=1, oom_settle_s=0,
                                          watch_exits=False),
                      events=self.events, scrape_targets=self.targets, engine_name=model)

    async def step(self, seconds: float = 1.0) -> None:
        """One poll of every engine's loop, then the set drops the engines that were stopped."""
        for _, driver in self.engines.engines():
            await driver.step()
            await driver.settle()
        await self.engines.reap()
        self.clock.t += seconds

    def healthy(self) -> None:
        for engine in self.runtime.engines.values():
            engine.healthy = True
