"""The Now page (state, phase, live progress, expectations, gateway, GPU health, the Try it box) and its
event stream."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request, status
from fastapi.responses import Response, StreamingResponse

from controller.api_context import load_view
from controller.console import try_it, views
from controller.console.auth import COOKIE, Session
from controller.console.gpu_views import gpu_health_view
from controller.console.load_views import load_panel
from controller.console.routes.pages import Pages, secure

STATUS_EVERY_S = 1.0  # the progress bar is time-based: a snapshot a second moves it without events


def register(router: APIRouter, pages: Pages) -> None:
    page, current, sessions, data = pages.page, pages.current, pages.sessions, pages.data
    session_form = pages.session_form
    driver, preflight = pages.ctx.driver, pages.ctx.preflight

    async def now_page(request: Request, session: Session, *, code: int = 200, **extra: object) -> Response:
        snapshot = driver.status()
        expectations = await asyncio.to_thread(data.expectations, snapshot.get("recipe"))
        gateway = await data.gateway()
        memory = await asyncio.to_thread(data.host_now, snapshot.get("recipe"))
        live = views.live_view(snapshot, memory)
        gpu = gpu_health_view(preflight.gpu)
        load = load_view(pages.ctx, driver.clock.now())
        launch = snapshot.get("launch") or {}
        context: dict[str, Any] = {"model": launch.get("served_model_name") or "", "prompt": "",
                                   "result": None,
                                   "gateway_url": pages.ctx.gateway_client_url,
                                   "max_tokens": try_it.MAX_TOKENS, **extra}
        # The engines started beside the primary (engine_set.py), each with its Stop and Restart.
        beside = [e for e in pages.ctx.engine_set.entries() if not e["primary"]]
        return page(request, "now.html", session, code, status=snapshot, expect=expectations, gateway=gateway,
                    status_json=json.dumps(live), live=live, gpu=gpu, load=load, panel=load_panel(load),
                    try_it=context, beside=beside)

    @router.get("/")
    async def now(request: Request) -> Response:
        return await now_page(request, current(request))

    @router.post("/try")
    async def try_it_submit(request: Request) -> Response:
        """One completion through the gateway with the pasted key (CSRF first, as every console form).
        The key is neither kept, logged nor put back into the page (only its "sk-…last4")."""
        session, form = await session_form(request)
        if isinstance(form, Response):
            return form
        key, model = form.get("key", "").strip(), form.get("model", "").strip()
        prompt = form.get("prompt", "").strip()[:try_it.MAX_PROMPT_CHARS]
        gateway_url = pages.ctx.gateway_client_url
        if gateway_url is None:
            return await now_page(request, session, code=status.HTTP_409_CONFLICT, model=model,
                                  prompt=prompt, problem=(
                                      "This controller was not told the gateway's client address (`appliance "
                                      "serve --gateway-client-url`), so it cannot try one."))
        if not key or not model or not prompt:
            return await now_page(request, session, code=status.HTTP_422_UNPROCESSABLE_CONTENT,
                                  model=model, prompt=prompt,
                                  problem="A key, a model and a prompt are all needed.")
        result = await try_it.try_completion(gateway_url, key, model, prompt)
        return await now_page(request, session, model=model, prompt=prompt, result=result)

    @router.get("/load")
    async def load_fragment(request: Request) -> Response:
        """The load panel alone: console.js redraws the Now page's panel from it every sample."""
        session, _ = sessions.lookup(request.cookies.get(COOKIE))
        if session is None:
            return secure(Response("log in first", status.HTTP_401_UNAUTHORIZED, media_type="text/plain"))
        return page(request, "_load.html", session,
                    panel=load_panel(load_view(pages.ctx, driver.clock.now())))

    @router.get("/events")
    async def events(request: Request) -> Response:
        session, _ = sessions.lookup(request.cookies.get(COOKIE))
        if session is None:
            return secure(Response("log in first", status.HTTP_401_UNAUTHORIZED, media_type="text/plain"))

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
        return secure(response)
