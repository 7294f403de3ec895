"""SQLite connections of one database file, off the event loop.

This module owns a database's connections once open (a writer and a reader on the
shared SQLite threads of :mod:`store.sqlite.threads`, and plain ones for inline writes
and reads): which one runs what, the write lock, the WAL checkpoints, closing them.
Opening them is :mod:`store.sqlite.opening`'s; one transaction on a connection, and
the limits of what runs inline, :mod:`store.sqlite.transactions`'s. It knows nothing
about what the tables mean; :mod:`store.sqlite.schema` owns that.

* WAL mode, so readers never wait for the writer and the writer never waits for
  readers.
* One writer connection guarded by an :class:`asyncio.Lock`: every multi-row
  change is one ``BEGIN IMMEDIATE`` ... ``COMMIT`` taken through :meth:`Database.write`.
* One reader connection (``query_only``) that sees committed data only.
* 4 KiB pages (small commits write little). The WAL is copied into the database
  (checkpointed) beside the writes: once a write on the writer's thread leaves
  ``BACKGROUND_CHECKPOINT_PAGES`` pages not yet copied, a connection opened for
  it copies them on a pool thread while the next writes go on (a checkpoint in
  the commit that crossed the limit, SQLite's way, made that commit wait for it:
  about a tenth of a bulk load's time). The writer's own checkpoint, every
  ~64 MiB of WAL, stays as the bound when the copying falls behind.
* Small writes may run *inline*: on the event loop's own thread, through a third
  connection that never checkpoints and never waits for a lock. A thread round trip
  costs more than such a write (0.2-0.4 ms against tens of microseconds), and a
  plain put needs one. The writer connection, on its thread, still does every
  large write and every checkpoint, so the loop never waits on the disk for long.
* Small reads (a few rows by primary key: a tree node, a value's piece) run inline
  too, through a fourth, read-only connection, for the same reason: a point read
  costs SQLite a few microseconds and the thread round trip a hundred times that.
  That connection never waits either: when SQLite answers busy, the read takes
  the reader's thread like a large one.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import sqlite3
import struct
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Literal, TypeVar

from ledgerd.store.errors import ClosedError
from ledgerd.store.sqlite import opening
from ledgerd.store.sqlite.files import NEW_SUFFIX as NEW_SUFFIX
from ledgerd.store.sqlite.files import PAGE_SIZE as PAGE_SIZE
from ledgerd.store.sqlite.files import file_uri as file_uri
from ledgerd.store.sqlite.files import translating as translating
from ledgerd.store.sqlite.schema import digest_key
from ledgerd.store.sqlite.threads import Connection, pool
from ledgerd.store.sqlite.transactions import INLINE_MAX_BYTES as INLINE_MAX_BYTES
from ledgerd.store.sqlite.transactions import INLINE_MAX_ROWS as INLINE_MAX_ROWS
from ledgerd.store.sqlite.transactions import INLINE_READ_ROWS as INLINE_READ_ROWS
from ledgerd.store.sqlite.transactions import INLINE_ROUND as INLINE_ROUND
from ledgerd.store.sqlite.transactions import (
    close_now,
    in_begun_transaction,
    in_transaction,
    is_busy,
    undo_begin,
)
from ledgerd.store.sqlite.transactions import fits_inline as fits_inline

log = logging.getLogger(__name__)

Synchronous = Literal["OFF", "NORMAL", "FULL"]
T = TypeVar("T")

WAL_CHECKPOINT_PAGES = 16384
BACKGROUND_CHECKPOINT_PAGES = 4096
"""Pages of WAL not yet copied into the database (16 MiB) past which a write on the
writer's thread starts copying them on a connection of its own (see the module
docstring)."""


def writer_pragmas(synchronous: Synchronous = "NORMAL") -> list[str]:
    """The settings of a writer connection (benchmarks use them for bare SQLite too)."""
    return [
        f"PRAGMA synchronous = {synchronous}",
        "PRAGMA temp_store = MEMORY",
        "PRAGMA cache_size = -16384",  # 16 MiB
        # Checkpoint (copy the WAL into the database, with an fsync) every ~64 MiB of
        # WAL rather than SQLite's 4 MiB: fewer stalls under write bursts.
        f"PRAGMA wal_autocheckpoint = {WAL_CHECKPOINT_PAGES}",
        f"PRAGMA journal_size_limit = {WAL_CHECKPOINT_PAGES * PAGE_SIZE}",
    ]


_WAL_INDEX_VERSION = 3007000
_WAL_INDEX = struct.Struct("=I12xI76xI")
"""The start of a WAL index (the ``-shm`` file; layout in SQLite's documented
"WAL-mode file format", walformat.html): ``iVersion`` at byte 0 and ``mxFrame``
(frames in the WAL) at 16 of the first header copy, ``nBackfill`` (frames copied
into the database) at 96, in the machine's byte order."""


