"""Batch updates of the page tree (:mod:`store.tree.btree`): the :class:`Builder`.

This module owns turning a batch of changes into new nodes: it rewrites only the nodes
on changed paths, splicing a leaf it made from runs of its own encoding, and keeps the
new nodes until the caller stores them, with the delta of each node it rewrote from a
stored one (:mod:`store.pieces.delta`: the runs it kept, as it splices a leaf, else
found by :func:`_diff`). A large batch is built a slice at a time, the event loop given
a turn between slices (:data:`SLICE_ENTRIES`). Node shapes, encodings and reads live in
:mod:`store.tree.btree`.
"""

from __future__ import annotations

import asyncio
import bisect
import functools
import itertools
import operator
from array import array
from collections.abc import Iterable, Mapping, Sequence

import msgpack

from ledgerd.store.errors import CorruptObjectError
from ledgerd.store.pieces import delta as deltas
from ledgerd.store.pieces import digest as dg
from ledgerd.store.pieces import split
from ledgerd.store.tree.btree import (
    EMPTY,
    Entry,
    Node,
    NodeStore,
    RawEntry,
    encode_node,
    key_levels,
    node_pieces,
    raw,
)

_KEY = operator.itemgetter(0)
_packer = msgpack.Packer(use_bin_type=True)

_LEAF_TAIL = _packer.pack(())  # a leaf's children: none

SLICE_ENTRIES = 4096
"""Entries a :class:`Builder` takes in (sorting, encoding) between turns it gives the
event loop: a batch of 70,000 small values built in one go held the loop for
hundreds of milliseconds. A batch is built alone (the commit lock is held) and its
nodes are the builder's own until stored, so the turns change nothing it makes, and
a reader meanwhile sees the head it started from."""

MERGE_RUNS = 8
"""Sorted runs of keys one call merges while a big batch's keys are sorted in slices."""


@functools.lru_cache(maxsize=1024)
def _leaf_head(n: int) -> bytes:
    """The bytes a leaf of ``n`` entries starts with: ``[0, [`` and the entries' count."""
    head: bytes = _packer.pack_array_header(3) + _packer.pack(0) + _packer.pack_array_header(n)
    return head


def _leaf_parts(entries: Sequence[RawEntry]) -> list[bytes]:
    """A leaf's encoding in parts: its head, each entry, its tail (msgpack's encoding of
    a whole is its parts' encodings one after the other)."""
    return [_leaf_head(len(entries)), *map(_packer.pack, entries), _LEAF_TAIL]


def _parts(node: Node) -> list[bytes]:
    """``node``'s encoding in parts: its head, each entry, its children's head, each child
    (a leaf's children: its tail). Their concatenation is :func:`encode_node`'s."""
    if node.level == 0:
        return _leaf_parts(node.entries)
    packed = list(map(_packer.pack, node.entries))
    head = _packer.pack_array_header(3) + _packer.pack(node.level)
    return [
        head + _packer.pack_array_header(len(packed)),
        *packed,
        _packer.pack_array_header(len(node.children)),
        *map(_packer.pack, node.children),
    ]


def _deltable(d: bytes, data: bytes, base: bytes) -> bool:
    """Whether node ``d`` (encoded ``data``) may be stored as a delta against node
    ``base``: both are pieces of their own (not inline, not split), and differ."""
    one_piece = dg.TREE_INLINE_LIMIT < len(data) <= split.MAX_CHUNK
    return d != base and one_piece and not dg.is_inline(base) and not dg.is_index(base)


def _diff(old: list[bytes], new: list[bytes]) -> list[deltas.Op]:
    """The runs that make the parts ``new`` from the concatenation of ``old``: each part
    found among the old ones is copied from there (equal bytes, wherever they lie, are
    the same bytes), the others are bytes of their own. Entries are in key order and
    children follow them, so a node's unchanged parts come as long copies."""
    at: dict[bytes, int] = {}
    pos = 0
    for part in old:
        at.setdefault(part, pos)
        pos += len(part)
    find = at.get
    return [part if (i := find(part)) is None else (i, len(part)) for part in new]


