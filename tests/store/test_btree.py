"""The page tree: history independence, diffs and range reads against a dict model."""

from __future__ import annotations

import asyncio
import gc
import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledgerd.store.errors import CorruptObjectError, InvalidDigestError
from ledgerd.store.pieces import digest as dg
from ledgerd.store.tree import btree, diff3
from ledgerd.store.tree.btree import EMPTY, Entry, NodeStore, Priority
from ledgerd.store.tree.builder import Builder
from ledgerd.store.tree.nodecheck import check_digests


class MemoryNodes:
    """An in-memory node reader: the tree algorithms need nothing else."""

    def __init__(self) -> None:
        self.pieces: dict[bytes, bytes] = {}
        self.reads = 0

    async def read_node_bytes(self, digest: bytes) -> bytes:
        self.reads += 1
        return self.pieces[digest]


@contextmanager
def _level_bits(bits: int) -> Iterator[None]:
    """Fewer bits per level make small trees deep, so properties cover every level."""
    saved = btree.LEVEL_BITS
    btree.LEVEL_BITS = bits
    try:
        yield
    finally:
        btree.LEVEL_BITS = saved


DOT = bytes(16)
"""A dot for entries made here (a tree's entries carry one: :mod:`store.tree.dots`)."""


def _entry(key: bytes, value: bytes = b"v") -> Entry:
    return Entry(key, dg.chunk_digest(dg.Kind.VALUE, value), Priority.EAGER, DOT)


async def _build(mem: MemoryNodes, root: bytes, changes: list[tuple[bytes, Entry | None]]) -> bytes:
    b = Builder(NodeStore(mem))
    new_root = await b.apply(root, changes)
    for p in b.pieces_reachable(new_root):
        mem.pieces[p.digest] = p.data
    return new_root


async def _items(mem: MemoryNodes, root: bytes, start: bytes = b"", end: bytes | None = None):
    return [(e.key, e.value) async for e in btree.iterate(NodeStore(mem), root, start, end)]


def _model(d: dict[bytes, bytes]) -> list[tuple[bytes, bytes]]:
    return [(k, dg.chunk_digest(dg.Kind.VALUE, v)) for k, v in sorted(d.items())]


keys = st.binary(min_size=0, max_size=6)
ops = st.lists(st.tuples(keys, st.one_of(st.none(), st.binary(max_size=3))), max_size=300)


@pytest.mark.parametrize("bits", [1, 6])
@settings(max_examples=60, deadline=None)
@given(ops, st.randoms(use_true_random=False))
async def test_root_independent_of_insertion_order(bits, ops_list, rnd) -> None:
    with _level_bits(bits):
        await _root_independent_of_insertion_order(ops_list, rnd)


async def _root_independent_of_insertion_order(ops_list, rnd) -> None:
    model: dict[bytes, bytes] = {}
    mem = MemoryNodes()
    root = EMPTY
    # Apply in several random batches.
    i = 0
    while i < len(ops_list):
        n = rnd.randint(1, 40)
        batch = ops_list[i : i + n]
        i += n
        root = await _build(mem, root, [(k, None if v is None else _entry(k, v)) for k, v in batch])
        for k, v in batch:
            if v is None:
                model.pop(k, None)
            else:
                model[k] = v
    # The same final set inserted at once, in another order, into an empty tree.
    final = list(model.items())
    rnd.shuffle(final)
    mem2 = MemoryNodes()
    root2 = await _build(mem2, EMPTY, [(k, _entry(k, v)) for k, v in final])
    assert root == root2
    assert await _items(mem, root) == _model(model)
    for k, v in model.items():
        got = await btree.lookup(NodeStore(mem), root, k)
        assert got is not None and got.value == dg.chunk_digest(dg.Kind.VALUE, v)
    assert await btree.lookup(NodeStore(mem), root, b"\xff" * 7) is None