def _wal_frames(fd: int) -> tuple[int, int] | None:
    """Frames in the WAL and frames of them copied into the database, read from the
    WAL index open as ``fd``; None if it cannot be read or has another layout. Read
    without SQLite's locks: figures for deciding when to checkpoint, never for
    correctness."""
    try:
        head = os.pread(fd, _WAL_INDEX.size, 0)
    except OSError:
        return None
    if len(head) < _WAL_INDEX.size:
        return None
    version, frames, copied = _WAL_INDEX.unpack(head)
    if version != _WAL_INDEX_VERSION:
        return None
    return frames, copied


@functools.cache
def _wal_index_unread() -> None:
    """Say once per process that checkpoints stay in the writer's commits: the WAL
    index cannot be read, or is not in the layout :data:`_WAL_INDEX` describes."""
    log.warning(
        "the WAL index (-shm file) of SQLite %s is not in the layout this ledgerd reads"
        " (version %d): the WAL is checkpointed in the writer's commits only",
        sqlite3.sqlite_version,
        _WAL_INDEX_VERSION,
    )


def _checkpoint(path: Path, synchronous: Synchronous) -> None:
    """A passive checkpoint of ``path`` (it waits for no lock, and writes go on while
    it copies) on a connection of its own, opened for it: pages that never write
    much never hold one. ``mode=rw``: it never creates the file."""
    conn = sqlite3.connect(file_uri(path, "rw"), uri=True, isolation_level=None, timeout=0)
    try:
        conn.execute(f"PRAGMA synchronous = {synchronous}")  # the checkpoint's syncs
        conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
    finally:
        conn.close()


