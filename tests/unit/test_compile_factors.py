"""appliance/recipe/compile_factors.py: factors with hashed values, and why a miss happened.
Pure: plain equality on golden values; the log lines are real vLLM 0.26.0 output (H200)."""

from __future__ import annotations

from pathlib import Path

from appliance.observe.log_phases import track_text
from appliance.recipe.compile_factors import (
    CacheSeen,
    CompileFactors,
    DirState,
    MissExplanation,
    MissReason,
    cache_hash,
    cache_seen,
    digest,
    explain_miss,
    factors,
    flag_factors,
    hash_dir,
    model_digest,
)

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "engine_logs" / "gpu-h200"
ROOT = "/root/app/cache/cuda-smollm2-graph-99ebe56812d3/vllm/torch_compile_cache"
AOT = (f"{ROOT}/torch_aot_compile/ac562b7578f112f63287782f09fe29396e3daa91f332f4bd2e9589c007980958"
       "/rank_0_0/model")
ARGV = ("vllm", "serve", "/m", "--dtype", "bfloat16", "--max-model-len", "2048", "--enforce-eager")
KEY = "eng_" + "x" * 43


def _seen(name: str) -> CacheSeen:
    tracker = track_text((LOGS / name).read_text())
    return cache_seen(tracker.events, tracker.cache_evidence)


def test_cold_log_gives_the_cache_dir_hash_and_the_saved_aot_path() -> None:
    seen = _seen("graph-cold.log")
    assert seen.cache_dir == f"{ROOT}/f100a03e45/rank_0_0/backbone"
    assert seen.cache_hash == "f100a03e45"
    assert seen.aot_path == AOT
    assert any("saved AOT compiled function to" in line for line in seen.evidence)


def test_warm_log_gives_the_same_hash_and_the_loaded_aot_path_with_hit_evidence() -> None:
    seen = _seen("graph-warm.log")
    assert (seen.cache_hash, seen.aot_path) == ("f100a03e45", AOT)
    assert any("Directly load AOT compilation from path" in line for line in seen.evidence)
    assert any("Directly load the compiled graph(s)" in line for line in seen.evidence)


def test_cache_hash_and_its_directory() -> None:
    assert cache_hash(f"{ROOT}/f100a03e45/rank_0_0/backbone") == "f100a03e45"
    assert hash_dir(f"{ROOT}/f100a03e45/rank_0_0/backbone") == f"{ROOT}/f100a03e45"
    assert cache_hash(AOT) is None  # the AOT directory is not vLLM's 10-hex factor hash
    assert cache_hash("/tmp/whatever") is None


def test_flags_drop_the_key_file_and_the_key_and_hash_every_value() -> None:
    argv = (*ARGV, "--config", "/run/k/engine.yaml", "--api-key", KEY, "--hf-token=hf_abc")
    assert flag_factors(argv) == {
        "--dtype": digest("bfloat16"), "--enforce-eager": digest(""), "--max-model-len": digest("2048"),
        "<command>": digest("vllm\0serve\0/m"),
    }
    # --config with another path (a fresh 0600 file per launch) is the same factor set.
    assert flag_factors((*ARGV, "--config=/run/other.yaml")) == flag_factors(ARGV)


def test_no_secret_value_appears_in_the_factors() -> None:
    f = factors({"VLLM_API_KEY": KEY, "HF_TOKEN": "hf_secret", "VLLM_X": "1"},
                (*ARGV, "--api-key", KEY), {"vllm": "0.26.0", "torch": "2.9.0"})
    text = f.model_dump_json()
    assert KEY not in text and "hf_secret" not in text
    assert f.env == {"HF_TOKEN": digest("hf_secret"), "VLLM_API_KEY": digest(KEY), "VLLM_X": digest("1")}
    assert f.versions == {"torch": "2.9.0", "vllm": "0.26.0"}


def test_model_digest() -> None:
    a = model_digest([("config.json", 10, 1.0), ("w.safetensors", 99, 2.0)])
    assert a == model_digest([("w.safetensors", 99, 2.9), ("config.json", 10, 1.0)])  # order, sub-second
    assert a != model_digest([("config.json", 10, 1.0), ("w.safetensors", 98, 2.0)])


BASE = factors({"VLLM_CACHE_ROOT": "/c", "VLLM_LOGGING_LEVEL": "INFO", "TOKENIZERS_PARALLELISM": "false"},
               ARGV, {"vllm": "0.26.0", "torch": "2.9.0"}, model="m1")


def test_the_vllm_api_key_bug_is_named_as_an_env_change() -> None:
    before = factors({**dict.fromkeys(["VLLM_CACHE_ROOT"], "/c"), "VLLM_API_KEY": "eng_a"}, ARGV, {})
    after = factors({**dict.fromkeys(["VLLM_CACHE_ROOT"], "/c"), "VLLM_API_KEY": "eng_b"}, ARGV, {})
    assert explain_miss(after, before, previous_id="L1") == MissExplanation(
        reason=MissReason.ENV, details=("env VLLM_API_KEY changed",), compared_with="L1")


def test_first_launch_and_fresh_cache_are_cold_first() -> None:
    assert explain_miss(BASE, None) == MissExplanation(
        reason=MissReason.COLD_FIRST, details=("first launch on this cache root",))
    fresh = explain_miss(BASE, BASE, previous_id="L1", root_emptied_on_purpose=True)
    assert fresh.reason is MissReason.COLD_FIRST


def test_nothing_differs_is_an_honest_unknown() -> None:
    assert explain_miss(BASE, BASE, previous_id="L1") == MissExplanation(
        reason=MissReason.UNKNOWN, details=("no recorded factor differs",), compared_with="L1")


def test_a_non_compile_variable_is_not_a_reason() -> None:
    after = BASE.model_copy(update={"env": {**BASE.env, "TOKENIZERS_PARALLELISM": digest("true")}})
    assert explain_miss(after, BASE).reason is MissReason.UNKNOWN


def test_precedence_and_all_details_kept() -> None:
    env = {"VLLM_CACHE_ROOT": "/c", "VLLM_LOGGING_LEVEL": "DEBUG", "TOKENIZERS_PARALLELISM": "false"}
    after = factors(env, (*ARGV[:-1],), {"vllm": "0.26.1", "torch": "2.9.0"}, model="m2")
    got = explain_miss(after, BASE, previous_id="L1", hashes=("f100a03e45", "0123456789"))
    assert got == MissExplanation(
        reason=MissReason.VERSION,
        details=("version vllm changed (0.26.0 → 0.26.1)", "model files changed (names, sizes or mtimes)",
                 "flag --enforce-eager removed", "env VLLM_LOGGING_LEVEL changed",
                 "vLLM's cache dir hash f100a03e45 → 0123456789"),
        compared_with="L1")


def test_an_emptied_or_deleted_earlier_cache_dir_comes_first() -> None:
    gone = DirState(path=f"{ROOT}/f100a03e45", exists=False)
    assert explain_miss(BASE, BASE, previous_dir=gone) == MissExplanation(
        reason=MissReason.CACHE_EMPTIED,
        details=(f"the earlier cache directory {ROOT}/f100a03e45 was deleted",))
    empty = DirState(path="/d", exists=True, non_empty=False)
    assert explain_miss(BASE, BASE, previous_dir=empty).details == (
        "the earlier cache directory /d was emptied",)
    unknown = DirState(path="/d")  # not on this host: says nothing
    assert explain_miss(BASE, BASE, previous_dir=unknown).reason is MissReason.UNKNOWN


def test_factors_round_trip_through_json() -> None:
    assert CompileFactors.model_validate_json(BASE.model_dump_json()) == BASE
