"""A conflict's resolution that takes a value this device never read.

A resolver answers a side ("left" or "right"): the resolution is this device's
write of that side's value, which it uploads with its next pack. The value may be
LAZY and unread here, in the other device's pack, and that pack may be compacted
before the upload, with no checkpoint holding a value that was superseded since.
So the resolution stores the value's pieces here first (``ObjectStore.hold``).
(Found by the simulation, seed 4637: the device was away ten hours between its
resolution and its upload; its page could never upload again.)"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from ledgerd.store import Page, Priority, Repository
from ledgerd.store.pieces import digest as dg
from ledgerd.store.pieces import split
from ledgerd.store.tree import btree, dots
from ledgerd.store.tree.merge import Choice, MergeRequest, Policy
from ledgerd.sync.engine import SyncEngine
from ledgerd.sync.folder import FolderStore
from tests.sync.test_engine import Device

BIG = os.urandom(10_000)
BIG_DIGEST = split.split_bytes(BIG)[1].digest


async def _take_the_big_one(req: MergeRequest) -> dict[bytes, Choice]:
    """Take the side whose value is not inline (the other device's big value)."""
    out: dict[bytes, Choice] = {}
    for c in req.conflicts:
        left = c.left.value if c.left is not None else dg.TOMBSTONE
        out[c.key] = "left" if not dg.is_inline(left) and left != dg.TOMBSTONE else "right"
    return out


class _Resolvers:
    connected = True

    def resolver_for(self, ledger: bytes) -> object:
        return _take_the_big_one if self.connected else None


@asynccontextmanager
async def _device(
    path: Path, bucket: FolderStore, resolvers: _Resolvers | None = None
) -> AsyncIterator[Device]:
    engine = SyncEngine(bucket, keys=None, compaction_settle=0.0)
    resolvers = resolvers or _Resolvers()
    repo = await Repository.open(path, hooks=engine.hooks(resolvers=resolvers))  # type: ignore[arg-type]
    await engine.start(repo, background=False)
    try:
        yield Device(repo, engine, bucket)  # type: ignore[arg-type]
    finally:
        await repo.close()


async def _concurrent(a: Device, b: Device) -> tuple[Page, Page]:
    """Page p on a custom policy: A's LAZY big value of k, uploaded; B's small one, not."""
    pa = await a.repo.ledger("l").page("p")
    await pa.set_policy(Policy.CUSTOM)
    await pa.put(b"k", BIG, Priority.LAZY)
    await a.engine.sync()
    pb = await b.repo.ledger("l").page("p")
    await pb.set_policy(Policy.CUSTOM)
    await pb.put(b"k", b"small")
    return pa, pb


async def test_a_resolution_uploads_a_lazy_value_whose_pack_went_meanwhile(
    tmp_path: Path, bucket: FolderStore
) -> None:
    """B resolves k by taking A's LAZY value, unread on B. Before B uploads, A writes k
    again and compaction deletes A's packs under a checkpoint holding only the later
    value: B must upload A's first value with its resolution, from what it holds, and
    a new device must be able to read it."""
    async with _device(tmp_path / "a", bucket) as a, _device(tmp_path / "b", bucket) as b:
        pa, pb = await _concurrent(a, b)
        await b.engine.round()  # b's write up, a's pack in: the resolver takes a's value
        await pb.try_merge()
        resolved = dots.versions(await btree.lookup(pb.nodes, pb.graph.head.root, b"k"))
        assert [v[0] for v in resolved] == [BIG_DIGEST] and pb.graph.conflicts == 0
        await pa.put(b"k", b"later")
        await a.engine.sync()
        cover = {
            a.engine.device: len(list((tmp_path / "bucket" / "packs").glob(f"*{a.engine.device}*")))
        }
        feed_time = await a.engine.feed.feed_time()
        assert await a.engine.checkpoints.write(pa, a.repo.device_id, feed_time, cover, force=True)
        for f in (tmp_path / "bucket" / "packs").iterdir():  # as compaction deletes them
            if a.engine.device in f.name:
                f.unlink()
        await b.engine.sync()
        assert not b.engine.health()["reasons"]  # (it was: the value could not be fetched)
        async with _device(tmp_path / "c", bucket) as c:
            await c.engine.sync()
            pc = await c.repo.ledger("l").page("p")
            assert await pc.objects.read_all(BIG_DIGEST) == BIG  # from b's pack


async def test_a_resolution_that_could_not_fetch_its_value_runs_again_at_the_next_round(
    tmp_path: Path, bucket: FolderStore
) -> None:
    """The value a resolution takes could not be fetched (the network): nothing would
    start the resolution again if no pack came, so each sync round does (sim seed 2995,
    where a GET failed once and the conflict waited for good)."""
    resolvers = _Resolvers()
    async with (
        _device(tmp_path / "a", bucket) as a,
        _device(tmp_path / "b", bucket, resolvers) as b,
    ):
        pa, pb = await _concurrent(a, b)
        resolvers.connected = False
        await b.engine.sync()  # a's pack in; the conflict waits for a resolver
        assert pb.graph.conflicts == 1
        packs = tmp_path / "bucket" / "packs"
        away = tmp_path / "away"
        away.mkdir()
        for f in packs.iterdir():
            if a.engine.device in f.name:
                f.rename(away / f.name)
        resolvers.connected = True
        assert not await pb.try_merge()  # the value cannot be fetched now
        assert pb.resolution_fetch_failed and pb.pending_conflict
        for f in away.iterdir():
            f.rename(packs / f.name)
        await b.engine.round()
        assert pb.graph.conflicts == 0 and not pb.pending_conflict
        assert await pb.objects.read_all(BIG_DIGEST) == BIG
