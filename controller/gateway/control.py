"""The controller's one client for the gateway's admin surface: `ControlGateway` (the supervisor's
GatewayLink: point_to, drain, clear, current), over the calls below (the CLI and tests use them too).

    await set_upstream(gateway, token, "http://127.0.0.1:8000", "qwen3.8-27b")   # engine ready
    await set_upstream(gateway, token, None, None, drain_deadline_s=30)          # before a restart
    await drain(gateway, token, deadline_s=30)

Every call takes ``engine``: the gateway's named slot (``admin.py``); None names none, which the
gateway takes for ``"default"`` (``drain``: every engine).

``token`` is the admin token itself; the gateway was started with its sha256 in
``APPLIANCE_ADMIN_TOKEN_SHA256`` (``auth.hash_admin_token``).
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from controller.gateway.hold.queue import HoldPlan

# The admin calls wait for a drain, so their HTTP timeout is the drain deadline plus this margin.
_MARGIN_S = 10.0


class GatewayControlError(Exception):
    """The gateway refused or could not be reached; ``status`` is None when it was unreachable."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class SwitchResult:
    upstream: dict[str, Any] | None  # {"url", "served_model", "generation"} or None
    drained: bool
    aborted: int
    remaining: int
    waited_s: float


@dataclass(frozen=True)
class DrainResult:
    drained: bool
    aborted: int
    remaining: int
    waited_s: float


async def _call(
    gateway_url: str,
    admin_token: str,
    method: str,
    path: str,
    body: dict[str, Any] | None,
    wait_s: float,
    session: aiohttp.ClientSession | None,
) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {admin_token}"}
    timeout = aiohttp.ClientTimeout(total=wait_s + _MARGIN_S, sock_connect=5.0)
    own = session is None
    s = session or aiohttp.ClientSession()
    url = gateway_url.rstrip("/") + path
    try:
        async with s.request(method, url, json=body, headers=headers, timeout=timeout) as resp:
            text = await resp.text()
            if resp.status != 200:
                raise GatewayControlError(
                    f"gateway {method} {path} → {resp.status}: {text[:500]}", resp.status
                )
            data: dict[str, Any] = await resp.json(content_type=None)
            return data
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise GatewayControlError(f"gateway {url} unreachable: {exc!r}") from exc
    finally:
        if own:
            await s.close()


async def set_upstream(
    gateway_url: str,
    admin_token: str,
    url: str | None,
    served_model: str | None,
    drain_deadline_s: float = 30.0,
    retry_after_s: int | None = None,
    *,
    upstream_key: str | None = None,
    aliases: Sequence[str] = (),
    hold: HoldPlan | None = None,
    detail: str | None = None,
    engine: str | None = None,
    session: aiohttp.ClientSession | None = None,
) -> SwitchResult:
    """Point new requests at ``url`` (None: no engine; clients get 503 + Retry-After or queue) and
    return once requests on the previous upstream ended, or were aborted at the deadline.
    ``upstream_key``: the engine's own API key; the gateway sends it upstream as the bearer token
    (never the client's), and never shows it back (``GET /admin/upstream`` omits it)."""
    body: dict[str, Any] = {"url": url, "served_model": served_model, "drain_deadline_s": drain_deadline_s}
    if engine is not None:
        body["engine"] = engine
    if upstream_key is not None:
        body["api_key"] = upstream_key
    if aliases:
        body["aliases"] = list(aliases)
    if retry_after_s is not None:
        body["retry_after_s"] = retry_after_s
    if hold is not None:
        body["hold"] = _hold_body(hold)
    if detail is not None:
        body["detail"] = detail[:1000]
    data = await _call(gateway_url, admin_token, "PUT", "/admin/upstream", body, drain_deadline_s, session)
    return SwitchResult(
        upstream=data["upstream"],
        drained=data["drained"],
        aborted=data["aborted"],
        remaining=data["remaining"],
        waited_s=data["waited_s"],
    )


async def drain(
    gateway_url: str,
    admin_token: str,
    deadline_s: float = 30.0,
    abort: bool = False,
    *,
    engine: str | None = None,
    session: aiohttp.ClientSession | None = None,
) -> DrainResult:
    """Wait (up to ``deadline_s``) for every in-flight request (of ``engine``; None: of every
    engine); abort the rest if ``abort``."""
    body: dict[str, Any] = {"deadline_s": deadline_s, "abort": abort}
    if engine is not None:
        body["engine"] = engine
    data = await _call(gateway_url, admin_token, "POST", "/admin/drain", body, deadline_s, session)
    return DrainResult(
        drained=data["drained"],
        aborted=data["aborted"],
        remaining=data["remaining"],
        waited_s=data["waited_s"],
    )


def _hold_body(plan: HoldPlan) -> dict[str, Any]:
    return {"reason": plan.reason[:200], "wait_s": plan.wait_s, "expected_ready_s": plan.expected_ready_s}


