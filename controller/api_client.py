"""The controller API's HTTP client: JSON calls with the admin token, and its one error type.

Below both the CLI (controller/cli/) and the evaluation's controls (controller/evaluation/controls.py),
which drive a running controller over HTTP; it imports neither.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import Any

from appliance import settings
from controller.admin_token import TOKEN_ENV
from controller.settings import CONTROLLER_PORT, Paths, default_home

DEFAULT_API = f"http://127.0.0.1:{CONTROLLER_PORT}"
API_ENV = "APPLIANCE_API"


def api_url(explicit: str | None = None) -> str:
    """`--api`, else $APPLIANCE_API, else the controller `appliance up` started for this
    APPLIANCE_HOME (`up --port 8091` is remembered), else the default port."""
    return (explicit or settings.current().api or remembered_api() or DEFAULT_API).rstrip("/")


def remembered_api(home: Path | None = None) -> str | None:
    """The URL `remember_api` wrote under APPLIANCE_HOME; None when there is none (or it is unreadable)."""
    try:
        text = Paths(home or default_home()).api_file.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text if text.startswith(("http://", "https://")) and "\n" not in text else None


def remember_api(home: Path, url: str) -> None:
    path = Paths(home).api_file
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(url + "\n")


def forget_api(home: Path) -> None:
    Paths(home).api_file.unlink(missing_ok=True)


class ApiError(Exception):
    """`str(exc)` is the controller's detail in words (the HTTP status's phrase when it gave none);
    the status stays on `exc.status` for exit codes and for callers that branch on it."""

    def __init__(self, status: int | None, detail: str) -> None:
        super().__init__(detail.strip() or _phrase(status))
        self.status = status
        self.detail = detail


def _phrase(status: int | None) -> str:
    try:
        return HTTPStatus(status).phrase.lower() if status is not None else "no answer"
    except ValueError:
        return f"an answer the client does not know (HTTP {status})"


def detail_words(detail: Any) -> str:
    """An error detail as a sentence: FastAPI's validation errors (a list of {loc, msg, ...}) become
    `limit: Input should be greater than or equal to 1`, not the raw JSON they arrive as."""
    if isinstance(detail, str):
        return detail
    if isinstance(detail, list) and detail and all(isinstance(d, dict) and "msg" in d for d in detail):
        return "; ".join(_one_error(d) for d in detail)
    return json.dumps(detail)


def _one_error(error: dict[str, Any]) -> str:
    # `loc` starts with where the value came from (query, body, path): the name after it is what a
    # reader typed, as an option or a field.
    where = [str(x) for x in error.get("loc") or () if x not in ("query", "body", "path")]
    return f"{'.'.join(where)}: {error['msg']}" if where else str(error["msg"])


def unreachable(base: str, exc: BaseException) -> str:
    """Why the controller at `base` did not answer; a refused connection means none is listening."""
    reason = getattr(exc, "reason", exc)
    text = f"cannot reach the controller at {base}: {reason}"
    if isinstance(reason, ConnectionRefusedError):
        text += "; is the controller running? `appliance up` starts it"
    return text


@dataclass
class Client:
    base: str
    token: str | None = field(default_factory=lambda: settings.current().admin_token)
    timeout_s: float = 30.0

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None,
                 auth: bool = False) -> tuple[bytes, dict[str, str]]:
        headers = {"Content-Type": "application/json"}
        if auth:
            if not self.token:
                raise ApiError(None, f"needs the admin token in ${TOKEN_ENV} (`appliance up` shows it once)")
            headers["Authorization"] = f"Bearer {self.token}"
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                # Lower-case names: HTTP header names are case-insensitive and uvicorn sends them
                # lower-case (`dict(resp.headers)` kept the wire's case, so `X-Next-Offset` was never
                # found and `logs -f` printed the whole log again every second).
                return resp.read(), {k.lower(): v for k, v in resp.headers.items()}
        except urllib.error.HTTPError as exc:
            raw = exc.read().decode(errors="replace")
            try:
                detail = json.loads(raw).get("detail", raw)
            except (ValueError, AttributeError):
                detail = raw
            raise ApiError(exc.code, detail_words(detail)) from exc
        except (urllib.error.URLError, OSError) as exc:
            raise ApiError(None, unreachable(self.base, exc)) from exc

    def get(self, path: str) -> Any:
        return json.loads(self._request("GET", path)[0])

    def post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        return json.loads(self._request("POST", path, body, auth=True)[0])

    def text(self, path: str) -> tuple[str, dict[str, str]]:
        """A text resource: the engine log, which is admin-only (it holds clients' request lines)."""
        raw, headers = self._request("GET", path, auth=True)
        return raw.decode(errors="replace"), headers

    def alive(self) -> bool:
        """A controller answers on this port. Any HTTP answer counts: /healthz is 503 while the
        controller's supervision has stalled, and that controller is still there — `up` must not
        start a second one on its port, and `down` must still ask it to stop the engine."""
        try:
            self.get("/healthz")
        except ApiError as exc:
            return exc.status is not None
        return True
