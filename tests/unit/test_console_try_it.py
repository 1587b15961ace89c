"""The Now page's Try it box (controller/console/try_it.py, routes/now.py): one completion through a
fake gateway on a free port — success, 401, 404 model_not_found, 503 while starting, no gateway at all —
with the CSRF check of every console form, and the pasted key never in the page or the logs.

The rig is test_console.py's (the real controller app over test_api.py's fakes).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvloop
from aiohttp import web

from controller.api.app import create_app
from controller.api_context import ApiContext
from controller.console import try_it
from tests.unit import test_console as _console
from tests.unit.test_api import Rig
from tests.unit.test_console import _form_token, login

home, rig = _console.home, _console.rig

GOOD = "sk-app-0123456789ab-goodsecretgoodsecretWXYZ"
STARTING = "sk-app-0123456789ab-startingstartingstart9876"
WRONG = "sk-app-0123456789ab-wrongwrongwrongwrongwr1234"
MODEL = "smollm2"
SECRETS = (GOOD, STARTING, WRONG, GOOD.rsplit("-", 1)[1], WRONG.rsplit("-", 1)[1])


def _error(status: int, message: str, type_: str) -> web.Response:
    # The gateway's own error object (controller/gateway/asgi.py error_body).
    return web.json_response({"error": {"message": message, "type": type_, "code": status}}, status=status)


async def _completions(request: web.Request) -> web.Response:
    body = await request.json()
    auth = request.headers.get("Authorization", "")
    if body.get("max_tokens") != try_it.MAX_TOKENS:
        return _error(400, f"max_tokens {body.get('max_tokens')}", "invalid_request_error")
    if auth == f"Bearer {STARTING}":
        return _error(503, "the engine is starting: try again in a moment", "service_unavailable")
    if auth != f"Bearer {GOOD}":
        return _error(401, "invalid API key", "authentication_error")
    if body.get("model") != MODEL:
        return _error(404, f"The model `{body.get('model')}` does not exist.", "model_not_found")
    question = body["messages"][0]["content"]
    return web.json_response({"choices": [{"message": {"role": "assistant",
                                                       "content": f"Paris <{question}>"}}]})


async def _fake_gateway() -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", _completions)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}"


@pytest.fixture
async def gateway() -> AsyncIterator[str]:
    runner, url = await _fake_gateway()
    try:
        yield url
    finally:
        await runner.cleanup()


def _client(rig: Rig, home: Path, gateway_url: str | None) -> httpx.AsyncClient:
    app = create_app(ApiContext(rig.driver, rig.store, rig.preflight, home, "cpu-smollm2",
                                gateway_client_url=gateway_url))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1")


async def _try(c: httpx.AsyncClient, key: str, model: str = MODEL, csrf: bool = True) -> httpx.Response:
    form = {"key": key, "model": model, "prompt": "capital of France?"}
    if csrf:
        form["csrf"] = _form_token((await c.get("/console/")).text, "csrf")
    return await c.post("/console/try", data=form)


def _no_secret_in(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text


async def test_try_it_answers_and_says_the_gateways_errors_without_showing_the_key(
        rig: Rig, home: Path, gateway: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    async with _client(rig, home, gateway) as c:
        await login(c)
        page = (await c.get("/console/")).text
        assert 'action="/console/try"' in page and 'name="csrf"' in page
        assert 'type="password" name="key"' in page
        assert gateway in page

        ok = await _try(c, GOOD)
        assert ok.status_code == 200
        assert 'id="try-status">200<' in ok.text and "Paris &lt;capital of France?&gt;" in ok.text
        assert 'id="try-ttfb">' in ok.text and " ms<" in ok.text
        assert 'id="try-key-used">sk-…WXYZ<' in ok.text
        _no_secret_in(ok.text)

        wrong = await _try(c, WRONG)
        assert 'id="try-status">401<' in wrong.text and 'id="try-error">invalid API key<' in wrong.text
        assert 'id="try-key-used">sk-…1234<' in wrong.text
        _no_secret_in(wrong.text)

        missing = await _try(c, GOOD, model="nope")
        assert 'id="try-status">404<' in missing.text and "The model `nope` does not exist." in missing.text

        starting = await _try(c, STARTING)
        assert 'id="try-status">503<' in starting.text
        assert "the engine is starting: try again in a moment" in starting.text
        _no_secret_in(starting.text)
    for record in caplog.records:
        _no_secret_in(record.getMessage())


async def test_try_it_without_the_csrf_token_is_refused_and_sends_nothing(
        rig: Rig, home: Path, gateway: str, monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[str] = []

    async def spy(*args: object, **kwargs: object) -> try_it.TryResult:
        sent.append("sent")
        return try_it.TryResult(200, 1.0, "x", None, "sk-…")

    monkeypatch.setattr(try_it, "try_completion", spy)
    async with _client(rig, home, gateway) as c:
        await login(c)
        r = await _try(c, GOOD, csrf=False)
        assert r.status_code == 403 and "Form expired or forged" in r.text
        r = await c.post("/console/try", data={"key": GOOD, "model": MODEL, "prompt": "p", "csrf": "forged"})
        assert r.status_code == 403
        _no_secret_in(r.text)
    assert sent == []


async def test_try_it_needs_a_session(rig: Rig, home: Path, gateway: str) -> None:
    async with _client(rig, home, gateway) as c:
        r = await c.post("/console/try", data={"key": GOOD, "model": MODEL, "prompt": "p"})
        assert r.status_code == 303 and "/console/login" in r.headers["location"]


async def test_try_it_says_when_the_controller_does_not_know_the_gateway(rig: Rig, home: Path) -> None:
    async with _client(rig, home, None) as c:
        await login(c)
        assert 'id="try-none"' in (await c.get("/console/")).text
        r = await _try(c, GOOD)
        assert r.status_code == 409 and "--gateway-client-url" in r.text
        _no_secret_in(r.text)


def _on_both_loops(case: Callable[[], Coroutine[Any, Any, None]], loop: str) -> None:
    """As tests/unit/test_upstream_client.py: once on asyncio's loop, once on uvloop."""
    (uvloop.run if loop == "uvloop" else asyncio.run)(case())


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_try_completion_results(loop: str) -> None:
    async def case() -> None:
        runner, url = await _fake_gateway()
        try:
            ok = await try_it.try_completion(url, GOOD, MODEL, "hi")
            assert (ok.status, ok.answer, ok.error, ok.key) == (200, "Paris <hi>", None, "sk-…WXYZ")
            assert ok.ttfb_ms is not None and ok.ttfb_ms >= 0
            bad = await try_it.try_completion(url, WRONG, MODEL, "hi")
            assert (bad.status, bad.answer, bad.error) == (401, None, "invalid API key")
        finally:
            await runner.cleanup()
        # Nothing listens there any more: said, not raised, and the key is not in the words.
        gone = await try_it.try_completion(url, GOOD, MODEL, "hi", timeout_s=5.0)
        assert gone.status is None and gone.error is not None and url in gone.error
        _no_secret_in(gone.error)

    _on_both_loops(case, loop)


@pytest.mark.parametrize(("key", "shown"), [
    (GOOD, "sk-…WXYZ"), ("sk-short", "sk-…"), ("abcdefghijklmnop", "…mnop"), ("", "…")])
def test_key_hint_shows_at_most_the_last_four(key: str, shown: str) -> None:
    assert try_it.key_hint(key) == shown


@pytest.mark.parametrize(("body", "message"), [
    (json.dumps({"error": {"message": "invalid API key", "code": 401}}).encode(), "invalid API key"),
    (b"<html>bad gateway</html>", "<html>bad gateway</html>"),
    (b"", "(empty answer)")])
def test_gateway_message(body: bytes, message: str) -> None:
    assert try_it.gateway_message(body) == message
