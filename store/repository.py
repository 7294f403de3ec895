"""A repository: one device's data directory, its ledgers and their pages.

This module owns the directory layout, name validation, the repository-wide
``page_usage.sqlite`` (when each page was last closed), the device id, and the
set of open pages. It is the entry point of the embedded API::

    repo = await Repository.open(Path("~/.local/share/ledgerd").expanduser())
    page = await repo.ledger("notes").page("inbox")
    await page.put(b"k", b"v")
    await repo.close()

Layout: ``{data_dir}/{FORMAT_VERSION}/ledgers/{ledger_b64}/{page_b64}/page.sqlite``
with base64url names without padding.

One process at a time: :meth:`Repository.open` takes an exclusive ``flock`` on
``{data_dir}/ledgerd.lock`` for as long as the repository is open, so an embedded
open of a running daemon's directory (or a second daemon) fails with
:class:`RepositoryLockedError` instead of writing where the daemon cannot see it.
Directories are created ``0700`` and databases ``0600``, whatever the umask.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import fcntl
import logging
import os
import shutil
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

from ledgerd.store.errors import (
    ClosedError,
    CorruptDatabaseError,
    InvalidArgumentError,
    LedgerNotFoundError,
    NameTooLargeError,
    NotEvictableError,
    PageNotFoundError,
    PageUnavailableError,
    RepositoryLockedError,
    SchemaError,
    StoreError,
    TooManyOpenPagesError,
    named,
)
from ledgerd.store.page import gc
from ledgerd.store.page.gc import HISTORY_RETENTION, GcResult
from ledgerd.store.page.hooks import NO_HOOKS, PageHooks
from ledgerd.store.page.page import Page
from ledgerd.store.page.transaction import TXN_MEMORY
from ledgerd.store.page.watch import MAX_WATCH_QUEUE, MAX_WATCH_QUEUE_BYTES
from ledgerd.store.pieces.cache import CACHE_BYTES, Cache
from ledgerd.store.repo import eviction
from ledgerd.store.sqlite import threads
from ledgerd.store.sqlite.db import NEW_SUFFIX, Database, Synchronous
from ledgerd.store.sqlite.schema import FORMAT_VERSION, create_usage_schema
from ledgerd.store.tree import dots

log = logging.getLogger(__name__)

NAME_LIMIT = 128
MAX_OPEN_PAGES = 1024
"""Pages open at once, by default (each holds three SQLite connections: a few
files and two threads)."""
ROOM_RECHECK = 0.25
"""Seconds between looks of an open that waits for room (``wait``): a lease's end
wakes it at once; a watcher, transaction or merge that ends frees a page too, and is
seen at the next look."""
PAGE_ID_SIZE = 16
"""Bytes of a page id chosen at random when none is given."""


def _name(value: bytes | str, what: str) -> bytes:
    if isinstance(value, str):
        raw = value.encode()
    elif isinstance(value, bytes | bytearray | memoryview):  # not bytes(n): n NUL bytes
        raw = bytes(value)
    else:
        raise InvalidArgumentError(f"{what} is bytes or str, not {type(value).__name__}")
    if not raw:
        raise InvalidArgumentError(f"{what} must not be empty")
    if len(raw) > NAME_LIMIT:
        raise NameTooLargeError(f"{what} of {len(raw)} bytes is over the {NAME_LIMIT}-byte limit")
    return raw


def encode_name(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def decode_name(text: str) -> bytes | None:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        return None


def _lock(root: Path) -> int:
    """Create ``root`` (0700) if needed and take the exclusive lock of ``ledgerd.lock``."""
    if not root.is_dir():
        root.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):  # created meanwhile: checked below
            root.mkdir(mode=0o700)
    fd = os.open(root / "ledgerd.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RepositoryLockedError(
            f"the data directory {root} is in use by another process (a running ledgerd? "
            "then use its client, ledgerd.daemon.client, instead of opening the directory)"
        ) from None
    except BaseException:
        os.close(fd)
        raise
    return fd


DISCARDED = ".discarded"
"""Suffix of a page directory being removed (:meth:`Repository.discard_unwritten`);
one found when the repository opens is a removal cut short, finished then."""


UNWRITTEN = "unwritten"
"""A directory beside ``ledgers``: while a write that makes a page is under way (a
daemon's PUT, batch, document write or session transaction into a page that did not
exist), a file ``{ledger}/{page}`` (their encoded names) is in it
(:meth:`Repository.mark_unwritten`). A page still marked when the repository opens
and holding nothing but its first commit was made by a write that a crash cut short,
never acknowledged: it is removed, as a failed first write's page is at once."""


