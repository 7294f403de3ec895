"""The embedded page API: writes, reads, ranges, snapshots, transactions, watchers."""

from __future__ import annotations

import asyncio
import random
import sqlite3
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledgerd.store import (
    OFF_LOOP_BYTES,
    AmbiguousCommitError,
    ClosedError,
    CommitNotFoundError,
    InvalidArgumentError,
    KeyNotFoundError,
    KeyTooLargeError,
    NameTooLargeError,
    Page,
    Priority,
    Repository,
    StorageError,
    TransactionClosedError,
    Versionstamp,
)
from ledgerd.store.keys import tuple as tuple_layer
from ledgerd.store.page import exchange
from ledgerd.store.page import page as store_page
from ledgerd.store.page import writer as store_writer
from ledgerd.store.page.page import SMALL_VALUE, Notification
from ledgerd.store.page.writer import JournalWriter
from ledgerd.store.sqlite import db as store_db
from ledgerd.store.sqlite.schema import LOCAL, TRANSIENT
from ledgerd.store.tree import commit as commit_mod
from ledgerd.store.tree.merge import Choice, MergeRequest, Policy
from tests.store.resolvers import set_resolver


async def _count(page: Page, sql: str) -> int:
    return int((await page.db.read_all(sql))[0][0])


async def _garbage(page: Page) -> int:
    """Pieces that are transient and staged by no open journal."""
    return await _count(
        page,
        f"SELECT count(*) FROM piece_status WHERE status = {TRANSIENT} "
        "AND digest NOT IN (SELECT digest FROM journal_pieces)",
    )


async def test_put_get_delete_clear(page: Page) -> None:
    await page.put(b"a", b"1")
    await page.put(b"b", b"x" * 5000, Priority.LAZY)
    assert await page.get(b"a") == b"1"
    assert await page.get(b"b") == b"x" * 5000
    assert (await page.get_entry(b"b")).priority is Priority.LAZY  # type: ignore[union-attr]
    assert await page.get_range(b"b", 4990, 100) == b"x" * 10
    assert await page.size(b"b") == 5000
    await page.delete(b"a")
    with pytest.raises(KeyNotFoundError):
        await page.get(b"a")
    await page.delete(b"never-there")
    await page.clear()
    assert (await page.keys()).items == []
    await page.flush()
    assert len(await page.heads()) == 1


async def test_binary_keys_and_empty_values(page: Page) -> None:
    keys = [b"", b"\x00", b"\x00\x00", b"\xff\xfe", "ключ".encode()]
    for k in keys:
        await page.put(k, b"")
    assert (await page.keys()).items == sorted(keys)
    assert await page.get(b"\x00") == b""


async def test_streamed_value_and_file(page: Page, tmp_path: Path) -> None:
    async def gen() -> AsyncIterator[bytes]:
        for i in range(20):
            yield bytes([i]) * 100_000

    await page.put(b"big", gen())
    want = b"".join(bytes([i]) * 100_000 for i in range(20))
    assert await page.size(b"big") == len(want)
    assert (
        b"".join([b async for b in await page.read(b"big", 150_000, 100_000)])
        == want[150_000:250_000]
    )
    f = tmp_path / "v"
    f.write_bytes(b"from a file")
    await page.put(b"file", f)
    assert await page.get(b"file") == b"from a file"


async def test_limits_give_clear_errors(repo: Repository, page: Page) -> None:
    with pytest.raises(KeyTooLargeError, match="4096"):
        await page.put(b"k" * 4097, b"v")
    await page.put(b"k" * 4096, b"v")
    with pytest.raises(NameTooLargeError):
        repo.ledger("l" * 129)
    with pytest.raises(NameTooLargeError):
        await repo.ledger("ok").page(b"p" * 129)
    with pytest.raises(InvalidArgumentError):
        repo.ledger("")
    with pytest.raises(InvalidArgumentError):
        await page.put("text-key", b"v")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        await page.put(b"k", 12)  # type: ignore[arg-type]
    assert (await page.keys()).items == [b"k" * 4096]


async def test_concurrent_writes_share_commits(page: Page) -> None:
    before = len(await page.history(10_000))
    await asyncio.gather(*[page.put(b"k%03d" % i, b"v%d" % i) for i in range(200)])
    # Every acknowledged write is readable at once, committed or not.
    assert len((await page.keys()).items) == 200
    await page.flush()
    commits = len(await page.history(10_000)) - before
    assert 1 <= commits <= 3
    assert await page.get(b"k123") == b"v123"


