"""Stop and Restart of the engine: a confirm page, then the submit (the same confirm + CSRF discipline
as Apply); 409 when the controller refuses. `?model=M` (and the form's `model`): the engine started
beside the primary that serves M (controller/supervisor/engine_set.py); 404 for a model none serves."""

from __future__ import annotations

from fastapi import APIRouter, Request, status
from fastapi.responses import RedirectResponse, Response

from controller.console.routes.pages import Pages, secure
from controller.supervisor.signals import Restart, Stop


def register(router: APIRouter, pages: Pages) -> None:
    page, problem, current, session_form = pages.page, pages.problem, pages.current, pages.session_form
    not_found = pages.not_found
    driver, engines = pages.ctx.driver, pages.ctx.engine_set

    engine_actions: dict[str, tuple[type[Stop] | type[Restart], str, str]] = {
        "stop": (Stop, "stopping", "Not stopped"), "restart": (Restart, "restarting", "Not restarted")}

    @router.get("/engine/{action}")
    async def engine_confirm(request: Request, action: str) -> Response:
        session = current(request)
        if action not in engine_actions:
            return not_found(request)
        model = request.query_params.get("model")
        if model is not None:
            beside = engines.alongside.get(model)
            if beside is None:
                return not_found(request)
            launch = beside.view.launch
            return page(request, "engine_action.html", session, action=action, status=beside.status(),
                        launch=launch.launch_id if launch else None, switch=None, gateway=None, model=model)
        launch = driver.view.launch
        recipe = driver.view.recipe
        # The consequence, as Apply's confirm page says it: a restart's path, hold bound and the ready
        # time expected from this variant's history; a stop's 503s and the requests in flight now.
        switch = (driver.switch_plan(recipe, launch.spec.spec_hash if launch else None)
                  if action == "restart" and recipe is not None else None)
        gateway = await pages.data.gateway() if action == "stop" else None
        return page(request, "engine_action.html", session, action=action, status=driver.status(),
                    launch=launch.launch_id if launch else None, switch=switch, gateway=gateway)

    @router.post("/engine/{action}")
    async def engine_action(request: Request, action: str) -> Response:
        session, form = await session_form(request)
        if isinstance(form, Response):
            return form
        if action not in engine_actions:
            return not_found(request)
        signal, notice, refused = engine_actions[action]
        target = driver
        model = form.get("model")
        if model:
            beside = engines.alongside.get(model)
            if beside is None:
                return not_found(request)
            # An engine beside the primary restarts by draining first: no blue/green beside itself.
            target = beside
        if signal is Restart:
            # Blue/green only for the primary, alone or beside ready GPU engines
            # (engine_set.py `primary_blue_green`).
            rejected = target.submit(Restart(blue_green=not model and engines.primary_blue_green()))
        else:
            rejected = target.submit(signal())
        if rejected is not None:
            return problem(request, session, status.HTTP_409_CONFLICT, refused,
                           f"The controller refused: {rejected.reason}. Nothing was changed.")
        return secure(RedirectResponse(f"/console/?notice={notice}", status.HTTP_303_SEE_OTHER))
