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
them all is one ``OrderedDict`` keyed by each entry's ``id()``, so that a batch of
lookups (a scan's values) runs as ``map`` over the two at C speed. An entry is a plain
tuple, which the garbage collector stops tracking once it holds only bytes and ints.

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
"""Bytes an entry costs besides its payload: its tuple, its slots in its space's dict
and in the LRU (with its ``id()``), and the payload object's header."""

V = TypeVar("V")

_Entry = tuple[object, int, bytes, int]
"""A cached value, what it costs, its digest and the id of its space."""

_Item = tuple[bytes, object, int]
"""What to cache: a digest, its value and what it costs."""

_VALUE = operator.itemgetter(0)


def piece_cost(data: bytes) -> int:
    return ENTRY_OVERHEAD + len(data)


class Cache:
    """An LRU of the entries of its spaces holding at most ``budget`` bytes (estimated)."""

    def __init__(self, budget: int = CACHE_BYTES) -> None:
        if budget < 0:
            raise ValueError("a cache budget is not negative")
        self.budget = budget
        self.used = 0
        self._order: OrderedDict[int, _Entry] = OrderedDict()
        """Every entry by its ``id()``, the least recently used first."""
        self._homes: dict[int, dict[bytes, _Entry]] = {}
        """The entries of each space that holds any, by digest."""
        self._spaces = itertools.count()

    def space(self) -> CacheSpace[V]:
        """A fresh namespace in this cache (one per page and kind of entry)."""
        return CacheSpace(self, next(self._spaces))

    def __len__(self) -> int:
        return len(self._order)

    def _put(self, space: int, home: dict[bytes, _Entry], items: Iterable[_Item]) -> None:
        """Keep each ``(digest, value, cost)`` of ``items`` in ``home``, the most recent
        last, evicting the least recent entries as the budget needs."""
        order, budget, homes = self._order, self.budget, self._homes
        for digest, value, cost in items:
            old = home.pop(digest, None)
            if old is not None:
                del order[id(old)]
                self.used -= old[1]
            if cost > budget:
                continue
            entry = (value, cost, digest, space)
            home[digest] = entry
            homes[space] = home
            order[id(entry)] = entry
            self.used += cost
            while self.used > budget:  # (never down to the new entry: cost <= budget)
                _, (_, gone_cost, gone, gone_space) = order.popitem(last=False)
                self.used -= gone_cost
                emptied = homes[gone_space]
                del emptied[gone]
                if not emptied:  # a space that holds nothing is not kept track of
                    del homes[gone_space]

    def _drop(self, space: int) -> None:
        home = self._homes.pop(space, None)
        if home is None:
            return
        for entry in home.values():
            del self._order[id(entry)]
            self.used -= entry[1]
        home.clear()

    def clear(self) -> None:
        for home in self._homes.values():
            home.clear()
        self._homes.clear()
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
        self.cache._order.move_to_end(id(entry))
        return entry[0]  # type: ignore[return-value]

    def get_each(self, digests: Iterable[bytes]) -> list[V | None]:
        """The cached value of each of ``digests`` in order, None where there is none;
        each found counts as used, as by :meth:`get` (in this order). Column by column,
        at C speed: a scan looks up every value of a page here."""
        got = list(map(self._found.get, digests))
        # (an entry is a non-empty tuple: filter(None, ...) keeps those found, in order)
        deque(map(self.cache._order.move_to_end, map(id, filter(None, got))), 0)
        return _values(got)

    def peek_each(self, digests: Iterable[bytes]) -> list[V | None]:
        """:meth:`get_each` that leaves the LRU order as it is: a bulk read's lookups
        (see :meth:`store.pieces.objects.ObjectStore.read_each`), which do not count as use."""
        return _values(list(map(self._found.get, digests)))

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
        self.cache._put(self.id, self._found, ((digest, value, cost),))

    def put_many(self, items: Iterable[tuple[bytes, V, int]]) -> None:
        """:meth:`put` each ``(digest, value, cost)``, in order."""
        self.cache._put(self.id, self._found, items)

    def demote(self, digests: Iterable[bytes]) -> None:
        """Make these entries the first to go when room is needed (a tree node that a
        commit replaced: the head no longer holds it, though a diff may still read it)."""
        found, order = self._found, self.cache._order
        for d in digests:
            entry = found.get(d)
            if entry is not None:
                order.move_to_end(id(entry), last=False)

    def __contains__(self, digest: bytes) -> bool:
        return digest in self._found

    def clear(self) -> None:
        """Forget this space's entries (as in a freshly started process)."""
        self.cache._drop(self.id)


def _values(got: list[_Entry | None]) -> list[V | None]:
    """The values of looked-up entries, None where none was found."""
    if None not in got:  # all found (no tuple is equal to None)
        return list(map(_VALUE, got))  # type: ignore[arg-type]
    return [None if entry is None else entry[0] for entry in got]  # type: ignore[misc]
