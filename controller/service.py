"""The controller process (`appliance serve`): admin API + supervisor + host watch, one event loop.

Stopping the controller (SIGTERM/SIGINT) never stops the engine: the engine runs in its own session
(process runtime) or container, and the next controller adopts it (ARCHITECTURE: a controller
restart never kills a healthy engine). Stopping the engine is an explicit `POST /stop` or
`appliance down`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI

from appliance import settings
from appliance.recipe.launch_spec import LaunchSpec
from appliance.recipe.recipe_loader import RecipeError
from appliance.recipe.render import RenderError, render
from controller import admin_token, logsetup
from controller.api.app import AdminGuard, create_app
from controller.api.gpu import gpu_router
from controller.api.keys import keys_router
from controller.api.usage import usage_router
from controller.api_context import ApiContext
from controller.evaluation.proof import ready_hook, recipe_deployment, recipe_expectations
from controller.gateway.control import ControlGateway
from controller.metrics import ControllerMetrics
from controller.runtime.base import Runtime
from controller.runtime.registry import Unavailable, available_runtimes
from controller.settings import CONTROLLER_PORT, Paths, instance_id
from controller.store import Store
from controller.supervisor.blue_green import BesideCheck
from controller.supervisor.clock import SystemClock
from controller.supervisor.driver import Driver, DriverConfig
from controller.supervisor.engine_set import EngineSet, slot_name
from controller.supervisor.events import EventLog
from controller.supervisor.gateway_link import GatewayLink, NoGateway
from controller.supervisor.gpu_health_watch import GpuHealthLink, LaunchView
from controller.supervisor.gpu_memory_check import GpuMemoryLink, NothingReplaced
from controller.supervisor.gpu_memory_watch import GpuWatchLink
from controller.supervisor.host_memory_watch import EngineView, HostWatchLink
from controller.supervisor.machine import Policy, State
from controller.supervisor.preflight import Preflight, UnknownRecipe
from controller.supervisor.probes import HttpProber
from controller.supervisor.provenance import provenance_for
from controller.supervisor.scrape_targets import ScrapeTargets
from controller.supervisor.signals import Apply
from controller.watch.gpu import GpuReader
from controller.watch.load_sampler import EngineTarget, LoadSampler
from controller.watch.recipe_target import recipe_mem_target
from host_setup.facts import HostFactsError

log = logging.getLogger("appliance.controller")


@dataclass
class ServiceConfig:
    home: Path
    recipes_dir: Path
    host: str = "127.0.0.1"
    port: int = CONTROLLER_PORT
    gateway_url: str | None = None  # None: no gateway to notify
    gateway_client_url: str | None = None  # where clients reach the gateway (the console's Try it box)
    apply_on_start: str | None = None  # applied when nothing was adopted
    docker: bool = True  # also supervise/adopt docker engines when a daemon answers
    watch_host: bool = True
    watch_kmsg: bool = True
    policy: Policy = field(default_factory=Policy)
    driver: DriverConfig = field(default_factory=DriverConfig)
    log_level: str = "info"


def engine_view(driver: Driver) -> EngineView:
    """The host watch's narrow view of the driver (controller/supervisor/host_memory_watch.py)."""
    view = driver.view
    return EngineView(launch=lambda: view.launch, state=lambda: view.state,
                      runtime=driver.runtimes.get, note=driver.note)


def make_runtimes(paths: Paths, docker: bool) -> tuple[dict[str, Runtime], dict[str, Unavailable]]:
    """Every runtime of the registry that works on this host (controller/runtime/registry.py), and
    why each other one does not (no SDK, no daemon, no cluster configuration). `docker=False`
    (`--no-docker`) leaves the docker one out. Each adopts only this instance's engines
    (`instance_id`, under APPLIANCE_HOME)."""
    return available_runtimes(paths.runs, skip=() if docker else ("docker",), instance_id=instance_id(paths))


def container_grant_warnings(docker_note: str | None) -> list[str]:
    """In a container (compose.yaml), one sentence per missing grant naming what is blind
    (controller.watch.grants). On a host there are no grants to miss; the kmsg follower and the
    docker runtime already say when they cannot work."""
    from controller.watch import grants

    if not (grants.in_container() or settings.current().check_grants):
        return []
    checks = grants.check_grants(grants.grant_paths_from_env(),
                                 docker_ping=lambda: docker_note)
    return [c.detail for c in checks if not c.ok]


def make_gateway(cfg: ServiceConfig, paths: Paths,
                 engine: str | None = None) -> tuple[GatewayLink, str | None]:
    """The gateway link of the primary engine (`engine` None: the gateway's default slot) or of an
    engine beside it (its named slot: its served model name)."""
    if not cfg.gateway_url:
        return NoGateway(), None
    token = admin_token.read_gateway_token(paths.home / "run")
    if token is None:
        return NoGateway(), (f"no gateway control token in {paths.home / 'run'}: the gateway at "
                             f"{cfg.gateway_url} will not be told about engine slots")
    return ControlGateway(cfg.gateway_url, token, engine=engine), None


