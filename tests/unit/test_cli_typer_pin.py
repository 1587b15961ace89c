"""The CLI reaches into typer's TyperOption.display_type_rich (cli/options.py): typer is pinned, this
fails when the pinned version's internals change, and a typer without them must not stop the CLI."""

from __future__ import annotations

from importlib.metadata import version
from typing import Any

import pytest
import typer.core

from controller.cli import options


def test_typer_is_the_pinned_version_with_the_method_options_replaces() -> None:
    assert version("typer") == "0.29.2"
    method = typer.core.TyperOption.display_type_rich
    assert callable(method)
    import inspect
    assert list(inspect.signature(method).parameters)[:2] == ["self", "ctx"]


def test_a_typer_without_the_method_leaves_the_help_as_it_is_and_the_cli_loads(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The lent H200's image has an older typer: `appliance` failed at import with AttributeError.
    class OldOption:
        pass

    monkeypatch.setattr(typer.core, "TyperOption", OldOption)
    options.flags_show_no_type()  # must not raise
    assert not hasattr(OldOption, "display_type_rich")


def test_flags_lose_their_type_and_valued_options_keep_it(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []

    class Option:
        def __init__(self, is_flag: bool, metavar: str | None) -> None:
            self.is_flag, self.metavar = is_flag, metavar

        def display_type_rich(self, ctx: Any) -> str | None:
            seen.append("typer's")
            return "<int>"

    monkeypatch.setattr(typer.core, "TyperOption", Option)
    options.flags_show_no_type()
    options.flags_show_no_type()  # applied once: a second call does not wrap the wrapper
    assert Option(is_flag=True, metavar=None).display_type_rich(None) is None
    assert Option(is_flag=False, metavar=None).display_type_rich(None) == "<int>"
    assert seen == ["typer's"]
