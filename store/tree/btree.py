"""The page tree: a history-independent Merkle search tree of entries.

This module owns tree entries and nodes (their encoding, levels and digests) and the
reads over them: lookup, ordered range iteration, and two-way diffs. It reads nodes
through a :class:`NodeStore`; it knows nothing of commits, journals or SQLite. Batch
updates are :mod:`store.tree.builder`'s, a node's column checks :mod:`store.tree.nodecheck`'s,
three-way diffs :mod:`store.tree.diff3`'s.

Shape
    Every key has a *level*: the number of trailing zero 6-bit groups of
    ``xxh3_64(key)`` (so about one key in 64 reaches level 1, one in 4096 level
    2, ...). The tree over a set of entries is defined, not built:

    * the root is a node at the highest level present, whose *separators* are the
      entries of that level, in key order;
    * between (and around) the separators of a level-``L`` node sit ``L-1``
      subtrees over the key ranges they delimit: ``n`` separators, ``n + 1``
      children. A child over an empty range is the empty digest ``b""``; a child
      over a range with no level-``L-1`` key is a node with no separators and one
      child;
    * level-0 nodes have no children.

    The same entries therefore give the same nodes and the same root digest on
    every device, whatever the order of insertion. With 6 bits per level a
    100,000-entry page is three levels deep, so a one-entry change rewrites three
    nodes.

Nodes are objects of kind TREE: a node encoding of at most 64 KiB is one chunk
(inline when at most ``TREE_INLINE_LIMIT``, 32 bytes), a larger one is split like any
value. A node a batch rewrote from a stored one is stored as a delta against it
(:mod:`store.pieces.delta`); reads get it whole. A leaf carries its values of up to
``INLINE_LIMIT`` (128 bytes) in their digests.
"""

from __future__ import annotations

import asyncio
import bisect
import enum
import functools
import operator
from array import array
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Iterable,
    Iterator,
)
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import msgpack
import xxhash

from ledgerd.store.errors import CorruptObjectError
from ledgerd.store.pieces import digest as dg
from ledgerd.store.pieces import split
from ledgerd.store.pieces.cache import ENTRY_OVERHEAD, Cache, CacheSpace
from ledgerd.store.tree.nodecheck import check_digests, check_entries

LEVEL_BITS = 6
MAX_LEVEL = 10
EMPTY = b""
"""Digest of the empty tree (and of an empty child)."""


class Priority(enum.IntEnum):
    """EAGER values are synced to every device; LAZY ones are fetched on first read."""

    EAGER = 0
    LAZY = 1


class _EntryTuple(NamedTuple):
    key: bytes
    value: bytes
    priority: Priority = Priority.EAGER
    dot: bytes = b""


_PRIORITIES = (Priority.EAGER, Priority.LAZY)

DOT_SIZE = 16
"""Bytes of a dot: the write's clock time (8, big endian, microseconds) and the
writer's tag (8): see :mod:`store.tree.dots`."""

Version = tuple[bytes, int, bytes]
"""One version of a key: its value digest, priority and dot."""


class Entry(_EntryTuple):
    """One entry of a page: a key, the root digest of its value, its priority, the
    *dot* of the write that made it (:mod:`store.tree.dots`), and, after the four fields,
    optionally a fifth: the key's other *siblings* (concurrent writes no write has
    superseded yet), as :data:`Version` tuples, largest dot first, all below ``dot``.

    ``value``, ``priority`` and ``dot`` are the *winner*, the sibling with the largest
    dot: what reads see. An entry being staged (not in a tree yet) has no dot.

    A tuple, so that msgpack encodes a node's entries at C speed, and decoding
    makes them at C speed too: a decoded entry holds its priority as the plain
    int 0 or 1 (equal to, and hashing like, EAGER or LAZY), and ``priority``
    always answers with the enum.
    """

    __slots__ = ()

    @property
    def priority(self) -> Priority:
        return _PRIORITIES[self[2]]

    @property
    def siblings(self) -> tuple[Version, ...]:
        """The losing concurrent versions (empty for nearly every entry)."""
        return self[4] if len(self) > 4 else ()

    def __repr__(self) -> str:
        more = f", siblings={self[4]!r}" if len(self) > 4 else ""
        return (
            f"Entry(key={self[0]!r}, value={self[1]!r}, priority={self[2]!r}, "
            f"dot={self[3] if len(self) > 3 else b''!r}{more})"
        )


