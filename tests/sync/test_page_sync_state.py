"""A page's ``sync`` state in ``/v1/status`` (:meth:`SyncEngine.page_status`)."""

from __future__ import annotations

from pathlib import Path

from ledgerd.store import Repository
from ledgerd.sync.engine import SyncEngine
from ledgerd.sync.folder import FolderStore


async def test_a_page_with_a_write_in_its_journal_is_pending_not_synced(tmp_path: Path) -> None:
    # A put is acknowledged once in the page's journal, which commits a moment later:
    # until then status said 'synced' (it counted only commits waiting for upload),
    # while du's 'sync' of the same page said 'pending' (no journal open).
    (tmp_path / "bucket").mkdir()
    engine = SyncEngine(FolderStore(tmp_path / "bucket"))
    repo = await Repository.open(tmp_path / "a", hooks=engine.hooks())
    try:
        await engine.start(repo, background=False)
        page = await repo.ledger("l").page("p")
        await page.put(b"k", b"v")
        await page.flush()
        await engine.round(download=False)
        assert (await engine.page_status(page))["sync"] == "synced"
        async with page.graph.lock:  # the journal's commit waits for it
            await page.put(b"k2", b"acknowledged, in the journal")
            assert page.writer.uncommitted
            assert (await engine.page_status(page))["sync"] == "pending"
        await page.flush()
        assert (await engine.page_status(page))["sync"] == "pending"
        await engine.round(download=False)
        assert (await engine.page_status(page))["sync"] == "synced"
    finally:
        await repo.close()