async def test_large_tree_is_shallow_and_updates_touch_a_path() -> None:
    rng = random.Random(5)
    mem = MemoryNodes()
    entries = {rng.randbytes(16): rng.randbytes(100) for _ in range(20_000)}
    root = await _build(mem, EMPTY, [(k, _entry(k, v)) for k, v in entries.items()])
    depth, d = 0, root
    while d:
        node = await NodeStore(mem).load(d)
        depth += 1
        d = node.children[0] if node.level else EMPTY
    assert depth <= 4
    before = set(mem.pieces)
    k = next(iter(entries))
    root2 = await _build(mem, root, [(k, _entry(k, b"changed"))])
    assert 1 <= len(set(mem.pieces) - before) <= depth
    assert [c.key async for c in btree.diff(NodeStore(mem), root, root2)] == [k]


@pytest.mark.parametrize("bits", [1, 6])
@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(keys, st.binary(max_size=3), max_size=150),
    st.dictionaries(keys, st.one_of(st.none(), st.binary(max_size=3)), max_size=60),
    keys,
)
async def test_two_way_diff_equals_dict_difference(bits, base, edits, start) -> None:
    with _level_bits(bits):
        await _two_way_diff_equals_dict_difference(base, edits, start)


async def _two_way_diff_equals_dict_difference(base, edits, start) -> None:
    mem = MemoryNodes()
    a = await _build(mem, EMPTY, [(k, _entry(k, v)) for k, v in base.items()])
    b = await _build(mem, a, [(k, None if v is None else _entry(k, v)) for k, v in edits.items()])
    after = dict(base)
    for k, v in edits.items():
        if v is None:
            after.pop(k, None)
        else:
            after[k] = v
    want = []
    for k in sorted(set(base) | set(after)):
        if base.get(k) != after.get(k):
            want.append((k, base.get(k), after.get(k)))

    def val(e: Entry | None) -> bytes | None:
        return None if e is None else dg.inline_content(e.value)

    got = [(c.key, val(c.old), val(c.new)) async for c in btree.diff(NodeStore(mem), a, b)]
    assert got == want
    back = [(c.key, val(c.new), val(c.old)) async for c in btree.diff(NodeStore(mem), b, a)]
    assert back == want
    # From a start key: the same changes, without those below it.
    later = [(c.key, val(c.old), val(c.new)) async for c in btree.diff(NodeStore(mem), a, b, start)]
    assert later == [w for w in want if w[0] >= start]


@pytest.mark.parametrize("bits", [1, 6])
@settings(max_examples=40, deadline=None)
@given(
    st.dictionaries(keys, st.binary(max_size=3), max_size=120),
    st.dictionaries(keys, st.one_of(st.none(), st.binary(max_size=3)), max_size=40),
    st.dictionaries(keys, st.one_of(st.none(), st.binary(max_size=3)), max_size=40),
)
async def test_three_way_diff(bits, base, left_edits, right_edits) -> None:
    with _level_bits(bits):
        await _three_way_diff(base, left_edits, right_edits)


async def _three_way_diff(base, left_edits, right_edits) -> None:
    mem = MemoryNodes()

    def applied(d: dict[bytes, bytes], edits: dict[bytes, bytes | None]) -> dict[bytes, bytes]:
        out = dict(d)
        for k, v in edits.items():
            if v is None:
                out.pop(k, None)
            else:
                out[k] = v
        return out

    b = await _build(mem, EMPTY, [(k, _entry(k, v)) for k, v in base.items()])
    lroot = await _build(
        mem, b, [(k, None if v is None else _entry(k, v)) for k, v in left_edits.items()]
    )
    rroot = await _build(
        mem, b, [(k, None if v is None else _entry(k, v)) for k, v in right_edits.items()]
    )
    left, right = applied(base, left_edits), applied(base, right_edits)
    want = [
        (k, base.get(k), left.get(k), right.get(k))
        for k in sorted(set(base) | set(left) | set(right))
        if base.get(k) != left.get(k) or base.get(k) != right.get(k)
    ]

    def val(e: Entry | None) -> bytes | None:
        return None if e is None else dg.inline_content(e.value)

    got = [
        (c.key, val(c.base), val(c.left), val(c.right))
        async for c in diff3.diff3(NodeStore(mem), b, lroot, rroot)
    ]
    assert got == want


