"""Sync rounds: one at a time, each a bucket check, a listing, an upload, the imports.

This module owns :class:`Rounds`, which runs the engine's rounds over its jobs
(:class:`~sync.assembly.Jobs`) under one lock, and the work that takes the same lock
(compaction, re-sealing under a new key); :class:`Stats` counts what a round moved
and :class:`RoundObserver` hears of every round (the daemon's metrics). When rounds
run is :mod:`sync.polling`'s and :class:`~sync.engine.SyncEngine`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Protocol

from ledgerd.store.errors import ClosedError
from ledgerd.sync import compaction, crypto
from ledgerd.sync.assembly import Jobs
from ledgerd.sync.errors import BucketIdentityError, NoBucketError
from ledgerd.sync.status import describe

log = logging.getLogger(__name__)


class RoundObserver(Protocol):
    """Told of every sync round (the daemon's metrics)."""

    def round_done(self, seconds: float, stats: Stats, error: BaseException | None) -> None: ...


@dataclass
class Stats:
    uploaded_packs: int = 0
    downloaded_packs: int = 0
    rounds: int = 0


class Rounds:
    """Runs sync rounds over ``jobs``, one at a time, telling ``observer`` of each."""

    def __init__(self, jobs: Jobs, observer: RoundObserver | None = None) -> None:
        self.jobs = jobs
        self.observer = observer
        self.lock = asyncio.Lock()  # one round at a time

    async def round(
        self,
        download: bool = True,
        only: tuple[bytes, bytes | None] | None = None,
        full: bool = False,
    ) -> Stats:
        """One listing of the feed, one upload round, then the imports (see
        :meth:`sync.engine.SyncEngine.round`)."""
        j = self.jobs
        stats = Stats()
        async with self.lock:
            before = j.store.snapshot()
            started = time.monotonic()
            try:
                await self._steps(stats, download, only, full)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                j.board.round_error = describe(e)
                if isinstance(e, NoBucketError | BucketIdentityError):
                    j.ctx.bucket_ok = False
                self._observe(started, stats, e)
                raise
            finally:
                j.board.last_round = {
                    **j.store.since(before),
                    "uploaded_packs": stats.uploaded_packs,
                    "imported_packs": stats.downloaded_packs,
                    "seconds": round(time.monotonic() - started, 3),
                    "at": time.time(),
                }
                await self._save_sync_times()
            j.board.round_error = None
            j.board.last_round_ok = time.time()
            stats.rounds = 1
            self._observe(started, stats, None)
        return stats

    async def _steps(
        self,
        stats: Stats,
        download: bool,
        only: tuple[bytes, bytes | None] | None,
        full: bool,
    ) -> None:
        """A round's steps, in order, counting what moved in ``stats``."""
        j = self.jobs
        if full:
            j.ctx.bucket_ok = False
        await j.ctx.check_bucket()
        # (Before an upload too: its listing, for the pack's name, is the
        # device's first, which a bootstrap marks as a restart.)
        await j.policy.bootstrap()
        if download:
            await j.policy.rejoin_if_away()
            await j.feed.list_new()
        stats.uploaded_packs = await j.uploader.upload_all(only)
        if download:
            stats.downloaded_packs = await j.downloader.download(force=full)
            await self._resolve_again()
        await j.policy.write_due()

    async def until_quiet(self, only: tuple[bytes, bytes | None] | None, total: Stats) -> None:
        """Rounds until one moves nothing (the first a ``full`` one), added up in
        ``total``; a few more while the feed defers packs (a page closing, a dropped
        connection)."""
        full, retries = True, 0
        while True:
            s = await self.round(only=only, full=full)
            full = False
            total.rounds += 1
            total.uploaded_packs += s.uploaded_packs
            total.downloaded_packs += s.downloaded_packs
            if s.uploaded_packs or s.downloaded_packs:
                continue
            if retries < 3 and self.jobs.feed.deferred():  # a page closing, a dropped connection
                retries += 1
                continue
            return

    async def _resolve_again(self) -> None:
        """Resolutions that could not read a value the resolver took (a LAZY value
        fetched first, :meth:`ledgerd.store.ObjectStore.hold`) run again: no import
        may come to start them (a closed page runs them when it opens)."""
        for page in self.jobs.ctx.repo.open_pages():
            if not page.closed and page.resolution_fetch_failed:
                with contextlib.suppress(ClosedError):
                    await page.try_merge()

    async def _save_sync_times(self) -> None:
        """The pages' last sync times (status shows them after a restart): one lost to
        a full disk is no failure of the round."""
        try:
            await self.jobs.board.save()
        except Exception as e:
            log.warning("could not record the pages' last sync times: %s", describe(e))

    def _observe(self, started: float, stats: Stats, error: BaseException | None) -> None:
        if self.observer is not None:
            try:
                self.observer.round_done(time.monotonic() - started, stats, error)
            except Exception:
                log.exception("the sync round observer failed")

    async def compact(self) -> compaction.Report:
        """Upload what is pending, then compact (see
        :meth:`sync.engine.SyncEngine.compact`)."""
        j = self.jobs
        async with self.lock:
            await j.ctx.check_bucket()
            await j.uploader.upload_all()  # what is pending goes up first: covers include it
            return await j.compactor.run(
                j.ctx.device, int(j.ctx.clock() * 1000), j.policy.write_for_compaction
            )

    async def reencrypt(self, keys: crypto.KeyRing | None) -> int:
        """Re-seal this device's packs under the write key (see
        :meth:`sync.engine.SyncEngine.reencrypt`)."""
        j = self.jobs
        async with self.lock:
            if keys is not None:
                j.ctx.keys = keys
            j.ctx.bucket_ok = False
            await j.ctx.check_bucket()
            return await j.uploader.reseal()