def _unwritten_marks(directory: Path) -> list[tuple[Path, bytes, bytes]]:
    """The marks under ``directory`` with the ledger and page each names (blocking);
    anything else there is dropped."""
    out: list[tuple[Path, bytes, bytes]] = []
    if not directory.is_dir():
        _unmark(directory)  # something else in its place (or nothing)
        return out
    for d in list(directory.iterdir()):
        ledger = decode_name(d.name)
        if not ledger or not d.is_dir():
            _unmark(d)
            continue
        for f in list(d.iterdir()):
            page = decode_name(f.name)
            if page and _mark_path(directory, ledger, page) == f:
                out.append((f, ledger, page))
            else:
                _unmark(f)
    return out


def _mark_path(directory: Path, ledger: bytes, page_id: bytes) -> Path:
    # A directory per ledger, as under ledgers/: a name joining both could be over
    # the file system's 255 bytes (names are up to 128 bytes, 171 in base64).
    return directory / encode_name(ledger) / encode_name(page_id)


def _mark(path: Path) -> None:
    for attempt in range(3):  # an _unmark on another thread may remove the directory
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
            return
        except FileNotFoundError:
            if attempt == 2:
                raise
            for d in (path.parent.parent, path.parent):  # private, as ledgers/ is
                d.mkdir(mode=0o700, exist_ok=True)


def _unmark(path: Path) -> None:
    """Remove a mark (or whatever is in its place), and its ledger's directory if
    that leaves it empty."""
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # not empty: other marks
        path.parent.rmdir()


def _log_failed_settle(done: asyncio.Future[bool]) -> None:
    # Its opener, if it went away, sees no error: logged here (and retrieved).
    if not done.cancelled() and (e := done.exception()) is not None:
        log.warning("settling the conflicts a page was opened with failed: %s", e)


def _never_made(path: Path) -> bool:
    """A marked page's database was never made (blocking): no file, or (as an older
    version left it, killed between creating the file and SQLite writing it) an empty
    one with no -wal. A page that was written has its -wal until it closes, and its
    close drops its mark, so an empty file beside a -wal is damage (refused as such).
    So is no file beside a -wal or -journal (:func:`_lost`): SQLite makes those only
    once the file is in place (a making writes ``page.sqlite.new`` and its own side
    files, :func:`_remove_unmade`), so the page was made, and they may hold commits."""
    try:
        if path.stat().st_size > 0:
            return False
    except FileNotFoundError:
        # No file: never made, unless its -wal or -journal remains (SQLite makes those
        # only for a database of this name): then the file was lost, and what remains
        # is all that is left of the page (see Repository.page_lost).
        return not _lost(path.parent)
    return not path.with_name(path.name + "-wal").exists()


def _remove_unmade(walked: eviction.Walk) -> list[Path]:
    """Remove what a making of a page's database cut short left (blocking): in a page
    directory with no ``page.sqlite``, its ``page.sqlite.new`` and that file's -journal,
    -wal and -shm (see store.db._create_private), then the directory if that leaves it
    empty, and its ledger's too. A page made without an unwritten mark (a policy set, a
    sync download) left its ledger listed with no page, and the file until the page was
    made again. Anything else (a -wal whose database is lost) stays, as does a page with
    its database. Returns the page directories cleaned."""
    cleaned: list[Path] = []

    def ours(d: Path) -> bool:  # a page's or ledger's directory, not one set aside
        raw = decode_name(d.name)
        return raw is not None and encode_name(raw) == d.name and d.is_dir()

    for ledger, entries in walked:
        if not ours(ledger):
            continue
        removed = False
        for page_dir in entries:
            path = page_dir / "page.sqlite"
            if path.exists() or not ours(page_dir):
                continue
            new = path.with_name(path.name + NEW_SUFFIX)
            for f in (new, *(new.with_name(new.name + s) for s in ("-journal", "-wal", "-shm"))):
                with contextlib.suppress(FileNotFoundError):
                    f.unlink()
                    cleaned.append(page_dir)
            with contextlib.suppress(OSError):  # not empty: left for the page's next open
                page_dir.rmdir()
                removed = True
        if removed:
            with contextlib.suppress(OSError):  # not empty: other pages
                ledger.rmdir()
    return sorted(set(cleaned))


