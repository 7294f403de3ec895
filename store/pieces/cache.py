"""The read cache of a repository: decoded tree nodes and verified pieces, one byte budget.

This module owns the one bounded LRU that every open page of a repository shares
(``Repository.open(cache_bytes=...)``): decoded tree nodes (:class:`store.tree.btree.NodeStore`)
and small pieces known good (:class:`store.pieces.objects.ObjectStore`). It knows nothing of
what it holds beyond a size.

Everything in it is named by a digest, so an entry is never stale: the same digest
always names the same bytes. Entries are still kept apart per page and per kind (a
:class:`CacheSpace`), because what a page answers also says what it *stores*: a
piece cached for one page must not make another page that lacks it look complete.

Each space finds its entries in a dict of its own, keyed by digest; the LRU order of
them all is one ``OrderedDict`` of the entries themselves (hashed by identity), so that a
batch of lookups (a scan's values) runs as ``map`` over the two at C speed.

An entry's cost is an estimate of the memory it holds (its bytes plus Python's
overhead for the objects, see :func:`piece_cost` and :func:`store.tree.btree.node_cost`),
so that the budget bounds the process's memory, not just the payload.
"""

from __future__ import annotations

import itertools
import operator
from collections import OrderedDict, deque
from collections.abc import Iterable
from typing import Generic, TypeVar

CACHE_BYTES = 64 * 1024 * 1024
"""The default budget of a repository's cache (the daemon's ``cache_bytes``)."""

ENTRY_OVERHEAD = 240
"""Bytes an entry costs besides its payload: its :class:`_Entry`, its slots in its
space's dict and in the LRU, and the payload object's header."""

V = TypeVar("V")


class _Entry:
    """One cached value: what it costs, and where it is found (its space's dict, its
    digest there). Hashed and compared by identity, as the LRU's key."""

    __slots__ = ("value", "cost", "home", "digest")

    def __init__(self, value: object, cost: int, home: dict[bytes, _Entry], digest: bytes) -> None:
        self.value = value
        self.cost = cost
        self.home = home
        self.digest = digest


_VALUE = operator.attrgetter("value")


def piece_cost(data: bytes) -> int:
    return ENTRY_OVERHEAD + len(data)


class Cache:
    """An LRU of entries in its spaces holding at most ``budget`` bytes (estimated)."""

    def __init__(self, budget: int = CACHE_BYTES) -> None:
        if budget < 0:
            raise ValueError("a cache budget is not negative")
        self.budget = budget
        self.used = 0
        self._order: OrderedDict[_Entry, None] = OrderedDict()
        """Every entry, the least recently used first."""
        self._spaces = itertools.count()

    def space(self) -> CacheSpace[V]:
        """A fresh namespace in this cache (one per page and kind of entry)."""
        return CacheSpace(self, next(self._spaces))

    def __len__(self) -> int:
        return len(self._order)

    def _put(self, home: dict[bytes, _Entry], items: Iterable[tuple[bytes, object, int]]) -> None:
        """Keep each ``(digest, value, cost)`` of ``items`` in ``home``, the most recent
        last, evicting the least recent entries as the budget needs."""
        order, budget = self._order, self.budget
        for digest, value, cost in items:
            old = home.pop(digest, None)
            if old is not None:
                del order[old]
                self.used -= old.cost
            if cost > budget:
                continue
            entry = _Entry(value, cost, home, digest)
            home[digest] = entry
            order[entry] = None
            self.used += cost
            while self.used > budget:
                gone, _ = order.popitem(last=False)
                del gone.home[gone.digest]
                self.used -= gone.cost

    def _drop(self, home: dict[bytes, _Entry]) -> None:
        order = self._order
        for entry in home.values():
            del order[entry]
            self.used -= entry.cost
        home.clear()

    def clear(self) -> None:
        for entry in self._order:
            entry.home.clear()
        self._order.clear()
        self.used = 0


class CacheSpace(Generic[V]):
    """One namespace of a :class:`Cache`: digest -> value."""

    __slots__ = ("cache", "id", "_found")

    def __init__(self, cache: Cache, space: int) -> None:
        self.cache = cache
        self.id = space
        self._found: dict[bytes, _Entry] = {}

    def get(self, digest: bytes) -> V | None:
        entry = self._found.get(digest)
        if entry is None:
            return None
        self.cache._order.move_to_end(entry)
        return entry.value  # type: ignore[return-value]

    def get_each(self, digests: Iterable[bytes]) -> list[V | None]:
        """The cached value of each of ``digests`` in order, None where there is none;
        each found counts as used, as by :meth:`get` (in this order). Column by column,
        at C speed: a scan looks up every value of a page here."""
        got = list(map(self._found.get, digests))
        touch = self.cache._order.move_to_end
        if None not in got:  # all found (an entry is equal to nothing but itself)
            deque(map(touch, got), 0)  # type: ignore[arg-type]
            return list(map(_VALUE, got))
        out: list[V | None] = []
        for entry in got:
            if entry is None:
                out.append(None)
            else:
                touch(entry)
                out.append(entry.value)  # type: ignore[arg-type]
        return out

    def get_many(self, digests: Iterable[bytes]) -> tuple[dict[bytes, V], list[bytes]]:
        """The cached values among ``digests`` (each counts as used, as by :meth:`get`),
        and the digests that are not cached, in their order."""
        wanted = digests if type(digests) is list else list(digests)
        found: dict[bytes, V] = {}
        missing: list[bytes] = []
        for d, v in zip(wanted, self.get_each(wanted), strict=True):
            if v is None:
                missing.append(d)
            else:
                found[d] = v
        return found, missing

    def put(self, digest: bytes, value: V, cost: int) -> None:
        self.cache._put(self._found, ((digest, value, cost),))

    def put_many(self, items: Iterable[tuple[bytes, V, int]]) -> None:
        """:meth:`put` each ``(digest, value, cost)``, in order."""
        self.cache._put(self._found, items)

    def demote(self, digests: Iterable[bytes]) -> None:
        """Make these entries the first to go when room is needed (a tree node that a
        commit replaced: the head no longer holds it, though a diff may still read it)."""
        found, order = self._found, self.cache._order
        for d in digests:
            entry = found.get(d)
            if entry is not None:
                order.move_to_end(entry, last=False)

    def __contains__(self, digest: bytes) -> bool:
        return digest in self._found

    def clear(self) -> None:
        """Forget this space's entries (as in a freshly started process)."""
        self.cache._drop(self._found)
