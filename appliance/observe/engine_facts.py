"""What a GPU engine's start-up log says about the engine itself, for the launch record. Pure.

Kept apart from `log_phases` (which tracks *progress*): these are facts about the start that explain
its speed and memory — which attention backend and model runner ran, and vLLM's own accounting of
the GPU memory at start-up (read on the H200, docs/gpu-h200.md, with upstream vLLM 0.26.0):

- ``Using FLASH_ATTN attention backend out of potential backends: [...]``; ``Using FlashAttention
  version 3``; the model runner (``… V2 model runner …``);
- ``Free memory on device (139.2/139.8 GiB) on startup. Desired GPU memory utilization is (0.3,
  41.9 GiB). Actual usage is 0.26 GiB for weight, 1.4 GiB for peak activation, 0.06 GiB for
  non-torch memory, and 0.39 GiB for CUDAGraph memory. …``;
- ``Available KV cache memory: 41.3 GiB``, ``GPU KV cache size: 1,923,456 tokens``;
- the graph pool: ``Graph capturing finished in 4 secs, took 0.39 GiB``.

Feed lines in order (`EngineFactsReader.feed`); the first value of each fact wins (TP ranks repeat
their lines). Nothing here raises on input text.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

_G = r"(-?\d+(?:\.\d+)?)"


class GpuMemoryBreakdown(BaseModel):
    """vLLM's start-up memory accounting, GiB (absent parts None)."""

    model_config = ConfigDict(frozen=True)

    free_gib: float | None = None
    total_gib: float | None = None
    utilization: float | None = None
    requested_gib: float | None = None
    weights_gib: float | None = None
    peak_activation_gib: float | None = None
    non_torch_gib: float | None = None
    cudagraph_gib: float | None = None


class EngineFacts(BaseModel):
    model_config = ConfigDict(frozen=True)

    attention_backend: str | None = None
    flash_attn_version: int | None = None
    model_runner: str | None = None
    memory: GpuMemoryBreakdown | None = None
    kv_cache_available_gib: float | None = None
    kv_cache_tokens: int | None = None
    graph_capture_seconds: float | None = None
    graph_pool_gib: float | None = None

    def is_empty(self) -> bool:
        return self == EngineFacts()


_ATTENTION = (
    re.compile(r"Using (?:AttentionBackendEnum\.)?([A-Z][A-Z0-9_]+) (?:attention )?backend\b"),
    re.compile(r"Using ([\w ]+?) backend on V1 engine"),
)
_FA_VERSION = re.compile(r"Using FlashAttention version (\d+)")
_RUNNER = re.compile(r"\b(V\d) [Mm]odel [Rr]unner\b|\b[Mm]odel runner:? (V\d|\w+ModelRunner)\b")
_FREE = re.compile(rf"Free memory on device \({_G}/{_G} GiB\)")
_DESIRED = re.compile(rf"Desired GPU memory utilization is \({_G}, {_G} GiB\)")
_PARTS = {
    "weights_gib": re.compile(rf"{_G} GiB for weight"),
    "peak_activation_gib": re.compile(rf"{_G} GiB for peak activation"),
    "non_torch_gib": re.compile(rf"{_G} GiB for non-torch memory"),
    "cudagraph_gib": re.compile(rf"{_G} GiB for CUDAGraph memory"),
}
_KV_AVAILABLE = re.compile(rf"Available KV cache memory: {_G} ?GiB")
_KV_TOKENS = re.compile(r"GPU KV cache size: (\d[\d,_]*) tokens")
_GRAPH_DONE = re.compile(rf"Graph capturing finished in {_G} secs?(?:, took {_G} ?GiB)?")


class EngineFactsReader:
    """Feed engine log lines; `facts` is what they said so far."""

    def __init__(self) -> None:
        self.facts = EngineFacts()

    def feed(self, line: str) -> bool:
        """One line (possibly with a log prefix); True when it added a fact."""
        if len(line) > 4000:  # a tqdm bar redrawn for minutes: no fact lives there
            line = line[-4000:]
        found: dict[str, object] = {}
        f = self.facts
        if f.attention_backend is None:
            for rx in _ATTENTION:
                m = rx.search(line)
                if m:
                    found["attention_backend"] = m.group(1).strip()
                    break
        if f.flash_attn_version is None and (m := _FA_VERSION.search(line)):
            found["flash_attn_version"] = int(m.group(1))
        if f.model_runner is None and (m := _RUNNER.search(line)):
            found["model_runner"] = m.group(1) or m.group(2)
        if f.memory is None and (m := _FREE.search(line)):
            parts: dict[str, float] = {"free_gib": float(m.group(1)), "total_gib": float(m.group(2))}
            if d := _DESIRED.search(line):
                parts.update(utilization=float(d.group(1)), requested_gib=float(d.group(2)))
            for name, rx in _PARTS.items():
                if p := rx.search(line):
                    parts[name] = float(p.group(1))
            found["memory"] = GpuMemoryBreakdown(**parts)
        if f.kv_cache_available_gib is None and (m := _KV_AVAILABLE.search(line)):
            found["kv_cache_available_gib"] = float(m.group(1))
        if f.kv_cache_tokens is None and (m := _KV_TOKENS.search(line)):
            found["kv_cache_tokens"] = int(m.group(1).replace(",", "").replace("_", ""))
        if f.graph_capture_seconds is None and (m := _GRAPH_DONE.search(line)):
            found["graph_capture_seconds"] = float(m.group(1))
            if m.group(2) is not None:
                found["graph_pool_gib"] = float(m.group(2))
        if not found:
            return False
        self.facts = f.model_copy(update=found)
        return True


def read_facts(text: str) -> EngineFacts:
    """The facts of a whole saved log (for `doctor` and tests)."""
    reader = EngineFactsReader()
    for line in text.split("\n"):
        for segment in line.split("\r"):
            reader.feed(segment)
    return reader.facts
