"""A repository: one device's data directory, its ledgers and their pages.

This module is the entry point of the embedded API, and the map of the
repository's parts::

    repo = await Repository.open(Path("~/.local/share/ledgerd").expanduser())
    page = await repo.ledger("notes").page("inbox")
    await page.put(b"k", b"v")
    await repo.close()

:class:`Repository` opens and closes the data directory, finishes at start what a
crash cut short, and removes pages nothing was written to; its other jobs are its
bases': the state and paths (:mod:`store.repo.state`), the pool of open pages
(:mod:`store.repo.pool`), eviction (:mod:`store.repo.evicting`), listings and deletes
(:mod:`store.repo.listing`), named values (:mod:`store.repo.metas`). Names and files:
:mod:`store.repo.layout` and :mod:`store.repo.marks`.

One process at a time: :meth:`Repository.open` takes an exclusive ``flock`` on
``{data_dir}/ledgerd.lock`` for as long as the repository is open, so an embedded
open of a running daemon's directory (or a second daemon) fails with
:class:`RepositoryLockedError` instead of writing where the daemon cannot see it.
Directories are created ``0700`` and databases ``0600``, whatever the umask.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from ledgerd.store.errors import (
    InvalidArgumentError,
    PageUnavailableError,
    SchemaError,
    StoreError,
    named,
)
from ledgerd.store.page import gc
from ledgerd.store.page.gc import HISTORY_RETENTION, GcResult
from ledgerd.store.page.hooks import NO_HOOKS, PageHooks
from ledgerd.store.page.transaction import TXN_MEMORY
from ledgerd.store.page.watch import MAX_WATCH_QUEUE, MAX_WATCH_QUEUE_BYTES
from ledgerd.store.pieces.cache import CACHE_BYTES
from ledgerd.store.repo import eviction
from ledgerd.store.repo.layout import DISCARDED as DISCARDED
from ledgerd.store.repo.layout import NAME_LIMIT as NAME_LIMIT
from ledgerd.store.repo.layout import decode_name as decode_name
from ledgerd.store.repo.layout import encode_name as encode_name
from ledgerd.store.repo.layout import lock_directory, remove_aside, remove_page_dir
from ledgerd.store.repo.listing import Ledger as Ledger
from ledgerd.store.repo.listing import Listing
from ledgerd.store.repo.marks import UNWRITTEN as UNWRITTEN
from ledgerd.store.repo.marks import drop_mark, never_made, remove_unmade, unwritten_marks
from ledgerd.store.repo.metas import Metas
from ledgerd.store.repo.state import MAX_OPEN_PAGES as MAX_OPEN_PAGES
from ledgerd.store.sqlite.db import Database, Synchronous
from ledgerd.store.sqlite.schema import FORMAT_VERSION, create_usage_schema

log = logging.getLogger(__name__)

_remove_page_dir = remove_page_dir
"""Removes a page's directory (:func:`store.repo.layout.remove_page_dir`); looked up
in this module at each call, so a test can hold a removal at this step."""


async def _open_directory(root: Path) -> tuple[int, Database]:
    """Lock ``root`` (made if need be), refuse a development version's pages, make
    the layout's directories and open the usage database: the lock's fd and it."""
    lock_fd = await asyncio.to_thread(lock_directory, root)
    try:
        for old in map(str, range(1, FORMAT_VERSION)):
            if (root / old / "ledgers").exists():
                raise SchemaError(
                    f"{root} holds pages of an unreleased development version of ledgerd "
                    f"(in {root / old}), which this version does not read: move that "
                    "directory away"
                )
        for d in (root / str(FORMAT_VERSION), root / str(FORMAT_VERSION) / "ledgers"):
            d.mkdir(mode=0o700, exist_ok=True)
        # FULL: the device id and sync's sequence numbers must survive a power loss.
        usage = await Database.open(
            root / "page_usage.sqlite", create_usage_schema, synchronous="FULL"
        )
    except BaseException:
        os.close(lock_fd)
        raise
    return lock_fd, usage


class Repository(Listing, Metas):
    """One device's data directory."""

    @classmethod
    async def open(
        cls,
        root: Path,
        *,
        synchronous: Synchronous = "NORMAL",
        hooks: PageHooks = NO_HOOKS,
        txn_memory: int = TXN_MEMORY,
        max_watch_queue: int = MAX_WATCH_QUEUE,
        max_watch_queue_bytes: int = MAX_WATCH_QUEUE_BYTES,
        max_open_pages: int = MAX_OPEN_PAGES,
        cache_bytes: int = CACHE_BYTES,
        history_retention: float = HISTORY_RETENTION,
        clock: Callable[[], float] = time.time,
    ) -> Repository:
        """Open (creating it on first use) the data directory ``root``.

        Raises :class:`RepositoryLockedError` while another process (a running
        ledgerd) has it open. ``hooks`` are the collaborators every page gets (see
        :mod:`store.page.hooks`); ``txn_memory`` is what one transaction may hold in
        memory before staging its values, ``max_watch_queue`` how far a watcher may
        fall behind (``max_watch_queue_bytes``: in the bytes its notifications hold),
        and ``max_open_pages`` how many pages may be open at once: opening one more
        closes the least recently used idle page, and fails with
        :class:`TooManyOpenPagesError` when every open page is busy. ``cache_bytes``
        bounds the one read cache all pages share (decoded tree nodes and verified
        pieces, see :mod:`store.pieces.cache`). ``history_retention`` is how many seconds of
        history a page keeps (:mod:`store.page.gc`). ``clock`` is the wall clock every page's
        writes are timed by (seconds; tests skew it).

        A data directory written by an unreleased development version of ledgerd (its
        pages under ``1/``) is refused (:class:`SchemaError`): its format is not read."""
        if cache_bytes < 0:
            raise InvalidArgumentError("cache_bytes must not be negative")
        root = Path(root)
        lock_fd, usage = await _open_directory(root)
        repo = cls(
            root,
            usage,
            synchronous,
            hooks,
            lock_fd=lock_fd,
            txn_memory=txn_memory,
            max_watch_queue=max_watch_queue,
            max_watch_queue_bytes=max_watch_queue_bytes,
            max_open_pages=max_open_pages,
            cache_bytes=cache_bytes,
            history_retention=history_retention,
            clock=clock,
        )
        try:
            await repo._recover()
        except BaseException:
            await repo.close()
            raise
        return repo

    async def _recover(self) -> None:
        """Load the device id and the evicted pages, and finish what a crash cut short:
        removals and evictions of pages, makings of page directories, unwritten pages."""
        await self._load_device_id()
        walked = await asyncio.to_thread(eviction.walk, self.ledgers_dir)
        aside = await asyncio.to_thread(eviction.cut_short, walked, (DISCARDED, eviction.SUFFIX))
        await self._finish_discards([(d, n) for d, n, s in aside if s == DISCARDED])
        await self._load_evicted([(d, n) for d, n, s in aside if s == eviction.SUFFIX])
        for page_dir in await asyncio.to_thread(remove_unmade, walked):
            log.info("removed the making of page directory %s cut short", page_dir)
        await self._remove_unwritten()

    async def _finish_discards(self, cut_short: list[tuple[Path, str]]) -> None:
        """Finish removals of unwritten pages cut short (see :meth:`discard_unwritten`)."""
        for ledger_dir, name in cut_short:
            aside = ledger_dir / (name + DISCARDED)
            ledger, page_id = decode_name(ledger_dir.name), decode_name(name)
            log.info("finishing the removal of page directory %s", aside)
            if ledger is not None and page_id is not None:
                await self._forget((ledger, page_id))
            await asyncio.to_thread(remove_aside, aside)

    async def _remove_unwritten(self) -> None:
        """Remove the pages whose making write a crash cut short (see :data:`UNWRITTEN`):
        each would be listed, empty, though nothing was acknowledged. A marked page that
        holds more (the write's journal landed, or another write did) only loses its
        mark."""
        for mark, ledger, page_id in await asyncio.to_thread(unwritten_marks, self.unwritten_dir):
            key = (ledger, page_id)
            path = self.page_path(*key)
            if key not in self._evicted and await asyncio.to_thread(never_made, path):
                # Killed before its database was made; an evicted page stays evicted.
                await self._forget(key)
                await asyncio.to_thread(_remove_page_dir, self.page_path(*key).parent)
            elif key not in self._evicted:
                try:
                    async with self.page(*key):  # opening commits a journal the crash left
                        pass
                except StoreError as e:  # damaged, say: it fails on its use, as any page
                    # would; the other pages stay reachable, and the mark stays for the
                    # next start to look again
                    log.warning("could not check unwritten page %s: %s", named(page_id), e)
                    continue
                await self.discard_unwritten(*key)
            await asyncio.to_thread(drop_mark, mark)

    async def collect_garbage(
        self, ledger: bytes, page_id: bytes, *, stop: Callable[[], bool] | None = None
    ) -> GcResult:
        """Prune the page's history past its retention and collect what nothing kept
        reaches (:func:`store.page.gc.collect`, which ends early once ``stop()`` is true); a
        page this opens is closed again after."""
        async with self.page(ledger, page_id, transient=True) as page:
            if stop is None:
                return await gc.collect(page, self.history_retention)
            return await gc.collect(page, self.history_retention, stop=stop)

    async def discard_unwritten(self, ledger: bytes, page_id: bytes) -> bool:
        """Remove a page that holds nothing but its first commit and was given no merge
        policy, with nothing queued and nobody using it: what a first write that failed
        (a streamed value whose body broke off), or a transaction or watcher that wrote
        nothing, made, so that it is not listed. Its ledger's directory goes too if that
        leaves it empty. Returns whether the page was removed."""
        self._check_open()
        key = (ledger, page_id)
        async with self._no_open_of(key):
            page = self._pages.get(key)
            if page is None or page.closed or not page.idle or page.writer.uncommitted:
                return False
            if not page.never_written:
                return False
            await page.close()  # checked and closed with no await in between
            page_dir = self.page_path(ledger, page_id).parent
            await asyncio.to_thread(_remove_page_dir, page_dir)
            await self._forget(key)
            self._closed_deleted.pop(key, None)
            await self.written(ledger, page_id)
            log.info("page %s removed: nothing was ever written to it", named(page_id))
            return True

    async def close(self) -> None:
        """Close every page, then the repository. A merge waiting for a conflict
        resolver (at most RESOLVER_TIMEOUT) is abandoned, its heads kept, rather than
        waited for; nothing of the repository's runs once this returns. A page whose
        close fails (logged by the page) does not keep the others, nor the repository,
        open: what its database left open is tried once more, and logged if it fails."""
        self._closed = True  # no page opens from now on
        self._wake_room()  # an open waiting for room gives up (ClosedError)
        for page in list(self._pages.values()):
            page.conflicts.abandon()  # an open merging its heads ends at once (below)
        for opening in list(self._opening.values()):
            await opening.lock.acquire()  # an open under way finishes: its page closes below
            opening.lock.release()
        for page in list(self._pages.values()):
            # A failure is logged by the page; the others close all the same, and what
            # its database left open is tried again below (self._unclosed).
            with contextlib.suppress(Exception):
                await page.close()
        if self._settling:  # cut short by the closes (their openers may be gone)
            await asyncio.wait(list(self._settling))
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
        for key in list(self._unclosed):
            try:
                await self._close_unclosed(key)
            except PageUnavailableError as e:
                log.error("%s", e)
        try:
            await self.usage.close()
        finally:
            if self._lock_fd >= 0:
                os.close(self._lock_fd)  # releases the flock
                self._lock_fd = -1

    async def __aenter__(self) -> Repository:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
