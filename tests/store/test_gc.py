"""History retention and garbage collection (store.page.gc)."""

from __future__ import annotations

import asyncio
import random
import sqlite3
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledgerd.store import HistoryPrunedError, KeyNotFoundError, Page, Repository, Snapshot
from ledgerd.store.page.check import check_page
from ledgerd.store.page.gc import collect, live_bytes, set_page_retention
from tests.exchanges import mark_all_uploaded, ship
from tests.store.test_crash import run_and_kill

MiB = 1024 * 1024


async def upload_all(page: Page) -> None:
    """What a sync round does on success: everything pending is in the cloud now."""
    await mark_all_uploaded(page)


def page_files(page: Page) -> int:
    path = page.db.path
    return sum(p.stat().st_size for p in (path, path.with_name(path.name + "-wal")) if p.exists())


async def test_retention_zero_prunes_history_and_reads_there_fail_clearly(tmp_path: Path) -> None:
    async with await Repository.open(tmp_path, history_retention=0) as repo:
        page = await repo.ledger("l").page("p")
        await page.put(b"k", b"first value, long enough to be stored as a piece")
        await page.flush()
        old = page.head.id
        await page.put(b"k", b"second value, long enough to be stored as a piece")
        await page.flush()
        assert await (await page.snapshot(old)).get(b"k") == (
            b"first value, long enough to be stored as a piece"
        )
        # History is this device's own: an upload needs none of it, so it goes at once.
        result = await collect(page, repo.history_retention)
        assert result.commits_pruned >= 1
        assert result.pieces_freed >= 1
        with pytest.raises(HistoryPrunedError, match="history retention"):
            await page.snapshot(old)
        assert await page.get(b"k") == b"second value, long enough to be stored as a piece"
        assert [c.id for c in await page.history(10)][1] == old  # the log still lists it
        report = await check_page(page)
        assert report.healthy, report.problems


async def test_commits_inside_the_retention_are_kept(tmp_path: Path) -> None:
    async with await Repository.open(tmp_path) as repo:  # the default: 7 days
        page = await repo.ledger("l").page("p")
        for i in range(5):
            await page.put(b"k", b"value number %d, long enough to be a piece" % i)
            await page.flush()
        await upload_all(page)
        result = await repo.collect_garbage(b"l", b"p")
        assert (result.commits_pruned, result.pieces_freed) == (0, 0)
        for c in await page.history(10):
            await (await page.snapshot(c.id)).entries()
        # A page's own retention overrides the repository's.
        await set_page_retention(page, 0)
        assert (await repo.collect_garbage(b"l", b"p")).commits_pruned == 4  # all but the head


async def test_open_snapshots_and_transactions_keep_what_they_read(tmp_path: Path) -> None:
    async with await Repository.open(tmp_path, history_retention=0) as repo:
        page = await repo.ledger("l").page("p")
        await page.write([(b"a%d" % i, b"old %d" % i * 10) for i in range(200)])
        await page.flush()
        snap = await page.snapshot(page.head.id)
        txn = page.transaction()
        await txn.start()
        await page.write([(b"a%d" % i, b"new %d" % i * 10) for i in range(200)])
        await page.flush()
        await upload_all(page)
        await collect(page, 0)
        assert await snap.get(b"a7") == b"old 7" * 10
        assert await txn.get(b"a8") == b"old 8" * 10
        await txn.rollback()


async def test_an_open_transaction_keeps_its_base_commit_for_its_merge(tmp_path: Path) -> None:
    """A transaction's commit has its base as parent and is merged with a head that
    moved meanwhile, from that base. Retention must not prune the base while the
    transaction is open: merged from the empty page instead, a key deleted since
    comes back and a newer value loses to the base's."""
    async with await Repository.open(tmp_path, history_retention=0) as repo:
        page = await repo.ledger("l").page("p")
        await page.write([(b"gone", b"deleted after the base"), (b"kept", b"old")])
        await page.flush()
        txn = page.transaction()
        await txn.start()
        await page.delete(b"gone")
        await page.put(b"kept", b"newer than the base")
        await page.flush()
        await upload_all(page)
        await collect(page, 0)
        await txn.put(b"mine", b"the transaction's own write")
        await txn.commit()
        await page.flush()
        assert await page.get(b"mine") == b"the transaction's own write"
        with pytest.raises(KeyNotFoundError):
            await page.get(b"gone")
        assert await page.get(b"kept") == b"newer than the base"