new_entry = functools.partial(tuple.__new__, Entry)
"""An Entry from a ``(key, value digest, priority[, dot[, siblings]])`` tuple, without
the Python-level ``__new__`` of a named tuple (for batches: one per entry)."""

RawEntry = tuple[bytes, bytes, int, bytes] | tuple[bytes, bytes, int, bytes, tuple[Version, ...]]
"""An entry as a node holds it: a plain ``(key, value digest, priority, dot)`` tuple,
with a fifth element, its siblings, only when it has any.

Nodes keep plain tuples, not :class:`Entry` objects: the garbage collector stops
tracking a plain tuple of bytes and ints the first time it sees one, but tracks an
instance of a tuple subclass for as long as it lives. A node cache of 64 MiB holds
a few hundred thousand entries; as Entry objects, every full collection walked
them all (a cold read of a 100,000-entry page spent a fifth of its time in the
collector, a scan more). Entries leave this module as :class:`Entry` objects
(:func:`lookup`, :func:`iterate`, diffs); code reading nodes directly indexes them.
"""


def versions_of(entries: Iterable[RawEntry | Entry]) -> Iterator[Version]:
    """Every version the entries hold: each one's winner, then its siblings."""
    for e in entries:
        yield (e[1], e[2], e[3])
        if len(e) > 4:
            yield from e[4]


def values_of(entries: Iterable[RawEntry | Entry]) -> Iterator[bytes]:
    """The value digests the entries reference, siblings' included."""
    for e in entries:
        yield e[1]
        if len(e) > 4:
            for v in e[4]:
                yield v[0]


def raw(e: Entry | RawEntry) -> RawEntry:
    """``e`` as the plain tuple a node holds (its priority a plain int)."""
    if len(e) > 4:
        return (e[0], e[1], int(e[2]), e[3], e[4])
    return (e[0], e[1], int(e[2]), e[3])


_KEY = operator.itemgetter(0)
_packer = msgpack.Packer(use_bin_type=True)


@dataclass(frozen=True, slots=True)
class Node:
    level: int
    entries: tuple[RawEntry, ...]
    children: tuple[bytes, ...]  # len(entries) + 1 at level > 0, empty at level 0
    # A leaf made by a Builder keeps its encoding and each entry's size in it, so that
    # the next batch that changes a few of its entries splices the new ones between
    # unchanged runs of these bytes instead of encoding every entry again. Decoded
    # nodes have neither (a read does not pay for them).
    encoded: bytes | None = field(default=None, compare=False, repr=False)
    sizes: array[int] | None = field(default=None, compare=False, repr=False)

    def is_empty(self) -> bool:
        return not self.entries and (self.level == 0 or self.children[0] == EMPTY)


def key_level(key: bytes) -> int:
    """The level of ``key`` in every tree: zero 6-bit groups at the bottom of its hash."""
    return split.zero_groups(xxhash.xxh3_64_intdigest(key), LEVEL_BITS, MAX_LEVEL)


def key_levels(keys: Iterable[bytes]) -> list[int]:
    """:func:`key_level` of each key, for a batch: the hashes made by one ``map`` over
    the C function, and the 63 keys in 64 of level 0 told by one test, without a
    Python call per key (the levels of a thousand keys were a tenth of a batch's tree
    work)."""
    zero_groups, low = split.zero_groups, (1 << LEVEL_BITS) - 1
    return [
        zero_groups(h, LEVEL_BITS, MAX_LEVEL) if not h & low else 0
        for h in map(xxhash.xxh3_64_intdigest, keys)
    ]


def encode_node(node: Node) -> bytes:
    """``[level, [[key, value digest, priority, dot(, siblings)], ...], [child digest or
    b"", ...]]``."""
    return _packer.pack((node.level, node.entries, node.children))  # type: ignore[no-any-return]


def decode_node(data: bytes) -> Node:
    """The node encoded in ``data``, checked; every check runs over whole columns
    (``map``, ``set``, ``join``) rather than entry by entry, so that reading a node
    costs little more than msgpack's own decoding."""
    try:
        level, raw, children = msgpack.unpackb(data, raw=False, use_list=False)
        if type(level) is not int or type(raw) is not tuple or type(children) is not tuple:
            raise TypeError("a node is [level, entries, children]")
        if raw:
            check_entries(raw, DOT_SIZE)
        if children:
            check_digests([c for c in children if c])
        node = Node(level, raw, children)
    except (ValueError, TypeError, IndexError) as e:
        raise CorruptObjectError(f"undecodable tree node: {e}") from e
    except Exception as e:  # msgpack's own exception types
        raise CorruptObjectError(f"undecodable tree node: {e}") from e
    n = len(node.entries)
    if node.level < 0 or len(node.children) != (n + 1 if node.level else 0):
        raise CorruptObjectError("tree node has a malformed shape")
    return node


