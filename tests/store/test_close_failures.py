"""A page whose database close fails, merges cut short by a repository's close, and a
page whose database file is gone while its -wal remains."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from pathlib import Path

import pytest

from ledgerd.store import Repository
from ledgerd.store.errors import (
    CorruptDatabaseError,
    NotEvictableError,
    PageUnavailableError,
    TooManyOpenPagesError,
)
from ledgerd.store.tree.merge import Choice, MergeRequest
from tests.store.resolvers import set_resolver
from tests.store.test_open_close_merge import DETECTOR, _reopened_with_a_held_resolver


def _is_closed(conn: sqlite3.Connection) -> bool:
    try:
        conn.execute("SELECT 1")
    except sqlite3.ProgrammingError:
        return True
    return False


async def test_a_page_whose_close_fails_is_not_opened_again_beside_its_open_connections(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The reader's close failing ended the database's close there: the writer (and its
    # WAL index) stayed open, and the page left the open set all the same, so its next
    # use opened a second set of connections on the file beside them. Now every other
    # connection closes, the failure is logged once naming the page, and the page is
    # refused until what was left open closes (its next use tries again).
    async with await Repository.open(tmp_path) as repo:
        page = await repo.ledger("l").page("p")
        await page.put(b"k", b"v")
        db = page.db
        real_close, failures = db.reader.close, [0]

        async def failing_close() -> None:
            failures[0] += 1
            raise sqlite3.OperationalError("injected: unable to close")

        db.reader.close = failing_close  # type: ignore[method-assign]
        with (
            caplog.at_level(logging.ERROR, "ledgerd.store.page.page"),
            pytest.raises(sqlite3.OperationalError, match="injected"),
        ):
            await page.close()
        assert db.inline is not None and db.inline_reader is not None
        assert _is_closed(db.writer.raw) and _is_closed(db.inline) and _is_closed(db.inline_reader)
        assert not _is_closed(db.reader.raw) and not repo.is_open(b"l", b"p")

        with pytest.raises(PageUnavailableError, match="reader"):
            await repo.ledger("l").page("p")
        assert failures[0] == 2 and db.unclosed == ["reader"]  # tried again, still open
        logged = [r.getMessage() for r in caplog.records if "closing failed" in r.getMessage()]
        assert len(logged) == 1 and "page p of ledger l" in logged[0] and "reader" in logged[0]

        db.reader.close = real_close  # type: ignore[method-assign]
        again = await repo.ledger("l").page("p")  # the old reader closes first
        assert again is not page and _is_closed(db.reader.raw) and db.unclosed == []
        assert await again.get(b"k") == b"v"
    assert len([r for r in caplog.records if "closing failed" in r.getMessage()]) == 1


async def test_a_repository_close_closes_what_a_failed_page_close_left_open(
    tmp_path: Path,
) -> None:
    async with await Repository.open(tmp_path) as repo:
        page = await repo.ledger("l").page("p")
        db, calls = page.db, []
        real_close = db.writer.close

        async def fails_once() -> None:
            calls.append(1)
            if len(calls) == 1:
                raise sqlite3.OperationalError("injected: unable to close")
            await real_close()

        db.writer.close = fails_once  # type: ignore[method-assign]
        with pytest.raises(sqlite3.OperationalError):
            await page.close()
        assert _is_closed(db.reader.raw) and not _is_closed(db.writer.raw)
    assert len(calls) == 2 and _is_closed(db.writer.raw)


async def test_a_repository_close_cuts_short_an_opening_merge_waiting_for_its_resolver(
    tmp_path: Path,
) -> None:
    # The resolver round of the conflicts a page was opened with waited for its
    # resolver (up to RESOLVER_TIMEOUT, 30 s) whatever happened meanwhile: a repository
    # close waited that long for an opener still there, and returned with the round
    # still running when its opener had gone. The close now abandons it (the conflict
    # kept) and returns only once it has ended.
    for cancel_opener in (False, True):
        path = tmp_path / str(cancel_opener)
        repo, _gate, entered, _ = await _reopened_with_a_held_resolver(path)
        opening = asyncio.create_task(repo.ledger("l").page("p"))
        await asyncio.wait_for(entered.wait(), DETECTOR)
        if cancel_opener:
            opening.cancel()
            await asyncio.gather(opening, return_exceptions=True)
        await asyncio.wait_for(repo.close(), DETECTOR)
        me = asyncio.current_task()
        assert [t for t in asyncio.all_tasks() if t not in (me, opening) and not t.done()] == []
        if not cancel_opener:
            assert (await opening).closed
        async with await Repository.open(path) as again:  # the conflict is kept
            assert (await again.ledger("l").page("p")).conflict_count == 1


async def test_a_page_close_ends_a_merge_waiting_for_its_resolver(tmp_path: Path) -> None:
    repo, _gate, entered, seen = await _reopened_with_a_held_resolver(tmp_path)
    async with repo:
        opening = asyncio.create_task(repo.ledger("l").page("p"))
        await asyncio.wait_for(entered.wait(), DETECTOR)
        await asyncio.wait_for(seen[0].close(), DETECTOR)
        assert (await asyncio.wait_for(opening, DETECTOR)).closed  # its merge ended
        assert seen[0].graph.conflicts == 1  # kept

        async def resolver(req: MergeRequest) -> dict[bytes, Choice]:
            return {c.key: b"resolved" for c in req.conflicts}

        set_resolver(repo, resolver)  # the next open merges, as before
        page = await repo.ledger("l").page("p")
        assert await page.get(b"k") == b"resolved"


async def test_a_page_whose_database_is_gone_but_its_wal_remains_is_listed_as_lost(
    tmp_path: Path,
) -> None:
    # Refused as damaged when opened, yet with no page.sqlite it was in no listing, so
    # a check (which checks the listed pages) never said a word about it.
    async with await Repository.open(tmp_path) as repo:
        page = await repo.ledger("l").page("p")
        await page.put(b"k", b"v")
        await page.flush()
        await (await repo.ledger("l").page("q")).put(b"k", b"v")
        path = repo.page_path(b"l", b"p")
        wal = path.with_name("page.sqlite-wal").read_bytes()
    for f in path.parent.iterdir():
        f.unlink()
    path.with_name("page.sqlite-wal").write_bytes(wal)
    async with await Repository.open(tmp_path) as repo:
        assert await repo.ledger("l").lost_pages() == [b"p"]
        assert repo.page_lost(b"l", b"p") and not repo.page_lost(b"l", b"q")
        assert await repo.ledger("l").pages() == [b"q"]  # listings still leave it out
        with pytest.raises(CorruptDatabaseError, match="remains"):
            await repo.ledger("l").page("p")
        assert path.with_name("page.sqlite-wal").read_bytes() == wal  # left as it was


async def test_a_page_whose_close_failed_is_not_evicted_under_its_open_connections(
    tmp_path: Path,
) -> None:
    async with await Repository.open(tmp_path) as repo:
        page = await repo.ledger("l").page("p")  # empty: evictable without a cloud
        db = page.db
        real_close = db.writer.close

        async def failing_close() -> None:
            raise sqlite3.OperationalError("injected: unable to close")

        db.writer.close = failing_close  # type: ignore[method-assign]
        with pytest.raises(sqlite3.OperationalError):
            await page.close()
        with pytest.raises(NotEvictableError, match="writer"):
            await repo.evict(b"l", b"p")
        assert repo.page_path(b"l", b"p").exists() and not repo.is_evicted(b"l", b"p")
        db.writer.close = real_close  # type: ignore[method-assign]
        assert await repo.evict(b"l", b"p") > 0
        assert _is_closed(db.writer.raw) and repo.is_evicted(b"l", b"p")


async def test_a_write_refused_on_a_lost_page_does_not_get_its_wal_removed_at_the_next_start(
    tmp_path: Path,
) -> None:
    # A write to a page with no page.sqlite marks it unwritten before it opens it (the
    # page is about to be made); the open is refused (its -wal remains), and the mark
    # stayed: the next start took the page for one a crash cut short and removed its
    # directory, -wal and all, so the page was no longer listed as lost, nor checked.
    async with await Repository.open(tmp_path) as repo:
        page = await repo.ledger("l").page("p")
        await page.put(b"k", b"v")
        await page.flush()
        path = repo.page_path(b"l", b"p")
        wal = path.with_name("page.sqlite-wal").read_bytes()
    for f in path.parent.iterdir():
        f.unlink()
    path.with_name("page.sqlite-wal").write_bytes(wal)
    async with await Repository.open(tmp_path) as repo:
        with pytest.raises(CorruptDatabaseError, match="remains"):
            await repo.ledger("l").page("p")
        with pytest.raises(CorruptDatabaseError, match="remains"):
            await repo.acquire_new(b"l", b"p")  # (a write's open: the API's PUT)
    async with await Repository.open(tmp_path) as repo:
        assert await repo.ledger("l").lost_pages() == [b"p"]
    assert path.with_name("page.sqlite-wal").read_bytes() == wal


async def test_a_page_close_failing_in_a_repository_close_leaves_nothing_else_open(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A repository close closed its pages one by one and stopped at the first whose
    # close raised: the pages after it stayed open, page_usage too, and the repository
    # lock stayed held, so it could not be opened again in this process. Now every
    # page closes, what the failure left open is tried once more and logged, and the
    # repository closes.
    repo = await Repository.open(tmp_path)
    first = await repo.ledger("l").page("a")
    second = await repo.ledger("l").page("b")
    await first.put(b"k", b"v")
    await second.put(b"k", b"v")
    db = first.db
    real_close = db.reader.close

    async def failing_close() -> None:
        raise sqlite3.OperationalError("injected: unable to close")

    db.reader.close = failing_close  # type: ignore[method-assign]
    with caplog.at_level(logging.ERROR):
        await repo.close()
    assert second.closed and _is_closed(second.db.writer.raw) and repo.usage.closed
    assert db.unclosed == ["reader"]
    assert any("reader" in r.getMessage() for r in caplog.records)
    db.reader.close = real_close  # type: ignore[method-assign]
    await db.close()
    async with await Repository.open(tmp_path) as again:
        assert await (await again.ledger("l").page("b")).get(b"k") == b"v"


async def test_a_page_kept_aside_after_a_failed_close_counts_against_max_open_pages(
    tmp_path: Path,
) -> None:
    # A page whose close failed left the open set, its connections still open: the
    # next opens took its slot, and with max_open_pages=2 three pages' connections
    # were open at once. Now it counts until a close of it succeeds; with every other
    # slot busy the refusal says why, and a later open retries its close.
    async with await Repository.open(tmp_path, max_open_pages=2) as repo:
        kept = await repo.ledger("l").page("kept")
        db = kept.db
        real_close = db.reader.close

        async def failing_close() -> None:
            raise sqlite3.OperationalError("injected: unable to close")

        db.reader.close = failing_close  # type: ignore[method-assign]
        with pytest.raises(sqlite3.OperationalError):
            await kept.close()
        assert db.unclosed == ["reader"] and not repo.is_open(b"l", b"kept")

        a = await repo.ledger("l").page("a")
        with a.lease():  # busy: the only slot left
            with pytest.raises(TooManyOpenPagesError) as refused:
                await repo.ledger("l").page("b")
            text = str(refused.value)
            assert "max_open_pages 2" in text and "1 kept aside" in text, text
            assert "closing them failed" in text and "page kept" in text, text
            assert not repo.is_open(b"l", b"b") and len(repo.open_pages()) == 1
        # Idle now: opening b closes a for room (the page kept aside still counts).
        b = await repo.ledger("l").page("b")
        assert a.closed and not b.closed and db.unclosed == ["reader"]

        db.reader.close = real_close  # type: ignore[method-assign]
        with b.lease():  # the open past the bound retries the close kept aside
            c = await repo.ledger("l").page("c")
        assert not c.closed and not b.closed and db.unclosed == []
        assert _is_closed(db.reader.raw) and len(repo.open_pages()) == 2
        again = await repo.ledger("l").page("kept")  # its slot was given back
        assert not again.closed and again is not kept
