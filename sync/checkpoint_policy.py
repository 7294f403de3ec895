"""When this device writes checkpoints, and when it starts pages from them.

This module owns :class:`CheckpointPolicy`: after a page's upload, a checkpoint
when its history since the last one calls for it, at most one per
``checkpoint_interval`` per page (one that has to wait is written by a later
round); the checkpoints compaction asks for; and joining checkpoints: every page's,
on a device's first listing of the bucket (bootstrap), after it was away for longer
than the compaction grace, and after a pack it listed was deleted before it
imported it (rejoin); one page's, when its held sections wait for writes that no
listed pack holds (rescue). What a checkpoint holds, and reading and writing it, are
:mod:`sync.checkpoints`'; what compaction deletes is :mod:`sync.compaction`'s.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

from ledgerd.store import Page
from ledgerd.store.errors import named
from ledgerd.store.page import exchange as ex
from ledgerd.sync.checkpoints import Checkpoints
from ledgerd.sync.context import LOCAL, Key, SyncContext
from ledgerd.sync.feed import Feed
from ledgerd.sync.layout import CheckpointName
from ledgerd.sync.status import describe

log = logging.getLogger(__name__)

REJOINING = "sync/rejoining"
"""Repository meta: set while a device away past the grace (or one that missed a
pack: :meth:`CheckpointPolicy.missed`) joins its pages with the checkpoints (see
:meth:`CheckpointPolicy.rejoin_if_away`)."""


class CheckpointPolicy:
    """Writes checkpoints when due, and takes them where a page must start again.

    ``changed(key)`` is told of a page that joined a checkpoint (a round looks at it);
    ``grace`` is the compaction grace; ``wake(key)`` makes the page's held sections
    due again.
    """

    def __init__(
        self,
        ctx: SyncContext,
        feed: Feed,
        checkpoints: Checkpoints,
        *,
        interval: float,
        grace: float,
        changed: Callable[[Key], None],
        wake: Callable[[Key], None] = lambda key: None,
    ) -> None:
        self.ctx = ctx
        self.feed = feed
        self.checkpoints = checkpoints
        self.interval = interval
        self.grace = grace
        self._rejoining: bool | None = None  # REJOINING, once read (see rejoin_if_away)
        self.changed = changed
        self.wake = wake
        self._due: dict[Key, None] = {}  # waiting for checkpoint_interval
        self._at: dict[Key, float] = {}  # monotonic time of the page's last one

    async def after_upload(self, page: Page) -> None:
        """Write a checkpoint of the page if its history since the last one calls for it,
        at most one per ``checkpoint_interval`` (a bulk load rewrites most of a page in
        every round); one that has to wait is written by a later round."""
        key = (page.ledger, page.id)
        if self._rejoining or self.feed.restarting:
            # A pack was deleted before this device read it: the pages' covers claim
            # what they lack until they join the checkpoints again (the next listing).
            self._due[key] = None
            return
        try:
            if not await self.checkpoints.due(page):
                self._due.pop(key, None)
                return
            if page.writer.uncommitted or await ex.has_unuploaded(page):
                return  # written since the upload: the next upload's round writes it
            if time.monotonic() < self._at.get(key, -1e9) + self.interval:
                self._due[key] = None
                return
            self._due.pop(key, None)
            written = await self.checkpoints.write(
                page,
                self.ctx.repo.device_id,
                await self.feed.feed_time(),
                await self._cover_after_best(page),
            )
            if written is not None:  # (one not written, e.g. for a write that came since
                self._at[key] = time.monotonic()  # the upload, waits for no interval)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the page's history is still there; a later round retries
            log.warning(
                "checkpoint of page %s of ledger %s failed: %s",
                named(key[1]),
                named(key[0]),
                describe(e),
            )

    async def write_due(self) -> None:
        """The checkpoints that waited for ``checkpoint_interval`` and may go now."""
        now = time.monotonic()
        repo = self.ctx.repo
        for key in list(self._due):
            if now >= self._at.get(key, -1e9) + self.interval:
                if not repo.page_exists(*key) or repo.is_evicted(*key):
                    self._due.pop(key, None)
                    continue
                async with self.ctx.using(key) as page:
                    await self.after_upload(page)

    async def write_for_compaction(self, key: Key) -> bool:
        """A checkpoint of ``key`` now, if this device holds the page (compaction's
        :data:`sync.compaction` writer). True if one was written."""
        repo = self.ctx.repo
        if key[0] == LOCAL or not repo.page_exists(*key) or not self.ctx.wanted_here(key):
            return False
        if self._rejoining or self.feed.restarting:  # (see after_upload)
            return False
        async with self.ctx.using(key) as page:
            return (
                await self.checkpoints.write(
                    page,
                    repo.device_id,
                    await self.feed.feed_time(),
                    await self._cover_after_best(page),
                    force=True,
                )
                is not None
            )

    async def _cover_after_best(self, page: Page) -> dict[str, int]:
        """The cover of a checkpoint of the page written now, once the page joined its
        best checkpoint if that one covers a pack the page lacks: a new checkpoint
        never holds less than the best before it. Compaction deleted packs that one
        covers, and it goes once another is best and the grace is over: a newest one
        that lacked them (its writer had not read them) would lose them for good."""
        key = (page.ledger, page.id)
        cover = await self.feed.cover(page, self.checkpoints.covers.get(key, {}))
        names = [cn async for cn in self.checkpoints.names(self.checkpoints.tag(key))]
        for cn in (await self.checkpoints.best(names)).values():
            head = await self.checkpoints.read(cn, sections=False)
            if head.key != key or all(s <= cover.get(d, 0) for d, s in head.cover.items()):
                continue
            await self.checkpoints.take(page, await self.checkpoints.read(cn))
            await self.feed.absorb(head.cover, key, cn.time)
            self.changed(key)
            cover = await self.feed.cover(page, self.checkpoints.covers.get(key, {}))
        return cover

    async def rescue(self, key: Key) -> bool:
        """Join page ``key`` with its best checkpoint, unless it joined that one already:
        its held sections wait for writes no listed pack holds (compacted into the
        checkpoint, or deleted before this device read them). True if it joined one."""
        if not self.ctx.wanted_here(key) or not self.ctx.repo.page_exists(*key):
            return False
        cp = await self.checkpoints.best_for(key)
        if cp is None or self.checkpoints.joined.get(key) == cp.name.name:
            return False
        async with self.ctx.using(key) as page:
            await self.checkpoints.take(page, cp)
        await self.feed.absorb(cp.cover, key, cp.name.time)
        log.info(
            "page %s of ledger %s waited for writes no listed pack holds: joined checkpoint %s",
            named(key[1]),
            named(key[0]),
            cp.name.name,
        )
        self.changed(key)
        return True

    async def bootstrap(self) -> None:
        """A device that has never listed this bucket joins the pages it wants with
        their checkpoints, at its first listing (once per cloud URL)."""
        done = f"sync/bootstrapped/{self.ctx.location}"
        if self.feed.feed_max or await self.ctx.repo.get_meta(done) is not None:
            return
        # Its first listing joins the checkpoints and starts each device's log at its
        # first pack (compaction may have deleted those before, also of pages no
        # checkpoint covered when it read them): marked now, so that a stop before
        # that listing keeps it.
        await self.feed.restart()
        await self.ctx.repo.set_meta(done, b"1")

    async def missed(self, name: str) -> None:
        """A pack this device listed was deleted (compacted) before it imported it: the
        pages in it lack its changes, and their later packs would wait for them for
        good (or, once compacted too, leave the pages behind with nothing in status).
        Compaction deletes only what a checkpoint covers, so the next round starts
        again from the checkpoints, as after an absence; marked in the repository, so
        a stop before that round does not lose it."""
        if self._rejoining:
            return
        log.warning(
            "pack %s was deleted before this device imported it (an import backlog "
            "longer than compaction_grace): starting again from the checkpoints",
            name,
        )
        await self.ctx.repo.set_meta(REJOINING, b"1")
        self._rejoining = True

    async def absent(self, away: float) -> None:
        """This device last listed the bucket ``away`` seconds ago, longer than the
        grace (told by any listing: one an upload makes comes before the round's
        :meth:`rejoin_if_away`): marked, for the next round to join the checkpoints."""
        if self._rejoining:
            return
        await self.ctx.repo.set_meta(REJOINING, b"1")
        self._rejoining = True
        log.warning(
            "this device last read the bucket %s ago, longer than compaction_grace: "
            "joining its pages with the checkpoints",
            _span(away),
        )

    async def rejoin_if_away(self) -> None:
        """A device that has not listed the bucket for longer than ``compaction_grace``
        may have missed packs that are deleted now: every page it holds joins its best
        checkpoint (its own writes not uploaded stay: the checkpoint has not seen them)
        and takes the packs above it."""
        # Marked until every page has joined: a stop midway (after which a listing may
        # have made this device look present) finishes the rejoin at the next round.
        if self._rejoining is None:  # (read once: this object keeps it after)
            self._rejoining = await self.ctx.repo.get_meta(REJOINING) is not None
        if self._rejoining:  # (an absence a listing saw, or a pack missed: see missed)
            log.warning("joining the pages with the checkpoints, as marked")
        else:
            listed = await self.feed.wall_listed()
            away = max(self.ctx.clock() - listed, self.feed.listed_ago())
            if not listed or away <= self.grace:
                return
            await self.absent(away)
        for dl in self.feed.logs.values():  # (floors come again from the checkpoints)
            dl.restart()
            await self.feed.save_log(dl)
        # The next listing joins every page with its best checkpoint (its own writes not
        # uploaded stay: the checkpoint has not seen them) and takes the packs above it.
        await self.feed.restart()
        await self.feed.set_wall_listed(self.ctx.clock())
        await self.ctx.repo.delete_meta(REJOINING)
        self._rejoining = False

    def _rejoins(self, key: Key) -> bool:
        """Whether a page joins its checkpoint when this device starts again from them:
        a page it holds that it wants here, or one it does not hold that it wants."""
        if self.ctx.repo.page_exists(*key):
            return self.ctx.wanted_here(key)
        return self.ctx.wanted(key)

    async def list_checkpoints(self) -> list[CheckpointName]:
        """Every checkpoint in the bucket, for a restart listing (:class:`sync.feed.Restarter`)."""
        return [cn async for cn in self.checkpoints.names()]

    async def join_checkpoints(self, listed: Sequence[object]) -> tuple[dict[str, int], int]:
        """Join every page this device holds and wants here, or wants and does not
        hold, with its best checkpoint of ``listed`` (a join is idempotent); held
        packs those hold are not needed. Per device, the highest sequence they cover,
        and their newest feed time (:class:`sync.feed.Restarter`)."""
        names = [cn for cn in listed if isinstance(cn, CheckpointName)]
        held, joined, newest = await self.checkpoints.join_best(
            names, self._rejoins, self.ctx.using
        )
        for key in joined:
            self.changed(key)
            self.wake(key)
        for dl in self.feed.logs.values():
            drop = [
                hid
                for hid, h in dl.held.items()
                if h.key and self.checkpoints.covered(h.key, h.ln.device, h.ln.seq)
            ]
            for hid in drop:
                del dl.held[hid]
            if drop:
                await self.feed.save_log(dl)
        return held, newest


def _span(seconds: float) -> str:
    """``seconds`` in the largest unit that keeps it at least 1 (days, hours, minutes)."""
    for unit, size in (("days", 86400), ("hours", 3600), ("minutes", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.0f} seconds"
