"""The controller's admin API (FastAPI). Listens on 127.0.0.1:8090 unless configured otherwise.

Reads are open (the port is loopback by default); every mutating endpoint needs the bearer admin
token: 401 when it is missing, 403 when it is wrong (or when no token is configured at all). Before
any route runs (controller/api_guard.py): the Host header must name this machine (loopback, the
address it listens on, or $APPLIANCE_ADMIN_HOSTS; else 400 — DNS rebinding), a request that may
carry a body is authenticated from its head before the body is read, and bodies over 64 KiB are 413.
Errors map to policy: 404 unknown recipe or launch, 409 a start already in progress (the state
machine's own refusal, so two concurrent applies get one 202 and one 409), 422 a bad body (with
the offending field in `detail[].loc`).

    GET  /healthz                  the controller answers
    GET  /metrics                  Prometheus (controller/metrics.py: the primary's ControllerMetrics, with
                                   each engine beside it by `model`: supervisor/engine_metrics.py)
    GET  /recipes                  what can be applied
    GET  /recipes/{name}           one recipe and its rendering on this host
    POST /recipes/{name}/plan      lint + admission + rendering, nothing started
    POST /apply                    {"recipe": name, "fresh_cache": false, "alongside": false}; alongside:
                                   start it beside the running engines (409 with what is in the way)
    POST /restart | /stop          {"model": name}: the engine serving that model (404: unknown, with
                                   the known ones); without it, the primary engine as always
    GET  /status                   state, phase, progress (fraction of the ready budget), eta (expected
                                   ready time from earlier launches, likely-stall flag), diagnosis;
                                   `engines`: one short entry per engine
    GET  /load                     how busy it is: req/s, output tokens/s, TTFT/TPOT p50/p99, in flight,
                                   queued, KV cache, 4xx/429/5xx, uptime since ready; ~15 min of series
    GET  /launches[?recipe=&limit=], /launches/{id}, /launches/{id}/log?offset= (admin)
    GET  /events                   server-sent events: state, phase and supervisor events
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Query, Request, Response, status
from fastapi.responses import JSONResponse, RedirectResponse, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field
from starlette.middleware.trustedhost import TrustedHostMiddleware

from appliance.engine_secret import redact_recipe_data
from appliance.recipe.recipe_loader import RecipeError
from appliance.recipe.render import RenderError
from controller.api_context import (
    ApiContext,
    LogUnavailable,
    load_view,
    read_launch_log,
    running_view,
    status_of,
)
from controller.api_guard import (
    SQLITE_INT_MAX,
    AdminTokenFirst,
    BodyLimit,
    StrictJson,
    admin_refusal,
    allowed_hosts,
    install_error_handlers,
)
from controller.catalogue import load_failed
from controller.console.routes import console_router
from controller.evaluation.choices import Choices
from controller.evaluation.router import evaluation_router
from controller.evaluation.store import EvalStore
from controller.store import LaunchRecord, LaunchSummary, redact_spec
from controller.supervisor import compile_cache
from controller.supervisor.driver import Driver
from controller.supervisor.engine_metrics import engine_set_metrics
from controller.supervisor.engine_set import AlongsideRefused
from controller.supervisor.preflight import UnknownRecipe
from controller.supervisor.signals import Apply, Restart, Stop
from host_setup.facts import HostFactsError

SSE_HEARTBEAT_S = 15.0
_TEXT = "text/plain; charset=utf-8"


class ApplyBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)  # as sent, never coerced (api/keys.py)

    recipe: str = Field(min_length=1, max_length=200, pattern=r"^[a-z0-9][a-z0-9._-]*$")
    fresh_cache: bool = Field(
        default=False,
        description="Empty the recipe's compile-cache root first: the next start is cold "
        "(and, for warm_restart recipes, runs the warm-up-then-restart flow).",
    )
    force: bool = Field(
        default=False,
        description="Restart even when exactly this launch spec is already ready (otherwise a no-op).",
    )
    blue_green: bool = Field(
        default=True,
        description="Start the new engine beside the serving one when it fits (host RAM against the "
        "recipe's MemAvailable target, GPU cards: other cards, or room on the same ones by NVML's free "
        "memory, a free port), then switch with no hold; false: always drain, stop and start with the "
        "gateway holding new requests.",
    )
    alongside: bool = Field(
        default=False,
        description="Start it beside the running engines, as an engine of its own serving the recipe's "
        "model name (controller/supervisor/engine_set.py); refused (409, naming the engine in the way) when "
        "the name, the port, the host's RAM, CPU cores or GPU cards are taken.",
    )


# A served model name as the gateway takes one (controller/gateway/admin.py): printable, no spaces.
MODEL_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]*$"


class StopBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    model: str | None = Field(default=None, min_length=1, max_length=200, pattern=MODEL_PATTERN,
                              description="The engine serving this model (None: the primary engine).")


class RestartBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    model: str | None = Field(default=None, min_length=1, max_length=200, pattern=MODEL_PATTERN,
                              description="The engine serving this model (None: the primary engine).")

    blue_green: bool = Field(
        default=True,
        description="Start the new engine beside the serving one when it fits (as apply's blue_green), "
        "then switch with no hold; false: drain, stop and start with the gateway holding new requests.",
    )


class Accepted(BaseModel):
    accepted: bool = True
    state: str
    recipe: str | None
    # The apply's id: `GET /status` → `last_apply` says what became of it (refused / unchanged / started).
    apply_id: int | None = None
    # Which path the switch takes and why, with the numbers (controller/supervisor/hold_plan.py).
    switch: dict[str, Any] | None = None
    # The engine it is about, by its served model name (None: the primary engine).
    model: str | None = None
    # An engine started beside the others: why it fits beside them, with the numbers (host RAM, cores,
    # cards: controller/supervisor/alongside_admission.py).
    admitted: str | None = None


class RecipeSummary(BaseModel):
    name: str
    description: str
    platform: str
    runtime: str
    ready_budget_s: int
    warm_restart: bool
    default: bool


_BEARER = HTTPBearer(auto_error=False, description="The admin token (its sha256 is configured).")


class AdminGuard:
    """The dependency on every mutating endpoint (also handed to keys_router)."""

    def __init__(self, home: Path) -> None:
        self.home = home

    def __call__(self, creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)]) -> None:
        # The same decision api_guard.AdminTokenFirst makes before a body is read; here it also
        # covers bodyless routes that need the token (GET /keys).
        refusal = admin_refusal(self.home, f"{creds.scheme} {creds.credentials}" if creds else None)
        if refusal is not None:
            raise refusal


def create_app(ctx: ApiContext) -> FastAPI:
    app = FastAPI(
        title="appliance controller",
        version="0.1.0",
        description="Supervises one engine per host: recipes, launches, phases, diagnosis.",
    )
    # Starlette runs the last added middleware first: Host, then the token, then the body size.
    app.add_middleware(StrictJson)  # innermost: reads a body BodyLimit has already bounded
    app.add_middleware(BodyLimit, max_bytes=ctx.max_body_bytes)
    app.add_middleware(AdminTokenFirst, home=ctx.home)
    app.add_middleware(TrustedHostMiddleware, www_redirect=False,
                       allowed_hosts=allowed_hosts(ctx.listen_host, ctx.extra_hosts))
    install_error_handlers(app)
    Admin = Depends(AdminGuard(ctx.home))
    driver, store, preflight, engines = ctx.driver, ctx.store, ctx.preflight, ctx.engine_set
    alongside_lock = asyncio.Lock()  # POST /apply {"alongside": true}: one judged-and-added at a time

    async def known_recipe(name: str) -> None:
        try:
            await asyncio.to_thread(preflight.recipe, name)
        except UnknownRecipe as exc:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"no launchable recipe named {name!r}") from exc
        except RecipeError as exc:
            raise HTTPException(status.HTTP_500_INTERNAL_SERVER_ERROR, load_failed(exc)) from exc

    @app.get("/healthz", tags=["meta"],
             responses={503: {"description": "supervision has stopped, or the launch store was lost"}})
    async def healthz() -> JSONResponse:
        # Liveness for compose's healthcheck / a pod's livenessProbe: answering HTTP is not enough
        # if the loop that watches the engine has stopped coming round, or the launch store's file
        # was deleted or replaced under the controller (its records would be lost at the restart).
        problem = engines.liveness_problem()  # every engine's loop: the primary's and those beside it
        body = {"ok": problem is None, "state": driver.view.state.value}
        if problem is not None:
            return JSONResponse({**body, "problem": problem}, status_code=status.HTTP_503_SERVICE_UNAVAILABLE)
        return JSONResponse(body)

    # Every engine's series: the primary's as its registry has them, those of each engine beside it
    # under the same families with a `model` label (engine_metrics.py).
    exposition = engine_set_metrics(engines)

    @app.get("/metrics", tags=["meta"], response_class=Response)
    async def get_metrics() -> Response:
        body, content_type = exposition.render()
        return Response(content=body, media_type=content_type)

    @app.get("/recipes", tags=["recipes"], response_model=list[RecipeSummary])
    async def list_recipes() -> list[RecipeSummary]:
        try:
            recipes = await asyncio.to_thread(preflight.catalogue.load)
        except RecipeError as exc:
            raise HTTPException(status.HTTP_500_INTERNAL_SERVER_ERROR, load_failed(exc)) from exc
        return [
            RecipeSummary(
                name=r.name, description=r.description.strip(), platform=r.platform.value,
                runtime=r.runtime.kind, ready_budget_s=r.expect.ready_budget_s,
                warm_restart=r.expect.warm_restart, default=r.name == ctx.default_recipe,
            )
            for r in recipes.values() if not r.abstract
        ]

    @app.get("/recipes/{name}", tags=["recipes"])
    async def show_recipe(name: str) -> dict[str, Any]:
        await known_recipe(name)
        report = await asyncio.to_thread(preflight.report, name)
        running = await asyncio.to_thread(running_view, ctx, report)
        return {
            # The recipe serving now: what a restart of it would start from (MemAvailable + its engine).
            "running": running,
            # unauthenticated: a recipe's own key (env VLLM_API_KEY, `--api-key` in extra_args) is redacted
            "recipe": redact_recipe_data(report.recipe.model_dump(mode="json")),
            "rendered": redact_spec(report.spec).model_dump(mode="json") if report.spec else None,
            "render_error": report.render_error,
        }

    @app.post("/recipes/{name}/plan", tags=["recipes"], dependencies=[Admin])
    async def plan(name: str) -> dict[str, Any]:
        await known_recipe(name)
        report = await asyncio.to_thread(preflight.report, name)
        current = driver.view.launch
        spec = report.spec
        # A cache root not writable, gone since a launch used it, or shared.
        warnings = [] if spec is None else await asyncio.to_thread(
            lambda: compile_cache.plan_warnings(
                spec, compile_cache.other_variants(preflight.catalogue.load(), report.facts, spec),
                store.earlier_on_root("", spec.cache_root)))
        return {
            "recipe": name,
            "launchable": report.launchable,
            "refusals": [vars(f) for f in report.refusals],
            "lint": [f.model_dump(mode="json") for f in report.findings],
            "admission": report.admission.model_dump(mode="json"),
            "rendered": redact_spec(report.spec).model_dump(mode="json") if report.spec else None,
            "render_error": report.render_error,
            "cache_root": report.spec.cache_root if report.spec else None,
            "cache_empty": report.cache_empty,
            "cache_warnings": warnings,
            "warm_restart_flow": report.recipe.expect.warm_restart and bool(report.cache_empty),
            "would_replace": current.spec.recipe if current else None,
            # This recipe serves now: a restart starts from MemAvailable plus what its engine holds.
            "running": await asyncio.to_thread(running_view, ctx, report),
            "state": driver.view.state.value,
            "switch": driver.switch_plan(report.recipe.name, report.spec.spec_hash if report.spec else None),
        }

    @app.post("/apply", tags=["control"], status_code=status.HTTP_202_ACCEPTED, dependencies=[Admin],
              response_model=Accepted, responses={404: {}, 409: {}, 422: {}})
    async def apply(body: ApplyBody) -> Accepted:
        await known_recipe(body.recipe)
        if body.alongside:
            return await apply_alongside(body)
        try:
            beside_why = await asyncio.to_thread(engines.judge_primary, body.recipe)
        except (UnknownRecipe, RecipeError, RenderError, HostFactsError, OSError):
            beside_why = None  # the preflight says what is wrong with the recipe, as always
        if beside_why is not None:
            raise HTTPException(status.HTTP_409_CONFLICT, beside_why)
        blue_green = engines.primary_blue_green(body.blue_green)
        # Before the apply: what serves now.
        switch = driver.switch_plan(body.recipe, drain_first=not blue_green)
        rejected = driver.submit(Apply(body.recipe, body.fresh_cache, body.force, blue_green=blue_green))
        if rejected is not None:
            raise HTTPException(status.HTTP_409_CONFLICT, rejected.reason)
        apply_id = driver.view.machine.apply.token if driver.view.machine.apply is not None else None
        return Accepted(state=driver.view.state.value, recipe=driver.view.recipe, apply_id=apply_id,
                        switch=switch)

    async def apply_alongside(body: ApplyBody) -> Accepted:
        # One start beside the others at a time: judged and added under one lock, so two requests
        # cannot both pass the port, core and RAM checks against a set that holds neither of them yet.
        async with alongside_lock:
            return await _apply_alongside(body)

    async def _apply_alongside(body: ApplyBody) -> Accepted:
        try:
            model, why, fits = await asyncio.to_thread(engines.judge, body.recipe)
        except (UnknownRecipe, RecipeError, RenderError, HostFactsError, OSError) as exc:
            raise HTTPException(status.HTTP_409_CONFLICT, f"{body.recipe}: {exc}") from exc
        if why is not None:
            raise HTTPException(status.HTTP_409_CONFLICT, why)
        try:
            beside = engines.add(model)
        except AlongsideRefused as exc:  # taken meanwhile by another request
            raise HTTPException(status.HTTP_409_CONFLICT, str(exc)) from exc
        # Judged against the engines running now; the driver's own preflight (lint, admission) follows.
        # `force`: a new driver has nothing running to leave unchanged; no blue/green beside itself.
        beside.submit(Apply(body.recipe, body.fresh_cache, force=True, blue_green=False))
        apply_id = beside.view.machine.apply.token if beside.view.machine.apply is not None else None
        return Accepted(state=beside.view.state.value, recipe=beside.view.recipe, apply_id=apply_id,
                        model=model, admitted=fits)

    def engine_for(model: str | None) -> Driver:
        """The driver serving `model` (None: the primary); 404 naming the known models."""
        if model is None:
            return driver
        found = engines.for_model(model)
        if found is None:
            known = sorted(engines.models())
            raise HTTPException(status.HTTP_404_NOT_FOUND,
                                f"no engine serves model {model!r}; serving: {', '.join(known) or 'none'}")
        return found

    @app.post("/restart", tags=["control"], status_code=status.HTTP_202_ACCEPTED, dependencies=[Admin],
              response_model=Accepted, responses={404: {}, 409: {}})
    async def restart(body: RestartBody | None = None) -> Accepted:
        model = body.model if body is not None else None
        if model is not None and engine_for(model) is not driver:
            beside = engine_for(model)
            rejected = beside.submit(Restart(blue_green=False))
            if rejected is not None:
                raise HTTPException(status.HTTP_409_CONFLICT, rejected.reason)
            return Accepted(state=beside.view.state.value, recipe=beside.view.recipe, model=model)
        blue_green = engines.primary_blue_green(body.blue_green if body is not None else True)
        recipe = driver.view.recipe
        launch = driver.view.launch
        # Before the restart: its path (blue/green beside the serving engine when it fits, else the hold).
        switch = (driver.switch_plan(recipe, launch.spec.spec_hash if launch is not None else None,
                                     drain_first=not blue_green) if recipe is not None else None)
        rejected = driver.submit(Restart(blue_green=blue_green))
        if rejected is not None:
            raise HTTPException(status.HTTP_409_CONFLICT, rejected.reason)
        return Accepted(state=driver.view.state.value, recipe=driver.view.recipe, switch=switch)

    @app.post("/stop", tags=["control"], status_code=status.HTTP_202_ACCEPTED, dependencies=[Admin],
              response_model=Accepted, responses={404: {}})
    async def stop(body: StopBody | None = None) -> Accepted:
        model = body.model if body is not None else None
        target = engine_for(model)
        target.submit(Stop())
        return Accepted(state=target.view.state.value, recipe=target.view.recipe, model=model)

    @app.get("/status", tags=["status"])
    async def get_status() -> dict[str, Any]:
        return status_of(ctx)

    @app.get("/load", tags=["status"])
    async def get_load() -> dict[str, Any]:
        """How busy it is now: req/s, output tokens/s, TTFT and TPOT p50/p99, in flight, queued, KV
        cache, error answers of the last minutes, uptime since ready; a series per figure for the last
        ~15 minutes (controller/watch/load_sampler.py, appliance/observe/load_figures.py)."""
        return load_view(ctx, driver.clock.now())

    @app.get("/launches", tags=["launches"], response_model=list[LaunchSummary])
    async def launches(
        limit: Annotated[int, Query(ge=1, le=1000)] = 50, recipe: str | None = None
    ) -> list[LaunchSummary]:
        return await asyncio.to_thread(store.list_launches, limit, recipe)

    @app.get("/launches/{launch_id}", tags=["launches"], response_model=LaunchRecord)
    async def launch(launch_id: str) -> LaunchRecord:
        record = await asyncio.to_thread(store.get_launch, launch_id)
        if record is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"no launch {launch_id!r}")
        return record

    # Admin only: the engine log holds every client's request line (vLLM's access log: paths with
    # their query strings), which an unauthenticated reader of this port must not see.
    @app.get("/launches/{launch_id}/log", tags=["launches"], response_class=Response, dependencies=[Admin])
    async def launch_log(
        launch_id: str, offset: Annotated[int, Query(ge=0, le=SQLITE_INT_MAX)] = 0,
    ) -> Response:
        """Engine log text from byte `offset` (at most 4 MiB); `X-Next-Offset` says where to go on."""
        try:
            text, next_offset = await asyncio.to_thread(read_launch_log, ctx, launch_id, offset)
        except LogUnavailable as exc:
            raise HTTPException(exc.code, str(exc)) from exc
        return Response(text, media_type=_TEXT, headers={"X-Next-Offset": str(next_offset)})

    @app.get("/events", tags=["status"], response_class=StreamingResponse)
    async def events(
        request: Request,
        after: Annotated[int | None, Query(
            ge=0, le=SQLITE_INT_MAX, description="Replay stored events with a larger id first.")] = None,
    ) -> StreamingResponse:
        async def stream() -> AsyncIterator[bytes]:
            async with driver.subscribe() as queue:
                yield _sse("status", status_of(ctx))
                if after is not None:
                    for record in await asyncio.to_thread(store.events, after, 1000):
                        yield _sse("event", {"type": "event", **record.model_dump()}, record.id)
                while not await request.is_disconnected():
                    try:
                        event = await asyncio.wait_for(queue.get(), timeout=SSE_HEARTBEAT_S)
                    except TimeoutError:
                        yield b": keep-alive\n\n"
                        continue
                    event_id = event.get("id") if event.get("type") == "event" else None
                    yield _sse(str(event.get("type", "event")), event, event_id)

        return StreamingResponse(
            stream(), media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    evals = EvalStore(store.path)  # one handle on the evaluation tables: the API and the console read it
    # What `serve` runs once its loop runs (a choice cut off by a restart resumes): app.state.on_start.
    app.state.on_start = []
    # One runner: the API and the console start the same; it refuses while engines run beside the primary.
    choices = Choices(driver, store, preflight, evals, beside=lambda: sorted(engines.alongside))
    app.include_router(evaluation_router(driver, store, preflight, AdminGuard(ctx.home), evals,
                                         on_start=app.state.on_start, choices=choices))
    for router in ctx.extra_routers:
        app.include_router(router)
    # the operator console (controller/console/), own log-in
    app.include_router(console_router(ctx, evals=evals, choices=choices))

    @app.get("/", include_in_schema=False)
    async def root() -> RedirectResponse:
        """A browser pointed at the controller's port lands on the console (it was a bare 404)."""
        return RedirectResponse("/console/", status.HTTP_307_TEMPORARY_REDIRECT)

    return app


def _sse(kind: str, data: dict[str, Any], event_id: object = None) -> bytes:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {kind}\ndata: {json.dumps(data, default=str)}\n\n".encode()
