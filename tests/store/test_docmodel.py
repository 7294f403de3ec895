"""The document model's fast paths against the plain definitions they stand for:
id texts against python-ulid, the JSON check against a direct reading of its rules."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ulid import ULID

from ledgerd.store.documents.docmodel import (
    MAX_DEPTH,
    InvalidDocumentError,
    RevClock,
    check_data,
    parse_ulid,
    ulid_text,
)

REV = bytes.fromhex("0190a1b2c3d400ff00ee11dd22cc33bb")


def test_id_texts_are_pinned() -> None:
    assert ulid_text(REV) == "01J2GV5GYM03ZG1VGHVMHCRCXV"
    assert ulid_text(bytes(range(16))) == "00041061050R3GG28A1C60T3GF"
    assert ulid_text(b"\xff" * 16) == "7ZZZZZZZZZZZZZZZZZZZZZZZZZ"
    assert parse_ulid("01J2GV5GYM03ZG1VGHVMHCRCXV") == REV


@given(st.binary(min_size=16, max_size=16))
def test_id_text_is_python_ulids(raw: bytes) -> None:
    text = ulid_text(raw)
    assert text == str(ULID.from_bytes(raw))
    assert parse_ulid(text) == raw
    assert parse_ulid(text.lower()) == raw


def test_revisions_increase_within_one_millisecond_and_past_a_seen_one() -> None:
    clock = RevClock(lambda: 1_000)
    revs = [clock.next() for _ in range(2000)]  # more random bytes than one pool holds
    assert revs == sorted(revs) and len(set(revs)) == len(revs)
    ahead = (5_000 << 80 | 7).to_bytes(16, "big")
    clock.observe(ahead)
    assert clock.next() > ahead


def test_a_batch_of_revisions_is_what_as_many_calls_in_one_millisecond_make() -> None:
    now = [1_000]
    clock = RevClock(lambda: now[0])
    assert clock.next_many(0) == []
    one = clock.next()
    batch = clock.next_many(3000)  # more random bytes than one pool holds
    after = clock.next()
    revs = [one, *batch, after]
    values = [int.from_bytes(r, "big") for r in revs]
    assert all(len(r) == 16 for r in revs)
    assert all(1 <= b - a <= 2**32 for a, b in zip(values, values[1:], strict=False))
    assert {v >> 80 for v in values} == {1_000}  # the random part took the steps
    # A batch starts past a revision seen, and in a new millisecond starts there.
    ahead = (5_000 << 80 | 7).to_bytes(16, "big")
    clock.observe(ahead)
    assert clock.next_many(2)[0] > ahead
    now[0] = 9_000
    first, second = clock.next_many(2)
    assert int.from_bytes(first, "big") >> 80 == 9_000 and second > first


def _reference_check(data: Any) -> None:
    """The JSON rules read directly (the implementation before it was made faster)."""
    if isinstance(data, dict):
        for k in data:
            if isinstance(k, str) and k.startswith("_"):
                raise InvalidDocumentError("reserved")
    stack: list[tuple[Any, int]] = [(data, 0)]
    while stack:
        v, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise InvalidDocumentError("deep")
        t = type(v)
        if t is str or t is bool or v is None:
            continue
        if t is int:
            if not -(2**63) <= v < 2**64:
                raise InvalidDocumentError("int")
        elif t is float:
            if not math.isfinite(v):
                raise InvalidDocumentError("float")
        elif t is dict:
            for k, item in v.items():
                if type(k) is not str:
                    raise InvalidDocumentError("key")
                stack.append((item, depth + 1))
        elif t is list:
            stack.extend((item, depth + 1) for item in v)
        else:
            raise InvalidDocumentError("type")


_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**65), max_value=2**65),
    st.floats(),
    st.text(max_size=5),
    st.sampled_from([b"x", (1,), {1}, 1j]),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(st.text(max_size=4), st.integers(0, 3)), inner, max_size=4),
    ),
    max_leaves=30,
)


def _agree(data: Any) -> None:
    try:
        _reference_check(data)
        expected = True
    except InvalidDocumentError:
        expected = False
    try:
        assert check_data(data) is data
        accepted = True
    except InvalidDocumentError:
        accepted = False
    assert accepted == expected, data


@settings(max_examples=500)
@given(_values)
def test_the_json_check_accepts_and_refuses_as_its_rules_say(data: Any) -> None:
    _agree(data)


@pytest.mark.parametrize("depth", [MAX_DEPTH - 1, MAX_DEPTH, MAX_DEPTH + 1])
@pytest.mark.parametrize("leaf", [1, None, [], {}, "s", [1], {"a": 1}])
@pytest.mark.parametrize("box", ["list", "dict"])
def test_the_json_check_at_the_depth_limit(depth: int, leaf: Any, box: str) -> None:
    data = leaf
    for _ in range(depth):
        data = [data] if box == "list" else {"a": data}
    _agree(data)
