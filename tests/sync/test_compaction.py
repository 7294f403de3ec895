"""Compaction (issue 16): a device deletes its own packs that checkpoints made unneeded."""

from __future__ import annotations

import contextlib
import os
import random
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ledgerd.store import Page, Priority
from ledgerd.store.page.check import HEADS, check_page, repair_local
from ledgerd.store.page.gc import collect
from ledgerd.sync.feed import RESTARTING
from ledgerd.sync.folder import FolderStore
from ledgerd.sync.layout import PackName
from tests.sync.test_checkpoints import _load
from tests.sync.test_engine import Device, _keys, device
from tests.sync.test_engine import encryption as encryption  # the fixture


class Clock:
    """Simulated wall time shared by the devices (seconds)."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def _bucket_bytes(root: Path, prefix: str = "") -> int:
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file() and prefix in str(f))


def _packs(root: Path) -> list[PackName]:
    out = []
    for f in sorted((root / "packs").iterdir()):
        pn = PackName.parse(f"packs/{f.name}")
        assert pn is not None
        out.append(pn)
    return out


async def test_compaction_deletes_only_own_covered_packs_past_the_grace(
    tmp_path: Path, bucket: FolderStore, encryption: object
) -> None:
    clock = Clock()
    grace = 3600.0
    kw: dict[str, Any] = {"clock": clock, "checkpoint_interval": 0, "compaction_grace": grace}
    rng = random.Random(3)
    root = tmp_path / "bucket"
    async with device(tmp_path / "a", bucket, **kw) as a, device(tmp_path / "b", bucket, **kw) as b:
        pa = await a.repo.ledger("l").page("p")
        pb = await b.repo.ledger("l").page("p")
        big = rng.randbytes(300_000)
        await pa.put(b"lazy", big, Priority.LAZY)  # B never reads it before compaction
        for _ in range(10):
            await _load(pa, rng, 1, 500)
            await a.engine.sync()
            clock.now += 60
        await pb.put(b"from b", b"b")
        await b.engine.sync()
        await a.engine.sync()
        before = _bucket_bytes(root)
        mine_before = [p for p in _packs(root) if p.device == a.engine.device]

        # Within the grace period nothing goes.
        report = await a.engine.compact()
        assert report.packs_deleted == 0
        assert len(_packs(root)) >= len(mine_before)

        clock.now += grace + 60
        report = await a.engine.compact()
        assert report.packs_deleted >= len(mine_before) - 1
        after = _bucket_bytes(root)
        assert after < before
        left = _packs(root)
        assert any(p.device == b.engine.device for p in left)  # B's packs are B's to delete
        live = sum(len(k) + len(v) for k, v in (await _keys(a.repo)).items())
        assert _bucket_bytes(root, "packs") + _bucket_bytes(root, "checkpoints") <= 2 * live + (
            1 << 20
        )

        # B reads the LAZY value whose pack is gone: the checkpoint has it.
        assert await pb.get(b"lazy") == big
        # Both go on, and a new device starts from what is left.
        await pb.put(b"after", b"compaction")
        await b.engine.sync()
        await a.engine.sync()
        want = await _keys(a.repo)
        assert want[b"after"] == b"compaction"
        async with device(tmp_path / "c", bucket, **kw) as c:
            await c.engine.sync()
            assert await _keys(c.repo) == want
            assert not c.engine.problems()


async def test_random_writes_syncs_and_compactions_converge(
    tmp_path: Path, bucket: FolderStore
) -> None:
    """Three devices write, sync, go offline (for less than the grace period) and
    compact in a random order; then everyone, and a new device, holds the same."""
    for seed in range(int(os.environ.get("LEDGERD_TEST_SEEDS", "3"))):
        clock = Clock()
        grace = 600.0
        kw: dict[str, Any] = {"clock": clock, "checkpoint_interval": 0, "compaction_grace": grace}
        rng = random.Random(seed)
        base = tmp_path / f"run{seed}"
        (base / "bucket").mkdir(parents=True)
        store = FolderStore(base / "bucket")
        last_sync = [clock.now] * 3
        async with (
            device(base / "0", store, **kw) as d0,
            device(base / "1", store, **kw) as d1,
            device(base / "2", store, **kw) as d2,
        ):
            devs = [d0, d1, d2]
            for _ in range(40):
                i = rng.randrange(3)
                d = devs[i]
                op = rng.random()
                if op < 0.5:
                    pg = await d.repo.ledger("l").page(rng.choice(["p", "q"]))
                    await _load(pg, rng, 1, rng.choice([1, 50, 300]))
                elif op < 0.85:
                    await d.engine.sync()
                    last_sync[i] = clock.now
                else:
                    await d.engine.compact()
                clock.now += rng.choice([1, 30, 200])
                for j, other in enumerate(devs):  # nobody stays away past the grace period
                    if clock.now - last_sync[j] > grace / 2:
                        await other.engine.sync()
                        last_sync[j] = clock.now
            for _ in range(2):
                for d in devs:
                    await d.engine.sync()
            for page in ["p", "q"]:
                want = await _keys(d0.repo, page=page)
                for d in devs[1:]:
                    assert await _keys(d.repo, page=page) == want, (
                        seed,
                        page,
                        [x.engine.problems() for x in devs],
                    )
            clock.now += grace + 1
            for d in devs:
                await d.engine.compact()
            async with device(base / "new", store, **kw) as new:
                await new.engine.sync()
                for page in ["p", "q"]:
                    assert await _keys(new.repo, page=page) == await _keys(d0.repo, page=page)
                assert not new.engine.problems()


async def test_a_device_away_past_the_grace_period_loses_nothing(
    tmp_path: Path, bucket: FolderStore, encryption: object
) -> None:
    """D writes offline while A writes on, checkpoints and compacts; D comes back
    after the grace period: D's change is carried onto A's checkpoint, everyone
    (and a new device) converges, and nothing waits."""
    clock = Clock()
    grace = 3600.0
    kw: dict[str, Any] = {"clock": clock, "checkpoint_interval": 0, "compaction_grace": grace}
    rng = random.Random(11)
    async with device(tmp_path / "a", bucket, **kw) as a, device(tmp_path / "d", bucket, **kw) as d:
        pa = await a.repo.ledger("l").page("p")
        await _load(pa, rng, 1, 300)
        await pa.put(b"shared", b"from a, early")
        await a.engine.sync()
        await d.engine.sync()
        pd = await d.repo.ledger("l").page("p")
        await pd.put(b"offline", b"written by d while away")
        await pd.put(b"shared", b"d's early edit")  # older than A's later edit: A wins
        for _ in range(6):
            clock.now += 600
            await _load(pa, rng, 1, 300)
            await a.engine.sync()
        await pa.put(b"shared", b"from a, late")
        await a.engine.sync()
        clock.now += grace + 600
        report = await a.engine.compact()
        assert report.packs_deleted > 0

        await d.engine.sync()
        assert not d.engine.problems()
        await a.engine.sync()
        want = await _keys(a.repo)
        assert want[b"offline"] == b"written by d while away"
        assert want[b"shared"] == b"from a, late"
        assert await _keys(d.repo) == want
        assert not a.engine.problems()
        # The commits D left behind (its old head) are childless but not heads, on
        # purpose: check accepts them and repair leaves the head alone.
        pd = await d.repo.ledger("l").page("p")
        checked = await check_page(pd)
        assert checked.healthy, [p.message for p in checked.problems]
        heads = [h.id for h in pd.graph.heads]

        def damage(conn: sqlite3.Connection) -> None:
            conn.execute("INSERT INTO heads (commit_id, timestamp) VALUES (?, 0)", (b"\x01" * 32,))

        await pd.db.run(damage, write=True)
        checked = await check_page(pd)
        assert [p.code for p in checked.problems] == [HEADS]
        await repair_local(pd, checked)
        assert [h.id for h in pd.graph.heads] == heads
        assert (await check_page(pd)).healthy
        async with device(tmp_path / "n", bucket, **kw) as n:
            await n.engine.sync()
            assert await _keys(n.repo) == want
            assert not n.engine.problems()


async def _write_on_and_compact(
    a: Device, pa: Page, clock: Clock, rng: random.Random, grace: float
) -> None:
    """A writes six rounds ten minutes apart (checkpointing), then compacts past the grace."""
    for _ in range(6):
        clock.now += 600
        await _load(pa, rng, 1, 300)
        await a.engine.sync()
    clock.now += grace + 600
    assert (await a.engine.compact()).packs_deleted > 0


@contextlib.asynccontextmanager
async def _d_away(
    tmp_path: Path, bucket: FolderStore, *, seed: int
) -> AsyncIterator[tuple[Device, Page, dict[str, Any]]]:
    """A and D sync A's first rounds; D stops while A writes on, checkpoints and
    compacts past the grace. Yields A (still running), its page and the settings a
    device of this bucket takes (a shared simulated clock, a grace of an hour)."""
    clock = Clock()
    grace = 3600.0
    kw: dict[str, Any] = {"clock": clock, "checkpoint_interval": 0, "compaction_grace": grace}
    rng = random.Random(seed)
    async with device(tmp_path / "a", bucket, **kw) as a:
        async with device(tmp_path / "d", bucket, **kw) as d:
            pa = await a.repo.ledger("l").page("p")
            await _load(pa, rng, 1, 300)
            await a.engine.sync()
            await d.engine.sync()
            assert await _keys(d.repo) == await _keys(a.repo)
        await _write_on_and_compact(a, pa, clock, rng, grace)
        yield a, pa, kw


async def test_a_device_away_with_nothing_to_carry_keeps_the_checkpoint_as_its_head(
    tmp_path: Path, bucket: FolderStore
) -> None:
    """D, with every change of its own uploaded, comes back after the grace period and
    joins the checkpoint: its page's head holds the checkpoint's state (in ``heads``,
    not only in memory), so the page reads the same after a reopen and a collection
    keeps the head's tree."""
    async with _d_away(tmp_path, bucket, seed=12) as (a, pa, kw):
        want = await _keys(a.repo)

        async with device(tmp_path / "d", bucket, **kw) as d:
            await d.engine.sync()
            assert not d.engine.problems()
            pd = await d.repo.ledger("l").page("p")
            assert pd.head.root == pa.head.root
            rows = await pd.db.read_all("SELECT commit_id FROM heads")
            assert [bytes(r[0]) for r in rows] == [pd.head.id]
            await collect(pd, 0.0)
            assert await _keys(d.repo) == want
        async with device(tmp_path / "d", bucket, **kw) as d:
            assert await _keys(d.repo) == want