LOST_LEFTOVERS = ("-wal", "-journal")
"""What a ``page.sqlite`` that is gone may leave: its page is damaged (see
:meth:`Repository.page_lost`)."""


def _lost(page_dir: Path) -> bool:
    """The page directory's database file is gone while its -wal or -journal remains
    (blocking)."""
    return bool(_lost_leftovers(page_dir))


def _lost_leftovers(page_dir: Path) -> list[str]:
    """The names of what remains of a ``page.sqlite`` that is gone (blocking): none if
    it is there, or if nothing remains (a page never made)."""
    path = page_dir / "page.sqlite"
    try:
        if path.exists():
            return []
        return [path.name + s for s in LOST_LEFTOVERS if path.with_name(path.name + s).exists()]
    except OSError:  # a name too long, say: the page's open says what is wrong
        return []


def _remove_page_dir(page_dir: Path) -> None:
    """Rename a page's directory to a name listings skip (atomic), then delete it; and
    its ledger's directory if that leaves it empty (blocking)."""
    aside = page_dir.with_name(page_dir.name + DISCARDED)
    shutil.rmtree(aside, ignore_errors=True)  # one left by a removal cut short
    with contextlib.suppress(FileNotFoundError):
        os.rename(page_dir, aside)
    _remove_aside(aside)


def _remove_aside(aside: Path) -> None:
    shutil.rmtree(aside, ignore_errors=True)
    with contextlib.suppress(OSError):  # not empty: other pages
        aside.parent.rmdir()


@dataclass(slots=True)
class _Opening:
    """The lock that opens one page once, and how many callers hold or wait for it."""

    lock: asyncio.Lock
    users: int = 0


EVICT_PASSES = 20
"""Most passes of :meth:`Repository.evict_by_policy` over the pages to meet a budget."""


