"""Plain writes: a page's implicit journal and its group commit.

This module owns the write worker of one page. A write (puts, deletes, a clear)
is queued; the worker takes everything queued, appends it to the page's
implicit journal in one SQLite transaction and acknowledges the writers: the
write is durable from then on, and readable at once through the journal's
in-memory overlay. A small write that finds nothing queued and the worker
between rounds appends itself, inline, when SQLite lets it without waiting
(handing it over cost a small put three turns of the event loop); the writes of
other tasks in that turn of the loop queue, and the worker appends them in one
transaction. The worker commits the journal, one commit for everything appended
since the last one, when writes pause for ``COMMIT_DELAY``, when the journal holds
``MAX_JOURNAL_ENTRIES`` keys, or when someone flushes; so concurrent and
back-to-back writers share commits. A write of at least ``DIRECT_BATCH`` changes
is committed on its own, after the journal.

The journal's commit is stamped with the time of its first acknowledged write
(never older than its parent), and its entries carry that time in their dot, so
that last-one-wins orders writes by when they were acknowledged, not by when the
group commit ran; if the journal holds versionstamped writes, with the time of its
latest stamp, so that the stamps a device has seen are all older than its head
(:mod:`store.page.stamps`). A plain write has seen the whole state it is applied to (an
import commits the journal first): it supersedes every version of its keys.

A write's versionstamped keys and values (:class:`store.page.stamps.StampedKey`,
:class:`~store.page.stamps.StampedValue`) share one stamp, taken by the worker just
before it appends the write: writes are stamped in the order they are appended
and acknowledged, so several in one group commit get distinct, increasing stamps. Journals left by a
crash are committed when the page opens (:meth:`JournalWriter.recover`).

It does not read (the page's views do) nor merge: its commits always build on
the current head.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ledgerd.store.errors import InvalidDigestError, named
from ledgerd.store.page import deleted, staging
from ledgerd.store.page.graph import DIRECT_BATCH, CommitGraph
from ledgerd.store.page.staging import Change
from ledgerd.store.page.stamps import StampClock, StampedValue
from ledgerd.store.page.view import KEY_LIMIT, NO_OVERLAY, Overlay
from ledgerd.store.pieces import digest as dg
from ledgerd.store.pieces import split
from ledgerd.store.pieces.objects import ObjectStore
from ledgerd.store.sqlite import journal, sql
from ledgerd.store.sqlite.db import INLINE_MAX_ROWS, Database, fits_inline
from ledgerd.store.tree.btree import Entry, NodeStore, Priority, new_entry
from ledgerd.store.tree.commit import Commit

log = logging.getLogger(__name__)

COMMIT_DELAY = 0.005
"""Seconds the write worker waits for more writes before committing the journal."""

MAX_JOURNAL_ENTRIES = 4096
"""The journal is committed at once when it holds this many keys."""


@dataclass(slots=True)
class _Write:
    clear: bool
    changes: list[tuple[bytes, Entry | None]]
    pieces: list[split.Piece]
    tokens: list[str]
    done: asyncio.Future[None]
    flush: bool = False  # resolve only once the journal is committed
    direct: bool = False  # a large batch: committed on its own, without the journal
    stamps: list[staging.StampSlot] = field(default_factory=list)
    completed: list[bytes] = field(default_factory=list)  # the stamped keys and values

    @property
    def empty(self) -> bool:
        return not (self.clear or self.changes or self.pieces or self.tokens)


class JournalWriter:
    """The implicit journal of one page and the worker that appends to and commits it."""

    def __init__(
        self,
        name: bytes,
        db: Database,
        objects: ObjectStore,
        nodes: NodeStore,
        graph: CommitGraph,
        clock: StampClock,
        check_open: Callable[[], None],
    ) -> None:
        self.name = name
        self.clock = clock
        self.db = db
        self.objects = objects
        self.nodes = nodes
        self.graph = graph
        self._check_open = check_open
        self.overlay = NO_OVERLAY
        """Acknowledged changes not committed yet: what reads see over the head."""
        self._journal: str | None = None
        self._since: int | None = None  # when its first write was acknowledged (µs)
        self._stamped: int | None = None  # the time of its latest versionstamp (µs)
        self._rows = 0  # rows the journal has staged (entries, pieces)
        self._pending: list[_Write] = []
        self._wake = asyncio.Event()
        self._worker: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        """Held by the worker while it appends to or commits the journal (a write
        appends itself only when it is free: :meth:`_submit`)."""
        self._last_append = 0.0  # loop time of the last append (the commit waits a pause)
        self._appended_by: asyncio.Task[object] | None = None
        """The task of a write that appended itself in this turn of the event loop
        (:meth:`_submit`)."""
        self.stopping = False
        """Set when the page closes: the worker commits what it has and ends."""

    @property
    def busy(self) -> bool:
        """Writes are queued, uncommitted, or the worker is running."""
        return bool(
            self._pending
            or self._journal is not None
            or (self._worker is not None and not self._worker.done())
        )

    @property
    def uncommitted(self) -> bool:
        return self._journal is not None or bool(self._pending)

    async def stop(self) -> None:
        """Let the worker finish what is queued (the page is closing)."""
        self.stopping = True
        self._wake.set()  # a worker waiting for a pause commits now
        if self._worker is not None:
            await asyncio.gather(self._worker, return_exceptions=True)

    # -- writing -------------------------------------------------------------------

    async def clear(self) -> None:
        loop = asyncio.get_running_loop()
        await self._submit(_Write(True, [], [], [], loop.create_future()))

    async def delete_page(self) -> None:
        """Queue the page's delete (a clear that leaves :data:`store.page.deleted.MARK` as a
        tombstone: one commit like any write) and wait until it is committed."""
        loop = asyncio.get_running_loop()
        await self._submit(_Write(True, [(deleted.MARK, None)], [], [], loop.create_future()))
        await self.flush()

    async def write(
        self, changes: Iterable[Change], prio: Priority = Priority.EAGER
    ) -> list[bytes]:
        """Many puts (value) and deletes (None) that land in one commit; returns the
        completed versionstamped keys and values, in the order of the changes."""
        prepared, stamps, pieces_of, staged = await staging.stage_changes(
            self.objects, changes, prio
        )
        # The last change to a key wins: values overwritten within this same write
        # are not stored (when no key comes twice, every value is live).
        latest = dict(prepared)
        live = (
            None
            if len(latest) == len(prepared)
            else {e.value for e in latest.values() if e is not None}
        )
        del latest
        pieces, tokens = await staging.only_live(self.objects, live, pieces_of, staged)
        loop = asyncio.get_running_loop()
        direct = len(prepared) >= DIRECT_BATCH
        w = _Write(
            False, prepared, pieces, tokens, loop.create_future(), direct=direct, stamps=stamps
        )
        await self._submit(w)
        if direct:  # a big write's objects are freed a slice at a time
            await staging.released(prepared, pieces, pieces_of)
        return w.completed

    async def flush(self) -> None:
        """Wait until every acknowledged write is committed (raising if that failed).

        Only the worker commits the journal; this queues a marker that it resolves
        after its next commit attempt."""
        if self._journal is None and not self._pending:
            return
        loop = asyncio.get_running_loop()
        await self._submit(_Write(False, [], [], [], loop.create_future(), flush=True))

    async def _submit(self, w: _Write) -> None:
        self._check_open()
        task = asyncio.current_task()
        # Writes of other tasks in the turn of the loop where one appended itself
        # (concurrent requests) queue: the worker appends them together, in one
        # SQLite transaction, rather than each in its own (group commit).
        others = self._appended_by is not None and self._appended_by is not task
        alone = not (self._pending or self._lock.locked() or self.stopping or others)
        if alone and not (w.empty or w.direct or w.stamps or w.tokens or w.clear):
            # Nothing queued, and the worker is between rounds: a small write appends
            # itself, inline and at once, rather than handing itself over and waiting
            # for the worker's turn and then for its answer (three turns of the loop,
            # most of a small put's cost). Nothing here yields, so it is all or
            # nothing even if the caller is cancelled. The worker still commits.
            work, small, appended = self._appending([w])
            if small and self.db.write_now(work)[0]:
                appended()
                if self._appended_by is None:
                    asyncio.get_running_loop().call_soon(self._turn_ended)
                self._appended_by = task
                if len(self.overlay.entries) >= MAX_JOURNAL_ENTRIES:
                    self._wake.set()
                self._start_worker()
                return
        self._pending.append(w)
        self._wake.set()
        self._start_worker()
        await asyncio.shield(w.done)

    def _turn_ended(self) -> None:
        self._appended_by = None

    def _start_worker(self) -> None:
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._run(), name=f"page-writes-{self.name!r}")

    # -- the worker ----------------------------------------------------------------

    async def _run(self) -> None:
        """Appends queued writes to the journal and commits it (group commit); a write
        that finds nothing queued and the lock free may append itself (:meth:`_submit`)."""
        while True:
            if not self._pending:
                if self._journal is None:
                    return
                if not self.stopping and len(self.overlay.entries) < MAX_JOURNAL_ENTRIES:
                    # Wait for more writes or COMMIT_DELAY, whichever comes first (a
                    # timer rather than wait_for: no task per pause on the hot path);
                    # writes that appended themselves meanwhile count as more writes.
                    loop = asyncio.get_running_loop()
                    self._wake.clear()
                    delay = COMMIT_DELAY - (loop.time() - self._last_append)
                    timer = loop.call_later(max(delay, 0), self._wake.set)
                    try:
                        await self._wake.wait()
                    finally:
                        timer.cancel()
                    if self._pending:
                        continue
                    if (
                        loop.time() - self._last_append < COMMIT_DELAY
                        and not self.stopping
                        and len(self.overlay.entries) < MAX_JOURNAL_ENTRIES
                    ):
                        continue  # not a pause yet
                async with self._lock:
                    committed = await self._try_commit([])
                if not committed:
                    return  # the journal stays; the next write, flush or open retries
                continue
            async with self._lock:
                await self._round()

    async def _round(self) -> None:
        """Append (or commit directly) what is queued; the lock is held."""
        if self._pending[0].direct:
            await self._commit_direct(self._pending.pop(0))
            return
        cut = next((i for i, w in enumerate(self._pending) if w.direct), len(self._pending))
        batch, self._pending = self._pending[:cut], self._pending[cut:]
        writes = [w for w in batch if not w.empty]
        flushes = [w for w in batch if w.empty]
        try:
            for w in writes:
                if w.stamps:
                    t = await self._stamp(w)
                    self._stamped = max(t, self._stamped or 0)
            if writes:
                await self._append(writes)
        except BaseException as e:
            for w in writes:
                if not w.done.done():
                    w.done.set_exception(e)
                await staging.discard(self.objects, w.tokens)
            if not isinstance(e, Exception):
                raise
        for w in writes:
            if not w.done.done():
                w.done.set_result(None)
        if flushes or len(self.overlay.entries) >= MAX_JOURNAL_ENTRIES:
            await self._try_commit(flushes)

    async def _commit_direct(self, w: _Write) -> None:
        """A large batch becomes one commit of its own, after the journal's."""
        try:
            if self._journal is not None:
                await self.commit_journal()
            async with self.graph.lock:
                at = await self._stamp(w) if w.stamps else None

                async def storing(c: Commit) -> staging.Storing:
                    # Many values never fit inline: said here, so that the commit does
                    # not add up every value's size to find out. (The pieces are of
                    # distinct values already: their count is at least the distinct
                    # pieces', with no set of 250,000 digests made on the event loop.)
                    small = fits_inline(len(w.pieces), 0)
                    return staging.Storing(values=w.pieces, tokens=w.tokens, also_small=small)

                stored = await staging.commit_staged(
                    self.graph, self.nodes, w.changes, storing, cleared=w.clear, at=at
                )
                if stored is None:
                    await staging.discard(self.objects, w.tokens)
        except BaseException as e:
            if not w.done.done():
                w.done.set_exception(e)
            await staging.discard(self.objects, w.tokens)
            if not isinstance(e, Exception):
                raise
            return
        if not w.done.done():
            w.done.set_result(None)

    async def _stamp(self, w: _Write) -> int:
        """Complete the write's versionstamped keys and values with one new stamp;
        returns the stamp's time."""
        t, stamp = self.clock.next()
        for s in w.stamps:
            done = s.template.complete(stamp)
            key, entry = w.changes[s.index]
            if isinstance(s.template, StampedValue):
                entry, pieces, _ = await staging.prepare(self.objects, key, done, s.priority)
                w.pieces.extend(pieces)  # in memory: stamped values are small
            else:
                assert entry is not None
                key, entry = done, new_entry((done, entry.value, entry.priority))
            w.changes[s.index] = (key, entry)
            w.completed.append(done)
        return t

    async def _try_commit(self, flushes: list[_Write]) -> bool:
        """Commit the journal; tell the flushers how it went. False if it failed."""
        error: Exception | None = None
        try:
            await self.commit_journal()
        except Exception as e:
            log.warning(
                "committing the implicit journal of page %s failed: %s", named(self.name), e
            )
            error = e
        for w in flushes:
            if w.done.done():
                continue
            if error is None:
                w.done.set_result(None)
            else:
                w.done.set_exception(error)
        if error is not None and self._pending:
            # Writes queued meanwhile wait for a worker: start the next round now
            # rather than leaving them until another write comes.
            self._wake.set()
            return True
        return error is None

    async def _append(self, batch: list[_Write]) -> None:
        """Append writes to the journal in one transaction (they are durable after)."""
        work, small, appended = self._appending(batch)
        await self.db.run(work, write=True, small=small)
        appended()

    def _appending(
        self, batch: list[_Write]
    ) -> tuple[Callable[[sqlite3.Connection], None], bool, Callable[[], None]]:
        """The SQLite work that appends ``batch`` to the journal, whether it is small
        enough to run inline, and what to do once it is stored."""
        new = self._journal is None
        jid = self._journal or f"I{time.time_ns():020d}{uuid.uuid4().hex[:12]}"
        since = self.graph.clock_us() if new else self._since
        pieces = {p.digest: p.data for w in batch for p in w.pieces}  # one row per piece

        def work(conn: sqlite3.Connection) -> None:
            if new:
                journal.open_journal(conn, jid, since)
            for w in batch:
                if w.clear:
                    journal.clear_journal(conn, jid)
                if w.changes:
                    journal.put_entries(
                        conn,
                        jid,
                        [
                            (k, None if e is None else e.value, 0 if e is None else e.priority)
                            for k, e in w.changes
                        ],
                    )
                journal.adopt_staged(conn, jid, w.tokens)
            if pieces:
                journal.put_pieces(conn, jid, pieces)

        # Staged values (tokens) and clears move rows in proportion to their size.
        rows = sum(len(w.changes) for w in batch) + len(pieces)
        if any(w.tokens or w.clear for w in batch):
            rows += INLINE_MAX_ROWS + 1
        small = fits_inline(rows, sum(map(len, pieces.values())))

        def appended() -> None:
            self._last_append = asyncio.get_running_loop().time()
            self._rows = rows + (0 if new else self._rows)
            self.objects.remember(pieces.items())  # read-your-writes
            self.overlay = self._overlaid(batch, new)
            self._since = since
            self._journal = jid

        return work, small, appended

    def _overlaid(self, batch: list[_Write], new: bool) -> Overlay:
        """The overlay with ``batch`` appended: a new one for a new journal, else the
        journal's own, its dict updated in place rather than copied per write (a copy
        cost a put time in proportion to the journal). Reads take the overlay at once,
        never across an await, and the journal's commit holds the lock that appends
        wait for (:meth:`_submit`), so nothing sees it change under it."""
        overlay = NO_OVERLAY if new else self.overlay
        if overlay is NO_OVERLAY or not isinstance(overlay.entries, dict):
            overlay = Overlay(overlay.cleared, dict(overlay.entries))
        entries = overlay.entries
        assert isinstance(entries, dict)
        for w in batch:
            if w.clear:
                entries.clear()
                if not overlay.cleared:
                    overlay = Overlay(True, entries)
            entries.update(w.changes)
        return overlay

    async def commit_journal(self) -> None:
        async with self.graph.lock:
            jid, overlay = self._journal, self.overlay
            if jid is None:
                return
            at = self._since if self._stamped is None else max(self._since or 0, self._stamped)

            async def storing(c: Commit) -> staging.Storing:
                # Values a later write of this journal replaced are in no commit: their
                # pieces are collected rather than kept (and uploaded) for nothing.
                live = {e.value for e in overlay.entries.values() if e is not None}
                keep = await self.objects.value_pieces(live)

                def drop(conn: sqlite3.Connection) -> None:
                    sql.keep_journal_pieces(conn, jid, keep)
                    sql.drop_journal(conn, jid)

                return staging.Storing(
                    also=drop, also_small=fits_inline(self._rows, 0), then=self._reset
                )

            stored = await staging.commit_staged(
                self.graph, self.nodes, overlay.entries, storing, cleared=overlay.cleared, at=at
            )
            if stored is None:
                await self.db.run(lambda conn: sql.drop_journal(conn, jid), write=True)
                await self.objects.discard(jid)
                self._reset()

    def _reset(self) -> None:
        self._journal, self.overlay, self._since, self._stamped = None, NO_OVERLAY, None, None

    async def recover(self) -> bool:
        """Commit the implicit journals a crash left (their writes were acknowledged)."""
        journals = await self.db.read_all(journal.IMPLICIT_JOURNALS)
        for jid, cleared, since in journals:
            entries = await self.db.read_all(journal.JOURNAL_ENTRIES, (jid,))
            changes = [c for k, v, p in entries if (c := _recovered(k, v, p)) is not None]
            if len(changes) < len(entries):
                log.warning(
                    "implicit journal %s of page %s: %d entries are damaged (a value that "
                    "is no digest, an unknown priority, a key that is not one) and are left out",
                    jid,
                    named(self.name),
                    len(entries) - len(changes),
                )
            self._journal, self._since = str(jid), since
            self._rows = INLINE_MAX_ROWS + 1  # its pieces are unknown: not inline
            self.overlay = Overlay(bool(cleared), dict(changes))
            log.info(
                "committing implicit journal %s left by a crash (%d entries)", jid, len(changes)
            )
            await self.commit_journal()
        return bool(journals)


def _recovered(key: object, value: object, priority: object) -> tuple[bytes, Entry | None] | None:
    """A change of an implicit journal left by a crash, as stored; None when a damaged
    file made it unusable (committed, it would make an undecodable tree node)."""
    if type(key) is not bytes or len(key) > KEY_LIMIT:  # (the empty key is a key)
        return None
    if value is None:
        return key, None
    if type(value) is not bytes or type(priority) is not int or priority not in (0, 1):
        return None
    try:
        dg.validate(value)
    except InvalidDigestError:
        return None
    return key, Entry(key, value, Priority(priority))
