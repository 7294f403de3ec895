"""Compaction deletes a device's packs one by one: a pack whose pages all have a
covering checkpoint goes, one holding a page without any (too large for one) stays.
A device that starts its pages from the checkpoints then lists a sequence with holes
in the middle (kept, deleted, kept, ...); those are no gaps."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import msgpack
import pytest

from ledgerd.sync.checkpoints import reach
from ledgerd.sync.feed import RESTARTING
from ledgerd.sync.folder import FolderStore
from ledgerd.sync.layout import PackName
from ledgerd.sync.progress import DeviceLog
from tests.sync.test_compaction import Clock
from tests.sync.test_engine import Device, _keys, device

GRACE = 5.0  # the smallest compaction grace the daemon allows


def _packs(root: Path, device: str) -> list[int]:
    out = []
    for f in sorted((root / "packs").iterdir()):
        pn = PackName.parse(f"packs/{f.name}")
        if pn is not None and pn.device == device:
            out.append(pn.seq)
    return sorted(out)


async def _everything(d: Device) -> dict[str, dict[bytes, bytes]]:
    return {page: await _keys(d.repo, page=page) for page in ["p", "q"]}


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_a_device_back_past_the_grace_lists_holes_in_the_middle_as_no_gaps(
    tmp_path: Path, bucket: FolderStore, seed: int
) -> None:
    clock = Clock()
    kw: dict[str, Any] = {
        "clock": clock,
        "checkpoint_interval": 0,
        "compaction_grace": GRACE,
        "max_checkpoint": 100_000,  # q, with a large value, never gets a checkpoint
    }
    rng = random.Random(seed)
    async with (
        device(tmp_path / "a", bucket, **kw) as a,
        device(tmp_path / "b", bucket, **kw) as b,
        device(tmp_path / "c", bucket, **kw) as c,
    ):
        pa, qa = await a.repo.ledger("l").page("p"), await a.repo.ledger("l").page("q")
        await pa.put(b"p0", b"a")
        await qa.put(b"big", rng.randbytes(150_000))
        for d in (a, b, c):
            clock.now += 0.5
            await d.engine.sync()
        # A and B write on, C is away; A's packs hold p or q, in a seeded order.
        for i in range(12):
            clock.now += 0.5
            if rng.random() < 0.6:
                await pa.put(f"pa{i}".encode(), rng.randbytes(50))
            else:
                await qa.put(f"qa{i}".encode(), rng.randbytes(50))
            await a.engine.sync()
            if rng.random() < 0.4:
                pb = await b.repo.ledger("l").page("p")
                await pb.put(f"pb{i}".encode(), rng.randbytes(50))
                clock.now += 0.5
                await b.engine.sync()
                await a.engine.sync()
            if rng.random() < 0.3:
                clock.now += GRACE + 1
                await b.engine.sync()
                await a.engine.sync()
                await a.engine.compact()
        clock.now += GRACE + 1
        await b.engine.sync()
        await a.engine.sync()
        await a.engine.compact()
        seqs = _packs(tmp_path / "bucket", a.engine.device)
        holes = sorted(set(range(seqs[0], seqs[-1] + 1)) - set(seqs))
        assert holes, seqs  # the setting does what it is for: holes in the middle

        want = await _everything(a)
        await c.engine.sync()  # back after the grace: starts from the checkpoints
        async with device(tmp_path / "new", bucket, **kw) as new:
            await new.engine.sync()  # a new device starts from them too
            for x in (c, new):
                assert await _everything(x) == want
                assert x.engine.status()["gaps"] == []
                assert x.engine.health()["synced"], x.engine.health()["reasons"]
        # A new device that holds only q starts no page from a checkpoint: the packs
        # compaction deleted are still no gaps.
        only_q = {**kw, "wants": lambda _ledger, page: page == b"q"}
        async with device(tmp_path / "part", bucket, **only_q) as part:
            await part.engine.sync()
            assert await _keys(part.repo, page="q") == want["q"]
            assert part.engine.status()["gaps"] == []
            assert part.engine.health()["synced"], part.engine.health()["reasons"]


def test_only_holes_a_checkpoint_covers_are_no_gaps() -> None:
    """Holes up to the highest sequence a checkpoint covers (the floor) are no missing
    packs, and go once probed a window after they were seen, or once the covering
    checkpoint is a window older than the newest name; a hole above the floor stays a
    gap (no checkpoint explains it: the pack may yet come)."""
    dl = DeviceLog("d" * 32)
    dl.floor = 10
    for seq, t in [(5, 50), (7, 70), (10, 100), (13, 130)]:
        dl.saw(seq, t, now=1000.0)
    assert [(g.first, g.last) for g in dl.missing()] == [(11, 12)]
    dl.drop_covered(seen_before=1000.0, named_before=0)  # seen just now: maybe late
    assert len(dl.gaps) == 4
    dl.drop_covered(seen_before=1000.5, named_before=0)  # seen a window ago
    assert [(g.first, g.last, g.after, g.until) for g in dl.gaps] == [(11, 12, 100, 130)]
    assert DeviceLog.decode(dl.device, dl.encode()).floor == 10
    dl = DeviceLog("d" * 32)
    dl.floor, dl.floor_time = 4, 500
    dl.saw(5, 600, now=1000.0)
    dl.drop_covered(seen_before=0.0, named_before=501)  # the checkpoint is old enough
    assert dl.gaps == []
    # Every pack of a device compacted away: its next pack follows no missing one, and
    # a pack up to the floor is still new (a cover claims no pack away).
    dl = DeviceLog("d" * 32)
    dl.floor = 4
    assert dl.is_new(3)
    dl.saw(5, 50)
    assert dl.missing() == [] and dl.max_seq == 5 and dl.is_new(3)


async def test_a_cover_past_a_devices_packs_does_not_hide_its_later_gaps(
    tmp_path: Path, bucket: FolderStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint whose cover names a sequence its device has not reached (broken, or
    hostile) gave the device starting from it a floor up there for good: a pack of that
    device listed late (after the next one) was no gap, then never read (below the
    log's top and in no gap), its commits missing while status said synced. A pack
    listed below the floor after the restart shows the floor is past what the device
    wrote: holes above what was listed are gaps again (here the packs compaction
    deleted before the restart too: with a wrong cover, nothing tells them apart)."""
    clock = Clock()
    kw: dict[str, Any] = {"clock": clock, "checkpoint_interval": 0, "compaction_grace": GRACE}
    root = tmp_path / "bucket"
    async with device(tmp_path / "a", bucket, **kw) as a:
        pa = await a.repo.ledger("l").page("p")
        await pa.put(b"k0", b"0")
        clock.now += 0.5
        await a.engine.sync()
        clock.now += GRACE + 1
        await a.engine.compact()  # writes the page's checkpoint first
        real = reach

        def inflated(into: dict[str, int], cover: dict[str, int]) -> None:
            real(into, {d: s + 1000 if d == a.engine.device else s for d, s in cover.items()})

        monkeypatch.setattr("ledgerd.sync.checkpoints.reach", inflated)
        async with device(tmp_path / "new", bucket, **kw) as new:
            clock.now += 0.5
            await new.engine.sync()  # starts from the checkpoint, its cover past A's packs
            assert await _keys(new.repo) == await _keys(a.repo)
            monkeypatch.undo()
            before = set(_packs(root, a.engine.device))
            qa = await a.repo.ledger("l").page("q")
            for pg in (qa, pa):  # the late pack holds a page of its own
                await pg.put(b"k1", b"1")
                clock.now += 0.5
                await a.engine.sync()
            late = min(set(_packs(root, a.engine.device)) - before)
            (name,) = [
                f
                for f in (root / "packs").iterdir()
                if (pn := PackName.parse(f"packs/{f.name}"))
                and pn.device == a.engine.device
                and pn.seq == late
            ]
            hidden = tmp_path / "hidden"
            name.rename(hidden)  # not listed yet: its successor is
            clock.now += 0.5
            await new.engine.sync()
            hidden.rename(name)
            for _ in range(3):
                clock.now += 0.5
                await new.engine.sync()
            assert await _everything(new) == await _everything(a)
            # What the wrong cover hid is read; the packs below what was listed are
            # reported (compaction's, or missing: nothing tells which any more).
            dl = new.engine.feed.logs[a.engine.device]
            assert [(g.first, g.last) for g in dl.gaps] == [(1, late - 1)]


