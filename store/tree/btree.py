"""The page tree: a history-independent Merkle search tree of entries.

This module owns tree nodes (their encoding, levels and digests) and the
algorithms over them: lookup, batch update, ordered range iteration, and two-
and three-way diffs. It reads and writes nodes through a :class:`NodeStore`; it
knows nothing of commits, journals or SQLite.

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
(inline when at most 32 bytes), a larger one is split like any value.
"""

from __future__ import annotations

import asyncio
import bisect
import enum
import functools
import itertools
import operator
from array import array
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Iterable,
    Iterator,
    Sequence,
)
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import msgpack
import xxhash

from ledgerd.store.errors import CorruptObjectError
from ledgerd.store.pieces import digest as dg
from ledgerd.store.pieces import split
from ledgerd.store.pieces.cache import ENTRY_OVERHEAD, Cache, CacheSpace

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
            # Four columns of equal length (entries with siblings apart), or zip or the
            # unpacking raises; an entry that is not an array fails the columns' type
            # checks below.
            plain = raw if set(map(len, raw)) == {4} else _with_siblings(raw)
            keys, values, priorities, dots = zip(*plain, strict=True)
            if set(map(type, priorities)) != {int} or not set(priorities) <= {0, 1}:
                raise TypeError("priorities are 0 or 1")
            # msgpack makes bytes of bin and nothing else: joining them is the check
            # that every key is bytes (anything else raises TypeError), at C speed.
            b"".join(keys)
            if set(map(len, dots)) != {DOT_SIZE} or len(b"".join(dots)) != DOT_SIZE * len(dots):
                raise TypeError(f"a dot is {DOT_SIZE} bytes")
            _validate_digests(values)
        if children:
            _validate_digests([c for c in children if c])
        node = Node(level, raw, children)
    except (ValueError, TypeError, IndexError) as e:
        raise CorruptObjectError(f"undecodable tree node: {e}") from e
    except Exception as e:  # msgpack's own exception types
        raise CorruptObjectError(f"undecodable tree node: {e}") from e
    n = len(node.entries)
    if node.level < 0 or len(node.children) != (n + 1 if node.level else 0):
        raise CorruptObjectError("tree node has a malformed shape")
    return node


def _with_siblings(raw: tuple[tuple[object, ...], ...]) -> list[tuple[object, ...]]:
    """The first four fields of each entry, after checking the siblings of those that
    have a fifth: a non-empty tuple of ``(value, priority, dot)`` versions, dots
    strictly decreasing and all below the entry's own (the winner is the largest)."""
    out: list[tuple[object, ...]] = []
    for e in raw:
        if len(e) == 5:
            siblings, dot = e[4], e[3]
            if type(siblings) is not tuple or not siblings or type(dot) is not bytes:
                raise TypeError("siblings are a non-empty array")
            last = dot
            for v in siblings:
                if type(v) is not tuple or len(v) != 3:
                    raise TypeError("a sibling is [value, priority, dot]")
                value, prio, vdot = v
                if type(prio) is not int or prio not in (0, 1):
                    raise TypeError("priorities are 0 or 1")
                if type(vdot) is not bytes or len(vdot) != DOT_SIZE or not vdot < last:
                    raise TypeError("siblings' dots decrease, below the entry's own")
                if type(value) is not bytes:
                    raise TypeError("a sibling's value is a digest")
                dg.validate(value)
                last = vdot
            out.append(e[:4])
        elif len(e) == 4:
            out.append(e)
        else:
            raise TypeError("an entry is [key, value, priority, dot(, siblings)]")
    return out


_HASHED = 1 + dg.HASH_SIZE
_HASHED_TYPES = frozenset(t for t in range(256) if dg.is_valid_hashed_type(t))


def _validate_digests(digests: Sequence[bytes]) -> None:
    """Raise TypeError unless every one is bytes, and InvalidDigestError unless every
    one is a well-formed digest (all hashed ones: at C speed)."""
    # The join raises TypeError unless every one is bytes-like, and msgpack makes
    # bytes and never bytearray or memoryview.
    joined = b"".join(digests)
    if set(map(len, digests)) == {_HASHED} and set(joined[::_HASHED]) <= _HASHED_TYPES:
        return
    for d in digests:
        dg.validate(d)


_LEAF_TAIL = _packer.pack(())  # a leaf's children: none


@functools.lru_cache(maxsize=1024)
def _leaf_head(n: int) -> bytes:
    """The bytes a leaf of ``n`` entries starts with: ``[0, [`` and the entries' count."""
    head: bytes = _packer.pack_array_header(3) + _packer.pack(0) + _packer.pack_array_header(n)
    return head


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
        self._remember(digest, node, len(data))
        return node

    def _remember(self, digest: bytes, node: Node, encoded_size: int) -> None:
        self.cache.put(digest, node, node_cost(node, encoded_size))

    def clear_cache(self) -> None:
        """Forget every decoded node (as in a freshly started process)."""
        self.cache.clear()


