"""Exact token accounting: how the gateway decides a request streams (as the engine does), reads
usage in every API's shape, sums running totals per choice, estimates what never reached it, and
reserves quota. The proxy-level cases are in tests/integration/test_gateway_metering.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from controller.gateway.keystore import KeyRecord
from controller.gateway.limits import KeyLimiter, LimitExceeded
from controller.gateway.usage.meter import (
    OBSERVE,
    BodyMeter,
    Metering,
    StreamMeter,
    StreamPlan,
    Usage,
    plan_request,
)
from controller.gateway.usage.quota import TokenQuotas
from controller.gateway.usage.ratelimit_headers import duration, ratelimit_headers
from controller.gateway.usage.request import (
    is_json_media_type,
    lax_bool,
    lax_int,
    may_stream,
    parse_body,
)

# -- deciding "stream" as vLLM's request models do (pydantic v2, lax mode) -------------------------

# pydantic's documented lax bool rules: bools; the ints 0/1; the floats 0.0/1.0; the strings
# 0/off/f/false/n/no and 1/on/t/true/y/yes in any case. Anything else is a validation error.
LAX_TRUE: list[Any] = [True, 1, 1.0, "1", "true", "True", "TRUE", "t", "T", "yes", "YES", "y", "Y",
                       "on", "On"]
LAX_FALSE: list[Any] = [False, 0, 0.0, "0", "false", "FALSE", "f", "no", "No", "n", "off", "OFF", None]
LAX_REFUSED: list[Any] = [2, -1, 1.5, "2", "", "yes please", "truthy", [], {}, [True]]


@pytest.mark.parametrize("value", LAX_TRUE)
def test_lax_true(value: Any) -> None:
    assert lax_bool(value) is True


@pytest.mark.parametrize("value", LAX_FALSE)
def test_lax_false(value: Any) -> None:
    assert lax_bool(value) is False


@pytest.mark.parametrize("value", LAX_REFUSED)
def test_lax_refused(value: Any) -> None:
    assert lax_bool(value) is None


def test_lax_int_reads_n_as_the_engine_does() -> None:
    assert [lax_int(v) for v in (4, "4", 4.0, 4.5, True, None, "x")] == [4, 4, 4, None, None, None, None]


@pytest.mark.parametrize(("content_type", "json_"), [
    (b"application/json", True),
    (b"Application/JSON", True),
    (b"APPLICATION/JSON; charset=UTF-8", True),
    (b"application/json;charset=utf-8", True),
    (b" application/json ", True),
    (b"application/vnd.api+json", True),
    (b"", True),  # FastAPI parses a body without a type as JSON
    (b"text/plain", False),
    (b"multipart/form-data; boundary=x", False),
    (b"application/x-www-form-urlencoded", False),
    (b"text/json", False),
])
def test_json_media_type_is_case_insensitive_with_parameters(content_type: bytes, json_: bool) -> None:
    assert is_json_media_type(content_type) is json_


@pytest.mark.parametrize("spelling", [b'"stream": 1', b'"stream": "true"', b'"stream": "yes"',
                                      b'"stream": "on"', b'"stream": 1.0', b'"str\\u0065am": true',
                                      b'"stream": "T"', b'"stream": false, "stream": true'])
def test_every_spelling_the_engine_streams_is_planned_and_asks_for_usage(spelling: bytes) -> None:
    body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], ' + spelling + b"}"
    assert may_stream(body)
    planned = plan_request(body, "/v1/chat/completions")
    assert planned.stream == StreamPlan(keep_final=False, keep_continuous=False, choices=1)
    assert planned.facts is not None and planned.facts.stream
    assert json.loads(planned.body)["stream_options"] == {"include_usage": True,
                                                         "continuous_usage_stats": True}


def test_client_usage_options_are_read_laxly_too() -> None:
    body = json.dumps({"stream": "yes", "stream_options": {"include_usage": "true"}}).encode()
    assert plan_request(body, "/v1/completions").stream == StreamPlan(True, False, 1)


def test_an_invalid_stream_options_is_not_repaired() -> None:
    # The engine refuses the request (400); the gateway must not turn it into a served stream.
    body = b'{"stream": true, "stream_options": "x"}'
    planned = plan_request(body, "/v1/chat/completions")
    assert planned.body == body


def test_streams_of_other_routes_are_observed_unchanged() -> None:
    body = b'{"model": "m", "input": "hello there", "stream": "on"}'
    planned = plan_request(body, "/v1/responses")
    assert planned.body == body and planned.stream == OBSERVE


def test_facts_n_prompts_max_tokens_and_the_estimate() -> None:
    _, facts = parse_body(json.dumps({"prompt": ["abcd" * 3, "ab"], "n": "2", "max_tokens": 10,
                                      "stream": 1}).encode())
    assert facts is not None
    assert (facts.stream, facts.choices, facts.prompts, facts.max_tokens) == (True, 2, 2, 10)
    assert facts.prompt_estimate == 4  # 14 characters / 4, rounded up
    assert facts.reservation() == 4 + 10 * 2 * 2
    _, facts = parse_body(b'{"messages": [{"role": "user", "content": [{"type": "image_url", '
                          b'"image_url": {"url": "data:image/png;base64,AAAA"}}]}]}')
    assert facts is not None and facts.prompt_estimate == 4  # "user" + "image_url": 13; no data URL
    assert facts.reservation() is None  # no output bound
    _, facts = parse_body(b'{"prompt": [1, 2, 3]}', "/v1/completions")
    assert facts is not None and (facts.prompt_estimate, facts.max_tokens) == (3, 16)


@pytest.mark.parametrize(("route", "members", "bound", "prompts"), [
    # Chat reads max_completion_tokens when it is not null, else max_tokens; never max_output_tokens.
    ("/v1/chat/completions", {"max_output_tokens": 1, "max_tokens": 4000}, 4000, 1),
    ("/v1/chat/completions", {"max_tokens": 1, "max_completion_tokens": 4000}, 4000, 1),
    ("/v1/chat/completions", {"max_tokens": 4000, "max_completion_tokens": None}, 4000, 1),
    ("/v1/chat/completions", {"max_output_tokens": 1}, None, 1),
    # Completions: absent is the model's 16, an explicit null is no bound at all.
    ("/v1/completions", {}, 16, 1),
    ("/v1/completions", {"max_tokens": None, "max_completion_tokens": 1}, None, 1),
    ("/v1/responses", {"max_tokens": 1, "max_output_tokens": 4000}, 4000, 1),
    ("/v1/messages", {"max_output_tokens": 1, "max_tokens": 4000}, 4000, 1),
    # One generation per conversation of a batch.
    ("/v1/chat/completions/batch", {"max_tokens": 100}, 100, 3),
    # A route the gateway does not know: the largest bound given.
    ("/v1/other", {"max_tokens": 1, "max_output_tokens": 4000}, 4000, 1),
])
def test_the_reservation_reads_the_bound_the_route_applies(
    route: str, members: dict[str, Any], bound: int | None, prompts: int
) -> None:
    """Red team h31: the reservation took the smallest of max_tokens, max_completion_tokens and
    max_output_tokens on every route, and 16 for a completions `max_tokens: null`; the engine reads
    one per route, so a request reserved 1 token (+ its prompt) and was allowed 4000 (or the whole
    context), and a batch of 3 conversations reserved one."""
    messages: Any = [{"role": "user", "content": "hi"}]
    if route.endswith("/batch"):
        messages = [messages] * 3
    _, facts = parse_body(json.dumps({"messages": messages, **members}).encode(), route)
    assert facts is not None
    assert (facts.max_tokens, facts.prompts) == (bound, prompts)
    assert facts.reservation() == (None if bound is None else facts.prompt_estimate + bound * prompts)


# -- reading streams ------------------------------------------------------------------------------


def _chunk(index: int, prompt: int, completion: int, text: str = "x") -> bytes:
    doc = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
           "choices": [{"index": index, "delta": {"content": text}, "logprobs": None,
                        "finish_reason": None}],
           "usage": {"prompt_tokens": prompt, "total_tokens": prompt + completion,
                     "completion_tokens": completion}}
    return b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"


def _final(prompt: int, completion: int) -> bytes:
    doc = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [],
           "usage": {"prompt_tokens": prompt, "total_tokens": prompt + completion,
                     "completion_tokens": completion}}
    return b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"


def test_four_events_in_one_read_bill_the_last_running_total() -> None:
    meter = StreamMeter(StreamPlan(False, False))
    out = meter.feed(b"".join(_chunk(0, 7, c) for c in (1, 2, 3, 4)))
    assert (meter.usage.prompt_tokens, meter.usage.completion_tokens) == (7, 4)
    assert b'"usage"' not in out and out.count(b"data: ") == 4
    # and one at a time: each read's total replaces the last
    meter = StreamMeter(StreamPlan(False, False))
    for c in (1, 2, 3, 4):
        meter.feed(_chunk(0, 7, c))
    assert meter.usage.completion_tokens == 4


def _n4_events(per_choice: int) -> list[bytes]:
    # vLLM's order with n=4: each engine step yields one event per choice, running totals per choice
    return [_chunk(i, 11, step) for step in range(1, per_choice + 1) for i in range(4)]


@pytest.mark.parametrize("reads", ["one event a read", "all in one read", "7 bytes a read"])
def test_n_choices_are_summed_per_index_and_the_prompt_counted_once(reads: str) -> None:
    events = _n4_events(5)
    meter = StreamMeter(StreamPlan(False, False, choices=4))
    raw = b"".join(events)
    pieces = {"one event a read": events, "all in one read": [raw],
              "7 bytes a read": [raw[i:i + 7] for i in range(0, len(raw), 7)]}[reads]
    for piece in pieces:
        meter.feed(piece)
    assert (meter.usage.prompt_tokens, meter.usage.completion_tokens) == (11, 20)  # not (11, 5)


def test_several_prompts_each_count_their_prompt() -> None:
    # /v1/completions with 2 prompts and n=2: indices 0,1 are prompt 0's, 2,3 prompt 1's.
    meter = StreamMeter(StreamPlan(False, False, choices=2))
    for event in (_chunk(0, 5, 1), _chunk(1, 5, 1), _chunk(2, 9, 1), _chunk(3, 9, 2), _chunk(0, 5, 2)):
        meter.feed(event)
    assert (meter.usage.prompt_tokens, meter.usage.completion_tokens) == (14, 6)


def test_the_final_usage_event_is_the_engines_total() -> None:
    meter = StreamMeter(StreamPlan(True, False, choices=4))
    for event in [*_n4_events(2), _final(11, 9)]:
        meter.feed(event)
    assert (meter.usage.prompt_tokens, meter.usage.completion_tokens) == (11, 9)


def _sse(kind: str, doc: dict[str, Any]) -> bytes:
    return f"event: {kind}\ndata: {json.dumps(doc)}\n\n".encode()


RESPONSES_STREAM = b"".join([
    _sse("response.created", {"type": "response.created", "sequence_number": 0,
                              "response": {"id": "resp_1", "status": "in_progress", "usage": None}}),
    _sse("response.output_text.delta", {"type": "response.output_text.delta", "sequence_number": 1,
                                        "delta": "Hi \"usage\": {\"input_tokens\": 999}"}),
    _sse("response.completed", {"type": "response.completed", "sequence_number": 2,
                                "response": {"id": "resp_1", "status": "completed", "usage": {
                                    "input_tokens": 12, "input_tokens_details": {"cached_tokens": 0},
                                    "output_tokens": 30,
                                    "output_tokens_details": {"reasoning_tokens": 0},
                                    "total_tokens": 42}}}),
])

MESSAGES_STREAM = b"".join([
    _sse("message_start", {"type": "message_start", "message": {
        "id": "msg_1", "type": "message", "role": "assistant", "content": [], "model": "m",
        "stop_reason": None, "usage": {"input_tokens": 25, "output_tokens": 1}}}),
    _sse("content_block_start", {"type": "content_block_start", "index": 0,
                                 "content_block": {"type": "text", "text": ""}}),
    _sse("content_block_delta", {"type": "content_block_delta", "index": 0,
                                 "delta": {"type": "text_delta", "text": "Hello"}}),
    _sse("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                           "usage": {"output_tokens": 15}}),
    _sse("message_stop", {"type": "message_stop"}),
])


@pytest.mark.parametrize(("stream", "expected"), [(RESPONSES_STREAM, (12, 30)), (MESSAGES_STREAM, (25, 15))])
def test_responses_and_messages_streams_are_counted_and_passed_unchanged(
    stream: bytes, expected: tuple[int, int]
) -> None:
    for size in (len(stream), 1, 50):
        meter = StreamMeter(OBSERVE)
        out = b"".join(meter.feed(stream[i:i + size]) for i in range(0, len(stream), size)) + meter.flush()
        assert out == stream
        assert (meter.usage.prompt_tokens, meter.usage.completion_tokens) == expected


def test_a_messages_stream_left_after_its_start_counts_the_prompt() -> None:
    meter = StreamMeter(OBSERVE)
    meter.feed(MESSAGES_STREAM.split(b"event: content_block_delta")[0])
    assert (meter.usage.prompt_tokens, meter.usage.completion_tokens, meter.usage.seen) == (25, 1, True)


@pytest.mark.parametrize(("body", "expected"), [
    (json.dumps({"id": "resp_1", "object": "response", "output": [{"type": "message", "content": [
        {"type": "output_text", "text": "hi"}]}], "usage": {
            "input_tokens": 12, "input_tokens_details": {"cached_tokens": 3}, "output_tokens": 30,
            "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 42}}), (12, 30)),
    (json.dumps({"id": "msg_1", "type": "message", "role": "assistant", "content": [
        {"type": "text", "text": "hi"}], "stop_reason": "end_turn", "usage": {
            "input_tokens": 25, "output_tokens": 15}}), (25, 15)),
])
def test_responses_and_messages_bodies_are_counted(body: str, expected: tuple[int, int]) -> None:
    meter = BodyMeter()
    meter.feed(body.encode())
    u = meter.finish()
    assert (u.prompt_tokens, u.completion_tokens, u.seen) == (*expected, True)


# -- what never reached the gateway ---------------------------------------------------------------


def test_settle_charges_the_estimate_only_for_a_request_the_engine_got_and_never_counted() -> None:
    body = b'{"messages": [{"role": "user", "content": "' + b"w" * 400 + b'"}]}'
    m = Metering(body=body)
    m.settle()
    assert m.usage == Usage()  # never sent upstream: nothing
    m.sent = True
    m.settle()
    assert (m.usage.prompt_tokens, m.usage.estimated) == (101, True)  # 404 characters / 4
    counted = Metering(usage=Usage(3, 4, True), body=body, sent=True)
    counted.settle()
    assert counted.usage == Usage(3, 4, True)  # the engine's own count stands


# -- quota reservation and where a key stands -----------------------------------------------------


class Clock:
    def __init__(self, t: float = 1_800_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _key(tpm: int | None = None, tpd: int | None = None, rpm: int | None = None) -> KeyRecord:
    return KeyRecord("0123456789ab", "k", 0.0, None, rpm, None, tpm_limit=tpm, tpd_limit=tpd)


def test_reservation_stops_concurrent_requests_at_the_level_and_refunds_at_the_end() -> None:
    q = TokenQuotas(Clock())
    key = _key(tpm=200)
    taken = [q.reserve(key, 60) for _ in range(8)]  # 8 at once, each at most 60 tokens
    assert taken[:4] == [60, 60, 60, 60]  # 200, 140, 80, 20 were above zero
    assert all(isinstance(t, LimitExceeded) for t in taken[4:])
    for _ in range(4):
        q.settle(key, 60, 25)  # each used 25: 35 back each
    assert q.level(key.id, "minute") == pytest.approx(200 - 100)


def test_reservation_without_a_bound_takes_what_is_left() -> None:
    q = TokenQuotas(Clock())
    key = _key(tpm=200, tpd=1000)
    q.charge(key, 50)
    assert q.reserve(key, None) == 150
    assert isinstance(q.reserve(key, None), LimitExceeded)
    q.settle(key, 150, 10)
    assert q.level(key.id, "minute") == pytest.approx(140) and q.level(key.id, "day") == pytest.approx(940)


def test_settle_never_fills_a_bucket_past_its_limit() -> None:
    q = TokenQuotas(Clock())
    key = _key(tpm=200)
    q.reserve(key, 10)
    q.settle(key, 500, 0)
    assert q.level(key.id, "minute") == 200


def test_a_key_without_a_quota_reserves_nothing() -> None:
    assert TokenQuotas(Clock()).reserve(_key(), 100) == 0


def test_standing_and_headers() -> None:
    clock = Clock()
    q = TokenQuotas(clock)
    key = _key(tpm=600, tpd=10_000, rpm=60)
    q.charge(key, 150)
    assert q.standing(key) == (600, 450, pytest.approx(15.0))  # 150 tokens at 10/s
    limiter = KeyLimiter(clock)
    assert limiter.standing(key) == (60, 60, 0.0)
    limiter.try_acquire(key)
    limiter.try_acquire(key)
    assert limiter.standing(key) == (60, 58, pytest.approx(2.0))
    headers = dict(ratelimit_headers(q.standing(key), limiter.standing(key)))
    assert headers == {
        b"x-ratelimit-limit-tokens": b"600", b"x-ratelimit-remaining-tokens": b"450",
        b"x-ratelimit-reset-tokens": b"15s", b"x-ratelimit-limit-requests": b"60",
        b"x-ratelimit-remaining-requests": b"58", b"x-ratelimit-reset-requests": b"2s"}
    q.charge(key, 10_000)
    standing = q.standing(key)
    assert standing is not None and standing[1] == 0  # never negative on the wire
    assert TokenQuotas(clock).standing(_key(tpd=86_400)) == (86_400, 86_400, 0.0)
    assert ratelimit_headers(None, None) == []


def test_duration_is_written_as_openai_writes_it() -> None:
    assert [duration(s) for s in (0, 0.2, 59.1, 60, 361, 3725)] == [
        "0s", "1s", "1m0s", "1m0s", "6m1s", "1h2m5s"]
