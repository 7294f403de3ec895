"""An upload round with more pages waiting than max_open_pages."""

from __future__ import annotations

from pathlib import Path

from ledgerd.store import Repository
from ledgerd.sync.engine import SyncEngine
from ledgerd.sync.folder import FolderStore


async def test_a_round_with_more_waiting_pages_than_may_be_open_uploads_them_all(
    tmp_path: Path,
) -> None:
    # An upload round kept up to LEASE_MOST (64) pages open until its pack was up,
    # whatever max_open_pages was: with more pages waiting than that bound (after a
    # restart, say, with a backlog) the pages past it failed with "all N open pages
    # are in use" (left for a later round, said in status), and so did every other
    # open meanwhile: a client's request (503 unavailable), a check (which listed the
    # page as a sqlite problem). A round now keeps at most half of max_open_pages.
    (tmp_path / "bucket").mkdir()
    engine = SyncEngine(FolderStore(tmp_path / "bucket"))
    repo = await Repository.open(tmp_path / "a", hooks=engine.hooks(), max_open_pages=4)
    try:
        await engine.start(repo, background=False)
        for i in range(10):
            page = await repo.ledger("l").page(f"p{i}")
            await page.put(b"k", b"v%d" % i)
            await page.flush()
        await engine.round(download=False)
        assert engine.problems() == []
        statuses = [
            (await engine.page_status(await repo.ledger("l").page(f"p{i}"))) for i in range(10)
        ]
        assert [s["sync"] for s in statuses] == ["synced"] * 10, statuses
    finally:
        await repo.close()
