"""A big batch body's ops decoded a group at a time, as they are parsed, read as the
body parsed whole (:func:`daemon.codec.batch_body_changes`)."""

from __future__ import annotations

import base64
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledgerd.daemon import codec
from ledgerd.daemon import errors as ae
from ledgerd.store import check_key


def _whole(body: bytes) -> object:
    """The reference: the body parsed whole, then its ops decoded."""
    try:
        doc = codec.parse_json(body, "batch body")
        ops = doc.get("ops") if isinstance(doc, dict) else None
        if not isinstance(ops, list):
            raise ae.BadRequest('batch body must be {"ops": [...]}')
        return codec.batch_changes(ops)
    except ae.BadRequest as e:
        return str(e)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


template = b"t" + b"\xff" * 10 + (1).to_bytes(4, "little")
ops = st.one_of(
    st.builds(
        lambda k, v: {"op": "put", "key": _b64(k), "value": _b64(v)}, st.binary(), st.binary()
    ),
    st.builds(lambda k: {"op": "delete", "key": _b64(k)}, st.binary(max_size=8)),
    st.builds(
        lambda p: {"op": "put", "key": "a2V5", "value": "dg==", "priority": p},
        st.sampled_from(["lazy", "eager", "late", 3]),
    ),
    st.just({"op": "set_versionstamped_key", "key": _b64(template), "value": "dg=="}),
    st.just({"op": "set_versionstamped_key", "key": "dg==", "value": "dg=="}),
    st.just({"op": "put", "key": "not base64!"}),
    st.just({"op": "put", "key": _b64(b"k" * 3000), "value": "dg=="}),
    st.just({"op": "get"}),
    st.just(7),
)


@pytest.mark.parametrize("group", [1, 2, 3])
@settings(max_examples=150, deadline=None)
@given(st.lists(ops, max_size=9), st.sampled_from(["", "x", "]", ', "more": 1}']))
def test_ops_decoded_a_group_at_a_time_read_as_the_body_parsed_whole(
    group: int, ops: list[object], tail: str
) -> None:
    """The same changes, or the same error, whatever the groups and the parts, for
    bad ops and for bodies that go wrong after them."""
    saved = codec.OPS_GROUP, codec.TEXT_PART
    codec.OPS_GROUP, codec.TEXT_PART = group, 16
    try:
        text = json.dumps({"ops": ops})
        body = (text[:-1] + tail if tail else text).encode()
        try:
            got: object = codec.batch_body_changes([body])[0]
        except ae.BadRequest as e:
            got = str(e)
        want = _whole(body)
        if isinstance(want, list):  # a good body: its keys are checked too
            try:
                for change in want:
                    if type(change[0]) is bytes:
                        check_key(change[0])
            except Exception as e:
                assert isinstance(got, str), e
                return
        assert got == want
    finally:
        codec.OPS_GROUP, codec.TEXT_PART = saved
