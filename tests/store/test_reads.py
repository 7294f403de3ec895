"""The read path: the repository's one read cache, and reads inline on the event loop."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from ledgerd.store import CorruptObjectError, InvalidArgumentError, Page, Priority, Repository
from ledgerd.store.page import page as store_page
from ledgerd.store.pieces.cache import Cache, CacheSpace


def _rows(n: int, tag: bytes) -> list[tuple[bytes, bytes]]:
    return [(tag + b"%06d" % i, (tag + b"%06d" % i) * 20) for i in range(n)]


async def _fill(page: Page, rows: list[tuple[bytes, bytes]]) -> None:
    for i in range(0, len(rows), 500):
        async with page.transaction() as txn:
            for k, v in rows[i : i + 500]:
                await txn.put(k, v)


def _clear(page: Page) -> None:
    page.nodes.clear_cache()
    page.objects.clear_cache()


def test_cache_keeps_the_most_recent_within_its_budget() -> None:
    cache = Cache(1000)
    a: CacheSpace[str] = cache.space()
    b: CacheSpace[str] = cache.space()
    a.put(b"x", "ax", 400)
    b.put(b"x", "bx", 400)  # same digest, another space: another entry
    assert a.get(b"x") == "ax" and b.get(b"x") == "bx"
    a.get(b"x")  # now the most recent
    a.put(b"y", "ay", 400)  # over budget: b's entry, the least recent, goes
    assert b.get(b"x") is None and a.get(b"x") == "ax" and a.get(b"y") == "ay"
    assert cache.used == 800
    a.put(b"z", "big", 1001)  # larger than the whole budget: not kept, nothing evicted
    assert a.get(b"z") is None and cache.used == 800
    a.clear()
    assert cache.used == 0 and len(cache) == 0


async def test_pages_share_one_bounded_cache(tmp_path: Path) -> None:
    budget = 400 * 1024
    async with await Repository.open(tmp_path / "data", cache_bytes=budget) as repo:
        a = await repo.ledger("l").page("a")
        b = await repo.ledger("l").page("b")
        rows_a, rows_b = _rows(3000, b"a"), _rows(3000, b"b")
        await _fill(a, rows_a)
        await _fill(b, rows_b)
        for page in (a, b):
            assert page.nodes.cache.cache is repo.cache
            assert page.objects.cache.cache is repo.cache
        digests_a = [e.value async for e in a.iter_entries()]
        # Reading all of a fills the cache with a's nodes and values...
        assert [kv.value for kv in (await a.entries()).items] == [v for _, v in rows_a]
        assert 0 < repo.cache.used <= budget
        held_by_a = sum(d in a.objects.cache for d in digests_a)
        assert held_by_a > 0
        # ... and reading all of b, under the same budget, evicts them.
        assert [kv.value for kv in (await b.entries()).items] == [v for _, v in rows_b]
        assert 0 < repo.cache.used <= budget
        assert sum(d in a.objects.cache for d in digests_a) < held_by_a
        # A piece cached for one page is not another's: b does not store a's values.
        digest = (await a.get_entry(rows_a[0][0])).value  # type: ignore[union-attr]
        await a.get(rows_a[0][0])
        assert digest in a.objects.cache and digest not in b.objects.cache


async def test_commits_keep_the_live_tree_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Random-key transactions rewrite most leaves; the versions they replace go first
    when the cache is full, so a cache that holds the live tree never reads a node
    back from SQLite for the next commit (it evicted untouched live leaves before)."""
    reads = 0
    real = store_page._Nodes.read_node_bytes

    async def counting(self: Any, digest: bytes) -> bytes:
        nonlocal reads
        reads += 1
        return await real(self, digest)

    monkeypatch.setattr(store_page._Nodes, "read_node_bytes", counting)
    rng = random.Random(5)
    async with await Repository.open(tmp_path / "data", cache_bytes=12 * 1024 * 1024) as repo:
        page = await repo.ledger("l").page("p")
        for _ in range(40):
            async with page.transaction() as txn:
                await txn.put_many([(rng.randbytes(16), rng.randbytes(40)) for _ in range(500)])
        assert reads == 0
        assert repo.cache.used <= 12 * 1024 * 1024


async def test_negative_cache_budget_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError):
        await Repository.open(tmp_path / "data", cache_bytes=-1)


async def _corrupt(page: Page, digest: bytes) -> None:
    async with page.db.write() as conn:
        await conn.execute(
            "UPDATE objects SET data = zeroblob(length(data)) WHERE digest = ?", (digest,)
        )


async def test_a_piece_is_verified_when_it_enters_the_cache(page: Page) -> None:
    await page.put(b"k", b"v" * 200)
    await page.put(b"j", b"w" * 200)
    await page.flush()
    entry = await page.get_entry(b"k")
    assert entry is not None
    _clear(page)
    await _corrupt(page, entry.value)
    for _ in range(2):  # refused, and not kept: refused again
        with pytest.raises(CorruptObjectError):
            await page.get(b"k")
    assert entry.value not in page.objects.cache

    # Verified once: a piece read good is served from the cache with no trip to SQLite.
    assert await page.get(b"j") == b"w" * 200
    good = await page.get_entry(b"j")
    assert good is not None
    await _corrupt(page, good.value)
    reads = page.db.inline_reads + page.db.thread_reads
    assert await page.get(b"j") == b"w" * 200
    assert page.db.inline_reads + page.db.thread_reads == reads


