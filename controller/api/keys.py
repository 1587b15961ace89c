"""Key management routes for the controller's admin API.

The controller's app includes ``keys_router(require_admin)``, passing its own admin-auth
dependency; the gateway process sees the change within about a second (key store version row).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, status
from pydantic import BaseModel, ConfigDict, Field

from controller.gateway.keystore import (
    LIMIT_BOUNDS,
    MAX_KEY_MODELS,
    KeyNotFound,
    KeyRecord,
    KeyStore,
    KeyStoreError,
)
from controller.settings import paths

MAX_RPM_LIMIT = LIMIT_BOUNDS["rpm_limit"]
MAX_CONCURRENT = LIMIT_BOUNDS["max_concurrent"]
MAX_TPM_LIMIT = LIMIT_BOUNDS["tpm_limit"]
MAX_TPD_LIMIT = LIMIT_BOUNDS["tpd_limit"]


# strict: an admin request's values are taken as sent, never coerced — `{"tpm_limit": true}` was
# once stored as a limit of 1 token a minute, and "5" as 5. A wrong type is a 422 naming the field.
class KeyCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    name: str = Field(min_length=1, max_length=200)
    # Upper bounds so that absurd values are a 422 naming the field, not an SQLite overflow (a 500
    # for rpm_limit=1e23). A million requests a minute and 10 000 in flight are far past what one
    # engine on one host serves; "no limit" is null.
    rpm_limit: int | None = Field(default=None, ge=1, le=MAX_RPM_LIMIT)
    max_concurrent: int | None = Field(default=None, ge=1, le=MAX_CONCURRENT)
    # Token quotas (prompt + completion tokens, as the engine counts them): per minute, per day.
    tpm_limit: int | None = Field(default=None, ge=1, le=MAX_TPM_LIMIT)
    tpd_limit: int | None = Field(default=None, ge=1, le=MAX_TPD_LIMIT)
    # The models the key may use (a served name allows its aliases); null: every model.
    models: list[str] | None = Field(default=None, min_length=1, max_length=MAX_KEY_MODELS)


class KeyUpdate(BaseModel):
    """The limits to change; a limit left out keeps its value, null removes it (``models`` null:
    every model)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    rpm_limit: int | None = Field(default=None, ge=1, le=MAX_RPM_LIMIT)
    max_concurrent: int | None = Field(default=None, ge=1, le=MAX_CONCURRENT)
    tpm_limit: int | None = Field(default=None, ge=1, le=MAX_TPM_LIMIT)
    tpd_limit: int | None = Field(default=None, ge=1, le=MAX_TPD_LIMIT)
    models: list[str] | None = Field(default=None, min_length=1, max_length=MAX_KEY_MODELS)


class KeyOut(BaseModel):
    id: str
    name: str
    created: float
    revoked: float | None
    rpm_limit: int | None
    max_concurrent: int | None
    tpm_limit: int | None = None
    tpd_limit: int | None = None
    models: list[str] | None = None

    @classmethod
    def of(cls, record: KeyRecord) -> KeyOut:
        return cls(**record.as_dict())


class KeyCreated(KeyOut):
    key: str = Field(description="The key itself. Shown only in this response; only its hash is stored.")


def keys_router(require_admin: Callable[..., Any], store: KeyStore | None = None) -> APIRouter:
    """``POST /keys``, ``GET /keys``, ``PATCH /keys/{id}`` (limits), ``DELETE /keys/{id}``, all behind
    ``require_admin``.
    ``store`` defaults to the appliance's key file (``paths().keys_db``), resolved per request so a
    test or an operator can change APPLIANCE_HOME without rebuilding the app."""
    router = APIRouter(prefix="/keys", tags=["keys"], dependencies=[Depends(require_admin)])

    def _store() -> KeyStore:
        return store if store is not None else KeyStore(paths().keys_db)

    # Plain `def` handlers: FastAPI runs them in its thread pool, so SQLite never blocks the loop.
    @router.post("", status_code=status.HTTP_201_CREATED, response_model=KeyCreated)
    def create_key(body: KeyCreate) -> KeyCreated:
        try:
            record, key = _store().create(
                body.name, body.rpm_limit, body.max_concurrent, body.tpm_limit, body.tpd_limit,
                body.models,
            )
        except KeyStoreError as exc:
            raise HTTPException(422, str(exc)) from exc
        return KeyCreated(**record.as_dict(), key=key)

    @router.get("", response_model=list[KeyOut])
    def list_keys(include_revoked: bool = True) -> list[KeyOut]:
        return [KeyOut.of(r) for r in _store().list(include_revoked=include_revoked)]

    @router.patch("/{key_id}", response_model=KeyOut)
    def update_key(key_id: str, body: KeyUpdate) -> KeyOut:
        limits = {name: getattr(body, name) for name in body.model_fields_set if name != "models"}
        try:
            if "models" in body.model_fields_set:
                return KeyOut.of(_store().update(key_id, limits, body.models))
            return KeyOut.of(_store().update(key_id, limits))
        except KeyNotFound as exc:
            raise HTTPException(status.HTTP_404_NOT_FOUND, str(exc)) from exc
        except KeyStoreError as exc:
            raise HTTPException(422, str(exc)) from exc

    @router.delete("/{key_id}", response_model=KeyOut)
    def revoke_key(key_id: str) -> KeyOut:
        try:
            return KeyOut.of(_store().revoke(key_id))
        except KeyNotFound as exc:
            raise HTTPException(status.HTTP_404_NOT_FOUND, str(exc)) from exc

    return router