async def test_back_to_back_puts_append_themselves_and_share_commits(
    page: Page, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A put that finds nothing queued appends itself to the journal (no round of
    the worker per put); the worker still commits once writes pause, in one commit."""
    rounds = 0
    real_round = JournalWriter._round

    async def counting(self: JournalWriter) -> None:
        nonlocal rounds
        rounds += 1
        await real_round(self)

    monkeypatch.setattr(JournalWriter, "_round", counting)
    before = len(await page.history(10_000))
    watcher = page.watch()
    for i in range(300):
        await page.put(b"s%03d" % i, b"v%d" % i)

    def uncommitted() -> bool:
        return page.writer.uncommitted

    # One small write in INLINE_ROUND takes the writer's thread (whose commits
    # checkpoint the WAL): that one, and only that one, goes through the worker.
    turns = 300 // store_db.INLINE_ROUND
    assert turns <= rounds <= turns + 1 and uncommitted()
    assert len((await page.keys(prefix=b"s")).items) == 300  # acknowledged: readable
    await asyncio.wait_for(watcher.__anext__(), 10)  # the worker committed after the pause
    assert not uncommitted()
    assert 1 <= len(await page.history(10_000)) - before <= 3
    assert await page.get(b"s299") == b"v299"


async def test_writes_that_appended_themselves_are_committed_at_close(tmp_path: Path) -> None:
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr(store_writer, "COMMIT_DELAY", 3600)  # no pause commits them
    try:
        async with await Repository.open(tmp_path) as repo:
            page = await repo.ledger("l").page("p")
            for i in range(50):
                await page.put(b"k%02d" % i, b"v")
            assert page.writer.uncommitted
            db = page.db.path
    finally:
        monkeypatch.undo()
    conn = sqlite3.connect(db)
    try:  # committed as the page closed, not left for the next open to recover
        assert conn.execute("SELECT count(*) FROM journals").fetchone()[0] == 0
    finally:
        conn.close()
    async with await Repository.open(tmp_path) as repo:
        page = await repo.ledger("l").page("p")
        assert len((await page.keys()).items) == 50


async def test_batch_write_is_one_commit(page: Page) -> None:
    await page.put(b"gone", b"x")
    await page.flush()
    before = page.head.id
    await page.write([(b"a", b"1"), (b"b", b"2"), (b"gone", None)])
    await page.flush()
    assert page.head.parents == (before,)
    assert (await page.keys()).items == [b"a", b"b"]


@pytest.mark.parametrize("n", [10, 2000])  # through the journal; a direct commit
async def test_shared_value_is_stored_once(page: Page, n: int) -> None:
    value = b"shared" * 40  # one piece, not inline
    await page.write([(b"k%05d" % i, value) for i in range(n)])
    async with page.transaction() as txn:
        for i in range(n, n + 10):
            await txn.put(b"k%05d" % i, value)
    await page.flush()
    rows = await page.db.read_all(
        "SELECT count(*), min(status) FROM piece_status WHERE data = ?",
        (value,),
    )
    assert tuple(rows[0]) == (1, LOCAL)  # one row, local
    assert await _garbage(page) == 0
    assert await page.get(b"k00003") == value and await page.get(b"k%05d" % (n + 9)) == value


async def test_transaction_values_around_the_piece_limits(page: Page) -> None:
    sizes = [0, 32, 33, 4096, 4097, 70_000]  # inline, one piece, split in memory
    values = {b"s%d" % n: random.Random(n).randbytes(n) for n in sizes}
    async with page.transaction() as txn:
        for k, v in values.items():
            await txn.put(k, v)
        assert [await txn.get(k) for k in values] == list(values.values())
    for k, v in values.items():
        assert await page.get(k) == v
    assert await _garbage(page) == 0


async def test_random_page_id_and_listing(repo: Repository) -> None:
    ledger = repo.ledger(b"\x00bin\xff")
    p1 = await ledger.page()
    p2 = await ledger.page()
    assert p1.id != p2.id and len(p1.id) == 16
    assert sorted(await ledger.pages()) == sorted([p1.id, p2.id])
    assert b"\x00bin\xff" in await repo.ledgers()


async def test_reopen_keeps_data_and_records_usage(tmp_path: Path) -> None:
    async with await Repository.open(tmp_path) as repo:
        page = await repo.ledger("l").page("p")
        assert await repo.usage_of("l", "p") == 0
        await page.put(b"k", b"v")
        device = repo.device_id
        await page.close()
        await asyncio.gather(*repo._closing)
        assert (await repo.usage_of("l", "p") or 0) > 0
    async with await Repository.open(tmp_path) as repo:
        assert repo.device_id == device and len(device) == 16
        page = await repo.ledger("l").page("p")
        assert await page.get(b"k") == b"v"


async def test_snapshots_read_past_commits(page: Page) -> None:
    await page.put(b"k", b"one")
    await page.flush()
    first = page.head.id
    await page.put(b"k", b"two")
    await page.put(b"other", b"x")
    await page.flush()
    snap = await page.snapshot(first)
    assert await snap.get(b"k") == b"one"
    assert (await snap.keys()).items == [b"k"]
    assert await (await page.snapshot()).get(b"k") == b"two"
    empty = await page.snapshot(commit_mod.FIRST.id)
    assert (await empty.keys()).items == []
    with pytest.raises(CommitNotFoundError):
        await page.snapshot(b"\x00" * 32)
    ids = [c.id for c in await page.history()]
    assert ids[-1] == commit_mod.FIRST.id and first in ids


async def test_a_commit_is_found_by_any_unique_prefix(page: Page) -> None:
    """As git: a commit id's unique prefix of 4 digits or more names it (``log`` prints
    12 digits); one that several commits start with, or none, is refused."""
    seen: dict[str, bytes] = {}
    while True:  # commits until two share their first 4 digits (a few hundred)
        await page.put(b"k", b"%d" % len(seen))
        await page.flush()
        cid = page.head.id
        if cid.hex()[:4] in seen:
            break
        seen[cid.hex()[:4]] = cid
    other = seen[cid.hex()[:4]]
    # The shortest prefix that tells the two apart (5 digits, unless they share a 5th).
    pairs = enumerate(zip(cid.hex(), other.hex(), strict=True))
    unique = next(i for i, (x, y) in pairs if x != y) + 1
    for n in (12, unique, 64):
        assert await page.find_commit(cid.hex()[:n]) == cid
    assert await page.find_commit(cid.hex()[:12].upper()) == cid
    assert await (await page.snapshot(await page.find_commit(other.hex()[:12]))).get(b"k")
    with pytest.raises(AmbiguousCommitError, match="ambiguous") as e:
        await page.find_commit(cid.hex()[:4])
    assert cid.hex()[:8] in str(e.value) and other.hex()[:8] in str(e.value)
    assert await page.find_commit(commit_mod.FIRST.id.hex()[:6]) == commit_mod.FIRST.id
    taken = {*seen, commit_mod.FIRST.id.hex()[:4]}
    unknown = next(p for p in (f"{i:04x}" for i in range(65536)) if p not in taken)
    with pytest.raises(CommitNotFoundError):
        await page.find_commit(unknown + "0")
    for bad in ("abc", "xyz1", "0" * 65, "", "12 4"):
        with pytest.raises(InvalidArgumentError):
            await page.find_commit(bad)


# -- ranges -------------------------------------------------------------------

small_keys = st.binary(max_size=3)


@settings(max_examples=25, deadline=None)
@given(
    st.dictionaries(small_keys, st.binary(max_size=4), max_size=80),
    st.dictionaries(small_keys, st.one_of(st.none(), st.binary(max_size=4)), max_size=20),
    st.lists(
        st.tuples(
            st.one_of(st.none(), small_keys),
            st.one_of(st.none(), small_keys),
            st.one_of(st.none(), st.binary(max_size=2)),
            st.one_of(st.none(), st.integers(1, 7)),
        ),
        min_size=1,
        max_size=8,
    ),
)
async def test_ranges_equal_sorted_dict_slices(data, txn_edits, queries) -> None:
    with tempfile.TemporaryDirectory() as d:
        async with await Repository.open(Path(d)) as repo:
            page = await repo.ledger("l").page("p")
            await page.write(list(data.items()))
            txn = page.transaction()
            for k, v in txn_edits.items():
                if v is None:
                    await txn.delete(k)
                else:
                    await txn.put(k, v)
            in_txn = dict(data)
            for k, v in txn_edits.items():
                if v is None:
                    in_txn.pop(k, None)
                else:
                    in_txn[k] = v
            for view, model in ((page, data), (txn, in_txn)):
                for start, end, prefix, limit in queries:
                    want = [
                        (k, model[k])
                        for k in sorted(model)
                        if (start is None or k >= start)
                        and (end is None or k < end)
                        and (prefix is None or k.startswith(prefix))
                    ]
                    got: list[tuple[bytes, bytes]] = []
                    token = None
                    while True:
                        res = await view.entries(start, end, prefix, limit, token)
                        got.extend((kv.key, kv.value) for kv in res.items)
                        assert limit is None or len(res.items) <= limit
                        if res.token is None:
                            break
                        token = res.token
                    assert got == want
            await txn.rollback()


# -- transactions -------------------------------------------------------------


async def test_transaction_isolation_and_commit(page: Page) -> None:
    await page.put(b"a", b"base")
    async with page.transaction() as txn:
        await txn.put(b"a", b"txn")
        await txn.put(b"t", b"1")
        await page.put(b"plain", b"concurrent")  # lands while the transaction is open
        assert await txn.get(b"a") == b"txn"
        assert not await txn.contains(b"plain")  # the base is fixed
        assert await page.get(b"a") == b"base"  # not visible outside before commit
        assert not await page.contains(b"t")
    await page.flush()
    assert await page.get(b"a") == b"txn"
    assert await page.get(b"plain") == b"concurrent"
    assert len(await page.heads()) == 1  # the page moved: two heads, merged at once


async def test_transaction_on_moved_page_last_one_wins(page: Page) -> None:
    await page.put(b"k", b"base")
    t1 = page.transaction()
    t2 = page.transaction()
    await t1.put(b"k", b"first")
    await t1.put(b"only1", b"x")
    await t2.put(b"k", b"second")
    await t2.put(b"only2", b"y")
    await t1.commit()
    await t2.commit()  # later commit: wins on the shared key
    heads = await page.heads()
    assert len(heads) == 1 and heads[0].parents  # history is a line
    assert await page.get(b"k") == b"second"
    e = await page.get_entry(b"k")  # the first one's write stays, as a sibling
    assert e is not None and len(e.siblings) == 1 and page.conflict_count == 1
    assert await page.get(b"only1") == b"x" and await page.get(b"only2") == b"y"


async def test_rollback_leaves_no_trace(page: Page) -> None:
    await page.put(b"keep", b"v")
    await page.flush()
    objects_before = await _count(page, "SELECT count(*) FROM objects")
    commits_before = await _count(page, "SELECT count(*) FROM commits")
    rng = random.Random(1)
    with pytest.raises(RuntimeError):
        async with page.transaction() as txn:
            await txn.put(b"big", rng.randbytes(3_000_000))
            await txn.put(b"small", b"s" * 100)
            raise RuntimeError("application error")
    txn2 = page.transaction()
    await txn2.put(b"big2", rng.randbytes(1_000_000))
    await txn2.rollback()
    await page.objects.collect_garbage()
    assert await _count(page, "SELECT count(*) FROM objects") == objects_before
    assert await _count(page, "SELECT count(*) FROM commits") == commits_before
    assert await _count(page, "SELECT count(*) FROM journal_pieces") == 0
    assert await _garbage(page) == 0
    assert not await page.contains(b"big")


async def test_transaction_clear_and_empty_commit(page: Page) -> None:
    await page.write([(b"a", b"1"), (b"b", b"2")])
    async with page.transaction() as txn:
        await txn.clear()
        await txn.put(b"c", b"3")
        assert (await txn.keys()).items == [b"c"]
    assert (await page.keys()).items == [b"c"]
    head = page.head.id
    async with page.transaction() as txn:
        assert await txn.get(b"c") == b"3"  # nothing written: no commit
    assert page.head.id == head and txn.commit_id is None
    async with page.transaction() as txn:
        await txn.put(b"c", b"3")  # the same value is a write all the same: it is later
    assert page.head.id != head and txn.commit_id is not None


_STAMPED = tuple_layer.pack_with_versionstamp((Versionstamp.incomplete(),))


async def test_put_many_is_put_after_put(page: Page) -> None:
    """put_many gives the commit that the same puts one by one give: small values
    held, large ones staged, a later put of a key winning, a stamped value replaced."""
    big = bytes(range(256)) * (SMALL_VALUE // 256 + 1)
    items = [(b"a", b"1"), (b"big", big), (b"b", b"x" * 40), (b"a", b"2"), (b"s", b"plain")]
    async with page.transaction() as one:
        await one.set_versionstamped_value(b"s", _STAMPED)
        for k, v in items:
            await one.put(k, v, Priority.LAZY)
    want = await page.entries()
    await page.clear()
    async with page.transaction() as many:
        await many.set_versionstamped_value(b"s", _STAMPED)
        await many.put_many(items, Priority.LAZY)
    got = await page.entries()
    assert got.items == want.items and {e.priority for e in got.items} == {Priority.LAZY}
    assert (await page.get(b"a"), await page.get(b"big")) == (b"2", big)
    with pytest.raises(InvalidArgumentError):
        async with page.transaction() as bad:
            await bad.put_many([(b"k", b"v"), ("not bytes", b"v")])  # type: ignore[list-item]
    assert not await page.contains(b"k")  # the transaction failed as a whole


# -- watchers -----------------------------------------------------------------


async def _take(w: AsyncIterator[Notification], n: int) -> list[Notification]:
    return [await asyncio.wait_for(w.__anext__(), 10) for _ in range(n)]


async def test_watchers_order_prefix_and_one_per_commit(page: Page) -> None:
    everything = page.watch()
    users = page.watch(b"user/")
    for i in range(5):
        await page.put(b"user/%d" % i, b"v%d" % i)
        await page.flush()
    await page.put(b"other", b"x")
    await page.flush()
    async with page.transaction() as txn:
        for i in range(30):
            await txn.put(b"user/t%02d" % i, b"t")
        await txn.delete(b"user/0")
    notes = await _take(everything, 7)
    assert [n.changed[0].key for n in notes[:5]] == [b"user/%d" % i for i in range(5)]
    assert notes[5].changed[0].key == b"other"
    assert len(notes[6].changed) == 30 and notes[6].deleted == [b"user/0"]  # never split
    assert notes[6].commit == page.head.id
    unote = await _take(users, 6)
    assert [len(n.changed) for n in unote] == [1, 1, 1, 1, 1, 30]  # 'other' filtered out
    assert unote[0].changed[0].value == b"v0"
    everything.close()
    assert [n async for n in everything] == []


async def test_watcher_sees_merge_result(page: Page) -> None:
    await page.put(b"k", b"base")
    await page.flush()
    t1, t2 = page.transaction(), page.transaction()
    await t1.put(b"a", b"1")
    await t2.put(b"b", b"2")
    w = page.watch()
    await t1.commit()
    await t2.commit()
    notes = await _take(w, 2)
    assert [c.key for c in notes[0].changed] == [b"a"]
    assert [c.key for c in notes[1].changed] == [b"b"]  # the merge adds t2's change
    assert notes[1].commit == page.head.id


# -- crashes (in-process simulations; the SIGKILL test is test_crash.py) --------


async def test_implicit_journal_is_committed_on_next_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with await Repository.open(tmp_path) as repo:
        page = await repo.ledger("l").page("p")

        async def no_commit(self: JournalWriter) -> None:  # the process "dies" first
            return None

        monkeypatch.setattr(JournalWriter, "commit_journal", no_commit)
        await page.put(b"acked", b"value")
        await page.put(b"big", b"b" * 1_000_000)
        assert await page.get(b"acked") == b"value"
        assert len(await page.history()) == 1
        monkeypatch.undo()
        page.writer._reset()  # forget it in memory, as a crash would
        await page.close()
    async with await Repository.open(tmp_path) as repo:
        page = await repo.ledger("l").page("p")
        assert await page.get(b"acked") == b"value"
        assert await page.get(b"big") == b"b" * 1_000_000
        assert len(await page.history()) == 2
        assert await _count(page, "SELECT count(*) FROM journals") == 0


async def test_explicit_journal_is_discarded_on_next_open(tmp_path: Path) -> None:
    async with await Repository.open(tmp_path) as repo:
        page = await repo.ledger("l").page("p")
        txn = page.transaction()
        await txn.put(b"big", b"z" * 2_000_000)
        assert await _count(page, "SELECT count(*) FROM journal_pieces") > 0
        await page.close()  # no commit, no rollback: as if the process died
    async with await Repository.open(tmp_path) as repo:
        page = await repo.ledger("l").page("p")
        assert not await page.contains(b"big")
        assert await _count(page, "SELECT count(*) FROM journal_pieces") == 0
        assert await _count(page, "SELECT count(*) FROM objects") == 0


async def test_close_idle_spares_pages_in_use(repo: Repository) -> None:
    ledger = repo.ledger("idle")
    leased, watched, in_txn, pending, idle = [await ledger.page(n) for n in "lwtpi"]
    for p in (leased, watched, in_txn, pending, idle):
        await p.put(b"k", p.id)
        await p.flush()
    watcher = watched.watch()
    txn = await in_txn.transaction().start()
    await txn.put(b"t", b"in a transaction")
    with leased.lease():
        await pending.put(b"queued", b"not committed yet")
        assert not pending.idle  # its journal is uncommitted
        await pending.flush()
        assert await repo.close_idle(3600) == 0  # nobody idle for that long
        assert await repo.close_idle(0) == 2  # `idle` and, once flushed, `pending`
        assert idle.closed and pending.closed
        assert not (leased.closed or watched.closed or in_txn.closed)
    watcher.close()
    await txn.commit()
    assert await repo.close_idle(0) == 3
    assert repo.open_pages() == []
    # Closed pages reopen on their next use, with everything they held.
    for name in "lwtpi":
        p = await ledger.page(name)
        assert await p.get(b"k") == name.encode()
    assert await (await ledger.page("t")).get(b"t") == b"in a transaction"
    assert await (await ledger.page("p")).get(b"queued") == b"not committed yet"
    assert (await repo.usage_of("idle", "i") or 0) == 0  # open again


async def test_a_lease_on_a_closed_page_is_refused(repo: Repository) -> None:
    page = await repo.ledger("l").page("p")
    await repo.close_idle(0)
    assert page.closed
    with pytest.raises(ClosedError):
        page.lease().__enter__()


@pytest.mark.parametrize("n", [10, 1000])  # through the journal; a direct commit
async def test_a_write_stores_every_chunk_of_its_values(tmp_path: Path, n: int) -> None:
    big = random.Random(n).randbytes(100_000)  # several chunks and an index piece
    async with await Repository.open(tmp_path) as repo:
        page = await repo.ledger("l").page("p")
        await page.write(
            [(b"big", b"overwritten" * 500), (b"big", big)]
            + [(b"k%04d" % i, b"x") for i in range(n - 2)]
        )
    async with await Repository.open(tmp_path) as repo:  # nothing cached
        page = await repo.ledger("l").page("p")
        assert await page.get(b"big") == big
        rows = await page.db.read_all(
            "SELECT count(*) FROM objects WHERE data = ?", (b"overwritten" * 500,)
        )
        assert rows[0][0] == 0  # a value overwritten within the same write is not stored


async def test_a_staged_value_overwritten_within_a_write_is_not_kept(page: Page) -> None:
    """A value over SMALL_VALUE is staged before the write; if a later change of the
    same write replaces it, its pieces are dropped, not committed (and uploaded)."""
    staged = random.Random(7).randbytes(SMALL_VALUE + 1)
    kept = random.Random(8).randbytes(SMALL_VALUE + 1)
    await page.write([(b"a", staged), (b"a", b"small"), (b"b", kept), (b"c", kept)])
    await page.flush()
    assert await page.get(b"a") == b"small" and await page.get(b"c") == kept
    assert await _garbage(page) == 0
    total = await _count(page, "SELECT coalesce(sum(length(data)), 0) FROM objects")
    assert len(kept) < total < len(kept) + 64 * 1024  # one copy of kept, none of staged


async def test_small_writes_go_inline_and_staged_values_do_not(
    page: Page, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Appends and commits of a few small keys run inline; a staged value's (its
    pieces are adopted row by row) and its journal's commit take the writer's thread."""
    calls: list[bool] = []
    run, write_now = page.db.run, page.db.write_now

    async def recording(fn: Any, *, write: bool = False, small: bool = False) -> Any:
        if write:
            calls.append(small)
        return await run(fn, write=write, small=small)

    def recording_now(fn: Any) -> Any:
        done = write_now(fn)
        if done[0]:
            calls.append(True)  # inline, at once (a write appending itself)
        return done

    monkeypatch.setattr(page.db, "run", recording)
    monkeypatch.setattr(page.db, "write_now", recording_now)
    await page.put(b"a", b"small")
    await page.flush()
    assert calls == [True, True]  # the append, the commit
    calls.clear()
    await page.put(b"b", random.Random(1).randbytes(SMALL_VALUE + 1))
    await page.flush()
    assert calls == [False, False, False]  # staging its pieces, the append, the commit
    calls.clear()
    async with page.transaction() as txn:
        await txn.put(b"c", b"small")
    assert calls == [True]


