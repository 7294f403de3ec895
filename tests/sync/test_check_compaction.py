"""``ledgerctl check --cloud`` and ``--repair`` on a bucket that compaction has thinned:
a checkpoint stands for the packs it covers."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from ledgerd.store import Page, Priority
from ledgerd.store.page import check as ck
from ledgerd.sync import check as sc
from ledgerd.sync.cloud import CloudStore
from ledgerd.sync.folder import FolderStore
from tests.sync.test_checkpoints import _load
from tests.sync.test_compaction import Clock, _packs, _write_on_and_compact
from tests.sync.test_engine import Device, _keys, device
from tests.sync.test_engine import encryption as encryption  # the fixture

GRACE = 3600.0


async def _check(d: Device, page: Page, *, repair: bool = False) -> sc.Checked:
    """The check as ``POST /v1/check`` runs it: one BucketIndex per request."""
    index = sc.BucketIndex(d.engine.store, d.engine.codec)
    return await sc.check_page(page, d.engine, index, cloud=True, repair=repair)


def _messages(checked: sc.Checked) -> list[str]:
    return [f"{p.code}: {p.message}" for p in checked.report.open_problems()]


async def _history(clock: Clock, a: Device, b: Device, rng: random.Random) -> None:
    """A writes many rounds (a LAZY value early on, overwritten later) and checkpoints;
    time passes past the grace, both devices syncing now and then (no rejoin)."""
    pa = await a.repo.ledger("l").page("p")
    await pa.put(b"lazy", rng.randbytes(300_000), Priority.LAZY)
    for i in range(10):
        await _load(pa, rng, 1, 500)
        if i == 5:
            await pa.put(b"lazy", rng.randbytes(200_000), Priority.LAZY)
        await a.engine.sync()
        await b.engine.sync()
        clock.now += 60
    for _ in range(5):
        clock.now += GRACE / 4
        await a.engine.sync()
        await b.engine.sync()


async def _compacted(clock: Clock, a: Device, b: Device, rng: random.Random) -> None:
    """:func:`_history`, then A compacts: most of its packs are gone, the old history
    is only in the checkpoint."""
    await _history(clock, a, b, rng)
    report = await a.engine.compact()
    assert report.packs_deleted > 0
    await a.engine.sync()
    await b.engine.sync()


async def test_check_cloud_after_compaction_is_healthy_on_the_writer_and_a_reader(
    tmp_path: Path, bucket: FolderStore, encryption: object
) -> None:
    clock = Clock()
    kw: dict[str, Any] = {"clock": clock, "checkpoint_interval": 0, "compaction_grace": GRACE}
    rng = random.Random(5)
    async with device(tmp_path / "a", bucket, **kw) as a, device(tmp_path / "b", bucket, **kw) as b:
        await b.engine.sync()  # B follows A's history from the start
        pa = await a.repo.ledger("l").page("p")
        await pa.put(b"early", b"1")
        await a.engine.sync()
        await b.engine.sync()
        pb = await b.repo.ledger("l").page("p")
        await pb.put(b"from b", b"b")
        await b.engine.sync()
        await a.engine.sync()
        await _compacted(clock, a, b, rng)
        assert await _keys(b.repo) == await _keys(a.repo)
        for d, pg in ((a, pa), (b, pb)):
            checked = await _check(d, pg)
            assert checked.report.healthy, _messages(checked)
            assert checked.cloud is not None and checked.cloud.packs > 0
        # A device that started from the checkpoint after compaction, too.
        async with device(tmp_path / "c", bucket, **kw) as c:
            await c.engine.sync()
            pc = await c.repo.ledger("l").page("p")
            checked = await _check(c, pc)
            assert checked.report.healthy, _messages(checked)


@pytest.mark.parametrize("who", ["writer", "reader"])
@pytest.mark.parametrize("when", ["index", "section"])
async def test_a_pack_compacted_between_listing_and_reading_is_no_problem(
    tmp_path: Path, bucket: FolderStore, when: str, who: str
) -> None:
    """Compaction runs while the check reads: the packs it lists go before their index
    (or their section) is read. The check skips them; the checkpoint stands for them."""
    clock = Clock()
    kw: dict[str, Any] = {"clock": clock, "checkpoint_interval": 0, "compaction_grace": GRACE}
    rng = random.Random(6)
    async with device(tmp_path / "a", bucket, **kw) as a, device(tmp_path / "b", bucket, **kw) as b:
        await _history(clock, a, b, rng)
        d = a if who == "writer" else b
        store: CloudStore = d.engine.store
        get = store.get
        fired: list[bool] = []

        async def racing(name: str, offset: int = 0, length: int | None = None) -> bytes:
            reads_section = offset > 0
            if not fired and name.startswith("packs/") and reads_section == (when == "section"):
                fired.append(True)
                assert (await a.engine.compact()).packs_deleted > 0
            return bytes(await get(name, offset, length))

        store.get = racing  # type: ignore[method-assign]
        try:
            checked = await _check(d, await d.repo.ledger("l").page("p"))
        finally:
            del store.get
        assert fired
        assert checked.report.healthy, _messages(checked)
        assert not checked.report.problems, _messages(checked)


async def test_repair_restores_a_corrupt_tree_node_from_the_checkpoint(
    tmp_path: Path, bucket: FolderStore, encryption: object
) -> None:
    """C starts the page from A's checkpoint; A compacts; C's head's tree nodes are
    damaged by hand. The bucket holds entries, not trees: the repair rebuilds the page
    from the checkpoint and the packs above it."""
    clock = Clock()
    kw: dict[str, Any] = {"clock": clock, "checkpoint_interval": 0, "compaction_grace": GRACE}
    rng = random.Random(8)
    async with device(tmp_path / "a", bucket, **kw) as a, device(tmp_path / "b", bucket, **kw) as b:
        await _history(clock, a, b, rng)
        async with device(tmp_path / "c", bucket, **kw) as c:
            await c.engine.sync()
            assert (await a.engine.compact()).packs_deleted > 0
            await c.engine.sync()
            pc = await c.repo.ledger("l").page("p")
            want = await _keys(c.repo)
            assert want == await _keys(a.repo)
            root = pc.head.root
            damaged = [root]

            def damage(conn: sqlite3.Connection) -> None:
                for d in damaged:
                    conn.execute("UPDATE objects SET data = ? WHERE digest = ?", (b"junk", d))

            await pc.db.run(damage, write=True)
            pc.objects.clear_cache()
            checked = await ck.check_page(pc)
            assert {p.digest for p in checked.open_problems(ck.CORRUPT_PIECE)} >= set(damaged)

            checked_cloud = await _check(c, pc)
            assert not checked_cloud.report.open_problems(ck.NOT_IN_CLOUD), _messages(checked_cloud)
            repaired = await _check(c, pc, repair=True)
            assert repaired.report.healthy, (_messages(repaired), repaired.notes)
            assert (await ck.check_page(pc)).healthy
            assert await _keys(c.repo) == want
            checked_cloud = await _check(c, pc)
            assert checked_cloud.report.healthy, _messages(checked_cloud)


async def test_what_is_newer_than_the_checkpoint_must_still_be_in_a_pack(
    tmp_path: Path, bucket: FolderStore
) -> None:
    """The checkpoint excuses only what it holds: B's write made after it, whose pack
    is lost, is still reported, and a repair uploads it again. (B writes no checkpoint
    of its own: one would hold that write.)"""
    clock = Clock()
    kw: dict[str, Any] = {"clock": clock, "checkpoint_interval": 0, "compaction_grace": GRACE}
    rng = random.Random(9)
    async with (
        device(tmp_path / "a", bucket, **kw) as a,
        device(tmp_path / "b", bucket, max_checkpoint=1, **kw) as b,  # writes none
    ):
        await _compacted(clock, a, b, rng)
        pb = await b.repo.ledger("l").page("p")
        await pb.put(b"after", b"the checkpoint")
        await b.engine.sync()
        mine = [p for p in _packs(tmp_path / "bucket") if p.device == b.engine.device]
        (tmp_path / "bucket" / mine[-1].name).unlink()
        checked = await _check(b, pb)
        lost = checked.report.open_problems(ck.NOT_IN_CLOUD)
        assert any("writes" in p.message for p in lost), _messages(checked)
        assert {p.code for p in checked.report.open_problems()} == {ck.NOT_IN_CLOUD}
        repaired = await _check(b, pb, repair=True)
        assert repaired.report.healthy, (_messages(repaired), repaired.notes)
        assert (await _check(b, pb)).report.healthy


async def test_a_device_that_rejoined_checks_clean_and_uploads_nothing_it_left_behind(
    tmp_path: Path, bucket: FolderStore
) -> None:
    """D changes a key offline while A compacts past the grace; D's rejoin carries the
    change onto the checkpoint and leaves its old commits behind, never to be uploaded
    on parents the others may not have. ``check --cloud`` on D is healthy, and
    ``--repair`` uploads none of them (it took them for synced commits the bucket lost
    and sent them up on their old parents)."""
    clock = Clock()
    kw: dict[str, Any] = {"clock": clock, "checkpoint_interval": 0, "compaction_grace": GRACE}
    rng = random.Random(8)
    async with device(tmp_path / "a", bucket, **kw) as a:
        pa = await a.repo.ledger("l").page("p")
        async with device(tmp_path / "d", bucket, **kw) as d:
            await _load(pa, rng, 1, 300)
            await a.engine.sync()
            await d.engine.sync()
            pd = await d.repo.ledger("l").page("p")
            await pd.put(b"offline", b"written by d while away")
        await _write_on_and_compact(a, pa, clock, rng, GRACE)
        async with device(tmp_path / "d", bucket, **kw) as d:
            await d.engine.sync()
            pd = await d.repo.ledger("l").page("p")
            assert (await pd.get(b"offline")) == b"written by d while away"
            assert not _messages(checked := await _check(d, pd)), _messages(checked)
            packs = _packs(tmp_path / "bucket")
            checked = await _check(d, pd, repair=True)
            assert checked.report.healthy, _messages(checked)
            assert _packs(tmp_path / "bucket") == packs  # nothing went up


async def test_unreadable_checkpoints_are_a_problem_and_nothing_is_uploaded_again(
    tmp_path: Path, bucket: FolderStore
) -> None:
    """After compaction, the page's checkpoints are damaged: what compaction removed
    cannot be told from what the bucket lost. The check says the checkpoints cannot be
    read, judges nothing missing, and a repair uploads nothing (it would have sent the
    whole compacted history up again)."""
    clock = Clock()
    kw: dict[str, Any] = {"clock": clock, "checkpoint_interval": 0, "compaction_grace": GRACE}
    rng = random.Random(9)
    async with device(tmp_path / "a", bucket, **kw) as a, device(tmp_path / "b", bucket, **kw) as b:
        await _compacted(clock, a, b, rng)
        files = [f for f in (tmp_path / "bucket" / "checkpoints").rglob("*") if f.is_file()]
        assert files
        for f in files:
            f.write_bytes(b"junk" * 100)
        pa = await a.repo.ledger("l").page("p")
        packs = _packs(tmp_path / "bucket")
        for repair in (False, True):
            checked = await _check(a, pa, repair=repair)
            assert not checked.report.healthy
            assert [p.code for p in checked.report.open_problems()] == [ck.CLOUD], _messages(
                checked
            )
            assert "checkpoint" in _messages(checked)[0], _messages(checked)
        assert _packs(tmp_path / "bucket") == packs  # nothing went up


@pytest.mark.parametrize("carry", [False, True])
async def test_check_cloud_is_healthy_on_a_device_back_after_the_grace(
    tmp_path: Path, bucket: FolderStore, carry: bool
) -> None:
    """D held A's early history, was away past the grace while A wrote on and compacted,
    and came back to A's checkpoint: the commits between D's old ones and the
    checkpoint's head are gone everywhere, so D cannot link its old synced commits to
    the checkpoint. They lie below it all the same (no head reaches them): no
    ``not_in_cloud`` (it reported every one of them, and their pieces)."""
    clock = Clock()
    kw: dict[str, Any] = {"clock": clock, "checkpoint_interval": 0, "compaction_grace": GRACE}
    rng = random.Random(13)
    async with device(tmp_path / "a", bucket, **kw) as a:
        pa = await a.repo.ledger("l").page("p")
        async with device(tmp_path / "d", bucket, **kw) as d:
            for _ in range(3):
                await _load(pa, rng, 1, 300)
                await a.engine.sync()
            await d.engine.sync()
            assert await _keys(d.repo) == await _keys(a.repo)
            if carry:
                pd = await d.repo.ledger("l").page("p")
                await pd.put(b"offline", b"written by d, never uploaded")
        for _ in range(6):  # D is stopped
            clock.now += 600
            await _load(pa, rng, 1, 300)
            await a.engine.sync()
        clock.now += GRACE + 600
        assert (await a.engine.compact()).packs_deleted > 0
        async with device(tmp_path / "d", bucket, **kw) as d:
            await d.engine.sync()
            await a.engine.sync()
            await d.engine.sync()
            assert not d.engine.problems()
            assert await _keys(d.repo) == await _keys(a.repo)
            pd = await d.repo.ledger("l").page("p")
            checked = await _check(d, pd)
            assert checked.report.healthy, _messages(checked)[:5]


async def test_a_pack_imported_after_the_checks_listing_is_no_problem(
    tmp_path: Path, bucket: FolderStore
) -> None:
    """``check --cloud`` lists the bucket once, at its first page; a pack imported into a
    later page after that listing made its pieces 'counts as synced but the bucket lacks
    it' (found by the sync crash torture: ``ledgerctl check --cloud`` on a reader while
    the writer uploaded, 19 such problems, healthy again a moment later)."""
    rng = random.Random(7)
    async with device(tmp_path / "a", bucket) as a, device(tmp_path / "b", bucket) as b:
        pa = await a.repo.ledger("l").page("p")
        await pa.put(b"k", b"v1")
        await a.engine.sync()
        await b.engine.sync()
        index = sc.BucketIndex(b.engine.store, b.engine.codec)
        await index.sections((b"l", b"p"))  # the check's listing, made at its first page
        await pa.put(b"lazy", rng.randbytes(200_000), Priority.LAZY)
        await pa.put(b"k", b"v2")
        await a.engine.sync()
        await b.engine.sync()
        pb = await b.repo.ledger("l").page("p")
        assert await pb.get(b"k") == b"v2"
        checked = await sc.check_page(pb, b.engine, index, cloud=True)
        assert checked.report.healthy, _messages(checked)
