"""Everything the gateway process is told at start-up."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from appliance import settings
from controller.gateway.slot import NoSlotPolicy

ADMIN_TOKEN_ENV = "APPLIANCE_ADMIN_TOKEN_SHA256"
METRICS_TOKEN_ENV = "APPLIANCE_METRICS_TOKEN_SHA256"


class MetricsAccess(Enum):
    """Who may read ``/metrics`` (key ids, per-key counts, the upstream URL) and the detailed
    ``/healthz``. Anyone else gets 401 for metrics and a bare ``{"status", "ready"}`` for health."""

    # Clients on the loopback interface (Prometheus on the host) and holders of the metrics or
    # admin token. The default: the gateway listens on 0.0.0.0 but scrapes come from 127.0.0.1.
    LOOPBACK = "loopback"
    TOKEN = "token"  # only holders of the metrics token or the admin token
    PUBLIC = "public"  # everyone (the listen address is private, or a proxy in front guards it)


@dataclass(frozen=True)
class GatewayConfig:
    keys_db: Path
    host: str = "127.0.0.1"
    port: int = 8080
    upstream_url: str | None = None
    served_model: str | None = None
    admin_token_sha256: str | None = None
    # 16 MiB: a 262144-token prompt is ~1 MiB of text; images as base64 are the large case.
    max_body_bytes: int = 16 * 1024 * 1024
    connect_timeout_s: float = 5.0
    # Idle read, not total: it also bounds the wait for the first token, so it must exceed the
    # slowest prefill (a 32K-token prompt on the reference host takes tens of seconds).
    idle_timeout_s: float = 600.0
    no_slot_policy: NoSlotPolicy = NoSlotPolicy.REJECT
    queue_max: int = 64
    queue_timeout_s: float = 30.0
    retry_after_s: int = 5
    # --- holding requests while the controller switches engines on purpose (``hold/queue.py``) ---
    # Most requests held at once, and per key (one client cannot take the whole queue); over: 503.
    hold_max: int = 256
    hold_per_key_max: int = 64
    # A held streaming client gets a comment line this often (proxies and SDKs time out idle streams).
    hold_tick_s: float = 5.0
    pool_limit: int = 1024
    # vLLM's server closes idle keep-alive connections after 5 s (uvicorn's default); reusing one
    # it is closing gives a spurious "server disconnected", so we drop ours first.
    upstream_keepalive_s: float = 4.0
    # A pooled connection that closes before a byte of the answer does not prove the engine never
    # got the request; a POST sent again may start a second generation billed to the key. Off: only
    # idempotent methods are retried (``upstream_client.may_retry``); each retry is counted.
    retry_stale_non_idempotent: bool = False
    key_refresh_s: float = 1.0
    # Fail closed: the cached keys are trusted this long after the last good read of the store.
    key_max_stale_s: float = 10.0
    # --- before authentication: what an anonymous client may hold (``protocol.py``) ---
    # Request line + headers. A bearer key is ~70 bytes; browsers send < 8 KiB; nginx's default
    # ceiling is 4 × 8 KiB. Larger: 431.
    max_header_bytes: int = 32 * 1024
    # From connecting (or the first byte of the next request) to the end of its headers. Past it: 408.
    header_timeout_s: float = 10.0
    # Idle keep-alive between requests (uvicorn's timer; an integer number of seconds).
    keepalive_timeout_s: int = 5
    # Open connections per client address, and in all (the latter also capped by the file limit,
    # keeping descriptors for upstream connections and the key store). Over either: 429/503 + close.
    max_connections_per_client: int = 256
    max_connections: int = 4096
    # The control listener: the controller's admin calls and scrapes, on an address clients (and a
    # reverse proxy on the host) are never sent to, so they can never fill its connections. Its own
    # cap; only /admin/, /metrics and /healthz there; /admin/ on the client listener is then 404
    # (``protocol.py``). None: no control listener, the client listener serves /admin/ as well (the
    # controller's calls then share the per-address cap with every loopback client). Port 0: any
    # free port (tests).
    control_listen: tuple[str, int] | None = None
    max_control_connections: int = 32
    # --- request bodies (``jsonbody.py``) ---
    # From the request's headers to the end of its body. Past it: 408 and close. Without it a key
    # limited to 1 concurrent request held 20 connections for 49 s by trickling bodies. 60 s is
    # 16 MiB (``max_body_bytes``) at ~280 KB/s.
    body_timeout_s: float = 60.0
    # JSON nesting deeper than this is refused (400) before anything parses it recursively.
    max_json_depth: int = 128
    # JSON bodies larger than this are inspected in a worker thread, so one large body never holds
    # the event loop (and every other client) for long.
    inline_json_bytes: int = 64 * 1024
    # --- observability surface ---
    metrics_access: MetricsAccess = MetricsAccess.LOOPBACK
    metrics_token_sha256: str | None = None
    # --- usage and token quotas (``usage/accounting.py``) ---
    # Usage per key per hour; default: usage.sqlite3 beside the key store.
    usage_db: Path | None = None
    usage_flush_s: float = 2.0  # how often pending sums are written (and quota levels saved)
    usage_retention_days: float = 90.0  # hourly rows older than this are deleted
    usage_max_pending: int = 10_000  # key x hour sums held while the store cannot be written
    # Token quotas: take each request's worst case (max_tokens x n) from its key's buckets when it
    # is admitted, refunded to what the engine counted when it ends, so concurrent requests cannot
    # overshoot the quota together (``usage/quota.py``). Off: charged when each ends (may overshoot).
    quota_reserve: bool = False
    graceful_shutdown_s: float = 30.0
    log_level: str = "warning"

    @property
    def usage_path(self) -> Path:
        return self.usage_db if self.usage_db is not None else self.keys_db.with_name("usage.sqlite3")

    @staticmethod
    def admin_hash_from_env() -> str | None:
        return settings.current().admin_token_sha256

    @staticmethod
    def metrics_hash_from_env() -> str | None:
        return settings.current().metrics_token_sha256
