"""The open pages of a repository: opening each once, at most ``max_open_pages``
at once, handing them out and leasing them, and recording their closes.

This module owns the page pool: the lock that opens a page once, making room by
closing idle pages, waiting for room, the pages whose failed close left
connections open, restoring an evicted page as it opens, and merging the heads a
page opens with. What a page does once open is :mod:`store.page.page`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from ledgerd.store.errors import PageUnavailableError, TooManyOpenPagesError, named
from ledgerd.store.page.page import Page
from ledgerd.store.repo import eviction
from ledgerd.store.repo.state import Opening, RepositoryState, log
from ledgerd.store.sqlite import threads
from ledgerd.store.sqlite import usage as usage_sql
from ledgerd.store.tree import dots

ROOM_RECHECK = 0.25
"""Seconds between looks of an open that waits for room (``wait``): a lease's end
wakes it at once; a watcher, transaction or merge that ends frees a page too, and is
seen at the next look."""


def _log_failed_settle(done: asyncio.Future[bool]) -> None:
    # Its opener, if it went away, sees no error: logged here (and retrieved).
    if not done.cancelled() and (e := done.exception()) is not None:
        log.warning("settling the conflicts a page was opened with failed: %s", e)


class PagePool(RepositoryState):
    """Opening pages, at most ``max_open_pages`` at once, and leasing them."""

    async def open_page(self, ledger: bytes, page_id: bytes) -> Page:
        return (await self.acquire(ledger, page_id))[0]

    async def acquire(
        self, ledger: bytes, page_id: bytes, *, wait: float = 0.0
    ) -> tuple[Page, bool]:
        """Like :meth:`open_page`, and whether this call is the one that opened it.
        With every open page busy, it waits up to ``wait`` seconds for one to be
        released before it raises :class:`TooManyOpenPagesError`."""
        page, opened, _ = await self._acquire(ledger, page_id, mark=False, wait=wait)
        return page, opened

    async def acquire_new(self, ledger: bytes, page_id: bytes) -> tuple[Page, bool]:
        """Like :meth:`open_page`, for a write that makes the page if it does not exist:
        the page, and whether this call made it, marked unwritten
        (:meth:`mark_unwritten`) before its file was. Looked at and marked under the
        lock that opens the page, which :meth:`discard_unwritten` holds while it removes
        one: a page removed meanwhile is made again, and marked, and the removal drops
        no mark made after it."""
        page, _, made = await self._acquire(ledger, page_id, mark=True)
        return page, made

    async def _acquire(
        self, ledger: bytes, page_id: bytes, *, mark: bool, wait: float = 0.0
    ) -> tuple[Page, bool, bool]:
        self._check_open()
        key = (ledger, page_id)
        page = self._pages.get(key)
        if page is not None and not page.closed:
            self._hand_out(key)
            return page, False, False
        async with self._no_open_of(key):
            page = self._pages.get(key)
            if page is not None and page.closed:
                # Still closing (its when_closing hooks, say, storing a document
                # index's held rows): a second Page on the file waits until it is done.
                await page.close()
                page = self._pages.get(key)
            opened = page is None or page.closed
            made = False
            if page is None or page.closed:
                self._check_open()  # closed while this waited: make no file
                await self._close_unclosed(key)
                if lost := self.lost_error(ledger, page_id):
                    # Refused before a write marks it unwritten: a start would take it
                    # for a page never made and remove it, its -wal too.
                    raise lost
                if mark and key not in self._evicted and not self.page_path(*key).exists():
                    await self.mark_unwritten(ledger, page_id)
                    made = True
                await self._make_room(wait)
                self._reserved += 1  # no await since _make_room found room
                try:
                    page = await self._open_new(ledger, page_id)
                finally:
                    self._reserved -= 1
                # Leased while it merges: neither close_idle nor _make_room closes it
                # between the merge's end and this open's return.
                with page.lease():
                    await self._settle_opened(page)
            # No await since the page was published, or since its merge's lease
            # ended: close_idle cannot close it before the caller takes a lease.
            self._hand_out(key)
            return page, opened, made

    async def _make_room(self, wait: float = 0.0) -> None:
        """Close least recently used idle pages until one more may open (pages being
        opened count as open, and so do pages closing: they hold their files until
        their close ends). While pages are closing, wait for the first close to end
        rather than for the one this began, or refuse: a page closing is in nobody's
        use, and its close ends (its writes, hooks and database). With no idle page, a
        quiet one (:attr:`Page.quiet`: only its journal's commit waiting) closes, and
        with none of those an unheld one (:attr:`Page.unheld`: that commit under way).
        With none of those, wait up to ``wait`` seconds for a page to be released (a
        background job's open, like sync's, rather than fail), then refuse."""
        deadline = time.monotonic() + wait
        while self._counted() >= self.max_open_pages:
            # (idle pages are quiet, and quiet ones unheld: the first kind there is)
            unheld = [p for p in self._pages.values() if not p.closed and p.unheld]
            idle = [p for p in unheld if p.idle] or [p for p in unheld if p.quiet] or unheld
            if idle:
                # Checked and closed with no await in between (see close_idle).
                min(idle, key=lambda p: p.last_used).start_close()
            closing = [p.start_close() for p in self._pages.values() if p.closed]
            if closing:
                await asyncio.wait(closing, return_when=asyncio.FIRST_COMPLETED)
            elif await self._retry_unclosed():
                continue  # one kept aside is closed at last: its slot is free
            elif (left := deadline - time.monotonic()) > 0:
                await self._room_freed(min(left, ROOM_RECHECK))
            else:
                raise TooManyOpenPagesError(self._full_message(wait))
            self._check_open()  # closed while this waited: open nothing

    async def _room_freed(self, timeout: float) -> None:
        """Wait until a page may have been released, at most ``timeout`` seconds."""
        freed = asyncio.get_running_loop().create_future()
        self._room_waiters.add(freed)
        try:
            await asyncio.wait([freed], timeout=timeout)
        finally:
            self._room_waiters.discard(freed)

    def _wake_room(self, page: Page | None = None) -> None:
        """Wake the opens waiting for room (``page``: the one released)."""
        for freed in self._room_waiters:
            if not freed.done():
                freed.set_result(None)

    def _counted(self) -> int:
        """What counts against ``max_open_pages``: the pages open or closing, those
        being opened, and those kept aside because their close failed (their
        connections, files and threads are still open)."""
        return len(self._pages) + self._reserved + len(self._unclosed)

    def _full_message(self, waited: float = 0.0) -> str:
        aside = len(self._unclosed)
        in_use = self._counted() - aside
        text = f"all {self._counted()} open pages are in use (max_open_pages {self.max_open_pages})"
        if aside:
            names = ", ".join(named(k[1]) for k in list(self._unclosed)[:3])
            text = (
                f"no more pages may be open (max_open_pages {self.max_open_pages}): "
                f"{in_use} are in use and {aside} kept aside because closing them "
                f"failed and left database connections open (page {names}"
                f"{', ...' if aside > 3 else ''}; their close is tried again at each "
                "open past the bound)"
            )
        if waited > 0:
            return f"{text}; none was released within {waited:g}s"
        return f"{text}; try again when one is released"

    async def _retry_unclosed(self) -> bool:
        """Try again to close what the failed closes of pages kept aside left open:
        whether one of them is closed now (its slot freed)."""
        for key in list(self._unclosed):
            try:
                await self._close_unclosed(key)
            except PageUnavailableError as e:
                log.debug("%s", e)
                continue
            return True
        return False

    def _hand_out(self, key: tuple[bytes, bytes]) -> None:
        self._handed_out[key] = self._handed_out.get(key, 0) + 1

    def handed_out(self, page: Page) -> int:
        """How many times the open page was handed out since it was opened."""
        return self._handed_out.get((page.ledger, page.id), 0)

    @contextlib.asynccontextmanager
    async def page(
        self, ledger: bytes, page_id: bytes, *, transient: bool = False, wait: float = 0.0
    ) -> AsyncIterator[Page]:
        """The page, opened if need be and held (leased) for the block: the one way
        the daemon's API, its sessions and sync use pages.

        With ``transient`` (a background look, like a sync round's), a page this
        call opened is closed again at the end unless someone else took it
        meanwhile or something is under way in it. ``wait``: seconds to wait for
        room when every open page is busy (:meth:`acquire`)."""
        page, opened = await self.acquire(ledger, page_id, wait=wait)
        mine = self.handed_out(page)
        try:
            with page.lease(use=not (transient and opened)):
                yield page
        finally:
            if (
                transient
                and opened
                and self.handed_out(page) == mine
                and page.idle
                and not page.closed
            ):
                await page.close()

    async def _open_new(self, ledger: bytes, page_id: bytes) -> Page:
        """Open a page (restoring it if evicted), record its use, and publish it: only
        once fully open."""
        evicted = self._evicted.get((ledger, page_id), 0)
        if evicted == eviction.SYNCED_EVICTED and self.hooks.restorer is None:
            raise PageUnavailableError(
                f"page {named(page_id)} was evicted from this device and there is no cloud "
                "to restore it from"
            )
        # An empty page evicted is brought back from the bucket too when there is one:
        # other devices may have written it meanwhile, and downloads pass over
        # evicted pages. (Nothing there: it starts empty again.)
        restore = evicted == eviction.SYNCED_EVICTED or (
            evicted == eviction.EMPTY_EVICTED and self.hooks.restorer is not None
        )
        path = self.page_path(ledger, page_id)
        if restore and path.parent.exists():
            # A restore cut short (cancelled, or killed) left part of the page: the
            # restore starts again from nothing, as a checkpoint goes only there.
            log.info("discarding the restore of page %s cut short", named(page_id))
            await asyncio.to_thread(eviction.delete_page_dir, path.parent)
        page = await self._open_page(ledger, page_id)
        try:
            if restore:
                # Cancelled meanwhile (a client that went away), the page is closed:
                # it is still evicted, and its next use restores it again.
                await self._restore(
                    page,
                    self._evicted_written.get((ledger, page_id), -1),
                    empty_ok=evicted == eviction.EMPTY_EVICTED,
                )
            await usage_sql.record_open(self.usage, (ledger, page_id))
        except BaseException:
            await asyncio.shield(page.close())
            raise
        self._evicted.pop((ledger, page_id), None)
        self._evicted_written.pop((ledger, page_id), None)
        page.last_used = time.monotonic()
        page.on_release = self._wake_room
        self._pages[(ledger, page_id)] = page
        self._handed_out[(ledger, page_id)] = 0
        return page

    async def _close_unclosed(self, key: tuple[bytes, bytes]) -> None:
        """Close what the failed close of page ``key`` left open, or refuse to open the
        page again (a second set of connections on its file, with their own locks and
        caches, beside the first)."""
        old = self._unclosed.get(key)
        if old is None:
            return
        try:
            await old.db.close()
        except Exception as e:
            raise PageUnavailableError(
                f"page {named(key[1])} cannot be opened now: its database's "
                f"{', '.join(old.db.unclosed)} connection, from before, could not be "
                f"closed ({type(e).__name__}: {e}); tried again at its next use"
            ) from e
        finally:
            # (Another caller may have closed them meanwhile: the close waits on the
            # database's lock, and logs once.)
            if not old.db.unclosed and self._unclosed.pop(key, None) is not None:
                log.info("page %s: its connections left open are closed", named(key[1]))

    async def _settle_opened(self, page: Page) -> None:
        """Merge the heads a page was opened with, now that it is published (and its
        open's reservation released: it counts once): a conflict resolver that opens it
        (a session's, or a custom one reading the page) gets it at once. Merged under
        the open lock, it waited for this open, which waited for the resolver, until
        RESOLVER_TIMEOUT abandoned the merge.

        Others may hold the page meanwhile (the resolver, an open that found it
        published): an opener that goes away leaves the merge going on and the page
        open, to close as idle once merged. A merge that fails (the page's storage)
        fails this open; the page stays open for its other holders, its heads kept, as
        after any failed merge."""
        if not page.graph.conflicts or self._closed:  # closing: close() ends rounds
            return
        settling = asyncio.ensure_future(page.conflicts.settle())
        settling.add_done_callback(_log_failed_settle)
        self._settling.add(settling)  # close() waits for it, once it cut it short
        settling.add_done_callback(self._settling.discard)
        await asyncio.shield(settling)

    async def _restore(self, page: Page, written: int, *, empty_ok: bool) -> None:
        """Bring an evicted page back from the bucket, with every write of this device
        up to ``written`` (see :mod:`store.repo.eviction`), or fail as unavailable (its
        storage is removed again: an empty page is never handed out, unless
        ``empty_ok``, a page evicted empty that the bucket has nothing of)."""
        restorer = self.hooks.restorer
        assert restorer is not None
        try:
            restored = await restorer.restore_page(page) or empty_ok
            why = "the bucket has nothing for it"
            back = page.graph.ctx.get(page.graph.tag, -1)
            if back < written:  # (a bucket whose listings lag its writes, say)
                restored = False
                why = (
                    "this device's own writes to it, up to "
                    f"{dots.format_time(written)}, did not all come back from the bucket yet"
                )
        except Exception as e:
            restored, why = False, f"{type(e).__name__}: {e}"
        if not restored:
            await asyncio.shield(page.close())
            await asyncio.to_thread(eviction.delete_page_dir, page.db.path.parent)
            raise PageUnavailableError(
                f"page {named(page.id)} of ledger {named(page.ledger)} was evicted from this device"
                f" and cannot be restored now: {why}"
            )
        log.info(
            "page %s of ledger %s restored after its eviction", named(page.id), named(page.ledger)
        )

    async def _open_page(self, ledger: bytes, page_id: bytes) -> Page:
        hooks = self.hooks
        return await Page.open(
            self.page_path(ledger, page_id),
            ledger,
            page_id,
            synchronous=self.synchronous,
            fetch=None if hooks.fetcher is None else hooks.fetcher.fetch_pieces,
            on_commit=None if hooks.listener is None else hooks.listener.page_committed,
            resolvers=hooks.resolvers,
            txn_memory=self.txn_memory,
            max_watch_queue=self.max_watch_queue,
            max_watch_queue_bytes=self.max_watch_queue_bytes,
            on_close=self._closed_page,
            device_id=self.device_id,
            cache=self.cache,
            settle=False,  # once published: see _open_new
            clock=self.clock,
        )

    def _closed_page(self, page: Page) -> None:
        key = (page.ledger, page.id)
        if self._pages.get(key) is page:
            del self._pages[key]
            self._handed_out.pop(key, None)
        if page.db.unclosed:  # (Page logs it, once)
            self._unclosed[key] = page
        self._wake_room()
        if not self.usage.closed:
            self._closed_deleted[key] = page.deleted  # until _record_close wrote it
            task = asyncio.get_running_loop().create_task(self._record_close(page))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def _record_close(self, page: Page) -> None:
        key = (page.ledger, page.id)
        if key in self._marked and not page.never_written:
            # Written by someone other than its maker (whose write drops the mark), a
            # marked page keeps its mark until it closes: marks do not pile up.
            await self.written(*key)
        try:
            async with self.usage.write() as conn:
                if self.is_open(page.ledger, page.id):
                    return  # reopened meanwhile: it is open again (closed_at stays 0)
                await usage_sql.record_close(conn, key, int(time.time() * 1000), page.deleted)
        except Exception as e:
            log.warning(
                "could not record that page %s of ledger %s was closed: %s",
                named(page.id),
                named(page.ledger),
                e,
            )
        finally:
            if self._closed_deleted.get((page.ledger, page.id)) == page.deleted:
                del self._closed_deleted[(page.ledger, page.id)]

    @contextlib.asynccontextmanager
    async def _no_open_of(self, key: tuple[bytes, bytes]) -> AsyncIterator[None]:
        """Hold the lock that opens page ``key``: no other open of it meanwhile. One
        lock per page being opened, dropped once nobody waits on it (a long-running
        daemon opens many pages over its life)."""
        opening = self._opening.get(key)
        if opening is None:
            opening = self._opening[key] = Opening(asyncio.Lock())
        opening.users += 1
        try:
            async with opening.lock:
                yield
        finally:
            opening.users -= 1
            if opening.users == 0:
                del self._opening[key]

    def open_pages(self) -> list[Page]:
        return list(self._pages.values())

    def is_open(self, ledger: bytes, page_id: bytes) -> bool:
        page = self._pages.get((ledger, page_id))
        return page is not None and not page.closed

    async def close_idle(self, idle_seconds: float) -> int:
        """Close the open pages that are idle (:attr:`Page.idle`) and whose last lease
        ended at least ``idle_seconds`` ago; they reopen on their next use.

        For long-running users that open many pages (the daemon), so that open
        files and threads stay bounded. Pages used without :meth:`Page.lease`
        must not be in a repository this runs on. Returns how many were closed.
        """
        now = time.monotonic()
        closed = 0
        for page in list(self._pages.values()):
            # Checked and closed with no await in between: Page.close marks the page
            # closed before it awaits anything, so no lease can start in a gap.
            if not page.closed and page.idle and now - page.last_used >= idle_seconds:
                await page.close()
                closed += 1
        if closed:
            await asyncio.to_thread(threads.give_back_memory)
        return closed
