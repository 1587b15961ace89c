"""Progress of concurrent requests arrives as each completes (bench's concurrency run, the
fingerprint's batch), and `fingerprint` says why a restart comparison is missing when earlier
launches of the variant exist."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from appliance.evaluation.bench_result import RequestRecord
from appliance.evaluation.bench_tiers import Tier, TierPlan
from appliance.evaluation.fingerprint import Comparison, Fingerprint
from controller.cli import evaluation_cmd
from controller.evaluation import fingerprint as fingerprint_mod
from controller.evaluation.bench import (
    SEED_TTFT_INPUTS,
    BenchParams,
    LaunchInfo,
    PromptCache,
    run_single_stream,
)
from controller.evaluation.client import Completion
from controller.evaluation.fingerprint import FingerprintRun, measure

LAUNCH = LaunchInfo(launch_id="L2", recipe="r", spec_hash="h", cache_vintage="warm", cache_root="/c",
                    engine_url="http://e")


class _Staggered:
    """Request k of a concurrent batch takes k × 20 ms; `finished` counts the ones done."""

    def __init__(self) -> None:
        self.finished = 0

    async def timed(self, tier: str, index: int, prompt: list[int], max_tokens: int,
                    ignore_eos: bool) -> RequestRecord:
        await asyncio.sleep(0.02 * index if tier == "conc" else 0)
        self.finished += 1
        return RequestRecord(tier=tier, index=index, input_tokens=len(prompt), output_tokens=4,
                             ttft_ms=1.0, tpot_ms=1.0, latency_ms=5.0, ok=True)

    async def tokens(self, prompt: str, max_tokens: int) -> Completion:
        await asyncio.sleep(0.02 * (hash(prompt) % 5))
        self.finished += 1
        return Completion(text="x", token_ids=[1, 2, 3], finish_reason="length")

    async def tokenize(self, text: str) -> list[int]:
        return list(range(len(text.split())))


def test_the_concurrency_run_reports_each_request_as_it_completes() -> None:
    client = _Staggered()
    prompts = PromptCache()

    async def ids(tier: str, index: int, length: int) -> list[int]:
        return [1] * length

    prompts.ids = ids  # type: ignore[method-assign]
    seen: list[tuple[int, int]] = []  # (done, requests finished when reported)

    def progress(event: dict[str, Any]) -> None:
        if event.get("phase") == "conc":
            seen.append((int(event["done"]), client.finished))

    plan = TierPlan(tiers=(Tier(name="4-8K", lo=64, hi=128, weight=1.0),), scale=1.0, max_model_len=4096,
                    output_tokens=4)
    asyncio.run(run_single_stream(client, prompts, plan, BenchParams(conc=4), progress))  # type: ignore[arg-type]
    assert [d for d, _ in seen] == [1, 2, 3, 4]
    before = 5 + len(SEED_TTFT_INPUTS)  # the decode samples and TTFT probes, before the concurrent run
    # Each reported right as it finished: the first while three were still running.
    assert all(finished == before + done for done, finished in seen), seen


def test_the_fingerprint_batch_reports_each_request_as_it_completes(monkeypatch: pytest.MonkeyPatch) -> None:
    client = _Staggered()

    class _Ctx:
        def __init__(self, *args: Any) -> None:
            pass

        async def __aenter__(self) -> Any:
            async def discover() -> tuple[str, int]:
                return "m", 4096
            client.discover = discover  # type: ignore[attr-defined]
            return client

        async def __aexit__(self, *args: Any) -> None:
            return None

    monkeypatch.setattr(fingerprint_mod, "EngineClient", _Ctx)
    events: list[tuple[int, int]] = []

    def progress(event: dict[str, Any]) -> None:
        if event["phase"] == "fingerprint-concurrent":
            events.append((int(event["done"]), client.finished))

    run = asyncio.run(measure(LAUNCH, None, progress=progress))
    total = len(run.streams)
    assert [d for d, _ in events] == list(range(1, total + 1))
    assert events[0][1] < 3 * total  # reported while the batch was still running


def _run(restarts: Comparison | None) -> FingerprintRun:
    same = Comparison(identical=True)
    fp = Fingerprint(prompt_set="v1", max_tokens=32, max_num_seqs=None, concurrency=4, serial_set_hash="a",
                     concurrent_set_hash="a", stream_hashes=["a"], repeats=same, batch=same,
                     restarts=restarts, restart_reference=None)
    return FingerprintRun(id="fp-1", launch=LAUNCH, fingerprint=fp, streams=[[1]], check=None)


def test_fingerprint_names_the_earlier_launches_it_had_no_fingerprint_of(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rows = [{"id": "L2", "spec_hash": "h"}, {"id": "L1", "spec_hash": "h"},
            {"id": "L0", "spec_hash": "other"}]
    earlier = evaluation_cmd.earlier_launches(lambda path: rows, LAUNCH)
    assert earlier == ["L1"]
    evaluation_cmd.print_fingerprint(_run(None), earlier)
    out = capsys.readouterr().out
    assert "no earlier launch" not in out
    assert "1 earlier launch(es) of this variant (L1) but no stored fingerprint of one" in out
    evaluation_cmd.print_fingerprint(_run(None), [])
    assert "no fingerprint of an earlier launch of this variant" in capsys.readouterr().out


def test_bench_progress_lines_show_the_concurrency_run(capsys: pytest.CaptureFixture[str]) -> None:
    evaluation_cmd._progress({"phase": "conc", "done": 3, "total": 8, "ok": True, "error": None})
    assert capsys.readouterr().err.strip() == "conc: 3/8"
