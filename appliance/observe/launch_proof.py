"""Kernel-path and deployment proof of a launch, from its log and file digests. Pure.

DOMAIN §7 (seeds 003/004): a new engine path must prove it ran with a log line ("… selected."),
and a deployment is verified file by file (e.g. `_C_stable_libtorch`, whose rollback brings back the
packed-SiLU NaN bug, DOMAIN §5). The seed also records, for every run, the versions the engine
reports and the compile cache's load/compile activity per rank (an AOT hit on rank 0 and a
recompile on rank 3 is a cold start, S11m). This module turns the log text and the digests the
controller computed into that record; controller/evaluation/proof.py gathers the inputs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from pydantic import BaseModel, Field

from appliance.observe.log_phases import PhaseTracker

# log_phases markers that mean "loaded from the compile cache" vs "compiled now" (DOMAIN §4).
LOAD_MARKERS = frozenset({"aot_load", "graph_cache_load", "fx_graph_cache_hit", "aot_autograd_cache_hit"})
COMPILE_MARKERS = frozenset(
    {
        "graph_compiled",
        "fx_graph_cache_miss",
        "aot_autograd_cache_miss",
        "load_failure_recompile",
        "source_changed",
    }
)
# vLLM prefixes worker lines with the process name: "(VllmWorker TP1 pid=…)", "(Worker_TP3 pid=…)",
# "(EngineCore_DP0 pid=…)"; torch's own loggers (TORCH_LOGS) prefix "[rank0]:". Lines without any
# come from the API server or a single-process engine.
_RANK = re.compile(
    r"\((?:VllmWorker|Worker)[ _]?(?:TP|rank)?\s*(\d+)|\((EngineCore)(?:_DP\d+)?\s+pid=|^\[rank(\d+)\]:"
)
_VERSIONS = (
    ("vllm", re.compile(r"vLLM API server version (\S+)")),
    ("vllm_engine", re.compile(r"Initializing a V\d LLM engine \(v?([^)]*)\)")),
    ("torch", re.compile(r"\btorch(?: version)?[ =:]+v?(\d+\.\d+[\w.+-]*)")),
)


# The scheduler limits as the engine itself states them at INFO (vLLM 0.26 / 0.32, the H200 and CPU
# fixture logs: "Chunked prefill is enabled with max_num_batched_tokens=8192."). vLLM states its
# defaulted max_num_seqs only at DEBUG ("Defaulting max_num_seqs to …", engine/arg_utils.py), which
# DOMAIN §2 forbids; the pattern is kept for engines that print it in their config line.
_LIMITS = (
    ("max_num_batched_tokens", re.compile(r"\bmax_num_batched_tokens=(\d+)")),
    ("max_num_seqs", re.compile(r"\bmax_num_seqs=(\d+)")),
)


def engine_limits(text: str) -> dict[str, int]:
    """The effective scheduler limits the engine logged (the last statement wins: a restart's)."""
    found: dict[str, int] = {}
    for name, pattern in _LIMITS:
        values = pattern.findall(text)
        if values:
            found[name] = int(values[-1])
    return found


# Must-not-appear markers every launch is checked for (DOMAIN §7: "no Traceback, no graph-capture
# failure, no service process exit"); a recipe adds its own in `expect.forbidden_markers`.
DEFAULT_FORBIDDEN_MARKERS: tuple[str, ...] = (
    "Traceback (most recent call last)",
    "EngineDeadError",
    "Engine core proc",  # vLLM: "Engine core proc EngineCore_DP0 died unexpectedly"
)


# Log text that proves only the mode an engine was asked for, not the kernels it ran: the config line's
# `enforce_eager=True|False` is the same for C and C′, for the FP8 emulation kernel and its 1984.8 ms
# Triton fallback, for custom all-reduce and PyNCCL (seed 000 S13: "两臂 AR 实际都选 PYNCCL").
MODE_ONLY_MARKERS: tuple[str, ...] = ("enforce_eager=",)


def proves_path(marker: str) -> bool:
    """Whether a declared marker says which path ran (an attention backend, a graph mode and its
    capture sizes, the all-reduce choice, a '… selected.' line), not only the mode."""
    return not any(marker.startswith(m) for m in MODE_ONLY_MARKERS)


def digest_algorithm(digest: str) -> str:
    """md5 for 32 hex characters (the seed's deployment checks), sha256 for 64."""
    return "md5" if len(digest) == 32 else "sha256"


class RankCounts(BaseModel):
    loads: int = 0
    compiles: int = 0


class LaunchProof(BaseModel):
    markers: dict[str, bool] = Field(default_factory=dict)  # declared marker → seen in the log
    checksums: dict[str, bool] = Field(default_factory=dict)  # declared path → digest matched
    forbidden: dict[str, bool] = Field(default_factory=dict)  # must-not-appear marker → seen
    actual_checksums: dict[str, str | None] = Field(default_factory=dict)  # None: unreadable
    versions: dict[str, str] = Field(default_factory=dict)
    engine_limits: dict[str, int] = Field(default_factory=dict)  # what the engine logged (engine_limits)
    ranks: dict[str, RankCounts] = Field(default_factory=dict)
    compile_cache: dict[str, object] = Field(default_factory=dict)
    host: dict[str, int | None] = Field(default_factory=dict)

    @property
    def problems(self) -> list[str]:
        out = [f"log marker not seen: {m!r}" for m, seen in self.markers.items() if not seen]
        for path, ok in self.checksums.items():
            if not ok:
                actual = self.actual_checksums.get(path)
                out.append(f"checksum mismatch: {path} ({'unreadable' if actual is None else actual[:16]})")
        out += [f"must-not-appear marker seen: {m!r}" for m, seen in self.forbidden.items() if seen]
        return out


def rank_of(line: str) -> str:
    m = _RANK.search(line)
    if m is None:
        return "main"
    if m.group(1) is not None or m.group(3) is not None:
        return f"rank{m.group(1) or m.group(3)}"
    return "engine-core"


def per_rank_counts(lines: Sequence[str]) -> dict[str, RankCounts]:
    out: dict[str, RankCounts] = {}
    tracker = PhaseTracker()
    for line in lines:
        for event in tracker.feed(line, 0.0):
            if event.marker in LOAD_MARKERS or event.marker in COMPILE_MARKERS:
                counts = out.setdefault(rank_of(line), RankCounts())
                if event.marker in LOAD_MARKERS:
                    counts.loads += 1
                else:
                    counts.compiles += 1
    return out


def versions(text: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for name, pattern in _VERSIONS:
        m = pattern.search(text)
        if m:
            found[name] = m.group(1).strip()
    return found


def evaluate(
    log_text: str,
    markers: Sequence[str],
    expected: Mapping[str, str],
    actual: Mapping[str, str | None],
    forbidden: Sequence[str] = DEFAULT_FORBIDDEN_MARKERS,
) -> LaunchProof:
    """Which declared markers appear (substring match, as an operator greps), which must-not-appear
    markers do, and which declared digests (md5 or sha256, `actual` computed with the same
    algorithm) match what was read (a file that could not be read is a mismatch)."""
    return LaunchProof(
        markers={m: m in log_text for m in markers},
        forbidden={m: m in log_text for m in dict.fromkeys(forbidden)},
        checksums={p: actual.get(p) is not None and actual.get(p) == d.lower() for p, d in expected.items()},
        actual_checksums={p: actual.get(p) for p in expected},
        versions=versions(log_text),
        engine_limits=engine_limits(log_text),
        ranks=per_rank_counts(log_text.splitlines()),
    )
