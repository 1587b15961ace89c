"""The operator console: server-rendered pages under /console on the controller's own FastAPI app.

    GET  /console/login, POST /console/login, POST /console/logout
    GET  /console/                      Now: state, phase, live progress, expectations, gateway, diagnosis
    GET  /console/recipes[?a=&b=]       every recipe with admission verdict and lint; a diff of two
    GET  /console/recipes/{name}        one recipe: admission numbers, lint findings
    GET  /console/recipes/{name}/apply  the preflight plan and a confirm form
    POST /console/recipes/{name}/apply  submit the apply (CSRF), 409 page when a start is in progress
    GET  /console/launches[/{id}]       history; one launch's phase waterfall and memory picture
    GET  /console/launches/{id}/log     the tail of its engine log (redacted), with a follow mode
    GET  /console/launches/{id}/log.txt?offset=   log text from a byte offset (the follow mode polls it)
    GET  /console/engine/{stop|restart} a confirm page; POST submits it (CSRF), 409 page when refused
    GET  /console/benchmarks[/{id}]     stored comparisons (verdicts) and benches; one bench's tiers
    GET  /console/comparisons/{id}      one comparison: both arms per tier and per gate step
    GET  /console/memory                host memory over time (controller/watch/history.py)
    GET  /console/keys, POST /console/keys, POST /console/keys/{id}/revoke
    GET  /console/events                server-sent status snapshots for the live progress bar
    GET  /console/static/{file}         console.js, console.css

Every page needs a session (controller/console/auth.py): the pages show host details. The console
talks to the driver, store and preflight in process, never to the JSON API, so it does not depend
on how that API authenticates. Every response carries a strict Content-Security-Policy: scripts
and styles only from /console/static, no inline script, no inline style, no framing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, HTTPException, Request, status
from fastapi.responses import FileResponse, RedirectResponse, Response, StreamingResponse
from fastapi.templating import Jinja2Templates

from appliance.recipe.recipe_loader import RecipeError
from controller.api_context import ApiContext, LogUnavailable, read_launch_log
from controller.console import views
from controller.console.auth import COOKIE, COOKIE_PATH, LoginError, LoginThrottle, Session, Sessions
from controller.console.bench_views import BenchData
from controller.console.gpu_views import gpu_health_view
from controller.console.usage_views import UsageView, optional_quota, usage_view
from controller.evaluation.store import EvalStore
from controller.gateway.keystore import KeyNotFound, KeyRecord, KeyStore, KeyStoreError
from controller.settings import Paths
from controller.supervisor.preflight import UnknownRecipe
from controller.supervisor.signals import Apply, Restart, Stop
from controller.watch.history import HOST_HISTORY, HostHistory
from host_setup.facts import HostFactsError

log = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
STATIC_FILES = {"console.js": "text/javascript", "console.css": "text/css", "favicon.svg": "image/svg+xml"}
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}
MAX_FORM_BYTES = 8 * 1024  # the console's forms are a few short fields
MAX_FIELD_CHARS = 512
# A broken recipe directory or unreadable host facts: a page that says so, never a traceback.
UNREADABLE = (RecipeError, HostFactsError, OSError)
LOG_TAIL_CHARS = 64 * 1024  # the log page shows this much of the end of the log
LOG_MAX_CHUNKS = 64  # reading to the end takes at most this many runtime reads (4 MiB each for files)
STATUS_EVERY_S = 1.0  # the progress bar is time-based: a snapshot a second moves it without events
# Fixed notices selected by a code in the redirect's query string: nothing a link can inject.
NOTICES = {
    "applied": "Apply accepted: the preflight runs, then the engine drains and switches. Watch it below.",
    "revoked": "Key revoked: the gateway refuses it within about a second.",
    "stopping": "Stop accepted: the gateway drains the engine, then it stops; the controller stays idle.",
    "restarting": "Restart accepted: the preflight runs again, then the engine (re)starts. Watch it below.",
    "logged-out": "Logged out.",
}


def _secure(response: Response) -> Response:
    for k, v in SECURITY_HEADERS.items():
        response.headers.setdefault(k, v)
    return response


class FormRefused(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


async def read_form(request: Request) -> dict[str, str]:
    """The form's text fields, read only after the caller has checked the session (the body of an
    unauthenticated request is never read, as the admin API's guard does for bearer tokens), and only
    when small: a declared length is required and bounded, fields are few and short, no files."""
    length = request.headers.get("content-length", "")
    if not length.isdigit():
        raise FormRefused(status.HTTP_411_LENGTH_REQUIRED, "a form needs a Content-Length")
    if int(length) > MAX_FORM_BYTES:
        raise FormRefused(status.HTTP_413_CONTENT_TOO_LARGE,
                          f"a console form is at most {MAX_FORM_BYTES} bytes")
    form = await request.form(max_files=0, max_fields=16)
    fields = {k: v for k, v in form.items() if isinstance(v, str)}
    if any(len(v) > MAX_FIELD_CHARS for v in fields.values()):
        raise FormRefused(status.HTTP_422_UNPROCESSABLE_CONTENT, f"a field is longer than {MAX_FIELD_CHARS}")
    return fields


def console_router(ctx: ApiContext, sessions: Sessions | None = None,
                   history: HostHistory = HOST_HISTORY, evals: EvalStore | None = None,
                   throttle: LoginThrottle | None = None) -> APIRouter:
    """`evals`: the EvalStore create_app shares with the evaluation API; mounted alone (tests), the
    console opens one on the launch store's file, where the evaluation tables live. `throttle`:
    the failed-log-in backoff (by default on the sessions' clock)."""
    router = APIRouter(prefix="/console", include_in_schema=False)
    sessions = sessions or Sessions(ctx.home)
    throttle = throttle or LoginThrottle(clock=sessions.clock)
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    templates.env.filters.update(views.FILTERS)
    driver, preflight = ctx.driver, ctx.preflight
    metrics = driver.metrics
    data = views.ConsoleData(ctx, history)
    bench = BenchData(evals or EvalStore(ctx.store.path))

    def keystore() -> KeyStore:
        return KeyStore(Paths(ctx.home).keys_db)

    def page(request: Request, template: str, session: Session | None, code: int = 200,
             **context: Any) -> Response:
        notice = NOTICES.get(request.query_params.get("notice", ""))
        response = templates.TemplateResponse(
            request, template, {"session": session, "notice": notice, **context}, status_code=code
        )
        return _secure(response)

    def problem(request: Request, session: Session | None, code: int, title: str, message: str,
                back: str = "/console/") -> Response:
        return page(request, "message.html", session, code, title=title, message=message, back=back)

    def current(request: Request) -> Session:
        """The request's session, or a redirect to the log-in page that says why."""
        session, why = sessions.lookup(request.cookies.get(COOKIE))
        if session is None:
            target = "/console/login?next=" + quote(request.url.path, safe="/")
            if why:
                target += "&why=" + quote(why)
            raise HTTPException(status.HTTP_303_SEE_OTHER, headers={"Location": target, **SECURITY_HEADERS})
        return session

    async def session_form(request: Request) -> tuple[Session, dict[str, str] | Response]:
        """Session first (redirect to log in), then the small form, then its CSRF token."""
        session = current(request)
        try:
            form = await read_form(request)
        except FormRefused as exc:
            return session, problem(request, session, exc.code, "Form refused",
                                    f"{exc}; nothing was changed.")
        if sessions.csrf_ok(session, form.get("csrf")):
            return session, form
        return session, problem(request, session, status.HTTP_403_FORBIDDEN, "Form expired or forged",
                       "This form's security token does not match your session, so nothing was changed. "
                       "Reload the page and submit it again.")

    # -- static and log-in

    def not_found(request: Request) -> Response:
        # A page with the same security headers as every other (FastAPI's own 404 had none).
        return problem(request, None, status.HTTP_404_NOT_FOUND, "Not found",
                       "There is no console page here.")

    @router.get("/static/{name}")
    async def static(request: Request, name: str) -> Response:
        media = STATIC_FILES.get(name)
        if media is None:
            return not_found(request)
        response = FileResponse(HERE / "static" / name, media_type=media)
        response.headers["Cache-Control"] = "no-cache"
        return _secure(response)

    @router.get("/login")
    async def login_page(request: Request, next: str = "/console/", why: str = "") -> Response:
        # `why` is shown as text (autoescaped), but only the messages this module writes are shown.
        reason = why if why in views.known_reasons() else ""
        return page(request, "login.html", None, error=reason, next=views.safe_next(next),
                    form_token=sessions.login_form_token())

    @router.post("/login")
    async def login(request: Request) -> Response:
        # The one form read without a session: bounded like every console form (read_form).
        try:
            form = await read_form(request)
        except FormRefused as exc:
            form = {"form_token": "", "error": str(exc)}
        next = views.safe_next(form.get("next", "/console/"))

        def refused(code: int, why: str) -> Response:
            return page(request, "login.html", None, code, error=why, next=next,
                        form_token=sessions.login_form_token())

        if "error" in form:
            return refused(status.HTTP_413_CONTENT_TOO_LARGE, form["error"])
        if not sessions.login_form_token_ok(form.get("form_token", "")):
            return refused(status.HTTP_403_FORBIDDEN, "the log-in form expired — try again")
        client = request.client.host if request.client else "unknown"
        # The token is always compared: a right one logs in at once, whatever failed before from
        # this address (a local user's wrong guesses must not lock the operator out).
        try:
            _, cookie = sessions.login(form.get("token", ""))
        except LoginError as exc:
            # Never the submitted token: only who, why, and how many in a row.
            failures, delay = throttle.failed(client)
            metrics.record_console_login_failure("throttled" if delay > 0 else "refused")
            log.warning("console log-in from %s refused: %s (%d failure%s in a row%s)", client, exc, failures,
                        "" if failures == 1 else "s", f"; answered after {delay:.0f} s" if delay else "")
            if delay > 0:
                await throttle.sleep(delay)  # a guesser learns "wrong" only this late
            return refused(status.HTTP_401_UNAUTHORIZED, str(exc))
        throttle.succeeded(client)
        response = RedirectResponse(next, status.HTTP_303_SEE_OTHER)
        response.set_cookie(
            COOKIE, cookie, max_age=int(sessions.ttl_s), path=COOKIE_PATH, httponly=True, samesite="strict",
            secure=request.url.scheme == "https",
        )
        return _secure(response)

    @router.post("/logout")
    async def logout(request: Request) -> Response:
        session, form = await session_form(request)
        if isinstance(form, Response):
            return form
        sessions.logout(session)
        response = RedirectResponse("/console/login?notice=logged-out", status.HTTP_303_SEE_OTHER)
        response.delete_cookie(COOKIE, path=COOKIE_PATH, httponly=True, samesite="strict")
        return _secure(response)

    # -- Now

    @router.get("/")
    async def now(request: Request) -> Response:
        session = current(request)
        snapshot = driver.status()
        expectations = await asyncio.to_thread(data.expectations, snapshot.get("recipe"))
        gateway = await data.gateway()
        memory = await asyncio.to_thread(data.host_now, snapshot.get("recipe"))
        live = views.live_view(snapshot, memory)
        gpu = gpu_health_view(preflight.gpu)
        return page(request, "now.html", session, status=snapshot, expect=expectations, gateway=gateway,
                    status_json=json.dumps(live), live=live, gpu=gpu)

    @router.get("/events")
    async def events(request: Request) -> Response:
        session, _ = sessions.lookup(request.cookies.get(COOKIE))
        if session is None:
            return _secure(Response("log in first", status.HTTP_401_UNAUTHORIZED, media_type="text/plain"))

        async def stream() -> AsyncIterator[bytes]:
            async with driver.subscribe() as queue:
                while not await request.is_disconnected():
                    live, _ = sessions.lookup(request.cookies.get(COOKIE))
                    if live is None:
                        yield b"event: ended\ndata: {}\n\n"
                        return
                    snapshot = driver.status()
                    memory = await asyncio.to_thread(data.host_now, snapshot.get("recipe"))
                    yield f"event: status\ndata: {json.dumps(views.live_view(snapshot, memory))}\n\n".encode()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(queue.get(), timeout=STATUS_EVERY_S)

        response = StreamingResponse(stream(), media_type="text/event-stream",
                                     headers={"X-Accel-Buffering": "no"})
        return _secure(response)

    # -- Recipes

    @router.get("/recipes")
    async def recipes(request: Request, a: str = "", b: str = "") -> Response:
        session = current(request)
        try:
            rows = await asyncio.to_thread(data.recipe_rows)
        except UNREADABLE as exc:
            return problem(request, session, 500, "Recipes do not load", str(exc))
        names = [r["name"] for r in rows]
        diff = None
        if a and b:
            if a not in names or b not in names:
                return problem(request, session, 404, "Unknown recipe",
                               "Pick two recipes from the list to compare.", "/console/recipes")
            diff = await asyncio.to_thread(data.diff, a, b)
        return page(request, "recipes.html", session, rows=rows, names=names, a=a, b=b, diff=diff,
                    current=driver.machine.recipe)

    async def plan_page(request: Request, name: str, template: str) -> Response:
        """The recipe's preflight plan, on its own page or on the apply confirmation."""
        session = current(request)
        try:
            report = await asyncio.to_thread(preflight.report, name)
        except UnknownRecipe:
            return problem(request, session, 404, "Unknown recipe", f"No launchable recipe named {name!r}.",
                           "/console/recipes")
        except UNREADABLE as exc:
            return problem(request, session, 500, "Cannot plan this recipe", str(exc), "/console/recipes")
        return page(request, template, session, report=views.plan_view(report, driver), name=name)

    @router.get("/recipes/{name}")
    async def recipe(request: Request, name: str) -> Response:
        return await plan_page(request, name, "recipe.html")

    @router.get("/recipes/{name}/apply")
    async def apply_confirm(request: Request, name: str) -> Response:
        return await plan_page(request, name, "apply.html")

    @router.post("/recipes/{name}/apply")
    async def apply(request: Request, name: str) -> Response:
        session, form = await session_form(request)
        if isinstance(form, Response):
            return form
        fresh_cache = form.get("fresh_cache") == "true"
        try:
            await asyncio.to_thread(preflight.recipe, name)
        except UnknownRecipe:
            return problem(request, session, 404, "Unknown recipe", f"No launchable recipe named {name!r}.",
                           "/console/recipes")
        except UNREADABLE as exc:
            return problem(request, session, 500, "Recipes do not load", str(exc), "/console/recipes")
        rejected = driver.submit(Apply(name, fresh_cache))
        if rejected is not None:
            return problem(request, session, status.HTTP_409_CONFLICT, "Not applied",
                           f"The controller refused: {rejected.reason}. Nothing was changed: the current "
                           "engine keeps its state.")
        return _secure(RedirectResponse("/console/?notice=applied", status.HTTP_303_SEE_OTHER))

    # -- Launches

    @router.get("/launches")
    async def launches(request: Request) -> Response:
        session = current(request)
        rows = await asyncio.to_thread(data.launch_rows)
        return page(request, "launches.html", session, rows=rows)

    @router.get("/launches/{launch_id}")
    async def launch(request: Request, launch_id: str) -> Response:
        session = current(request)
        view = await asyncio.to_thread(data.launch_view, launch_id)
        if view is None:
            return problem(request, session, 404, "Unknown launch", f"No launch {launch_id!r}.",
                           "/console/launches")
        benches = await asyncio.to_thread(bench.for_launch, launch_id)
        return page(request, "launch.html", session, launch=view, benches=benches)

    def log_tail(launch_id: str) -> tuple[str, int, bool]:
        """The end of the launch's log (the API's data path, keys redacted), its end offset, and
        whether the start was cut off (longer than LOG_TAIL_CHARS, or than LOG_MAX_CHUNKS reads)."""
        tail, offset, cut = "", 0, False
        for _ in range(LOG_MAX_CHUNKS):
            text, next_offset = read_launch_log(ctx, launch_id, offset)
            if next_offset == offset or not text:
                break
            tail += text
            if len(tail) > LOG_TAIL_CHARS:
                tail, cut = tail[-LOG_TAIL_CHARS:], True
            offset = next_offset
        else:
            cut = True
        return tail, offset, cut

    @router.get("/launches/{launch_id}/log")
    async def launch_log(request: Request, launch_id: str) -> Response:
        session = current(request)
        record = await asyncio.to_thread(ctx.store.get_launch, launch_id)
        if record is None:
            return problem(request, session, 404, "Unknown launch", f"No launch {launch_id!r}.",
                           "/console/launches")
        try:
            text, offset, cut = await asyncio.to_thread(log_tail, launch_id)
        except LogUnavailable as exc:
            return page(request, "log.html", session, exc.code, r=record, text="", offset=0, cut=False,
                        error=f"The engine log cannot be read: {exc}",
                        stored_tail=record.log_tail, live=False)
        live = driver.machine.launch is not None and driver.machine.launch.launch_id == launch_id
        return page(request, "log.html", session, r=record, text=text, offset=offset, cut=cut,
                    stored_tail=record.log_tail if not text else None, live=live)

    @router.get("/launches/{launch_id}/log.txt")
    async def launch_log_text(request: Request, launch_id: str, offset: int = 0) -> Response:
        """What the log page's follow mode polls: text from `offset`, `X-Next-Offset` where to go on."""
        session, _ = sessions.lookup(request.cookies.get(COOKIE))
        if session is None:
            return _secure(Response("log in first", status.HTTP_401_UNAUTHORIZED, media_type="text/plain"))
        try:
            text, next_offset = await asyncio.to_thread(read_launch_log, ctx, launch_id, max(0, offset))
        except LogUnavailable as exc:
            return _secure(Response(str(exc), exc.code, media_type="text/plain"))
        return _secure(Response(text, media_type="text/plain; charset=utf-8",
                                headers={"X-Next-Offset": str(next_offset)}))

    # -- Stop / Restart (the same confirm + CSRF discipline as Apply)

    engine_actions: dict[str, tuple[type[Stop] | type[Restart], str, str]] = {
        "stop": (Stop, "stopping", "Not stopped"), "restart": (Restart, "restarting", "Not restarted")}

    @router.get("/engine/{action}")
    async def engine_confirm(request: Request, action: str) -> Response:
        session = current(request)
        if action not in engine_actions:
            return not_found(request)
        return page(request, "engine_action.html", session, action=action, status=driver.status(),
                    launch=driver.machine.launch.launch_id if driver.machine.launch else None)

    @router.post("/engine/{action}")
    async def engine_action(request: Request, action: str) -> Response:
        session, form = await session_form(request)
        if isinstance(form, Response):
            return form
        if action not in engine_actions:
            return not_found(request)
        signal, notice, refused = engine_actions[action]
        rejected = driver.submit(signal())
        if rejected is not None:
            return problem(request, session, status.HTTP_409_CONFLICT, refused,
                           f"The controller refused: {rejected.reason}. Nothing was changed.")
        return _secure(RedirectResponse(f"/console/?notice={notice}", status.HTTP_303_SEE_OTHER))

    # -- Benchmarks (read-only: `appliance bench | compare` write them)

    @router.get("/benchmarks")
    async def benchmarks(request: Request) -> Response:
        session = current(request)
        view = await asyncio.to_thread(bench.index_view)
        return page(request, "benchmarks.html", session, view=view)

    @router.get("/comparisons/{comparison_id}")
    async def comparison(request: Request, comparison_id: str) -> Response:
        session = current(request)
        try:
            view = await asyncio.to_thread(bench.comparison_view, comparison_id)
        except ValueError as exc:  # pydantic's ValidationError: a row this version cannot read
            return problem(request, session, 500, "Comparison unreadable",
                           f"Comparison {comparison_id!r} is stored but does not load: {exc}",
                           "/console/benchmarks")
        if view is None:
            return problem(request, session, 404, "Unknown comparison", f"No comparison {comparison_id!r}.",
                           "/console/benchmarks")
        return page(request, "comparison.html", session, cmp=view)

    @router.get("/benchmarks/{bench_id}")
    async def benchmark(request: Request, bench_id: str) -> Response:
        session = current(request)
        try:
            view = await asyncio.to_thread(bench.bench_view, bench_id)
        except ValueError as exc:  # pydantic's ValidationError: a row this version cannot read
            return problem(request, session, 500, "Benchmark unreadable",
                           f"Benchmark {bench_id!r} is stored but does not load: {exc}",
                           "/console/benchmarks")
        if view is None:
            return problem(request, session, 404, "Unknown benchmark", f"No benchmark {bench_id!r}.",
                           "/console/benchmarks")
        return page(request, "benchmark.html", session, bench=view)

    # -- Host memory

    @router.get("/memory")
    async def memory(request: Request, minutes: int = 60) -> Response:
        session = current(request)
        minutes = max(5, min(minutes, 6 * 60))
        view = await asyncio.to_thread(data.memory_view, minutes * 60.0)
        return page(request, "memory.html", session, memory=view, minutes=minutes,
                    gpu=gpu_health_view(preflight.gpu))

    # -- Keys

    def usage_of(rows: list[KeyRecord], request: Request) -> UsageView:
        try:
            days = int(request.query_params.get("days", "1"))
        except ValueError:
            days = 1
        return usage_view(keystore().path.with_name("usage.sqlite3"), rows, days)

    @router.get("/keys")
    async def keys(request: Request) -> Response:
        session = current(request)
        rows = await asyncio.to_thread(keystore().list, True)
        usage = await asyncio.to_thread(usage_of, rows, request)
        return page(request, "keys.html", session, keys=rows, created=None, usage=usage)

    @router.post("/keys")
    async def create_key(request: Request) -> Response:
        session, form = await session_form(request)
        if isinstance(form, Response):
            return form
        try:
            name = views.key_name(form.get("name", ""))
            rpm = views.optional_positive(form.get("rpm_limit", ""), "requests/min")
            conc = views.optional_positive(form.get("max_concurrent", ""), "max concurrent")
            tpm = optional_quota(form.get("tpm_limit", ""), "tpm_limit", "tokens/min")
            tpd = optional_quota(form.get("tpd_limit", ""), "tpd_limit", "tokens/day")
            record, key = await asyncio.to_thread(keystore().create, name, rpm, conc, tpm, tpd)
        except (KeyStoreError, ValueError) as exc:
            rows = await asyncio.to_thread(keystore().list, True)
            usage = await asyncio.to_thread(usage_of, rows, request)
            return page(request, "keys.html", session, 422, keys=rows, created=None, error=str(exc),
                        usage=usage)
        rows = await asyncio.to_thread(keystore().list, True)
        usage = await asyncio.to_thread(usage_of, rows, request)
        # The key itself, this once: it is not stored (only its hash) and no other page shows it.
        return page(request, "keys.html", session, 201, keys=rows, created={"record": record, "key": key},
                    usage=usage)

    @router.post("/keys/{key_id}/revoke")
    async def revoke_key(request: Request, key_id: str) -> Response:
        session, form = await session_form(request)
        if isinstance(form, Response):
            return form
        try:
            await asyncio.to_thread(keystore().revoke, key_id)
        except KeyNotFound:
            return problem(request, session, 404, "Unknown key", "No such key; nothing was changed.",
                           "/console/keys")
        return _secure(RedirectResponse("/console/keys?notice=revoked", status.HTTP_303_SEE_OTHER))

    # Last: any other address under /console/ (registered after every page, so it never shadows one).
    @router.api_route("/{rest:path}", methods=["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"])
    async def unknown_page(request: Request, rest: str) -> Response:
        return not_found(request)

    return router