async def test_a_put_racing_rollback_is_refused(page: Page) -> None:
    await page.put(b"x", b"1")  # so that starting the transaction awaits a flush
    txn = page.transaction()
    put = asyncio.create_task(txn.put(b"k", b"v" * 100))
    await asyncio.sleep(0)  # the put is starting the transaction
    await txn.rollback()
    with pytest.raises(TransactionClosedError):
        await put
    assert page.idle  # the rolled-back transaction is not counted as under way


async def test_flush_waits_for_a_transaction_commit_under_way(page: Page) -> None:
    txn = await page.transaction().start()
    await txn.put(b"t", b"from the transaction")
    await page.put(b"moved", b"the base")  # the commit will need a merge
    await page.flush()
    commit = asyncio.create_task(txn.commit())
    await asyncio.sleep(0)  # the commit is under way
    await page.flush()
    assert await page.get(b"t") == b"from the transaction"
    assert len(await page.heads()) == 1
    await commit


async def test_open_page_racing_close_idle_returns_an_open_page(repo: Repository) -> None:
    for _ in range(20):
        await (await repo.ledger("l").page("p")).flush()
        await repo.close_idle(0)
        opening = asyncio.create_task(repo.open_page(b"l", b"p"))
        while not opening.done():  # close idle pages at every turn of the loop
            await repo.close_idle(0)
            await asyncio.sleep(0)
        assert not opening.result().closed


