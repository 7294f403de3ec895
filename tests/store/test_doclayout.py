"""The document layer's stored bytes, pinned: keys, heads and bodies.

Documents already stored (and other devices' trees, whose digests depend on these
bytes) must read the same after any change to how they are made; the fast paths
that make them are checked against the general ones they stand for.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ledgerd.store.documents import doclayout
from ledgerd.store.documents.doclayout import AttachmentMeta, Record, State
from ledgerd.store.keys import tuple as tup
from ledgerd.store.pieces.digest import value_chunk_digest

DOC = bytes(range(16))  # holds a 0x00, escaped in keys
REV = bytes.fromhex("0190a1b2c3d400ff00ee11dd22cc33bb")


def test_keys_are_pinned() -> None:
    prefix = "026400026974656d73000100ff0102030405060708090a0b0c0d0e0f00"
    assert doclayout.doc_prefix("items", DOC).hex() == prefix
    assert doclayout.head_key("items", DOC).hex() == prefix + "14"
    assert doclayout.body_key("items", DOC).hex() == prefix + "1501"
    assert doclayout.attachment_key("items", DOC, REV).hex() == (
        prefix + "1502010190a1b2c3d400ffff00ffee11dd22cc33bb00"
    )
    assert doclayout.collection_prefix("items").hex() == "026400026974656d7300"


def test_head_and_body_encodings_are_pinned() -> None:
    assert doclayout.encode_head(REV, State.DELETED).hex() == "0190a1b2c3d400ff00ee11dd22cc33bb01"
    data = {"k": 1, "v": 0.5, "name": "x", "tags": ["a", "b"], "n": None}
    r = Record(
        REV,
        State.LIVE,
        1720000000000,
        1720000000500,
        None,
        None,
        data,
        (AttachmentMeta(DOC, "a.txt", "text/plain", 3),),
    )
    body = doclayout.encode_record(r)
    assert body.hex() == (
        "9901c4100190a1b2c3d400ff00ee11dd22cc33bb00cf0000019077fd3000cf0000019077fd31f4c0c0"
        "85a16b01a176cb3fe0000000000000a46e616d65a178a47461677392a161a162a16ec09194c41000"
        "0102030405060708090a0b0c0d0e0fa5612e747874aa746578742f706c61696e03"
    )
    assert doclayout.decode_record(body) == r


@given(st.text(min_size=1, max_size=20), st.binary(min_size=16, max_size=16))
def test_keys_are_the_packed_tuples(collection: str, doc_id: bytes) -> None:
    assert doclayout.doc_prefix(collection, doc_id) == tup.pack(("d", collection, doc_id))
    assert doclayout.head_key(collection, doc_id) == tup.pack(("d", collection, doc_id, 0))
    assert doclayout.body_key(collection, doc_id) == tup.pack(("d", collection, doc_id, 1))
    assert doclayout.doc_keys(collection, doc_id) == (
        doclayout.head_key(collection, doc_id),
        doclayout.body_key(collection, doc_id),
    )


_ELEMENT = st.one_of(st.text(max_size=6), st.binary(max_size=18), st.integers(-3, 300), st.none())


@given(
    st.one_of(
        # document keys, well formed
        st.builds(
            lambda c, d, p: tup.pack(("d", c, d, p)),
            st.text(max_size=8),
            st.binary(max_size=18),
            st.sampled_from([0, 1, 2, 3]),
        ),
        st.builds(
            lambda c, d, a: doclayout.attachment_key(c, d, a),
            st.text(max_size=8),
            st.binary(max_size=18),
            st.binary(max_size=18),
        ),
        # other tuples under and beside the document prefix
        st.builds(lambda t: tup.pack(("d", *t)), st.lists(_ELEMENT, max_size=5).map(tuple)),
        st.builds(lambda t: tup.pack(t), st.lists(_ELEMENT, max_size=5).map(tuple)),
        # bytes that may not be a tuple at all
        st.binary(max_size=40).map(lambda b: doclayout.DOCS + b),
        st.binary(max_size=40),
    )
)
def test_parsing_a_document_key_fast_agrees_with_unpacking_it(key: bytes) -> None:
    assert doclayout.parse_doc_key(key) == doclayout._parse_doc_key(key)


def test_parsing_a_document_key() -> None:
    for collection in ("items", "", "n\x00ul", "é"):
        for doc_id in (DOC, REV, bytes(range(1, 17))):
            head, body = doclayout.doc_keys(collection, doc_id)
            assert doclayout.parse_doc_key(head) == (collection, doc_id, doclayout.HEAD, None, None)
            assert doclayout.parse_doc_key(body) == (collection, doc_id, doclayout.BODY, None, None)
            att = doclayout.attachment_key(collection, doc_id, REV)
            assert doclayout.parse_doc_key(att) == (
                collection,
                doc_id,
                doclayout.ATTACHMENT,
                REV,
                None,
            )
    assert doclayout.parse_doc_key(doclayout.DOCS) is None
    assert doclayout.parse_doc_key(doclayout.index_key("items", "by_k")) is None
    assert doclayout.parse_doc_key(doclayout.body_key("items", DOC) + b"\x00") is None


def test_a_kept_conflicts_key_names_its_revision_state_and_dot() -> None:
    dot = bytes(range(16))
    cid = doclayout.conflict_id(REV, doclayout.State.DELETED, dot)
    group = doclayout.doc_prefix("items", DOC)
    key = doclayout.conflict_key_in(group, cid)
    assert key.startswith(doclayout.conflict_prefix("items", DOC))
    assert key.startswith(doclayout.conflicts_of_group(group))
    assert doclayout.group_of(key) == group
    assert doclayout.parse_doc_key(key) == ("items", DOC, doclayout.CONFLICT, None, cid)
    assert doclayout.parse_conflict_id(cid) == (REV, doclayout.State.DELETED, dot)
    head = doclayout.encode_head(REV, doclayout.State.DELETED)
    assert doclayout.conflict_head(cid) == value_chunk_digest(head)  # ranks as a head
    assert doclayout.parse_doc_key(doclayout.conflict_key_in(group, cid[:-1])) is None
