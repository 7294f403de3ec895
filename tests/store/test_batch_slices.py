"""A big batch is built a slice at a time, with the same result as in one go.

:class:`store.tree.builder.Builder` gives the event loop a turn every
``SLICE_ENTRIES`` entries, a commit passes its stamped entries to ``apply_raw``, and the
write's staging loop makes a plain put's entry in place (:func:`staging.one_chunk` and
:func:`staging.prepare` written out) and takes every value as live when no key comes
twice. These properties hold each to the plain path, and a reader during a sliced
commit to the state before it or the one after.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledgerd.store import Repository
from ledgerd.store.errors import InvalidArgumentError
from ledgerd.store.page import staging
from ledgerd.store.pieces import digest as dg
from ledgerd.store.pieces import split
from ledgerd.store.pieces.objects import ObjectStore
from ledgerd.store.tree import btree, builder
from ledgerd.store.tree.btree import EMPTY, Entry, NodeStore, Priority, RawEntry
from ledgerd.store.tree.builder import Builder

_NO_OBJECTS = cast(ObjectStore, None)  # values of at most SMALL_VALUE never reach it
DOT = bytes(16)


class MemoryNodes:
    def __init__(self) -> None:
        self.pieces: dict[bytes, bytes] = {}

    async def read_node_bytes(self, digest: bytes) -> bytes:
        return self.pieces[digest]


@contextmanager
def _deep_and_sliced(bits: int, slice_entries: int) -> Iterator[None]:
    """Small trees made deep (fewer bits per level), and built in slices of
    ``slice_entries``."""
    saved = btree.LEVEL_BITS, builder.SLICE_ENTRIES
    btree.LEVEL_BITS, builder.SLICE_ENTRIES = bits, slice_entries
    try:
        yield
    finally:
        btree.LEVEL_BITS, builder.SLICE_ENTRIES = saved


async def _build(
    mem: MemoryNodes, root: bytes, changes: dict[bytes, RawEntry | None], raw: bool
) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    b = Builder(NodeStore(mem))
    if raw:
        new_root = await b.apply_raw(root, changes)
    else:
        as_entries = [(k, None if e is None else Entry(*e)) for k, e in changes.items()]
        new_root = await b.apply(root, as_entries)
    pieces = sorted((p.digest, p.data) for p in b.pieces_reachable(new_root))
    for d, data in pieces:
        mem.pieces[d] = data
    return new_root, pieces


def _raw(key: bytes, value: bytes) -> RawEntry:
    return (key, dg.chunk_digest(dg.Kind.VALUE, value), 0, DOT)


keys = st.binary(min_size=1, max_size=6)
trees = st.dictionaries(keys, st.binary(max_size=40), max_size=60)
batches = st.dictionaries(keys, st.none() | st.binary(max_size=40), max_size=60)


@settings(max_examples=60, deadline=None)
@given(trees, batches, st.integers(1, 9), st.booleans())
async def test_a_tree_built_in_slices_is_the_tree_built_in_one_go(
    base: dict[bytes, bytes],
    batch: dict[bytes, bytes | None],
    slice_entries: int,
    raw: bool,
) -> None:
    """The same root and the same new nodes, whatever the slices, through ``apply`` or
    ``apply_raw``; and the tree holds what the entries say."""
    changes = {k: None if v is None else _raw(k, v) for k, v in batch.items()}
    got = []
    for size, through_raw in ((10**9, False), (slice_entries, raw)):
        with _deep_and_sliced(2, size):
            mem = MemoryNodes()
            root, _ = await _build(mem, EMPTY, {k: _raw(k, v) for k, v in base.items()}, True)
            got.append(await _build(mem, root, changes, through_raw))
            expected = dict(base)
            for k, v in batch.items():
                if v is None:
                    expected.pop(k, None)
                else:
                    expected[k] = v
            found = [(e.key, e.value) async for e in btree.iterate(NodeStore(mem), got[-1][0])]
            assert found == [(k, _raw(k, v)[1]) for k, v in sorted(expected.items())]
    assert got[0] == got[1]


priorities = st.one_of(
    st.sampled_from([Priority.EAGER, Priority.LAZY, 0, 1, None]),
    st.integers(-2, 3),
    st.text(max_size=2),
)
values = st.one_of(
    st.none(),
    st.binary(max_size=split.MIN_CHUNK),
    st.binary(min_size=split.MIN_CHUNK + 1, max_size=3 * 65536),
)
writes = st.lists(st.tuples(st.binary(max_size=8), values, priorities), max_size=12)


def _staged(entry: Entry | None) -> tuple[Any, ...] | None:
    return None if entry is None else tuple(entry[:3])


async def _plain(
    changes: list[tuple[bytes, bytes | None, object]],
) -> tuple[list[tuple[bytes, Any]], dict[bytes, list[tuple[bytes, bytes]]]]:
    """Staging by the plain path: :func:`staging.prepare` per put."""
    prepared: list[tuple[bytes, Any]] = []
    pieces: dict[bytes, list[tuple[bytes, bytes]]] = {}
    for key, value, prio in changes:
        if value is None:
            prepared.append((key, None))
            continue
        entry, more, _ = await staging.prepare(_NO_OBJECTS, key, value, prio)
        if more:
            pieces[entry.value] = [(p.digest, p.data) for p in more]
        prepared.append((key, _staged(entry)))
    return prepared, pieces


@settings(max_examples=200, deadline=None)
@given(writes)
async def test_staging_a_write_is_preparing_each_value(
    changes: list[tuple[bytes, bytes | None, object]],
) -> None:
    """:func:`staging.stage_changes` gives the entries and pieces that preparing each
    value alone gives, and refuses a priority that path refuses."""
    try:
        plain = await _plain(changes)
    except InvalidArgumentError:
        with pytest.raises(InvalidArgumentError):
            await staging.stage_changes(_NO_OBJECTS, changes, Priority.EAGER)  # type: ignore[arg-type]
        return
    prepared, stamps, pieces_of, staged = await staging.stage_changes(
        _NO_OBJECTS,
        changes,  # type: ignore[arg-type]
        Priority.EAGER,
    )
    assert not stamps and not staged
    assert [(k, _staged(e)) for k, e in prepared] == plain[0]
    assert {d: [(p.digest, p.data) for p in ps] for d, ps in pieces_of.items()} == plain[1]
    for _, entry in prepared:
        assert entry is None or (type(entry) is Entry and type(entry.priority) is Priority)


@settings(max_examples=50, deadline=None)
@given(st.dictionaries(st.binary(min_size=1, max_size=33), st.integers(1, 3), max_size=8))
async def test_every_value_live_is_none(sizes: dict[bytes, int]) -> None:
    """``only_live`` of None takes what it takes when given every value's digest."""
    pieces_of = {d: [split.Piece(d + bytes([i]), b"x") for i in range(n)] for d, n in sizes.items()}
    everything = await staging.only_live(_NO_OBJECTS, set(sizes), pieces_of, {})
    fast = await staging.only_live(_NO_OBJECTS, None, pieces_of, {})
    assert sorted(fast[0]) == sorted(everything[0]) and fast[1] == everything[1] == []


