"""Imports take only canonical trees: a tree another device uploads must be the one its
entries make (sorted keys, each at its level, inside its parent's range, no needless
node, encoded and split as every device does), or lookups, roots and merges go wrong."""

from __future__ import annotations

import itertools
import os
import random
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledgerd.store import Page, Repository, btree, commit, exchange
from ledgerd.store import digest as dg
from ledgerd.store.btree import EMPTY, Builder, Node, NodeStore, RawEntry
from ledgerd.store.errors import NonCanonicalTreeError
from tests.store.test_btree import MemoryNodes, _level_bits


@dataclass
class T:
    """A tree node as nested Python values, to damage and encode again."""

    level: int
    entries: list[RawEntry]
    children: list[T | None] = field(default_factory=list)  # None: the empty digest


def _raw(key: bytes) -> RawEntry:
    return (key, dg.chunk_digest(dg.Kind.VALUE, b"v" + key[:8]), 0)


async def _canonical(keys: list[bytes]) -> tuple[bytes, dict[bytes, bytes]]:
    """The root and pieces of the tree a Builder makes of ``keys``."""
    mem = MemoryNodes()
    b = Builder(NodeStore(mem))
    root = await b.apply(EMPTY, [(k, btree.new_entry(_raw(k))) for k in keys])
    return root, {p.digest: p.data for p in b.pieces_reachable(root)}


async def _nested(root: bytes, pieces: dict[bytes, bytes]) -> T | None:
    mem = MemoryNodes()
    mem.pieces = pieces
    nodes = NodeStore(mem)

    async def walk(d: bytes) -> T | None:
        if not d:
            return None
        n = await nodes.load(d)
        return T(n.level, list(n.entries), [await walk(c) for c in n.children])

    return await walk(root)


def _encode(t: T | None, pieces: dict[bytes, bytes]) -> bytes:
    """Encode as given (no canonical shortcut: an empty leaf is a node here)."""
    if t is None:
        return EMPTY
    children = tuple(_encode(c, pieces) for c in t.children)
    d, ps = btree.node_pieces(btree.encode_node(Node(t.level, tuple(t.entries), children)))
    pieces.update((p.digest, p.data) for p in ps)
    return d


def _all(t: T | None) -> Iterator[T]:
    if t is not None:
        yield t
        for c in t.children:
            yield from _all(c)


def _leaves(t: T | None) -> list[T]:
    return [n for n in _all(t) if n.level == 0]


# -- each kind of damage: None where the tree has no place for it ----------------------


def _unsorted(t: T) -> bool:
    for leaf in _leaves(t):
        if len(leaf.entries) >= 2:
            leaf.entries[0], leaf.entries[1] = leaf.entries[1], leaf.entries[0]
            return True
    return False


def _duplicate(t: T) -> bool:
    n = next(n for n in _all(t) if n.entries)
    n.entries.insert(0, n.entries[0])
    if n.level:
        n.children.insert(1, None)
    return True


def _separator_into_leaf(t: T) -> bool:
    """A level-1 key put down into the leaf beside it (the two leaves joined)."""
    for n in _all(t):
        if n.level == 1 and n.entries:
            left, right = n.children[0], n.children[1]
            lo, hi = (left.entries if left else []), (right.entries if right else [])
            joined = [*lo, n.entries[0], *hi]
            n.entries.pop(0)
            n.children[0:2] = [T(0, joined)]
            return True
    return False


def _leaf_key_up(t: T) -> bool:
    """A level-0 key raised into its leaf's parent (the leaf split around it)."""
    for n in _all(t):
        for i, c in enumerate(n.children):
            if c is not None and c.level == 0 and len(c.entries) >= 3:
                mid = len(c.entries) // 2
                lo, e, hi = T(0, c.entries[:mid]), c.entries[mid], T(0, c.entries[mid + 1 :])
                n.entries.insert(i, e)
                n.children[i : i + 1] = [lo, hi]
                return True
    return False


def _outside_range(t: T) -> bool:
    """The last key of a leaf moved to the front of the next leaf (both stay sorted)."""
    for n in _all(t):
        for a, b in itertools.pairwise(n.children):
            if a is not None and b is not None and a.level == 0 and len(a.entries) >= 2:
                b.entries.insert(0, a.entries.pop())
                return True
    return False


