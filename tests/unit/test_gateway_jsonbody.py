"""The JSON body walk: the top-level model is aliased in place, everything else passes byte for byte;
bodies that are not objects or nest too deep are refused with a reason (400), never a 500."""

from __future__ import annotations

import json

import pytest

from controller.gateway.jsonbody import BodyError, ModelNotFound, alias_model, model_spans


def test_aliases_only_the_top_level_model_and_keeps_other_bytes() -> None:
    # Spacing, key order, escapes and a nested "model" member must all survive untouched.
    body = (
        b'{ "messages" : [{"role":"user","content":"say \\"model\\": [ { } ]\\u00e9"}],\n'
        b' "model" : "gpt-4o",\t"tools":[{"model":"inner"}], "n": 1e400, "stream":true }'
    )
    out = alias_model(body, "served", 128, frozenset({"gpt-4o"}))
    assert out == body.replace(b'"gpt-4o"', b'"served"')
    doc = json.loads(out)
    assert doc["model"] == "served" and doc["tools"][0]["model"] == "inner"


def test_no_served_model_or_same_name_forwards_the_same_object() -> None:
    body = b'{"model":"served","messages":[]}'
    assert alias_model(body, "served", 128) is body
    assert alias_model(body, None, 128) is body
    assert alias_model(b'{"messages":[]}', "served", 128) == b'{"messages":[]}'
    assert alias_model(b'{"model":"\\u0073erved"}', "served", 128) == b'{"model":"\\u0073erved"}'


def test_non_ascii_served_name() -> None:
    assert json.loads(alias_model(b'{"model":"x"}', "modèle", 128, frozenset({"x"})))["model"] == "modèle"


@pytest.mark.parametrize("pad", [0, 200])  # few brackets (json.loads path) and many (the walk)
def test_depth_bound_is_a_400_reason_not_a_recursion_error(pad: int) -> None:
    filler = b'"f":[' + b"[]," * pad + b"[]],"  # many brackets, depth 3
    ok = b'{' + filler + b'"a":' + b"[" * 127 + b"]" * 127 + b',"model":"x"}'
    assert json.loads(alias_model(ok, "s", 128, frozenset({"x"})))["model"] == "s"
    deep = b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with pytest.raises(BodyError, match="deeper than 128"):
        alias_model(deep, "s", 128)
    with pytest.raises(BodyError, match="deeper than 128"):
        model_spans(b'{' + filler + b'"a":' + b"{\"b\":" * 200 + b"1" + b"}" * 200 + b"}", 128)


@pytest.mark.parametrize(
    "bad",
    [
        b"",
        b"   ",
        b"[1, 2]",
        b'"text"',
        b"\xff\xfe",
        b'{"model": "x",',
        b'{"a": [1, 2}',
        b'{"a": "unterminated}',
        b'{"a": 1} trailing',
        b'{"a" 1}',
        b'{a: 1}',
    ],
)
def test_not_an_object_is_refused(bad: bytes) -> None:
    with pytest.raises(BodyError, match="malformed JSON body"):
        alias_model(bad, "s", 128)
    with pytest.raises(BodyError, match="malformed JSON body"):
        model_spans(bad, 128)  # the walk agrees with json.loads on these


def test_large_body_walk_matches_a_full_parse() -> None:
    messages = [{"role": "user", "content": f"part {i} with [brackets] and {{braces}} \"quotes\""}
                for i in range(5000)]
    body = json.dumps({"messages": messages, "model": "alias", "temperature": 0.5}).encode()
    out = alias_model(body, "served", 128, frozenset({"alias"}))
    assert json.loads(out) == {"messages": messages, "model": "served", "temperature": 0.5}
    assert len(out) == len(body) + 1



def test_large_flat_body_is_walked_not_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    # 16 MiB of `[1,1,…]` held json.loads (one C call, the GIL held) for over a second.
    import controller.gateway.jsonbody as jb

    parsed: list[int] = []
    real_loads = json.loads

    def recording_loads(data: bytes) -> object:
        parsed.append(len(data))
        return real_loads(data)

    monkeypatch.setattr("controller.gateway.jsonbody.json.loads", recording_loads)
    body = b'{"model":"alias","a":[' + b",".join([b"1"] * 100_000) + b"]}"
    out = jb.alias_model(body, "served", 128, frozenset({"alias"}))
    assert out == body.replace(b'"alias"', b'"served"', 1)
    assert parsed == [len(b'"alias"')]  # only the model name was decoded


# Finding 8: a model name the gateway does not serve is refused, never served by whatever engine runs.


@pytest.mark.parametrize("pad", [0, 200])  # few brackets (json.loads path) and many (the walk)
def test_an_unknown_model_name_is_refused_and_only_aliases_are_rewritten(pad: int) -> None:
    filler = b'"f":[' + b"[]," * pad + b"[]],"
    aliases = frozenset({"smol", "small"})
    with pytest.raises(ModelNotFound) as caught:
        alias_model(b"{" + filler + b'"model":"gpt-4o"}', "smollm2", 128, aliases)
    assert caught.value.model == "gpt-4o"
    with pytest.raises(ModelNotFound):  # no aliases: only the served name
        alias_model(b"{" + filler + b'"model":"smol"}', "smollm2", 128)
    out = alias_model(b"{" + filler + b'"model":"smol"}', "smollm2", 128, aliases)
    assert json.loads(out)["model"] == "smollm2"
    served = b"{" + filler + b'"model":"smollm2"}'
    assert alias_model(served, "smollm2", 128, aliases) is served
    # Every top-level "model" member is checked, not only the one json.loads keeps (the last).
    with pytest.raises(ModelNotFound):
        alias_model(b"{" + filler + b'"model":"gpt-4o","model":"smollm2"}', "smollm2", 128, aliases)


def test_what_is_not_checked_is_forwarded_unchanged() -> None:
    # No model member, or not a string: the engine answers for it (as before). No served name known
    # (a gateway started without one): nothing to check against.
    for body in (b'{"messages":[]}', b'{"model":3}', b'{"model":null}'):
        assert alias_model(body, "smollm2", 128) is body
    body = b'{"model":"gpt-4o"}'
    assert alias_model(body, None, 128) is body


def test_model_not_found_body_is_openais() -> None:
    assert json.loads(ModelNotFound("gpt-4o").body()) == {"error": {
        "message": "The model `gpt-4o` does not exist or you do not have access to it.",
        "type": "invalid_request_error", "param": "model", "code": "model_not_found"}}
    long = json.loads(ModelNotFound("m" * 100_000).body())["error"]["message"]
    assert len(long) < 400 and long.startswith("The model `mmm")