async def test_diff_cost_grows_with_change_not_page() -> None:
    rng = random.Random(6)
    mem = MemoryNodes()
    entries = {rng.randbytes(16): rng.randbytes(8) for _ in range(20_000)}
    a = await _build(mem, EMPTY, [(k, _entry(k, v)) for k, v in entries.items()])
    changed = rng.sample(sorted(entries), 3)
    b = await _build(mem, a, [(k, _entry(k, b"new")) for k in changed])
    mem.reads = 0
    got = [c.key async for c in btree.diff(NodeStore(mem), a, b)]
    assert got == sorted(changed)
    assert mem.reads < 40  # a few paths, not the ~300 nodes of the page


async def test_a_long_diff_lets_other_tasks_run() -> None:
    rng = random.Random(7)
    mem = MemoryNodes()  # its reads never yield, as reads of cached nodes do not
    entries = {rng.randbytes(16): rng.randbytes(8) for _ in range(20_000)}
    root = await _build(mem, EMPTY, [(k, _entry(k, v)) for k, v in entries.items()])
    turns, done = 0, False

    async def other() -> None:
        nonlocal turns
        while not done:
            turns += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(other())
    await asyncio.sleep(0)
    before = turns
    got = [c.key async for c in btree.diff(NodeStore(mem), EMPTY, root)]
    during = turns - before
    done = True
    await task
    assert got == sorted(entries)
    nodes = len(mem.pieces)  # about 300: every one is opened
    assert during >= 3
    assert during >= nodes // btree.DIFF_TURN_NODES - 1


async def test_range_iteration_bounds() -> None:
    mem = MemoryNodes()
    ks = [bytes([i, j]) for i in range(0, 256, 7) for j in range(0, 256, 31)]
    root = await _build(mem, EMPTY, [(k, _entry(k, k)) for k in ks])
    for start, end in [
        (b"", None),
        (b"\x07", b"\x1c"),
        (b"\x07\x1f", b"\x07\x20"),
        (b"\xff", None),
    ]:
        want = [k for k in ks if k >= start and (end is None or k < end)]
        assert [k for k, _ in await _items(mem, root, start, end)] == want
    assert btree.prefix_end(b"ab") == b"ac"
    assert btree.prefix_end(b"a\xff") == b"b"
    assert btree.prefix_end(b"\xff\xff") is None


_digests = st.one_of(
    st.binary(min_size=32, max_size=32).map(lambda h: bytes([dg.Kind.VALUE]) + h),
    st.binary(min_size=32, max_size=32).map(lambda h: bytes([dg.Kind.VALUE | 0x02]) + h),
    st.binary(max_size=32).map(lambda c: dg.chunk_digest(dg.Kind.VALUE, c)),
)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, 10),
    st.lists(
        st.tuples(st.binary(max_size=300), _digests, st.sampled_from(list(btree.Priority))),
        max_size=40,
    ),
    st.data(),
)
def test_nodes_decode_to_what_was_encoded(
    level: int, raw: list[tuple[bytes, bytes, btree.Priority]], data: st.DataObject
) -> None:
    entries = tuple(Entry(k, v, p, DOT) for k, v, p in raw)
    children: tuple[bytes, ...] = ()
    if level:
        tree = st.binary(min_size=32, max_size=32).map(lambda h: bytes([dg.Kind.TREE]) + h)
        children = tuple(
            data.draw(
                st.lists(
                    st.one_of(st.just(b""), tree), min_size=len(raw) + 1, max_size=len(raw) + 1
                )
            )
        )
    node = btree.Node(level, entries, children)
    got = btree.decode_node(btree.encode_node(node))
    assert got == node and btree.encode_node(got) == btree.encode_node(node)
    assert all(type(e) is tuple and type(e[2]) is int for e in got.entries)


