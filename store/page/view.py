"""Reading a page's contents: point reads, values and range queries over one state.

This module owns the read side shared by a page's live state, its snapshots and
transactions: a tree root plus an optional *overlay* of not-yet-committed
changes (the implicit journal, or a transaction's own writes). It does not write.

Ranges
    ``start`` is inclusive, ``end`` exclusive, ``prefix`` narrows both. A
    continuation *token* is the key to resume from (opaque to callers): a page
    of results with ``limit`` set returns the token of the next page, or None.
    Paging reads the state current at each call; take a snapshot for a stable
    listing.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import gc
import operator
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Generic, NamedTuple, TypeVar

from ledgerd.store.errors import InvalidArgumentError, KeyNotFoundError, KeyTooLargeError, named
from ledgerd.store.pieces.digest import TOMBSTONE
from ledgerd.store.pieces.objects import ObjectStore
from ledgerd.store.tree import btree
from ledgerd.store.tree.btree import EMPTY, Entry, NodeStore, Priority, RawEntry, new_entry

KEY_LIMIT = 4096

T = TypeVar("T")


def live(e: Entry | None) -> Entry | None:
    """``e``, or None if it is absent or a tombstone (a delete kept for merges:
    :data:`store.pieces.digest.TOMBSTONE`). Every read goes through this."""
    return None if e is None or e.value == TOMBSTONE else e


_KEY, _VALUE, _PRIORITY = map(operator.itemgetter, range(3))
"""An entry's key, value digest and priority."""


def check_key(key: bytes) -> bytes:
    if type(key) is bytes and len(key) <= KEY_LIMIT:  # the common case, first
        return key
    if not isinstance(key, bytes | bytearray | memoryview):
        raise InvalidArgumentError(f"keys are bytes, not {type(key).__name__}")
    key = bytes(key)
    if len(key) > KEY_LIMIT:
        raise KeyTooLargeError(f"key of {len(key)} bytes is over the {KEY_LIMIT}-byte limit")
    return key


@dataclass(frozen=True, slots=True)
class Overlay:
    """Changes not in the tree yet: key -> entry (None = deleted), after an optional clear."""

    cleared: bool = False
    entries: Mapping[bytes, Entry | None] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return self.cleared or bool(self.entries)


NO_OVERLAY = Overlay()


class _KeyValueTuple(NamedTuple):
    key: bytes
    value: bytes
    priority: Priority


_PRIORITIES = (Priority.EAGER, Priority.LAZY)


class KeyValue(_KeyValueTuple):
    """An entry with its value, as a range query returns it.

    A tuple, like :class:`store.tree.btree.Entry`, so that a scan makes them at C speed;
    ``priority`` answers with the enum. (The garbage collector tracks them all the
    same, as every instance of a tuple subclass: see :func:`collector_paused`.)"""

    __slots__ = ()

    @property
    def priority(self) -> Priority:
        return _PRIORITIES[self[2]]