async def test_opening_pages_leaves_no_lock_behind(repo: Repository) -> None:
    """Many callers opening many pages at once all get the same page each; the
    per-page opening locks are gone afterwards (a daemon opens pages for months)."""
    names = [f"p{i}".encode() for i in range(10)]
    pages = await asyncio.gather(*(repo.open_page(b"l", n) for n in names for _ in range(3)))
    for i in range(len(names)):
        assert pages[3 * i] is pages[3 * i + 1] is pages[3 * i + 2]
    await repo.close_idle(0)
    with pytest.raises(StorageError):  # an open that fails (a file name over 255 bytes)
        await repo.open_page(b"l", b"x" * 200)
    assert repo._opening == {}


async def test_a_bad_priority_is_a_clear_error(page: Page) -> None:
    for value in (b"small", b"x" * 5000):  # one chunk; split in memory
        with pytest.raises(InvalidArgumentError, match="priority"):
            await page.put(b"k", value, 2)  # type: ignore[arg-type]
        async with page.transaction() as txn:
            with pytest.raises(InvalidArgumentError, match="priority"):
                await txn.put(b"k", value, "lazy")  # type: ignore[arg-type]
    assert (await page.keys()).items == []


async def test_a_resolver_may_flush_the_page_it_resolves(repo: Repository, page: Page) -> None:
    await page.set_policy(Policy.AUTOMATIC_WITH_FALLBACK)
    await page.put(b"k", b"base")
    later = await page.transaction().start()
    await later.put(b"x", b"from a later transaction")
    meanwhile: list[asyncio.Task[bytes | None]] = []

    async def resolver(req: MergeRequest) -> dict[bytes, Choice]:
        if not meanwhile:  # while the merge waits for us, more work arrives
            meanwhile.append(asyncio.create_task(later.commit()))
            await page.put(b"plain", b"written meanwhile")
        await asyncio.wait_for(page.flush(), 10)  # and we read the page before answering
        return {c.key: "left" for c in req.conflicts}

    set_resolver(repo, resolver)
    txn = await page.transaction().start()
    await txn.put(b"k", b"from the transaction")
    await page.put(b"k", b"plain")  # the head moves: the commit needs a merge
    await page.flush()
    await asyncio.wait_for(txn.commit(), 20)
    await asyncio.wait_for(meanwhile[0], 20)
    await page.flush()
    assert len(await page.heads()) == 1 and page.pending_conflict is None
    assert await page.get(b"x") == b"from a later transaction"
    assert await page.get(b"plain") == b"written meanwhile"


