"""`appliance choose` and `appliance choices [ID]`: choosing a recipe for this host with evidence.

`choose` asks the controller (`POST /choices`, controller/evaluation/router.py) for the plan first —
every recipe of the host's platform with its admission, the baseline, the candidates in the rule's
order with their expected duration from the launch history — asks for confirmation on a terminal
(`--yes` skips it), then starts the tournament in the controller (so a restart resumes it) and follows
its progress with the ETA until the decision record is written. Needs the admin token.
Exit codes: 0 a decision (done, or stopped by the budget with the champion so far), 1 the choice
failed, 2 bad input or refused (a pattern that matches nothing, a refused baseline, a budget too
small, another choice running), 3 not confirmed.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Annotated, Any

import typer

from appliance.evaluation.sla_bound import SlaBound, SlaInputError, parse_sla
from appliance.evaluation.sweep import MAX_VARIANTS, SweepInputError, parse_sweep
from appliance.evaluation.tournament import budget_note
from controller.api_client import ApiError, Client, api_url
from controller.cli.options import JsonOpt

ApiOpt = Annotated[str | None, typer.Option("--api", help="Controller API URL (default $APPLIANCE_API).")]
POLL_S = 2.0


def register(app: typer.Typer) -> None:
    app.command("choose")(choose)
    app.command("choices")(choices)


def _fail(message: str, code: int = 2) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


def _post(client: Client, body: dict[str, Any]) -> dict[str, Any]:
    try:
        out: dict[str, Any] = client.post("/choices", body)
    except ApiError as exc:
        raise _fail(str(exc), 2 if exc.status in (409, 422) else 1) from exc
    return out


def _secs(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s / 60:.1f} min" if s >= 120 else f"{s:.0f} s"


def print_plan(record: dict[str, Any]) -> None:
    fast = " — FAST MODE (capped outputs, not a full measurement)" if record.get("fast") else ""
    typer.echo(f"platform {record['platform']}, recipes {record['pattern']!r}{fast}")
    typer.echo(f"rule: {record['rule']}")
    if record.get("sweep"):
        grid = "; ".join(f"{k}={','.join(map(str, v))}" for k, v in record["sweep"].items())
        typer.echo(f"sweep stage first: {grid} — each recipe's variants gated against each other "
                   f"(--allow-diff {','.join(record['sweep'])}), one picked per recipe")
    if sla := (record.get("settings") or {}).get("sla"):
        typer.echo(f"SLA: {SlaBound.model_validate(sla).words()} — a candidate over it does not "
                   "become champion, a champion over it is not promoted")
    for x in record["lines"]:
        margin = "-" if x.get("margin_gib") is None else f"{x['margin_gib']:.2f} GiB"
        stage = "sweep " if x.get("stage") == "sweep" else ""
        eta = _secs(x.get("eta_s")) + ("*" if x.get("eta_from_history") is False else "")
        typer.echo(f"  {stage}{x['status']:<10} {x['recipe']:<32} {x.get('mode') or '-':<6} "
                   f"margin {margin:<10} ETA {eta:<9} {x['why']}")
    if any(x.get("eta_from_history") is False for x in record["lines"]):
        typer.echo("  * no launch or bench of that variant on this host yet: its ETA is the defaults' guess")
    budget = f" of a {_secs(record['budget_s'])} budget" if record.get("budget_s") else ""
    note = budget_note(float(record["eta_s"]), record.get("budget_s"))
    budget += f" ({note})" if note else ""
    typer.echo(f"expected duration: {_secs(record['eta_s'])}{budget}; serving now: "
               f"{record.get('serving_before') or 'nothing'} (returned to at the end"
               + (", unless the champion is promoted)" if record.get("promote") else ")"))


def time_left(eta_s: float, budget_s: float | None, spent: float) -> float:
    """What is left to wait, about: the ETA's rest, never past the budget (the budget stops the choice
    there, whatever the ETA forecast — a fresh host's default ETA can be far over it)."""
    left = eta_s - spent
    if budget_s is not None:
        left = min(left, budget_s - spent)
    return max(0.0, left)


def _follow(client: Client, choice_id: str, eta_s: float, budget_s: float | None = None) -> dict[str, Any]:
    after, t0 = 0, time.monotonic()
    while True:
        got = client.get(f"/choices/{choice_id}/events?after={after}")
        for e in got["events"]:
            rest = {k: v for k, v in e.items() if k not in ("phase", "recipe", "at")}
            who = f"[{e['recipe']}] " if e.get("recipe") else ""
            typer.echo(f"  {who}{e.get('phase')} {json.dumps(rest, default=str)}", err=True)
        after = got["next"]
        if got["state"] != "running":
            record: dict[str, Any] = client.get(f"/choices/{choice_id}")
            return record
        spent = time.monotonic() - t0
        left = time_left(eta_s, budget_s, spent)
        typer.echo(f"  … {_secs(spent)} spent, about {_secs(left)} left", err=True)
        time.sleep(POLL_S)


