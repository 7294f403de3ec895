"""daemon.codec's JSON parsing: lone UTF-16 surrogates are refused, and the quick test
that lets most bodies skip the surrogate pattern agrees with the pattern."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledgerd.daemon import codec
from ledgerd.daemon import errors as ae

LONE = [
    b'"\\ud800"',
    b'"\\uDFFF"',
    b'{"ops": [{"op": "put", "key": "a2V5", "value": "\\udc00"}]}',
    b'["ok", {"deep": ["\\uDbFf"]}]',
]


@pytest.mark.parametrize("body", LONE)
def test_lone_surrogates_are_refused(body: bytes) -> None:
    for data in (body, body.decode()):
        with pytest.raises(ae.BadRequest, match="lone UTF-16 surrogate"):
            codec.parse_json(data, "body")


def test_a_raw_surrogate_in_a_str_is_refused() -> None:
    with pytest.raises(ae.BadRequest, match="lone UTF-16 surrogate"):
        codec.parse_json('"\ud800"', "message")


def test_a_body_that_is_not_utf8_is_refused() -> None:
    with pytest.raises(ae.BadRequest, match="not valid JSON"):
        codec.parse_json('"\udcff"'.encode("utf-8", "surrogatepass"), "body")


@pytest.mark.parametrize(
    "body",
    [
        b'"\\ud83d\\ude00"',  # a whole pair: one character
        b'"\\\\ud800"',  # an escaped backslash, then the letters
        b'{"ops": [{"op": "put", "key": "a2V5", "value": "dmFsdWU="}]}',
        '"caf\u00e9 \\u00e9"'.encode(),
    ],
)
def test_good_bodies_are_taken(body: bytes) -> None:
    assert codec.parse_json(body, "body") == json.loads(body)


JSON_TEXT = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
).map(lambda v: json.dumps(v, ensure_ascii=False))
"""JSON text, surrogates included: ``st.text()`` draws lone ones, and ``ensure_ascii=False``
leaves them raw where json escapes other control characters."""

ESCAPES = st.lists(
    st.sampled_from(["\\u", "\\ud8", "\\uD9", "\\udc00", "\\uDFFF", "\\\\u", "\\u00e9", "a", "é"])
).map("".join)
"""Strings made of escape-like pieces, to reach the pattern's edges."""


@given(st.one_of(st.text(), JSON_TEXT, ESCAPES, JSON_TEXT.map(lambda t: t.replace("\\", "\\\\"))))
def test_the_quick_test_agrees_with_the_pattern(text: str) -> None:
    pattern = codec._SURROGATE.search(text) is not None
    assert codec.may_hold_surrogate(text, decoded=False) == pattern
    try:
        text.encode()
    except UnicodeEncodeError:
        return  # no body decoded from UTF-8 holds this text
    assert codec.may_hold_surrogate(text, decoded=True) == pattern


def _accepted(data: bytes | str) -> bool:
    """What parse_json must take: UTF-8 (for bytes), JSON, and every string in it
    encodable as UTF-8."""
    try:
        text = data.decode() if isinstance(data, bytes) else data
        json.dumps(json.loads(text), ensure_ascii=False).encode()
    except ValueError:  # not UTF-8, not JSON, or a lone surrogate (UnicodeEncodeError)
        return False
    return True


@given(st.one_of(JSON_TEXT, ESCAPES.map(lambda s: f'["{s}"]')))
def test_parse_json_accepts_what_a_full_check_accepts(text: str) -> None:
    """parse_json, with its quick test, refuses exactly what a check of every body
    refuses."""
    for data in (text, text.encode("utf-8", "surrogatepass")):
        try:
            codec.parse_json(data, "body")
            refused = False
        except ae.BadRequest:
            refused = True
        assert refused == (not _accepted(data)), data
