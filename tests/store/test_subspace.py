"""Subspaces: prefixes, nesting, membership and ranges, byte-identical to fdb.Subspace's."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledgerd.store.keys import tuple as fdbtuple
from ledgerd.store.keys.subspace import Subspace
from ledgerd.store.keys.tuple import TupleError, Versionstamp

fdb_subspace: Any = pytest.importorskip("fdb.subspace_impl")  # the test extra has it


def test_prefix_is_the_packed_tuple_after_the_raw_prefix() -> None:
    s = Subspace(("users", 7), rawPrefix=b"\x15app")
    assert s.key() == b"\x15app" + fdbtuple.pack(("users", 7))
    assert s.as_foundationdb_key() == s.key()
    assert Subspace().key() == b""
    assert repr(s) == f"Subspace(rawPrefix={s.key()!r})"


def test_pack_unpack_and_nesting() -> None:
    users = Subspace(("users",))
    one = users[uuid.UUID(int=1)]
    assert one == users.subspace((uuid.UUID(int=1),))
    assert one.key() == fdbtuple.pack(("users", uuid.UUID(int=1)))
    key = one.pack(("name",))
    assert key == fdbtuple.pack(("users", uuid.UUID(int=1), "name"))
    assert one.unpack(key) == ("name",)
    assert users.unpack(key) == (uuid.UUID(int=1), "name")
    assert one.pack() == one.key() and one.unpack(one.key()) == ()
    assert users["a"]["b"] == Subspace(("a", "b"), users.key())
    assert len({users["a"], Subspace(("users", "a"))}) == 1


def test_contains_and_unpack_errors() -> None:
    s = Subspace(("logs",))
    assert s.contains(s.pack((1,))) and not s.contains(fdbtuple.pack(("other", 1)))
    with pytest.raises(TupleError, match="not in"):
        s.unpack(fdbtuple.pack(("other", 1)))
    with pytest.raises(ValueError, match="at byte"):
        s.unpack(s.key() + b"\x02unterminated")
    raw = Subspace(rawPrefix=b"\xfe")
    assert raw.contains(b"\xfe\x02x\x00") and raw.unpack(b"\xfe\x02x\x00") == ("x",)


def test_range() -> None:
    s = Subspace(("idx",), rawPrefix=b"p")
    r = s.range(("a",))
    assert r == slice(s.pack(("a",)) + b"\x00", s.pack(("a",)) + b"\xff")
    assert r.start <= s.pack(("a", 1)) < r.stop
    assert r.start <= s.pack(("a", None)) < r.stop
    assert not r.start <= s.pack(("a",)) < r.stop
    assert not r.start <= s.pack(("b",)) < r.stop
    whole = s.range()
    assert whole == slice(s.key() + b"\x00", s.key() + b"\xff")
    assert whole.start <= s.pack(("a",)) < whole.stop


def test_pack_with_versionstamp_counts_the_prefix() -> None:
    s = Subspace(("events",), rawPrefix=b"xy")
    packed = s.pack_with_versionstamp(("at", Versionstamp.incomplete(4)))
    offset = int.from_bytes(packed[-4:], "little")
    assert offset == len(s.pack(("at",))) + 1
    stamp = b"\x00" * 8 + b"\x00\x01"
    assert s.unpack(fdbtuple.complete_versionstamp(packed, stamp)) == (
        "at",
        Versionstamp(stamp, 4),
    )


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.one_of(st.text(max_size=5), st.integers(), st.binary(max_size=5)), max_size=3),
    st.binary(max_size=4),
    st.lists(st.one_of(st.text(max_size=5), st.integers(), st.none()), max_size=3),
)
def test_matches_fdb_subspace(prefix: list[Any], raw: bytes, t: list[Any]) -> None:
    ours, theirs = Subspace(tuple(prefix), raw), fdb_subspace.Subspace(tuple(prefix), raw)
    assert ours.key() == theirs.key() and repr(ours) == repr(theirs)
    assert ours.pack(tuple(t)) == theirs.pack(tuple(t))
    assert ours.range(tuple(t)) == theirs.range(tuple(t))
    assert ours["x"].key() == theirs["x"].key()
    assert ours.unpack(ours.pack(tuple(t))) == theirs.unpack(ours.pack(tuple(t))) == tuple(t)
