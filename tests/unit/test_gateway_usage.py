"""Usage metering (``usage.meter``), token quotas (``quota``), the usage store and the accounting
between them. The streams are real bytes from vLLM 0.32's OpenAI server (the CPU engine, smollm2),
in tests/fixtures/usage/: one stream asked for the final usage event only (``-u``), one for running
totals on every event too (``-uc``), as the gateway asks."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
from pathlib import Path

import pytest

from controller.gateway.keystore import KeyRecord
from controller.gateway.usage.accounting import Accounting
from controller.gateway.usage.meter import (
    BodyMeter,
    StreamMeter,
    StreamPlan,
    Usage,
    ask_for_usage,
    parse_usage,
)
from controller.gateway.usage.metrics import MAX_KEY_LABELS, UsageMetrics
from controller.gateway.usage.quota import TokenQuotas
from controller.gateway.usage.store import HourUsage, UsageStore

FIX = Path(__file__).parent.parent / "fixtures" / "usage"
STREAM_U = (FIX / "vllm-0.32-stream-u.bin").read_bytes()
STREAM_UC = (FIX / "vllm-0.32-stream-uc.bin").read_bytes()


def _events(stream: bytes) -> list[bytes]:
    return [e + b"\n\n" for e in stream.split(b"\n\n") if e]


def _strip_json(event: bytes) -> dict[str, object] | None:
    body = event[len(b"data: "):].strip()
    return None if body == b"[DONE]" else json.loads(body)


# -- the request side ---------------------------------------------------------------------------


def test_a_stream_asks_for_running_totals_and_the_body_keeps_the_rest() -> None:
    body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": true}'
    sent, plan = ask_for_usage(body)
    assert plan == StreamPlan(keep_final=False, keep_continuous=False)
    doc = json.loads(sent)
    assert doc["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert sent.startswith(body[:-1])  # appended: everything the client sent goes on unchanged


def test_client_usage_options_are_kept_and_extended() -> None:
    body = json.dumps({"stream": True, "stream_options": {"include_usage": True}}).encode()
    sent, plan = ask_for_usage(body)
    assert plan == StreamPlan(keep_final=True, keep_continuous=False)
    assert json.loads(sent)["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    both = json.dumps({"stream": True, "stream_options": {"include_usage": True,
                                                           "continuous_usage_stats": True}}).encode()
    assert ask_for_usage(both) == (both, StreamPlan(True, True))


# Not streams to the engine either: pydantic's lax bool refuses "maybe", 2 and 0.5 (a 400), and
# reads "no", "OFF", 0 and null as false.
@pytest.mark.parametrize("body", [b'{"stream": false}', b'{"model": "m"}', b"[1]", b'{"stream": "maybe"}',
                                  b'{"stream": 2}', b'{"stream": 0.5}', b'{"stream": "no"}',
                                  b'{"stream": "OFF"}', b'{"stream": 0}', b'{"stream": null}',
                                  b'{"stream": true, "stream": false}'])
def test_not_a_stream_is_left_alone(body: bytes) -> None:
    assert ask_for_usage(body) == (body, None)


def test_empty_object_gets_the_member_without_a_stray_comma() -> None:
    sent, _ = ask_for_usage(b'{"stream":true}')
    assert json.loads(sent)["stream"] is True
    sent, _ = ask_for_usage(b'{ "stream" : true }  ')
    assert json.loads(sent)["stream_options"]["include_usage"] is True


# -- the response side --------------------------------------------------------------------------


def test_non_streamed_body_usage() -> None:
    for name, prompt, completion in (("plain", 32, 5), ("compl", 1, 3)):
        meter = BodyMeter()
        raw = (FIX / f"vllm-0.32-{name}.bin").read_bytes()
        for i in range(0, len(raw), 100):  # arrives in pieces
            meter.feed(raw[i:i + 100])
        u = meter.finish()
        assert (u.prompt_tokens, u.completion_tokens, u.seen) == (prompt, completion, True)


def test_body_without_usage_counts_nothing() -> None:
    meter = BodyMeter()
    meter.feed(b'{"error": {"message": "bad", "code": 400}}')
    assert meter.finish() == Usage()
    assert not parse_usage(b'{"usage": null}', Usage())


def test_text_that_spells_usage_is_not_usage() -> None:
    body = b'{"choices":[{"text":"\\"usage\\":{\\"prompt_tokens\\":99}"}],"usage":{"prompt_tokens":3,' \
           b'"completion_tokens":4}}'
    u = Usage()
    assert parse_usage(body, u) and (u.prompt_tokens, u.completion_tokens) == (3, 4)


def test_client_that_asked_nothing_gets_what_vllm_sends_without_usage() -> None:
    meter = StreamMeter(StreamPlan(keep_final=False, keep_continuous=False))
    out = b"".join(meter.feed(e) for e in _events(STREAM_UC)) + meter.flush()
    assert b'"usage"' not in out
    assert out.endswith(b"data: [DONE]\n\n")
    # Every event is the one vLLM sends when not asked for usage (same members, same order).
    shapes = [list(d) if (d := _strip_json(e)) else None for e in _events(out)]
    plain = [list(d) if (d := _strip_json(e)) else None
             for e in _events(STREAM_U) if b'"choices":[]' not in e]
    assert shapes == plain
    assert (meter.usage.prompt_tokens, meter.usage.completion_tokens) == (32, 4)


def test_client_that_asked_for_the_final_usage_keeps_it_only() -> None:
    meter = StreamMeter(StreamPlan(keep_final=True, keep_continuous=False))
    out = b"".join(meter.feed(e) for e in _events(STREAM_UC))
    usage_events = [e for e in _events(out) if b'"usage"' in e]
    assert len(usage_events) == 1 and b'"choices":[]' in usage_events[0]
    assert (meter.usage.prompt_tokens, meter.usage.completion_tokens) == (32, 4)


def test_client_that_asked_for_everything_gets_the_bytes_unchanged() -> None:
    meter = StreamMeter(StreamPlan(keep_final=True, keep_continuous=True))
    assert b"".join(meter.feed(e) for e in _events(STREAM_UC)) == STREAM_UC


def test_events_split_anywhere_are_rejoined() -> None:
    for size in (1, 7, 50, 333):
        meter = StreamMeter(StreamPlan(False, False))
        out = b"".join(meter.feed(STREAM_UC[i:i + size]) for i in range(0, len(STREAM_UC), size))
        out += meter.flush()
        reference = StreamMeter(StreamPlan(False, False))
        assert out == b"".join(reference.feed(e) for e in _events(STREAM_UC))
        assert meter.usage.completion_tokens == 4


def test_abandoned_stream_counts_the_last_running_total() -> None:
    meter = StreamMeter(StreamPlan(False, False))
    for e in _events(STREAM_UC)[:3]:
        meter.feed(e)
    assert (meter.usage.prompt_tokens, meter.usage.completion_tokens) == (32, 2)


def test_completions_stream_too() -> None:
    meter = StreamMeter(StreamPlan(False, False))
    out = b"".join(meter.feed(e) for e in _events((FIX / "vllm-0.32-compl-uc.bin").read_bytes()))
    assert b'"usage"' not in out and out.count(b"data: ") == 4
    assert (meter.usage.prompt_tokens, meter.usage.completion_tokens) == (1, 3)


# -- quotas -------------------------------------------------------------------------------------


def _key(tpm: int | None = None, tpd: int | None = None, key_id: str = "0123456789ab") -> KeyRecord:
    return KeyRecord(key_id, "k", 0.0, None, None, None, tpm_limit=tpm, tpd_limit=tpd)


class Clock:
    def __init__(self, t: float = 1_800_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_no_quota_never_refuses() -> None:
    q = TokenQuotas(Clock())
    q.charge(_key(), 10**9)
    assert q.check(_key()) is None


def test_minute_quota_refuses_once_spent_with_retry_after_from_the_bucket() -> None:
    clock = Clock()
    q = TokenQuotas(clock)
    key = _key(tpm=600)  # 10 tokens a second
    assert q.check(key) is None
    q.charge(key, 500)
    assert q.check(key) is None  # 100 left: still admitted
    q.charge(key, 700)  # a long answer takes it to -600: never cut, accounted after
    refused = q.check(key)
    assert refused is not None and "600 tokens per minute" in refused.reason
    assert refused.retry_after_s == 61  # 600 tokens at 10/s, plus one token's worth, rounded up
    clock.t += 59.5
    assert q.check(key) is not None  # -5: not yet
    clock.t += 1.0
    assert q.check(key) is None  # +5


def test_day_quota_retry_after_is_the_longer_wait() -> None:
    clock = Clock()
    q = TokenQuotas(clock)
    key = _key(tpm=60_000, tpd=86_400)  # day: 1 token a second
    q.charge(key, 86_400 + 100)
    refused = q.check(key)
    assert refused is not None and "per day" in refused.reason and refused.retry_after_s == 101


def test_quota_levels_survive_a_restart() -> None:
    clock = Clock()
    q = TokenQuotas(clock)
    key = _key(tpd=1000)
    q.charge(key, 1500)
    saved = q.snapshot()
    clock.t += 100  # down for 100 s: refilled by 100 × 1000/86400 tokens only
    again = TokenQuotas(clock)
    again.restore(saved)
    refused = again.check(key)
    assert refused is not None
    assert again.level("0123456789ab", "day") == pytest.approx(-500 + 100 * 1000 / 86400)


def test_lowered_limit_caps_the_level() -> None:
    clock = Clock()
    q = TokenQuotas(clock)
    q.check(_key(tpm=1000))
    q.check(_key(tpm=10))
    assert q.level("0123456789ab", "minute") == 10


def test_clock_stepping_back_does_not_drain() -> None:
    clock = Clock()
    q = TokenQuotas(clock)
    q.check(_key(tpm=100))
    clock.t -= 3600
    assert q.check(_key(tpm=100)) is None and q.level("0123456789ab", "minute") == 100


# -- store and accounting -----------------------------------------------------------------------


def test_store_sums_per_hour_prunes_and_is_private(tmp_path: Path) -> None:
    store = UsageStore(tmp_path / "usage.sqlite3")
    h = 1_800_000_000 - 1_800_000_000 % 3600
    store.write({("a" * 12, h): HourUsage(2, 1, 10, 20, 0.5)})
    store.write({("a" * 12, h): HourUsage(1, 0, 1, 2, 0.25), ("b" * 12, h + 3600): HourUsage(1, 0, 5, 5, 1)})
    rows = store.query()
    assert [(r.key_id, r.requests, r.errors, r.prompt_tokens, r.completion_tokens) for r in rows] == [
        ("a" * 12, 3, 1, 11, 22, ), ("b" * 12, 1, 0, 5, 5)]
    assert [r.key_id for r in store.query(key_ids=["b" * 12])] == ["b" * 12]
    assert [r.hour for r in store.query(since=h + 1800)] == [h, h + 3600]  # the hour that overlaps
    assert [r.hour for r in store.query(until=h + 3600)] == [h]
    store.write({}, prune_before=h + 3600)
    assert [r.hour for r in store.query()] == [h + 3600]
    assert stat.S_IMODE(os.stat(store.path).st_mode) == 0o600


def test_missing_store_reads_empty_and_is_not_created(tmp_path: Path) -> None:
    store = UsageStore(tmp_path / "none.sqlite3")
    assert store.query() == [] and store.quota_states() == []
    assert not store.path.exists()


def test_a_store_read_before_its_tables_exist_reads_empty(tmp_path: Path) -> None:
    """The writer creates the file, then its tables: a reader in between (a CLI, an API call, a
    test polling for the first row) reads nothing, not `no such table`."""
    path = tmp_path / "young.sqlite3"
    sqlite3.connect(path).close()  # the file exists, with no table yet
    store = UsageStore(path)
    assert store.query() == [] and store.quota_states() == []


async def test_accounting_records_flushes_and_restores_quotas(tmp_path: Path) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    clock = Clock()
    registry = CollectorRegistry()
    acc = Accounting(UsageStore(tmp_path / "u.sqlite3"), UsageMetrics(registry), clock=clock)
    key = _key(tpd=100)
    acc.record(key, 200, Usage(30, 40, True), 0.2)
    acc.record(key, 499, Usage(5, 1, True), 0.1)
    acc.record(key, 429, Usage(), 0.0)
    assert await acc.flush()
    [row] = acc.store.query()
    assert (row.requests, row.errors, row.prompt_tokens, row.completion_tokens) == (3, 2, 35, 41)
    text = generate_latest(registry).decode()
    assert f'appliance_gateway_tokens_total{{key_id="{key.id}",kind="completion"}} 41.0' in text
    assert f'appliance_gateway_key_requests_total{{key_id="{key.id}",outcome="error"}} 2.0' in text
    # The day budget (100) is spent (76 used, then more): a new gateway on the same file refuses too.
    acc.record(key, 200, Usage(20, 10, True), 0.1)
    assert await acc.flush()
    again = Accounting(UsageStore(tmp_path / "u.sqlite3"), UsageMetrics(CollectorRegistry()), clock=clock)
    again.restore()
    refused = again.admit(key)
    assert refused is not None and refused.retry_after_s > 0


async def test_unwritable_store_keeps_usage_bounded_and_counts_the_loss(tmp_path: Path) -> None:
    from prometheus_client import CollectorRegistry

    blocked = tmp_path / "dir-not-file"
    blocked.mkdir()  # a directory where the file should be: every write fails
    registry = CollectorRegistry()
    clock = Clock()
    acc = Accounting(UsageStore(blocked), UsageMetrics(registry), max_pending=2, clock=clock)
    acc.record(_key(key_id="a" * 12), 200, Usage(1, 1, True), 0.1)
    assert not await acc.flush()  # failed, kept
    acc.record(_key(key_id="a" * 12), 200, Usage(1, 1, True), 0.1)
    acc.record(_key(key_id="b" * 12), 200, Usage(1, 1, True), 0.1)
    acc.record(_key(key_id="c" * 12), 200, Usage(1, 1, True), 0.1)  # a third row: over the bound
    assert acc.dropped == 1
    assert registry.get_sample_value("appliance_gateway_usage_dropped_total") == 1
    assert registry.get_sample_value("appliance_gateway_usage_store_errors_total") == 1
    assert registry.get_sample_value("appliance_gateway_usage_pending_rows") == 2
    # The store comes back: what was kept is written, nothing twice.
    blocked.rmdir()
    assert await acc.flush()
    rows = {r.key_id: r.requests for r in acc.store.query()}
    assert rows == {"a" * 12: 2, "b" * 12: 1}


def test_key_label_set_is_bounded() -> None:
    from prometheus_client import CollectorRegistry

    metrics = UsageMetrics(CollectorRegistry())
    for i in range(MAX_KEY_LABELS + 50):
        metrics.children(f"{i:012x}")[0].inc()
    labels = {s.labels["key_id"] for s in next(iter(metrics.tokens.collect())).samples}
    assert len(labels) == MAX_KEY_LABELS + 1 and "other" in labels


def test_other_spellings_of_usage_are_read_and_stripped_too() -> None:
    # Spaces, another member order, nested details: the general path, not vLLM's compact one.
    event = (b'data: {"id": "x", "choices": [{"index": 0, "delta": {"content": "a"}}], "usage": '
             b'{"completion_tokens": 7, "prompt_tokens": 3, '
             b'"prompt_tokens_details": {"cached_tokens": 1}}}\n\n')
    meter = StreamMeter(StreamPlan(False, False))
    out = meter.feed(event)
    assert (meter.usage.prompt_tokens, meter.usage.completion_tokens) == (3, 7)
    assert json.loads(out[6:]) == {"id": "x", "choices": [{"index": 0, "delta": {"content": "a"}}]}
