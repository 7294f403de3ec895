"""A restarted device's first listing starts where the last one did, not a window below
the newest name: a pack named behind that name, by a device whose clock is behind and
that named it from a listing a moment old, is found at once (simulation seed 150454)."""

from __future__ import annotations

from pathlib import Path

from ledgerd.sync.folder import FolderStore
from tests.sync.test_compaction import Clock, _packs
from tests.sync.test_engine import _keys, device

BEHIND = 3600.0


async def test_a_pack_named_behind_the_newest_name_is_found_after_a_restart(
    tmp_path: Path, bucket: FolderStore
) -> None:
    clock = Clock()

    def behind() -> float:
        return clock.now - BEHIND

    async with device(tmp_path / "b", bucket, clock=behind) as b:
        pb = await b.repo.ledger("l").page("p")
        async with device(tmp_path / "a", bucket, clock=clock) as a:
            pa = await a.repo.ledger("l").page("p")
            await pa.put(b"first", b"a")
            await a.engine.sync()
            await b.engine.sync()
            await a.engine.sync()
        clock.now += 600  # A's next pack is named ten minutes on
        await b.engine.feed.list_new()  # B's newest name: A's first pack
        async with device(tmp_path / "a", bucket, clock=clock) as a:
            pa = await a.repo.ledger("l").page("p")
            await pa.put(b"second", b"a")
            await a.engine.sync()  # its listing sees its own pack: the newest name
        # B writes and uploads at once: its listing is fresh, so it names its pack
        # after the newest name it listed, A's first, ten minutes behind A's second.
        await pb.put(b"from b", b"b")
        await b.engine.round(download=False, full=False)
        mine = [pn for pn in _packs(tmp_path / "bucket") if pn.device == b.engine.ctx.device]
        theirs = [pn for pn in _packs(tmp_path / "bucket") if pn.device != b.engine.ctx.device]
        assert max(pn.time for pn in mine) < max(pn.time for pn in theirs) - 300_000
        async with device(tmp_path / "a", bucket, clock=clock) as a:
            await a.engine.round(download=True, full=False)  # one listing: it is there
            assert (await _keys(a.repo))[b"from b"] == b"b"