async def test_decoded_nodes_leave_the_garbage_collector() -> None:
    """A cached node's entries are plain tuples, which the collector stops tracking
    after its first pass, so that a large node cache does not lengthen every full
    collection; entries handed out are Entry objects all the same."""
    entries = tuple(
        Entry(bytes([i]), bytes([dg.Kind.VALUE]) + b"h" * 32, Priority.EAGER, DOT)
        for i in range(50)
    )
    got = btree.decode_node(btree.encode_node(btree.Node(0, entries, ())))
    gc.collect()
    assert not any(map(gc.is_tracked, got.entries))
    nodes = MemoryNodes()
    data = btree.encode_node(got)
    d = btree.node_pieces(data)[0]
    nodes.pieces[d] = data
    found = await btree.lookup(NodeStore(nodes), d, bytes([7]))
    assert found == entries[7] and type(found) is Entry
    assert [type(e) for e in [e async for e in btree.iterate(NodeStore(nodes), d)]] == [Entry] * 50


_GOOD = bytes([dg.Kind.VALUE]) + b"h" * 32


@pytest.mark.parametrize(
    "shape",
    [
        [0, [[b"k", _GOOD]], []],  # an entry of two fields
        [0, [[b"k", _GOOD, 2]], []],  # a priority that is not 0 or 1
        [0, [[b"k", _GOOD, True]], []],  # a priority that is a bool
        [0, [["k", _GOOD, 0]], []],  # a key that is text
        [0, [[7, _GOOD, 0]], []],  # a key that is a number
        [0, [[b"k", [1], 0]], []],  # a value that is an array shaped like an inline digest
        [0, [[b"k", "\x01h", 0]], []],  # a value that is text
        [0, [[b"k", _GOOD, 0], [b"l", 5, 0]], []],  # one value of two that is a number
        [0, [[b"k", _GOOD[:-1], 0]], []],  # a hashed digest one byte short
        [0, [[b"k", bytes([0x80]) + b"h" * 32, 0]], []],  # an unknown type byte
        [0, [[b"k", bytes([0x03]) + b"h", 0]], []],  # an inline index
        [0, [[b"k", b"", 0]], []],  # an empty digest
        [1, [[b"k", _GOOD, 0]], [b""]],  # one child too few
        [1, [[b"k", _GOOD, 0]], [b"", b"x" * 33]],  # a child that is no digest
        [1, [[b"k", _GOOD, 0]], [b"", "\x04" + "h" * 32]],  # a child that is text
        [0, [], [b""]],  # children at level 0
        ["0", [], []],  # a level that is text
        [-1, [], []],  # a negative level
        [0, {}, []],  # entries that are a map
        [0, [b"k"], []],  # an entry that is not a list
    ],
)
def test_malformed_nodes_are_corrupt(shape: list[object]) -> None:
    with pytest.raises(CorruptObjectError):
        btree.decode_node(msgpack.packb(shape, use_bin_type=True))


_splice_keys = st.one_of(st.binary(min_size=0, max_size=6), st.binary(min_size=250, max_size=300))
_splice_entry = st.one_of(
    st.none(),
    st.tuples(st.binary(max_size=40), st.sampled_from([btree.Priority.EAGER, btree.Priority.LAZY])),
)


