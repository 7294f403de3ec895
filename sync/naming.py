"""This device's pack names: sequence numbers and feed times (a hybrid logical clock).

This module owns :class:`Naming`: the sequence number and feed time of this device's
next pack, taken and saved before its PUT (:meth:`Naming.next_seq`), a number taken
and never seen in the bucket (:meth:`Naming.spent`), and how far this device's packs
are known to be in the bucket. The feed times never go below what the last listing
showed; the listing itself is :mod:`sync.feed`'s.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

from ledgerd.sync import layout
from ledgerd.sync.context import SyncContext
from ledgerd.sync.layout import PackName

SEQ_UP = "sync/seq_up"
"""Repository meta: the highest sequence of this device's packs known to be in the bucket."""


class Naming:
    """This device's pack names. ``fresh()`` lists the feed unless it was listed
    lately; ``newest()`` is the newest feed time listed."""

    def __init__(
        self,
        ctx: SyncContext,
        feed_window: float,
        *,
        fresh: Callable[[], Awaitable[None]],
        newest: Callable[[], int],
    ) -> None:
        self.ctx = ctx
        self.feed_window = feed_window
        self.fresh = fresh
        self.newest = newest
        self.own_seq = 0  # the highest sequence of this device listed or written
        self.own_time = 0

    async def load(self) -> None:
        up = int(await self.ctx.repo.get_meta(SEQ_UP) or b"0")
        self.own_seq = max(self.own_seq, min(up, layout.NAMED_SEQ_CEILING))

    def saw(self, pn: PackName) -> None:
        """This device's pack was listed. Anyone may name an object so: a name moves
        the next ones only so far."""
        self.own_seq = max(self.own_seq, min(pn.seq, layout.NAMED_SEQ_CEILING))
        self.own_time = max(self.own_time, min(pn.time, layout.NAMED_TIME_CEILING))

    async def next_seq(self) -> tuple[int, int]:
        """The next sequence number and feed time, saved before use.

        The sequence is never below what the bucket shows of this device (the last
        listing saw its packs after the cursor); the feed time is never below this
        device's last pack nor the newest name listed (a hybrid logical clock), so
        a reader's cursor never passes a pack that is not up yet, whatever the
        clocks say.
        """
        await self.fresh()
        stored, last = await self._saved()
        seq = max(stored, self.own_seq) + 1
        t = self._time_after(last)
        # The time first: a stop between the two writes leaves the number untaken
        # (taken again, at a new time), never taken with no time to look for it at.
        await self.ctx.repo.set_meta("sync/seq_time", str(t).encode())
        await self.ctx.repo.set_meta("sync/seq", str(seq).encode())
        return seq, t

    async def _saved(self) -> tuple[int, int]:
        """The sequence number and feed time :meth:`next_seq` saved last, held to the
        ceilings (saved before listed names were, they may be past them)."""
        repo = self.ctx.repo
        stored = int(await repo.get_meta("sync/seq") or b"0")
        t = int(await repo.get_meta("sync/seq_time") or b"0")
        return min(stored, layout.NAMED_SEQ_CEILING), min(t, layout.NAMED_TIME_CEILING)

    def _time_after(self, last: int) -> int:
        """A feed time after ``last``, this device's last pack and the newest name listed."""
        return max(int(self.ctx.clock() * 1000), self.newest(), last + 1, self.own_time + 1)

    async def retime(self, t: int) -> int:
        """The feed time for the PUT, tried again, of the pack this device last took a
        number for, named ``t`` then: ``t`` while it is recent (a quarter of the
        window), else a new one, saved for :meth:`spent` to look at (should the first
        PUT land after all, a reader takes whichever of the two it lists first)."""
        now = self._time_after(t)
        if now - t <= self.feed_window * 1000 / 4:
            return t
        await self.ctx.repo.set_meta("sync/seq_time", str(now).encode())
        return now

    async def spent(self) -> tuple[int, int] | None:
        """The sequence number this device last took (saved before its pack's PUT, see
        :meth:`next_seq`) if its pack is not in the bucket: the process that took it
        stopped during the PUT. Other devices wait for that number as a gap in this
        device's log, so it has to go up (:mod:`sync.upload`); returned with a new feed
        time for it, saved. None when the pack is listed or found at its feed time (one
        LIST, only when this process has not listed it)."""
        await self.fresh()
        stored, t0 = await self._saved()
        if stored <= self.own_seq:
            return None
        if stored == layout.NAMED_SEQ_CEILING or t0 == layout.NAMED_TIME_CEILING:
            return None  # held to the ceilings: saved from a hostile name, never spent
        if not t0:
            return None
        async for pn in named_between(self.ctx, t0, t0):
            if pn.device == self.ctx.device:  # its pack is older than the listing window
                await self.wrote(pn.seq, pn.time)
        if stored <= self.own_seq:
            return None
        t = self._time_after(t0)
        await self.ctx.repo.set_meta("sync/seq_time", str(t).encode())
        return stored, t

    async def wrote(self, seq: int, t: int) -> None:
        """This device's pack of sequence ``seq`` and feed time ``t`` is in the bucket:
        remembered (``sync/seq_up``), since compaction deletes it later, and a number
        taken and not seen in the bucket would be taken for spent (:meth:`spent`) and
        filled again, a second pack of that number that readers take for a broken
        cover."""
        if seq > self.own_seq:
            await self.ctx.repo.set_meta(SEQ_UP, str(seq).encode())
        self.own_seq, self.own_time = max(self.own_seq, seq), max(self.own_time, t)

    async def feed_time(self) -> int:
        """A feed time for a checkpoint: never below this device's last pack nor the
        newest name listed (as for packs, without using a sequence number)."""
        return max(int(self.ctx.clock() * 1000), self.newest(), self.own_time)


async def named_between(ctx: SyncContext, after: int, until: int) -> AsyncIterator[PackName]:
    """The packs listed with feed times from ``after`` to ``until`` (one listing)."""
    async for name in ctx.store.list(layout.PACKS, layout.feed_after(after)):
        pn = PackName.parse(name)
        if pn is None:
            continue
        if pn.time > until:
            return
        yield pn