class Builder:
    """One batch of changes: new nodes are kept here until the caller stores them."""

    def __init__(self, nodes: NodeStore) -> None:
        self.nodes = nodes
        self.new: dict[bytes, tuple[Node, list[split.Piece]]] = {}
        self.replaced: list[bytes] = []
        """Nodes this batch rewrote (see :meth:`pieces_reachable`)."""

    async def load(self, digest: bytes) -> Node:
        got = self.new.get(digest)
        return got[0] if got is not None else await self.nodes.load(digest)

    def make(self, level: int, entries: Sequence[RawEntry], children: list[bytes]) -> bytes:
        if level == 0:
            if not entries:
                return EMPTY
            # Entry by entry (msgpack's encoding of a whole is its parts' encodings one
            # after the other), so that the leaf knows where each entry lies in it.
            packed = list(map(_packer.pack, entries))
            parts = [_leaf_head(len(entries)), *packed, _LEAF_TAIL]
            sizes = array("I", map(len, packed))
            return self._add(Node(0, tuple(entries), (), b"".join(parts), sizes))
        node = Node(level, tuple(entries), tuple(children))
        if node.is_empty():
            return EMPTY
        return self._add(node)

    def _add(self, node: Node) -> bytes:
        encoded = node.encoded if node.encoded is not None else encode_node(node)
        d, pieces = node_pieces(encoded)
        if d not in self.new:
            self.new[d] = (node, pieces)
        return d

    def _splice(self, node: Node, items: list[tuple[bytes, int, RawEntry | None]]) -> bytes:
        """The leaf ``node`` with ``items`` applied, made from runs of its own encoding
        and the new entries' encodings (it must have its encoding and sizes)."""
        assert node.encoded is not None and node.sizes is not None
        old, encoded, sizes = node.entries, node.encoded, node.sizes
        view = memoryview(encoded)
        n = len(old)
        runs: list[tuple[RawEntry, ...]] = []
        parts: list[bytes | memoryview] = []
        new_sizes = array("I")
        at = 0  # the first entry of old not yet taken or skipped
        pos = len(_leaf_head(n))  # where it starts in encoded
        for key, _, new in items:
            i = bisect.bisect_left(old, key, at, key=_KEY)
            if i > at:  # the unchanged run before key
                run = sizes[at:i]
                end = pos + sum(run)
                runs.append(old[at:i])
                parts.append(view[pos:end])
                new_sizes.extend(run)
                at, pos = i, end
            if new is not None:
                packed = _packer.pack(new)
                runs.append((new,))
                parts.append(packed)
                new_sizes.append(len(packed))
            if i < n and old[i][0] == key:  # replaced or deleted: skip the old one
                pos += sizes[i]
                at = i + 1
        if at < n:
            runs.append(old[at:])
            parts.append(view[pos : len(encoded) - len(_LEAF_TAIL)])
            new_sizes.extend(sizes[at:])
        entries = tuple(itertools.chain.from_iterable(runs))
        if not entries:
            return EMPTY
        data = b"".join([_leaf_head(len(entries)), *parts, _LEAF_TAIL])
        return self._add(Node(0, entries, (), data, new_sizes))

    def pieces_reachable(self, root: bytes) -> list[split.Piece]:
        """Pieces of the new nodes reachable from ``root`` (drops intermediate ones),
        which are kept in the node cache, where the nodes they replace become the first
        to go: else, once a load's old versions filled it, the nodes it evicted were
        the live leaves that the last commits did not touch, read back and encoded
        whole by the next."""
        out: list[split.Piece] = []
        stack = [root]
        seen: set[bytes] = set()
        while stack:
            d = stack.pop()
            if d in seen or d not in self.new:
                continue
            seen.add(d)
            node, pieces = self.new[d]
            out.extend(pieces)
            stack.extend(c for c in node.children if c)
        self.nodes.cache.demote(d for d in self.replaced if d not in seen)
        for d in seen:
            node, pieces = self.new[d]
            self.nodes._remember(d, node, sum(len(p.data) for p in pieces) or dg.INLINE_LIMIT)
        return out

    # -- update ----------------------------------------------------------------

    async def apply(
        self, root: bytes, changes: Iterable[tuple[bytes, Entry | RawEntry | None]]
    ) -> bytes:
        """New root after applying ``changes`` (key -> entry to put, or None to delete).

        The last change to a key wins. Only nodes on changed paths are rewritten.
        """
        batch: dict[bytes, RawEntry | None] = {  # plain tuples of bytes and ints: see RawEntry
            key: None if e is None else raw(e) for key, e in changes
        }
        if not batch:
            return root
        # The keys sorted alone (list.sort compares bytes directly, not tuples).
        keys = sorted(batch)
        items = list(zip(keys, key_levels(keys), map(batch.__getitem__, keys), strict=True))
        level = (await self.load(root)).level if root else -1
        top = max([level] + [lvl for _, lvl, e in items if e is not None])
        if top < 0:
            return EMPTY  # deletes on an empty tree
        d = root
        if root:  # grow: wrap the root in separator-less nodes up to the new top level
            for lvl in range(level + 1, top + 1):
                d = self.make(lvl, [], [d])
        d = await self._update(d, top, items)
        # The root sits at the highest level present: drop separator-less tops.
        while d:
            node = await self.load(d)
            if node.entries or node.level == 0:
                break
            d = node.children[0]
        return d

    async def _update(
        self, d: bytes, level: int, items: list[tuple[bytes, int, RawEntry | None]]
    ) -> bytes:
        if not items:
            return d
        if d:
            node = await self.load(d)
            if node.level != level:
                raise CorruptObjectError(f"tree node at level {node.level}, expected {level}")
            self.replaced.append(d)
            if node.sizes is not None:  # a leaf this process made: splice it
                return self._splice(node, items)
            entries = list(node.entries)
            children = list(node.children)
        else:
            entries, children = [], ([EMPTY] if level > 0 else [])
        if level > 0:  # most keys belong lower: split them off in one pass
            lower = [item for item in items if item[1] < level]
            items = [item for item in items if item[1] >= level]
        else:
            lower = []
        for key, _, new in items:
            i = bisect.bisect_left(entries, key, key=_KEY)
            present = i < len(entries) and entries[i][0] == key
            if present and new is not None:
                entries[i] = new
            elif present:
                del entries[i]
                if level > 0:
                    children[i : i + 2] = [
                        await self._merge(children[i], children[i + 1], level - 1)
                    ]
            elif new is not None:
                entries.insert(i, new)
                if level > 0:
                    children[i : i + 1] = list(await self._split(children[i], level - 1, key))
        if level > 0 and lower:
            start = 0
            for i in range(len(children)):
                if i < len(entries):
                    end = bisect.bisect_left(lower, entries[i][0], start, key=_KEY)
                else:
                    end = len(lower)
                if end > start:
                    children[i] = await self._update(children[i], level - 1, lower[start:end])
                start = end
        return self.make(level, entries, children)

    async def _split(self, d: bytes, level: int, key: bytes) -> tuple[bytes, bytes]:
        """Split a subtree into the parts below and above ``key`` (which it lacks)."""
        if not d:
            return EMPTY, EMPTY
        node = await self.load(d)
        i = bisect.bisect_left(node.entries, key, key=_KEY)
        if level == 0:
            return (
                self.make(0, list(node.entries[:i]), []),
                self.make(0, list(node.entries[i:]), []),
            )
        lo, hi = await self._split(node.children[i], level - 1, key)
        left = self.make(level, list(node.entries[:i]), [*node.children[:i], lo])
        right = self.make(level, list(node.entries[i:]), [hi, *node.children[i + 1 :]])
        return left, right

    async def _merge(self, a: bytes, b: bytes, level: int) -> bytes:
        """Join two adjacent subtrees of the same level (all keys of ``a`` < keys of ``b``)."""
        if not a:
            return b
        if not b:
            return a
        na, nb = await self.load(a), await self.load(b)
        entries = [*na.entries, *nb.entries]
        if level == 0:
            return self.make(0, entries, [])
        mid = await self._merge(na.children[-1], nb.children[0], level - 1)
        return self.make(level, entries, [*na.children[:-1], mid, *nb.children[1:]])


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
    while True:
        if opened >= DIFF_TURN_NODES:
            opened = 0
            await asyncio.sleep(0)
        x, y = a.peek(), b.peek()
        if x is None and y is None:
            return
        if x is not None and y is not None and x[2] is None and y[2] is None and x[0] == y[0]:
            a.stack.pop()
            b.stack.pop()
            continue
        if x is not None and x[2] is None and (y is None or y[2] is not None or x[1] >= y[1]):
            await a.expand()
            opened += 1
            continue
        if y is not None and y[2] is None:
            await b.expand()
            opened += 1
            continue
        # Both fronts are entries (or one side is exhausted).
        ex = x[2] if x is not None else None
        ey = y[2] if y is not None else None
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


