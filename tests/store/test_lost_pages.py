"""A lost page: its ``page.sqlite`` is gone while its -wal remains (real files).

It is refused as damaged by every use, kept by a start (its -wal may hold committed
data), and deleted only when asked."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledgerd.store import Repository
from ledgerd.store.errors import CorruptDatabaseError
from ledgerd.store.repo.repository import UNWRITTEN, encode_name
from ledgerd.store.sqlite.schema import FORMAT_VERSION


async def _lose(root: Path, ledger: bytes = b"l", page_id: bytes = b"p") -> tuple[Path, bytes]:
    """Write a page (and another one), then delete its page.sqlite and keep its -wal."""
    async with await Repository.open(root) as repo:
        page = await repo.ledger(ledger).page(page_id)
        await page.put(b"k", b"v")
        await page.flush()
        await (await repo.ledger(ledger).page("other")).put(b"k", b"v")
        wal = repo.page_path(ledger, page_id).with_name("page.sqlite-wal")
        held = wal.read_bytes()
    for f in wal.parent.iterdir():
        f.unlink()
    wal.write_bytes(held)
    return wal, held


def _mark_unwritten(root: Path, ledger: bytes, page_id: bytes) -> Path:
    mark = root / str(FORMAT_VERSION) / UNWRITTEN / encode_name(ledger) / encode_name(page_id)
    mark.parent.mkdir(parents=True, exist_ok=True)
    mark.touch()
    return mark


async def test_a_lost_page_still_marked_unwritten_is_kept_by_a_start(tmp_path: Path) -> None:
    # A start took a marked page with no page.sqlite for one whose making was cut
    # short, and removed its directory, its -wal (which can hold committed data) too.
    wal, held = await _lose(tmp_path)
    _mark_unwritten(tmp_path, b"l", b"p")
    async with await Repository.open(tmp_path) as repo:
        assert wal.read_bytes() == held
        assert await repo.ledger("l").lost_pages() == [b"p"]
        with pytest.raises(CorruptDatabaseError, match="page.sqlite-wal remains"):
            await repo.ledger("l").page("p")
    async with await Repository.open(tmp_path) as repo:  # and the next start too
        assert wal.read_bytes() == held
        assert await repo.ledger("l").lost_pages() == [b"p"]


async def test_a_write_to_a_lost_page_marks_nothing_a_start_would_remove(tmp_path: Path) -> None:
    # A write into a page with no page.sqlite marked it unwritten before its open
    # failed; the mark stayed, and the next start removed the directory and its -wal.
    wal, held = await _lose(tmp_path)
    async with await Repository.open(tmp_path) as repo:
        with pytest.raises(CorruptDatabaseError, match="page.sqlite-wal remains"):
            await repo.acquire_new(b"l", b"p")
        assert not (tmp_path / str(FORMAT_VERSION) / UNWRITTEN / encode_name(b"l")).exists()
    async with await Repository.open(tmp_path) as repo:
        assert wal.read_bytes() == held
        assert await repo.ledger("l").lost_pages() == [b"p"]


async def test_deleting_a_lost_page_removes_what_remains_of_it(tmp_path: Path) -> None:
    # It was not listed, so a delete said page_not_found: the operator had no way out
    # but removing the files by hand.
    wal, _ = await _lose(tmp_path)
    async with await Repository.open(tmp_path) as repo:
        await repo.ledger("l").delete_page("p")
        assert not wal.parent.exists()
        assert await repo.ledger("l").lost_pages() == []
        assert await repo.ledger("l").pages() == [b"other"]
        page = await repo.ledger("l").page("p")  # a write makes it anew
        await page.put(b"k", b"new")
        assert await page.get(b"k") == b"new"
        assert await repo.ledger("l").pages() == [b"other", b"p"]


async def test_a_lost_page_is_not_evicted_as_not_stored(tmp_path: Path) -> None:
    wal, held = await _lose(tmp_path)
    async with await Repository.open(tmp_path) as repo:
        with pytest.raises(CorruptDatabaseError, match="page.sqlite-wal remains"):
            await repo.evict(b"l", b"p")
        assert not repo.is_evicted(b"l", b"p")
    assert wal.read_bytes() == held


@pytest.mark.parametrize("leftover", ["", "-journal", "-wal", "-shm"])
async def test_what_a_making_cut_short_leaves_is_removed_and_never_taken_for_a_lost_page(
    tmp_path: Path, leftover: str
) -> None:
    # Only page.sqlite.new and its side files are a making's: removed at start, the
    # page marked unwritten is then made anew by its next use.
    async with await Repository.open(tmp_path) as repo:
        path = repo.page_path(b"l", b"p")
    path.parent.mkdir(parents=True)
    path.with_name("page.sqlite.new").write_bytes(b"")
    if leftover:
        path.with_name("page.sqlite.new" + leftover).write_bytes(b"x" * 100)
    _mark_unwritten(tmp_path, b"l", b"p")
    async with await Repository.open(tmp_path) as repo:
        assert not path.parent.exists()
        assert await repo.ledger("l").lost_pages() == []
        page = await repo.ledger("l").page("p")
        await page.put(b"k", b"v")
        assert await page.get(b"k") == b"v"
