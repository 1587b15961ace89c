"""What the controller API is built from (`create_app(ctx)` in controller/api/app.py).

Its own module, below both the API and the console (controller/console/ mounts its pages on the
same app and reads the same driver, store and preflight): the console no longer imports the API
module that mounts it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from appliance.engine_secret import redact as redact_keys
from appliance.recipe.running_plan import running_plan
from controller.api_guard import MAX_BODY_BYTES
from controller.runtime.base import EngineHandle, EngineRuntimeError
from controller.store import Store
from controller.supervisor.blue_green import serving_footprint
from controller.supervisor.driver import Driver
from controller.supervisor.engine_set import EngineSet
from controller.supervisor.machine import State
from controller.supervisor.preflight import PlanReport, Preflight
from controller.watch.load_sampler import LoadSampler


@dataclass
class ApiContext:
    driver: Driver
    store: Store
    preflight: Preflight
    home: Path  # where the admin token's hash file lives
    default_recipe: str | None = None
    extra_routers: tuple[Any, ...] = ()  # e.g. keys_router(require_admin)
    listen_host: str | None = None  # the address the API is bound to: also an accepted Host
    extra_hosts: tuple[str, ...] = ()  # more accepted Host names (besides loopback, $APPLIANCE_ADMIN_HOSTS)
    max_body_bytes: int = MAX_BODY_BYTES
    load: LoadSampler | None = None  # the gateway's and engine's load, sampled (GET /load, the Now page)
    gateway_client_url: str | None = None  # the gateway's client address: the console's Try it box
    # Every engine of the host: `driver` (the primary) and those started beside it (None: the primary
    # alone, as a set of one that cannot start another).
    engines: EngineSet | None = None

    def __post_init__(self) -> None:
        if self.engines is None:
            self.engines = EngineSet(self.driver)

    @property
    def engine_set(self) -> EngineSet:
        assert self.engines is not None  # set in __post_init__
        return self.engines


class LogUnavailable(Exception):
    """A launch's log cannot be read: `code` is the HTTP status the API answers (404, 502)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def read_launch_log(ctx: ApiContext, launch_id: str, offset: int) -> tuple[str, int]:
    """Engine log text of a launch from byte `offset` (at most the runtime's chunk) and the next offset,
    with the engine's API key redacted. The one path behind `GET /launches/{id}/log` and the console's
    log view. Blocking (the store, the runtime's file or daemon): call it from a worker thread."""
    record = ctx.store.get_launch(launch_id)
    if record is None:
        raise LogUnavailable(404, f"no launch {launch_id!r}")
    if record.handle is None:
        return "", offset
    handle = EngineHandle.model_validate(record.handle)
    runtime = ctx.driver.runtimes.get(handle.runtime)
    if runtime is None:
        raise LogUnavailable(404, f"this controller has no {handle.runtime} runtime")
    try:
        text, next_offset = runtime.read_logs(handle, offset)
    except EngineRuntimeError as exc:
        raise LogUnavailable(502, str(exc)) from exc
    # vLLM 0.26.0 logs the key it read from its config file (appliance/engine_secret.py).
    key = ctx.driver.engine_key(launch_id)
    return redact_keys(text, [key] if key else []), next_offset


def status_of(ctx: ApiContext) -> dict[str, Any]:
    """`GET /status`: the primary engine's status as always, plus `engines`, one short entry per
    engine of the host (the primary first; engine_set.py)."""
    return {**ctx.driver.status(), "engines": ctx.engine_set.entries()}


def load_view(ctx: ApiContext, now: float) -> dict[str, Any]:
    """`GET /load` and the Now page's load: the sampler's report with the engine's uptime since ready
    (the ready launch's `ready_at`; None while no engine is ready)."""
    view = ctx.driver.view
    launch = view.ready_launch()
    report = ctx.load.report() if ctx.load is not None else {
        "sampled_at": None, "now": {}, "errors": {}, "series": {}, "sources": {},
        "problems": {"sampler": "this controller samples no load"}, "gateway_attached": False}
    ready_at = launch.ready_at if launch is not None else None
    return {**report, "state": view.state.value, "recipe": view.recipe,
            "launch_id": launch.launch_id if launch is not None else None, "ready_at": ready_at,
            "uptime_s": round(now - ready_at, 1) if ready_at is not None else None}


def running_view(ctx: ApiContext, report: PlanReport) -> dict[str, Any] | None:
    """When `report`'s recipe is the one serving now: what a restart of it would start from (MemAvailable
    now plus what the engine holds; appliance/recipe/running_plan.py). None for any other recipe.
    Blocking (the engine's process tree): call it from a worker thread."""
    view = ctx.driver.view
    launch = view.launch
    if (launch is None or launch.handle is None or view.state is not State.READY
            or launch.spec.recipe != report.recipe.name):
        return None
    engine_gib = serving_footprint(ctx.driver.runtimes, launch.handle)
    target = report.recipe.expect.min_mem_available_gib or 0.0
    plan = running_plan(report.admission, launch.launch_id, report.facts.mem_available_gib, engine_gib,
                        cold=bool(report.cache_empty), target_gib=target)
    return plan.model_dump(mode="json")