def test_a_restarted_log_takes_its_floor_again_from_the_checkpoints() -> None:
    """A log started again (a device back after the grace) kept the floor an earlier
    restart gave it, though the restart reads the checkpoints' covers anew (one since
    replaced, or found wrong, went on hiding gaps)."""
    dl = DeviceLog("d" * 32)
    dl.floor = 10
    dl.saw(4, 40)
    dl.restart()
    assert (dl.max_seq, dl.floor, [(g.first, g.last) for g in dl.gaps]) == (4, 0, [(1, 3)])


async def test_a_restart_marked_before_a_stop_is_done_by_the_next_listing(
    tmp_path: Path, bucket: FolderStore
) -> None:
    """A device stopped between marking a restart and the listing that does it finds
    the mark when it starts; that listing joins the checkpoints listed right before it
    and takes their covers for the logs' floors. Whatever an older ledgerd saved in the
    mark (its covers, or ``1``), or a garbled one, only marks it."""
    async with device(tmp_path / "w", bucket) as w:
        page = await w.repo.ledger("l").page("p")
        await page.put(b"k", b"v")
        await w.engine.sync()
        feed_time = await w.engine.feed.feed_time()
        cover = {w.engine.device: 1}
        assert await w.engine.checkpoints.write(
            page, w.repo.device_id, feed_time, cover, force=True
        )
        for name, raw in (("a", None), ("b", b"1"), ("c", b"\xc1"), ("d", msgpack.packb({"e": 7}))):
            async with device(tmp_path / name, bucket) as a:
                await a.engine.sync()
                await a.engine.feed.restart()
                if raw is not None:
                    await a.repo.set_meta(RESTARTING, raw)
            async with device(tmp_path / name, bucket) as a:
                assert a.engine.feed.restarting
                await a.engine.sync()  # the listing joins, and saves the logs
                assert await a.repo.get_meta(RESTARTING) is None
                assert (await a.engine.feed.device_log(w.engine.device)).floor == 1
                assert a.engine.checkpoints.joined.get((b"l", b"p"))
                assert await _keys(a.repo, "l", "p") == {b"k": b"v"}