def _needless_top(t: T) -> bool:
    """The root wrapped in a separator-less node (above the highest level present)."""
    inner = T(t.level, t.entries, t.children)
    t.level, t.entries, t.children = t.level + 1, [], [inner]
    return True


def _empty_child(t: T) -> bool:
    """An empty leaf node where the tree has the empty digest."""
    for n in _all(t):
        for i, c in enumerate(n.children):
            if c is None:
                n.children[i] = T(0, [])
                return True
    return False


def _wrong_child_level(t: T) -> bool:
    """A leaf hung under a level-2 node (a level is skipped)."""
    for n in _all(t):
        if n.level == 2:
            for i, c in enumerate(n.children):
                if c is not None:
                    leaf = [e for x in _all(c) for e in x.entries if x.level == 0][:1]
                    n.children[i] = T(0, leaf)
                    return True
    return False


DAMAGE: dict[str, Callable[[T], bool]] = {
    "unsorted": _unsorted,
    "duplicate": _duplicate,
    "separator_into_leaf": _separator_into_leaf,
    "leaf_key_up": _leaf_key_up,
    "outside_range": _outside_range,
    "needless_top": _needless_top,
    "empty_child": _empty_child,
    "wrong_child_level": _wrong_child_level,
}


def _bin16(data: bytes, key: bytes) -> bytes:
    """``data`` with ``key``'s msgpack bin8 encoding written as bin16 (the same node)."""
    short = b"\xc4" + bytes([len(key)]) + key
    assert short in data
    return data.replace(short, b"\xc5" + len(key).to_bytes(2, "big") + key, 1)


# -- importing -------------------------------------------------------------------------


class Pages:
    """Fresh pages of one repository, one per import."""

    def __init__(self, repo: Repository) -> None:
        self.repo = repo
        self.n = 0

    async def fresh(self) -> Page:
        self.n += 1
        return await self.repo.ledger("l").page(f"p{self.n}")


@pytest.fixture
async def pages(tmp_path: Path) -> AsyncIterator[Pages]:
    repo = await Repository.open(tmp_path / "r")
    try:
        yield Pages(repo)
    finally:
        await repo.close()


async def _import(page: Page, root: bytes, pieces: dict[bytes, bytes]) -> commit.Commit:
    c = commit.make((commit.FIRST.id,), 1, 1, root, os.urandom(8))
    await exchange.import_remote(page, [c.data], dict(pieces), {})
    return c


async def _stored_nothing(page: Page) -> None:
    assert [h.id for h in await page.heads()] == [commit.FIRST.id]
    rows = await page.db.read_all("SELECT count(*) FROM objects")
    assert rows[0][0] == 0


async def _refused(pages: Pages, t: T) -> None:
    """The tree ``t``, encoded as it is, is refused by a fresh page, which stores nothing."""
    bad: dict[bytes, bytes] = {}
    bad_root = _encode(t, bad)
    page = await pages.fresh()
    with pytest.raises(NonCanonicalTreeError):
        await _import(page, bad_root, bad)
    await _stored_nothing(page)


@contextmanager
def _deep() -> Iterator[None]:
    with _level_bits(2):  # a level per 4 keys: small trees have every shape
        yield


KEYS = st.lists(st.binary(min_size=1, max_size=6), min_size=1, max_size=120, unique=True)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(keys=KEYS)
async def test_every_tree_a_builder_makes_is_imported(pages: Pages, keys: list[bytes]) -> None:
    with _deep():
        root, pieces = await _canonical(keys)
        page = await pages.fresh()
        await _import(page, root, pieces)
        assert page.head.root == root
        assert [e.key async for e in page.iter_entries()] == sorted(keys)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(keys=KEYS, kind=st.sampled_from(sorted(DAMAGE)))
async def test_every_kind_of_damage_is_refused_and_nothing_stored(
    pages: Pages, keys: list[bytes], kind: str
) -> None:
    with _deep():
        root, pieces = await _canonical(keys)
        t = await _nested(root, pieces)
        assert t is not None
        if not DAMAGE[kind](t):
            return  # the tree has no place for this damage
        await _refused(pages, t)


