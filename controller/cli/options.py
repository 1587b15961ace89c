"""Options every command group spells the same way.

`--json` is a flag: `--json` alone, never `--json true`. Typer's help shows a bool option's type
(`<bool>`), which reads as "takes a value"; the empty metavar shows it as the flag it is.
"""

from __future__ import annotations

from typing import Annotated

import typer

JSON_HELP = "Print machine-readable JSON (a flag: no value)."

JsonOpt = Annotated[bool, typer.Option("--json", help=JSON_HELP, metavar="")]