async def test_a_commit_made_while_gc_marks_is_not_pruned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The retained commits are read once, then the mark walks their trees (the event
    loop runs meanwhile). A commit stored during that walk was not among them; it must
    not be recorded as pruned (whatever the retention: it is new)."""
    from ledgerd.store.page import gc

    async with await Repository.open(tmp_path) as repo:  # 7 days: nothing is old
        page = await repo.ledger("l").page("p")
        await page.put(b"k", b"first")
        await page.flush()
        walk = gc._Marker.trees
        made: list[bytes] = []

        async def trees(self: gc._Marker, roots: list[bytes]) -> None:
            if not made:
                await page.put(b"k", b"written while the mark walks")
                await page.flush()
                made.append(page.head.id)
            await walk(self, roots)

        monkeypatch.setattr(gc._Marker, "trees", trees)
        result = await collect(page, repo.history_retention)
        assert made and page.head.id == made[0]
        assert result.commits_pruned == 0
        assert not await gc.is_pruned(page, made[0])
        assert await (await page.snapshot(made[0])).get(b"k") == b"written while the mark walks"


async def test_the_bulk_load_shrinks_to_twice_its_live_data_after_gc(tmp_path: Path) -> None:
    """The issue's load, scaled down: 20 transactions of 1,000 random keys."""
    rng = random.Random(7)
    live: dict[bytes, bytes] = {}
    async with await Repository.open(tmp_path, history_retention=0) as repo:
        page = await repo.ledger("l").page("p")
        for _ in range(20):
            async with page.transaction() as txn:
                for _ in range(1000):
                    k, v = rng.randbytes(16), rng.randbytes(100)
                    live[k] = v
                    await txn.put(k, v)
        await page.flush()
        await upload_all(page)
        before = page_files(page)
        result = await collect(page, 0)
        after = page_files(page)
        # Live data as stored: the pieces the head reaches (values and tree nodes). The
        # user's bytes alone are less: see docs/performance.md, "Garbage collection".
        data = await live_bytes(page)
        assert sum(len(k) + len(v) for k, v in live.items()) < data
        assert after <= 2 * data + MiB, (before, after, data)
        assert after < before
        assert result.file_bytes_after == after
        for k, v in rng.sample(sorted(live.items()), 200):
            assert await page.get(k) == v
        assert (await check_page(page)).healthy


async def test_an_old_file_moves_to_incremental_vacuum(tmp_path: Path) -> None:
    async with await Repository.open(tmp_path) as repo:
        page = await repo.ledger("l").page("p")
        await page.put(b"k", b"v" * 100)
        path = page.db.path
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA auto_vacuum = NONE")
    conn.execute("VACUUM")
    assert conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 0
    conn.close()
    async with await Repository.open(tmp_path) as repo:
        page = await repo.ledger("l").page("p")
        assert await page.get(b"k") == b"v" * 100
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 2
    conn.close()


async def kill_at_gc(data: Path, seed: int, collections: int) -> list[str]:
    """Run the GC child and SIGKILL it as soon as its ``collections``-th collection
    starts; every line it printed."""
    return await run_and_kill(
        data,
        seed,
        child="tests.store.gc_crash_child",
        until=lambda seen: seen.count("G") >= collections,
    )


async def test_sigkill_during_gc_loses_nothing_reachable(tmp_path: Path) -> None:
    rng = random.Random(17)
    data = tmp_path / "data"
    latest: dict[int, int] = {}
    mid_gc = 0
    for it in range(10):
        lines = await kill_at_gc(data, it + 1, rng.randint(1, 3))
        marks = [x for x in lines if x in ("G", "D")]
        mid_gc += bool(marks) and marks[-1] == "G"  # killed while collecting
        for line in lines:
            if line.startswith("P "):
                _, key, number = line.split()
                latest[int(key)] = int(number)
        async with await Repository.open(data, history_retention=0) as repo:
            page = await repo.ledger("gc").page("page")
            report = await check_page(page)
            assert report.healthy, report.problems
            for k, n in latest.items():
                got = await page.get(b"k%d" % k)
                assert int(got.split(b":")[1]) >= n, f"iteration {it}: k{k} lost write {n}"
            async for e in page.iter_entries():
                await page.get(e.key)  # every value reachable from the head reads back
    assert mid_gc >= 3


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.integers(0, 9), st.integers(0, 3)),
        st.tuples(st.just("delete"), st.integers(0, 9), st.just(0)),
        st.tuples(st.just("txn"), st.integers(0, 9), st.integers(1, 5)),
        st.tuples(st.just("snapshot"), st.just(0), st.just(0)),
        st.tuples(st.just("upload"), st.just(0), st.just(0)),
        st.tuples(st.just("gc"), st.just(0), st.integers(0, 1)),
    ),
    max_size=25,
)


def value(n: int, size: int) -> bytes:
    return b"%d:" % n + bytes([n % 251]) * (0, 40, 5000, 70000)[size]


