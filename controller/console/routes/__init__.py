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
    GET  /console/choices[/{id}]        decision records of `appliance choose`; one with its table and charts
    GET  /console/choices/new[?plan=1]  "Start a choice": the form, then the plan and its ETA to confirm
    POST /console/choices               start it (CSRF); 409 page when one is running
    GET  /console/choices/{id}/promote  a confirm page; POST applies the champion (CSRF), refused with
                                        the reason for an ACCEPT-PENDING-FULL gate
    GET  /console/memory                host memory over time (controller/watch/history.py)
    GET  /console/keys, POST /console/keys, POST /console/keys/{id}/revoke
    GET  /console/events                server-sent status snapshots for the live progress bar
    GET  /console/static/{file}         console.js, console.css

One module per area (login.py, now.py, recipes.py, launches.py, engine.py, benchmarks.py,
choices.py, memory.py, keys.py), each with a `register(router, pages)`; pages.py holds what they share.

Every page needs a session (controller/console/auth.py): the pages show host details. The console
talks to the driver, store and preflight in process, never to the JSON API, so it does not depend
on how that API authenticates. Every response carries a strict Content-Security-Policy: scripts
and styles only from /console/static, no inline script, no inline style, no framing.
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import APIRouter, Request
from fastapi.responses import Response

from controller.api_context import ApiContext
from controller.console import views
from controller.console.auth import LoginThrottle, Sessions
from controller.console.bench_views import BenchData
from controller.console.choice_views import ChoiceData
from controller.console.routes import benchmarks, engine, keys, launches, login, memory, now, recipes
from controller.console.routes import choices as choice_pages
from controller.console.routes.pages import Pages, console_templates
from controller.evaluation.choices import Choices
from controller.evaluation.store import EvalStore
from controller.watch.history import HOST_HISTORY, HostHistory

# Registration order is the order FastAPI matches in: the catch-all below comes after all of these.
AREAS: tuple[Callable[[APIRouter, Pages], None], ...] = (
    login.register, now.register, recipes.register, launches.register, engine.register,
    benchmarks.register, choice_pages.register, memory.register, keys.register,
)


def console_router(ctx: ApiContext, sessions: Sessions | None = None,
                   history: HostHistory = HOST_HISTORY, evals: EvalStore | None = None,
                   throttle: LoginThrottle | None = None, choices: Choices | None = None) -> APIRouter:
    """`evals`: the EvalStore create_app shares with the evaluation API; mounted alone (tests), the
    console opens one on the launch store's file, where the evaluation tables live. `throttle`:
    the failed-log-in backoff (by default on the sessions' clock)."""
    router = APIRouter(prefix="/console", include_in_schema=False)
    sessions = sessions or Sessions(ctx.home)
    throttle = throttle or LoginThrottle(clock=sessions.clock)
    templates = console_templates()
    data = views.ConsoleData(ctx, history)
    evals = evals or EvalStore(ctx.store.path)
    bench = BenchData(evals)
    # `choices`: the one create_app shares with the admin API (mounted alone: one of the console's own).
    choices = choices or Choices(ctx.driver, ctx.store, ctx.preflight, evals)
    pages = Pages(ctx, sessions, throttle, templates, data, bench, choices,
                  ChoiceData(choices.records, evals))
    for register in AREAS:
        register(router, pages)

    # Last: any other address under /console/ (registered after every page, so it never shadows one).
    @router.api_route("/{rest:path}", methods=["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"])
    async def unknown_page(request: Request, rest: str) -> Response:
        return pages.not_found(request)

    return router