def node_pieces(data: bytes) -> tuple[bytes, list[split.Piece]]:
    """Digest and storable pieces of an encoded node."""
    if len(data) <= split.MAX_CHUNK:
        d = dg.chunk_digest(dg.Kind.TREE, data)
        return d, ([] if dg.is_inline(d) else [split.Piece(d, data)])
    pieces, root = split.split_bytes(data, dg.Kind.TREE)
    return root.digest, pieces


class NodeReader(Protocol):
    async def read_node_bytes(self, digest: bytes) -> bytes: ...


class NodeLoader(Protocol):
    async def load(self, digest: bytes) -> Node: ...


def node_cost(node: Node, encoded_size: int) -> int:
    """Estimated bytes a decoded node holds in memory: its encoding's bytes plus, per
    entry, a tuple and two bytes objects' headers, and per child a bytes object; and
    the encoding and sizes a leaf made by a Builder keeps."""
    kept = 0 if node.encoded is None else len(node.encoded) + 4 * len(node.entries)
    return ENTRY_OVERHEAD + encoded_size + kept + 145 * len(node.entries) + 80 * len(node.children)


class NodeStore:
    """Loads nodes, keeping decoded ones in a cache (:mod:`store.pieces.cache`; a node is
    named by its digest, so a cached one is never stale and is checked once, when
    decoded)."""

    def __init__(self, reader: NodeReader, cache: CacheSpace[Node] | None = None) -> None:
        self.reader = reader
        self.cache: CacheSpace[Node] = cache if cache is not None else Cache().space()

    async def load(self, digest: bytes) -> Node:
        node = self.cache.get(digest)
        if node is not None:
            return node
        if dg.is_inline(digest):
            data = dg.inline_content(digest)
        else:
            data = await self.reader.read_node_bytes(digest)
        node = decode_node(data)
        self.remember(digest, node, len(data))
        return node

    def remember(self, digest: bytes, node: Node, encoded_size: int) -> None:
        self.cache.put(digest, node, node_cost(node, encoded_size))

    def clear_cache(self) -> None:
        """Forget every decoded node (as in a freshly started process)."""
        self.cache.clear()


# -- reading ------------------------------------------------------------------


async def lookup(nodes: NodeLoader, root: bytes, key: bytes) -> Entry | None:
    d = root
    cached = nodes.cache.get if isinstance(nodes, NodeStore) else None
    while d:
        node = (cached and cached(d)) or await nodes.load(d)
        entries = node.entries
        i = bisect.bisect_left(entries, key, key=_KEY)
        if i < len(entries) and entries[i][0] == key:
            return new_entry(entries[i])
        if node.level == 0:
            return None
        d = node.children[i]
    return None


async def runs(
    nodes: NodeLoader, root: bytes, start: bytes = b"", end: bytes | None = None
) -> AsyncIterator[tuple[RawEntry, ...]]:
    """The entries with ``start <= key < end`` in key order, as runs: a leaf's entries
    in the range come as one slice of the node (no object per entry, plain tuples: see
    :data:`RawEntry`), a separator as a run of one. Only the nodes needed are loaded."""
    # Explicit stack of pending work: a node's digest (bytes) or a run (a tuple).
    stack: list[bytes | tuple[RawEntry, ...]] = [root] if root else []
    load = nodes.load
    while stack:
        item = stack.pop()
        if type(item) is tuple:
            yield item
            continue
        assert type(item) is bytes
        node = await load(item)
        entries = node.entries
        lo = bisect.bisect_left(entries, start, key=_KEY) if start else 0
        hi = len(entries) if end is None else bisect.bisect_left(entries, end, key=_KEY)
        if node.level == 0:
            if lo < hi:
                yield entries[lo:hi]
            continue
        # children[lo] holds keys between entries[lo-1] and entries[lo] (may include
        # start); children[hi] may hold keys below end.
        children = node.children
        work: list[bytes | tuple[RawEntry, ...]] = []
        for i in range(lo, hi + 1):
            if children[i]:
                work.append(children[i])
            if i < hi:
                work.append(entries[i : i + 1])
        stack.extend(reversed(work))


async def iterate(
    nodes: NodeLoader, root: bytes, start: bytes = b"", end: bytes | None = None
) -> AsyncIterator[Entry]:
    """Entries with ``start <= key < end`` in key order, loading only the nodes needed."""
    async for run in runs(nodes, root, start, end):
        for e in run:
            yield new_entry(e)


