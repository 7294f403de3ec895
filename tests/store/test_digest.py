from __future__ import annotations

import hashlib
import struct

import pytest

from ledgerd.store.errors import InvalidDigestError
from ledgerd.store.pieces import digest as dg


@pytest.mark.parametrize(
    ("kind", "limit"), [(dg.Kind.VALUE, 128), (dg.Kind.TREE, 32)], ids=["value", "tree"]
)
def test_values_are_inline_up_to_128_bytes_tree_nodes_up_to_32(kind: dg.Kind, limit: int) -> None:
    assert dg.inline_limit(kind) == limit
    for n in (0, 1, limit):
        d = dg.chunk_digest(kind, b"x" * n)
        assert dg.is_inline(d) and dg.inline_content(d) == b"x" * n
        assert len(d) == n + 1 and dg.validate(d) == d and dg.verify(d, b"x" * n)
    d = dg.chunk_digest(kind, b"x" * (limit + 1))
    assert not dg.is_inline(d)
    assert d[1:] == hashlib.sha256(struct.pack(">Q", limit + 1) + b"x" * (limit + 1)).digest()
    # One name for each piece: content this short is never named by its hash.
    hashed = bytes([d[0]]) + dg.content_hash(b"x" * limit)
    assert not dg.verify(hashed, b"x" * limit)
    with pytest.raises(InvalidDigestError, match=f"longer than {limit} bytes"):
        dg.validate(bytes([dg.chunk_digest(kind, b"")[0]]) + b"x" * (limit + 1))


def test_type_byte_tells_kind_and_index() -> None:
    data = b"y" * 200
    v = dg.chunk_digest(dg.Kind.VALUE, data)
    t = dg.chunk_digest(dg.Kind.TREE, data)
    i = dg.index_digest(dg.Kind.VALUE, data)
    assert len({v, t, i}) == 3 and v[1:] == t[1:] == i[1:]
    assert dg.kind_of(v) is dg.Kind.VALUE and dg.kind_of(t) is dg.Kind.TREE
    assert dg.is_index(i) and not dg.is_index(v)
    assert dg.verify(v, data) and not dg.verify(v, data + b"!")


@pytest.mark.parametrize(
    "bad",
    [b"", b"\x80" + b"\0" * 32, b"\x00" + b"\0" * 10, b"\x01" + b"\0" * 129, b"\x05" + b"\0" * 33]
    + [b"\x03abc"],
)
def test_validate_rejects_malformed(bad: bytes) -> None:
    with pytest.raises(InvalidDigestError):
        dg.validate(bad)


def test_fast_value_digest_matches() -> None:
    for n in (0, 1, 32, 33, 100, 4096):
        data = bytes(range(256)) * 20
        assert dg.value_chunk_digest(data[:n]) == dg.chunk_digest(dg.Kind.VALUE, data[:n])