async def test_a_cancelled_close_still_closes(repo: Repository) -> None:
    page = await repo.ledger("l").page("p")
    await page.put(b"k", b"v")
    closing = asyncio.create_task(page.close())
    await asyncio.sleep(0)  # closing has begun
    closing.cancel()

    async def closed() -> None:
        while not page.db.closed:
            await asyncio.sleep(0.01)

    await asyncio.wait_for(closed(), 10)  # the database closed all the same
    assert page.db.closed and not repo.is_open(b"l", b"p")
    assert await (await repo.ledger("l").page("p")).get(b"k") == b"v"


async def test_a_write_cancelled_during_begin_leaves_no_transaction(repo: Repository) -> None:
    setting = asyncio.create_task(repo.set_meta("x", b"1"))
    while not repo.usage._lock.locked():  # BEGIN is on its way to the writer's thread
        await asyncio.sleep(0)
    setting.cancel()
    await asyncio.gather(setting, return_exceptions=True)
    await repo.set_meta("y", b"2")  # the next write starts its own transaction
    assert await repo.get_meta("y") == b"2"
    page = await repo.ledger("l").page("p")  # opening a page writes to the usage db
    assert not page.closed


async def test_values_replaced_within_one_journal_are_not_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writes that share one implicit journal (group commit) land in one commit: a
    value a later write of that journal replaced is in no commit, so its pieces are
    collected, not kept and uploaded. What the commit holds stays, across a reopen."""
    monkeypatch.setattr(store_writer, "COMMIT_DELAY", 3600)  # commit only on flush
    rng = random.Random(5)
    first, second, gone = rng.randbytes(100), rng.randbytes(100), rng.randbytes(100)
    big_first, big_second = rng.randbytes(100_000), rng.randbytes(100_000)  # several chunks
    async with await Repository.open(tmp_path) as repo:
        page = await repo.ledger("l").page("p")
        await page.put(b"k", first)
        await page.put(b"k", second)
        await page.put(b"big", big_first, Priority.LAZY)
        await page.put(b"big", big_second, Priority.LAZY)
        await page.put(b"gone", gone)
        await page.delete(b"gone")
        await page.flush()
        assert len(await page.history()) == 2  # the empty first commit, then the journal's
        up = await exchange.pending_delta(page)
        assert up is not None and not set(up.eager) & set(up.lazy)
        assert len(up.lazy) > 1  # big_second waits to be fetched
    async with await Repository.open(tmp_path) as repo:  # nothing cached
        page = await repo.ledger("l").page("p")
        assert await page.get(b"k") == second and await page.get(b"big") == big_second
        with pytest.raises(KeyNotFoundError):
            await page.get(b"gone")
        stored = [bytes(r[0]) for r in await page.db.read_all("SELECT data FROM objects")]
        assert first not in stored and gone not in stored
        assert not [d for d in stored if len(d) > 1000 and d in big_first]
        assert await _garbage(page) == 0


async def test_a_staged_value_a_transaction_replaced_is_not_kept(page: Page) -> None:
    staged = random.Random(11).randbytes(SMALL_VALUE + 1)
    kept = random.Random(12).randbytes(SMALL_VALUE + 1)
    async with page.transaction() as txn:
        await txn.put(b"a", staged)
        await txn.put(b"a", b"small")
        await txn.put(b"b", kept)
        await txn.put(b"c", kept)
        await txn.put(b"c", b"replaced, but b still holds the same value")
    assert await page.get(b"a") == b"small" and await page.get(b"b") == kept
    assert await _garbage(page) == 0
    total = await _count(page, "SELECT coalesce(sum(length(data)), 0) FROM objects")
    assert len(kept) < total < len(kept) + 64 * 1024  # one copy of kept, none of staged


async def test_writes_queued_behind_a_failed_commit_are_answered(
    page: Page, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A journal commit that fails (a full disk) answers every write queued behind
    it, a large batch included, instead of leaving them waiting for another write."""
    from ledgerd.store import StorageFullError
    from ledgerd.store.page.graph import CommitGraph

    real = CommitGraph.store
    failing = True

    async def store(self: CommitGraph, *args: Any, **kwargs: Any) -> None:
        if failing:
            raise StorageFullError()
        await real(self, *args, **kwargs)

    monkeypatch.setattr(CommitGraph, "store", store)
    await page.put(b"acked", b"1")  # in the journal; its commit will fail
    batch = [(b"b%05d" % i, b"v") for i in range(store_page.DIRECT_BATCH)]
    with pytest.raises(StorageFullError):
        await asyncio.wait_for(page.write(batch), 10)  # waits for the journal's commit
    with pytest.raises(StorageFullError):
        await asyncio.wait_for(page.flush(), 10)
    failing = False  # space is back
    await asyncio.wait_for(page.flush(), 10)
    assert await page.get(b"acked") == b"1"


