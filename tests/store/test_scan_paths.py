"""A scan's values: the column-wise cache lookups and ordered reads against plain paths.

``CacheSpace.get_each`` and ``peek_each`` (batches of lookups by ``map``; a peek leaves
the order alone) and ``put_many`` against a model LRU; ``ObjectStore.read_each`` (a
scan's values in order, the cached ones found in one pass) against reading each value
alone; and a scan still verifies what it reads from SQLite."""

from __future__ import annotations

import tempfile
from collections import OrderedDict
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledgerd.store import Page, Repository
from ledgerd.store.errors import CorruptObjectError
from ledgerd.store.pieces.cache import Cache, CacheSpace
from ledgerd.store.pieces.objects import ObjectStore

_digests = st.sampled_from([bytes([i]) * 3 for i in range(8)])
_ops = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.integers(0, 1), _digests, st.integers(0, 500)),
        st.tuples(
            st.just("put_many"),
            st.integers(0, 1),
            st.lists(st.tuples(_digests, st.integers(0, 500)), max_size=5),
        ),
        st.tuples(st.just("get"), st.integers(0, 1), _digests),
        st.tuples(st.just("each"), st.integers(0, 1), st.lists(_digests, max_size=6)),
        st.tuples(st.just("peek"), st.integers(0, 1), st.lists(_digests, max_size=6)),
        st.tuples(st.just("many"), st.integers(0, 1), st.lists(_digests, max_size=6)),
        st.tuples(st.just("demote"), st.integers(0, 1), st.lists(_digests, max_size=3)),
        st.tuples(st.just("clear"), st.integers(0, 1)),
    ),
    max_size=60,
)