def choose(
    recipes: Annotated[str, typer.Option("--recipes", help="Shell pattern(s), comma-separated.")] = "*",
    baseline: Annotated[str | None, typer.Option(help="The baseline (default: the rule's).")] = None,
    budget: Annotated[str | None, typer.Option(help="Stop with the champion so far: 90s, 45m, 2h.")] = None,
    promote: Annotated[bool, typer.Option("--promote", help="Apply the champion at the end.")] = False,
    fast: Annotated[bool, typer.Option("--fast", help="FAST MODE: capped outputs (tests only).")] = False,
    platform: Annotated[str | None, typer.Option(help="cpu, cuda or gfx906 (default: this host's).")] = None,
    sweep: Annotated[list[str] | None, typer.Option(
        "--sweep", help="A sweep stage before the tournament: FIELD=V1,V2,... (max_num_seqs or "
        f"max_num_batched_tokens; repeatable; at most {MAX_VARIANTS} variants per recipe).")] = None,
    sla: Annotated[str | None, typer.Option(
        "--sla", help="A latency bound every tier must hold, P99 in ms: ttft=2000,tpot=80 (either or both). "
        "A candidate over it does not become champion; a champion over it is not promoted.")] = None,
    accuracy: Annotated[bool, typer.Option("--accuracy/--no-accuracy", help="The accuracy veto.")] = True,
    ready_timeout: Annotated[float, typer.Option(help="Seconds an arm may take to become ready.")] = 3600,
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask for confirmation.")] = False,
    plan_only: Annotated[bool, typer.Option("--plan", help="Show the plan and stop.")] = False,
    follow: Annotated[bool, typer.Option("--follow/--no-follow", help="Follow until the record.")] = True,
    api: ApiOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Every recipe of this host's platform → lint → admission → the gate as a tournament (eager
    baseline first, compiled modes after, smaller memory margin last) → a decision record."""
    try:
        grid = parse_sweep(sweep) if sweep else None
        bound = parse_sla(sla) if sla is not None else None
    except (SweepInputError, SlaInputError) as exc:
        raise _fail(str(exc)) from exc
    client = Client(api_url(api))
    body: dict[str, Any] = {"recipes": recipes, "promote": promote, "fast": fast, "accuracy": accuracy,
                            "ready_timeout_s": ready_timeout}
    body |= {"sweep": grid} if grid else {}
    body |= {"sla": bound.model_dump(exclude_none=True)} if bound is not None else {}
    body |= {k: v for k, v in (("baseline", baseline), ("budget", budget), ("platform", platform)) if v}
    planned = _post(client, {**body, "dry_run": True})
    if not as_json or plan_only:
        if as_json:
            typer.echo(json.dumps(planned, indent=2))
        else:
            print_plan(planned)
    if plan_only:
        return
    if not yes and sys.stdin.isatty() and not typer.confirm("Run this choice?"):
        raise typer.Exit(3)
    record = _post(client, body)
    typer.echo(f"choice {record['id']} started", err=True)
    if not follow:
        typer.echo(json.dumps(record, indent=2) if as_json else record["id"])
        return
    try:
        budget_s = record.get("budget_s")
        record = _follow(client, record["id"], float(record.get("eta_s") or 0.0),
                         float(budget_s) if budget_s else None)
    except ApiError as exc:
        raise _fail(f"following {record['id']}: {exc} (the choice goes on in the controller)", 1) from exc
    _show(client, record, as_json, markdown=not as_json)
    if record["state"] in ("failed", "interrupted"):
        raise typer.Exit(1)


def _show(client: Client, record: dict[str, Any], as_json: bool, markdown: bool) -> None:
    if as_json:
        typer.echo(json.dumps(record, indent=2))
    elif markdown:
        typer.echo(client.text(f"/choices/{record['id']}?format=markdown")[0], nl=False)


def choices(
    choice_id: Annotated[str | None, typer.Argument(help="One choice's decision record.")] = None,
    markdown: Annotated[bool, typer.Option("--markdown", help="The record as a Markdown table.")] = False,
    api: ApiOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Choices made on this host, newest first; with an ID, its decision record."""
    client = Client(api_url(api))
    try:
        if choice_id is None:
            rows = client.get("/choices")
            if as_json:
                typer.echo(json.dumps(rows, indent=2))
                return
            for r in rows:
                mode = " FAST" if r["fast"] else ""
                typer.echo(f"{r['id']}  {r['state']:<14} champion {r['champion']:<30} tried {r['tried']}  "
                           f"{r['pattern']}{mode}")
            return
        record = client.get(f"/choices/{choice_id}")
        _show(client, record, as_json, markdown=markdown or not as_json)
    except ApiError as exc:
        raise _fail(str(exc), 2 if exc.status == 404 else 1) from exc