class Repository:
    """One device's data directory."""

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
        self._opening: dict[tuple[bytes, bytes], _Opening] = {}
        self._reserved = 0
        """Pages being opened: they count against ``max_open_pages`` before they are
        published in ``_pages`` (else openers of distinct pages all pass the bound at once)."""
        self._closed = False
        self._closing: set[asyncio.Task[None]] = set()
        self._closed_deleted: dict[tuple[bytes, bytes], bool] = {}
        """Whether pages closed a moment ago are deleted, until page_usage says it."""
        self._evicted: dict[tuple[bytes, bytes], int] = {}
        """Evicted pages (store.eviction): their page_usage.evicted."""
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
        lock_fd = await asyncio.to_thread(_lock, root)
        try:
            if (root / "1" / "ledgers").exists():
                raise SchemaError(
                    f"{root} holds pages of an unreleased development version of ledgerd "
                    f"(in {root / '1'}), which this version does not read: move that "
                    "directory away (its data is in the bucket if it was synced)"
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
            await repo._load_device_id()
            walked = await asyncio.to_thread(eviction.walk, repo.ledgers_dir)
            aside = await asyncio.to_thread(
                eviction.cut_short, walked, (DISCARDED, eviction.SUFFIX)
            )
            await repo._finish_discards([(d, n) for d, n, s in aside if s == DISCARDED])
            await repo._load_evicted([(d, n) for d, n, s in aside if s == eviction.SUFFIX])
            for page_dir in await asyncio.to_thread(_remove_unmade, walked):
                log.info("removed the making of page directory %s cut short", page_dir)
            await repo._remove_unwritten()
        except BaseException:
            await repo.close()
            raise
        return repo

    async def _load_device_id(self) -> None:
        rows = await self.usage.read_all("SELECT value FROM repository WHERE name = 'device_id'")
        if rows:
            self.device_id = bytes(rows[0][0])
            return
        device = os.urandom(16)
        async with self.usage.write() as conn:
            await conn.execute(
                "INSERT OR IGNORE INTO repository (name, value) VALUES ('device_id', ?)", (device,)
            )
        rows = await self.usage.read_all("SELECT value FROM repository WHERE name = 'device_id'")
        self.device_id = bytes(rows[0][0])

    async def _finish_discards(self, cut_short: list[tuple[Path, str]]) -> None:
        """Finish removals of unwritten pages cut short (see :meth:`discard_unwritten`)."""
        for ledger_dir, name in cut_short:
            aside = ledger_dir / (name + DISCARDED)
            ledger, page_id = decode_name(ledger_dir.name), decode_name(name)
            log.info("finishing the removal of page directory %s", aside)
            if ledger is not None and page_id is not None:
                await self._forget((ledger, page_id))
            await asyncio.to_thread(_remove_aside, aside)

    async def _forget(self, key: tuple[bytes, bytes]) -> None:
        """Drop the page's row of page_usage (its files are gone, or going)."""
        async with self.usage.write() as conn:
            await conn.execute("DELETE FROM page_usage WHERE ledger = ? AND page = ?", key)

    async def _remove_unwritten(self) -> None:
        """Remove the pages whose making write a crash cut short (see :data:`UNWRITTEN`):
        each would be listed, empty, though nothing was acknowledged. A marked page that
        holds more (the write's journal landed, or another write did) only loses its
        mark."""
        for mark, ledger, page_id in await asyncio.to_thread(_unwritten_marks, self.unwritten_dir):
            key = (ledger, page_id)
            path = self.page_path(*key)
            if key not in self._evicted and await asyncio.to_thread(_never_made, path):
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
            await asyncio.to_thread(_unmark, mark)

    def _unwritten_mark(self, ledger: bytes, page_id: bytes) -> Path:
        return _mark_path(self.unwritten_dir, ledger, page_id)

    async def mark_unwritten(self, ledger: bytes, page_id: bytes) -> None:
        """Note that a write is about to make this page (call it before the page is
        made): if the process dies before :meth:`written`, the next open of the
        repository removes the page unless it holds more than its first commit. Not
        synced to disk: a power cut, unlike a killed process, may still leave such a
        page listed, empty, as may a mark that could not be made (logged)."""
        try:
            await asyncio.to_thread(_mark, self._unwritten_mark(ledger, page_id))
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
            await asyncio.to_thread(_unmark, self._unwritten_mark(ledger, page_id))
        except OSError as e:  # the write stands; the next start drops the mark
            log.warning("could not drop the unwritten mark of page %s: %s", named(page_id), e)

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
        rows = await self.usage.read_all(
            "SELECT ledger, page, evicted, written FROM page_usage WHERE evicted != 0"
        )
        self._evicted = {(bytes(a), bytes(b)): int(c) for a, b, c, _ in rows}
        self._evicted_written = {(bytes(a), bytes(b)): int(d) for a, b, _, d in rows}

    async def _mark_evicted(
        self,
        ledger: bytes,
        page_id: bytes,
        verdict: eviction.Evictability,
        *,
        only_unset: bool = False,
    ) -> None:
        async with self.usage.write() as conn:
            await conn.execute(
                "INSERT OR IGNORE INTO page_usage (ledger, page, closed_at) VALUES (?, ?, ?)",
                (ledger, page_id, int(time.time() * 1000)),
            )
            # (Finishing one cut short: the row may say already.)
            where = " AND evicted = 0" if only_unset else ""
            await conn.execute(
                f"UPDATE page_usage SET evicted = ?, written = ? "
                f"WHERE ledger = ? AND page = ?{where}",
                (verdict.kind, verdict.written, ledger, page_id),
            )
        self._evicted[(ledger, page_id)] = verdict.kind
        self._evicted_written[(ledger, page_id)] = verdict.written

    @property
    def ledgers_dir(self) -> Path:
        return self.root / str(FORMAT_VERSION) / "ledgers"

    @property
    def unwritten_dir(self) -> Path:
        """Where the unwritten marks are (see :data:`UNWRITTEN`)."""
        return self.root / str(FORMAT_VERSION) / UNWRITTEN

    def ledger(self, name: bytes | str) -> Ledger:
        return Ledger(self, _name(name, "ledger name"))

    async def ledgers(self, *, include_deleted: bool = False) -> list[bytes]:
        """The ledgers stored here, by name. A ledger whose every page is deleted is
        left out unless ``include_deleted`` (sync and check want every stored page)."""

        def scan() -> list[bytes]:
            out = []
            for p in self.ledgers_dir.iterdir():
                raw = decode_name(p.name)
                if raw is not None and p.is_dir() and encode_name(raw) == p.name:
                    out.append(raw)
            return sorted(out)

        # An evicted page has no directory: a ledger of evicted pages only may have
        # none either (the removal of a page nothing was written to drops an emptied
        # ledger directory).
        names = sorted({*await asyncio.to_thread(scan), *(k[0] for k in self._evicted)})
        if include_deleted:
            return names
        rows = await self.usage.read_all("SELECT DISTINCT ledger FROM page_usage WHERE deleted = 1")
        some_deleted = {bytes(r[0]) for r in rows}
        some_deleted.update(k[0] for k in [*self._pages, *self._closed_deleted])
        return [n for n in names if n not in some_deleted or await self.ledger(n).pages()]

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
        return _lost(self.page_path(ledger, page_id).parent)

    def lost_error(self, ledger: bytes, page_id: bytes) -> CorruptDatabaseError | None:
        """The error every use of a lost page (:meth:`page_lost`) raises; None if it is
        not lost (blocking, briefly: it looks at the page's directory)."""
        if not self.page_lost(ledger, page_id):
            return None
        path = self.page_path(ledger, page_id)
        left = _lost_leftovers(path.parent) or [path.name + "-wal"]
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

    async def _known_deleted(self, key: tuple[bytes, bytes]) -> bool | None:
        """Whether the page is deleted, when known without page_usage: an open page
        is asked (a closing one too: page_usage is written once it has closed), once
        its acknowledged writes are committed (a delete of its last key may make it
        a deleted page again); a page closed a moment ago remembered; None otherwise."""
        page = self._pages.get(key)
        if page is not None:
            if page.writer.uncommitted and not page.closed:
                with contextlib.suppress(StoreError):  # (it answers as it stands)
                    await page.flush()
            return page.deleted
        return self._closed_deleted.get(key)

    async def page_listed(self, ledger: bytes, page_id: bytes) -> bool:
        """The page is stored here and not deleted: listings show it."""
        if not self.page_exists(ledger, page_id):
            return False
        known = await self._known_deleted((ledger, page_id))
        if known is not None:
            return not known
        rows = await self.usage.read_all(
            "SELECT deleted FROM page_usage WHERE ledger = ? AND page = ?", (ledger, page_id)
        )
        return not (rows and rows[0][0])

    async def ledger_listed(self, ledger: bytes) -> bool:
        """The ledger holds a page that listings show."""
        return self.ledger_exists(ledger) and bool(await self.ledger(ledger).pages())

    async def delete_page(self, ledger: bytes | str, page_id: bytes | str) -> None:
        """Delete a page: one commit that removes every entry and marks the page
        deleted (:mod:`store.page.deleted`), synced to the other devices like any commit,
        so they empty the page and leave it out of listings too. Listings here leave
        it out at once. A later write brings the page back with only the new keys.
        Raises :class:`PageNotFoundError` for a page that is not listed (never
        stored here, or deleted already). A lost page (:meth:`page_lost`) cannot be
        opened to commit that: what remains of it is removed (:meth:`_remove_lost`)."""
        led, pid = _name(ledger, "ledger name"), _name(page_id, "page id")
        if self.page_lost(led, pid) and await self._remove_lost(led, pid):
            return
        if not await self.page_listed(led, pid):
            if not await self.ledger_listed(led):
                raise LedgerNotFoundError(f"no ledger {named(led)}")
            raise PageNotFoundError(f"no page {named(pid)} in ledger {named(led)}")
        async with self.page(led, pid) as page:
            await page.delete_page()
            await self._record_deleted(page)

    async def _remove_lost(self, ledger: bytes, page_id: bytes) -> bool:
        """Remove what remains of a lost page (:meth:`page_lost`): its directory, the
        -wal in it, its page_usage row and its unwritten mark. No commit says it is
        deleted (the page cannot be opened), so a page the bucket holds comes back at
        the next sync. Returns False if the page is no longer lost (opened meanwhile)."""
        key = (ledger, page_id)
        async with self._no_open_of(key):
            if not self.page_lost(ledger, page_id):
                return False
            page_dir = self.page_path(ledger, page_id).parent
            left = await asyncio.to_thread(_lost_leftovers, page_dir)
            await asyncio.to_thread(_remove_page_dir, page_dir)
            await self._forget(key)
            self._closed_deleted.pop(key, None)
            self._marked.add(key)  # (a mark an earlier run left: dropped too)
            await self.written(ledger, page_id)
            log.warning(
                "page %s of ledger %s deleted while lost: its %s removed",
                named(page_id),
                named(ledger),
                ", ".join(left),
            )
            return True

    async def delete_ledger(self, ledger: bytes | str) -> int:
        """Delete every page of a ledger (:meth:`delete_page`, page by page: each is
        its own commit); returns how many. Raises :class:`LedgerNotFoundError` when
        the ledger has no listed page."""
        led = _name(ledger, "ledger name")
        ids = await self.ledger(led).pages()
        if not ids:
            raise LedgerNotFoundError(f"no ledger {named(led)}")
        for pid in ids:
            async with self.page(led, pid) as page:
                await page.delete_page()
                await self._record_deleted(page)
        return len(ids)

    async def _record_deleted(self, page: Page) -> None:
        """Write down whether the page is deleted, for listings once it is closed."""
        async with self.usage.write() as conn:
            await conn.execute(
                "UPDATE page_usage SET deleted = ? WHERE ledger = ? AND page = ?",
                (int(page.deleted), page.ledger, page.id),
            )

    async def open_page(self, ledger: bytes, page_id: bytes) -> Page:
        return (await self.acquire(ledger, page_id))[0]

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"the repository {self.root} is closed")

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
            async with self.usage.write() as conn:
                await conn.execute(
                    "INSERT INTO page_usage (ledger, page, closed_at) VALUES (?, ?, 0) "
                    "ON CONFLICT (ledger, page) DO UPDATE SET closed_at = 0, evicted = 0",
                    (ledger, page_id),
                )
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
        return await Page.open(
            self.page_path(ledger, page_id),
            ledger,
            page_id,
            synchronous=self.synchronous,
            hooks=self.hooks,
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
                await conn.execute(
                    "UPDATE page_usage SET closed_at = ?, deleted = ? "
                    "WHERE ledger = ? AND page = ?",
                    (int(time.time() * 1000), int(page.deleted), page.ledger, page.id),
                )
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

    async def get_meta(self, name: str) -> bytes | None:
        """A small named value of the repository (sync keeps its cursors here)."""
        rows = await self.usage.read_all("SELECT value FROM repository WHERE name = ?", (name,))
        return bytes(rows[0][0]) if rows else None

    async def metas(self, prefix: str) -> dict[str, bytes]:
        """The named values whose names start with ``prefix``."""
        rows = await self.usage.read_all(
            "SELECT name, value FROM repository WHERE name >= ? AND name < ?",
            (prefix, prefix + "\U0010ffff"),
        )
        return {str(n): bytes(v) for n, v in rows}

    async def set_meta(self, name: str, value: bytes) -> None:
        async with self.usage.write() as conn:
            await conn.execute(
                "INSERT OR REPLACE INTO repository (name, value) VALUES (?, ?)", (name, value)
            )

    async def delete_meta(self, name: str) -> None:
        async with self.usage.write() as conn:
            await conn.execute("DELETE FROM repository WHERE name = ?", (name,))

    async def set_metas(self, values: dict[str, bytes | None]) -> None:
        """Set (or, for None, delete) several named values in one transaction."""
        if not values:
            return
        async with self.usage.write() as conn:
            for name, value in values.items():
                if value is None:
                    await conn.execute("DELETE FROM repository WHERE name = ?", (name,))
                else:
                    await conn.execute(
                        "INSERT OR REPLACE INTO repository (name, value) VALUES (?, ?)",
                        (name, value),
                    )

    async def usage_of(self, ledger: bytes | str, page_id: bytes | str) -> int | None:
        """When the page was last closed (UNIX ms), 0 while open, None if unknown."""
        rows = await self.usage.read_all(
            "SELECT closed_at FROM page_usage WHERE ledger = ? AND page = ?",
            (_name(ledger, "ledger name"), _name(page_id, "page id")),
        )
        return int(rows[0][0]) if rows else None

    # -- for sync (added by the sync branch; see its report) -------------------------

    async def pages_used_since(self, since_ms: int) -> list[tuple[bytes, bytes]]:
        """(ledger, page id) of the pages open now, or left open by a crash, or closed
        at or after ``since_ms`` (UNIX ms): those that can have changed since then.
        One query on ``page_usage``; no page is opened."""
        rows = await self.usage.read_all(
            "SELECT ledger, page FROM page_usage WHERE closed_at = 0 OR closed_at >= ?",
            (since_ms,),
        )
        return [(bytes(r[0]), bytes(r[1])) for r in rows]

    # ---------------------------------------------------------------------------------

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

    @contextlib.asynccontextmanager
    async def _no_open_of(self, key: tuple[bytes, bytes]) -> AsyncIterator[None]:
        """Hold the lock that opens page ``key``: no other open of it meanwhile. One
        lock per page being opened, dropped once nobody waits on it (a long-running
        daemon opens many pages over its life)."""
        opening = self._opening.get(key)
        if opening is None:
            opening = self._opening[key] = _Opening(asyncio.Lock())
        opening.users += 1
        try:
            async with opening.lock:
                yield
        finally:
            opening.users -= 1
            if opening.users == 0:
                del self._opening[key]

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
            await self.usage.run(lambda conn: conn.execute("PRAGMA wal_checkpoint(TRUNCATE)"))
            if await asyncio.to_thread(eviction.directory_bytes, self.root) <= disk_budget:
                break
        return evicted

    async def _evict_pass(self, disk_budget: int, older_than: float) -> int:
        rows = await self.usage.read_all(
            "SELECT ledger, page, closed_at FROM page_usage WHERE closed_at > 0 AND evicted = 0 "
            "ORDER BY closed_at"
        )
        now_ms = int(time.time() * 1000)
        evicted = 0
        used = await asyncio.to_thread(eviction.directory_bytes, self.root) if disk_budget else 0
        for a, b, closed_at in rows:
            ledger, page_id = bytes(a), bytes(b)
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


class Ledger:
    """A namespace of pages (one per application)."""

    def __init__(self, repo: Repository, name: bytes) -> None:
        self.repo = repo
        self.name = name

    async def page(self, page_id: bytes | str | None = None) -> Page:
        """Open (creating on first use) a page; a fresh random id when none is given."""
        raw = os.urandom(PAGE_ID_SIZE) if page_id is None else _name(page_id, "page id")
        return await self.repo.open_page(self.name, raw)

    async def delete_page(self, page_id: bytes | str) -> None:
        """Delete one page of the ledger (:meth:`Repository.delete_page`)."""
        await self.repo.delete_page(self.name, page_id)

    async def delete(self) -> int:
        """Delete every page of the ledger (:meth:`Repository.delete_ledger`)."""
        return await self.repo.delete_ledger(self.name)

    async def pages(self, *, include_deleted: bool = False) -> list[bytes]:
        """The ledger's pages, by id, evicted ones included; deleted ones are left out
        unless ``include_deleted``."""
        ids = sorted({*await self._stored(), *self.repo.evicted_pages(self.name)})
        if include_deleted:
            return ids
        rows = await self.repo.usage.read_all(
            "SELECT page FROM page_usage WHERE ledger = ? AND deleted = 1", (self.name,)
        )
        marked = {bytes(r[0]) for r in rows}
        out = []
        for pid in ids:
            known = await self.repo._known_deleted((self.name, pid))
            if not (pid in marked if known is None else known):
                out.append(pid)
        return out

    async def lost_pages(self) -> list[bytes]:
        """The ledger's pages whose database file is gone while its -wal or -journal
        remains (:meth:`Repository.page_lost`): not in :meth:`pages`, damaged."""
        lost = await asyncio.to_thread(self._scan, _lost)
        return [p for p in lost if self.repo.page_lost(self.name, p)]

    def _scan(self, test: Callable[[Path], bool]) -> list[bytes]:
        """The ids of the ledger's page directories that pass ``test``, in order
        (blocking)."""
        directory = self.repo.ledgers_dir / encode_name(self.name)
        if not directory.is_dir():
            return []
        out = []
        for p in directory.iterdir():
            raw = decode_name(p.name)
            if raw is not None and encode_name(raw) == p.name and test(p):
                out.append(raw)
        return sorted(out)

    async def _stored(self) -> list[bytes]:
        return await asyncio.to_thread(self._scan, lambda p: (p / "page.sqlite").exists())
