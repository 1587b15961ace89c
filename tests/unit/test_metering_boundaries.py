"""Boundary cases of token metering and quotas written from mutmut's survivors (docs/mutation-testing.md):
the request body the engine gets, a non-streamed answer read in pieces and past its size bound, the
quota's dirty flag and sub-token levels, and the x-ratelimit headers of a key with only a requests
limit. The fourth round's (below the line "fourth round"): which streams are metered, events without a
choice index or not JSON, Messages counts that never go down, the quota's one-token edges."""

from __future__ import annotations

import json

import pytest

from controller.gateway.keystore import KeyRecord
from controller.gateway.usage.meter import (
    _MAX_BODY,
    _MAX_CARRY,
    OBSERVE,
    BodyMeter,
    Metering,
    StreamMeter,
    StreamPlan,
    Usage,
    parse_usage,
    plan_request,
    with_stream_options,
)
from controller.gateway.usage.quota import TokenQuotas
from controller.gateway.usage.ratelimit_headers import ratelimit_headers
from controller.gateway.usage.request import is_json_media_type, parse_body

ASK_BOTH = {"include_usage": True, "continuous_usage_stats": True}
USAGE = b'"usage":{"prompt_tokens":7,"total_tokens":9,"completion_tokens":2}'


class Clock:
    def __init__(self, t: float = 1_800_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _key(tpm: int | None = None, tpd: int | None = None) -> KeyRecord:
    return KeyRecord("0123456789ab", "k", 0.0, None, None, None, tpm_limit=tpm, tpd_limit=tpd)


# -- x-ratelimit-* ------------------------------------------------------------------------------


def test_a_key_with_only_a_requests_limit_gets_the_requests_headers() -> None:
    # No token quota (tokens: None) must not end the loop before the requests' headers.
    assert dict(ratelimit_headers(None, (60, 59, 0.5))) == {
        b"x-ratelimit-limit-requests": b"60", b"x-ratelimit-remaining-requests": b"59",
        b"x-ratelimit-reset-requests": b"1s"}


# -- what is JSON to the engine -----------------------------------------------------------------


def test_a_media_type_with_several_parameters_is_json() -> None:
    # The type is what comes before the *first* ";" (RFC 9110 §8.3.1).
    assert is_json_media_type(b"application/json; charset=utf-8; profile=x")
    assert not is_json_media_type(b"text/plain; a=application/json")


# -- the body sent upstream ---------------------------------------------------------------------


def test_a_stream_with_n_choices_plans_per_choice_sums() -> None:
    planned = plan_request(b'{"stream": true, "n": 3, "messages": []}', "/v1/chat/completions")
    assert planned.stream is not None and planned.stream.choices == 3


def test_the_member_is_appended_before_the_closing_brace_and_the_rest_kept() -> None:
    # What comes before the last member and after the closing brace goes on as the client sent it
    # (the whitespace between the last member and the brace is where the member goes).
    body = b'  {"stream": true }\n'
    assert with_stream_options(body, json.loads(body), ASK_BOTH) == (
        b'  {"stream": true,"stream_options":{"include_usage":true,"continuous_usage_stats":true}}\n')
    # Options other than the usual pair are written compactly, after a comma or none.
    assert with_stream_options(b'{"a": 1}', {"a": 1}, {"include_usage": True}) == (
        b'{"a": 1,"stream_options":{"include_usage":true}}')
    assert with_stream_options(b"{ }", {}, ASK_BOTH) == (
        b'{"stream_options":{"include_usage":true,"continuous_usage_stats":true}}')


def test_a_re_serialised_body_keeps_its_text_as_utf8() -> None:
    # With the client's own stream_options the body is written again: non-ASCII text stays UTF-8
    # (\u escapes would make a CJK prompt twice its size in bytes on the way to the engine).
    doc = {"stream": True, "stream_options": {"include_usage": True}, "prompt": "日本語"}
    sent = with_stream_options(json.dumps(doc).encode(), doc, ASK_BOTH)
    assert "日本語".encode() in sent and json.loads(sent)["stream_options"] == ASK_BOTH


# -- a non-streamed answer ----------------------------------------------------------------------


def test_the_body_meter_counts_into_the_requests_usage() -> None:
    usage = Usage()
    meter = BodyMeter(usage)  # the proxy passes its Metering's usage: counted in place
    meter.feed(b"{" + USAGE + b"}")
    meter.finish()
    assert (usage.prompt_tokens, usage.completion_tokens, usage.seen) == (7, 2, True)


def test_an_answer_in_two_reads_is_read_whole() -> None:
    meter = BodyMeter()
    meter.feed(b'{"choices":[],')
    meter.feed(b"" + USAGE + b"}")
    assert meter.finish().total == 9


def test_a_body_past_the_bound_keeps_only_its_tail_and_still_counts() -> None:
    # The usage object straddles the read that takes the body past _MAX_BODY: the tail is cut from
    # the reads joined as they came.
    text = b'{"choices":[{"text":"' + b"a" * (_MAX_BODY - 40) + b'"}],' + USAGE + b"}"
    step = 1 << 20
    meter = BodyMeter()
    for i in range(0, len(text), step):
        meter.feed(text[i:i + step])
    kept = sum(len(p) for p in meter._parts)
    assert kept <= 64 << 10  # the tail only, not the 4 MiB before it
    assert meter.finish().total == 9


def test_a_long_answer_never_keeps_more_than_the_bound() -> None:
    meter = BodyMeter()
    for _ in range(6):
        meter.feed(b"x" * (1 << 20))
        assert sum(len(p) for p in meter._parts) <= _MAX_BODY


# -- quotas -------------------------------------------------------------------------------------


def test_an_unknown_bucket_has_no_level() -> None:
    assert TokenQuotas(Clock()).level("nobody", "minute") is None


def test_every_change_of_a_level_marks_the_quotas_for_saving() -> None:
    q = TokenQuotas(Clock())
    key = _key(tpm=600)
    for change in (lambda: q.reserve(key, 10), lambda: q.settle(key, 10, 4), lambda: q.charge(key, 3)):
        q.snapshot()
        assert not q.dirty
        change()
        assert q.dirty is True


def test_an_unbounded_reservation_on_a_fraction_of_a_token_takes_one() -> None:
    clock = Clock()
    q = TokenQuotas(clock)
    key = _key(tpm=60)  # refills 1 token a second
    q.charge(key, 60)
    clock.t += 0.5  # half a token back: above zero, so admitted
    assert q.reserve(key, None) == 1
    assert q.level(key.id, "minute") == pytest.approx(-0.5)


# -- reading usage objects ----------------------------------------------------------------------


def _vllm(prompt: int, completion: int) -> bytes:
    return (b'"usage":{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d}'
            % (prompt, prompt + completion, completion))


@pytest.mark.parametrize("spelling", ["vllm", "spaced"])
def test_the_last_usage_object_in_a_text_is_the_total(spelling: str) -> None:
    # Four running totals in one text (the first, vLLM's role event, counts 0 completion tokens).
    objs = [_vllm(7, c) for c in (0, 1, 2, 3)]
    if spelling == "spaced":
        objs = [o.replace(b":", b": ").replace(b",", b", ") for o in objs]
    u = Usage()
    assert parse_usage(b"\n\n".join(b"data: {" + o + b"}" for o in objs), u)
    assert (u.prompt_tokens, u.completion_tokens) == (7, 3)


def test_a_usage_object_with_one_count_reads_the_other_as_zero() -> None:
    embeddings = Usage()  # embeddings: prompt_tokens and total_tokens only
    assert parse_usage(b'{"data":[],"usage":{"prompt_tokens":8,"total_tokens":8}}', embeddings)
    assert (embeddings.prompt_tokens, embeddings.completion_tokens, embeddings.seen) == (8, 0, True)
    output_only = Usage(prompt_tokens=5)
    assert parse_usage(b'{"usage":{"output_tokens":4}}', output_only)
    assert (output_only.prompt_tokens, output_only.completion_tokens) == (0, 4)


def test_a_usage_member_that_is_not_an_object_is_no_usage() -> None:
    u = Usage()
    assert not parse_usage(b'{"usage": 12}', u) and u == Usage()
    body = BodyMeter()
    body.feed(b'{"usage": "n/a"}')
    assert body.finish() == Usage()


# -- request facts ------------------------------------------------------------------------------


def test_plans_carry_the_facts_of_every_json_request() -> None:
    completions = plan_request(b'{"prompt": "hi"}', "/v1/completions")
    assert completions.facts is not None and completions.facts.max_tokens == 16  # vLLM's default
    assert completions.facts.reservation() == 1 + 16
    chat = plan_request(b'{"messages": [{"content": "hi"}]}', "/v1/chat/completions")
    assert chat.facts is not None and chat.facts.max_tokens is None and chat.stream is None
    observed = plan_request(b'{"stream": true, "n": 2, "input": "hi"}', "/v1/responses")
    assert observed.facts is not None and observed.facts.stream
    assert observed.stream == StreamPlan(True, True, 2)


def _facts(doc: str) -> tuple[int, int, int | None, int]:
    _, facts = parse_body(doc.encode())
    assert facts is not None
    return facts.choices, facts.prompts, facts.max_tokens, facts.prompt_estimate


def test_request_facts_boundaries() -> None:
    # One prompt, whatever its form: text, token ids; a list of either is that many prompts.
    assert _facts('{"prompt": "hello"}') == (1, 1, None, 2)
    assert _facts('{"prompt": [1, 2, 3]}') == (1, 1, None, 3)
    assert _facts('{"prompt": [[1, 2, 3], [4, 5]]}') == (1, 2, None, 5)
    assert _facts('{"messages": [{"content": "abcd"}]}')[1] == 1
    # A data URL (an image, audio) is not prompt text.
    assert _facts('{"messages": [{"content": "data:image/png;base64,AAAA"}]}')[3] == 0
    # n below 1 is not a count of choices (the engine refuses it); 0 output tokens is a bound.
    assert _facts('{"n": 0}')[0] == 1
    assert _facts('{"max_tokens": 0}')[2] == 0
    # Several output bounds on a route the gateway does not know: the largest, in either order (a
    # guess either way, so the safe one; each known route reads its own member:
    # test_gateway_metering.py::test_the_reservation_reads_the_bound_the_route_applies).
    assert _facts('{"max_tokens": 20, "max_completion_tokens": 100}')[2] == 100
    assert _facts('{"max_completion_tokens": 30, "max_output_tokens": 100}')[2] == 100
    assert _facts('{"max_output_tokens": 100, "max_tokens": 20}')[2] == 100


# -- stream events in other shapes --------------------------------------------------------------


def _meter(*events: bytes, plan: StreamPlan = OBSERVE) -> StreamMeter:
    meter = StreamMeter(plan)
    for event in events:
        meter.feed(event)
    return meter


def test_a_final_total_is_the_engines_count_even_when_zero() -> None:
    meter = _meter(b'event: response.completed\ndata: {"type":"response.completed","response":'
                   b'{"usage":{"input_tokens":0,"output_tokens":0}}}\n\n')
    # Seen: the engine counted (0), so nothing is estimated for it afterwards.
    assert meter.usage == Usage(0, 0, seen=True)
    other = _meter(b'data: {"type":"x","usage":{"prompt_tokens":3,"completion_tokens":4}}\n\n')
    assert (other.usage.prompt_tokens, other.usage.completion_tokens, other.usage.seen) == (3, 4, True)


def test_a_messages_stream_in_sse_s_other_spellings() -> None:
    # "data:" without a space, an event's JSON over two data lines, a start with input_tokens only.
    meter = _meter(
        b'event: message_start\ndata:{"type":"message_start","message":{"usage":{"input_tokens":25}}}\n\n',
        b'event: message_delta\ndata: {"type":"message_delta",\ndata: "usage":{"output_tokens":15}}\n\n',
    )
    assert (meter.usage.prompt_tokens, meter.usage.completion_tokens) == (25, 15)


def test_an_event_whose_data_is_not_an_object_counts_nothing() -> None:
    meter = _meter(b'data: "usage"\n\n', b'data: ["usage", 1]\n\n')
    assert meter.usage == Usage()


def test_a_usage_member_that_is_not_an_object_is_passed_on() -> None:
    event = b'data: {"choices":[{"index":0,"delta":{}}],"usage":"n/a"}\n\n'
    meter = StreamMeter(StreamPlan(False, False))
    assert meter.feed(event) == event and meter.usage == Usage()


def test_a_stream_meter_counts_into_the_requests_usage_and_marks_it_seen() -> None:
    usage = Usage()
    meter = StreamMeter(StreamPlan(True, True), usage)  # the proxy passes its Metering's usage
    meter.feed(b"data: {" + b'"choices":[{"index":0}],' + _vllm(7, 1)[:-1] + b"}}\n\n")
    assert (usage.prompt_tokens, usage.completion_tokens, usage.seen) == (7, 1, True)


def test_every_complete_event_of_a_read_goes_on_at_once() -> None:
    # Two whole events and the start of a third: the two go to the client now, the third waits.
    a, b = b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n', b"data: [DONE]\n\n"
    meter = StreamMeter(OBSERVE)
    assert meter.feed(a + b + b"data: {") == a + b
    assert meter.flush() == b"data: {"


def test_a_nearly_refilled_bucket_says_retry_in_one_second() -> None:
    clock = Clock()
    q = TokenQuotas(clock)
    key = _key(tpm=600)  # 10 tokens a second
    q.charge(key, 601)  # one token below zero: back above it within 0.2 s
    refused = q.check(key)
    assert refused is not None and refused.retry_after_s == 1


# -- fourth round -------------------------------------------------------------------------------


def test_fresh_quotas_have_nothing_to_save() -> None:
    assert TokenQuotas(Clock()).dirty is False


def test_one_token_is_charged_and_none_changes_nothing() -> None:
    q = TokenQuotas(Clock())
    key = _key(tpm=600)
    q.charge(key, 0)
    assert q.dirty is False and q.level(key.id, "minute") is None  # nothing counted: nothing to save
    q.charge(key, 1)
    assert q.level(key.id, "minute") == 599


def test_settling_without_a_reservation_charges_the_count() -> None:
    q = TokenQuotas(Clock())
    key = _key(tpm=600)
    q.settle(key, 0, 0)
    assert q.dirty is False and q.level(key.id, "minute") is None
    q.settle(key, 0, 5)
    assert q.level(key.id, "minute") == 595


def test_a_reservation_of_one_token_is_replaced_by_the_count() -> None:
    q = TokenQuotas(Clock())
    key = _key(tpm=600)
    assert q.reserve(key, 1) == 1
    q.settle(key, 1, 5)
    assert q.level(key.id, "minute") == 595  # 5 in all, not 1 + 5


def test_which_streams_are_metered() -> None:
    planned = StreamPlan(keep_final=False, keep_continuous=False)
    assert Metering(plan=planned, quota=True).stream_plan("/v1/chat/completions") is planned
    # Unplanned (the engine streamed when the gateway did not expect it): observed, unless the key has
    # a quota and the route carries no usage events of its own (its count would be unknown).
    assert Metering().stream_plan("/v1/chat/completions") is OBSERVE
    assert Metering(quota=True).stream_plan("/v1/chat/completions") is None
    assert Metering(quota=True).stream_plan("/v1/messages") is OBSERVE
    assert Metering(quota=True).stream_plan("/v1/responses") is OBSERVE


def _event(choice: bytes, prompt: int, completion: int) -> bytes:
    """A chat chunk with ``choice`` (the inside of "choices": [...]) and vLLM's running totals."""
    return b'data: {"choices":[' + choice + b"]," + _vllm(prompt, completion)[:-1] + b"}}\n\n"


def test_a_final_total_alone_is_the_count() -> None:
    meter = _meter(_event(b"", 7, 2))  # "choices":[] and the totals, nothing before it
    assert (meter.usage.prompt_tokens, meter.usage.completion_tokens) == (7, 2)


@pytest.mark.parametrize("one_read", [True, False])
def test_a_choice_without_an_index_is_choice_zero(one_read: bool) -> None:
    a = _event(b'{"index":0,"text":"a"}', 5, 1)
    b = _event(b'{"text":"b"}', 5, 2)  # the running total of the same choice, grown by one
    meter = _meter(a + b) if one_read else _meter(a, b)
    assert (meter.usage.prompt_tokens, meter.usage.completion_tokens) == (5, 2)


def test_an_events_index_is_its_own_not_an_earlier_events() -> None:
    # Two events without usage (choice 1) before the one with it (choice 0), in one read: the
    # totals are choice 0's, so choice 0's next total replaces them.
    other = b'data: {"choices":[{"index":1,"text":"x"}]}\n\n'
    meter = _meter(other + other + _event(b'{"index":0,"text":"a"}', 5, 1),
                   _event(b'{"index":0,"text":"b"}', 5, 2))
    assert (meter.usage.prompt_tokens, meter.usage.completion_tokens) == (5, 2)


def test_a_usage_in_an_event_that_is_not_json_is_a_total() -> None:
    meter = _meter(b'data: {"type":"x","usage":{"prompt_tokens":3,"completion_tokens":4}, oops\n\n')
    assert meter.usage == Usage(3, 4, seen=True)


def test_a_message_start_whose_message_is_not_an_object_counts_nothing() -> None:
    meter = _meter(b'data: {"type":"message_start","message":"x","usage":{"input_tokens":9}}\n\n')
    assert meter.usage == Usage()


def test_a_messages_delta_never_lowers_the_prompt() -> None:
    meter = _meter(
        b'data: {"type":"message_start","message":{"usage":{"input_tokens":25}}}\n\n',
        b'data: {"type":"message_delta","usage":{"input_tokens":0,"output_tokens":15}}\n\n',
        b'data: {"type":"message_delta","usage":{"output_tokens":9}}\n\n',
    )
    assert (meter.usage.prompt_tokens, meter.usage.completion_tokens) == (25, 15)


def test_a_messages_stream_whose_data_lines_have_no_space() -> None:
    meter = _meter(
        b'event: message_start\ndata:{"type":"message_start","message":{"usage":{"input_tokens":25}}}\n\n',
        b'event: message_delta\ndata:{"type":"message_delta","usage":{"output_tokens":15}}\n\n',
    )
    assert (meter.usage.prompt_tokens, meter.usage.completion_tokens) == (25, 15)


def test_what_is_left_is_flushed_once() -> None:
    meter = StreamMeter(OBSERVE)
    assert meter.feed(b"data: {") == b""
    assert meter.flush() == b"data: {"
    assert meter.flush() == b""


def test_an_unfinished_event_is_carried_up_to_its_bound() -> None:
    at_bound = b"data: " + b"x" * (_MAX_CARRY - 6)
    assert StreamMeter(OBSERVE).feed(at_bound) == b""  # kept until its end arrives
    assert StreamMeter(OBSERVE).feed(at_bound + b"x") == at_bound + b"x"  # past it: passed on


def test_a_stream_of_several_prompts_with_one_choice_each_sums_their_prompts() -> None:
    # /v1/completions with two prompts, n = 1: choice i is prompt i, each with its own prompt count.
    meter = _meter(_event(b'{"index":0,"text":"a"}', 5, 1), _event(b'{"index":1,"text":"b"}', 7, 1),
                   plan=StreamPlan(keep_final=False, keep_continuous=False, choices=1))
    assert (meter.usage.prompt_tokens, meter.usage.completion_tokens) == (12, 2)
