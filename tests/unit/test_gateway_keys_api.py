"""The controller's key routes, mounted on a throwaway FastAPI app with a fake admin check."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI, Header, HTTPException
from fastapi.testclient import TestClient

from controller.api.keys import keys_router
from controller.gateway.keystore import KeyStore, hash_key


def require_admin(authorization: str = Header(default="")) -> None:
    if authorization != "Bearer ok":
        raise HTTPException(401, "admin only")


def client(store: KeyStore) -> TestClient:
    app = FastAPI()
    app.include_router(keys_router(require_admin, store=store))
    return TestClient(app)


def test_create_list_revoke(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "k.db")
    c = client(store)
    h = {"Authorization": "Bearer ok"}
    assert c.get("/keys").status_code == 401
    r = c.post("/keys", json={"name": "svc", "rpm_limit": 30}, headers=h)
    assert r.status_code == 201
    created = r.json()
    key = created["key"]
    assert key.startswith("sk-app-") and created["rpm_limit"] == 30
    assert store.snapshot()[1][created["id"]].digest == bytes.fromhex(hash_key(key))
    listed = c.get("/keys", headers=h).json()
    assert [k["id"] for k in listed] == [created["id"]]
    assert "key" not in listed[0]  # shown only once, at creation
    r = c.delete(f"/keys/{created['id']}", headers=h)
    assert r.status_code == 200 and r.json()["revoked"] is not None
    assert c.get("/keys?include_revoked=false", headers=h).json() == []
    assert c.delete("/keys/0123456789ab", headers=h).status_code == 404
    assert c.post("/keys", json={"name": "x", "max_concurrent": 0}, headers=h).status_code == 422