async def _failing_listing() -> None:
    raise OSError("the listing failed")


@pytest.mark.parametrize("first_listing", ["works", "fails"])
async def test_packs_compacted_before_a_device_first_or_again_lists_are_no_gap(
    tmp_path: Path, bucket: FolderStore, first_listing: str
) -> None:
    """A new device, and one back after the grace period, list A's recent packs above
    the ones compaction deleted (the checkpoints hold those): no gap is left in A's log,
    which no probe could ever fill, and both are synced. Also when the first listing
    after the checkpoints fails (or the daemon stops before it): the restarted device
    still starts the logs at their first pack."""
    async with _d_away(tmp_path, bucket, seed=13) as (a, pa, kw):
        await pa.put(b"recent", b"a pack above the compacted ones")
        await a.engine.sync()
        want = await _keys(a.repo)
        for name in ["d", "new"]:
            if first_listing == "fails":
                async with device(tmp_path / name, bucket, **kw) as x:
                    x.engine.feed.list_new = _failing_listing  # type: ignore[method-assign]
                    with pytest.raises(OSError, match="the listing failed"):
                        await x.engine.sync(timeout=5)
            async with device(tmp_path / name, bucket, **kw) as x:
                await x.engine.sync()
                assert await _keys(x.repo) == want
                assert x.engine.status()["gaps"] == []
                assert x.engine.health()["synced"], x.engine.health()["reasons"]


