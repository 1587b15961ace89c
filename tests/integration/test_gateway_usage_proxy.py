"""Usage and token quotas through the real gateway (uvicorn, real sockets) in front of the synthetic
upstream, which reports usage the way vLLM does (body always; streams when asked, running totals on
every event when asked). The real engine's side is test_gateway_engine.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bench.synthetic_upstream import Shape, SyntheticUpstream
from controller.gateway.config import GatewayConfig
from controller.gateway.embedded import serve_in_loop
from controller.gateway.keystore import KeyStore
from controller.gateway.usage.store import UsageStore

pytestmark = pytest.mark.timeout(120)
CHUNKS = 6


@pytest.fixture
async def upstream() -> AsyncIterator[SyntheticUpstream]:
    up = SyntheticUpstream(Shape(ttft_s=0.01, chunks=CHUNKS, interval_s=0.002), model="served")
    await up.start()
    yield up
    await up.stop()


def _config(tmp_path: Path, upstream: SyntheticUpstream, **kw: Any) -> GatewayConfig:
    return GatewayConfig(keys_db=tmp_path / "keys.db", port=0, upstream_url=upstream.url,
                         served_model="served", key_refresh_s=0.2, usage_flush_s=0.2, **kw)


def _h(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _prompt_tokens(up: SyntheticUpstream) -> int:
    return max(1, len(up.requests[-1].body) // 4)  # the synthetic upstream's rule


async def test_usage_per_key_and_the_client_gets_what_it_asked(
    tmp_path: Path, upstream: SyntheticUpstream
) -> None:
    store = KeyStore(tmp_path / "keys.db")
    rec, key = store.create("a")
    async with serve_in_loop(_config(tmp_path, upstream)) as gw, aiohttp.ClientSession() as s:
        expected_prompt = 0
        body: dict[str, Any] = {"model": "served", "stream": True,
                                "messages": [{"role": "user", "content": "hi"}]}
        async with s.post(gw.url + "/v1/chat/completions", json=body, headers=_h(key)) as r:
            got = await r.read()
        assert b'"usage"' not in got and got.endswith(b"data: [DONE]\n\n")
        assert got.count(b"data: ") == CHUNKS + 2  # the events vLLM sends a client that asks nothing
        sent_upstream = json.loads(upstream.requests[-1].body)
        assert sent_upstream["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
        expected_prompt += _prompt_tokens(upstream)

        body["stream_options"] = {"include_usage": True}
        async with s.post(gw.url + "/v1/completions", json=body, headers=_h(key)) as r:
            events = [e for e in (await r.read()).split(b"\n\n") if e]
        assert [e for e in events if b'"usage"' in e] == [events[-2]]  # the final usage event only
        expected_prompt += _prompt_tokens(upstream)

        async with s.post(gw.url + "/v1/chat/completions", json={"model": "served"}, headers=_h(key)) as r:
            assert (await r.json())["usage"]["completion_tokens"] == CHUNKS
        expected_prompt += _prompt_tokens(upstream)

        async with s.get(gw.url + "/metrics") as r:
            text = await r.text()
        tokens = f'appliance_gateway_tokens_total{{key_id="{rec.id}",kind='
        assert f'{tokens}"completion"}} {3 * CHUNKS}.0' in text
        assert f'{tokens}"prompt"}} {expected_prompt}.0' in text
        await gw.app.accounting.flush()
    [row] = UsageStore(tmp_path / "usage.sqlite3").query()
    assert (row.key_id, row.requests, row.errors) == (rec.id, 3, 0)
    assert (row.prompt_tokens, row.completion_tokens) == (expected_prompt, 3 * CHUNKS)


async def test_token_quota_refuses_after_the_budget_and_survives_a_restart(
    tmp_path: Path, upstream: SyntheticUpstream
) -> None:
    store = KeyStore(tmp_path / "keys.db")
    _, key = store.create("q", tpd_limit=10)  # a day budget one request overspends
    _, other = store.create("other")
    body = {"model": "served", "stream": True, "prompt": "hello"}
    async with serve_in_loop(_config(tmp_path, upstream)) as gw, aiohttp.ClientSession() as s:
        async with s.post(gw.url + "/v1/completions", json=body, headers=_h(key)) as r:
            streamed = await r.read()
        # Never cut: the whole stream arrives although it spends more than the budget.
        assert r.status == 200 and streamed.endswith(b"data: [DONE]\n\n")
        async with s.post(gw.url + "/v1/completions", json=body, headers=_h(key)) as r:
            assert r.status == 429
            retry = int(r.headers["Retry-After"])
            assert "10 tokens per day" in (await r.json())["error"]["message"]
        spent = _prompt_tokens(upstream) + CHUNKS
        # The bucket refills 10 tokens a day: back above zero after (spent - 10) / (10 / 86400) s.
        assert retry == pytest.approx((spent - 10) * 8640 + 8640, abs=2)
        async with s.post(gw.url + "/v1/completions", json=body, headers=_h(other)) as r:
            assert r.status == 200  # another key is not affected
            await r.read()
    # A new gateway on the same files: the day's budget is still spent.
    async with (
        serve_in_loop(_config(tmp_path, upstream)) as gw,
        aiohttp.ClientSession() as s,
        s.post(gw.url + "/v1/completions", json=body, headers=_h(key)) as r,
    ):
        assert r.status == 429


async def test_unwritable_usage_store_does_not_fail_requests(
    tmp_path: Path, upstream: SyntheticUpstream
) -> None:
    store = KeyStore(tmp_path / "keys.db")
    _, key = store.create("a")
    blocked = tmp_path / "usage-is-a-directory"
    blocked.mkdir()
    cfg = _config(tmp_path, upstream, usage_db=blocked, usage_max_pending=1)
    async with serve_in_loop(cfg) as gw, aiohttp.ClientSession() as s:
        for _ in range(3):
            async with s.post(gw.url + "/v1/completions", json={"prompt": "x"}, headers=_h(key)) as r:
                assert r.status == 200
        await gw.app.accounting.flush()
        async with s.get(gw.url + "/metrics") as r:
            text = await r.text()
    assert "appliance_gateway_usage_store_errors_total 0.0" not in text
    assert 'appliance_gateway_usage_pending_rows 1.0' in text


async def test_a_client_leaving_mid_stream_is_counted_up_to_what_the_upstream_sent(tmp_path: Path) -> None:
    """The client stops reading, then leaves: what the upstream had sent meanwhile (piled up in
    buffers, its running totals included) is still read by the gateway before it closes, so the
    count is the upstream's last total, not the last event the client took."""
    up = SyntheticUpstream(Shape(ttft_s=0.01, chunks=2000, interval_s=0.0005, pad=2000), model="served")
    await up.start()
    try:
        store = KeyStore(tmp_path / "keys.db")
        rec, key = store.create("a")
        async with serve_in_loop(_config(tmp_path, up)) as gw:
            client = aiohttp.ClientSession()
            r = await client.post(gw.url + "/v1/chat/completions", json={"model": "served", "stream": True},
                                  headers=_h(key))
            seen = 0
            while seen < 5:
                seen += (await r.content.readany()).count(b"data: ")
            await asyncio.sleep(0.5)  # not reading: the socket buffers fill, the upstream pauses
            r.close()
            await client.close()
            for _ in range(100):  # bounded: 5 s for the gateway to count the abandoned request
                await gw.app.accounting.flush()
                rows = UsageStore(tmp_path / "usage.sqlite3").query()
                if rows:
                    break
                await asyncio.sleep(0.05)
        [row] = rows
        sent = bytes(up.requests[-1].sent)
        last = [e for e in sent.split(b"\n\n") if b'"usage"' in e][-1]
        upstream_total = json.loads(last[len(b"data: "):])["usage"]["completion_tokens"]
        assert 5 <= upstream_total < 2000  # left mid-stream
        assert (row.key_id, row.errors, row.completion_tokens) == (rec.id, 1, upstream_total)
    finally:
        await up.stop()