def prefix_end(prefix: bytes) -> bytes | None:
    """The smallest key greater than every key starting with ``prefix`` (None: no bound)."""
    p = bytearray(prefix)
    while p and p[-1] == 0xFF:
        p.pop()
    if not p:
        return None
    p[-1] += 1
    return bytes(p)


# -- diff ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Change:
    """A key whose entry differs: ``old``/``new`` is None where the key is absent."""

    key: bytes
    old: Entry | None
    new: Entry | None


class _Cursor:
    """Walks a tree in key order, yielding whole subtrees so equal ones can be skipped."""

    def __init__(self, nodes: NodeLoader, root: bytes, start: bytes = b"") -> None:
        self.nodes = nodes
        # Items in reverse order: (digest, level, None) for a subtree, (b"", -1, entry).
        self.stack: list[tuple[bytes, int, RawEntry | None]] = []
        self.root = root
        self.lower = start  # entries, and subtrees wholly, below it are left out

    async def start(self) -> None:
        if self.root:
            node = await self.nodes.load(self.root)
            self.stack.append((self.root, node.level, None))

    def peek(self) -> tuple[bytes, int, RawEntry | None] | None:
        return self.stack[-1] if self.stack else None

    async def expand(self) -> None:
        d, _, _ = self.stack.pop()
        node = await self.nodes.load(d)
        items: list[tuple[bytes, int, RawEntry | None]] = []
        # Entries below start, and the children before them, are left out: the same
        # on both sides of a diff, since it depends on the keys alone.
        first = bisect.bisect_left(node.entries, self.lower, key=_KEY) if self.lower else 0
        for i in range(first, len(node.entries)):
            e = node.entries[i]
            if node.level > 0 and node.children[i]:
                items.append((node.children[i], node.level - 1, None))
            items.append((EMPTY, -1, e))
        if node.level > 0 and node.children[-1]:
            items.append((node.children[-1], node.level - 1, None))
        self.stack.extend(reversed(items))


_END: tuple[bytes, int, RawEntry | None] = (EMPTY, -2, None)
"""The front of a :class:`_Cursor` that has nothing left."""

DIFF_TURN_NODES = 16
"""Nodes a diff opens between two turns it gives the event loop (about a thousand
entries): loading cached nodes never yields, so a diff of a whole large page (a
first catch-up, an import, a changes feed from the start) held the loop for as
long as it ran, 0.7 s for 200,000 entries."""


async def diff(
    nodes: NodeLoader, old: bytes, new: bytes, start: bytes = b""
) -> AsyncGenerator[Change, None]:
    """Changes from tree ``old`` to tree ``new`` in key order, of keys from ``start`` on.

    Subtrees with equal digests on both sides are skipped unopened, so the cost
    grows with the size of the change, not of the page. Every ``DIFF_TURN_NODES``
    nodes it opens, it lets the event loop run other tasks.
    """
    if old == new:
        return
    a, b = _Cursor(nodes, old, start), _Cursor(nodes, new, start)
    await a.start()
    await b.start()
    opened = 0
    # Each front is (digest, level, None) for a subtree, (b"", -1, entry) for an entry,
    # or _END for an exhausted side.
    while True:
        if opened >= DIFF_TURN_NODES:
            opened = 0
            await asyncio.sleep(0)
        x = a.stack[-1] if a.stack else _END
        y = b.stack[-1] if b.stack else _END
        xl, yl = x[1], y[1]
        if xl >= 0:  # a subtree: skip it with an equal one, else open the taller
            if x[0] == y[0]:
                a.stack.pop()
                b.stack.pop()
            elif xl >= yl:
                await a.expand()
                opened += 1
            else:
                await b.expand()
                opened += 1
        elif yl >= 0:
            await b.expand()
            opened += 1
        elif xl == yl == -2:
            return
        else:  # two entries, or an entry and an exhausted side
            ex, ey = x[2], y[2]
            if ey is None or (ex is not None and ex[0] < ey[0]):
                assert ex is not None
                a.stack.pop()
                yield Change(ex[0], new_entry(ex), None)
            elif ex is None or ey[0] < ex[0]:
                b.stack.pop()
                yield Change(ey[0], None, new_entry(ey))
            else:
                a.stack.pop()
                b.stack.pop()
                if ex != ey:
                    yield Change(ex[0], new_entry(ex), new_entry(ey))
