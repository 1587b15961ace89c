"""`appliance token rotate`: a new admin token when the old one is lost (or leaked).

Only the token's sha256 is stored (`APPLIANCE_HOME/admin-token.sha256`, controller/admin_token.py),
so a lost token cannot be shown again: rotating writes the hash of a fresh one and prints the token
once. The running controller needs no restart: the API and the console read the hash on every request
(`configured_hash`), so the old token stops working at once and console sessions opened with it end.
Whoever can write APPLIANCE_HOME can rotate: that account owns the appliance already.
"""

from __future__ import annotations

import json

import typer

from appliance import settings
from controller import admin_token
from controller.cli.options import JsonOpt
from controller.settings import paths

token_app = typer.Typer(name="token", help="The operator's admin token.", no_args_is_help=True)


@token_app.command("rotate")
def rotate(as_json: JsonOpt = False) -> None:
    """Replace the admin token with a new one and print it (the only time it is shown). The old token
    is refused from now on, by the running controller too; console sessions must log in again."""
    if settings.current().admin_token_sha256:
        # The environment's hash wins over the file (admin_token.py): a new file would change nothing.
        typer.echo(f"error: the controller takes its admin token hash from ${admin_token.HASH_ENV}; "
                   "set a new hash there (a rotated file would be ignored)", err=True)
        raise typer.Exit(1)
    home = paths().home
    try:
        replaced = admin_token.configured_hash(home) is not None
    except ValueError:
        replaced = True  # a damaged hash file: rotating is how it is mended
    token = admin_token.new_token()
    path = admin_token.write_hash(home, token)
    if as_json:
        typer.echo(json.dumps({"token": token, "hash_file": str(path), "replaced": replaced}))
        return
    typer.echo(f"export {admin_token.TOKEN_ENV}={token}")
    typer.echo(f"new admin token (shown once; only its sha256 is stored in {path}); the old one is refused "
               "from now on, also by the running controller", err=True)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the `appliance` app."""
    app.add_typer(token_app)
