"""The admin API's guard (controller/api_guard.py): token before body, bounded bodies and values,
Host checked.

Requests are driven as raw ASGI calls where it matters how much of the body the app pulled: the
`receive` callable counts the chunks handed over, so "the body was never read" is an assertion,
not a guess from memory figures.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from controller import admin_token
from controller.api.app import AdminGuard, create_app
from controller.api.keys import keys_router
from controller.api_context import ApiContext
from controller.api_guard import HOSTS_ENV, MAX_BODY_BYTES, allowed_hosts
from controller.gateway.keystore import KeyStore
from tests.unit.test_api import AUTH, TOKEN, Rig

CHUNK = 64 * 1024


class Body:
    """An ASGI `receive` that serves `total` bytes in chunks and counts what was taken."""

    def __init__(self, total: int) -> None:
        self.left = total
        self.chunks_read = 0

    async def __call__(self) -> dict[str, Any]:
        if self.left <= 0:
            return {"type": "http.disconnect"}
        size = min(CHUNK, self.left)
        self.left -= size
        self.chunks_read += 1
        return {"type": "http.request", "body": b"{" + b" " * (size - 1), "more_body": self.left > 0}


async def raw(app: Any, method: str, path: str, body: Body, headers: dict[str, str],
              content_length: int | None) -> tuple[int, dict[str, str], bytes]:
    head = {"host": "127.0.0.1:8090", "content-type": "application/json", **headers}
    if content_length is not None:
        head["content-length"] = str(content_length)
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
             "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
             "root_path": "", "headers": [(k.encode(), v.encode()) for k, v in head.items()],
             "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8090)}
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, body, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    text = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], {k.decode(): v.decode() for k, v in start["headers"]}, text


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv(admin_token.HASH_ENV, raising=False)
    monkeypatch.delenv(HOSTS_ENV, raising=False)
    admin_token.write_hash(tmp_path, TOKEN)
    return tmp_path


@pytest.mark.parametrize("path", ["/apply", "/restart", "/recipes/cpu-smollm2/plan", "/keys"])
@pytest.mark.parametrize(("headers", "code"), [({}, 401), ({"authorization": "Bearer nope"}, 403),
                                               ({"authorization": "Basic dXNlcjpwdw=="}, 401)])
@pytest.mark.parametrize("declared", [True, False])
async def test_a_refused_token_is_decided_before_one_body_byte_is_read(
        home: Path, path: str, headers: dict[str, str], code: int, declared: bool) -> None:
    rig = Rig(home)
    app = create_app(ApiContext(rig.driver, rig.store, rig.preflight, home,
                                extra_routers=(keys_router(AdminGuard(home), KeyStore(home / "k.db")),)))
    size = 50 * 1024 * 1024  # the 50 MB body of the report
    body = Body(size)
    status, response_headers, _ = await raw(app, "POST", path, body, headers, size if declared else None)
    assert status == code
    assert body.chunks_read == 0
    if code == 401:
        assert response_headers["www-authenticate"] == "Bearer"


async def test_an_oversized_body_with_the_token_is_413_without_reading_it(home: Path) -> None:
    rig = Rig(home)
    body = Body(MAX_BODY_BYTES + 1)
    status, _, text = await raw(rig.app, "POST", "/apply", body, {"authorization": AUTH["Authorization"]},
                                MAX_BODY_BYTES + 1)
    assert (status, body.chunks_read) == (413, 0)
    assert b"larger than" in text


async def test_a_chunked_body_with_the_token_is_cut_off_at_the_limit(home: Path) -> None:
    rig = Rig(home)
    body = Body(50 * 1024 * 1024)
    status, _, _ = await raw(rig.app, "POST", "/apply", body, {"authorization": AUTH["Authorization"]}, None)
    assert status == 413
    assert body.chunks_read <= MAX_BODY_BYTES // CHUNK + 1  # stopped at the limit, not at 50 MB


async def test_a_small_body_with_the_token_still_works(home: Path) -> None:
    rig = Rig(home)
    transport = httpx.ASGITransport(app=rig.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8090") as c:
        r = await c.post("/apply", json={"recipe": "cpu-smollm2"}, headers=AUTH)
        assert r.status_code == 202
        r = await c.post("/apply", json={"recipe": "BAD NAME"}, headers=AUTH)
        assert r.status_code == 422


@pytest.mark.parametrize("host", ["127.0.0.1:8090", "localhost:8090", "[::1]:8090", "LOCALHOST", "127.0.0.1"])
async def test_loopback_host_headers_are_served(home: Path, host: str) -> None:
    rig = Rig(home)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=rig.app), base_url="http://x") as c:
        assert (await c.get("/status", headers={"host": host})).status_code == 200


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8090", "127.0.0.1.evil.example",
                                  "localhost.evil.example:8090", "10.0.0.5:8090"])
async def test_other_host_headers_are_refused_even_on_open_reads(home: Path, host: str) -> None:
    # DNS rebinding: a page on evil.example re-points its name at 127.0.0.1; the browser still
    # sends `Host: evil.example`, so the open GETs must not answer it.
    rig = Rig(home)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=rig.app), base_url="http://x") as c:
        for path in ("/status", "/recipes", "/launches", "/healthz"):
            assert (await c.get(path, headers={"host": host})).status_code == 400


async def test_configured_names_and_the_bound_address_are_served(
        home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(HOSTS_ENV, "appliance.lan, ops.example")
    rig = Rig(home)
    app = create_app(ApiContext(rig.driver, rig.store, rig.preflight, home, listen_host="10.0.0.5"))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://x") as c:
        for host in ("appliance.lan:8090", "ops.example", "10.0.0.5:8090"):
            assert (await c.get("/status", headers={"host": host})).status_code == 200, host
        assert (await c.get("/status", headers={"host": "10.0.0.6:8090"})).status_code == 400


def test_allowed_hosts_bracket_ipv6_and_skip_wildcards() -> None:
    assert allowed_hosts("0.0.0.0", environ={}) == ["127.0.0.1", "localhost", "[::1]"]
    assert allowed_hosts("fd00::5", environ={})[-1] == "[fd00::5]"
    assert allowed_hosts(None, ("A.lan",), environ={HOSTS_ENV: "b.lan"})[-2:] == ["a.lan", "b.lan"]


@pytest.mark.parametrize(("field", "value"), [("rpm_limit", 1e23), ("rpm_limit", 10**30),
                                              ("rpm_limit", 1_000_001), ("max_concurrent", 10**9),
                                              ("max_concurrent", 0), ("rpm_limit", -1)])
async def test_key_limits_out_of_range_are_422_naming_the_field(home: Path, field: str,
                                                                value: object) -> None:
    rig = Rig(home)
    app = create_app(ApiContext(rig.driver, rig.store, rig.preflight, home,
                                extra_routers=(keys_router(AdminGuard(home), KeyStore(home / "k.db")),)))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as c:
        r = await c.post("/keys", json={"name": "svc", field: value}, headers=AUTH)
        assert r.status_code == 422, r.text
        assert r.json()["detail"][0]["loc"][-1] == field
        ok = await c.post("/keys", json={"name": "svc", "rpm_limit": 1_000_000, "max_concurrent": 10_000},
                          headers=AUTH)
        assert ok.status_code == 201


async def test_open_recipe_listing_refuses_an_alias_bomb_instead_of_expanding_it(
        home: Path, tmp_path: Path) -> None:
    import shutil

    from tests.unit.recipe_helpers import RECIPES_DIR
    from tests.unit.test_recipe_loader import BILLION_LAUGHS

    recipes = tmp_path / "recipes"
    shutil.copytree(RECIPES_DIR, recipes)
    (recipes / "child.yaml").write_text(BILLION_LAUGHS.replace("extends: base", "extends: gfx906-base"))
    rig = Rig(home)
    rig.preflight.recipes_dir = recipes
    transport = httpx.ASGITransport(app=rig.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
        r = await c.get("/recipes")
    assert r.status_code == 500
    assert "yaml-alias" in r.json()["detail"]


# ---- issue 23 item 8: input no answer can carry back is a 4xx with a reason, not a 500 ------------


def _keys_app(home: Path) -> Any:
    rig = Rig(home)
    return create_app(ApiContext(rig.driver, rig.store, rig.preflight, home,
                                 extra_routers=(keys_router(AdminGuard(home), KeyStore(home / "k.db")),)))


JSON = {**AUTH, "content-type": "application/json"}


@pytest.mark.parametrize(("path", "body", "reason"), [
    ("/apply", b'{"recipe": "cpu-smollm2", "fresh_cache": 1e999}', "out of range"),
    ("/apply", b'{"recipe": "cpu-smollm2", "force": -1e999}', "out of range"),
    ("/apply", b'{"recipe": NaN}', "NaN"),
    ("/apply", b'{"recipe": "cpu-smollm2", "force": Infinity}', "Infinity"),
    ("/apply", b'{"recipe": "\\ud800"}', "surrogate"),
    ("/keys", b'{"name": "\\ud800"}', "surrogate"),
    ("/keys", b'{"name": "svc", "rpm_limit": NaN}', "NaN"),
    ("/keys", b'{"\\udfff": 1, "name": "svc"}', "surrogate"),
])
def test_unwritable_json_is_422_with_a_reason(home: Path, path: str, body: bytes, reason: str) -> None:
    from fastapi.testclient import TestClient

    # raise_server_exceptions (the default): a 500 would raise its traceback here
    with TestClient(_keys_app(home), base_url="http://127.0.0.1") as c:
        r = c.post(path, content=body, headers=JSON)
        assert r.status_code == 422, r.text
        assert r.json()["detail"][0]["loc"] == ["body"] and reason in r.json()["detail"][0]["msg"]
        # nothing was created on the way
        assert c.get("/keys", headers=AUTH).json() == []
        # ordinary bodies still pass through the check
        ok = c.post("/keys", content=b'{"name": "svc \\u00e9 \\ud83d\\ude00"}', headers=JSON)  # a valid pair
        assert ok.status_code == 201 and ok.json()["name"] == "svc \u00e9 \U0001f600"


@pytest.mark.parametrize(("path", "param"), [("/events", "after"), ("/launches/x/log", "offset")])
def test_numbers_past_sqlite_integers_are_422(home: Path, path: str, param: str) -> None:
    from fastapi.testclient import TestClient

    with TestClient(_keys_app(home), base_url="http://127.0.0.1") as c:
        r = c.get(path, params={param: "99999999999999999999999"}, headers=AUTH)  # the log is admin-only
        assert r.status_code == 422, r.text
        assert r.json()["detail"][0]["loc"] == ["query", param]
        assert "less than or equal to 9223372036854775807" in r.json()["detail"][0]["msg"]


async def test_the_422_handler_never_echoes_unwritable_input() -> None:
    from fastapi.exceptions import RequestValidationError

    from controller.api_guard import validation_error

    exc = RequestValidationError([
        {"type": "bool_parsing", "loc": ("body", "force"), "msg": "Input should be a valid boolean",
         "input": float("nan")},
        {"type": "string_type", "loc": ("body", "name\ud800"), "msg": "bad \udc00", "input": "x\ud800"},
        {"type": "int_type", "loc": ("query", "n"), "msg": "Input should be a valid integer", "input": "abc"},
    ])
    response = await validation_error(None, exc)  # type: ignore[arg-type]
    assert response.status_code == 422
    detail = __import__("json").loads(response.body)["detail"]
    assert "input" not in detail[0] and "input" not in detail[1]
    assert detail[1]["loc"] == ["body", "name\\ud800"] and detail[1]["msg"] == "bad \\udc00"
    assert detail[2]["input"] == "abc" and detail[2]["msg"] == "Input should be a valid integer"
