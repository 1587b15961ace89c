"""`appliance gpu status | reset-done N`: the cards' health as the controller watches it.

`status` prints each card (temperature, power, PCIe link, ECC, remaps, throttling), what admission
would say of it, and the latest kernel GPU events (Xid, amdgpu resets). `reset-done N` tells the
controller that card N was reset (`nvidia-smi -r -i N`, or a reboot): a fatal kernel event on a card
refuses launches on it until then, because the kernel does not say when a card was reset.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from controller.api_client import ApiError, Client, api_url
from controller.cli.api_cmd import ApiOpt, fail
from controller.cli.options import JsonOpt

gpu_app = typer.Typer(name="gpu", help="GPU health: cards, findings, kernel GPU events.",
                      no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(gpu_app)


def _call(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except ApiError as exc:
        raise fail(str(exc), 2 if exc.status in (401, 403, 404, 422) else 1) from exc


@gpu_app.command("status")
def status(as_json: JsonOpt = False, api: ApiOpt = None) -> None:
    """Each card's health and findings, and the latest kernel GPU events."""
    from appliance.observe.gpu_health import CardHealth, card_line

    answer = _call(Client(api_url(api)).get, "/gpu")
    if as_json:
        typer.echo(json.dumps(answer, indent=2))
        return
    fields = set(CardHealth.model_fields)
    for card in answer["cards"]:
        health = CardHealth(**{k: v for k, v in card.items() if k in fields})
        typer.echo(f"{card['verdict']:<6} {card_line(health)}")
        for finding in card["findings"]:
            typer.echo(f"         {finding['message']}")
    if not answer["cards"]:
        typer.echo("no GPU card read on this host")
    if answer.get("blind"):
        typer.echo(f"blind: {answer['blind']}")
    for event in answer["events"]:
        typer.echo(f"event: {event['describe']}")


@gpu_app.command("reset-done")
def reset_done(
    index: Annotated[int, typer.Argument(help="The card's index (`appliance gpu status`).", min=0)],
    as_json: JsonOpt = False,
    api: ApiOpt = None,
) -> None:
    """Say that card INDEX was reset: its fatal kernel events stop refusing launches on it."""
    answer = _call(Client(api_url(api)).post, f"/gpu/{index}/reset")
    if as_json:
        typer.echo(json.dumps(answer, indent=2))
    else:
        typer.echo(f"GPU {index}: {answer['cleared_fatal_events']} fatal event(s) cleared")
