"""A repository's state, and where its files are.

This module owns what every part of :class:`store.repo.repository.Repository` shares:
its settings, the open pages' and evicted pages' tables, the paths of its pages and
marks, whether a page is lost or evicted, and the unwritten marks it made. Opening
pages (:mod:`store.repo.pool`), eviction (:mod:`store.repo.evicting`) and listings
(:mod:`store.repo.listing`) build on it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ledgerd.store.errors import ClosedError, CorruptDatabaseError, named
from ledgerd.store.page import gc
from ledgerd.store.page.gc import HISTORY_RETENTION
from ledgerd.store.page.hooks import NO_HOOKS, PageHooks
from ledgerd.store.page.page import Page
from ledgerd.store.page.transaction import TXN_MEMORY
from ledgerd.store.page.watch import MAX_WATCH_QUEUE, MAX_WATCH_QUEUE_BYTES
from ledgerd.store.pieces.cache import CACHE_BYTES, Cache
from ledgerd.store.repo.layout import encode_name, is_lost, lost_leftovers
from ledgerd.store.repo.marks import UNWRITTEN, drop_mark, make_mark, mark_path
from ledgerd.store.sqlite import usage as usage_sql
from ledgerd.store.sqlite.db import Database, Synchronous
from ledgerd.store.sqlite.schema import FORMAT_VERSION

log = logging.getLogger("ledgerd.store.repo.repository")
"""The one logger of every part of the repository (its façade's name, as before the split)."""

MAX_OPEN_PAGES = 1024
"""Pages open at once, by default (each holds three SQLite connections: a few
files and two threads)."""


@dataclass(slots=True)
class Opening:
    """The lock that opens one page once, and how many callers hold or wait for it."""

    lock: asyncio.Lock
    users: int = 0


class RepositoryState:
    """What a repository holds, and where its files are: the base of its parts."""

    def __init__(
        self,
        root: Path,
        usage: Database,
        synchronous: Synchronous,
        hooks: PageHooks = NO_HOOKS,
        *,
        lock_fd: int = -1,
        txn_memory: int = TXN_MEMORY,
        max_watch_queue: int = MAX_WATCH_QUEUE,
        max_watch_queue_bytes: int = MAX_WATCH_QUEUE_BYTES,
        max_open_pages: int = MAX_OPEN_PAGES,
        cache_bytes: int = CACHE_BYTES,
        history_retention: float = HISTORY_RETENTION,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.root = root
        self.history_retention = gc.check_retention(history_retention)
        self.clock = clock
        """The wall clock pages time their writes by (seconds)."""
        """Seconds of history pages keep (unless a page has its own): see :mod:`store.page.gc`."""
        self.cache = Cache(cache_bytes)
        """The read cache every page of the repository shares (decoded tree nodes and
        verified pieces): one budget of ``cache_bytes``, see :mod:`store.pieces.cache`."""
        self._lock_fd = lock_fd
        """The open ``ledgerd.lock`` whose flock this repository holds (-1: none)."""
        self.max_open_pages = max_open_pages
        self.usage = usage
        self.synchronous = synchronous
        self.hooks = hooks
        """What every page of this repository reaches outside the store."""
        self.txn_memory = txn_memory
        self.max_watch_queue = max_watch_queue
        self.max_watch_queue_bytes = max_watch_queue_bytes
        self.device_id = b""
        self._pages: dict[tuple[bytes, bytes], Page] = {}
        self._handed_out: dict[tuple[bytes, bytes], int] = {}
        self._opening: dict[tuple[bytes, bytes], Opening] = {}
        self._reserved = 0
        """Pages being opened: they count against ``max_open_pages`` before they are
        published in ``_pages`` (else openers of distinct pages all pass the bound at once)."""
        self._closed = False
        self._closing: set[asyncio.Task[None]] = set()
        self._closed_deleted: dict[tuple[bytes, bytes], bool] = {}
        """Whether pages closed a moment ago are deleted, until page_usage says it."""
        self._evicted: dict[tuple[bytes, bytes], int] = {}
        """Evicted pages (store.repo.eviction): their page_usage.evicted."""
        self._evicted_written: dict[tuple[bytes, bytes], int] = {}
        """Evicted pages: the time of this device's last write to each (page_usage.written)."""
        self._marked: set[tuple[bytes, bytes]] = set()
        """Pages marked unwritten since the repository opened (:meth:`mark_unwritten`)."""
        self._unclosed: dict[tuple[bytes, bytes], Page] = {}
        """Closed pages whose database close left connections open: the page is not
        opened again until they are closed (:meth:`_close_unclosed`)."""
        self._settling: set[asyncio.Future[bool]] = set()
        """Merges of the heads pages were opened with (:meth:`_settle_opened`)."""
        self._room_waiters: set[asyncio.Future[None]] = set()
        """Opens waiting for room (:meth:`_make_room`'s ``wait``): woken when a page's
        last lease ends, a page closes, or the repository closes."""

    async def _forget(self, key: tuple[bytes, bytes]) -> None:
        """Drop the page's row of page_usage (its files are gone, or going)."""
        await usage_sql.forget(self.usage, key)

    def _unwritten_mark(self, ledger: bytes, page_id: bytes) -> Path:
        return mark_path(self.unwritten_dir, ledger, page_id)

    async def mark_unwritten(self, ledger: bytes, page_id: bytes) -> None:
        """Note that a write is about to make this page (call it before the page is
        made): if the process dies before :meth:`written`, the next open of the
        repository removes the page unless it holds more than its first commit. Not
        synced to disk: a power cut, unlike a killed process, may still leave such a
        page listed, empty, as may a mark that could not be made (logged)."""
        try:
            await asyncio.to_thread(make_mark, self._unwritten_mark(ledger, page_id))
        except OSError as e:  # the write goes on: the mark only tidies up after a crash
            log.warning("could not mark page %s unwritten: %s", named(page_id), e)
        else:
            self._marked.add((ledger, page_id))

    async def written(self, ledger: bytes, page_id: bytes) -> None:
        """The write that made the page was acknowledged (or the page is gone): drop
        the note :meth:`mark_unwritten` made (nothing to do, and no file touched, for a
        page it did not mark: the marks of earlier runs are gone once the repository
        is open)."""
        if (ledger, page_id) not in self._marked:
            return
        self._marked.discard((ledger, page_id))
        try:
            await asyncio.to_thread(drop_mark, self._unwritten_mark(ledger, page_id))
        except OSError as e:  # the write stands; the next start drops the mark
            log.warning("could not drop the unwritten mark of page %s: %s", named(page_id), e)

    @property
    def ledgers_dir(self) -> Path:
        return self.root / str(FORMAT_VERSION) / "ledgers"

    @property
    def unwritten_dir(self) -> Path:
        """Where the unwritten marks are (see :data:`UNWRITTEN`)."""
        return self.root / str(FORMAT_VERSION) / UNWRITTEN

    def page_path(self, ledger: bytes, page_id: bytes) -> Path:
        return self.ledgers_dir / encode_name(ledger) / encode_name(page_id) / "page.sqlite"

    def page_exists(self, ledger: bytes, page_id: bytes) -> bool:
        key = (ledger, page_id)
        return key in self._pages or key in self._evicted or self.page_path(*key).exists()

    def page_lost(self, ledger: bytes, page_id: bytes) -> bool:
        """The page's ``page.sqlite`` is gone but its -wal or -journal remains: every
        use of it fails as damaged (:meth:`lost_error`), listings leave it out, a
        check lists it (:meth:`Ledger.lost_pages`), a start keeps it, and
        :meth:`delete_page` removes what remains of it. (An evicted page's directory is
        a restore cut short, discarded by its next use: not lost.)"""
        if (ledger, page_id) in self._evicted or (ledger, page_id) in self._pages:
            return False
        return is_lost(self.page_path(ledger, page_id).parent)

    def lost_error(self, ledger: bytes, page_id: bytes) -> CorruptDatabaseError | None:
        """The error every use of a lost page (:meth:`page_lost`) raises; None if it is
        not lost (blocking, briefly: it looks at the page's directory)."""
        if not self.page_lost(ledger, page_id):
            return None
        path = self.page_path(ledger, page_id)
        left = lost_leftovers(path.parent) or [path.name + "-wal"]
        return CorruptDatabaseError(
            f"page {named(page_id)} of ledger {named(ledger)} is damaged: its {path.name} "
            f"is missing but its {left[0]} remains ({path.parent}); that file is kept as "
            f"it is (it may hold committed data): restore {path.name} there, or delete "
            "the page to remove what remains of it"
        )

    def is_evicted(self, ledger: bytes, page_id: bytes) -> bool:
        """Whether the page's storage was evicted (its next use restores it)."""
        return (ledger, page_id) in self._evicted

    def evicted_pages(self, ledger: bytes) -> list[bytes]:
        return sorted(p for (led, p) in self._evicted if led == ledger)

    def ledger_exists(self, ledger: bytes) -> bool:
        """The ledger has a directory here, or an evicted page (which has none)."""
        return (self.ledgers_dir / encode_name(ledger)).is_dir() or any(
            k[0] == ledger for k in self._evicted
        )

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"the repository {self.root} is closed")
