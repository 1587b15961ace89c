"""Every `APPLIANCE_*` environment variable, with its type, default and meaning, in one place.

`current()` is the one place that reads them from the process environment; everything else
(controller/settings.py re-exports this module, host_setup/facts.py, the runtimes, the CLI) takes
the value from a `Settings`. A new variable is a new field here: tests/unit/test_settings.py fails
when code names an `APPLIANCE_` variable that is not one.

An empty value counts as unset (the default applies). The environment is parsed at each call of
`current()`, not cached, so a variable changed while the process runs (a test's monkeypatch, a
`--home` the CLI exports for its children) is seen as before.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

PREFIX = "APPLIANCE_"
DEFAULT_TORCH_INDEX_URL = "https://download.pytorch.org/whl/cpu"
DEFAULT_HOST_CGROUP = Path("/sys/fs/cgroup")
DEFAULT_UNSCHEDULABLE_GRACE_S = 300.0


class SettingsError(ValueError):
    """An `APPLIANCE_*` variable holds a value of the wrong kind; the message names the variable."""


class Settings(BaseModel):
    """The operator's knobs. Field names are the variable names without the prefix, lowercased."""

    model_config = ConfigDict(frozen=True, populate_by_name=True, extra="ignore")

    # -- where things are
    home: Path | None = Field(None, alias="APPLIANCE_HOME", description=(
        "The data directory (engine venv, models, caches, launch and key stores). Unset: "
        "/var/lib/appliance as root, else ~/.local/share/appliance (see `appliance_home()`)."))
    recipes: Path | None = Field(None, alias="APPLIANCE_RECIPES", description=(
        "The recipe directory. Unset: the `recipes/` folder beside the code (controller/settings.py)."))
    # -- the admin token (controller/admin_token.py)
    admin_token_sha256: str | None = Field(None, alias="APPLIANCE_ADMIN_TOKEN_SHA256", description=(
        "sha256 (hex) of the admin token; the controller and the gateway check bearer tokens against "
        "it. Unset: the hash file APPLIANCE_HOME/admin-token.sha256. Lowercased, spaces stripped."))
    admin_token: str | None = Field(None, alias="APPLIANCE_ADMIN_TOKEN", description=(
        "The admin token in clear, which the CLI presents to the admin API (client side only)."))
    admin_hosts: tuple[str, ...] = Field((), alias="APPLIANCE_ADMIN_HOSTS", description=(
        "Extra host names/addresses clients use to reach the admin API, comma-separated (the "
        "Host header check; loopback and the listen address are always allowed)."))
    # -- the gateway
    metrics_token_sha256: str | None = Field(None, alias="APPLIANCE_METRICS_TOKEN_SHA256", description=(
        "sha256 (hex) of the token that may read the gateway's /metrics and detailed /healthz. "
        "Lowercased, spaces stripped."))
    # -- clients
    api: str | None = Field(None, alias="APPLIANCE_API", description=(
        "The controller's admin API URL the CLI talks to. Unset: http://127.0.0.1:8090."))
    bench_key: str | None = Field(None, alias="APPLIANCE_BENCH_KEY", description=(
        "Gateway key for `appliance eval`/bench runs against the gateway (read by the CLI option "
        "--key, whose envvar it is)."))
    # -- containers and runtimes
    check_grants: bool = Field(False, alias="APPLIANCE_CHECK_GRANTS", description=(
        "'1': check the container grants (host cgroup tree, docker socket) even outside a "
        "container. Any other value: off."))
    host_cgroup: Path = Field(DEFAULT_HOST_CGROUP, alias="APPLIANCE_HOST_CGROUP", description=(
        "Where the host's cgroup tree is mounted (compose.yaml: /host/sys/fs/cgroup)."))
    k8s_namespace: str | None = Field(None, alias="APPLIANCE_K8S_NAMESPACE", description=(
        "Kubernetes namespace for engines. Unset: the service account's namespace in a pod, else "
        "'default'."))
    k8s_unschedulable_grace_s: float = Field(
        DEFAULT_UNSCHEDULABLE_GRACE_S, alias="APPLIANCE_K8S_UNSCHEDULABLE_GRACE_S", description=(
            "Seconds a pod may stay unschedulable before the launch ends (0: at once); a finite "
            "number >= 0."))
    # -- engine setup
    torch_index_url: str = Field(DEFAULT_TORCH_INDEX_URL, alias="APPLIANCE_TORCH_INDEX_URL", description=(
        "The pip index the CPU engine's torch comes from."))

    @field_validator("admin_token_sha256", "metrics_token_sha256", mode="before")
    @classmethod
    def _hash(cls, v: Any) -> Any:
        return (v.strip().lower() or None) if isinstance(v, str) else v

    @field_validator("admin_hosts", mode="before")
    @classmethod
    def _hosts(cls, v: Any) -> Any:
        return tuple(n.strip() for n in v.split(",") if n.strip()) if isinstance(v, str) else v

    @field_validator("check_grants", mode="before")
    @classmethod
    def _one(cls, v: Any) -> Any:
        return v == "1" if isinstance(v, str) else v

    @field_validator("k8s_unschedulable_grace_s", mode="before")
    @classmethod
    def _grace(cls, v: Any) -> float:
        try:
            grace = float(v)
        except (TypeError, ValueError):
            grace = -1.0
        if not 0 <= grace < math.inf:
            raise ValueError("is not a number of seconds >= 0 "
                             "(0: an unschedulable pod ends the launch at once)")
        return grace

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> Settings:
        """The settings in `environ` (only APPLIANCE_* names are looked at; empty values are unset)."""
        raw = {k: v for k, v in environ.items() if k.startswith(PREFIX) and v != ""}
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            err = exc.errors()[0]
            name = str(err["loc"][0]) if err["loc"] else "?"
            message = err["msg"].removeprefix("Value error, ")
            raise SettingsError(f"{name}={raw.get(name)!r} {message}") from None

    @classmethod
    def variables(cls) -> dict[str, str]:
        """Every variable name and its meaning."""
        return {str(f.alias): f.description or "" for f in cls.model_fields.values()}

    def appliance_home(self) -> Path:
        """APPLIANCE_HOME, else /var/lib/appliance as root, else ~/.local/share/appliance."""
        if self.home is not None:
            return self.home
        if os.geteuid() == 0:
            return Path("/var/lib/appliance")
        return Path.home() / ".local" / "share" / "appliance"


def current() -> Settings:
    """The settings in this process's environment now (raises SettingsError naming a bad variable)."""
    return Settings.from_environ(os.environ)
