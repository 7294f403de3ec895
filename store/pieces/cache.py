"""The read cache of a repository: decoded tree nodes and verified pieces, one byte budget.

This module owns the one bounded LRU that every open page of a repository shares
(``Repository.open(cache_bytes=...)``): decoded tree nodes (:class:`store.tree.btree.NodeStore`)
and small pieces known good (:class:`store.pieces.objects.ObjectStore`). It knows nothing of
what it holds beyond a size.

Everything in it is named by a digest, so an entry is never stale: the same digest
always names the same bytes. Entries are still kept apart per page and per kind (a
:class:`CacheSpace`), because what a page answers also says what it *stores*: a
piece cached for one page must not make another page that lacks it look complete.

An entry's cost is an estimate of the memory it holds (its bytes plus Python's
overhead for the objects, see :func:`piece_cost` and :func:`store.tree.btree.node_cost`),
so that the budget bounds the process's memory, not just the payload.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Iterable
from typing import Generic, TypeVar

CACHE_BYTES = 64 * 1024 * 1024
"""The default budget of a repository's cache (the daemon's ``cache_bytes``)."""

ENTRY_OVERHEAD = 240
"""Bytes an entry costs besides its payload: its key (a tuple, an int and a digest),
the LRU's link and the payload object's header."""

V = TypeVar("V")


def piece_cost(data: bytes) -> int:
    return ENTRY_OVERHEAD + len(data)


class Cache:
    """An LRU over ``(space, digest)`` keys holding at most ``budget`` bytes (estimated)."""

    def __init__(self, budget: int = CACHE_BYTES) -> None:
        if budget < 0:
            raise ValueError("a cache budget is not negative")
        self.budget = budget
        self.used = 0
        self._entries: OrderedDict[tuple[int, bytes], tuple[object, int]] = OrderedDict()
        self._spaces = itertools.count()

    def space(self) -> CacheSpace[V]:
        """A fresh namespace in this cache (one per page and kind of entry)."""
        return CacheSpace(self, next(self._spaces))

    def __len__(self) -> int:
        return len(self._entries)

    def _put(self, key: tuple[int, bytes], value: object, cost: int) -> None:
        entries = self._entries
        old = entries.pop(key, None)
        if old is not None:
            self.used -= old[1]
        if cost > self.budget:
            return
        entries[key] = (value, cost)
        self.used += cost
        while self.used > self.budget:
            _, (_, c) = entries.popitem(last=False)
            self.used -= c

    def _drop_space(self, space: int) -> None:
        for key in [k for k in self._entries if k[0] == space]:
            self.used -= self._entries.pop(key)[1]

    def clear(self) -> None:
        self._entries.clear()
        self.used = 0


class CacheSpace(Generic[V]):
    """One namespace of a :class:`Cache`: digest -> value."""

    __slots__ = ("cache", "id", "_entries")

    def __init__(self, cache: Cache, space: int) -> None:
        self.cache = cache
        self.id = space
        self._entries = cache._entries

    def get(self, digest: bytes) -> V | None:
        key = (self.id, digest)
        got = self._entries.get(key)
        if got is None:
            return None
        self._entries.move_to_end(key)
        return got[0]  # type: ignore[return-value]

    def get_many(self, digests: Iterable[bytes]) -> tuple[dict[bytes, V], list[bytes]]:
        """The cached values among ``digests`` (each counts as used, as by :meth:`get`),
        and the digests that are not cached, in their order."""
        entries, space = self._entries, self.id
        touch = entries.move_to_end
        found: dict[bytes, V] = {}
        missing: list[bytes] = []
        for d in digests:
            key = (space, d)
            got = entries.get(key)
            if got is None:
                missing.append(d)
            else:
                touch(key)
                found[d] = got[0]  # type: ignore[assignment]
        return found, missing

    def put(self, digest: bytes, value: V, cost: int) -> None:
        self.cache._put((self.id, digest), value, cost)

    def demote(self, digests: Iterable[bytes]) -> None:
        """Make these entries the first to go when room is needed (a tree node that a
        commit replaced: the head no longer holds it, though a diff may still read it)."""
        entries, space = self._entries, self.id
        for d in digests:
            key = (space, d)
            if key in entries:
                entries.move_to_end(key, last=False)

    def __contains__(self, digest: bytes) -> bool:
        return (self.id, digest) in self._entries

    def clear(self) -> None:
        """Forget this space's entries (as in a freshly started process)."""
        self.cache._drop_space(self.id)
