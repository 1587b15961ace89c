"""Everything the gateway process is told at start-up."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from controller.gateway.slot import NoSlotPolicy

ADMIN_TOKEN_ENV = "APPLIANCE_ADMIN_TOKEN_SHA256"


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
    pool_limit: int = 1024
    # vLLM's server closes idle keep-alive connections after 5 s (uvicorn's default); reusing one
    # it is closing gives a spurious "server disconnected", so we drop ours first.
    upstream_keepalive_s: float = 4.0
    key_refresh_s: float = 1.0
    graceful_shutdown_s: float = 30.0
    log_level: str = "warning"

    @staticmethod
    def admin_hash_from_env() -> str | None:
        value = os.environ.get(ADMIN_TOKEN_ENV, "").strip().lower()
        return value or None
