"""A repository's evictions: evicting a page, by hand or by policy, and the record of
evicted pages.

This module owns the repository's side of eviction (the steps, on files and
``page_usage``, are :mod:`store.repo.eviction`'s): which pages are evicted,
evicting an idle page, the policies' passes, and finishing evictions a crash cut
short. Restoring an evicted page as it opens is :mod:`store.repo.pool`'s.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from ledgerd.store.errors import NotEvictableError, PageUnavailableError, named
from ledgerd.store.repo import eviction
from ledgerd.store.repo.layout import decode_name
from ledgerd.store.repo.pool import PagePool
from ledgerd.store.repo.state import log
from ledgerd.store.sqlite import usage as usage_sql
from ledgerd.store.tree import dots

EVICT_PASSES = 20
"""Most passes of :meth:`Repository.evict_by_policy` over the pages to meet a budget."""


class Evicting(PagePool):
    """Evicting closed pages, and finishing evictions cut short."""

    async def _load_evicted(self, cut_short: list[tuple[Path, str]]) -> None:
        """Finish evictions cut short, then read which pages are evicted."""
        for ledger_dir, name in cut_short:
            ledger, page_id = decode_name(ledger_dir.name), decode_name(name)
            if ledger is None or page_id is None:
                continue
            log.info(
                "finishing the eviction of page %s of ledger %s cut short",
                named(page_id),
                named(ledger),
            )
            aside = ledger_dir / (name + eviction.SUFFIX)
            verdict = await asyncio.to_thread(
                eviction.kind_of_aside, aside, dots.tag_of_device(self.device_id)
            )
            await self._mark_evicted(ledger, page_id, verdict, only_unset=True)
            await asyncio.to_thread(eviction.delete_aside, aside)
        rows = await usage_sql.evicted(self.usage)
        self._evicted = {key: kind for key, kind, _ in rows}
        self._evicted_written = {key: written for key, _, written in rows}

    async def _mark_evicted(
        self,
        ledger: bytes,
        page_id: bytes,
        verdict: eviction.Evictability,
        *,
        only_unset: bool = False,
    ) -> None:
        # (Finishing one cut short, ``only_unset``: the row may say already.)
        now_ms = int(time.time() * 1000)
        await usage_sql.mark_evicted(
            self.usage,
            (ledger, page_id),
            verdict.kind,
            verdict.written,
            now_ms,
            only_unset=only_unset,
        )
        self._evicted[(ledger, page_id)] = verdict.kind
        self._evicted_written[(ledger, page_id)] = verdict.written

    async def evict(self, ledger: bytes, page_id: bytes) -> int:
        """Delete the local storage of a closed, fully synced (or empty) page; its next
        use restores it (:mod:`store.repo.eviction`). An open page is closed first if idle.
        Returns the bytes its files took. Raises :class:`NotEvictableError` when the
        page is in use or not fully synced."""
        self._check_open()
        if (ledger, page_id) in self._evicted:
            return 0
        async with self._no_open_of((ledger, page_id)):
            if lost := self.lost_error(ledger, page_id):
                raise lost  # not "not stored here": it is damaged
            return await self._evict(ledger, page_id)

    async def _evict(self, ledger: bytes, page_id: bytes) -> int:
        try:  # not under connections a failed close left open
            await self._close_unclosed((ledger, page_id))
        except PageUnavailableError as e:
            raise NotEvictableError(str(e)) from e
        page = self._pages.get((ledger, page_id))
        if page is not None:
            if not page.closed and not page.idle:
                raise NotEvictableError(f"page {named(page_id)} is in use")
            await page.close()  # or waits for a close under way: its hooks still write
        path = self.page_path(ledger, page_id)
        verdict = await asyncio.to_thread(
            eviction.evictability, path, dots.tag_of_device(self.device_id)
        )
        # Without a cloud only an empty page can go: say so first, rather than "not
        # fully synced", which invites a sync that cannot run.
        if self.hooks.restorer is None and (
            not verdict.ok or verdict.kind == eviction.SYNCED_EVICTED
        ):
            raise NotEvictableError(
                f"page {named(page_id)} of ledger {named(ledger)} cannot be evicted:"
                " nothing could restore it (no cloud)"
            )
        if not verdict.ok:
            raise NotEvictableError(
                f"page {named(page_id)} of ledger {named(ledger)} cannot be evicted:"
                f" {verdict.reason}"
            )
        size = await asyncio.to_thread(eviction.directory_bytes, path.parent)
        aside = await asyncio.to_thread(eviction.set_aside, path.parent)
        await self._mark_evicted(ledger, page_id, verdict)
        await asyncio.to_thread(eviction.delete_aside, aside)
        log.info("page %s of ledger %s evicted (%d bytes)", named(page_id), named(ledger), size)
        return size

    async def evict_by_policy(self, disk_budget: int = 0, older_than: float = 0.0) -> int:
        """Evict closed pages: those closed more than ``older_than`` seconds ago (0:
        none by age), then the least recently used ones while the data directory
        takes more than ``disk_budget`` bytes (0: no budget; measured again after
        each pass: a page's files shrink as it closes, so a pass's own count can be
        off; at most EVICT_PASSES passes). Pages that are not evictable are passed
        over. Returns how many were evicted."""
        evicted = 0
        for _ in range(EVICT_PASSES):
            n = await self._evict_pass(disk_budget, older_than)
            evicted += n
            if not n or not disk_budget:
                break
            # The usage database's WAL grew with every eviction recorded: fold it back
            # before measuring again, or it takes the budget it freed.
            await usage_sql.truncate_wal(self.usage)
            if await asyncio.to_thread(eviction.directory_bytes, self.root) <= disk_budget:
                break
        return evicted

    async def _evict_pass(self, disk_budget: int, older_than: float) -> int:
        rows = await usage_sql.closed_pages(self.usage)
        now_ms = int(time.time() * 1000)
        evicted = 0
        used = await asyncio.to_thread(eviction.directory_bytes, self.root) if disk_budget else 0
        for ledger, page_id, closed_at in rows:
            old = older_than > 0 and closed_at < now_ms - older_than * 1000
            if not old and not (disk_budget and used > disk_budget):
                break  # under budget, and by closed_at the rest are younger still
            if self.is_open(ledger, page_id):
                continue
            try:
                size = await self.evict(ledger, page_id)
            except NotEvictableError as e:
                log.debug("%s", e)
                continue
            used -= size
            evicted += 1
        return evicted
