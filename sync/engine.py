"""Page sync: the engine, a façade over the jobs that run the protocol.

This module owns :class:`SyncEngine`: it has its jobs built (:mod:`sync.assembly`,
each given the :class:`~sync.context.SyncContext` and the other jobs it needs), is
the repository's piece fetcher, commit listener and page restorer, starts and stops
the background loop (:mod:`sync.polling`) and the rounds of :meth:`SyncEngine.sync`
(:mod:`sync.rounds`), and schedules compaction. The jobs are

* :mod:`sync.context`: the bucket's identity and codec, the repository, page leases;
* :mod:`sync.feed`: listing the feed, the devices' logs, this device's next name;
* :mod:`sync.pending` and :mod:`sync.upload`: which pages wait, and upload rounds;
* :mod:`sync.download`: importing listed packs, held packs, restoring a page;
* :mod:`sync.fetch`: lazy fetches of LAZY pieces;
* :mod:`sync.checkpoint_policy`: when checkpoints are written and taken;
* :mod:`sync.status`: what went wrong, and status, problems and health.

The bucket's names are in :mod:`sync.layout`, the pack format in :mod:`sync.pack`,
the per-device download state in :mod:`sync.progress`, checkpoints in
:mod:`sync.checkpoints`, compaction in :mod:`sync.compaction`. Sync sees the store
only through its public API (:mod:`store.page.exchange`, :class:`store.Repository`) and
the cloud only through :class:`~sync.cloud.CloudStore`.

Bucket identity: the first daemon to use a bucket writes the marker
(``ledgerd-bucket.{version}``); a device remembers (repository meta, per cloud
URL) that it has seen it, and from then on refuses a bucket without it instead of
starting an empty one in its place (an unmounted share, a moved folder). A bucket
of an older layout is refused (``docs/convergence.md``).

Upload round: every page with writes not uploaded puts its delta into one pack (one
section per page: its entries and the EAGER pieces of its values, then all pages'
LAZY pieces in the order of their values' bytes); past ``max_pack`` bytes the round
writes more packs, a page's entries always in the last pack that holds its pieces,
so a value is in the bucket before any entry that names it. The sequence number and
feed time are taken (and saved) before the PUT, so a crash leaves at most a gap.
Then the page's upload mark moves up to the writes the delta held. Which pages have
writes pending is kept in repository meta (``sync/pending``), so a round opens only
those.

Discovery: one LIST of ``packs/`` after a cursor that lags the names a window shows
every device's new packs; feed times are a hybrid logical clock
(:meth:`sync.naming.Naming.next_seq`), so no clock's error hides a pack. Each pack
carries its device's sequence number: sequences missing from a device's log are
gaps, probed with backoff over the stretch of the feed where they must lie.

Download: per pack, its index and the EAGER sections of the pages this device
holds, in one ranged GET (or the index, then coalesced ranges of sections). The
store verifies everything and joins a delta once it is causally ready (the writes
it builds on are here); one that is not is held and retried, and never blocks later
packs. LAZY pieces are recorded with their location and fetched on first read,
adjacent ranges of one pack in one GET, within ``fetch_timeout``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from ledgerd.store import Commit, CommitListener, Page, PageHooks, Repository, ResolverSource
from ledgerd.sync import compaction, crypto
from ledgerd.sync.assembly import Jobs, Settings, build
from ledgerd.sync.checkpoint_policy import CheckpointPolicy
from ledgerd.sync.checkpoints import MAX_CHECKPOINT, Checkpoints
from ledgerd.sync.cloud import CloudStore
from ledgerd.sync.context import LOCAL, Key, SyncContext
from ledgerd.sync.download import Downloader
from ledgerd.sync.errors import SyncStoppedError, SyncTimeoutError
from ledgerd.sync.feed import FEED_WINDOW, LISTED_WALL, LISTED_WALL_STEP, Feed
from ledgerd.sync.fetch import COALESCE_GAP, COALESCE_SPAN, PREFETCH
from ledgerd.sync.metered import Metered
from ledgerd.sync.pagestate import PageState
from ledgerd.sync.pending import PENDING_SLACK_MS
from ledgerd.sync.polling import Poller
from ledgerd.sync.progress import Held
from ledgerd.sync.rounds import RoundObserver, Rounds, Stats
from ledgerd.sync.status import StatusBoard, describe
from ledgerd.sync.upload import LEASE_MOST, MAX_PACK, READ_BATCH

log = logging.getLogger(__name__)

__all__ = [  # the names other modules and tests import from here
    "COALESCE_GAP",
    "COALESCE_SPAN",
    "COMPACTED_AT",
    "FEED_WINDOW",
    "LEASE_MOST",
    "LISTED_WALL",
    "LISTED_WALL_STEP",
    "LOCAL",
    "MAX_PACK",
    "PENDING_SLACK_MS",
    "PREFETCH",
    "READ_BATCH",
    "PageState",
    "RoundObserver",
    "Stats",
    "SyncEngine",
]


COMPACTED_AT = "sync/compacted_at"
"""Repository meta: the wall time of this device's last compaction."""