class Builder:
    """One batch of changes: new nodes are kept here until the caller stores them."""

    def __init__(self, nodes: NodeStore) -> None:
        self.nodes = nodes
        self.new: dict[bytes, tuple[Node, list[split.Piece]]] = {}
        self.replaced: list[bytes] = []
        """Nodes this batch rewrote (see :meth:`pieces_reachable`)."""
        self.deltas: dict[bytes, tuple[bytes, bytes]] = {}
        """Nodes rewritten from a stored one: digest -> (the base's digest, the delta), in
        the order made (a base comes before the nodes made from it)."""
        self._taken = 0  # entries taken in since the event loop last had a turn

    async def _turn(self, entries: int = 0) -> None:
        """Count ``entries`` taken in; past :data:`SLICE_ENTRIES`, give the loop a turn."""
        self._taken += entries
        if self._taken >= SLICE_ENTRIES:
            self._taken = 0
            await asyncio.sleep(0)

    async def load(self, digest: bytes) -> Node:
        got = self.new.get(digest)
        return got[0] if got is not None else await self.nodes.load(digest)

    def make(
        self,
        level: int,
        entries: Sequence[RawEntry],
        children: list[bytes],
        base: tuple[bytes, Node] | None = None,
    ) -> bytes:
        """The node of these entries and children; ``base``, the node it replaces (digest,
        node), if any, makes its delta (see :meth:`_delta`)."""
        if level == 0:
            if not entries:
                return EMPTY
            # Entry by entry (msgpack's encoding of a whole is its parts' encodings one
            # after the other), so that the leaf knows where each entry lies in it.
            self._taken += len(entries)
            parts = _leaf_parts(entries)
            sizes = array("I", map(len, parts[1:-1]))
            node = Node(0, tuple(entries), (), b"".join(parts), sizes)
        else:
            node = Node(level, tuple(entries), tuple(children))
            if node.is_empty():
                return EMPTY
            if base is None:
                return self._add(node)
            parts = _parts(node)
        data = b"".join(parts) if node.encoded is None else node.encoded
        d = self._add(node, data)
        if base is not None and _deltable(d, data, base[0]):
            self._delta(d, data, base[0], _diff(_parts(base[1]), parts))
        return d

    def _add(self, node: Node, encoded: bytes | None = None) -> bytes:
        if encoded is None:
            encoded = node.encoded if node.encoded is not None else encode_node(node)
        d, pieces = node_pieces(encoded)
        if d not in self.new:
            self.new[d] = (node, pieces)
        return d

    def _delta(self, d: bytes, data: bytes, base: bytes, ops: list[deltas.Op]) -> None:
        """Keep the delta of node ``d`` (encoded ``data``) against the node ``base`` when
        it is less than half the node (else the node changed too much for it to be worth
        a read's while)."""
        delta = deltas.encode(ops)
        if 2 * len(delta) < len(data):
            self.deltas.setdefault(d, (base, delta))

    def _splice(
        self, node: Node, items: list[tuple[bytes, int, RawEntry | None]], base: bytes
    ) -> bytes:
        """The leaf ``node`` (digest ``base``) with ``items`` applied, made from runs of
        its own encoding and the new entries' encodings (it must have its encoding and
        sizes); the runs, as copies from ``base``, are the new leaf's delta."""
        assert node.encoded is not None and node.sizes is not None
        old, encoded, sizes = node.entries, node.encoded, node.sizes
        view = memoryview(encoded)
        n = len(old)
        runs: list[tuple[RawEntry, ...]] = []
        parts: list[bytes | memoryview] = []
        ops: list[deltas.Op] = []
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
                ops.append((pos, end - pos))
                new_sizes.extend(run)
                at, pos = i, end
            if new is not None:
                packed = _packer.pack(new)
                runs.append((new,))
                parts.append(packed)
                ops.append(packed)
                new_sizes.append(len(packed))
            if i < n and old[i][0] == key:  # replaced or deleted: skip the old one
                pos += sizes[i]
                at = i + 1
        if at < n:
            runs.append(old[at:])
            parts.append(view[pos : len(encoded) - len(_LEAF_TAIL)])
            ops.append((pos, len(encoded) - len(_LEAF_TAIL) - pos))
            new_sizes.extend(sizes[at:])
        entries = tuple(itertools.chain.from_iterable(runs))
        self._taken += len(items)
        if not entries:
            return EMPTY
        head = _leaf_head(len(entries))
        data = b"".join([head, *parts, _LEAF_TAIL])
        d = self._add(Node(0, entries, (), data, new_sizes))
        if _deltable(d, data, base):
            self._delta(d, data, base, [head, *ops, _LEAF_TAIL])
        return d

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
            self.nodes.remember(d, node, sum(len(p.data) for p in pieces) or dg.TREE_INLINE_LIMIT)
        return out

    def split_deltas(
        self, pieces: Sequence[split.Piece]
    ) -> tuple[list[split.Piece], list[tuple[bytes, bytes, bytes, bytes]]]:
        """``pieces`` (of :meth:`pieces_reachable`) as (those to store whole, those to store
        as deltas: ``(digest, data, base digest, delta)``, each after its base if both
        are new): the arguments of :func:`store.sqlite.sql.put_pieces` and
        :func:`store.sqlite.sql.put_deltas`."""
        data = {p.digest: p.data for p in pieces if p.digest in self.deltas}
        whole = [p for p in pieces if p.digest not in data]
        spliced = [(d, data[d], *self.deltas[d]) for d in self.deltas if d in data]
        return whole, spliced

    # -- update ----------------------------------------------------------------

    async def apply(
        self, root: bytes, changes: Iterable[tuple[bytes, Entry | RawEntry | None]]
    ) -> bytes:
        """New root after applying ``changes`` (key -> entry to put, or None to delete).

        The last change to a key wins. Only nodes on changed paths are rewritten.
        """
        # plain tuples of bytes and ints: see RawEntry
        return await self.apply_raw(
            root, {key: None if e is None else raw(e) for key, e in changes}
        )

    async def apply_raw(self, root: bytes, batch: Mapping[bytes, RawEntry | None]) -> bytes:
        """:meth:`apply` of changes whose entries are plain tuples already (:func:`raw`
        of each is itself), as a commit's stamped changes are, by key."""
        if not batch:
            return root
        keys = await self._sorted(batch)
        level = (await self.load(root)).level if root else -1
        items: list[tuple[bytes, int, RawEntry | None]] = []
        top = level
        for i in range(0, len(keys), SLICE_ENTRIES):
            some = keys[i : i + SLICE_ENTRIES]
            levels = key_levels(some)
            news = list(map(batch.__getitem__, some))
            top = max(top, max(itertools.compress(levels, news), default=-1))
            items.extend(zip(some, levels, news, strict=True))
            await self._turn(len(some))
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

    async def _sorted(self, batch: Iterable[bytes]) -> list[bytes]:
        """The keys sorted alone (``list.sort`` compares bytes directly, not tuples), in
        slices: 250,000 random keys sorted in one call held the event loop for 0.1 s.
        Slices of :data:`SLICE_ENTRIES` are sorted, then runs of them merged
        :data:`MERGE_RUNS` at a time (each such sort merges the sorted runs it finds),
        a turn of the loop after each."""
        keys = list(batch)
        run = SLICE_ENTRIES
        if len(keys) <= run:
            keys.sort()
            return keys
        while run < len(keys):
            for i in range(0, len(keys), run):
                keys[i : i + run] = sorted(keys[i : i + run])
                await self._turn(run)
            run *= MERGE_RUNS
        keys.sort()  # (the runs left are sorted: one merge of at most MERGE_RUNS)
        return keys

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
                return self._splice(node, items, d)
            entries = list(node.entries)
            children = list(node.children)
            base: tuple[bytes, Node] | None = (d, node)
        else:
            entries, children = [], ([EMPTY] if level > 0 else [])
            base = None
        if level > 0:  # most keys belong lower: split them off in one pass
            lower = [item for item in items if item[1] < level]
            items = [item for item in items if item[1] >= level]
            if items:
                await self._separators(level, entries, children, items)
            if lower:
                await self._children(level, entries, children, lower)
        else:
            for key, _, new in items:
                i = bisect.bisect_left(entries, key, key=_KEY)
                if i < len(entries) and entries[i][0] == key:
                    if new is not None:
                        entries[i] = new
                    else:
                        del entries[i]
                elif new is not None:
                    entries.insert(i, new)
        return self.make(level, entries, children, base)

    async def _separators(
        self,
        level: int,
        entries: list[RawEntry],
        children: list[bytes],
        items: list[tuple[bytes, int, RawEntry | None]],
    ) -> None:
        """Apply the changes to keys of ``level`` (this node's separators) in place,
        splitting and merging the children around the ones put and deleted."""
        for key, _, new in items:
            i = bisect.bisect_left(entries, key, key=_KEY)
            present = i < len(entries) and entries[i][0] == key
            if present and new is not None:
                entries[i] = new
            elif present:
                del entries[i]
                children[i : i + 2] = [await self._merge(children[i], children[i + 1], level - 1)]
            elif new is not None:
                entries.insert(i, new)
                children[i : i + 1] = list(await self._split(children[i], level - 1, key))

    async def _children(
        self,
        level: int,
        entries: list[RawEntry],
        children: list[bytes],
        lower: list[tuple[bytes, int, RawEntry | None]],
    ) -> None:
        """Apply the changes to keys below ``level`` to the children they fall in."""
        start = 0
        for i in range(len(children)):
            if i < len(entries):
                end = bisect.bisect_left(lower, entries[i][0], start, key=_KEY)
            else:
                end = len(lower)
            if end > start:
                children[i] = await self._update(children[i], level - 1, lower[start:end])
                await self._turn()
            start = end

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
