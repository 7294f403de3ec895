"""Compaction and a device starting from the checkpoints, when the two meet.

A device that starts from the checkpoints (new to the bucket, or back after longer
than the compaction grace) lists them and then the feed: a pack missing from that
listing counts as compacted when a checkpoint listed covers the pack's number. Two
rules keep that true (``sync.compaction``, ``sync.feed``): compaction deletes a pack
only once its covering checkpoint has been listed for a feed window, and a restart
listing lists the checkpoints right before the feed, its pages joining those (never
ones read earlier). (Found by the simulation, seed 4852: a device's first round
uploaded nothing, so its checkpoints were read half an hour before its first
listing; meanwhile a page it did not hold got its first checkpoint and the pack
holding that page was compacted.)"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ledgerd.sync import layout
from ledgerd.sync.errors import TransientCloudError
from ledgerd.sync.feed import RESTARTING
from ledgerd.sync.folder import FolderStore
from tests.sync.test_compaction import Clock, _packs
from tests.sync.test_engine import _keys, device

GRACE = 60.0
WINDOW = 120.0


class Monotonic:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_a_pack_goes_only_a_window_after_its_checkpoint_was_listed(
    tmp_path: Path, bucket: FolderStore
) -> None:
    clock, mono = Clock(), Monotonic()
    async with device(
        tmp_path / "a",
        bucket,
        clock=clock,
        monotonic=mono,
        compaction_grace=GRACE,
        compaction_settle=WINDOW,
        feed_window=WINDOW,
    ) as a:
        page = await a.repo.ledger("l").page("p")
        await page.put(b"k", b"v")
        await a.engine.sync()
        clock.now += GRACE + 60
        first = await a.engine.compact()
        assert (first.checkpoints_written, first.packs_deleted) == (1, 0)
        mono.now += WINDOW - 1
        assert (await a.engine.compact()).packs_deleted == 0  # listed a window ago: not yet
        mono.now += 2
        assert (await a.engine.compact()).packs_deleted == 1


async def test_a_restart_listing_takes_the_checkpoints_listed_right_before_it(
    tmp_path: Path, bucket: FolderStore
) -> None:
    """A's pack P holds pages y and x; y has a checkpoint, x none. B's first round
    uploads nothing (it lists nothing). Then x gets its checkpoint and P goes. B's
    first listing, much later, does not list P: with only y's checkpoint (as read
    at B's first round, once), B took P for explained and never had x."""
    clock = Clock()
    kw: dict[str, Any] = {"clock": clock, "compaction_grace": GRACE, "checkpoint_interval": 3600.0}
    async with device(tmp_path / "a", bucket, **kw) as a:
        y = await a.repo.ledger("l").page("y")
        x = await a.repo.ledger("l").page("x")
        await y.put(b"in y", b"1")
        await x.put(b"in x", b"1")
        await a.engine.sync()  # P: both pages
        feed_time = await a.engine.feed.feed_time()
        cover = {a.engine.device: 1}
        assert await a.engine.checkpoints.write(y, a.repo.device_id, feed_time, cover, force=True)
        async with device(tmp_path / "b", bucket, **kw) as b:
            await b.engine.round(download=False)  # marks the restart; lists nothing
            clock.now += GRACE + 60
            report = await a.engine.compact()  # x's checkpoint, and P goes
            assert report.checkpoints_written == 1 and report.packs_deleted == 1
            await b.engine.sync()
            assert await _keys(b.repo, "l", "x") == {b"in x": b"1"}
            assert await _keys(b.repo, "l", "y") == {b"in y": b"1"}
            assert not b.engine.problems()


async def test_the_daemon_compacts_again_a_window_after_a_run_that_had_to_wait(
    tmp_path: Path, bucket: FolderStore
) -> None:
    """A run whose packs wait for their new checkpoints to settle is followed by one a
    window later, not a ``compaction_interval`` (a day) later: a daemon that restarts
    more often than that would otherwise never delete a pack."""
    clock, mono = Clock(), Monotonic()
    async with device(
        tmp_path / "a",
        bucket,
        clock=clock,
        monotonic=mono,
        compaction_grace=GRACE,
        compaction_interval=24 * 3600.0,
        compaction_settle=WINDOW,
        feed_window=WINDOW,
    ) as a:
        page = await a.repo.ledger("l").page("p")
        await page.put(b"k", b"v")
        await a.engine.sync()
        clock.now += GRACE + 60
        packs = len(_packs(tmp_path / "bucket"))
        await a.engine._compact_when_due()  # the first run: the checkpoint goes up
        await a.engine._compact_when_due()  # not due again yet
        assert len(_packs(tmp_path / "bucket")) == packs
        mono.now += WINDOW + 2
        await a.engine._compact_when_due()
        assert len(_packs(tmp_path / "bucket")) < packs


async def test_a_restart_listing_slower_than_half_a_window_is_done_again(
    tmp_path: Path, bucket: FolderStore
) -> None:
    """The checkpoints a restart listing lists hold every checkpoint covering a pack
    compacted before its feed listing only when the two listings are less than a
    window apart: one that took longer fails, keeps the restart, and the next round
    lists both again."""
    mono = Monotonic()
    kw: dict[str, Any] = {"monotonic": mono, "feed_window": WINDOW}
    async with device(tmp_path / "a", bucket, **kw) as a:
        page = await a.repo.ledger("l").page("p")
        await page.put(b"k", b"v")
        await a.engine.sync()
    async with device(tmp_path / "b", bucket, **kw) as b:
        store = b.engine.ctx.store
        plain = store.list

        def slow(prefix: str, after: str = "") -> AsyncIterator[str]:
            if prefix == layout.PACKS:
                mono.now += WINDOW  # the feed's listing came a window after the checkpoints'
            return plain(prefix, after)

        store.list = slow  # type: ignore[method-assign,assignment]
        with pytest.raises(TransientCloudError, match="took too long"):
            await b.engine.round()
        assert await b.repo.get_meta(RESTARTING) is not None
        store.list = plain  # type: ignore[method-assign]
        await b.engine.sync()
        assert await b.repo.get_meta(RESTARTING) is None
        assert await _keys(b.repo, "l", "p") == {b"k": b"v"}