class Database:
    """One SQLite database file with a writer and a reader connection."""

    def __init__(
        self,
        path: Path,
        writer: Connection,
        reader: Connection,
        inline: sqlite3.Connection | None = None,
        inline_reader: sqlite3.Connection | None = None,
        synchronous: Synchronous = "NORMAL",
    ):
        self.path = path
        self.synchronous = synchronous
        self.writer = writer
        self.reader = reader
        self.inline = inline
        self.inline_reader = inline_reader
        self.inline_reads = 0
        """Reads served inline so far (and :attr:`thread_reads` on the reader's thread)."""
        self.thread_reads = 0
        self._inline_count = 0
        self._lock = asyncio.Lock()
        self._closed = False
        self._wal_index: int | None = None  # the -shm file, open once it exists (and
        # closed only after SQLite's connections: see close)
        self._checkpointing: asyncio.Task[None] | None = None
        self._unclosed: list[tuple[str, Callable[[], Awaitable[None]]]] = []
        """What :meth:`close` has yet to close (see :attr:`unclosed`)."""
        self._copy_started_at: int | None = None  # frames in the WAL then
        self.background_checkpoints = 0
        """Checkpoints run beside the writes so far (see :meth:`_after_write`)."""

    @classmethod
    async def open(
        cls,
        path: Path,
        create_schema: Callable[[sqlite3.Connection], None],
        *,
        synchronous: Synchronous = "NORMAL",
        empty_is_damage: bool = False,
    ) -> Database:
        """Open (creating it if there is none) the database ``path``. With
        ``empty_is_damage``, an empty file there is refused with
        :class:`CorruptDatabaseError` (the store never leaves one: see
        :func:`store.sqlite.files.create_private`)."""
        with translating(path):
            c = await opening.connect(
                path,
                create_schema,
                writer_pragmas(synchronous),
                # With FULL every commit waits for an fsync: not something for the loop.
                inline=synchronous != "FULL",
                empty_is_damage=empty_is_damage,
            )
            return cls(path, c.writer, c.reader, c.inline, c.inline_reader, synchronous)

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"database {self.path} is closed")

    @asynccontextmanager
    async def write(self) -> AsyncIterator[Connection]:
        """One write transaction: committed if the block succeeds, rolled back if not."""
        self._check_open()
        with translating(self.path):
            async with self._write() as conn:
                yield conn

    @asynccontextmanager
    async def _write(self) -> AsyncIterator[Connection]:
        async with self._lock:
            self._check_open()
            conn = self.writer
            begin = asyncio.ensure_future(conn.execute("BEGIN IMMEDIATE"))
            try:
                await asyncio.shield(begin)
            except BaseException:
                # Cancelled while BEGIN ran on the thread: once it has run, undo it, so
                # that the connection is never left inside a transaction.
                await asyncio.shield(undo_begin(conn, begin))
                raise
            try:
                yield conn
            except BaseException:
                await asyncio.shield(conn.rollback())
                raise
            else:
                await asyncio.shield(conn.commit())
                self._after_write()

    async def run(
        self, fn: Callable[[sqlite3.Connection], T], *, write: bool = False, small: bool = False
    ) -> T:
        """Run ``fn(connection)`` on the connection's own thread: one hop for many statements.

        With ``write`` it runs as one ``BEGIN IMMEDIATE`` ... ``COMMIT`` transaction under
        the write lock (rolled back if ``fn`` raises). It runs on a shared SQLite
        thread (:mod:`store.sqlite.threads`); the hot paths use it so that a transaction
        costs one thread round trip instead of one per statement.

        A ``small`` write (a few rows, at most about ``INLINE_MAX_BYTES``) runs inline
        instead, on this thread, unless the database is busy (another process holds
        the write lock): then it takes the writer's thread like any other. So does
        one small write in every ``INLINE_ROUND``, for the checkpoints.

        A ``small`` read (at most ``INLINE_READ_ROWS`` rows by primary key) runs
        inline as well, unless SQLite answers busy: then it takes the reader's thread.
        ``fn`` may then run twice, so a read must have no effect but its result.
        """
        self._check_open()
        with translating(self.path):
            if not write:
                if small and self.inline_reader is not None:
                    try:
                        result = fn(self.inline_reader)
                    except sqlite3.OperationalError as e:
                        if not is_busy(e):
                            raise
                        log.debug("inline read of %s takes the thread: %s", self.path, e)
                    else:
                        self.inline_reads += 1
                        return result
                self.thread_reads += 1
                return await self.reader.run(fn)
            return await self._write_with(fn, small)

    async def _write_with(self, fn: Callable[[sqlite3.Connection], T], small: bool) -> T:
        async with self._lock:
            self._check_open()
            if small:
                done, result = self._inline_write(fn)
                if done:
                    return result  # type: ignore[return-value]
            result = await asyncio.shield(self.writer.run(partial(in_transaction, fn)))
            self._after_write()
            return result

    def _after_write(self) -> None:
        """After a write on the writer's thread: copy the WAL into the database beside
        the next writes if it holds ``BACKGROUND_CHECKPOINT_PAGES`` pages not yet
        copied and no copying is under way.

        A reader's snapshot keeps the frames written after it from being copied: the
        backlog then stays past the limit however often the copying runs, so it runs
        again only once as many frames again were written since it last started (not
        after every write, each opening a connection to copy nothing)."""
        if self._checkpointing is not None or self._closed:
            return
        if self._wal_index is None:
            try:
                self._wal_index = os.open(f"{self.path}-shm", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return  # not there yet (or never: then the writer checkpoints, as ever)
        wal = _wal_frames(self._wal_index)
        if wal is None:
            _wal_index_unread()
            return
        frames, copied = wal
        if frames - copied < BACKGROUND_CHECKPOINT_PAGES:
            return
        since = self._copy_started_at
        if since is not None and since <= frames < since + BACKGROUND_CHECKPOINT_PAGES:
            return  # (frames < since: the WAL started over since then)
        self._copy_started_at = frames
        self._checkpointing = asyncio.ensure_future(self._checkpoint_beside())

    async def _checkpoint_beside(self) -> None:
        """:func:`_checkpoint` on a pool thread; a failure is logged (the writer's own
        checkpoint tries again when the WAL reaches its bound)."""
        try:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(pool(), _checkpoint, self.path, self.synchronous)
            self.background_checkpoints += 1
        except (sqlite3.Error, OSError) as e:
            log.warning("checkpoint of %s beside the writes failed: %s", self.path, e)
        finally:
            self._checkpointing = None

    def write_now(self, fn: Callable[[sqlite3.Connection], T]) -> tuple[bool, T | None]:
        """Run a small write inline, now, if that needs no wait: (True, its result); or
        (False, None) with nothing done, when it would have to wait (another write
        under way here, SQLite busy, or this write's turn to go to the writer's
        thread). Nothing in it yields to the event loop, so a caller cancelled around
        it cannot leave it half done."""
        self._check_open()
        if self._lock.locked() or self._inline_count + 1 >= INLINE_ROUND:
            return False, None  # (the thread's turn is left for the write that waits)
        with translating(self.path):
            return self._inline_write(fn)

    def _inline_write(self, fn: Callable[[sqlite3.Connection], T]) -> tuple[bool, T | None]:
        if self.inline is None or not self._inline_turn():
            return False, None
        inline = self.inline
        if inline.in_transaction:  # never expected; never keep the write lock
            inline.rollback()
        try:
            inline.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as e:
            if e.sqlite_errorcode & 0xFF != sqlite3.SQLITE_BUSY:
                raise
            log.debug("inline write to %s waits for the writer: %s", self.path, e)
            return False, None
        return True, in_begun_transaction(fn, inline)

    def _inline_turn(self) -> bool:
        """Whether this small write may run inline: all but one in ``INLINE_ROUND``.

        Only the writer's commits checkpoint the WAL (when it is over
        ``WAL_CHECKPOINT_PAGES``, inline frames included), so a steady trickle of
        small writes sends one in every round to the writer's thread.
        """
        self._inline_count += 1
        if self._inline_count >= INLINE_ROUND:
            self._inline_count = 0
            return False
        return True

    async def read_all(
        self, sql: str, params: Sequence[object] = (), *, small: bool = False
    ) -> list[sqlite3.Row]:
        """Run a query on the reader connection and return every row (inline if ``small``:
        see :meth:`run`)."""

        def work(conn: sqlite3.Connection) -> list[sqlite3.Row]:
            return conn.execute(sql, params).fetchall()

        return await self.run(work, small=small)

    async def read_in(
        self, sql: str, keys: Sequence[bytes], *, chunk: int = 400
    ) -> list[sqlite3.Row]:
        """Rows of ``sql`` for many keys, a chunk of keys to a query, so that no query
        has too many. In ``sql``, each ``{marks}`` becomes the chunk's placeholders and
        each ``{keys}`` the placeholders of their digest prefixes (``objects_digest``'s
        expression: :data:`store.sqlite.schema.DIGEST_IN`); each takes the chunk's
        keys. A query of at most ``INLINE_READ_ROWS`` keys runs inline (see
        :meth:`run`)."""
        lookups = sql.count("{marks}")  # a {keys} narrows its {marks}' lookup
        groups = lookups + sql.count("{keys}")
        rows: list[sqlite3.Row] = []
        for i in range(0, len(keys), chunk):
            part = list(keys[i : i + chunk])
            marks = ",".join("?" * len(part))
            prefixes = ",".join([digest_key("?")] * len(part))
            small = len(part) * lookups <= INLINE_READ_ROWS
            query = sql.format(marks=marks, keys=prefixes)
            rows.extend(await self.read_all(query, part * groups, small=small))
        return rows

    async def checkpoint(self) -> None:
        """Copy the WAL into the database and truncate it (after a garbage collection,
        so that the space it freed leaves the WAL too). Busy readers elsewhere may
        keep part of the WAL; that is fine."""
        self._check_open()
        with translating(self.path):
            async with self._lock:
                self._check_open()
                # A copying beside the writes holds SQLite's checkpoint lock: TRUNCATE
                # would answer busy at once, the WAL left whole, with no error.
                await self._copied()
                await self.writer.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    async def _copied(self) -> None:
        """Wait (under the write lock, so that no new one starts) for the checkpoint
        beside the writes under way, if any; it logs its own failure."""
        if self._checkpointing is not None:
            await asyncio.wait([self._checkpointing])

    @property
    def unclosed(self) -> list[str]:
        """The connections a failed :meth:`close` left open (empty once closed, or while
        open): until a later close has closed them, the file must not be opened again
        (a second set of connections on it, with their own locks and caches)."""
        return [name for name, _ in self._unclosed]

    def _closers(self) -> list[tuple[str, Callable[[], Awaitable[None]]]]:
        """What closes each connection, in order; the writer's last (its checkpoint
        first), then the WAL index (see :meth:`close`)."""
        out: list[tuple[str, Callable[[], Awaitable[None]]]] = []
        for name, conn in (("inline writer", self.inline), ("inline reader", self.inline_reader)):
            if conn is not None:
                out.append((name, partial(close_now, conn)))
        out.append(("reader", lambda: self.reader.close()))
        out.append(("writer", self._close_writer))
        return out

    async def _close_writer(self) -> None:
        try:
            await self.writer.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.Error as e:  # a busy reader elsewhere; the WAL stays: fine
            log.debug("checkpoint on close of %s failed: %s", self.path, e)
        await self.writer.close()

    async def close(self) -> None:
        """Close every connection, each tried however the others went (one that fails
        does not keep the rest open), then the WAL index. Raises the first failure;
        the connections that failed stay in :attr:`unclosed`, and a later call tries
        them again; so do all of them if the close is cancelled before it closes any."""
        if self._closed and not self._unclosed:
            return
        async with self._lock:
            if not self._closed:
                self._closed = True
                # Recorded before the wait: a close cancelled there leaves them to a
                # later one (not marked closed with its connections open for good).
                self._unclosed = self._closers()
            await self._copied()  # (again in a later close, if a cancelled one left it)
            failed: list[tuple[str, Callable[[], Awaitable[None]]]] = []
            errors: list[BaseException] = []
            for name, close in self._unclosed:
                try:
                    await close()
                except BaseException as e:  # the others are closed all the same
                    failed.append((name, close))
                    errors.append(e)
            self._unclosed = failed
            # Last, and only once no connection is left: closing any descriptor of the
            # -shm file drops every POSIX lock this process holds on it, SQLite's own
            # (other processes would see the WAL index unused while a connection of
            # this one still works in it).
            if not failed and self._wal_index is not None:
                os.close(self._wal_index)
                self._wal_index = None
            if errors:
                names = ", ".join(name for name, _ in failed)
                log.debug("closing %s left its %s open: %r", self.path, names, errors)
                with translating(self.path):
                    raise errors[0]