async def test_a_watcher_that_falls_behind_ends_with_a_reason(tmp_path: Path) -> None:
    async with await Repository.open(tmp_path, max_watch_queue=2) as repo:
        page = await repo.ledger("l").page("p")
        w = page.watch()
        for i in range(4):
            await page.put(b"k", b"%d" % i)
            await page.flush()
        got = [n async for n in w]  # what was queued, then the end
        assert len(got) == 2 and w.ended_reason and "behind" in w.ended_reason
        assert not page.watchers  # it no longer holds the page


async def test_put_of_none_is_refused_and_deletes_nothing(page: Page) -> None:
    """``Page.put(key, None)`` deleted the key (None is a delete in ``write``), where
    ``Transaction.put`` refuses None: a value that happened to be None lost data."""
    await page.put(b"k", b"v")
    with pytest.raises(InvalidArgumentError, match="not NoneType"):
        await page.put(b"k", None)  # type: ignore[arg-type]
    assert await page.get(b"k") == b"v"


@pytest.mark.parametrize("name", [5, None, 1.5])
async def test_a_name_that_is_not_bytes_or_str_is_refused(repo: Repository, name: Any) -> None:
    """``bytes(5)`` is five NUL bytes: ``repo.ledger(5)`` made a ledger of that name
    (and ``bytes(10**12)`` would allocate a terabyte); None was a bare TypeError. (A
    page id of None is a random one.)"""
    with pytest.raises(InvalidArgumentError, match="ledger name is bytes or str, not"):
        repo.ledger(name)
    if name is not None:
        with pytest.raises(InvalidArgumentError, match="page id is bytes or str, not"):
            await repo.ledger("l").page(name)
    assert await repo.ledgers() == []


