"""A pack this device listed but had not imported when its writer's compaction deleted
it (an import backlog longer than the compaction grace): the pages in it start again
from the checkpoints that covered it, as after an absence, rather than stay behind."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ledgerd.sync.checkpoint_policy import REJOINING
from ledgerd.sync.folder import FolderStore
from tests.sync.test_compaction import Clock
from tests.sync.test_engine import _keys, device

GRACE = 60.0


@pytest.mark.parametrize("both_gone", [False, True])
async def test_a_pack_compacted_before_its_import_is_made_up_from_the_checkpoint(
    tmp_path: Path, bucket: FolderStore, both_gone: bool
) -> None:
    """B lists A's pack P and is stopped before importing it; A uploads Q on top of P
    and compacts P away (and, with ``both_gone``, Q too before B reads it). B skipped
    P as gone, then Q waited for P's commits for good ("a pack edits is not here"),
    or with both gone B was silently behind with nothing in status. Now B takes the
    page's checkpoint, keeps its own write made meanwhile, and both converge."""
    clock = Clock()
    kw: dict[str, Any] = {"clock": clock, "checkpoint_interval": 0, "compaction_grace": GRACE}
    async with device(tmp_path / "a", bucket, **kw) as a, device(tmp_path / "b", bucket, **kw) as b:
        pa = await a.repo.ledger("l").page("p")
        for i in range(50):
            await pa.put(b"k%03d" % i, b"one")
        await a.engine.sync()
        await b.engine.sync()
        await pa.put(b"k001", b"two")
        await a.engine.sync()  # pack P
        await b.engine.feed.list_new()  # B lists P; a stop comes before its import
        clock.now += GRACE + 60
        await b.engine.feed.list_new()  # B lists again: it is not away
        await pa.put(b"k002", b"three")
        await a.engine.sync()  # pack Q, on top of P
        assert (await a.engine.compact()).packs_deleted  # P goes: a checkpoint covers it
        if both_gone:
            await b.engine.feed.list_new()
            clock.now += GRACE + 60
            await b.engine.feed.list_new()
            await a.engine.sync()
            assert (await a.engine.compact()).packs_deleted  # Q goes too
        pb = await b.repo.ledger("l").page("p")
        await pb.put(b"from b", b"meanwhile")
        await b.engine.sync()
        await a.engine.sync()
        await b.engine.sync()
        want = {**{b"k%03d" % i: b"one" for i in range(50)}, b"from b": b"meanwhile"}
        want |= {b"k001": b"two", b"k002": b"three"}
        assert await _keys(b.repo) == want
        assert await _keys(a.repo) == want
        assert not b.engine.problems()
        assert await b.repo.get_meta(REJOINING) is None


async def test_a_page_written_before_the_first_sync_is_carried_over_onto_the_checkpoint(
    tmp_path: Path, bucket: FolderStore
) -> None:
    """C wrote the page before it ever listed the bucket; meanwhile A wrote it and
    compacted its packs away. C's first sync skipped the checkpoint (C holds the page)
    and its log began at A's first pack still listed: that pack waited for the
    compacted ones for ever. Now C carries its writes over onto the checkpoint."""
    clock = Clock()
    kw: dict[str, Any] = {"clock": clock, "checkpoint_interval": 0, "compaction_grace": GRACE}
    async with device(tmp_path / "a", bucket, **kw) as a:
        pa = await a.repo.ledger("l").page("p")
        await pa.put(b"k", b"a1")
        await pa.put(b"gone", b"a1")
        await a.engine.sync()
        await pa.put(b"k", b"a2")
        await pa.delete(b"gone")
        await a.engine.sync()
        assert (await a.engine.compact()).packs_deleted is not None
        clock.now += GRACE + 60
        await pa.put(b"after", b"a3")
        await a.engine.sync()
        assert (await a.engine.compact()).packs_deleted
        async with device(tmp_path / "c", bucket, **kw) as c:
            pc = await c.repo.ledger("l").page("p")
            await pc.put(b"c", b"offline on c")
            await pc.flush()
            await c.engine.sync()
            await a.engine.sync()
            await c.engine.sync()
            want = {b"k": b"a2", b"after": b"a3", b"c": b"offline on c"}
            assert await _keys(c.repo) == want
            assert await _keys(a.repo) == want
            assert not c.engine.problems()