async def renew_hold(
    gateway_url: str, admin_token: str, plan: HoldPlan, *, engine: str | None = None,
    session: aiohttp.ClientSession | None = None,
) -> dict[str, Any]:
    """A later estimate and a fresh lease for the hold (409 while an upstream is set)."""
    body = _hold_body(plan)
    if engine is not None:
        body["engine"] = engine
    return await _call(gateway_url, admin_token, "PUT", "/admin/hold", body, 0.0, session)


def _engine_query(engine: str | None, **more: str) -> str:
    params = {**({"engine": engine} if engine is not None else {}), **more}
    return "?" + urllib.parse.urlencode(params) if params else ""


async def get_upstream(
    gateway_url: str, admin_token: str, *, engine: str | None = None,
    session: aiohttp.ClientSession | None = None,
) -> dict[str, Any]:
    """That engine's slot; without ``engine``: the default's, plus ``"engines"``: every slot."""
    return await _call(gateway_url, admin_token, "GET", "/admin/upstream" + _engine_query(engine), None, 0.0,
                       session)


async def remove_engine(
    gateway_url: str, admin_token: str, engine: str, drain_deadline_s: float = 30.0, *,
    session: aiohttp.ClientSession | None = None,
) -> DrainResult:
    """Remove the engine's slot: its names answer 404 from then on; its requests drain (aborted at
    the deadline)."""
    query = _engine_query(engine, drain_deadline_s=str(drain_deadline_s))
    data = await _call(gateway_url, admin_token, "DELETE", "/admin/upstream" + query, None, drain_deadline_s,
                       session)
    return DrainResult(drained=data["drained"], aborted=data["aborted"], remaining=data["remaining"],
                       waited_s=data["waited_s"])


@dataclass(frozen=True)
class GatewayUpstream:
    """Where the gateway sends new requests."""

    url: str
    served_model: str | None
    aliases: frozenset[str] = frozenset()


class ControlGateway:
    """The real gateway, through its admin surface. `token` is the gateway's control token; `engine`:
    the named slot every call is about (None: the gateway's ``"default"``, the primary engine's; an
    engine started beside it names its own, its served model name)."""

    def __init__(self, url: str, token: str, engine: str | None = None) -> None:
        self.url = url
        self._token = token
        self.engine = engine

    async def point_to(
        self, url: str, served_model: str, api_key: str | None = None, aliases: Sequence[str] = ()
    ) -> None:
        await set_upstream(
            self.url, self._token, url, served_model, drain_deadline_s=0.0, upstream_key=api_key,
            aliases=aliases, engine=self.engine,
        )

    async def switch(
        self, url: str, served_model: str, api_key: str | None, deadline_s: float,
        aliases: Sequence[str] = (),
    ) -> DrainResult:
        """Blue/green: the new upstream at once; the previous one's requests drain (PUT /admin/upstream)."""
        result = await set_upstream(
            self.url, self._token, url, served_model, drain_deadline_s=deadline_s, upstream_key=api_key,
            aliases=aliases, engine=self.engine,
        )
        return DrainResult(result.drained, result.aborted, result.remaining, result.waited_s)

    async def drain(
        self, deadline_s: float, retry_after_s: float, hold: HoldPlan | None = None
    ) -> DrainResult:
        result = await set_upstream(
            self.url, self._token, None, None, drain_deadline_s=deadline_s,
            retry_after_s=_secs(retry_after_s), hold=hold, engine=self.engine,
        )
        return DrainResult(result.drained, result.aborted, result.remaining, result.waited_s)

    async def clear(
        self, retry_after_s: float, hold: HoldPlan | None = None, detail: str | None = None
    ) -> None:
        await set_upstream(
            self.url, self._token, None, None, drain_deadline_s=0.0, retry_after_s=_secs(retry_after_s),
            hold=hold, detail=detail, engine=self.engine,
        )

    async def renew_hold(self, hold: HoldPlan) -> dict[str, Any] | None:
        data = await renew_hold(self.url, self._token, hold, engine=self.engine)
        view = data.get("hold")
        return view if isinstance(view, dict) else None

    async def current(self) -> GatewayUpstream | None:
        try:
            data = await get_upstream(self.url, self._token, engine=self.engine)
        except GatewayControlError as exc:
            if self.engine is not None and exc.status == 404:
                return None  # a named slot the gateway does not have (it restarted): no upstream
            raise
        up = data.get("upstream")
        if not isinstance(up, dict) or not isinstance(up.get("url"), str):
            return None
        served = up.get("served_model")
        names = up.get("aliases")
        aliases = (frozenset(a for a in names if isinstance(a, str)) if isinstance(names, list)
                   else frozenset[str]())
        return GatewayUpstream(up["url"], served if isinstance(served, str) else None, aliases)


    async def remove(self, deadline_s: float = 0.0) -> None:
        """This named slot goes (its model names answer 404): its engine was stopped for good.
        Never the default slot (the primary engine's, kept with its reason while nothing serves)."""
        if self.engine is not None:
            await remove_engine(self.url, self._token, self.engine, drain_deadline_s=deadline_s)


def _secs(value: float) -> int:
    return max(1, round(value))