async def test_a_corrupt_tree_node_is_detected_when_loaded(page: Page) -> None:
    await _fill(page, _rows(2000, b"k"))
    _clear(page)
    await _corrupt(page, page.head.root)
    with pytest.raises(CorruptObjectError):
        await page.get(b"k000001")
    assert page.nodes.cache.get(page.head.root) is None


async def test_point_reads_run_inline(page: Page) -> None:
    rows = _rows(2000, b"k")
    await _fill(page, rows)
    _clear(page)
    inline, thread = page.db.inline_reads, page.db.thread_reads
    for k, v in rows[::100]:
        assert await page.get(k) == v
    assert page.db.thread_reads == thread  # the nodes and the values: no trip to a thread
    assert page.db.inline_reads > inline


class _BusyOnce:
    """The inline read connection, answering SQLite's busy error to its first statement."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.refused = 0

    def execute(self, sql: str, params: Any = ()) -> sqlite3.Cursor:
        if not self.refused:
            self.refused += 1
            e = sqlite3.OperationalError("database is locked")
            e.sqlite_errorcode = sqlite3.SQLITE_BUSY
            raise e
        return self.conn.execute(sql, params)

    def close(self) -> None:
        self.conn.close()


async def test_an_inline_read_takes_the_thread_when_busy(page: Page) -> None:
    await page.put(b"k", b"v" * 100)
    await page.flush()
    _clear(page)
    real = page.db.inline_reader
    assert real is not None
    busy = _BusyOnce(real)
    page.db.inline_reader = busy  # type: ignore[assignment]
    thread = page.db.thread_reads
    assert await page.get(b"k") == b"v" * 100
    assert busy.refused == 1
    assert page.db.thread_reads == thread + 1  # the refused read, on the reader's thread


async def test_a_large_value_read_is_not_cached(page: Page) -> None:
    rng = random.Random(7)
    big = rng.randbytes(2 * 1024 * 1024)  # over CACHE_VALUE_LIMIT
    small = rng.randbytes(300_000)  # several chunks, under the limit
    await page.put(b"big", big)
    await page.put(b"small", small)
    await page.flush()
    _clear(page)
    assert await page.get(b"big") == big
    assert page.objects.cache.cache.used < 100_000  # its index piece at most
    assert await page.get(b"small") == small
    assert page.objects.cache.cache.used > 300_000  # its chunks stay


def test_get_many_answers_like_get_and_marks_what_it_found_used() -> None:
    cache = Cache(1000)
    a: CacheSpace[str] = cache.space()
    b: CacheSpace[str] = cache.space()
    a.put(b"x", "ax", 300)
    a.put(b"y", "ay", 300)
    b.put(b"z", "bz", 300)
    found, missing = a.get_many([b"z", b"x", b"w"])  # z is b's, not a's
    assert found == {b"x": "ax"} and missing == [b"z", b"w"]
    a.put(b"v", "av", 300)  # over budget: y, the least recently used, goes (x was used)
    assert a.get(b"y") is None and a.get(b"x") == "ax"


async def test_scans_merge_a_transactions_writes_and_page_at_every_limit(page: Page) -> None:
    """Scans read a tree leaf by leaf (in runs), merge a transaction's own puts and
    deletes into them and skip the tombstones of deletes; every page of every limit
    continues exactly where the last stopped, whether a run ends there or not."""
    rng = random.Random(5)
    rows = _rows(1500, b"k")
    await _fill(page, rows)
    model = dict(rows)
    for k, _ in rng.sample(rows, 200):  # deletes of present keys, committed
        await page.delete(k)
        del model[k]
    await page.flush()
    for k in [b"k%06d" % i for i in rng.sample(range(3000), 100)]:  # some not there: tombstones
        await page.delete(k)
        model.pop(k, None)
    await page.flush()
    async with page.transaction() as txn:  # its writes: an overlay on its base
        for i in rng.sample(range(3000), 150):
            k = b"k%06d" % i
            if rng.random() < 0.3:
                await txn.delete(k)
                model.pop(k, None)
            else:
                await txn.put(k, b"new" + k)
                model[k] = b"new" + k
        want = sorted(model.items())
        got = await txn.entries()
        assert [(kv.key, kv.value) for kv in got.items] == want and got.token is None
        assert [e.key async for e in txn.iter_entries(start=b"k000500", end=b"k001000")] == [
            k for k, _ in want if b"k000500" <= k < b"k001000"
        ]
        for limit in (1, 7, 64, 99, 100, 1000, len(want), len(want) + 1):
            seen: list[bytes] = []
            token = None
            while True:
                res = await txn.keys(limit=limit, token=token)
                assert 0 < len(res.items) <= limit
                seen.extend(res.items)
                token = res.token
                if token is None:
                    break
            assert seen == [k for k, _ in want], limit
    assert [(kv.key, kv.value) for kv in (await page.entries()).items] == want


async def test_scan_results_are_tuples_with_an_enum_priority(page: Page) -> None:
    await page.put(b"a", b"1", priority=Priority.LAZY)
    await page.put(b"b", b"2")
    items = (await page.entries()).items
    assert items == [(b"a", b"1", 1), (b"b", b"2", 0)]
    assert [type(kv.priority) for kv in items] == [Priority, Priority]
    assert [kv.priority for kv in items] == [Priority.LAZY, Priority.EAGER]
