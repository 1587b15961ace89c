"""What every console page shares: the security headers, the bounded form reader, and `Pages`, the
page/problem/session helpers each area's routes (login.py, now.py, recipes.py, ...) are built on."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from fastapi import HTTPException, Request, status
from fastapi.responses import Response
from fastapi.templating import Jinja2Templates

from appliance.recipe.recipe_loader import RecipeError
from controller.api_context import ApiContext
from controller.console import views
from controller.console.auth import COOKIE, LoginThrottle, Session, Sessions
from controller.console.bench_views import BenchData
from controller.console.choice_views import ChoiceData
from controller.evaluation.choices import Choices
from controller.gateway.keystore import KeyStore
from controller.settings import Paths
from host_setup.facts import HostFactsError

CONSOLE_DIR = Path(__file__).resolve().parents[1]  # controller/console/: templates/ and static/
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
# Fixed notices selected by a code in the redirect's query string: nothing a link can inject.
NOTICES = {
    "applied": "Apply accepted: the preflight runs, then the engine drains and switches. Watch it below.",
    "revoked": "Key revoked: the gateway refuses it within about a second.",
    "limits": "Limits saved: the gateway applies them within about a second.",
    "stopping": "Stop accepted: the gateway drains the engine, then it stops; the controller stays idle.",
    "restarting": "Restart accepted: the preflight runs again, then the engine (re)starts. Watch it below.",
    "logged-out": "Logged out.",
}


def secure(response: Response) -> Response:
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


def console_templates() -> Jinja2Templates:
    templates = Jinja2Templates(directory=str(CONSOLE_DIR / "templates"))
    templates.env.filters.update(views.FILTERS)
    return templates


@dataclass
class Pages:
    """One console's shared state (built once by `console_router`) and the helpers every page uses."""

    ctx: ApiContext
    sessions: Sessions
    throttle: LoginThrottle
    templates: Jinja2Templates
    data: views.ConsoleData
    bench: BenchData
    choices: Choices  # the one create_app shares with the admin API: a choice started here is the same
    choice_data: ChoiceData

    def keystore(self) -> KeyStore:
        return KeyStore(Paths(self.ctx.home).keys_db)

    def page(self, request: Request, template: str, session: Session | None, code: int = 200,
             **context: Any) -> Response:
        notice = NOTICES.get(request.query_params.get("notice", ""))
        response = self.templates.TemplateResponse(
            request, template, {"session": session, "notice": notice, **context}, status_code=code
        )
        return secure(response)

    def problem(self, request: Request, session: Session | None, code: int, title: str, message: str,
                back: str = "/console/") -> Response:
        return self.page(request, "message.html", session, code, title=title, message=message, back=back)

    def current(self, request: Request) -> Session:
        """The request's session, or a redirect to the log-in page that says why."""
        session, why = self.sessions.lookup(request.cookies.get(COOKIE))
        if session is None:
            target = "/console/login?next=" + quote(request.url.path, safe="/")
            if why:
                target += "&why=" + quote(why)
            raise HTTPException(status.HTTP_303_SEE_OTHER, headers={"Location": target, **SECURITY_HEADERS})
        return session

    async def session_form(self, request: Request) -> tuple[Session, dict[str, str] | Response]:
        """Session first (redirect to log in), then the small form, then its CSRF token."""
        session = self.current(request)
        try:
            form = await read_form(request)
        except FormRefused as exc:
            return session, self.problem(request, session, exc.code, "Form refused",
                                         f"{exc}; nothing was changed.")
        if self.sessions.csrf_ok(session, form.get("csrf")):
            return session, form
        return session, self.problem(
            request, session, status.HTTP_403_FORBIDDEN, "Form expired or forged",
            "This form's security token does not match your session, so nothing was changed. "
            "Reload the page and submit it again.")

    def not_found(self, request: Request) -> Response:
        # A page with the same security headers as every other (FastAPI's own 404 had none).
        return self.problem(request, None, status.HTTP_404_NOT_FOUND, "Not found",
                            "There is no console page here.")