@contextlib.contextmanager
def collector_paused(young_every: float | None = None) -> Iterator[None]:
    """No automatic garbage collection while many objects that cannot form cycles are
    made: a scan's result, a big batch's changes. Made one by one, 100,000 tracked
    objects set off a full collection of the whole heap each time the heap grows by a
    quarter, six or more per scan, which took as long as the rest of the scan. After
    it, the collector runs as usual (nested pauses leave it off until the outer ends).

    With ``young_every`` (seconds; in a running event loop), the young generation is
    still collected that often meanwhile, on the loop. A big batch keeps what it made
    (its new tree's 250,000 entries, all tuples): left to the first collection after
    the pause, examining them held the loop for 100-170 ms in one go; a pass every
    ``young_every`` examines only what was made since the last one."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    timer: asyncio.TimerHandle | None = None
    if young_every is not None:
        loop, every = asyncio.get_running_loop(), young_every

        def young() -> None:
            nonlocal timer
            gc.collect(0)
            timer = loop.call_later(every, young)

        timer = loop.call_later(every, young)
    try:
        yield
    finally:
        if timer is not None:
            timer.cancel()
        gc.enable()


@dataclass(frozen=True, slots=True)
class RangeResult(Generic[T]):
    """One page of a range query; ``token`` continues it (None: nothing more)."""

    items: list[T]
    token: bytes | None


def bounds(
    start: bytes | None, end: bytes | None, prefix: bytes | None, token: bytes | None
) -> tuple[bytes, bytes | None]:
    lo = check_key(start) if start is not None else b""
    hi = check_key(end) if end is not None else None
    if prefix is not None:
        prefix = check_key(prefix)
        lo = max(lo, prefix)
        pe = btree.prefix_end(prefix)
        if pe is not None:
            hi = pe if hi is None else min(hi, pe)
    if token is not None:
        lo = max(lo, bytes(token))
    return lo, hi


class View(abc.ABC):
    """Reads over one (root, overlay) state. Subclasses say where the state comes from."""

    def __init__(self, objects: ObjectStore, nodes: NodeStore) -> None:
        self.objects = objects
        self.nodes = nodes

    @abc.abstractmethod
    def _state(self) -> tuple[bytes, Overlay]:
        """The tree root and the overlay reads see now."""

    async def get_entry(self, key: bytes) -> Entry | None:
        key = check_key(key)
        root, overlay = self._state()
        if key in overlay.entries:
            return live(overlay.entries[key])
        if overlay.cleared:
            return None
        return live(await btree.lookup(self.nodes, root, key))

    async def _entry(self, key: bytes) -> Entry:
        e = await self.get_entry(key)
        if e is None:
            raise KeyNotFoundError(f"key {named(key[:64])} is not in the page")
        return e

    async def contains(self, key: bytes) -> bool:
        return await self.get_entry(key) is not None

    async def get(self, key: bytes) -> bytes:
        """The whole value of ``key``; raises KeyNotFoundError. Use :meth:`read` for large ones."""
        return await self.objects.read_all((await self._entry(key)).value)

    async def size(self, key: bytes) -> int:
        return await self.objects.size((await self._entry(key)).value)

    async def read(
        self, key: bytes, offset: int = 0, length: int | None = None
    ) -> AsyncIterator[bytes]:
        """Stream ``length`` bytes of the value from ``offset`` (only the chunks covered)."""
        return await self.objects.read((await self._entry(key)).value, offset, length)

    async def get_range(self, key: bytes, offset: int, length: int) -> bytes:
        """A byte range of a value, in memory."""
        return b"".join([b async for b in await self.read(key, offset, length)])

    async def entry_runs(
        self,
        start: bytes | None = None,
        end: bytes | None = None,
        prefix: bytes | None = None,
        token: bytes | None = None,
    ) -> AsyncIterator[Sequence[RawEntry]]:
        """The live entries of a range in key order, in non-empty runs: a leaf's entries
        come as one slice (see :func:`store.tree.btree.runs`), merged with the overlay; as
        plain tuples (:data:`store.tree.btree.RawEntry`)."""
        lo, hi = bounds(start, end, prefix, token)
        root, overlay = self._state()
        if hi is not None and lo >= hi:
            return
        pending = sorted(
            (k, e) for k, e in overlay.entries.items() if k >= lo and (hi is None or k < hi)
        )
        i, n = 0, len(pending)
        if not overlay.cleared:
            async for run in btree.runs(self.nodes, root, lo, hi):
                if i < n and pending[i][0] <= run[-1][0]:
                    merged, i = _merged(run, pending, i)
                    if merged:
                        yield merged
                elif TOMBSTONE in map(_VALUE, run):  # rare: deletes kept for merges
                    kept = [e for e in run if e[1] != TOMBSTONE]
                    if kept:
                        yield kept
                else:
                    yield run
        rest = [e for e in map(live, [e for _, e in pending[i:]]) if e is not None]
        if rest:
            yield rest

    async def iter_entries(
        self,
        start: bytes | None = None,
        end: bytes | None = None,
        prefix: bytes | None = None,
        token: bytes | None = None,
    ) -> AsyncIterator[Entry]:
        """Entries in key order, streamed: only the nodes on the way are loaded."""
        async for run in self.entry_runs(start, end, prefix, token):
            for e in run:
                yield new_entry(e)

    async def _page(
        self,
        start: bytes | None,
        end: bytes | None,
        prefix: bytes | None,
        limit: int | None,
        token: bytes | None,
    ) -> tuple[list[RawEntry], bytes | None]:
        if limit is not None and limit < 1:
            raise InvalidArgumentError("limit must be at least 1")
        out: list[RawEntry] = []
        async for run in self.entry_runs(start, end, prefix, token):
            if limit is not None and len(out) + len(run) > limit:
                take = limit - len(out)
                out.extend(run[:take])
                return out, run[take][0]
            out.extend(run)
        return out, None

    async def entries(
        self,
        start: bytes | None = None,
        end: bytes | None = None,
        prefix: bytes | None = None,
        limit: int | None = None,
        token: bytes | None = None,
    ) -> RangeResult[KeyValue]:
        """Keys and values (in memory) over a range; see the module docs for paging."""
        found, nxt = await self._page(start, end, prefix, limit, token)
        if not found:
            return RangeResult([], nxt)
        values = await self.objects.read_each(list(map(_VALUE, found)))
        # Column by column, at C speed: no Python call per entry (and no zip(*found),
        # which makes an iterator per entry for the collector to count).
        columns = zip(map(_KEY, found), values, map(_PRIORITY, found), strict=True)
        made = map(tuple.__new__, repeat(KeyValue), columns)
        with collector_paused():
            items = list(made)
        return RangeResult(items, nxt)

    async def keys(
        self,
        start: bytes | None = None,
        end: bytes | None = None,
        prefix: bytes | None = None,
        limit: int | None = None,
        token: bytes | None = None,
    ) -> RangeResult[bytes]:
        found, nxt = await self._page(start, end, prefix, limit, token)
        return RangeResult([e[0] for e in found], nxt)


def _merged(
    run: Sequence[RawEntry], pending: list[tuple[bytes, Entry | None]], i: int
) -> tuple[list[RawEntry], int]:
    """The live entries of ``run`` merged with the overlay's ``pending[i:]`` up to the
    run's last key (an overlay entry wins over the tree's of its key), and the index in
    ``pending`` of the first overlay entry past the run."""
    n = len(pending)
    merged: list[RawEntry] = []
    for e in run:
        while i < n and pending[i][0] < e[0]:
            over = live(pending[i][1])
            if over is not None:
                merged.append(over)
            i += 1
        if i < n and pending[i][0] == e[0]:
            over = live(pending[i][1])
            i += 1
            if over is not None:
                merged.append(over)
        elif e[1] != TOMBSTONE:
            merged.append(e)
    return merged, i


class TreeView(View):
    """A fixed tree (a snapshot at a commit)."""

    def __init__(self, objects: ObjectStore, nodes: NodeStore, root: bytes = EMPTY) -> None:
        super().__init__(objects, nodes)
        self.root = root

    def _state(self) -> tuple[bytes, Overlay]:
        return self.root, NO_OVERLAY
