"""The fast paths of staging a write agree with the plain path (store/page/staging.py).

Plain writes stage a value of one chunk through :func:`staging.one_chunk`, and
:meth:`Transaction.put_many` writes those lines out in its loop; both are fast paths of
:func:`staging.prepare`, the one plain path. These properties hold them to it.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any, cast

from hypothesis import given, settings
from hypothesis import strategies as st

from ledgerd.store import Repository
from ledgerd.store.errors import InvalidArgumentError
from ledgerd.store.page import staging
from ledgerd.store.page.stamps import STAMPED_VALUE_LIMIT
from ledgerd.store.pieces import split
from ledgerd.store.pieces.objects import ObjectStore
from ledgerd.store.tree.btree import Priority

_NO_OBJECTS = cast(ObjectStore, None)  # a value of one chunk never reaches the object store

one_chunk_values = st.binary(max_size=split.MIN_CHUNK)
priorities = st.one_of(
    st.sampled_from([Priority.EAGER, Priority.LAZY, 0, 1]),
    st.integers(-3, 5),
    st.none(),
    st.text(max_size=2),
    st.floats(allow_nan=False),
)


def test_a_stamped_value_is_split_in_memory() -> None:
    assert STAMPED_VALUE_LIMIT <= staging.SMALL_VALUE


def _plain(key: bytes, value: bytes, prio: object) -> Any:
    entry, pieces, token = asyncio.run(staging.prepare(_NO_OBJECTS, key, value, prio))
    return _staged(entry), [tuple(p) for p in pieces], token


def _staged(entry: tuple[Any, ...]) -> tuple[Any, ...]:
    """An entry being staged: key, value digest, priority (a staged entry has no dot)."""
    assert entry[3:] in ((), (b"",))
    return tuple(entry[:3])


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64), one_chunk_values, priorities)
def test_one_chunk_is_prepare(key: bytes, value: bytes, prio: object) -> None:
    """A value of one chunk gives the same entry and pieces either way, and a priority
    one path refuses, the other refuses too."""
    try:
        plain = _plain(key, value, prio)
    except InvalidArgumentError:
        try:
            staging.one_chunk(key, value, prio)
        except InvalidArgumentError:
            return
        raise AssertionError("one_chunk accepted a priority prepare refuses") from None
    entry, piece = staging.one_chunk(key, value, prio)
    assert (_staged(entry), [] if piece is None else [tuple(piece)], None) == plain
    assert entry.priority is plain[0][2]


items = st.lists(
    st.tuples(
        st.binary(min_size=1, max_size=8),
        st.one_of(one_chunk_values, st.binary(min_size=split.MIN_CHUNK + 1, max_size=3 * 65536)),
    ),
    max_size=12,
)


@settings(max_examples=20, deadline=None)
@given(items, st.sampled_from([Priority.EAGER, Priority.LAZY]), st.integers(0, 4096))
async def test_put_many_is_prepare(
    puts: list[tuple[bytes, bytes]], prio: Priority, budget: int
) -> None:
    """Transaction.put_many, whose loop holds the one-chunk fast path, leaves the entries,
    in-memory pieces and budget that the plain path (Transaction._prepare per value)
    leaves, whatever the memory budget."""
    with tempfile.TemporaryDirectory() as d:
        async with await Repository.open(Path(d)) as repo:
            page = await repo.ledger("l").page("p")
            fast, plain = page.transaction(), page.transaction()
            for txn in (fast, plain):
                await txn.start()
                txn._txns.memory_budget = budget
            await fast.put_many(puts, prio)
            for key, value in puts:
                plain.state.entries[key] = await plain._prepare(key, value, prio)
            assert {
                k: None if e is None else _staged(e) for k, e in fast.state.entries.items()
            } == {k: None if e is None else _staged(e) for k, e in plain.state.entries.items()}
            assert {k: [tuple(p) for p in v] for k, v in fast.state.pieces.items()} == {
                k: [tuple(p) for p in v] for k, v in plain.state.pieces.items()
            }
            assert fast.state.memory == plain.state.memory
            assert sorted(fast.state.staged.values()) == sorted(plain.state.staged.values())
            await fast.rollback()
            await plain.rollback()