async def test_reads_of_a_closed_page_are_refused_whether_cached_or_not(tmp_path: Path) -> None:
    # The shared cache answered a closed page's reads of what it held; past it the
    # same reads failed with "database ... is closed". Both are ClosedError now.
    for cache_bytes in (0, 1 << 20):
        async with await Repository.open(tmp_path / str(cache_bytes), cache_bytes=cache_bytes) as r:
            page = await r.ledger("l").page("p")
            await page.put(b"k", b"v" * 100)
            await page.flush()
            assert await page.get(b"k") == b"v" * 100  # cached, when there is a cache
        for read in (page.get(b"k"), page.get_entry(b"k"), page.entries()):
            with pytest.raises(ClosedError, match="page p is closed"):
                await read


async def test_a_big_write_lets_other_tasks_run_while_it_prepares(page: Page) -> None:
    """Values split and hashed on the loop (4 KiB: no thread hop) give the loop back
    every ``OFF_LOOP_BYTES``: a task started with the write runs before the write has
    taken its last change, not only once it waits for SQLite."""
    other_ran = asyncio.Event()

    async def other() -> None:
        other_ran.set()

    seen: list[bool] = []

    def changes() -> Iterator[tuple[bytes, bytes]]:
        for i in range(3 * OFF_LOOP_BYTES // 4096 + 2):
            yield b"k%06d" % i, random.randbytes(4096)
        seen.append(other_ran.is_set())

    task = asyncio.create_task(other())
    await page.write(changes())
    await task
    assert seen == [True]
    assert len((await page.keys(limit=10_000)).items) == 3 * OFF_LOOP_BYTES // 4096 + 2
