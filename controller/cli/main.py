"""The `appliance` command. Each command group lives in its own module and registers itself here."""

from __future__ import annotations

from importlib import metadata
from typing import Annotated

import typer

from controller.cli.options import flags_show_no_type

DISTRIBUTION = "llm-appliance"  # pyproject.toml [project] name

app = typer.Typer(
    name="appliance",
    help="Serve LLMs on memory-starved GPU hosts: recipes, supervised launches, host watch, gateway.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
flags_show_no_type()


def package_version() -> str:
    """The installed package's version (importlib.metadata), or a sentence saying it is not installed."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return f"unknown ({DISTRIBUTION} is not installed: `pip install -e .`)"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"appliance {package_version()}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option(
        "--version", help="Print the appliance's version and exit.", metavar="", is_eager=True,
        callback=_print_version)] = False,
) -> None:
    """Serve LLMs on memory-starved GPU hosts: recipes, supervised launches, host watch, gateway."""


def _register() -> None:
    # Imported here so that `appliance --help` stays fast and one broken group names itself.
    from controller.cli import (
        api_cmd,
        choose_cmd,
        doctor_cmd,
        engine_cmd,
        evaluation_cmd,
        gateway_cmd,
        gpu_cmd,
        host_cmd,
        keys_cmd,
        lifecycle_cmd,
        recipes_cmd,
        token_cmd,
        usage_cmd,
    )

    for module in (recipes_cmd, doctor_cmd, engine_cmd, lifecycle_cmd, api_cmd, host_cmd, gateway_cmd,
                   keys_cmd, evaluation_cmd, choose_cmd, gpu_cmd, usage_cmd, token_cmd):
        module.register(app)


def main() -> None:
    _register()
    app()


if __name__ == "__main__":
    main()
