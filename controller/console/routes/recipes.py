"""The recipes pages: the list with admission verdicts and a diff of two, one recipe's preflight plan,
and Apply (a confirm page, then the submit with its CSRF token; 409 when a start is in progress)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request, status
from fastapi.responses import RedirectResponse, Response

from appliance.recipe.render import RenderError
from controller.api_context import running_view
from controller.console import views
from controller.console.routes.pages import UNREADABLE, Pages, secure
from controller.supervisor.preflight import UnknownRecipe
from controller.supervisor.signals import Apply


def register(router: APIRouter, pages: Pages) -> None:
    page, problem, current, session_form = pages.page, pages.problem, pages.current, pages.session_form
    data = pages.data
    driver, preflight = pages.ctx.driver, pages.ctx.preflight

    @router.get("/recipes")
    async def recipes(request: Request, a: str = "", b: str = "", refused: str = "") -> Response:
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
        # Refused recipes are hidden unless asked for (most of the shipped ones are for other hosts); the
        # one serving now always shows.
        show_refused = refused == "shown"
        hidden = 0 if show_refused else sum(1 for r in rows if r["apply_refused"]
                                            and r["name"] != driver.view.recipe)
        shown = [r for r in rows if show_refused or not r["apply_refused"] or r["name"] == driver.view.recipe]
        return page(request, "recipes.html", session, rows=shown, names=names, a=a, b=b, diff=diff,
                    current=driver.view.recipe, hidden=hidden, show_refused=show_refused,
                    refused_count=sum(1 for r in rows if r["apply_refused"]))

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
        running = await asyncio.to_thread(running_view, pages.ctx, report)
        return page(request, template, session, report=views.plan_view(report, driver), name=name,
                    running=running)

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
        engines = pages.ctx.engine_set
        try:
            beside_why = await asyncio.to_thread(engines.judge_primary, name)
        except (*UNREADABLE, RenderError):
            beside_why = None  # the preflight says what is wrong with the recipe, as always
        if beside_why is not None:
            return problem(request, session, status.HTTP_409_CONFLICT, "Not applied",
                           f"The controller refused: {beside_why}. Nothing was changed.")
        rejected = driver.submit(Apply(name, fresh_cache, blue_green=engines.primary_blue_green()))
        if rejected is not None:
            return problem(request, session, status.HTTP_409_CONFLICT, "Not applied",
                           f"The controller refused: {rejected.reason}. Nothing was changed: the current "
                           "engine keeps its state.")
        return secure(RedirectResponse("/console/?notice=applied", status.HTTP_303_SEE_OTHER))