@settings(max_examples=25, deadline=None)
@given(ops=OPS)
async def test_every_retained_commit_and_open_snapshot_reads_back(
    ops: list[tuple[str, int, int]],
) -> None:
    with tempfile.TemporaryDirectory() as d:
        async with await Repository.open(Path(d), history_retention=0) as repo:
            page = await repo.ledger("l").page("p")
            model: dict[bytes, bytes] = {}
            states: dict[bytes, dict[bytes, bytes]] = {page.head.id: {}}
            snaps: list[tuple[Snapshot, dict[bytes, bytes]]] = []
            for n, (op, k, arg) in enumerate(ops):
                key = b"k%d" % k
                if op == "put":
                    await page.put(key, value(n, arg))
                    model[key] = value(n, arg)
                elif op == "delete":
                    await page.delete(key)
                    model.pop(key, None)
                elif op == "txn":
                    async with page.transaction() as txn:
                        for j in range(arg):
                            await txn.put(b"k%d" % ((k + j) % 10), value(n, j % 4))
                            model[b"k%d" % ((k + j) % 10)] = value(n, j % 4)
                elif op == "snapshot":
                    await page.flush()
                    snaps.append((await page.snapshot(page.head.id), dict(model)))
                elif op == "upload":
                    await upload_all(page)
                else:
                    await page.flush()
                    await collect(page, 0 if arg == 0 else 3600)
                await page.flush()
                states[page.head.id] = dict(model)
            await collect(page, 0)
            for cid, expected in states.items():
                try:
                    snap = await page.snapshot(cid)
                except HistoryPrunedError:
                    continue
                assert {e.key: await snap.get(e.key) async for e in snap.iter_entries()} == expected
            for snap, expected in snaps:
                assert {e.key: await snap.get(e.key) async for e in snap.iter_entries()} == expected
            assert {e.key: await page.get(e.key) async for e in page.iter_entries()} == model
            assert (await check_page(page)).healthy


async def test_a_piece_that_a_commit_reuses_during_the_sweep_is_kept(tmp_path: Path) -> None:
    """Between the mark and a sweep batch, a commit stores a value whose piece the mark
    found unreachable (content addressing: the piece is not written again). The batch
    must not delete it."""
    from ledgerd.store.pieces.digest import Kind, chunk_digest
    from ledgerd.store.tree.btree import Builder, Entry, Priority
    from ledgerd.store.tree.commit import child

    old = b"an old value, replaced, so its piece is garbage" * 3
    async with await Repository.open(tmp_path, history_retention=0) as repo:
        page = await repo.ledger("l").page("p")
        await page.put(b"k", old)
        await page.flush()
        await page.put(b"k", b"a new value, long enough to be a piece of its own" * 3)
        await page.flush()
        await upload_all(page)
        sweeping = asyncio.Event()

        def stop() -> bool:
            sweeping.set()  # called just before each sweep batch takes the commit lock
            return False

        async with page.graph.lock:
            gc_task = asyncio.create_task(collect(page, 0, stop=stop))
            await sweeping.wait()
            # A commit (as a write of the same bytes makes it) reusing the old piece.
            builder = Builder(page.nodes)
            ts = page.graph.next_time()
            entry = Entry(
                b"again", chunk_digest(Kind.VALUE, old), Priority.EAGER, page.graph.dot(ts)
            )
            root = await builder.apply(page.head.root, [(b"again", entry)])
            await page.graph.store(child(page.head, root, ts), builder)
        result = await gc_task
        assert result.commits_pruned >= 1
        assert await page.get(b"again") == old
        assert (await check_page(page)).healthy


async def test_an_import_during_a_sweep_batch_keeps_what_it_brings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another device writes bytes this device holds only as garbage (a value of pruned
    history): its delta carries the piece again, and an import that runs while a sweep
    batch is deleting the old copy waits for that batch, then stores the piece (the
    commit lock orders them). The page reads the value and stays healthy."""
    import threading

    from ledgerd.store.page import gc

    old = b"an old value, replaced, so its piece is garbage" * 3
    async with (
        await Repository.open(tmp_path / "a") as ra,
        await Repository.open(tmp_path / "b", history_retention=0) as rb,
    ):
        b = await rb.ledger("l").page("p")
        a = await ra.ledger("l").page("p")
        await b.put(b"k", old)
        await b.flush()
        await b.put(b"k", b"a new value, long enough to be a piece of its own" * 3)
        await b.flush()
        await ship(b, a)
        await a.put(b"again", old)  # the other device writes the old bytes again
        await a.flush()

        deleting, go = threading.Event(), threading.Event()
        real_delete = gc._delete

        def paused_delete(conn: sqlite3.Connection, ids: list[int]) -> tuple[int, int]:
            deleting.set()
            go.wait(60)
            return real_delete(conn, ids)

        monkeypatch.setattr(gc, "_delete", paused_delete)
        gc_task = asyncio.create_task(collect(b, 0))
        assert await asyncio.to_thread(deleting.wait, 60)  # a batch is deleting
        importing = asyncio.create_task(ship(a, b))
        await asyncio.sleep(0)
        go.set()
        await gc_task
        await importing
        assert await b.get(b"again") == old
        assert (await check_page(b)).healthy
