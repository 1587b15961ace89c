"""A recorded Kubernetes API at the client's HTTP seam (no cluster can run here).

`RecordedCluster` replaces the urllib3 PoolManager inside a real `kubernetes.client.ApiClient`, so
everything above it is the real client: URL and query building, JSON serialisation, ApiException
from Status bodies, model deserialisation, and the Watch's line-by-line event parsing. Each request
must match the next scripted exchange (method + path, optionally the query), in order, and is
answered with a real `urllib3.HTTPResponse` whose body is a recorded API response from
tests/fixtures/k8s_api/ (shapes from the Kubernetes API reference and public issues; see the
README there).
"""

from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import urllib3
from kubernetes import client as k8s

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "k8s_api"
HOST = "https://k8s.test:6443"
REASONS = {200: "OK", 201: "Created", 202: "Accepted", 400: "Bad Request", 403: "Forbidden",
           404: "Not Found", 409: "Conflict", 503: "Service Unavailable"}


def fixture(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


def pod_list(*pods: Any, resource_version: str = "481600") -> dict[str, Any]:
    """A PodList as `list_namespaced_pod` returns it (items carry no kind/apiVersion)."""
    items = []
    for pod in pods:
        item = dict(pod)
        item.pop("kind", None)
        item.pop("apiVersion", None)
        items.append(item)
    return {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": resource_version},
            "items": items}


def events(*pairs: tuple[str, Any]) -> bytes:
    """A watch response body: one JSON event per line (`{"type": ..., "object": ...}`)."""
    return b"".join(json.dumps({"type": t, "object": o}).encode() + b"\n" for t, o in pairs)


class _Body(io.BytesIO):
    """A response body that closes at EOF, as a socket-backed http.client response does (urllib3's
    `stream()` reads until its fp reports closed; a plain BytesIO never does)."""

    def read(self, size: int | None = -1) -> bytes:
        data = super().read(size)
        if not data and (size is None or size != 0):
            self.close()
        return data

    def read1(self, size: int | None = -1) -> bytes:
        return self.read(size)

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


@dataclass
class Exchange:
    method: str
    path: str  # regex over the URL path
    status: int
    body: bytes
    query: dict[str, str] = field(default_factory=dict)  # must be present in the request's query
    content_type: str = "application/json"


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes | None

    def json(self) -> Any:
        return json.loads(self.body or b"null")


class RecordedCluster:
    """Stands in for urllib3.PoolManager: `request(...)` answers from the script."""

    def __init__(self) -> None:
        self.script: list[Exchange] = []
        self.requests: list[Request] = []

    def expect(self, method: str, path: str, body: Any = None, *, status: int = 200,
               query: dict[str, str] | None = None, echo: bool = False) -> None:
        """Script the next exchange. `body`: a fixture file name, a dict (JSON), or bytes.
        `echo`: answer with the request's own JSON body (server-side apply returns the object)."""
        if isinstance(body, str):
            raw = (FIXTURES / body).read_bytes()
        elif isinstance(body, bytes):
            raw = body
        else:
            raw = json.dumps(body if body is not None else {}).encode()
        ct = "text/plain" if isinstance(body, str) and body.endswith(".txt") else "application/json"
        self.script.append(Exchange(method, path, status, b"<echo>" if echo else raw, query or {}, ct))

    def request(self, method: str, url: str, fields: Any = None, body: Any = None,
                timeout: Any = None, headers: dict[str, str] | None = None,
                preload_content: bool = True, **_: Any) -> urllib3.HTTPResponse:
        parts = urlsplit(url)
        raw = body.encode() if isinstance(body, str) else body
        req = Request(method, parts.path, parse_qs(parts.query), dict(headers or {}), raw)
        self.requests.append(req)
        assert self.script, f"unexpected request {method} {url}"
        ex = self.script.pop(0)
        assert method == ex.method and re.fullmatch(ex.path, parts.path), (
            f"expected {ex.method} {ex.path}, got {method} {parts.path}")
        for key, value in ex.query.items():
            assert req.query.get(key) == [value], f"{key}={req.query.get(key)} (wanted {value})"
        data = (raw or b"{}") if ex.body == b"<echo>" else ex.body
        return urllib3.HTTPResponse(body=_Body(data), status=ex.status,
                                    reason=REASONS.get(ex.status, ""),
                                    headers={"Content-Type": ex.content_type},
                                    preload_content=False)

    def clear(self) -> None:  # PoolManager API
        pass

    def api_client(self) -> k8s.ApiClient:
        cfg = k8s.Configuration()
        cfg.host = HOST
        api = k8s.ApiClient(cfg)
        api.rest_client.pool_manager = self  # type: ignore[assignment]
        return api

    def done(self) -> None:
        assert not self.script, f"scripted but never requested: {[(e.method, e.path) for e in self.script]}"
