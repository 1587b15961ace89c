"""Finding the known signatures in text: a saved engine log, `dmesg`/kmsg or the journal. Pure.

`scan_text(text)` finds every signature of the table (appliance/diagnosis/signatures.py) in a saved
engine log or `dmesg`/kmsg text — failures, degradations (a compile-cache miss) and the benign lines
that alarm newcomers (``Using default W8A8 Block FP8 kernel config``, ``rocblaslt warning: No paths
matched``: expected on Z100, ignore). `oom_events_in_text` and `gpu_events_in_kernel_text` find the
kernel's OOM kills and GPU events in saved kernel text for `doctor` (appliance.observe.kmsg and
appliance.observe.gpu_events do the parsing).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from pydantic import BaseModel, ConfigDict

from appliance.diagnosis.signatures import CONTEXT_LINES, SIGNATURES, DiagnosisCode, Severity, Signature
from appliance.observe.gpu_events import GpuEvent, gpu_events_in_text
from appliance.observe.kmsg import OomAssembler, OomEvent, OomEventKind


class Finding(BaseModel):
    """One signature found in a text: how often, where first, and what to do."""

    model_config = ConfigDict(frozen=True)

    code: DiagnosisCode
    severity: Severity
    benign: bool
    count: int
    first_line_no: int  # 1-based
    evidence: tuple[str, ...]  # up to three matching lines, "N: text"
    summary: str
    hint: str
    fact: str
    retryable: bool


# --- kernel OOM records ---------------------------------------------------------------------------

# Kernel lines come as /dev/kmsg records ("6,466,234772597,-;msg"), `dmesg` ("[  234.772597] msg"),
# `dmesg -T` ("[Sat Nov 29 07:13:00 2026] msg") or the journal ("Nov 29 07:13:00 host kernel: msg").
_KMSG_PREFIX = re.compile(r"^\d+,\d+,\d+,[^;]*;")
_DMESG_PREFIX = re.compile(r"^\s*(?:<\d+>)?\[[^\]]*\]\s?")
_JOURNAL_PREFIX = re.compile(r"^\w{3} +\d+ [\d:]+ \S+ kernel: ")


def kernel_message(line: str) -> str:
    """The kernel's message text of one saved kernel-log line, whatever tool saved it."""
    for prefix in (_KMSG_PREFIX, _DMESG_PREFIX, _JOURNAL_PREFIX):
        m = prefix.match(line)
        if m is not None:
            return line[m.end():]
    return line


def oom_events_in_text(lines: Iterable[str]) -> list[OomEvent]:
    """Kernel OOM kills in saved dmesg/kmsg/journal text (appliance.observe.kmsg does the parsing)."""
    assembler = OomAssembler()
    events: list[OomEvent] = []
    for line in lines:
        events.extend(assembler.feed_message(kernel_message(line.rstrip("\r\n"))))
    events.extend(assembler.flush())
    return [e for e in events if e.kind is OomEventKind.KILL]


def gpu_events_in_kernel_text(lines: Iterable[str]) -> list[GpuEvent]:
    """GPU kernel events (Xid, amdgpu resets …) in saved dmesg/kmsg/journal text, for `doctor`."""
    return gpu_events_in_text([kernel_message(line.rstrip("\r\n")) for line in lines])


def clip(text: str, limit: int = 320) -> str:
    """Shorten a long line in the middle: the head says who logged it, the tail holds the reason
    (``… load failure from <a 150-character path>, reason: 'function' object has no attribute …``)."""
    if len(text) <= limit:
        return text
    head = limit * 2 // 5
    return f"{text[:head]} … {text[-(limit - head - 3):]}"


# --- scanning text --------------------------------------------------------------------------------


def _matches(sig: Signature, lines: Sequence[str], i: int) -> bool:
    line = lines[i]
    if not any(p.search(line) for p in sig.patterns):
        return False
    if sig.needs_context or sig.unless_context:
        window = lines[max(0, i - CONTEXT_LINES): i + CONTEXT_LINES + 1]
        if sig.needs_context and not any(p.search(w) for w in window for p in sig.needs_context):
            return False
        if sig.unless_context and any(p.search(w) for w in window for p in sig.unless_context):
            return False
    return True


def _first_line(patterns: tuple[re.Pattern[str], ...], lines: Sequence[str]) -> int | None:
    return next((i for i, line in enumerate(lines) if any(p.search(line) for p in patterns)), None)


def scan_lines(lines: Sequence[str]) -> list[Finding]:
    """Every signature in `lines`, one Finding per code, in the order of `SIGNATURES`."""
    hits: dict[DiagnosisCode, list[int]] = {}
    clean = [line.rstrip("\r\n") for line in lines]
    # Where each row's `only_before` first appears: its triggers count only above that line.
    cutoff = {sig.code: _first_line(sig.only_before, clean) for sig in SIGNATURES if sig.only_before}
    for i in range(len(clean)):
        for sig in SIGNATURES:
            end = cutoff.get(sig.code)
            if end is not None and i > end:
                continue
            if _matches(sig, clean, i):
                hits.setdefault(sig.code, []).append(i)
    findings: list[Finding] = []
    for sig in SIGNATURES:
        where = hits.get(sig.code)
        if not where:
            continue
        findings.append(Finding(
            code=sig.code, severity=sig.severity, benign=sig.benign, count=len(where),
            first_line_no=where[0] + 1,
            evidence=tuple(f"{i + 1}: {clip(clean[i].strip())}" for i in where[:3]),
            summary=sig.summary, hint=sig.hint, fact=sig.fact, retryable=sig.retryable,
        ))
    return findings


def scan_text(text: str) -> list[Finding]:
    """Every signature in a saved engine log or dmesg/kmsg text (benign ones flagged as such)."""
    return scan_lines(text.split("\n"))