class SyncEngine:
    """Syncs one repository's pages through a bucket.

    Made before the repository opens, because the repository's pages need it:
    it fetches their LAZY pieces and hears of their commits (the
    :class:`~ledgerd.store.PieceFetcher` and :class:`~ledgerd.store.CommitListener`
    of :meth:`hooks`). :meth:`start` then gives it the repository::

        engine = SyncEngine(store)
        repo = await Repository.open(path, hooks=engine.hooks())
        await engine.start(repo)

    ``wants(ledger, page)``, if given, says which pages this device holds: packs
    bring only those (every page, without it). ``clock`` is the wall clock (tests
    skew it). ``compaction_settle``: seconds a checkpoint is listed before compaction
    takes it as covering a pack (``sync.compaction``; the feed window by default).
    """

    def __init__(
        self,
        store: CloudStore,
        *,
        location: str = "",
        poll_interval: float = 0.5,
        poll_interval_max: float = 60.0,
        active_for: float = 10.0,
        debounce: float = 0.5,
        max_pack: int = MAX_PACK,
        feed_window: float = FEED_WINDOW,
        fetch_timeout: float = 60.0,
        retry_first: float = 5.0,
        retry_most: float = 3600.0,
        clock_skew: float = 300.0,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        wants: Callable[[bytes, bytes], bool] | None = None,
        observer: RoundObserver | None = None,
        max_checkpoint: int = MAX_CHECKPOINT,
        checkpoint_interval: float = 60.0,
        compaction_grace: float = compaction.GRACE,
        compaction_interval: float = 24 * 3600.0,
        compaction_settle: float | None = None,
        keys: crypto.KeyRing | None = None,
    ) -> None:
        self.jobs: Jobs = build(
            store,
            Settings(
                location=location,
                keys=keys,
                clock=clock,
                monotonic=monotonic,
                wants=wants,
                max_pack=max_pack,
                feed_window=feed_window,
                fetch_timeout=fetch_timeout,
                retry_first=retry_first,
                retry_most=retry_most,
                clock_skew=clock_skew,
                max_checkpoint=max_checkpoint,
                checkpoint_interval=checkpoint_interval,
                compaction_grace=compaction_grace,
                compaction_settle=compaction_settle,
                # This module's PENDING_SLACK_MS, read when the engine is made (a test
                # sets it).
                pending_slack_ms=PENDING_SLACK_MS,
            ),
            changed=self._changed,
        )
        self.rounds = Rounds(self.jobs, observer)
        self.poller = Poller(poll_interval, poll_interval_max, active_for, debounce)
        self._also: CommitListener | None = None
        self._task: asyncio.Task[None] | None = None
        self._syncs: set[asyncio.Task[None]] = set()  # the rounds of sync() calls in flight
        self._stopping = False  # interrupt() was called: no new sync() calls
        self._stopped = False
        self.compaction_interval = compaction_interval
        self._compacted_at: float | None = None  # wall time of the last compaction
        self._compact_again_at: float | None = None  # monotonic: a run a window later

    # -- the jobs (:mod:`sync.assembly`) others reach, as the engine's own attributes ------

    @property
    def store(self) -> Metered:
        return self.jobs.store

    @property
    def ctx(self) -> SyncContext:
        return self.jobs.ctx

    @property
    def checkpoints(self) -> Checkpoints:
        return self.jobs.checkpoints

    @property
    def feed(self) -> Feed:
        return self.jobs.feed

    @property
    def compactor(self) -> compaction.Compactor:
        return self.jobs.compactor

    @property
    def policy(self) -> CheckpointPolicy:
        return self.jobs.policy

    @property
    def board(self) -> StatusBoard:
        return self.jobs.board

    @property
    def downloader(self) -> Downloader:
        return self.jobs.downloader

    @property
    def interval(self) -> float:
        """Seconds to the next background poll."""
        return self.poller.interval

    # -- what the jobs hold, as the engine's own attributes ----------------------------

    @property
    def repo(self) -> Repository:
        return self.ctx.repo

    @property
    def device(self) -> str:
        """This device as it is named in the bucket: its id in hex, or in an encrypted
        bucket a keyed hash of it."""
        return self.ctx.device

    @property
    def codec(self) -> crypto.Codec | None:
        """The bucket's codec once its marker was checked, if the bucket is encrypted."""
        return self.ctx.codec

    @property
    def keys(self) -> crypto.KeyRing | None:
        return self.ctx.keys

    @keys.setter
    def keys(self, keys: crypto.KeyRing | None) -> None:
        self.ctx.keys = keys

    @property
    def location(self) -> str:
        """The cloud URL, as repository meta names the bucket."""
        return self.ctx.location

    @location.setter
    def location(self, location: str) -> None:
        self.ctx.location = location

    @property
    def bucket_error(self) -> str | None:
        return self.ctx.bucket_error

    # -- lifecycle -----------------------------------------------------------------

    def hooks(
        self, resolvers: ResolverSource | None = None, also: CommitListener | None = None
    ) -> PageHooks:
        """The page hooks to open the repository with: this engine fetches and listens
        (and tells ``also`` of every commit: the daemon's metrics)."""
        self._also = also
        return PageHooks(fetcher=self, listener=self, resolvers=resolvers, restorer=self)

    async def start(self, repo: Repository, background: bool = True) -> None:
        """Sync ``repo`` (opened with :meth:`hooks`), in the background unless told not to."""
        if repo.hooks.fetcher is not self or repo.hooks.listener is not self:
            raise ValueError("open the repository with this engine's hooks()")
        self.ctx.attach(repo)
        await self.feed.load()
        await self.board.load()
        await self.jobs.pending.load()  # (status tells pending pages from the start)
        await self.checkpoints.load(repo)
        if background:
            self._task = asyncio.create_task(
                self.poller.run(self.round, self._compact_when_due), name="sync"
            )

    async def interrupt(self, timeout: float = 5.0) -> None:
        """End sync's work in flight: the background loop, and every :meth:`sync` call
        (each raises :class:`SyncStoppedError`); later ones raise it at once. Waits up to
        ``timeout`` seconds for them to end (a cloud call they wait for on a thread is
        not waited for: it cannot be cancelled, and its result is dropped)."""
        self._stopping = True
        tasks = {*self._syncs, *([self._task] if self._task is not None else [])}
        self._task = None
        for task in tasks:
            task.cancel()
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=timeout)
            if pending:
                log.warning(
                    "%d sync tasks did not end within %gs of stopping", len(pending), timeout
                )

    async def stop(self, final_upload_timeout: float = 5.0) -> None:
        """:meth:`interrupt`, then one last upload round (bounded by
        ``final_upload_timeout``: what does not go up goes up on the next start), then
        close the store. Only the first call does anything."""
        if self._stopped:
            return
        self._stopped = True
        await self.interrupt()
        try:
            await asyncio.wait_for(self.round(download=False), final_upload_timeout)
        except TimeoutError:
            log.warning(
                "the last upload at stop did not finish within %gs; the rest goes up "
                "on the next start",
                final_upload_timeout,
            )
        except Exception as e:
            log.warning("the last upload at stop failed (it goes up on the next start): %s", e)
        try:  # a short stop is no absence (see CheckpointPolicy.rejoin_if_away)
            await self.feed.save_wall_listed()
        except Exception as e:
            log.warning("saving the time of the last listing at stop failed: %s", describe(e))
        await self.store.close()

    async def fetch_pieces(self, page: Page, digests: list[bytes]) -> dict[bytes, bytes]:
        return await self.jobs.fetcher.fetch(page, digests)

    def page_committed(self, page: Page, commit: Commit) -> None:
        self._changed((page.ledger, page.id))
        if self._also is not None:
            self._also.page_committed(page, commit)

    def requeued(self, key: Key) -> None:
        """``key`` has pending uploads again (a repair made pieces or commits pending)."""
        self._changed(key)

    def upload_error(self, key: Key) -> str | None:
        """Why the page's last upload failed, or None."""
        return self.board.upload_error(key)

    def _changed(self, key: Key) -> None:
        if not self.jobs.pending.changed(key):  # the _local ledger never leaves this device
            return
        self.poller.changed()

    def poke(self) -> None:
        """Poll at once, and fast for a while (``ledgerctl sync`` does this)."""
        self.poller.poke()

    async def _compact_when_due(self) -> None:
        """Compact when ``compaction_interval`` has passed since the last compaction,
        by the wall clock (the time is kept across restarts). A last compaction in the
        future means the clock went back: that is due too, or a clock set back a year
        would put compaction off for a year."""
        if self._compacted_at is None:  # read once; every poll asks
            self._compacted_at = float(await self.repo.get_meta(COMPACTED_AT) or b"0")
        again_at = self._compact_again_at
        again = again_at is not None and self.ctx.monotonic() >= again_at
        if 0 <= self.ctx.clock() - self._compacted_at < self.compaction_interval and not again:
            return
        self._compact_again_at = None
        try:
            report = await self.compact()
            if report.packs_settling:  # their checkpoints are new: a run a window later
                self._compact_again_at = self.ctx.monotonic() + self.compactor.settle + 1
        except asyncio.CancelledError:
            raise
        except Exception as e:  # nothing was lost; the next interval tries again
            log.warning("compaction failed: %s", describe(e))
        self._compacted_at = self.ctx.clock()
        await self.repo.set_meta(COMPACTED_AT, str(self._compacted_at).encode())

    async def compact(self) -> compaction.Report:
        """Delete this device's packs and checkpoints that checkpoints made unneeded
        and that are older than ``compaction_grace`` (see :mod:`sync.compaction`)."""
        return await self.rounds.compact()

    # -- rounds --------------------------------------------------------------------

    async def round(
        self,
        download: bool = True,
        only: tuple[bytes, bytes | None] | None = None,
        full: bool = False,
    ) -> Stats:
        """One listing of the feed, one upload round, then the imports.

        ``full`` (the first round of :meth:`sync`) checks the bucket's marker again
        and retries held packs and probes gaps without waiting for their backoff.
        Raises if the round as a whole failed (the bucket, the listing); a page's or
        a pack's failure stays theirs, in status. Without ``download`` (at stop) it
        lists only if the last listing is old (the feed time of a new pack needs it).
        """
        return await self.rounds.round(download, only, full)

    async def sync(
        self, ledger: bytes | None = None, page: bytes | None = None, timeout: float = 60.0
    ) -> Stats:
        """Upload everything pending, fetch everything visible, merge; repeat until quiet.

        Returns when a round moves nothing; what could not be synced is then in
        :meth:`problems`. Raises SyncTimeoutError, with the last error seen, after
        ``timeout`` seconds.
        """
        only = (ledger, page) if ledger is not None else None
        total = Stats()
        if self._stopping:
            raise SyncStoppedError()
        log.debug("sync requested: rounds until quiet, for up to %gs", timeout)
        self.poller.active()
        # The rounds run in a task of their own, which :meth:`interrupt` cancels and
        # waits for: none outlives the engine (or the repository it syncs).
        task = asyncio.create_task(self.rounds.until_quiet(only, total), name="sync request")
        self._syncs.add(task)
        task.add_done_callback(self._syncs.discard)
        try:
            done, _ = await asyncio.wait({task}, timeout=timeout)
        finally:
            if not task.done():  # the timeout, or our caller was cancelled
                task.cancel()
                await asyncio.wait({task})
        if not done:
            reason = self.store.last_failure() or self.board.round_error
            raise SyncTimeoutError(
                f"did not finish within {timeout:g}s"
                + (f"; last error: {reason}" if reason else "")
            )
        if task.cancelled():  # by interrupt()
            raise SyncStoppedError()
        task.result()  # the round's error, if it failed
        return total

    async def restore_page(self, page: Page) -> bool:
        """Bring an evicted page back (:class:`store.PageRestorer`; see
        :meth:`sync.download.Downloader.restore`)."""
        return await self.downloader.restore(page)

    async def reencrypt(self, keys: crypto.KeyRing | None = None) -> int:
        """Key rotation: this device's packs sealed with another key than the write key
        go up again, sealed with it, as new packs (the old ones stay until compaction
        deletes them; ``sync/rekeyed/...`` remembers the last one done, so a second
        run goes on where the first stopped). ``keys``: the key file read again (its
        first key is the new one; it is registered in the bucket). Returns the packs
        uploaded."""
        return await self.rounds.reencrypt(keys)

    # -- status ----------------------------------------------------------------------

    def _held(self) -> Iterable[Held]:
        return self.feed.held()

    @property
    def last_error(self) -> str | None:
        """The first thing in the way of sync, if any (``sync_error`` in status)."""
        return self.board.last_error

    def problems(
        self, ledger: bytes | None = None, page: bytes | None = None
    ) -> list[dict[str, Any]]:
        """What sync could not do, of the page or ledger given (plus whole-bucket ones)."""
        return self.board.problems(ledger, page)

    def status(self) -> dict[str, Any]:
        """Sync's part of ``/v1/status``: every problem, for open and closed pages."""
        return self.board.status(
            self.interval, self.poller.poll_interval, self.poller.poll_interval_max
        )

    def health(self) -> dict[str, Any]:
        """Whether sync works, and whether this device is synced, with every reason why
        not (see :meth:`sync.status.StatusBoard.health`)."""
        return self.board.health(self.poller.poll_interval, self.poller.poll_interval_max)

    def gauges(self) -> dict[str, Any]:
        """Sync's state for the metrics (see :meth:`sync.status.StatusBoard.gauges`)."""
        return self.board.gauges(self.poller.poll_interval, self.poller.poll_interval_max)

    async def page_status(self, page: Page) -> dict[str, Any]:
        return await self.board.page_status(page)

    def page_states(self, keys: Iterable[Key]) -> list[dict[str, Any]]:
        """Pages' sync without opening them (:meth:`sync.status.StatusBoard.page_states`)."""
        return self.board.page_states(keys)

    def conflicted(self) -> list[tuple[Key, int, str | None]]:
        """Pages with conflicts at their last sync (:meth:`StatusBoard.conflicted`)."""
        return self.board.conflicted()

    def devices(self) -> list[dict[str, Any]]:
        """Every device the feed showed (:meth:`sync.status.StatusBoard.devices`)."""
        return self.board.devices()
