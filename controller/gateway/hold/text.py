"""How the status (CLI and console Now page) says the gateway's hold during a planned switch:
"holding 3 requests (restart), each up to 75 s; ready in ~35 s" (controller/gateway/hold/queue.py).
Plain text from the status' ``hold`` object; no imports, so the CLI can use it cheaply."""

from __future__ import annotations

from typing import Any


def _secs(v: float) -> str:
    return f"{v:.0f} s" if v < 120 else f"{int(v // 60)} min {int(v % 60):02d} s"


def status_line(hold: dict[str, Any] | None) -> str:
    """"" when there is no hold."""
    if not hold:
        return ""
    waiting = hold.get("waiting")
    held = ("holding new requests" if not isinstance(waiting, int)
            else f"holding {waiting} request{'' if waiting == 1 else 's'}")
    text = f"{held} ({hold.get('reason')})"
    wait = hold.get("wait_s")
    if isinstance(wait, int | float):
        text += f", each up to {_secs(wait)}"
    ready_in = hold.get("ready_in_s")
    if isinstance(ready_in, int | float):
        text += f"; ready in ~{_secs(ready_in)}" if ready_in >= 1 else "; ready any moment now"
    return text
