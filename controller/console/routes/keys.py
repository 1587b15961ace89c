"""The gateway keys page with their token usage: list, create (the key shown this once), revoke."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request, status
from fastapi.responses import RedirectResponse, Response

from controller.console import views
from controller.console.routes.pages import Pages, secure
from controller.console.usage_views import UsageView, optional_quota, usage_view
from controller.gateway.keystore import KeyNotFound, KeyRecord, KeyStoreError


def register(router: APIRouter, pages: Pages) -> None:
    page, problem, current, session_form = pages.page, pages.problem, pages.current, pages.session_form
    keystore = pages.keystore

    def usage_of(rows: list[KeyRecord], request: Request) -> UsageView:
        try:
            days = int(request.query_params.get("days", "1"))
        except ValueError:
            days = 1
        return usage_view(keystore().path.with_name("usage.sqlite3"), rows, days)

    @router.get("/keys")
    async def keys(request: Request) -> Response:
        session = current(request)
        rows = await asyncio.to_thread(keystore().list, True)
        usage = await asyncio.to_thread(usage_of, rows, request)
        return page(request, "keys.html", session, keys=rows, created=None, usage=usage)

    @router.post("/keys")
    async def create_key(request: Request) -> Response:
        session, form = await session_form(request)
        if isinstance(form, Response):
            return form
        try:
            name = views.key_name(form.get("name", ""))
            rpm = views.optional_positive(form.get("rpm_limit", ""), "requests/min")
            conc = views.optional_positive(form.get("max_concurrent", ""), "max concurrent")
            tpm = optional_quota(form.get("tpm_limit", ""), "tpm_limit", "tokens/min")
            tpd = optional_quota(form.get("tpd_limit", ""), "tpd_limit", "tokens/day")
            record, key = await asyncio.to_thread(keystore().create, name, rpm, conc, tpm, tpd)
        except (KeyStoreError, ValueError) as exc:
            rows = await asyncio.to_thread(keystore().list, True)
            usage = await asyncio.to_thread(usage_of, rows, request)
            return page(request, "keys.html", session, 422, keys=rows, created=None, error=str(exc),
                        usage=usage)
        rows = await asyncio.to_thread(keystore().list, True)
        usage = await asyncio.to_thread(usage_of, rows, request)
        # The key itself, this once: it is not stored (only its hash) and no other page shows it.
        return page(request, "keys.html", session, 201, keys=rows, created={"record": record, "key": key},
                    usage=usage)

    @router.post("/keys/{key_id}/limits")
    async def key_limits(request: Request, key_id: str) -> Response:
        """Change a key's four limits (an empty field: no limit), as `appliance keys update` does."""
        session, form = await session_form(request)
        if isinstance(form, Response):
            return form
        try:
            limits = {
                "rpm_limit": views.optional_positive(form.get("rpm_limit", ""), "requests/min"),
                "max_concurrent": views.optional_positive(form.get("max_concurrent", ""), "max concurrent"),
                "tpm_limit": optional_quota(form.get("tpm_limit", ""), "tpm_limit", "tokens/min"),
                "tpd_limit": optional_quota(form.get("tpd_limit", ""), "tpd_limit", "tokens/day"),
            }
            await asyncio.to_thread(keystore().update, key_id, limits)
        except KeyNotFound:
            return problem(request, session, 404, "Unknown key", "No such key; nothing was changed.",
                           "/console/keys")
        except (KeyStoreError, ValueError) as exc:
            rows = await asyncio.to_thread(keystore().list, True)
            usage = await asyncio.to_thread(usage_of, rows, request)
            return page(request, "keys.html", session, 422, keys=rows, created=None, error=str(exc),
                        usage=usage)
        return secure(RedirectResponse("/console/keys?notice=limits", status.HTTP_303_SEE_OTHER))

    @router.post("/keys/{key_id}/revoke")
    async def revoke_key(request: Request, key_id: str) -> Response:
        session, form = await session_form(request)
        if isinstance(form, Response):
            return form
        try:
            await asyncio.to_thread(keystore().revoke, key_id)
        except KeyNotFound:
            return problem(request, session, 404, "Unknown key", "No such key; nothing was changed.",
                           "/console/keys")
        return secure(RedirectResponse("/console/keys?notice=revoked", status.HTTP_303_SEE_OTHER))
