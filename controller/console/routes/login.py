"""The console's static files, log-in and log-out: the pages reachable without a session."""

from __future__ import annotations

import logging

from fastapi import APIRouter, Request, status
from fastapi.responses import FileResponse, RedirectResponse, Response

from controller.console import views
from controller.console.auth import COOKIE, COOKIE_PATH, LoginError
from controller.console.routes.pages import CONSOLE_DIR, STATIC_FILES, FormRefused, Pages, read_form, secure

# The name it had before the console's routes were split by area: log lines and filters keep it.
log = logging.getLogger("controller.console.routes")


def register(router: APIRouter, pages: Pages) -> None:
    page, not_found, session_form = pages.page, pages.not_found, pages.session_form
    sessions, throttle = pages.sessions, pages.throttle
    metrics = pages.ctx.driver.metrics

    @router.get("/static/{name}")
    async def static(request: Request, name: str) -> Response:
        media = STATIC_FILES.get(name)
        if media is None:
            return not_found(request)
        response = FileResponse(CONSOLE_DIR / "static" / name, media_type=media)
        response.headers["Cache-Control"] = "no-cache"
        return secure(response)

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
        return secure(response)

    @router.post("/logout")
    async def logout(request: Request) -> Response:
        session, form = await session_form(request)
        if isinstance(form, Response):
            return form
        sessions.logout(session)
        response = RedirectResponse("/console/login?notice=logged-out", status.HTTP_303_SEE_OTHER)
        response.delete_cookie(COOKIE, path=COOKIE_PATH, httponly=True, samesite="strict")
        return secure(response)
