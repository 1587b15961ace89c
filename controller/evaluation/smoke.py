"""The smoke step of a compare: the first 8–16K request alone, before anything is measured.

The request has its own prompt of the first request's length ("smoke:8-16K"), never the measured
request's tokens: with prefix caching on, those would make round 1's first measured request a
cache hit (seed 004 §163: the single request only rules out crashes). Its output
limit is the tier's, like the measured requests'.

DOMAIN §7 (seed 004 §5.3): failed = 0, the API still alive after it, output length equal to the
control's (the gate applies a stated tolerance, appliance/evaluation/protocol.py), and no new error
in the service log. It only rules out crashes; it says nothing about performance. The engine log is
read through the controller (`GET /launches/{id}/log`) from where the arm became ready: the text
after the engine's last "Application startup complete." line, else everything read after the
offset noted when the compare found the arm ready.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable

from appliance.evaluation.bench_result import SmokeResult
from appliance.evaluation.bench_tiers import TierPlan, input_lengths
from controller.evaluation.bench import PromptCache
from controller.evaluation.client import EngineClient

SMOKE_TIER = "8-16K"  # DOMAIN §7: the first 8–16K request
SMOKE_PROMPT = "smoke"  # the prompt name: its text is not any measured request's
READY_LINE = "Application startup complete."
# What counts as an error line in a vLLM log: its ERROR level, a Python traceback, a dead engine core.
_ERROR = re.compile(r"\bERROR\b|Traceback \(most recent call last\)|EngineDeadError|died unexpectedly")

# (launch id, byte offset) → (text, next offset); the controller's log endpoint.
LogReader = Callable[[str, int], Awaitable[tuple[str, int]]]


def error_lines_since_ready(text: str) -> list[str]:
    """Error lines after the last ready line (the whole text when there is none)."""
    cut = text.rfind(READY_LINE)
    tail = text[cut + len(READY_LINE) :] if cut >= 0 else text
    return [line.strip() for line in tail.splitlines() if _ERROR.search(line)]


async def read_log_from(
    read: LogReader, launch_id: str, offset: int = 0, limit: int = 64 << 20
) -> tuple[str, int]:
    parts: list[str] = []
    size = 0
    while size < limit:
        text, nxt = await read(launch_id, offset)
        if not text or nxt == offset:
            break
        parts.append(text)
        size += len(text)
        offset = nxt
    return "".join(parts), offset


async def run_smoke(
    client: EngineClient,
    prompts: PromptCache,
    plan: TierPlan,
    output_tokens: int,
    ignore_eos: bool,
    *,
    launch_id: str | None,
    read_log: LogReader | None,
) -> SmokeResult:
    tier = next(t for t in plan.tiers if t.name == SMOKE_TIER)
    length = input_lengths(tier)[0]
    # Its own prompt (another text, the same length): never a prefix of a measured request.
    ids = await prompts.ids(f"{SMOKE_PROMPT}:{tier.name}", 0, length)
    rec = await client.timed(tier.name, 0, ids, output_tokens, ignore_eos)
    alive = await client.alive()
    errors: list[str] = []
    checked = False
    if read_log is not None and launch_id:
        try:
            text, _ = await read_log_from(read_log, launch_id)
            errors, checked = error_lines_since_ready(text), True
        except Exception:  # noqa: BLE001 — an unreadable log is recorded as "not checked", never a pass
            checked = False
    return SmokeResult(request=rec, alive_after=alive, new_error_lines=errors, log_checked=checked)