@dataclass(frozen=True, slots=True)
class Change3:
    """A key changed on at least one side of a three-way diff."""

    key: bytes
    base: Entry | None
    left: Entry | None
    right: Entry | None


async def diff3(
    nodes: NodeLoader, base: bytes, left: bytes, right: bytes
) -> AsyncIterator[Change3]:
    """Keys changed base→left or base→right, in key order, with all three entries."""
    lefts = [c async for c in diff(nodes, base, left)]
    rights = [c async for c in diff(nodes, base, right)]
    for c in join3(lefts, rights):
        yield c


def join3(lefts: Sequence[Change], rights: Sequence[Change]) -> list[Change3]:
    """Two diffs from one base (each in key order) as three-way changes."""
    out: list[Change3] = []
    i = j = 0
    while i < len(lefts) or j < len(rights):
        if j == len(rights) or (i < len(lefts) and lefts[i].key < rights[j].key):
            c = lefts[i]
            out.append(Change3(c.key, c.old, c.new, c.old))
            i += 1
        elif i == len(lefts) or rights[j].key < lefts[i].key:
            c = rights[j]
            out.append(Change3(c.key, c.old, c.old, c.new))
            j += 1
        else:
            out.append(Change3(lefts[i].key, lefts[i].old, lefts[i].new, rights[j].new))
            i += 1
            j += 1
    return out
