"""The controller's gateway client names its engine slot (controller/gateway/control.py
`ControlGateway(engine=...)`): an engine started beside the primary talks to its own slot on every
call, the primary's link names none (the gateway's `default`, as before). A stand-in admin surface
records what arrives."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web

from controller.gateway.control import ControlGateway
from controller.gateway.hold.queue import HoldPlan

UPSTREAM = {"url": "http://127.0.0.1:8001", "served_model": "smollm2-b", "generation": 1}
DRAINED = {"upstream": UPSTREAM, "drained": True, "aborted": 0, "remaining": 0, "waited_s": 0.0}


@asynccontextmanager
async def admin_surface(missing: bool = False) -> AsyncIterator[tuple[str, list[tuple[str, str, Any]]]]:
    """(its URL, what arrived: method, query string, JSON body). `missing`: GET answers 404."""
    seen: list[tuple[str, str, Any]] = []

    async def handle(request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else None
        seen.append((request.method, request.query_string, body))
        if request.method == "GET":
            if missing:
                return web.json_response({"error": "no such engine"}, status=404)
            return web.json_response({"upstream": UPSTREAM, "in_flight": 0})
        if request.path == "/admin/hold":
            return web.json_response({"hold": {"waiting": 2}})
        return web.json_response(DRAINED)

    app = web.Application()
    app.router.add_route("*", "/admin/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        await runner.cleanup()


async def test_a_named_link_names_its_engine_on_every_call() -> None:
    async with admin_surface() as (url, seen):
        link = ControlGateway(url, "tok", engine="smollm2-b")
        await link.point_to("http://127.0.0.1:8001", "smollm2-b", "key")
        await link.switch("http://127.0.0.1:8001", "smollm2-b", "key", 1.0)
        await link.drain(1.0, 5.0)
        await link.clear(5.0, detail="stopped")
        await link.renew_hold(HoldPlan("restart", 30.0, 20.0))
        current = await link.current()
        await link.remove()
    bodies = [body for method, _, body in seen if method in ("PUT", "POST")]
    assert len(bodies) == 5 and all(b["engine"] == "smollm2-b" for b in bodies)
    queries = [(method, query) for method, query, _ in seen if method in ("GET", "DELETE")]
    assert queries == [("GET", "engine=smollm2-b"), ("DELETE", "engine=smollm2-b&drain_deadline_s=0.0")]
    assert current is not None and current.served_model == "smollm2-b"


async def test_the_primary_link_names_no_engine_and_never_removes_the_default_slot() -> None:
    async with admin_surface() as (url, seen):
        link = ControlGateway(url, "tok")
        await link.point_to("http://127.0.0.1:8000", "smollm2", "key")
        await link.current()
        await link.remove()
    assert [(method, query) for method, query, _ in seen] == [("PUT", ""), ("GET", "")]
    assert "engine" not in seen[0][2]


async def test_a_named_slot_the_gateway_lost_reads_as_no_upstream() -> None:
    # A gateway restarted under the controller has no such slot (404): the link answers "none", so the
    # driver's periodic check sends the upstream again instead of saying the gateway is unreachable.
    async with admin_surface(missing=True) as (url, _):
        assert await ControlGateway(url, "tok", engine="smollm2-b").current() is None
