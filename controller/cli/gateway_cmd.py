"""`appliance gateway`: run the authenticated streaming proxy (standalone or under the controller)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from controller import logsetup
from controller.gateway.config import ADMIN_TOKEN_ENV, METRICS_TOKEN_ENV, GatewayConfig, MetricsAccess
from controller.gateway.slot import NoSlotPolicy
from controller.settings import paths


def _split_listen(listen: str, flag: str = "--listen") -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise typer.BadParameter(f"expected HOST:PORT, got {listen!r}", param_hint=flag)
    return host.strip("[]") or "0.0.0.0", int(port)


def control_address(control_listen: str | None, client_port: int) -> tuple[str, int] | None:
    """Where the control listener binds: HOST:PORT as given, ``off`` for none, and by default
    127.0.0.1 on the client port + 1 (any free port when the client port is 0)."""
    if control_listen is None:
        return "127.0.0.1", client_port + 1 if client_port else 0
    if control_listen.strip().lower() == "off":
        return None
    return _split_listen(control_listen, "--control-listen")


def gateway(
    upstream: Annotated[
        str | None,
        typer.Option(
            help="Engine base URL, e.g. http://127.0.0.1:8000. Unset: no slot until the "
            "controller sets one (PUT /admin/upstream)."
        ),
    ] = None,
    served_model: Annotated[
        str | None, typer.Option(help="Rewrite the `model` of JSON requests to this served name.")
    ] = None,
    listen: Annotated[str, typer.Option(help="HOST:PORT to serve clients on.")] = "0.0.0.0:8080",
    control_listen: Annotated[str | None, typer.Option(
        help="HOST:PORT of the control listener: the controller's /admin/ calls and /metrics scrapes, "
        "never counted against the client connection caps (then /admin/ is not served on --listen). "
        "Default: 127.0.0.1 on the --listen port + 1. `off`: none (/admin/ on --listen).")] = None,
    keys: Annotated[
        Path | None, typer.Option(help="Key store file (default: the appliance's keys.sqlite3).")
    ] = None,
    no_slot: Annotated[
        NoSlotPolicy, typer.Option(help="While no engine is ready: reject (503 + Retry-After) or queue.")
    ] = NoSlotPolicy.REJECT,
    queue_max: Annotated[int, typer.Option(help="Queue mode: most requests waiting for a slot.")] = 64,
    queue_timeout: Annotated[
        float, typer.Option(help="Queue mode: longest wait for a slot, seconds.")
    ] = 30.0,
    retry_after: Annotated[int, typer.Option(help="Retry-After seconds sent with 503 while no slot.")] = 5,
    hold_max: Annotated[int, typer.Option(
        min=1, help="While the controller switches engines: most requests held at once (over: 503).")] = 256,
    hold_per_key_max: Annotated[int, typer.Option(
        min=1, help="While the controller switches engines: most requests held per key (over: 503).")] = 64,
    max_body: Annotated[int, typer.Option(help="Largest request body in bytes (larger: 413).")] = 16 << 20,
    connect_timeout: Annotated[float, typer.Option(help="Upstream connect timeout, seconds.")] = 5.0,
    idle_timeout: Annotated[
        float, typer.Option(help="Upstream idle-read timeout, seconds (there is no total timeout).")
    ] = 600.0,
    max_header_bytes: Annotated[
        int, typer.Option(help="Largest request line + headers in bytes (larger: 431).")
    ] = 32 * 1024,
    header_timeout: Annotated[
        float, typer.Option(help="Seconds a client has to send a request's headers (then: 408).")
    ] = 10.0,
    body_timeout: Annotated[
        float, typer.Option(help="Seconds to receive a request's body after its headers (then 408).")
    ] = 60.0,
    keepalive_timeout: Annotated[
        int, typer.Option(help="Seconds an idle keep-alive connection is held between requests.")
    ] = 5,
    max_connections: Annotated[
        int, typer.Option(help="Most open client connections (also bounded by the file limit).")
    ] = 4096,
    max_connections_per_client: Annotated[
        int, typer.Option(help="Most open connections from one client address.")
    ] = 256,
    metrics_access: Annotated[
        MetricsAccess,
        typer.Option(
            help="Who may read /metrics and the detailed /healthz: loopback clients and token holders, "
            f"token holders only (${METRICS_TOKEN_ENV} or the admin token), or everyone."
        ),
    ] = MetricsAccess.LOOPBACK,
    usage_retention_days: Annotated[
        float, typer.Option(min=1, max=3650, help="Days of hourly usage kept (usage.sqlite3, by the keys).")
    ] = 90.0,
    quota_reserve: Annotated[
        bool, typer.Option(help="Token quotas: take each request's worst case (max_tokens x n) from its "
                           "key's buckets when admitted, refunded when it ends, so concurrent requests "
                           "cannot overshoot together. Off: charged when each ends.")
    ] = False,
    log_level: Annotated[str, typer.Option(help="uvicorn/gateway log level.")] = "warning",
) -> None:
    """Run the gateway in the foreground. Admin calls need the token whose sha256 is in
    $APPLIANCE_ADMIN_TOKEN_SHA256 (unset: the admin surface is closed); /metrics needs a loopback
    client or that token or the one whose sha256 is in $APPLIANCE_METRICS_TOKEN_SHA256."""
    from controller.gateway import server  # imported late: uvicorn/aiohttp are heavy for other commands

    host, port = _split_listen(listen)
    config = GatewayConfig(
        keys_db=keys or paths().keys_db,
        host=host,
        port=port,
        control_listen=control_address(control_listen, port),
        upstream_url=upstream,
        served_model=served_model,
        admin_token_sha256=GatewayConfig.admin_hash_from_env(),
        max_body_bytes=max_body,
        connect_timeout_s=connect_timeout,
        idle_timeout_s=idle_timeout,
        no_slot_policy=no_slot,
        queue_max=queue_max,
        queue_timeout_s=queue_timeout,
        retry_after_s=retry_after,
        hold_max=hold_max,
        hold_per_key_max=hold_per_key_max,
        max_header_bytes=max_header_bytes,
        header_timeout_s=header_timeout,
        keepalive_timeout_s=keepalive_timeout,
        body_timeout_s=body_timeout,
        max_connections=max_connections,
        max_connections_per_client=max_connections_per_client,
        metrics_access=metrics_access,
        metrics_token_sha256=GatewayConfig.metrics_hash_from_env(),
        usage_retention_days=usage_retention_days,
        quota_reserve=quota_reserve,
        log_level=log_level,
    )
    logsetup.configure(log_level)  # host-independent (controller/logsetup.py)
    admin = "open" if config.admin_token_sha256 else f"closed (set {ADMIN_TOKEN_ENV})"
    control = config.control_listen
    where = f"control on {control[0]}:{control[1]}" if control else "no control listener"
    typer.echo(
        f"gateway on {host}:{port} ({where}) → {upstream or 'no upstream yet'}; keys {config.keys_db}; "
        f"admin surface {admin}",
        err=True,
    )
    server.run(config)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the `appliance` app."""
    app.command("gateway")(gateway)
