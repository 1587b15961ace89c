"""The operator's admin token: configured as a sha256 hash, never stored or printed in clear.

Where the hash comes from, first match wins:
1. `APPLIANCE_ADMIN_TOKEN_SHA256` (hex) in the controller's environment;
2. the file `APPLIANCE_HOME/admin-token.sha256`, written by `appliance up` when it creates a
   token (the token itself is shown once, on that terminal, and nowhere else).

Clients (the CLI) present the token from `APPLIANCE_ADMIN_TOKEN`. Comparison is constant-time.

The gateway's control token is a different secret: the controller must present it to the
gateway's admin surface, so it has to exist in clear somewhere — a 0600 file under
`APPLIANCE_HOME/run/`, readable only by the account that runs the appliance, created fresh each
time `appliance up` starts the gateway. It grants only "switch the upstream / drain".
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
from pathlib import Path

from appliance import settings

HASH_ENV = "APPLIANCE_ADMIN_TOKEN_SHA256"
TOKEN_ENV = "APPLIANCE_ADMIN_TOKEN"
HASH_FILE = "admin-token.sha256"
GATEWAY_TOKEN_FILE = "gateway-control.token"
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return "adm_" + secrets.token_urlsafe(32)


def hash_file(home: Path) -> Path:
    return home / HASH_FILE


def configured_hash(home: Path) -> str | None:
    """The admin token's hash, or None when no admin token is configured (mutations refused)."""
    explicit = settings.current().admin_token_sha256
    if explicit:
        if not _HEX64.match(explicit):
            raise ValueError(f"{HASH_ENV} must be 64 hex characters (a sha256), not {len(explicit)}")
        return explicit
    path = hash_file(home)
    try:
        stored = path.read_text().strip().lower()
    except FileNotFoundError:
        return None
    if not _HEX64.match(stored):
        raise ValueError(f"{path} does not hold a sha256 hex digest")
    return stored


def write_hash(home: Path, token: str) -> Path:
    """Store the hash of a new token (0600). Returns the file written."""
    home.mkdir(parents=True, exist_ok=True)
    path = hash_file(home)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(hash_token(token) + "\n")
    os.replace(tmp, path)
    return path


def matches(presented: str, expected_hash: str) -> bool:
    return hmac.compare_digest(hash_token(presented), expected_hash)


def write_gateway_token(run_dir: Path) -> str:
    """A fresh control token for the gateway (0600 file); returns it for the gateway's env hash."""
    run_dir.mkdir(parents=True, exist_ok=True)
    token = "gw_" + secrets.token_urlsafe(32)
    path = run_dir / GATEWAY_TOKEN_FILE
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    os.replace(tmp, path)
    return token


def read_gateway_token(run_dir: Path) -> str | None:
    try:
        return (run_dir / GATEWAY_TOKEN_FILE).read_text().strip() or None
    except FileNotFoundError:
        return None
