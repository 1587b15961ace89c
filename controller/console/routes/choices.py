"""The Choices pages: the decision records of `appliance choose`, one record with its table and charts,
"Start a choice" (a form, then a confirm page showing the plan and its ETA from history, then the
submit with its CSRF token) and "Promote" (a confirm page, then the submit with its CSRF token; a
champion whose gate was ACCEPT-PENDING-FULL is refused with the reason) — the confirm + CSRF
discipline of Apply (recipes.py)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request, status
from fastapi.responses import RedirectResponse, Response
from pydantic import ValidationError

from appliance.evaluation.sweep import parse_sweep
from appliance.evaluation.tournament import ChoiceInputError, budget_note
from controller.console.choice_views import eta_source, plan_rows
from controller.console.routes.pages import UNREADABLE, Pages, secure
from controller.evaluation.choices import BesideRefused, ChoiceBody, PromoteRefused
from controller.evaluation.choose import ChoiceBusy

FIELDS = ("recipes", "baseline", "budget", "sweep", "platform", "fast", "promote")


def body_of(form: dict[str, str]) -> ChoiceBody:
    """A choice's body from the console's form (ChoiceInputError, ValidationError: bad input)."""
    specs = [s for s in form.get("sweep", "").replace(";", " ").split() if s]
    return ChoiceBody.model_validate({
        "recipes": form.get("recipes", "").strip() or "*",
        "baseline": form.get("baseline", "").strip() or None,
        "budget": form.get("budget", "").strip() or None,
        "platform": form.get("platform", "").strip() or None,
        "sweep": parse_sweep(specs) if specs else None,
        "fast": form.get("fast") == "true",
        "promote": form.get("promote") == "true",
    })


def _bad(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        return "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
    return str(exc)


def register(router: APIRouter, pages: Pages) -> None:
    page, problem, current, session_form = pages.page, pages.problem, pages.current, pages.session_form
    choices, data = pages.choices, pages.choice_data

    @router.get("/choices")
    async def index(request: Request) -> Response:
        session = current(request)
        rows = await asyncio.to_thread(data.index_view)
        return page(request, "choices.html", session, rows=rows, running=choices.running())

    @router.get("/choices/new")
    async def new(request: Request) -> Response:
        """The form; with its fields in the query, the plan and its ETA under a confirm form (a plan
        claims and switches nothing, so it is a GET)."""
        session = current(request)
        form = {k: request.query_params.get(k, "") for k in FIELDS}
        planned = error = None
        if request.query_params.get("plan"):
            try:
                planned = await choices.plan(body_of(form))
            except (ChoiceInputError, ValidationError) as exc:
                error = _bad(exc)
            except UNREADABLE as exc:
                error = f"cannot plan: {exc}"
        return page(request, "choice_new.html", session, form=form, plan=planned, error=error,
                    rows=plan_rows(planned) if planned else [], running=choices.running(),
                    eta_source=eta_source(planned) if planned else "",
                    budget_note=budget_note(planned.eta_s, planned.budget_s) if planned else "",
                    code=status.HTTP_422_UNPROCESSABLE_CONTENT if error else 200)

    @router.post("/choices")
    async def start(request: Request) -> Response:
        session, form = await session_form(request)
        if isinstance(form, Response):
            return form
        try:
            record = await choices.start(body_of(form))
        except (ChoiceInputError, ValidationError) as exc:
            return problem(request, session, status.HTTP_422_UNPROCESSABLE_CONTENT, "Not started",
                           f"{_bad(exc)}. Nothing was started.", "/console/choices/new")
        except ChoiceBusy as exc:
            return problem(request, session, status.HTTP_409_CONFLICT, "Not started",
                           f"Choice {exc} is already running: one at a time. Nothing was started.",
                           "/console/choices")
        except BesideRefused as exc:
            return problem(request, session, status.HTTP_409_CONFLICT, "Not started",
                           f"{exc}. Nothing was started.", "/console/choices")
        return secure(RedirectResponse(f"/console/choices/{record.id}", status.HTTP_303_SEE_OTHER))

    @router.get("/choices/{choice_id}")
    async def choice(request: Request, choice_id: str) -> Response:
        session = current(request)
        try:
            view = await asyncio.to_thread(data.choice_view, choice_id)
        except ValueError as exc:  # pydantic's ValidationError: a record this version cannot read
            return problem(request, session, 500, "Choice unreadable",
                           f"Choice {choice_id!r} is stored but does not load: {exc}", "/console/choices")
        if view is None:
            return problem(request, session, 404, "Unknown choice", f"No choice {choice_id!r}.",
                           "/console/choices")
        return page(request, "choice.html", session, c=view)

    @router.get("/choices/{choice_id}/promote")
    async def promote_confirm(request: Request, choice_id: str) -> Response:
        session = current(request)
        view = await asyncio.to_thread(data.choice_view, choice_id)
        if view is None:
            return problem(request, session, 404, "Unknown choice", f"No choice {choice_id!r}.",
                           "/console/choices")
        r = view["r"]
        switch = pages.ctx.driver.switch_plan(r.champion, r.line(r.champion).spec_hash)
        return page(request, "choice_promote.html", session, c=view, status=pages.ctx.driver.status(),
                    switch=switch)

    @router.post("/choices/{choice_id}/promote")
    async def promote(request: Request, choice_id: str) -> Response:
        session, form = await session_form(request)
        if isinstance(form, Response):
            return form
        try:
            await choices.promote(choice_id, "the console")
        except LookupError:
            return problem(request, session, 404, "Unknown choice", f"No choice {choice_id!r}.",
                           "/console/choices")
        except PromoteRefused as exc:
            return problem(request, session, status.HTTP_409_CONFLICT, "Not promoted",
                           f"{exc}. Nothing was changed.", f"/console/choices/{choice_id}")
        return secure(RedirectResponse("/console/?notice=applied", status.HTTP_303_SEE_OTHER))