async def test_each_kind_of_damage_has_a_tree_that_shows_it(pages: Pages) -> None:
    """The property above is not vacuous: every kind applies to some tree and is refused."""
    rng = random.Random(5)
    with _deep():
        keys = [rng.randbytes(4) for _ in range(300)]
        for kind, damage in DAMAGE.items():
            root, pieces = await _canonical(keys)
            t = await _nested(root, pieces)
            assert t is not None and damage(t), kind
            await _refused(pages, t)


async def test_a_node_encoded_otherwise_is_refused(pages: Pages) -> None:
    """The same node in other msgpack bytes would give the same entries another root."""
    rng = random.Random(6)
    keys = [rng.randbytes(4) for _ in range(50)]
    root, pieces = await _canonical(keys)
    assert len(pieces) == 1  # one leaf
    data = _bin16(pieces[root], sorted(keys)[0])
    assert btree.decode_node(data) == btree.decode_node(pieces[root])
    d, ps = btree.node_pieces(data)
    page = await pages.fresh()
    with pytest.raises(NonCanonicalTreeError, match="encoded"):
        await _import(page, d, {p.digest: p.data for p in ps})
    await _stored_nothing(page)


async def test_a_root_that_is_a_value_is_refused(pages: Pages) -> None:
    root, pieces = await _canonical([os.urandom(8) for _ in range(40)])
    data = pieces[root]
    as_value = dg.chunk_digest(dg.Kind.VALUE, data)
    page = await pages.fresh()
    with pytest.raises(NonCanonicalTreeError, match="not a tree node"):
        await _import(page, as_value, {as_value: data})
    await _stored_nothing(page)


async def test_a_new_node_over_stored_subtrees_in_the_wrong_order_is_refused(
    pages: Pages,
) -> None:
    """Stored subtrees are not opened again, but their edges are checked against the
    slot a new node puts them in: two stored leaves swapped under a new root."""
    rng = random.Random(7)
    keys = [rng.randbytes(4) for _ in range(400)]
    root, pieces = await _canonical(keys)
    page = await pages.fresh()
    await _import(page, root, pieces)  # every node stored
    t = await _nested(root, pieces)
    assert t is not None and t.level >= 1
    # A new root whose children are the stored subtrees, two of them swapped.
    top = await page.nodes.load(root)
    children = list(top.children)
    i = next(i for i in range(len(children) - 1) if children[i] and children[i + 1])
    children[i], children[i + 1] = children[i + 1], children[i]
    data = btree.encode_node(Node(top.level, top.entries, tuple(children)))
    d, ps = btree.node_pieces(data)
    c = commit.make((page.head.id,), page.head.timestamp + 1, 2, d, b"s")
    with pytest.raises(NonCanonicalTreeError, match="outside"):
        await exchange.import_remote(page, [c.data], {p.digest: p.data for p in ps}, {})
    assert page.head.root == root


async def test_a_large_import_is_checked_on_a_thread_and_still_refused(pages: Pages) -> None:
    """More than VERIFY_INLINE nodes in a level: the check runs on a thread."""
    rng = random.Random(8)
    with _deep():
        keys = [rng.randbytes(6) for _ in range(3000)]
        root, pieces = await _canonical(keys)
        page = await pages.fresh()
        await _import(page, root, pieces)
        assert page.head.root == root
        t = await _nested(root, pieces)
        assert t is not None and _outside_range(t)
        await _refused(pages, t)


async def test_a_large_node_split_otherwise_is_refused(pages: Pages) -> None:
    """A node over 64 KiB is split into chunks and an index: sent as one chunk, the same
    entries would have another root."""
    rng = random.Random(9)
    keys = [bytes([0]) + rng.randbytes(2000) for _ in range(200)]
    keys = [k for k in keys if btree.key_level(k) == 0][:60]
    root, pieces = await _canonical(keys)
    assert dg.is_index(root)
    data = btree.encode_node(Node(0, tuple(_raw(k) for k in sorted(keys)), ()))
    assert btree.node_pieces(data)[0] == root
    whole = dg.chunk_digest(dg.Kind.TREE, data)
    page = await pages.fresh()
    with pytest.raises(NonCanonicalTreeError, match="split"):
        await _import(page, whole, {whole: data})
    await _stored_nothing(page)
