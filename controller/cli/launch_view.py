"""`appliance launches ID`: one launch record as a page to read.

The full record is ~400 lines of JSON (`--json` keeps it, for scripts); by default the reader sees what
the record is for: the phases with their times, the compile-cache verdict and why, the memory peaks,
and the diagnosis. An ID may be given by a unique prefix (`resolve_launch`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import quote

from controller.api_client import ApiError

GIB = 2**30
PREFIX_SEARCH_LIMIT = 1000  # the API's largest page of launch summaries (newest first)


class LaunchLookupError(Exception):
    """No launch, or a prefix that names several; `str(exc)` says which."""


def resolve_launch(get: Callable[[str], Any], launch_id: str) -> dict[str, Any]:
    """The record of launch `launch_id`, or of the one launch whose ID starts with it."""
    try:
        record: dict[str, Any] = get(f"/launches/{quote(launch_id, safe='')}")
        return record
    except ApiError as exc:
        if exc.status != 404:
            raise
    rows = get(f"/launches?limit={PREFIX_SEARCH_LIMIT}")
    matches = [r["id"] for r in rows if str(r["id"]).startswith(launch_id)] if launch_id else []
    if not matches:
        raise LaunchLookupError(f"no launch {launch_id!r} (and no launch ID starts with it; "
                                "`appliance launches` lists them)")
    if len(matches) > 1:
        shown = "\n  ".join(matches[:20]) + ("\n  …" if len(matches) > 20 else "")
        raise LaunchLookupError(f"launch ID prefix {launch_id!r} is ambiguous: {len(matches)} launches "
                                f"start with it; give more characters:\n  {shown}")
    found: dict[str, Any] = get(f"/launches/{quote(matches[0], safe='')}")
    return found


def _when(at: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at)) if at is not None else "-"


def _gib(n: float | None) -> str:
    return f"{n / GIB:.1f} GiB" if n is not None else "-"


def launch_lines(record: dict[str, Any], compile_lines: Sequence[str] = ()) -> list[str]:
    """The readable view of a launch record (`GET /launches/{id}`). `compile_lines`: the compile-cache
    explanation (api_cmd.compile_cache_lines of the record's `compile_cache`)."""
    r = record
    out = [
        f"launch     {r.get('id')}",
        f"recipe     {r.get('recipe')}  ({r.get('kind')}, {r.get('runtime')} runtime, spec "
        f"{str(r.get('spec_hash') or '-')[:16]})",
        f"status     {r.get('status')}",
        f"started    {_when(r.get('started_at') or r.get('created_at'))}",
    ]
    if r.get("ready_s") is not None:
        out.append(f"ready in   {r['ready_s']:.1f} s  (at {_when(r.get('ready_at'))})")
    if r.get("ended_at") is not None or r.get("exit_code") is not None or r.get("exit_signal") is not None:
        how = [f"exit code {r['exit_code']}" if r.get("exit_code") is not None else None,
               f"signal {r['exit_signal']}" if r.get("exit_signal") is not None else None,
               "OOM-killed" if r.get("oom_killed") else None]
        out.append(f"ended      {_when(r.get('ended_at'))}  " + ", ".join(h for h in how if h))

    phases = r.get("phases") or []
    if phases:
        out.append("phases     (seconds since the start)")
        for p in phases:
            detail = f"  {p['detail']}" if p.get("detail") else ""
            out.append(f"  {p.get('elapsed_s', 0.0):8.1f} s  {p.get('name')}{detail}")

    cc = r.get("compile_cache") or {}
    verdict = r.get("cache") or "unknown"
    previous = cc.get("previous_launch")
    against = f" (compared with launch {previous})" if previous else ""
    out.append(f"cache      compile cache {verdict}{against}")
    out += [f"  {line}" for line in compile_lines]

    mem = [f"MemAvailable low {_gib(r.get('mem_available_min_bytes'))}",
           f"swap peak {_gib(r.get('swap_peak_bytes'))}"]
    out.append("memory     " + ", ".join(mem))
    for phase, cards in (r.get("gpu_peaks") or {}).items():
        for card, peak in (cards or {}).items():
            busy = peak.get("busy_max_percent")
            busy_text = f", busy up to {busy:.0f}%" if busy is not None else ""
            out.append(f"  GPU {card} during {phase}: {_gib(peak.get('used_max_bytes'))} of "
                       f"{_gib(peak.get('total_bytes'))}{busy_text}")
    out += _rank_lines((r.get("engine") or {}).get("ranks") or {})
    out += _deployment_lines(r.get("events") or [])
    ooms = r.get("oom") or []
    if ooms:
        victims = sorted({str(o.get("task") or o.get("victim") or "?") for o in ooms})
        out.append(f"OOM        {len(ooms)} kernel OOM record(s); victims: {', '.join(victims)}")

    d = r.get("diagnosis")
    if d:
        out.append(f"diagnosis  {d.get('code')} ({d.get('severity')}): {d.get('summary')}")
        if d.get("hint"):
            out.append(f"  hint:     {d['hint']}")
        for line in (d.get("evidence") or [])[:5]:
            out.append(f"  evidence: {line}")
    else:
        out.append("diagnosis  none")
    out.append(f"(the full record: `appliance launches {r.get('id')} --json`)")
    return out


def _rank_lines(ranks: dict[str, Any]) -> list[str]:
    """Tensor parallel: one line per rank (appliance/observe/rank_logs.py `RankTracker.record`)."""
    if not ranks:
        return []
    out = ["ranks      (each worker process: its own log lines and host RAM)"]
    for rank in sorted(ranks, key=lambda k: int(k) if k.isdigit() else 0):
        v = ranks[rank] or {}
        out.append(f"  rank {rank}: pid {v.get('pid') or '-'}, furthest {v.get('furthest') or '-'}, "
                   f"compile cache {v.get('cache_outcome') or 'unknown'}, "
                   f"RssAnon peak {_gib(v.get('anon_peak_bytes'))}")
    return out


def _deployment_lines(events: Sequence[dict[str, Any]]) -> list[str]:
    """The latest `deployment-proof` event (controller/evaluation/deployment.py): the versions seed
    004 §11 asks to record, and the deployment check's verdict."""
    found = [e for e in events if e.get("kind") == "deployment-proof"]
    if not found:
        return []
    event = found[-1]
    d = event.get("data") or {}
    facts = d.get("facts") or {}
    problems = d.get("problems") or []
    verdict = ("MISMATCH" if problems else
               "as declared" if d.get("declared") else "not declared (versions only)")
    out = [f"deployment {verdict}  (probe landed {_when(event.get('at'))}, {d.get('probe_s', '-')} s)",
           f"  versions: {d.get('versions') or '-'}",
           f"  vllm:     {facts.get('vllm_file') or facts.get('vllm_error') or facts.get('error') or '-'}"]
    out += [f"  problem:  {p}" for p in problems]
    return out
