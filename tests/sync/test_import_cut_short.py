"""A download stopped in the middle of a pack: the pack's pages not imported yet stay held."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from ledgerd.store.page import exchange as ex
from ledgerd.sync.errors import SyncStoppedError
from ledgerd.sync.folder import FolderStore
from tests.sync.test_engine import _keys, device


async def test_a_stop_during_a_packs_import_leaves_its_other_pages_held(
    tmp_path: Path, bucket: FolderStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The soak's stall: a device stopped (SIGTERM) while it imported a pack of several
    pages had dropped the pack from its log before its pages were in, and saved the
    log so (the download's last save). The pages it had not reached never got that
    pack's commits, and every later pack of theirs waited for good ("waits for what
    no pack seen holds: tree node ... a pack edits is not here")."""
    async with device(tmp_path / "a", bucket) as a:
        await (await a.repo.ledger("l").page("p0")).put(b"k", b"0")
        await a.engine.sync()  # pack 1: p0
        for name in ("p1", "p2"):
            await (await a.repo.ledger("l").page(name)).put(b"k", name.encode())
        await a.engine.sync()  # pack 2: p1 and p2

        real = ex.apply_delta
        reached = asyncio.Event()
        pages: list[bytes] = []

        async def apply_delta(page: Any, *args: Any, **kw: Any) -> Any:
            pages.append(page.id)
            if len(pages) == 3:  # pack 2's second page: the stop comes now
                reached.set()
                await asyncio.Event().wait()
            return await real(page, *args, **kw)

        monkeypatch.setattr(ex, "apply_delta", apply_delta)
        async with device(tmp_path / "b", bucket) as b:
            task = asyncio.create_task(b.engine.sync())
            await reached.wait()
            await b.engine.stop()  # what SIGTERM does
            with pytest.raises(SyncStoppedError):
                await task
        assert pages == [b"p0", b"p1", b"p2"]
        monkeypatch.setattr(ex, "apply_delta", real)

        async with device(tmp_path / "b", bucket) as b:
            await b.engine.sync()
            assert await _keys(b.repo, "l", "p2") == {b"k": b"p2"}
            # A later pack of that page builds on what the lost one brought.
            await (await a.repo.ledger("l").page("p2")).put(b"k2", b"more")
            await a.engine.sync()
            await b.engine.sync()
            assert await _keys(b.repo, "l", "p2") == {b"k": b"p2", b"k2": b"more"}
            assert b.engine.problems() == []
