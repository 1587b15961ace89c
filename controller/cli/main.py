"""The `appliance` command. Each command group lives in its own module and registers itself here."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="appliance",
    help="Serve LLMs on memory-starved GPU hosts: recipes, supervised launches, host watch, gateway.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


def _register() -> None:
    # Imported here so that `appliance --help` stays fast and one broken group names itself.
    from controller.cli import (
        api_cmd,
        doctor_cmd,
        engine_cmd,
        evaluation_cmd,
        gateway_cmd,
        host_cmd,
        keys_cmd,
        lifecycle_cmd,
        recipes_cmd,
    )

    for module in (recipes_cmd, doctor_cmd, engine_cmd, lifecycle_cmd, api_cmd, host_cmd, gateway_cmd,
                   keys_cmd, evaluation_cmd):
        module.register(app)


def main() -> None:
    _register()
    app()


if __name__ == "__main__":
    main()
