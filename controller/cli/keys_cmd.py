"""`appliance keys create|list|update|revoke`: manage gateway API keys and their limits.

Works on the key file directly, or through the controller's admin API with ``--api URL`` (admin
token from $APPLIANCE_ADMIN_TOKEN). A key is printed once, at creation; only its hash is stored.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Annotated, Any

import typer

from appliance import settings
from controller.api_client import ApiError, detail_words, unreachable
from controller.cli.options import JsonOpt
from controller.gateway.keystore import LIMIT_BOUNDS, KeyNotFound, KeyStore, KeyStoreError
from controller.settings import paths

ADMIN_TOKEN_CLIENT_ENV = "APPLIANCE_ADMIN_TOKEN"

keys_app = typer.Typer(
    name="keys", help="Gateway API keys (stored as hashes; shown once at creation).", no_args_is_help=True
)

KeysOpt = Annotated[
    Path | None, typer.Option("--keys", help="Key store file (default: keys.sqlite3 in APPLIANCE_HOME).")
]
ApiOpt = Annotated[
    str | None, typer.Option("--api", help="Use the controller's admin API at this URL, not the file.")
]


def _api(base: str, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    token = settings.current().admin_token
    if not token:
        raise typer.BadParameter(
            f"--api needs the admin token in ${ADMIN_TOKEN_CLIENT_ENV}", param_hint="--api"
        )
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        base.rstrip("/") + path,
        data=data,
        method=method,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        # The controller's detail in words; the HTTP status only picks the exit code (as for the
        # other API commands: 2 for a refused credential, an unknown key or bad input).
        error = ApiError(exc.code, _detail(exc.read().decode(errors="replace")[:500]))
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2 if exc.code in (401, 403, 404, 422) else 1) from exc
    except urllib.error.URLError as exc:
        typer.echo(f"error: {unreachable(base, exc)}", err=True)
        raise typer.Exit(1) from exc


def _detail(raw: str) -> str:
    try:
        detail = json.loads(raw).get("detail", raw)
    except (ValueError, AttributeError):
        return raw
    return detail_words(detail)


def _store_error(exc: KeyStoreError) -> typer.Exit:
    """A store refusal in words; exit 2 for an unknown key (as every unknown name or id), else 1."""
    typer.echo(f"error: {exc}", err=True)
    return typer.Exit(2 if isinstance(exc, KeyNotFound) else 1)


def _shown(text: str) -> str:
    """A key name as the terminal gets it: control characters as escapes, never raw.

    The store refuses such names, but a store written before that rule, or a controller reached with
    --api, can still hand one over; printed raw, an escape sequence would act on the terminal.
    """
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)


TpmOpt = Annotated[
    int | None,
    typer.Option("--tpm", min=1, max=LIMIT_BOUNDS["tpm_limit"],
                 help="Tokens per minute, prompt + completion (unset: no limit)."),
]
TpdOpt = Annotated[
    int | None,
    typer.Option("--tpd", min=1, max=LIMIT_BOUNDS["tpd_limit"],
                 help="Tokens per day, prompt + completion (unset: no limit)."),
]


ModelsOpt = Annotated[
    str | None,
    typer.Option("--models", help="The models the key may use, comma-separated (a served name allows "
                 "its aliases; unset: every model)."),
]


def _models(text: str | None) -> list[str] | None:
    """``--models a,b`` as a list (blanks dropped); None when not given."""
    if text is None:
        return None
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise typer.BadParameter("name at least one model (or leave --models out for every model)",
                                 param_hint="--models")
    return names


def _when(ts: float | None) -> str:
    return "-" if ts is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


@keys_app.command("create")
def create(
    name: Annotated[str, typer.Option("--name", help="Who or what the key is for.")],
    rpm: Annotated[
        int | None, typer.Option("--rpm", min=1, help="Requests per minute (unset: no limit).")
    ] = None,
    max_concurrent: Annotated[
        int | None, typer.Option("--max-concurrent", min=1, help="Concurrent requests (unset: no limit).")
    ] = None,
    tpm: TpmOpt = None,
    tpd: TpdOpt = None,
    models: ModelsOpt = None,
    keys: KeysOpt = None,
    api: ApiOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Create a key and print it (the only time it is ever shown)."""
    names = _models(models)
    if api:
        out = _api(api, "POST", "/keys", {"name": name, "rpm_limit": rpm, "max_concurrent": max_concurrent,
                                          "tpm_limit": tpm, "tpd_limit": tpd, "models": names})
    else:
        try:
            record, key = KeyStore(keys or paths().keys_db).create(name, rpm, max_concurrent, tpm, tpd,
                                                                   names)
        except KeyStoreError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1) from exc
        out = {**record.as_dict(), "key": key}
    if as_json:
        typer.echo(json.dumps(out))
        return
    typer.echo(out["key"])
    typer.echo(f"created key {out['id']} ({_shown(out['name'])}). Store it now: it cannot be shown again.",
               err=True)