@dataclass
class Service:
    """The controller's parts, wired (`build`); `serve` runs them."""

    store: Store
    driver: Driver
    watch: HostWatchLink
    gpu_watch: GpuWatchLink
    prober: HttpProber
    app: FastAPI
    metrics: ControllerMetrics
    gpu_health: GpuHealthLink
    load: LoadSampler
    engines: EngineSet


def build(cfg: ServiceConfig, runtimes: dict[str, Runtime] | None = None) -> Service:
    """Construct and wire everything, start nothing. `runtimes`: the engines' seam (tests pass fakes;
    None: the host's, `make_runtimes`)."""
    paths = Paths(cfg.home)
    store = Store(paths.db)
    metrics = ControllerMetrics()  # one registry, injected into everything that records (GET /metrics)
    missing: dict[str, Unavailable] = {}
    if runtimes is None:
        runtimes, missing = make_runtimes(paths, cfg.docker)
    docker_gap = missing.get("docker")
    # Only the docker runtime's own answer feeds the docker-socket grant check (compose.yaml).
    docker_note = docker_gap.reason if docker_gap is not None and docker_gap.fault else None
    gateway, gateway_note = make_gateway(cfg, paths)
    preflight = Preflight(recipes_dir=cfg.recipes_dir, appliance_home=cfg.home, cache_bases=(paths.cache,),
                          runtime_kinds=frozenset(runtimes),
                          runtime_gaps={kind: gap.reason for kind, gap in missing.items()},
                          generated_dir=paths.generated_recipes)
    watch = HostWatchLink(store, metrics=metrics)
    gpu_health = GpuHealthLink(metrics=metrics)
    preflight.gpu = gpu_health
    watch.on_record = gpu_health.on_record  # kernel GPU events ride on the OOM watch's kmsg follower
    prober = HttpProber()

    def spec_for_recipe(name: str) -> LaunchSpec | None:
        try:
            return preflight.plan(name)[2]
        except (UnknownRecipe, RecipeError, RenderError, HostFactsError, OSError):
            return None

    # The cards' memory now: preflight's KV admission and blue/green's same-card rule read it.
    gpu_memory = GpuMemoryLink(GpuReader(), running_pids=running_pids_of(watch))
    # The event stream exists before the driver: the on-ready proof is built with its `note`.
    clock = SystemClock()
    events = EventLog(store, clock)
    # One Prometheus target file for every engine of the host (each driver publishes its own).
    targets = ScrapeTargets(paths.prometheus_targets)
    # The host seams every driver shares, the primary's and those of the engines beside it.
    shared: dict[str, Any] = dict(
        runtimes=runtimes, store=store, prober=prober, clock=clock, policy=cfg.policy, config=cfg.driver,
        provenance=provenance_for(runtimes), spec_for_recipe=spec_for_recipe, oom_events=watch.oom_events,
        gpu_events=gpu_health.gpu_events, mem_target=recipe_mem_target(preflight.recipe),
        unavailable_runtimes={kind: gap.reason for kind, gap in missing.items()},
        process_peaks=watch.process_peaks,
        on_ready=ready_hook(runtimes, recipe_expectations(preflight.recipe), events.note,
                            recipe_deployment(preflight.recipe, str(cfg.home))), events=events,
        scrape_targets=targets,
    )
    driver = Driver(
        **shared, preflight=preflight, gateway=gateway, metrics=metrics,
        beside=BesideCheck(preflight.recipe, preflight.facts, render, runtimes,
                           gpu_memory=lambda: gpu_memory.view(replaces_running=False)),
    )

    def alongside(model: str) -> Driver:
        """The driver of an engine started beside the primary (engine_set.py): its own gateway slot
        (named `model`), its own metrics registry (`GET /metrics` merges its engine series in, labelled
        `model`: engine_metrics.py), a preflight that counts nothing the running engines hold on a card
        as free, and no blue/green beside itself."""
        link, _ = make_gateway(cfg, paths, engine=slot_name(model))
        beside_preflight = dataclasses.replace(preflight, gpu_memory=NothingReplaced(gpu_memory))
        return Driver(**shared, preflight=beside_preflight, gateway=link, metrics=ControllerMetrics(),
                      engine_name=model)

    async def remove_slot(gone: Driver) -> None:
        link = gone.gateway
        if isinstance(link, ControlGateway):
            await link.remove()

    engines = EngineSet(driver, alongside, plan=preflight.plan, remove_slot=remove_slot,
                        gpu_memory=lambda: gpu_memory.view(replaces_running=False))
    watch.engine = engine_view(driver)
    # OOM attribution and the launch records' memory marks follow every engine; the GPU watches below
    # stay the primary's (engine_set.py, "Named gaps").
    watch.beside = lambda: [engine_view(d) for d in engines.alongside.values()]
    gpu_health.view = LaunchView(launch=watch.engine.launch, pids=watch.pids_of, note=driver.note)
    preflight.note = driver.note
    preflight.gpu_memory = gpu_memory
    gpu_watch = GpuWatchLink(store, metrics=metrics)
    gpu_watch.current_launch = watch.engine.launch
    for note in (*(gap.reason for gap in missing.values() if gap.fault), gateway_note):
        if note:
            driver.note("controller", note)
    for blind in container_grant_warnings(docker_note):
        log.warning("%s", blind)
        driver.note("grant", blind)
    guard = AdminGuard(cfg.home)
    load = LoadSampler(cfg.gateway_url, ready_engine(driver))
    app = create_app(ApiContext(driver, store, preflight, cfg.home, cfg.apply_on_start,
                                extra_routers=(keys_router(guard), gpu_router(guard, gpu_health),
                                               usage_router(guard)),
                                listen_host=cfg.host, load=load, gateway_client_url=cfg.gateway_client_url,
                                engines=engines))
    return Service(store, driver, watch, gpu_watch, prober, app, metrics, gpu_health, load, engines)


