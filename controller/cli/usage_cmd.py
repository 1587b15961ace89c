"""`appliance usage`: tokens, requests, errors and time per gateway key and model per hour.

Reads the gateway's usage file (``usage.sqlite3`` beside the key store) directly, or the
controller's ``GET /usage`` with ``--api URL`` (admin token from $APPLIANCE_ADMIN_TOKEN).
"""

from __future__ import annotations

import csv
import json
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Annotated, Any

import typer

from controller.api.usage import usage_path
from controller.cli.keys_cmd import ApiOpt, KeysOpt, _api, _shown
from controller.cli.options import JsonOpt
from controller.gateway.keystore import KeyStore
from controller.gateway.usage.report import GROUPINGS, RangeError, parse_range, report, resolve_keys
from controller.gateway.usage.store import UsageStore, UsageStoreError
from controller.settings import paths

_COLUMNS = ("hour_utc", "key_id", "key_name", "requests", "errors", "prompt_tokens", "completion_tokens",
            "total_tokens", "duration_s", "model")

# OWASP "CSV Injection": a spreadsheet runs a cell that starts with one of these as a formula (a
# key named `=HYPERLINK(...)` became a link that sends data away). Such a cell gets a leading `'`.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: object) -> object:
    """`value` fit for a CSV a spreadsheet opens: text starting like a formula is prefixed with `'`
    (numbers are written as they are)."""
    return f"'{value}" if isinstance(value, str) and value.startswith(_FORMULA_START) else value


KeyFilterOpt = Annotated[
    list[str] | None, typer.Option("--key", help="A key's name or id (repeat for more).")
]


def usage(
    key: KeyFilterOpt = None,
    since: Annotated[str | None, typer.Option(
        "--since", help="Start: 24h, 7d, 30m (ago), 2026-12-01, 2026-12-01T10:00 (UTC) or Unix seconds. "
                        "Default: 24h.")] = None,
    until: Annotated[str | None, typer.Option("--until", help="End (same spellings). Default: now.")] = None,
    as_csv: Annotated[bool, typer.Option("--csv", help="One CSV row per key, model and hour.",
                                         metavar="")] = False,
    by: Annotated[str, typer.Option("--by", help="Totals per key or per model (key, model).")] = "key",
    keys: KeysOpt = None,
    api: ApiOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Usage per key and model per hour, with totals per key or model (the engine's own token counts)."""
    if as_csv and as_json:
        raise typer.BadParameter("choose one of --json and --csv", param_hint="--csv")
    if by not in GROUPINGS:
        raise typer.BadParameter(f"choose one of {', '.join(GROUPINGS)}", param_hint="--by")
    if api:
        query = [("since", since or ""), ("until", until or ""), ("by", by)] + [("key", k) for k in key or []]
        out: dict[str, Any] = _api(api, "GET", "/usage?" + urllib.parse.urlencode(query))
    else:
        out = _local(keys or paths().keys_db, key or [], since, until, by)
    if as_json:
        typer.echo(json.dumps(out))
        return
    if as_csv:
        writer = csv.DictWriter(sys.stdout, fieldnames=_COLUMNS, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        writer.writerows({k: csv_cell(v) for k, v in row.items()} for row in out["rows"])
        return
    _table(out)


def _local(
    keys_db: Path, wanted: list[str], since: str | None, until: str | None, by: str = "key"
) -> dict[str, Any]:
    store = KeyStore(keys_db)
    try:
        start, end = parse_range(since, until)
        records = store.list(include_revoked=True)
        ids = resolve_keys(wanted, records) if wanted else None
        rows = UsageStore(usage_path(keys_db)).query(ids, start, end)
    except RangeError as exc:
        typer.echo(f"error: --{exc}", err=True)
        raise typer.Exit(2) from exc
    except UsageStoreError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    return report(rows, records, start, end, by)


def _table(out: dict[str, Any]) -> None:
    span = (f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime(out['since']))} – "
            f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime(out['until']))} UTC")
    if not out["rows"]:
        typer.echo(f"no usage recorded {span}")
        return
    typer.echo(f"{'HOUR (UTC)':<18} {'KEY':<24} {'MODEL':<20} {'REQ':>7} {'ERR':>5} {'PROMPT':>10} "
               f"{'COMPLETION':>11} {'TOTAL':>11}")
    for r in out["rows"]:
        name = _shown(r.get("key_name") or r["key_id"])
        model = _shown(r.get("model") or "-")
        typer.echo(f"{r['hour_utc'][:16]:<18} {name[:24]:<24} {model[:20]:<20} {r['requests']:>7} "
                   f"{r['errors']:>5} {r['prompt_tokens']:>10} {r['completion_tokens']:>11} "
                   f"{r['total_tokens']:>11}")
    typer.echo(f"totals {span}" + (" per model:" if out.get("by") == "model" else ":"))
    for t in out["totals"]:
        name = _shown((t.get("model") or "-") if "model" in t else (t.get("key_name") or t["key_id"]))
        typer.echo(f"{'':<18} {name[:24]:<24} {t['requests']:>7} {t['errors']:>5} {t['prompt_tokens']:>10} "
                   f"{t['completion_tokens']:>11} {t['total_tokens']:>11}")


def register(app: typer.Typer) -> None:
    """Add this module's command to the `appliance` app."""
    app.command("usage")(usage)