async def test_a_new_device_converges_whatever_compaction_deleted(
    tmp_path: Path, bucket: FolderStore
) -> None:
    """C writes two packs concurrently with A's writes; A checkpoints; C compacts the
    packs A's checkpoint covers. A new device takes the checkpoint and the packs above
    its cover, B what it had and the rest: all end equal, nothing waits."""
    clock = Clock()
    grace = 600.0
    kw: dict[str, Any] = {"clock": clock, "checkpoint_interval": 0, "compaction_grace": grace}
    async with (
        device(tmp_path / "a", bucket, **kw) as a,
        device(tmp_path / "b", bucket, **kw) as b,
        device(tmp_path / "c", bucket, **kw) as c,
    ):
        pa = await a.repo.ledger("l").page("p")
        pc = await c.repo.ledger("l").page("p")
        await pa.put(b"k0", b"a")
        for d in (a, b, c):
            await d.engine.sync()
        await pa.put(b"k1", b"a")
        await pc.put(b"c1", b"c")  # concurrent with k1
        clock.now += 1
        await c.engine.round(download=False)
        await pc.put(b"c2", b"c")
        clock.now += 1
        await c.engine.round(download=False)
        await a.engine.sync()
        await b.engine.sync()
        clock.now += grace + 60
        assert (await a.engine.compact()).checkpoints_written == 1
        report = await c.engine.compact()
        assert report.packs_deleted == 2 and report.packs_kept == 0
        await pa.put(b"k2", b"after the checkpoint")
        await a.engine.sync()
        want = await _keys(a.repo)
        async with device(tmp_path / "new", bucket, **kw) as new:
            await new.engine.sync()
            assert new.engine.checkpoints.covers
            assert not new.engine.problems()
            assert await _keys(new.repo) == want
            pn = await new.repo.ledger("l").page("p")
            assert pn.head.root == pa.head.root
            assert (await check_page(pn)).healthy
        for d in (b, c, a, b, c):
            await d.engine.sync()
        for d in (b, c):
            assert await _keys(d.repo) == want
            assert not d.engine.problems()


