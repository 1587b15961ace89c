"""Options every command group spells the same way.

`--json` is a flag: `--json` alone, never `--json true`. Typer's help shows a bool option's type
(`<bool>`), which reads as "takes a value"; the empty metavar shows it as the flag it is.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
import typer.core

JSON_HELP = "Print machine-readable JSON (a flag: no value)."

JsonOpt = Annotated[bool, typer.Option("--json", help=JSON_HELP, metavar="")]


def flags_show_no_type() -> None:
    """Every flag's help without a type: typer 0.29 shows `<bool>` beside each flag (`--help`
    included, which no metavar can reach), read as "takes a value". A flag takes none, so its type
    column stays empty; options that take a value keep theirs. Applied once, by `main`.

    `display_type_rich` is typer's own (0.29), not API: typer is pinned (pyproject) and
    tests/unit/test_cli_typer_pin.py fails when it changes. Where another typer runs the CLI (the lent
    GPU host's image has an older one, which has no such method) the help keeps typer's own look
    instead of the CLI failing at import."""
    option = typer.core.TyperOption
    shown = getattr(option, "display_type_rich", None)
    if shown is None or getattr(shown, "_flag_aware", False):
        return

    def display_type_rich(self: typer.core.TyperOption, ctx: Any) -> str | None:
        if self.is_flag and self.metavar is None:
            return None
        typed: str | None = shown(self, ctx)
        return typed

    display_type_rich._flag_aware = True  # type: ignore[attr-defined]
    option.display_type_rich = display_type_rich  # type: ignore[method-assign]