async def test_a_reader_during_a_sliced_commit_sees_the_state_before_or_after() -> None:
    """A big write's commit gives the loop turns while its tree is built; a reader
    meanwhile sees the whole old state until the commit is stored, then the whole new
    one: never some keys old and others new."""
    n = 1500  # a direct write (graph.DIRECT_BATCH): one commit of its own
    names = [b"k%05d" % i for i in range(n)]
    with tempfile.TemporaryDirectory() as d, _deep_and_sliced(btree.LEVEL_BITS, 64):
        async with await Repository.open(Path(d) / "r") as repo:
            page = await repo.ledger("l").page("p")
            await page.write([(k, b"old-" + k) for k in names])
            await page.flush()
            writing = asyncio.create_task(page.write([(k, b"new-" + k) for k in names]))
            seen: list[bool] = []  # each read: the key is new
            i = mid_commit = 0
            while not writing.done():
                mid_commit += page.graph.lock.locked()
                value = await page.get(names[i % n])
                seen.append(value == b"new-" + names[i % n])
                i += 997  # keys all over the tree
                await asyncio.sleep(0)  # (a read served from memory does not yield)
            await writing
            assert mid_commit > 3  # the commit gave the reader turns
            first_new = seen.index(True) if True in seen else len(seen)
            assert not any(seen[:first_new]) and all(seen[first_new:])
            listed = (await page.entries(limit=n)).items
            assert [(x[0], x[1]) for x in listed] == [(k, b"new-" + k) for k in names]


@settings(max_examples=100, deadline=None)
@given(st.lists(keys, unique=True, max_size=300), st.integers(1, 9), st.integers(2, 4))
def test_keys_sorted_in_slices_are_sorted(
    batch: list[bytes], slice_entries: int, runs: int
) -> None:
    """A big batch's keys are sorted a slice at a time, then merged a few runs at a time."""
    saved = builder.SLICE_ENTRIES, builder.MERGE_RUNS
    builder.SLICE_ENTRIES, builder.MERGE_RUNS = slice_entries, runs
    try:
        got = asyncio.run(Builder(NodeStore(MemoryNodes()))._sorted(dict.fromkeys(batch)))
    finally:
        builder.SLICE_ENTRIES, builder.MERGE_RUNS = saved
    assert got == sorted(batch)


async def test_a_paused_collector_still_collects_young_objects_when_asked() -> None:
    """During a big batch the collector is paused, but the young generation is collected
    every ``young_every`` on the event loop, so that what the batch keeps is not left to
    one long pass after it; the pause then ends and the timer with it."""
    import gc

    from ledgerd.store import collector_paused

    collected = asyncio.Event()

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "stop" and info["generation"] == 0:
            collected.set()

    assert gc.isenabled()
    gc.callbacks.append(seen)
    try:
        with collector_paused(0.001):
            assert not gc.isenabled()
            await asyncio.wait_for(collected.wait(), 30)
            with collector_paused(0.001):  # nested: no second timer, still paused
                assert not gc.isenabled()
            assert not gc.isenabled()
        assert gc.isenabled()
    finally:
        gc.callbacks.remove(seen)
    assert gc.isenabled()


async def test_a_big_writes_objects_are_released_a_slice_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What a committed big write held is emptied in slices, a turn of the loop between:
    another task runs before the last slice is freed."""
    monkeypatch.setattr(staging, "RELEASE_SLICE", 3)
    held: list[Any] = list(range(10))
    by_key: dict[Any, Any] = {i: str(i) for i in range(8)}
    seen: list[tuple[int, int]] = []

    async def other() -> None:
        seen.append((len(held), len(by_key)))

    task = asyncio.ensure_future(other())
    await staging.released(held, by_key)
    await task
    assert held == [] and by_key == {}
    assert seen and seen[0][0] < 10  # it ran while the release was under way