def ready_engine(driver: Driver) -> Callable[[], EngineTarget | None]:
    """The engine the load sampler scrapes: the ready launch only (a starting engine does not listen
    yet, and its counters are not the load clients put on the appliance)."""
    def target() -> EngineTarget | None:
        launch = driver.view.ready_launch()
        return EngineTarget(launch.launch_id, launch.spec.base_url) if launch is not None else None
    return target


def running_pids_of(watch: HostWatchLink) -> Callable[[], frozenset[int] | None]:
    """The running engine's pids as the host watch last saw them: empty when no engine runs, None
    when one runs but none of its pids were seen (GPU admission then cannot count its share)."""
    def pids() -> frozenset[int] | None:
        launch = watch.engine.launch() if watch.engine is not None else None
        if launch is None or launch.handle is None:
            return frozenset()
        return watch.pids_of(launch.launch_id) or None
    return pids


async def serve(cfg: ServiceConfig) -> None:
    svc = build(cfg)
    store, driver, watch, gpu_watch, prober, app = (
        svc.store, svc.driver, svc.watch, svc.gpu_watch, svc.prober, svc.app)
    # Our logging config again, as uvicorn's: its configure step must not replace ours (logsetup).
    server = uvicorn.Server(uvicorn.Config(app, host=cfg.host, port=cfg.port, log_level=cfg.log_level,
                                           log_config=logsetup.logging_config(cfg.log_level),
                                           lifespan="off", access_log=False))
    # uvicorn turns SIGINT/SIGTERM into should_exit, then re-raises the signal to the handler that
    # was there before it: make that ours, so the re-raise cannot kill the process before cleanup.
    # The engine is left running on purpose.
    def _exit_on_signal(signum: int, frame: object) -> None:
        server.should_exit = True

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _exit_on_signal)

    stop = asyncio.Event()
    driver.note("controller", f"controller starting on {cfg.host}:{cfg.port} (pid {os.getpid()})")
    await svc.engines.adopt()
    if cfg.apply_on_start and driver.view.state is State.IDLE:
        driver.submit(Apply(cfg.apply_on_start))
    # Every engine's supervision loop: the primary's, and one per engine started beside it.
    tasks = [asyncio.create_task(svc.engines.run(stop), name="supervisors")]
    for hook in getattr(app.state, "on_start", ()):  # e.g. a choice a restart cut off resumes
        hook()
    if cfg.watch_host:
        tasks.append(asyncio.create_task(watch.run_sampler(stop), name="host-sampler"))
    if cfg.watch_kmsg:
        tasks.append(asyncio.create_task(watch.run_kmsg(stop), name="kmsg"))
    if cfg.watch_host:
        tasks.append(asyncio.create_task(gpu_watch.run(stop), name="gpu-watch"))
        tasks.append(asyncio.create_task(svc.gpu_health.run(stop), name="gpu-health"))
    tasks.append(asyncio.create_task(svc.load.run(stop), name="load-sampler"))
    try:
        await server.serve()
    finally:
        stop.set()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(task, timeout=10)
        await svc.engines.shutdown()
        await prober.close()
        driver.note("controller", "controller stopped; the engine (if any) keeps running for adoption")
        store.close()


def run(cfg: ServiceConfig) -> None:
    logsetup.configure(cfg.log_level)
    asyncio.run(serve(cfg))
