"""Edited sections (sync.upload EDIT_BASES): a page's tree nodes sent as edits of the
nodes they replace, read by devices whose page was evicted and restored from a
checkpoint, or started from one."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from ledgerd.store import Repository
from ledgerd.sync.folder import FolderStore
from tests.sync.test_engine import Device, _keys, device


async def _write(repo: Repository, rng: random.Random, n: int = 300) -> None:
    pg = await repo.ledger("l").page("p")
    await pg.write([(rng.randbytes(8).hex().encode(), rng.randbytes(100)) for _ in range(n)])


async def _round(*devices: Device) -> None:
    for _ in range(2):
        for d in devices:
            await d.engine.sync()


async def _both_write(x: Device, y: Device, rng: random.Random, n: int) -> None:
    """``x`` writes ``n`` keys and uploads them, ``y`` writes ``n``, both sync: they
    then hold the same keys, and no problem is left."""
    await _write(x.repo, rng, n)
    await x.engine.sync()
    await _write(y.repo, rng, n)
    await _round(x, y)
    assert await _keys(x.repo) == await _keys(y.repo)
    _clean(x, y)


def _clean(*devices: Device) -> None:
    for d in devices:
        assert not d.engine.problems(), d.engine.problems()


@pytest.mark.parametrize("evicts", ["reader", "writer", "both"])
@pytest.mark.parametrize("checkpoint", ["old", "new"])
async def test_edited_packs_after_a_restore(
    tmp_path: Path, bucket: FolderStore, evicts: str, checkpoint: str
) -> None:
    """A writes and uploads round after round (each pack edits its last tree); a
    checkpoint is written early or late; a page evicted and restored (from that
    checkpoint and the packs above its cover) still imports A's next edited packs."""
    rng = random.Random(5)
    async with (
        device(tmp_path / "a", bucket, checkpoint_interval=0) as a,
        device(tmp_path / "b", bucket, checkpoint_interval=0) as b,
    ):
        for i in range(8):
            await _write(a.repo, rng, 1000 if (checkpoint == "new") == (i >= 5) else 30)
            await a.engine.sync()
        await b.engine.sync()
        pb = await b.repo.ledger("l").page("p")
        await pb.put(b"from b", b"1")
        await _round(a, b)
        for _ in range(3):
            if evicts in ("reader", "both"):
                assert await b.repo.evict(b"l", b"p") > 0
            if evicts in ("writer", "both"):
                assert await a.repo.evict(b"l", b"p") > 0
            await _both_write(a, b, rng, 40)


async def test_a_new_device_from_a_checkpoint_reads_later_edited_packs(
    tmp_path: Path, bucket: FolderStore
) -> None:
    rng = random.Random(6)
    async with device(tmp_path / "a", bucket, checkpoint_interval=0) as a:
        for _ in range(6):
            await _write(a.repo, rng, 1000)
            await a.engine.sync()
        for _ in range(3):
            await _write(a.repo, rng, 20)
            await a.engine.sync()
        async with device(tmp_path / "c", bucket) as c:
            await c.engine.sync()
            assert c.engine.checkpoints.covers
            for _ in range(3):
                await _both_write(a, c, rng, 20)
                assert await c.repo.evict(b"l", b"p") > 0


async def test_three_devices_evicting_every_round(tmp_path: Path, bucket: FolderStore) -> None:
    """The crash torture's shape, without its clock: three devices write, sync and
    evict the page in a random order, a checkpoint after every upload. A device
    whose page was restored from a checkpoint wrote checkpoints claiming all its own
    packs while some of them still waited to be imported into the page: a device
    restoring from such a checkpoint skipped those packs, and the packs built on
    them waited for good ("waits for what no pack seen holds"; five seeds of six)."""
    rng = random.Random(0)
    async with (
        device(tmp_path / "a", bucket, checkpoint_interval=0) as a,
        device(tmp_path / "b", bucket, checkpoint_interval=0) as b,
        device(tmp_path / "c", bucket, checkpoint_interval=0) as c,
    ):
        devs = [a, b, c]
        for _ in range(60):
            d = rng.choice(devs)
            op = rng.random()
            if op < 0.45:
                await _write(d.repo, rng, rng.choice([20, 300, 800]))
            elif op < 0.85:
                await d.engine.sync()
            else:
                await d.engine.sync()
                if not d.repo.is_evicted(b"l", b"p") and d.repo.page_exists(b"l", b"p"):
                    await d.repo.evict(b"l", b"p")
        for d in devs:  # restored on use: packs listed meanwhile come with the next rounds
            await d.repo.ledger("l").page("p")
        for _ in range(10):
            for d in devs:
                await d.engine.sync()
        _clean(*devs)
        keys = [await _keys(d.repo) for d in devs]
        assert keys[0] == keys[1] == keys[2]
