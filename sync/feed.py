"""Discovery: listing the feed, and the devices' logs read so far.

This module owns :class:`Feed`: the LIST of ``packs/`` after a cursor (every
device's new packs, each held to be imported), the gaps in a device's sequence and
their probes with backoff, the per-device logs (:class:`sync.progress.DeviceLog`,
saved in repository meta). From those it tells a page's *cover* (how far each
device's packs of it are all here). It imports nothing: what to do with a held pack
is :mod:`sync.download`'s. The hybrid logical clock that names this device's next
pack is :mod:`sync.naming`'s (:attr:`Feed.names`).

The cursor
    A listing starts at the newest feed time this device had listed a window
    (``feed_window``) before its previous listing, less the window; not at the
    newest it has listed. A device names a pack at least the newest time it listed
    within a quarter of the window (:meth:`sync.naming.Naming.next_seq`), and its
    PUT lands (and shows in listings) within another quarter, so a pack that was
    not listed at the previous listing was named from a listing that saw every name
    visible a window before that one: it lies above the cursor, however long ago the previous
    listing was. The newest name alone moves with the fastest clock: a device
    an hour ahead names packs an hour ahead, and a device that listed just before
    that pack and uploads just after it names its own an hour behind, below a
    cursor that followed the newest name, to be found only when a later pack of
    its writer showed the gap (and never, were it that device's last). A cursor
    that follows names only a window late passes no such pack, whatever the
    clocks; after a leap of the names it covers the leap for one window, which
    costs a listing of the few packs named in between. A new process starts from
    the cursor saved (``FEED_CURSOR``), not from the newest name: the marks that
    trailed it ended with the process before.

Gaps and restarts
    A device's packs missing between two listed are a gap, probed (a listing of
    that stretch of the feed) until found, or until the probe shows them gone and a
    checkpoint's cover explains them (compaction deletes only covered packs; the
    log's floor): a gap up to the floor goes once it was seen a window ago, or the
    checkpoint was written a window before the newest name (its writer had read
    those packs then: late ones would show by now). A device new to the bucket, or
    back after longer than the compaction grace, starts from the checkpoints and lists
    the whole feed: that listing is the probe. Its checkpoints are listed right before
    the feed; their covers become the logs' floors and their pages join them after it
    (:class:`Restarter`). Compaction deletes a pack a window after it listed a
    checkpoint covering it (:mod:`sync.compaction`), so a pack missing from the feed's
    listing is covered by a checkpoint in the one just before (a listing slower than
    half the window is done again), whose page joins it. No earlier read of the
    checkpoints is trusted: another page of a pack may have got its first checkpoint
    since, and the pack been compacted.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Protocol

from ledgerd.store import Page
from ledgerd.store.page import exchange as ex
from ledgerd.sync import layout, progress
from ledgerd.sync.context import Key, SyncContext
from ledgerd.sync.errors import TransientCloudError
from ledgerd.sync.layout import PackName
from ledgerd.sync.naming import Naming, named_between
from ledgerd.sync.progress import DeviceLog, Gap, Held

log = logging.getLogger(__name__)

LISTED_WALL = "sync/listed-wall"
"""Repository meta: the wall time a listing of the feed started, saved at least every
quarter of the compaction grace (at most hourly) and at stop."""
RESTARTING = "sync/restarting"
"""Repository meta: set while the next listing is to list the whole feed and start
from the checkpoints (see ``Feed.restarting``)."""
LOG_PREFIX = "sync/log/"
"""Repository meta: each device's log (:class:`sync.progress.DeviceLog`), by device id."""
FEED_CURSOR = "sync/feed-cursor"
"""Repository meta: the cursor the last listing started from (the newest feed time
listed a window before the one before it). A new process's first listing starts
there: the newest name listed (``sync/feed``) can be far above a pack named from
an older listing by a device whose clock is behind."""
LISTED_WALL_STEP = 3600.0
FEED_WINDOW = 120.0
"""Seconds of feed time each listing looks back past the newest name seen: packs
whose PUT was slower than the listing that followed it."""


