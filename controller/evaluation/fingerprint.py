"""`appliance fingerprint`: measure a recipe's reproducibility on the running engine.

DOMAIN §2: any evaluation must fix and record max_num_seqs and concurrency, because even eager
changes its token stream with the batch composition. The fixed prompt set is sent serially twice
(repeats), then all at once (batch), at temperature 0 with a fixed max_tokens; the serial streams
are stored so the next launch of the same recipe variant on the same cache root is compared
against them (restarts; cold vs warm when the vintages differ).
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass

from appliance.evaluation.fingerprint import (
    DeclaredCheck,
    Fingerprint,
    check_declared,
    compare_runs,
    set_hash,
    stream_hash,
)
from appliance.evaluation.prompts import FINGERPRINT_PROMPTS, PROMPT_SET_VERSION
from controller.evaluation.bench import LaunchInfo, Progress, _quiet
from controller.evaluation.client import EngineClient
from controller.evaluation.store import EvalStore


@dataclass
class FingerprintRun:
    id: str
    launch: LaunchInfo
    fingerprint: Fingerprint
    streams: list[list[int]]
    check: DeclaredCheck | None


async def measure(
    launch: LaunchInfo,
    store: EvalStore | None,
    *,
    max_tokens: int = 32,
    concurrency: int = 4,
    api_key: str | None = None,
    progress: Progress = _quiet,
    save: bool = True,
) -> FingerprintRun:
    async with EngineClient(launch.engine_url, api_key or launch.engine_key) as c:
        await c.discover()

        async def serial(label: str) -> list[list[int]]:
            out = []
            for i, p in enumerate(FINGERPRINT_PROMPTS):
                out.append((await c.tokens(p, max_tokens)).token_ids)
                progress({"phase": f"fingerprint-{label}", "done": i + 1, "total": len(FINGERPRINT_PROMPTS)})
            return out

        first = await serial("serial")
        again = await serial("repeat")
        gate = asyncio.Semaphore(concurrency)
        done = 0

        async def one(p: str) -> list[int]:
            # Reported as each request completes (not once, when the whole batch has ended).
            nonlocal done
            async with gate:
                ids = (await c.tokens(p, max_tokens)).token_ids
            done += 1
            progress({"phase": "fingerprint-concurrent", "done": done, "total": len(FINGERPRINT_PROMPTS)})
            return ids

        concurrent = list(await asyncio.gather(*(one(p) for p in FINGERPRINT_PROMPTS)))

    ref = (
        store.restart_reference(
            launch.recipe,
            launch.spec_hash,
            launch.cache_root,
            PROMPT_SET_VERSION,
            max_tokens,
            launch.launch_id,
        )
        if store
        else None
    )
    hashes = [stream_hash(s) for s in first]
    fp = Fingerprint(
        prompt_set=PROMPT_SET_VERSION,
        max_tokens=max_tokens,
        max_num_seqs=launch.max_num_seqs,
        concurrency=concurrency,
        serial_set_hash=set_hash(hashes),
        concurrent_set_hash=set_hash([stream_hash(s) for s in concurrent]),
        stream_hashes=hashes,
        repeats=compare_runs(first, again),
        batch=compare_runs(first, concurrent),
        restarts=compare_runs(ref[1], first) if ref else None,
        restart_reference=ref[0] if ref else None,
    )
    check = check_declared(launch.reproducibility, fp) if launch.reproducibility else None
    run = FingerprintRun(
        id=f"fp-{uuid.uuid4().hex[:12]}", launch=launch, fingerprint=fp, streams=first, check=check
    )
    if store is not None and save:
        store.add_fingerprint(
            run.id,
            launch.launch_id,
            launch.recipe,
            launch.spec_hash,
            launch.cache_root,
            launch.cache_vintage,
            fp,
            first,
            check,
        )
    return run
