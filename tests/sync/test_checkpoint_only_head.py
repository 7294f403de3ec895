"""A commit may exist only in a checkpoint: compaction deletes the packs a checkpoint
covers, the one holding the checkpoint's head too (and a page started from that
checkpoint, or restored from it, has that head without any pack holding it). The
devices that start from the checkpoint, and those that read the packs before they
went, converge on it and build on it; each is synced."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from ledgerd.store import commit
from ledgerd.sync import layout
from ledgerd.sync.checkpoints import Checkpoints
from ledgerd.sync.folder import FolderStore
from ledgerd.sync.layout import PackName
from ledgerd.sync.s3 import S3Store
from tests.sync.test_compaction import Clock, _packs
from tests.sync.test_engine import Device, _keys, device

GRACE = 5.0


async def _checkpoint_heads(d: Device) -> set[bytes]:
    cps: Checkpoints = d.engine.checkpoints
    heads = set()
    async for cn in cps.names():
        heads.add(commit.decode((await cps.read(cn)).commits[0]).id)
    return heads


async def _settle(*devices: Device) -> None:
    for _ in range(2):
        for d in devices:
            await d.engine.sync()


def _synced(*devices: Device) -> None:
    for i, d in enumerate(devices):
        assert not d.engine.problems(), (i, d.engine.problems())
        assert d.engine.status()["gaps"] == []
        assert d.engine.health()["synced"], (i, d.engine.health()["reasons"])


async def _head(d: Device) -> bytes:
    pg = await d.repo.ledger("l").page("p")
    heads = await pg.heads()
    assert len(heads) == 1
    return heads[0].id


async def _put(d: Device, rng: random.Random, n: int = 50) -> None:
    pg = await d.repo.ledger("l").page("p")
    await pg.write([(rng.randbytes(8).hex().encode(), rng.randbytes(100)) for _ in range(n)])


async def test_a_head_only_in_a_checkpoint_is_built_on_and_synced(
    tmp_path: Path, bucket: FolderStore
) -> None:
    clock = Clock()
    kw: dict[str, Any] = {"clock": clock, "checkpoint_interval": 0, "compaction_grace": GRACE}
    rng = random.Random(7)
    root = tmp_path / "bucket"
    async with (
        device(tmp_path / "a", bucket, **kw) as a,
        device(tmp_path / "b", bucket, **kw) as b,
    ):
        for _ in range(4):
            clock.now += 1
            await _put(a, rng, 300)
            await _settle(a, b)
        head = await _head(a)
        clock.now += GRACE + 1
        await _settle(a, b)
        report = await a.engine.compact()
        assert report.packs_deleted > 0
        # A's head is in a checkpoint and in no pack: every pack of A is gone.
        assert _packs(root) == []
        assert head in await _checkpoint_heads(a)
        await _settle(a, b)
        assert await _head(b) == head
        _synced(a, b)

        async with device(tmp_path / "n", bucket, **kw) as n:
            await n.engine.sync()  # starts from the checkpoint: its head, in no pack
            assert await _head(n) == head
            want = await _keys(a.repo)
            assert await _keys(n.repo) == want
            _synced(n)
            # Everyone builds on that head, concurrently; all converge.
            for d in (n, a, b):
                await _put(d, rng)
                clock.now += 0.5
                await d.engine.sync()
            await _settle(n, a, b)
            keys = [await _keys(d.repo) for d in (n, a, b)]
            assert keys[0] == keys[1] == keys[2]
            _synced(n, a, b)

            # A merge made on a restore: B's page is evicted, A and N write on the same
            # head, and B restores the page from the checkpoint and both packs.
            await _settle(n, a, b)
            assert await b.repo.evict(b"l", b"p") > 0
            await _put(a, rng)
            await _put(n, rng)
            clock.now += 0.5
            await a.engine.sync()
            clock.now += 0.5
            await n.engine.round()  # up without reading A's pack: two heads
            await b.engine.sync()  # lists both packs; the page stays evicted
            assert b.repo.is_evicted(b"l", b"p")
            await b.repo.ledger("l").page("p")  # restored: checkpoint, packs, a merge
            await _settle(b, a, n)
            keys = [await _keys(d.repo) for d in (n, a, b)]
            assert keys[0] == keys[1] == keys[2]
            _synced(n, a, b)

            # Each compacts past the grace: the newest heads go into checkpoints only,
            # and a new device starts from them.
            clock.now += GRACE + 1
            await _settle(a, b, n)
            for d in (a, b, n):
                await d.engine.compact()
            await _settle(a, b, n)
            _synced(a, b, n)
            heads = {await _head(d) for d in (a, b, n)}
            assert len(heads) == 1
            async with device(tmp_path / "m", bucket, **kw) as m:
                await m.engine.sync()
                assert await _keys(m.repo) == keys[0]
                assert await _head(m) in heads
                _synced(m)


async def test_a_restore_imports_a_merge_listed_before_a_pack_it_merges(
    tmp_path: Path, bucket: FolderStore
) -> None:
    """Packs of one feed time are listed by device name: X's merge of Y's pack can
    have Y's pack's feed time and come first. A restore of an evicted page takes it
    once Y's pack is in, instead of leaving it waiting (a problem in status) for the
    next round."""
    clock = Clock()
    kw: dict[str, Any] = {"clock": clock, "checkpoint_interval": 0}
    rng = random.Random(8)
    async with (
        device(tmp_path / "x", bucket, **kw) as d1,
        device(tmp_path / "y", bucket, **kw) as d2,
        device(tmp_path / "r", bucket, **kw) as r,
    ):
        x, y = sorted((d1, d2), key=lambda d: d.engine.device)  # x's names sort first
        await _put(x, rng)
        await _settle(x, y, r)
        assert await r.repo.evict(b"l", b"p") > 0
        await _put(x, rng)
        clock.now += 1
        await x.engine.round(download=False)
        clock.now += 1
        await _put(y, rng)
        await y.engine.round(download=False)
        await x.engine.sync()  # merges y's pack, in a pack of the same feed time
        merged = [pn for pn in _packs(tmp_path / "bucket")][-2:]
        assert [pn.time for pn in merged] == [merged[0].time] * 2
        assert merged[0].device == x.engine.device
        await r.repo.ledger("l").page("p")  # restored
        assert not r.engine.problems(), r.engine.problems()
        assert await _head(r) == await _head(x)
        assert await _keys(r.repo) == await _keys(x.repo)
        await _settle(r, x, y)
        _synced(r, x, y)


async def _packs_of(cloud: S3Store) -> dict[str, int]:
    """How many packs each device has in the bucket."""
    out: dict[str, int] = {}
    async for name in cloud.list(layout.PACKS):
        pn = PackName.parse(name)
        assert pn is not None
        out[pn.device] = out.get(pn.device, 0) + 1
    return out


@pytest.mark.parametrize("restorer_first", [True, False])
async def test_a_merge_another_device_uploaded_is_not_uploaded_again(
    tmp_path: Path, moto_store: S3Store, restorer_first: bool
) -> None:
    """B restores its evicted page from A's and N's concurrent packs, merges their heads
    and uploads the merge. A and N then import each other's pack and B's: each makes
    the same merge (deterministic) on the one and finds it in B's. It is in the bucket
    already, so neither uploads it again (each did: a pack holding only that commit).
    ``restorer_first``: B's pack, of the same feed time as N's, is listed before it
    (device names sort so), and waits for it on A: it is tried again in the same
    download, not after the next upload."""
    clock = Clock()
    kw: dict[str, Any] = {"clock": clock, "checkpoint_interval": 0}
    rng = random.Random(9)
    async with (
        device(tmp_path / "d1", moto_store, **kw) as d1,
        device(tmp_path / "d2", moto_store, **kw) as d2,
        device(tmp_path / "d3", moto_store, **kw) as d3,
    ):
        first, mid, last = sorted((d1, d2, d3), key=lambda d: d.engine.device)
        b, n, a = (first, mid, last) if restorer_first else (last, mid, first)
        await _put(a, rng)
        await _settle(a, b, n)
        assert await b.repo.evict(b"l", b"p") > 0
        await _put(a, rng)
        await _put(n, rng)
        clock.now += 0.5
        await a.engine.sync()
        clock.now += 0.5
        await n.engine.round(download=False)  # up without reading A's pack
        await b.engine.sync()  # lists both packs; the page stays evicted
        await b.repo.ledger("l").page("p")  # restored: checkpoint, packs, a merge
        merge = await _head(b)
        await b.engine.sync()  # the merge goes up
        before = await _packs_of(moto_store)
        assert before[b.engine.device] == 1, before
        await _settle(a, n, b)
        assert await _packs_of(moto_store) == before  # nobody uploaded the merge again
        assert [await _head(d) for d in (a, n, b)] == [merge] * 3
        pg = await a.repo.ledger("l").page("p")
        assert len((await pg.load_commit(merge)).parents) == 2
        _synced(a, n, b)