async def test_compaction_runs_each_interval_by_the_wall_clock_even_after_it_went_back(
    tmp_path: Path, bucket: FolderStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    runs: list[float] = []
    async with device(tmp_path / "a", bucket, clock=clock, compaction_interval=3600.0) as a:

        async def compact() -> Any:
            runs.append(clock.now)

        monkeypatch.setattr(a.engine, "compact", compact)
        await a.engine._compact_when_due()  # never compacted: due
        clock.now += 1800
        await a.engine._compact_when_due()  # half an interval: not yet
        clock.now += 1800
        await a.engine._compact_when_due()  # an interval: due
        assert runs == [1_800_000_000.0, 1_800_003_600.0]

        clock.now -= 365 * 86400  # the wall clock is set back a year: due, not in a year
        await a.engine._compact_when_due()
        assert runs[-1] == clock.now
        clock.now += 60
        await a.engine._compact_when_due()
        assert len(runs) == 3

    # The time of the last compaction is kept across restarts.
    async with device(tmp_path / "a", bucket, clock=clock, compaction_interval=3600.0) as again:
        monkeypatch.setattr(again.engine, "compact", compact)
        await again.engine._compact_when_due()
        assert len(runs) == 3
        clock.now += 3600
        await again.engine._compact_when_due()
        assert len(runs) == 4


async def test_a_rejoin_cut_short_is_finished_after_a_restart(
    tmp_path: Path, bucket: FolderStore
) -> None:
    """D, back after the grace, is stopped while its listing moves its pages onto the
    checkpoints, after the rejoin made it look present (its last-listed time is new):
    at the next start it finishes the rejoin instead of reading packs above compacted
    ones and waiting for good."""
    async with _d_away(tmp_path, bucket, seed=14) as (a, pa, kw):
        await pa.put(b"recent", b"after the compaction")
        await a.engine.sync()
        want = await _keys(a.repo)
        async with device(tmp_path / "d", bucket, **kw) as d:
            d.engine.checkpoints.take = _stopped  # type: ignore[method-assign]
            with pytest.raises(_Stop):
                await d.engine.sync(timeout=5)
            assert await d.engine.feed.wall_listed() > 0
            assert await d.repo.get_meta(RESTARTING) is not None
        async with device(tmp_path / "d", bucket, **kw) as d:
            await d.engine.sync()
            assert await _keys(d.repo) == want
            assert d.engine.health()["synced"], d.engine.health()["reasons"]


class _Stop(BaseException):
    """The daemon stops here (not an error the rejoin would take for one page's)."""


async def _stopped(*args: object, **kwargs: object) -> None:
    raise _Stop()