class Restarter(Protocol):
    """Starts pages from the checkpoints for a restart listing
    (:class:`sync.checkpoint_policy.CheckpointPolicy`)."""

    async def list_checkpoints(self) -> Sequence[object]:
        """The bucket's checkpoints, listed right before the feed."""

    async def join_checkpoints(self, listed: Sequence[object]) -> tuple[dict[str, int], int]:
        """Join the pages with the best of ``listed``; per device, the highest sequence
        they cover (of every page, joined or not), and their newest feed time."""


class Feed:
    """What this device has listed of the bucket's feed, per device.

    ``grace`` is the compaction grace: the wall time of a listing is saved often
    enough (a quarter of it, at most hourly, and at stop) that a device can tell it
    was away for longer; a long import lists again meanwhile (:meth:`listing_due`).
    """

    def __init__(
        self,
        ctx: SyncContext,
        *,
        feed_window: float,
        retry_first: float,
        retry_most: float,
        grace: float,
    ) -> None:
        self.ctx = ctx
        self.feed_window = feed_window
        self.retry_first = retry_first
        self.retry_most = retry_most
        self.grace = grace
        self.logs: dict[str, DeviceLog] = {}
        self.devices: set[str] = set()
        self.feed_max = -1  # the newest feed time listed (-1: not loaded)
        self._saved_cursor = 0  # the cursor saved as FEED_CURSOR
        self.names = Naming(ctx, feed_window, fresh=self.fresh, newest=lambda: self.feed_max)
        self._ignored: set[str] = set()
        self._listed_at: float | None = None  # monotonic time of the last listing
        # (wall time, monotonic time, newest feed time listed) at the end of each
        # listing: the cursor is the newest one's that is a window old.
        self._marks: list[tuple[float, float, int]] = []
        # Told by a listing that comes longer than the grace after the one before
        # (CheckpointPolicy.absent): packs compacted meanwhile were never listed.
        self.absent: Callable[[float], Awaitable[None]] | None = None
        self._listed_wall = 0.0  # wall time the last listing started (see wall_listed)
        self._saved_wall = 0.0  # the one saved in the repository
        # The next listing lists the whole feed and sets the logs' floors: set when
        # this device read the checkpoints to start pages from (a new device, or one
        # back after longer than the grace), below which compaction may have deleted
        # packs (also of pages this device does not hold). Kept in the repository's
        # metadata until a listing has saved the logs, so that a stop before then (or
        # a listing that failed) does not leave gaps for good.
        self.restarting = False
        # Lists and joins the checkpoints for a restart listing (the engine sets it).
        self.restarter: Restarter | None = None

    async def load(self) -> None:
        # (as listed names move it: one saved before that rule may be past the ceiling)
        stored = int(await self.ctx.repo.get_meta("sync/feed") or b"0")
        self.feed_max = min(stored, layout.NAMED_TIME_CEILING)
        # Not feed_max: the marks that trailed it a window behind ended with the last
        # process. A data directory of before the cursor was saved lists it all once.
        cursor = await self.ctx.repo.get_meta(FEED_CURSOR)
        self._saved_cursor = min(int(cursor), self.feed_max) if cursor is not None else 0
        self._marks = [(float("-inf"), float("-inf"), self._saved_cursor)]
        await self.names.load()
        # Every device's log, now: one whose packs the next listings do not reach
        # still holds packs to retry (those of this device too, held by a restore).
        for name in await self.ctx.repo.metas(LOG_PREFIX):
            device = name.removeprefix(LOG_PREFIX)
            if layout.device_ok(device):
                await self.device_log(device)
        self.restarting = await self.ctx.repo.get_meta(RESTARTING) is not None

    async def restart(self) -> None:
        """The next listing lists the whole feed and starts from the checkpoints (see
        ``restarting``); recorded before the caller records what it did."""
        await self.ctx.repo.set_meta(RESTARTING, b"1")
        self.restarting = True

    async def absorb(self, cover: dict[str, int], key: Key | None = None, written: int = 0) -> None:
        """A page (``key``) joined a checkpoint of ``cover``: a pack a device wrote up to
        there may be compacted away (compaction deletes only what checkpoints cover),
        so a gap up to there goes once a probe does not find it (the pack may hold
        other pages, and may just be late; ``written``: the checkpoint's feed time);
        and the page's sections held up to there are in it."""
        for device, seq in cover.items():
            if not layout.device_ok(device):
                continue
            dl = self.logs.get(device) if device == self.ctx.device else None
            if device != self.ctx.device:
                dl = await self.device_log(device)
                dl.floor = max(dl.floor, seq)  # (its gaps up to there go once probed)
                dl.floor_time = max(dl.floor_time, written)
            if dl is None:
                continue
            for hid in [
                hid for hid, h in dl.held.items() if h.key == key and key and h.ln.seq <= seq
            ]:
                del dl.held[hid]
            await self.save_log(dl)

    # -- listing -----------------------------------------------------------------------

    async def fresh(self) -> None:
        """List the feed unless this engine did so within a quarter of the window, by
        both clocks: the wall clock names packs, and it moves on while the monotonic
        clock stands still (a machine suspended); a pack named from a listing that
        old could land behind the others' cursors."""
        quarter = self.feed_window / 4
        if (
            self._listed_at is None
            or self.ctx.monotonic() - self._listed_at > quarter
            or not 0 <= self.ctx.clock() - self._listed_wall <= quarter
        ):
            await self.list_new()

    def _cursor(self) -> int:
        """The newest feed time this device had listed a window before its last
        listing (by the wall clock, which names packs, or the monotonic one, which a
        wall clock set back cannot stop); see the module docstring."""
        if not self._marks:
            return self.feed_max
        wall, mono, _ = self._marks[-1]
        old = 0
        for i, (w, m, _) in enumerate(self._marks):
            if wall - w >= self.feed_window or mono - m >= self.feed_window:
                old = i
        del self._marks[:old]
        return self._marks[0][2]

    async def list_new(self) -> None:
        """One LIST of ``packs/`` after the cursor (the newest feed time listed a
        window ago, less the window; all of it when the logs restart): every
        device's new packs. Each is held to be imported."""
        window = int(self.feed_window * 1000)
        cursor = self._cursor()
        # A restart lists the whole feed: a pack named before the cursor (by a device
        # whose clock is behind) that compaction kept is not in any checkpoint, and
        # taking it for compacted away would lose it.
        whole = self.restarting or cursor <= 0
        after = "" if whole else layout.feed_after(cursor - window)
        if not self.restarting and self.absent is not None:
            await self._tell_absence(self.absent)
        restarter = self.restarter if self.restarting else None
        # The checkpoints right before the feed (see the module docstring, Restarts).
        checkpoints_at = self.ctx.monotonic()
        checkpoints = await restarter.list_checkpoints() if restarter else ()
        started = self.ctx.monotonic()
        wall = self.ctx.clock()
        names = [name async for name in self.ctx.store.list(layout.PACKS, after)]
        if restarter is not None and self.ctx.monotonic() - checkpoints_at > self.feed_window / 2:
            # (a pack compacted since may be covered by a checkpoint written after
            # that listing: the next round lists both again)
            raise TransientCloudError("listing the feed took too long after the checkpoints")
        held, covers_time = await self._join_checkpoints(restarter, checkpoints)
        touched, newest = await self._take_listed(names, held, covers_time)
        await self._save_listing(held, touched, covers_time, newest, wall - self.feed_window)
        self._marks.append((self.ctx.clock(), self.ctx.monotonic(), newest))
        # Saved once it moved a window on: one lower than the cursor is safe (a longer
        # listing), and a write per round is too many.
        if cursor - self._saved_cursor >= window:
            await self.ctx.repo.set_meta(FEED_CURSOR, str(cursor).encode())
            self._saved_cursor = cursor
        self._listed_at = started
        # The time it started (what it lists is in the bucket by then), known at once
        # here; saved now and then (a write each round is too many), and at stop.
        self._listed_wall = wall
        if not 0 <= wall - self._saved_wall <= min(LISTED_WALL_STEP, self.grace / 4):
            await self.set_wall_listed(wall)

    async def _tell_absence(self, absent: Callable[[float], Awaitable[None]]) -> None:
        """Tell ``absent`` if the last listing is longer ago than the grace."""
        listed = await self.wall_listed()
        away = max(self.ctx.clock() - listed, self.listed_ago())
        if listed and away > self.grace:
            await absent(away)

    async def _join_checkpoints(
        self, restarter: Restarter | None, checkpoints: Sequence[object]
    ) -> tuple[dict[str, int], int]:
        """A restart listing's pages join the ``checkpoints``: per device, the highest
        sequence they cover (the logs' floors), and their newest feed time."""
        if restarter is None:
            return {}, 0
        held, covers_time = await restarter.join_checkpoints(checkpoints)
        for device, seq in held.items():
            if device != self.ctx.device:
                dl = await self.device_log(device)
                dl.floor = max(dl.floor, seq)
        return held, covers_time

    async def _take_listed(
        self, names: list[str], held: dict[str, int], covers_time: int
    ) -> tuple[set[str], int]:
        """Note the listed ``names``: the devices whose logs changed, and the newest
        feed time listed (or covered)."""
        touched = set(held) - {self.ctx.device}
        newest = max(self.feed_max, covers_time)
        for name in names:
            pn = PackName.parse(name)
            if pn is None:
                self.ignore(name)
                continue
            newest = max(newest, min(pn.time, layout.NAMED_TIME_CEILING))
            if await self.saw(pn):
                touched.add(pn.device)
        return touched, newest

    async def _save_listing(
        self,
        held: dict[str, int],
        touched: set[str],
        covers_time: int,
        newest: int,
        seen_before: float,
    ) -> None:
        """Save what a listing changed: the logs (all of them after a restart, whose
        listing was the probe of every gap seen before ``seen_before``) and the newest
        feed time."""
        window = int(self.feed_window * 1000)
        for device in touched & set(held):
            # Packs a checkpoint covers and that are not listed were compacted away,
            # also those above a device's last listed pack (or all of its packs).
            dl = self.logs[device]
            dl.floor_time = max(dl.floor_time, covers_time or newest)
        if self.restarting:
            for dl in self.logs.values():  # (the listing was the probe)
                dl.drop_covered(seen_before, newest - window)
        for device in sorted(self.logs if self.restarting else touched):
            await self.save_log(self.logs[device])
        if self.restarting:  # the logs it started are saved
            self.restarting = False
            await self.ctx.repo.delete_meta(RESTARTING)
        if newest != self.feed_max:
            self.feed_max = newest
            await self.ctx.repo.set_meta("sync/feed", str(newest).encode())

    def listed_ago(self) -> float:
        """Seconds since this process's last listing by the monotonic clock (0 before
        its first): an absence that a wall clock set back does not hide."""
        return 0.0 if self._listed_at is None else self.ctx.monotonic() - self._listed_at

    async def wall_listed(self) -> float:
        """The wall time the last listing started: of this process, or else the one
        saved (within a quarter of the grace of the last one before a stop that saved
        nothing); 0 if there was none."""
        if not self._listed_wall:
            self._listed_wall = float(await self.ctx.repo.get_meta(LISTED_WALL) or b"0")
            self._saved_wall = self._listed_wall
        return self._listed_wall

    async def set_wall_listed(self, now: float) -> None:
        self._listed_wall = self._saved_wall = now
        await self.ctx.repo.set_meta(LISTED_WALL, str(now).encode())

    async def save_wall_listed(self) -> None:
        """Save the last listing's time if a newer one than the saved (at stop)."""
        if self._listed_wall and self._listed_wall != self._saved_wall:
            await self.set_wall_listed(self._listed_wall)

    def listing_due(self) -> bool:
        """Whether the last listing of this process is a quarter of the grace old: a
        round whose imports run that long lists again between them, or the next round
        would take this device for away (compaction may have deleted packs named since
        that it never listed) and start its pages again from the checkpoints."""
        return bool(self._listed_at) and self.ctx.clock() - self._listed_wall > self.grace / 4

    async def saw(self, pn: PackName) -> bool:
        """Take note of a listed pack; True if it is new (then it is held for import)."""
        if pn.device == self.ctx.device:
            self.names.saw(pn)
            return False
        dl = await self.device_log(pn.device)
        if not dl.is_new(pn.seq):
            return False
        if dl.in_gap(pn.seq) and pn.seq < dl.max_seq:
            log.info("pack %s appeared in a gap of device %s", pn.name, pn.device)
        dl.saw(pn.seq, pn.time, self.ctx.clock())
        h = Held(pn, None, progress.RETRY, "listed, not imported yet")
        dl.held[h.id] = h
        self.devices.add(pn.device)
        return True

    async def probe_gaps(self, force: bool) -> None:
        """List the stretch of the feed where a device's missing packs must be, for
        gaps older than the window (the window's own listing covers the others)."""
        now = self.ctx.monotonic()
        floor = self._cursor() - int(self.feed_window * 1000)
        for dl in list(self.logs.values()):
            old = [g for g in dl.gaps if g.until and g.after < floor]
            if not old or not (force or now >= dl.probe_due):
                continue
            found = 0
            for after, until in _stretches(old):
                async for pn in named_between(self.ctx, after, until):
                    if pn.device == dl.device and await self.saw(pn):
                        found += 1
            dl.drop_covered(
                self.ctx.clock() - self.feed_window, self.feed_max - int(self.feed_window * 1000)
            )
            dl.probes = 0 if found else dl.probes + 1
            dl.probe_due = now + progress.backoff(dl.probes, self.retry_first, self.retry_most)
            await self.save_log(dl)

    def ignore(self, name: str) -> None:
        if name not in self._ignored:
            if len(self._ignored) > 10_000:
                self._ignored.clear()
            self._ignored.add(name)
            log.warning("ignoring an object that no ledgerd writes: %s", name)

    # -- the devices' logs ---------------------------------------------------------------

    async def device_log(self, device: str) -> DeviceLog:
        dl = self.logs.get(device)
        if dl is not None:
            return dl
        raw = await self.ctx.repo.get_meta(LOG_PREFIX + device)
        if raw is not None:
            try:
                dl = DeviceLog.decode(device, raw)
            except ValueError as e:
                log.warning("%s; reading that device's log from its start", e)
        if dl is None:  # first contact
            dl = DeviceLog(device)
        self.logs[device] = dl
        return dl

    async def save_log(self, dl: DeviceLog) -> None:
        await self.ctx.repo.set_meta(LOG_PREFIX + dl.device, dl.encode())

    def held(self) -> Iterable[Held]:
        for device in sorted(self.logs):
            yield from sorted(self.logs[device].held.values(), key=lambda h: (h.ln.seq, h.id))

    def deferred(self) -> bool:
        return any(
            h.state == progress.DEFERRED for dl in self.logs.values() for h in dl.held.values()
        )

    async def feed_time(self) -> int:
        """A feed time for a checkpoint (:meth:`sync.naming.Naming.feed_time`)."""
        return await self.names.feed_time()

    async def cover(self, page: Page, joined: Mapping[str, int]) -> dict[str, int]:
        """Per device, the highest sequence whose packs' sections of this page are all
        in it: every pack listed, below anything held or missing (and what a checkpoint
        the page joined covered: ``joined``, whose packs held are not needed)."""
        key = (page.ledger, page.id)
        device_here = self.ctx.device
        cover = {device_here: self.names.own_seq}
        for name, value in await ex.sync_values(page, "imported/"):
            device = name.removeprefix("imported/")
            if layout.device_ok(device) and device != device_here:
                cover[device] = int(value)
        for device, dl in self.logs.items():
            if device != device_here:
                cover[device] = max(cover.get(device, 0), dl.max_seq)
                for g in dl.gaps:  # (a gap the page's checkpoint covers is in it)
                    if g.last > joined.get(device, 0):
                        cover[device] = min(cover[device], g.first - 1)
            # This device's own packs too: a page restored from a checkpoint imports
            # those above its cover like anyone's, and one held is not in the page.
            for h in dl.held.values():
                if (h.key is None or h.key == key) and h.ln.seq > joined.get(device, 0):
                    cover[device] = min(cover[device], h.ln.seq - 1)
        # Pieces whose writes are not in yet (see sync.download._import_marks).
        for name, value in await ex.sync_values(page, ex.PIECES_WAITING):
            device = name.removeprefix(ex.PIECES_WAITING)
            waiting = ex.waiting_seqs(value)
            if device in cover and waiting:
                cover[device] = min(cover[device], waiting[0] - 1)
        return {d: s for d, s in cover.items() if s > 0}


def _stretches(gaps: list[Gap]) -> list[tuple[int, int]]:
    """The stretches of the feed to list for ``gaps`` (feed times ``[after, until]``),
    overlapping or touching ones joined: a device that left a gap at every other
    sequence is probed with one listing, not one per gap."""
    out: list[tuple[int, int]] = []
    for g in sorted(gaps, key=lambda g: g.after):
        if out and g.after <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], g.until))
        else:
            out.append((g.after, g.until))
    return out
