"""``GET /usage``: token usage per key per hour, from the gateway's usage file (admin token).

    GET /usage?since=24h&until=&key=NAME_OR_ID&key=…

Rows (one per key per hour: requests, errors, prompt/completion/total tokens, time) and totals per
key. A range that cannot be read or is reversed is a 422 naming the field (``gateway.usage.report``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Query, status

from controller.gateway.keystore import KeyStore
from controller.gateway.usage.report import RangeError, parse_range, report, resolve_keys
from controller.gateway.usage.store import UsageStore, UsageStoreError
from controller.settings import paths


def usage_path(keys_db: Path) -> Path:
    """Where the gateway writes usage: beside the key store (``GatewayConfig.usage_path``)."""
    return keys_db.with_name("usage.sqlite3")


def usage_router(require_admin: Callable[..., Any], keys: KeyStore | None = None) -> APIRouter:
    router = APIRouter(prefix="/usage", tags=["keys"], dependencies=[Depends(require_admin)])

    # A plain `def`: FastAPI runs it in its thread pool, so SQLite never blocks the loop.
    @router.get("")
    def get_usage(
        since: Annotated[str | None, Query(max_length=64, description="24h, 7d, ISO 8601 or Unix s")] = None,
        until: Annotated[str | None, Query(max_length=64)] = None,
        key: Annotated[list[str] | None, Query(max_length=200, description="name or id; repeat")] = None,
        by: Annotated[Literal["key", "model"], Query(description="totals per key or per model")] = "key",
    ) -> dict[str, Any]:
        store = keys if keys is not None else KeyStore(paths().keys_db)
        try:
            start, end = parse_range(since, until)
            records = store.list(include_revoked=True)
            ids = resolve_keys(key, records) if key else None
            rows = UsageStore(usage_path(store.path)).query(ids, start, end)
        except RangeError as exc:
            raise HTTPException(422,
                                [{"loc": ["query", exc.field], "msg": str(exc)}]) from exc
        except UsageStoreError as exc:
            raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, str(exc)) from exc
        return report(rows, records, start, end, by)

    return router
