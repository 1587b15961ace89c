"""Grafana dashboard JSON as the tests read it: every panel, those inside rows included.

A collapsed row keeps its panels in its own `panels` list (Grafana's format); an open row's panels
follow it at the top level. Tests that walk `doc["panels"]` alone miss the collapsed ones.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def all_panels(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in doc["panels"]:
        yield panel
        yield from panel.get("panels", [])


def query_panels(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The panels that query something (rows do not)."""
    return (p for p in all_panels(doc) if p["type"] != "row")