@pytest.mark.parametrize("bits", [1, 6])
@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.tuples(_splice_keys, _splice_entry), max_size=60), max_size=8))
async def test_leaves_spliced_from_their_encoding_are_encoded_exactly(bits, batches) -> None:
    """A leaf a Builder made keeps its encoding; the next batch splices changed entries
    into it. Every such leaf is byte for byte what encoding it whole gives, and the root
    after each batch is the root of the same entries built at once (keys of 256 bytes
    and more take a longer msgpack header; values of all sizes, both priorities)."""
    with _level_bits(bits):
        mem = MemoryNodes()
        nodes = NodeStore(mem)  # one store across batches: its leaves are spliced
        root, model = EMPTY, dict[bytes, Entry]()
        for batch in batches:
            changes: list[tuple[bytes, Entry | None]] = []
            for key, change in batch:
                if change is None:
                    changes.append((key, None))
                    model.pop(key, None)
                else:
                    e = Entry(key, dg.chunk_digest(dg.Kind.VALUE, change[0]), change[1], DOT)
                    changes.append((key, e))
                    model[key] = e
            b = Builder(nodes)
            root = await b.apply(root, changes)
            for p in b.pieces_reachable(root):
                mem.pieces[p.digest] = p.data
            for node, _ in b.new.values():
                if node.level == 0:
                    assert node.encoded == btree.encode_node(node)
                    assert node.sizes is not None
                    assert list(node.sizes) == [len(msgpack.packb(e)) for e in node.entries]
            fresh = MemoryNodes()
            assert root == await _build(fresh, EMPTY, sorted(model.items()))
            got = [e async for e in btree.iterate(NodeStore(mem), root)]
            assert got == [model[k] for k in sorted(model)]


async def test_a_batch_splices_the_leaves_the_last_one_made(monkeypatch) -> None:
    spliced: list[int] = []
    splice = Builder._splice

    def counting(self: Builder, node: btree.Node, items: list[Any], base: bytes) -> bytes:
        spliced.append(len(node.entries))
        return splice(self, node, items, base)

    monkeypatch.setattr(Builder, "_splice", counting)
    mem = MemoryNodes()
    nodes = NodeStore(mem)
    rows = {b"k%05d" % i: _entry(b"k%05d" % i) for i in range(3000)}
    b = Builder(nodes)
    root = await b.apply(EMPTY, sorted(rows.items()))
    for p in b.pieces_reachable(root):
        mem.pieces[p.digest] = p.data
    assert not spliced  # built from nothing
    changes: list[tuple[bytes, Entry | None]] = [
        (b"k%05d" % i, _entry(b"k%05d" % i, b"new")) for i in range(0, 3000, 300)
    ]
    changes += [(b"k00007", None), (b"k00007x", _entry(b"k00007x"))]
    rows.update((k, e) for k, e in changes[:-2] if e is not None)
    del rows[b"k00007"]
    rows[b"k00007x"] = _entry(b"k00007x")
    b = Builder(nodes)
    root = await b.apply(root, changes)
    assert len(spliced) >= 5  # the changed leaves, from the nodes the first batch made
    assert root == await _build(MemoryNodes(), EMPTY, sorted(rows.items()))


_INLINE = dg.value_chunk_digest(b"v" * 128)
_MIXED = [
    _GOOD,
    _INLINE,
    dg.TOMBSTONE,
    dg.value_chunk_digest(b""),
    dg.index_digest(dg.Kind.VALUE, b"i"),
]


@pytest.mark.parametrize(
    "bad",
    [
        dg.VALUE_INLINE + b"v" * 129,  # inline, over INLINE_LIMIT
        dg.TOMBSTONE + b"x",  # a tombstone with a body
        _GOOD[:-1],  # hashed, a byte short
        _GOOD + b"x",  # hashed, a byte long
        bytes([0x80]) + b"h" * 32,  # an unknown type byte
        bytes([0x05]) + b"t" * 33,  # an inline tree node over TREE_INLINE_LIMIT
        bytes([0x03]) + b"h",  # an inline index
        b"",  # empty
    ],
)
def test_a_leaf_s_values_are_checked_column_by_column(bad: bytes) -> None:
    """Hashed digests, values carried inline and tombstones pass together at C speed;
    one malformed digest among them is found, wherever it lies."""
    check_digests(_MIXED * 20)
    check_digests([dg.chunk_digest(dg.Kind.TREE, b"t" * 32), *_MIXED])  # (one by one)
    for at in (0, 37, 100):
        digests = _MIXED * 20
        digests.insert(at, bad)
        with pytest.raises(InvalidDigestError):
            check_digests(digests)
