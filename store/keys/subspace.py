"""Subspaces: a key prefix, packed from a tuple, under which tuple keys are packed.

This module owns :class:`Subspace`, with the names and behaviour of the class in
FoundationDB's Python binding (``fdb.Subspace``): a subspace is nothing but its raw
prefix, so ``Subspace(("users",))`` and the keys it packs are byte-identical to
FoundationDB's. It does no I/O and owns no encoding (that is :mod:`.tuple`), nor the
directory layer, which allocates short prefixes for named paths and is not built here.
"""

from __future__ import annotations

from typing import Any

from ledgerd.store.keys.tuple import TupleError, pack, pack_with_versionstamp, range, unpack


class Subspace:
    """The keys that start with ``rawPrefix`` followed by the packed ``prefixTuple``."""

    __slots__ = ("rawPrefix",)

    def __init__(self, prefixTuple: tuple[Any, ...] = (), rawPrefix: bytes = b"") -> None:
        self.rawPrefix: bytes = pack(prefixTuple, prefix=rawPrefix)

    def key(self) -> bytes:
        """The prefix itself: the key of this subspace's empty tuple."""
        return self.rawPrefix

    def as_foundationdb_key(self) -> bytes:
        return self.rawPrefix

    def pack(self, t: tuple[Any, ...] = ()) -> bytes:
        return pack(t, prefix=self.rawPrefix)

    def pack_with_versionstamp(self, t: tuple[Any, ...]) -> bytes:
        """Like :func:`.tuple.pack_with_versionstamp`; the offset counts the prefix."""
        return pack_with_versionstamp(t, prefix=self.rawPrefix)

    def unpack(self, key: bytes) -> tuple[Any, ...]:
        """The tuple packed in ``key`` after the prefix; ``ValueError`` if ``key`` is not
        in this subspace or is not a packed tuple."""
        if not self.contains(key):
            raise TupleError(f"key {key!r} is not in {self!r}")
        return unpack(key, prefix_len=len(self.rawPrefix))

    def range(self, t: tuple[Any, ...] = ()) -> slice:
        """The keys of every tuple in this subspace that starts with ``t`` and is longer."""
        r = range(t)
        return slice(self.rawPrefix + r.start, self.rawPrefix + r.stop)

    def contains(self, key: bytes) -> bool:
        """Whether ``key`` starts with the prefix (it may still not be a packed tuple)."""
        return key.startswith(self.rawPrefix)

    def subspace(self, t: tuple[Any, ...]) -> Subspace:
        """The subspace of ``t`` nested in this one."""
        return Subspace(t, self.rawPrefix)

    def __getitem__(self, name: Any) -> Subspace:
        """``sub[x]`` is ``sub.subspace((x,))``."""
        return Subspace((name,), self.rawPrefix)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Subspace) and self.rawPrefix == other.rawPrefix

    def __hash__(self) -> int:
        return hash((Subspace, self.rawPrefix))

    def __repr__(self) -> str:
        return f"Subspace(rawPrefix={self.rawPrefix!r})"
