"""Deleting a page or a ledger: one commit that empties the page and marks it
deleted; listings leave it out, here and (through sync, tests/sync) elsewhere."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from ledgerd.store import LedgerNotFoundError, PageNotFoundError, Repository
from ledgerd.store.page import deleted as dl
from ledgerd.store.pieces.digest import TOMBSTONE
from ledgerd.store.sqlite.schema import FORMAT_VERSION
from ledgerd.store.tree import btree


async def _fill(repo: Repository, ledger: str, page: str, n: int = 3) -> None:
    pg = await repo.ledger(ledger).page(page)
    await pg.write([(b"k%d" % i, b"v%d" % i) for i in range(n)])
    await pg.flush()


async def test_a_deleted_page_holds_the_mark_and_tombstones_only(tmp_path: Path) -> None:
    """Deleting a page writes a tombstone over every key it held and puts the mark: the
    page is deleted while nothing else is live, and listed again after a write."""
    async with await Repository.open(tmp_path) as repo:
        page = await repo.ledger("notes").page("inbox")
        await page.write([(b"a", b"1"), (b"b", b"2")])
        await page.flush()
        await repo.delete_page("notes", "inbox")
        assert page.deleted
        rows = [(e[0], e[1]) async for e in btree.iterate(page.nodes, page.head.root)]
        assert rows == [(b"a", TOMBSTONE), (b"b", TOMBSTONE), (dl.MARK, TOMBSTONE)]
        await page.put(b"c", b"3")
        await page.flush()
        assert not page.deleted


async def test_a_deleted_page_is_one_commit_and_leaves_the_listings(tmp_path: Path) -> None:
    async with await Repository.open(tmp_path) as repo:
        await _fill(repo, "notes", "inbox")
        await _fill(repo, "notes", "kept")
        page = await repo.ledger("notes").page("inbox")
        before = len(await page.history(limit=1000))
        await repo.delete_page("notes", "inbox")
        assert len(await page.history(limit=1000)) == before + 1  # one commit
        assert (await page.entries()).items == []
        assert not await page.contains(b"k0")
        assert page.deleted
        assert await repo.ledger("notes").pages() == [b"kept"]
        assert await repo.ledger("notes").pages(include_deleted=True) == [b"inbox", b"kept"]
        assert not await repo.page_listed(b"notes", b"inbox")
        await page.close()  # closed, the repository remembers it
        assert await repo.ledger("notes").pages() == [b"kept"]
    async with await Repository.open(tmp_path) as repo:  # and after a restart
        assert await repo.ledger("notes").pages() == [b"kept"]
        assert await repo.ledgers() == [b"notes"]


async def test_deleting_a_ledger_deletes_every_page_and_hides_it(tmp_path: Path) -> None:
    async with await Repository.open(tmp_path) as repo:
        for p in ("a", "b", "c"):
            await _fill(repo, "gone", p)
        await _fill(repo, "other", "x")
        assert await repo.ledger("gone").delete() == 3
        assert await repo.ledgers() == [b"other"]
        assert await repo.ledgers(include_deleted=True) == [b"gone", b"other"]
        assert await repo.ledger("gone").pages() == []
        with pytest.raises(LedgerNotFoundError):
            await repo.delete_ledger("gone")  # nothing left to delete
        with pytest.raises(LedgerNotFoundError):
            await repo.delete_ledger("never")


async def test_deleting_a_page_that_is_not_there_is_not_found(tmp_path: Path) -> None:
    async with await Repository.open(tmp_path) as repo:
        await _fill(repo, "l", "p")
        # the messages name the page and ledger as every other not-found does (they are
        # the daemon's 404 messages), never as Python bytes reprs (b'nope')
        with pytest.raises(PageNotFoundError, match=r"^no page nope in ledger l$"):
            await repo.delete_page("l", "nope")
        with pytest.raises(LedgerNotFoundError, match=r"^no ledger nope$"):
            await repo.delete_page("nope", "p")
        with pytest.raises(LedgerNotFoundError, match=r"^no ledger hex:00ff$"):
            await repo.delete_ledger(b"\x00\xff")
        await repo.delete_page("l", "p")
        with pytest.raises(LedgerNotFoundError):  # its only page: the ledger is gone too
            await repo.delete_page("l", "p")
        assert (
            not (tmp_path / str(FORMAT_VERSION) / "ledgers").joinpath("bm9wZQ").exists()
        )  # made nothing


async def test_a_write_after_the_delete_brings_the_page_back_with_only_new_keys(
    tmp_path: Path,
) -> None:
    async with await Repository.open(tmp_path) as repo:
        await _fill(repo, "l", "p")
        await repo.delete_page("l", "p")
        page = await repo.ledger("l").page("p")
        await page.put(b"new", b"1")
        assert not page.deleted  # waiting in the journal: listed already
        assert await repo.ledger("l").pages() == [b"p"]
        await page.flush()
        assert [kv.key for kv in (await page.entries()).items] == [b"new"]
        await page.close()
        assert await repo.ledger("l").pages() == [b"p"]
        assert await repo.ledgers() == [b"l"]


async def test_odd_names_and_the_local_ledger(tmp_path: Path) -> None:
    odd = b"\x00\xff/..\n"
    async with await Repository.open(tmp_path) as repo:
        await _fill(repo, odd.decode("latin-1"), "p")  # str names are UTF-8 encoded
        await repo.delete_page(odd.decode("latin-1").encode(), b"p")
        await _fill(repo, "_local", "p")
        await repo.ledger("_local").delete()
        await _fill(repo, "x", "y")
        page = await repo.ledger(odd).page(odd)  # a page of odd bytes, then deleted
        await page.put(b"k", b"v")
        await page.flush()
        await repo.ledger(odd).delete_page(odd)
        assert await repo.ledgers() == [b"x"]


async def test_watchers_see_removals_and_snapshots_keep_reading(tmp_path: Path) -> None:
    async with await Repository.open(tmp_path) as repo:
        await _fill(repo, "l", "p", n=2)
        page = await repo.ledger("l").page("p")
        snap = await page.snapshot()
        w = page.watch()
        await repo.delete_page("l", "p")
        note = await asyncio.wait_for(w.__anext__(), 10)
        assert note.changed == [] and sorted(note.deleted) == [b"k0", b"k1"]
        assert note.commit == page.head.id
        assert await snap.get(b"k1") == b"v1"  # a snapshot reads its commit
        w.close()


async def test_an_open_transaction_merges_with_the_delete(tmp_path: Path) -> None:
    """A transaction begun before the delete commits on its base, and merges like a
    concurrent write: its new keys survive, so the page is back."""
    async with await Repository.open(tmp_path) as repo:
        await _fill(repo, "l", "p", n=2)
        page = await repo.ledger("l").page("p")
        txn = page.transaction()
        await txn.put(b"t", b"from the transaction")
        await repo.delete_page("l", "p")
        await txn.commit()
        assert {kv.key for kv in (await page.entries()).items} == {b"t"}
        assert await repo.ledger("l").pages() == [b"p"]


async def test_clear_after_a_delete_keeps_the_page_listed(tmp_path: Path) -> None:
    """``clear`` empties the tree, the mark included: an empty page that is listed."""
    async with await Repository.open(tmp_path) as repo:
        await _fill(repo, "l", "p")
        page = await repo.ledger("l").page("p")
        await page.clear()
        await page.flush()
        assert await repo.ledger("l").pages() == [b"p"]
        await repo.delete_page("l", "p")
        await page.clear()
        await page.flush()
        assert not page.deleted and await repo.ledger("l").pages() == [b"p"]


async def test_the_page_usage_database_of_version_1_is_migrated(tmp_path: Path) -> None:
    import sqlite3

    async with await Repository.open(tmp_path) as repo:
        await _fill(repo, "l", "p")
    conn = sqlite3.connect(tmp_path / "page_usage.sqlite")
    conn.executescript(
        "ALTER TABLE page_usage DROP COLUMN deleted; ALTER TABLE page_usage DROP COLUMN evicted; "
        "ALTER TABLE page_usage DROP COLUMN written; PRAGMA user_version = 1;"
    )
    conn.close()
    async with await Repository.open(tmp_path) as repo:
        assert await repo.ledger("l").pages() == [b"p"]
        await repo.delete_page("l", "p")
        assert await repo.ledger("l").pages() == []


async def test_a_page_written_after_its_delete_stays_listed_while_it_closes(
    tmp_path: Path,
) -> None:
    """While a page closes (it says closed at once, and is recorded as closed at the
    end), listings fell back on page_usage, which still said deleted: a page written
    since its delete, acknowledged keys and all, left the listings for that moment."""
    async with await Repository.open(tmp_path) as repo:
        await _fill(repo, "l", "p")
        await repo.delete_page("l", "p")
        page = await repo.ledger("l").page("p")
        await page.put(b"new", b"1")
        await page.flush()
        entered, release = asyncio.Event(), asyncio.Event()

        async def held() -> None:
            entered.set()
            await release.wait()

        page.when_closing(held)
        closing = asyncio.create_task(page.close())
        await entered.wait()
        try:
            assert await repo.ledger("l").pages() == [b"p"]
            assert await repo.ledgers() == [b"l"]
        finally:
            release.set()
            await closing
        assert await repo.ledger("l").pages() == [b"p"]