class _ModelLRU:
    """The plain LRU the cache stands for: one ordered dict over ``(space, digest)``."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.entries: OrderedDict[tuple[int, bytes], tuple[str, int]] = OrderedDict()

    def used(self) -> int:
        return sum(c for _, c in self.entries.values())

    def put(self, key: tuple[int, bytes], value: str, cost: int) -> None:
        self.entries.pop(key, None)
        if cost > self.budget:
            return
        self.entries[key] = (value, cost)
        while self.used() > self.budget:
            self.entries.popitem(last=False)

    def get(self, key: tuple[int, bytes]) -> str | None:
        if key not in self.entries:
            return None
        self.entries.move_to_end(key)
        return self.entries[key][0]

    def peek(self, key: tuple[int, bytes]) -> str | None:
        return self.entries[key][0] if key in self.entries else None


@settings(max_examples=200, deadline=None)
@given(_ops)
def test_batched_lookups_keep_the_cache_a_plain_lru(ops: list[tuple[object, ...]]) -> None:
    cache = Cache(1000)
    spaces: list[CacheSpace[str]] = [cache.space(), cache.space()]
    model = _ModelLRU(1000)
    for n, op in enumerate(ops):
        kind, s = op[0], int(op[1])  # type: ignore[call-overload]
        space = spaces[s]
        if kind == "put":
            d, cost = op[2], op[3]
            space.put(d, f"v{n}", cost)
            model.put((s, d), f"v{n}", cost)  # type: ignore[arg-type]
        elif kind == "put_many":
            items: list[tuple[bytes, int]] = op[2]  # type: ignore[assignment]
            space.put_many([(d, f"v{n}.{i}", c) for i, (d, c) in enumerate(items)])
            for i, (d, c) in enumerate(items):
                model.put((s, d), f"v{n}.{i}", c)
        elif kind == "get":
            assert space.get(op[2]) == model.get((s, op[2]))  # type: ignore[arg-type]
        elif kind == "each":
            want: list[bytes] = op[2]  # type: ignore[assignment]
            assert space.get_each(want) == [model.get((s, d)) for d in want]
        elif kind == "peek":  # a bulk read's lookups: found, the LRU order left alone
            want = op[2]  # type: ignore[assignment]
            assert space.peek_each(want) == [model.peek((s, d)) for d in want]
        elif kind == "many":
            want = op[2]  # type: ignore[assignment]
            found, missing = space.get_many(want)
            expected = [(d, model.get((s, d))) for d in want]
            assert found == {d: v for d, v in expected if v is not None}
            assert missing == [d for d, v in expected if v is None]
        elif kind == "demote":
            space.demote(op[2])
            for d in op[2]:  # type: ignore[attr-defined]
                if (s, d) in model.entries:
                    model.entries.move_to_end((s, d), last=False)
        else:
            space.clear()
            for key in [k for k in model.entries if k[0] == s]:
                del model.entries[key]
        assert cache.used == model.used() and len(cache) == len(model.entries)
        for s2, d in model.entries:
            assert d in spaces[s2]
        assert sum(d in sp for sp in spaces for d in {bytes([i]) * 3 for i in range(8)}) == len(
            model.entries
        )


_values = st.one_of(
    st.binary(max_size=32),  # inline
    st.binary(min_size=33, max_size=200),  # one hashed piece
    st.integers(0, 3).map(lambda i: bytes([i]) * 70_000),  # several pieces (an index)
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(_values, min_size=1, max_size=12),
    st.lists(st.integers(0, 11), max_size=20),
    st.sampled_from(["none", "some", "all"]),
)
async def test_read_each_gives_what_reading_each_alone_gives(
    values: list[bytes], picks: list[int], cached: str
) -> None:
    """Values in order, duplicates and all, whatever part of them is cached."""
    with tempfile.TemporaryDirectory() as d:
        repo = await Repository.open(Path(d) / "r")
        try:
            page = await repo.ledger("l").page("p")
            objects: ObjectStore = page.objects
            digests = [(await objects.put_value(v, "Ia")).digest for v in values]
            order = [digests[i % len(digests)] for i in picks] + digests
            alone = [await objects.read_all(x) for x in order]
            objects.clear_cache()
            if cached != "none":
                await objects.read_many(digests[:: 1 if cached == "all" else 2])
            assert await objects.read_each(order) == alone
            assert await objects.read_many(order) == dict(zip(order, alone, strict=True))
        finally:
            await repo.close()


async def test_a_scan_verifies_each_value_it_reads_from_sqlite(page: Page) -> None:
    """The damaged value in the second of three batches is refused, the third's query
    (read meanwhile) dropped; the values before it are read."""
    rows = [(b"k%04d" % i, b"value %04d " % i * 16) for i in range(1000)]
    async with page.transaction() as txn:
        await txn.put_many(rows)
    await page.flush()
    victim = (await page.get_entry(rows[523][0])).value  # type: ignore[union-attr]
    async with page.objects.db.write() as conn:
        await conn.execute("UPDATE objects SET data = ? WHERE digest = ?", (b"x" * 176, victim))
    page.objects.clear_cache()
    with pytest.raises(CorruptObjectError, match="does not match its digest"):
        await page.entries()
    assert [kv.value for kv in (await page.entries(end=rows[523][0])).items] == [
        v for _, v in rows[:523]
    ]


async def test_a_bulk_reads_hits_keep_their_place_in_the_lru(page: Page) -> None:
    """Values a scan finds cached are not moved to the recent end; point reads are."""
    objects: ObjectStore = page.objects
    a, b = [(await objects.put_value(bytes([i]) * 200, "Ia")).digest for i in (1, 2)]
    objects.clear_cache()
    await objects.read_all(b)
    await objects.read_all(a)  # a is the most recent
    order = objects.cache.cache._order
    assert await objects.read_each([b, a, b]) == [bytes([2]) * 200, bytes([1]) * 200] + [
        bytes([2]) * 200
    ]
    assert [entry[2] for entry in order.values()][-2:] == [b, a]
    await objects.read_all(b)
    assert [entry[2] for entry in order.values()][-2:] == [a, b]


@pytest.mark.parametrize("sizes", [(0, 128), (0, 200_000)], ids=["inline", "mixed"])
async def test_a_scan_of_values_carried_in_the_leaves_reads_them_from_the_leaves(
    page: Page, sizes: tuple[int, int]
) -> None:
    """Values of up to INLINE_LIMIT bytes are in their digests: a warm scan of them makes
    no SQLite call; beside pieces (one of many pieces too), each value is exact."""
    rows = [(b"k%04d" % i, b"%d" % i * (1 + i % 40)) for i in range(1000)]
    rows = [(k, v[: sizes[1]]) for k, v in rows]  # up to 128 bytes each
    if sizes[1] > 128:
        rows[10] = (rows[10][0], b"a piece " * 40)
        rows[500] = (rows[500][0], bytes(range(256)) * 800)  # several pieces
    async with page.transaction() as txn:
        await txn.put_many(rows)
    await page.flush()
    assert [(kv.key, kv.value) for kv in (await page.entries()).items] == rows
    reads = page.db.inline_reads + page.db.thread_reads
    assert [(kv.key, kv.value) for kv in (await page.entries()).items] == rows
    if sizes[1] <= 128:
        assert page.db.inline_reads + page.db.thread_reads == reads