@keys_app.command("list")
def list_keys(
    all_keys: Annotated[bool, typer.Option("--all", help="Include revoked keys.")] = False,
    keys: KeysOpt = None,
    api: ApiOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List keys (ids, names, limits; never the keys)."""
    if api:
        rows: list[dict[str, Any]] = _api(api, "GET", f"/keys?include_revoked={str(all_keys).lower()}")
    else:
        rows = [r.as_dict() for r in KeyStore(keys or paths().keys_db).list(include_revoked=all_keys)]
    if as_json:
        typer.echo(json.dumps(rows))
        return
    typer.echo(f"{'ID':<13} {'NAME':<24} {'CREATED':<19} {'REVOKED':<19} {'RPM':>6} {'CONC':>5} "
               f"{'TOK/MIN':>9} {'TOK/DAY':>11} MODELS")
    for r in rows:
        typer.echo(
            f"{r['id']:<13} {_shown(r['name'])[:24]:<24} {_when(r['created']):<19} {_when(r['revoked']):<19} "
            f"{r['rpm_limit'] or '-':>6} {r['max_concurrent'] or '-':>5} "
            f"{r.get('tpm_limit') or '-':>9} {r.get('tpd_limit') or '-':>11} "
            f"{_shown(','.join(r.get('models') or ['(all)']))}"
        )


_NONE_HELP = " 0 removes the limit."


@keys_app.command("update")
def update(
    key_id: Annotated[str, typer.Argument(help="The key's id (from `appliance keys list`).")],
    rpm: Annotated[int | None, typer.Option("--rpm", min=0, max=LIMIT_BOUNDS["rpm_limit"],
                                            help="Requests per minute." + _NONE_HELP)] = None,
    max_concurrent: Annotated[int | None, typer.Option(
        "--max-concurrent", min=0, max=LIMIT_BOUNDS["max_concurrent"],
        help="Concurrent requests." + _NONE_HELP)] = None,
    tpm: Annotated[int | None, typer.Option("--tpm", min=0, max=LIMIT_BOUNDS["tpm_limit"],
                                            help="Tokens per minute." + _NONE_HELP)] = None,
    tpd: Annotated[int | None, typer.Option("--tpd", min=0, max=LIMIT_BOUNDS["tpd_limit"],
                                            help="Tokens per day." + _NONE_HELP)] = None,
    models: ModelsOpt = None,
    all_models: Annotated[bool, typer.Option("--all-models", help="Let the key use every model.")] = False,
    keys: KeysOpt = None,
    api: ApiOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Change a key's limits; the gateway applies them within about a second."""
    given = {"rpm_limit": rpm, "max_concurrent": max_concurrent, "tpm_limit": tpm, "tpd_limit": tpd}
    # 0 on the command line means "no limit" (null): a limit of 0 would refuse every request.
    limits: dict[str, int | None] = {k: (v or None) for k, v in given.items() if v is not None}
    if models is not None and all_models:
        raise typer.BadParameter("--models and --all-models exclude each other", param_hint="--models")
    names = _models(models)
    change_models = models is not None or all_models
    if not limits and not change_models:
        raise typer.BadParameter("name at least one of --rpm, --max-concurrent, --tpm, --tpd, --models, "
                                 "--all-models", param_hint="limits")
    if api:
        out: dict[str, Any] = _api(api, "PATCH", f"/keys/{key_id}",
                                   {**limits, "models": names} if change_models else limits)
    else:
        try:
            store = KeyStore(keys or paths().keys_db)
            record = store.update(key_id, limits, names) if change_models else store.update(key_id, limits)
            out = record.as_dict()
        except KeyStoreError as exc:
            raise _store_error(exc) from exc
    if as_json:
        typer.echo(json.dumps(out))
        return
    changed: dict[str, object] = dict(limits)
    if change_models:
        changed["models"] = ",".join(names) if names is not None else "all"
    shown = ", ".join(f"{k}={_shown(str(v)) if v is not None else 'none'}" for k, v in changed.items())
    typer.echo(f"updated {key_id}: {shown}")


@keys_app.command("revoke")
def revoke(
    key_id: Annotated[str, typer.Argument(help="The key's id (from `appliance keys list`).")],
    keys: KeysOpt = None,
    api: ApiOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Revoke a key; the gateway refuses it within about a second, without a restart."""
    if api:
        out: dict[str, Any] = _api(api, "DELETE", f"/keys/{key_id}")
    else:
        try:
            out = KeyStore(keys or paths().keys_db).revoke(key_id).as_dict()
        except KeyStoreError as exc:
            raise _store_error(exc) from exc
    if as_json:
        typer.echo(json.dumps(out))
        return
    typer.echo(f"revoked {key_id}")


def register(app: typer.Typer) -> None:
    """Add this module's commands to the `appliance` app."""
    app.add_typer(keys_app)
