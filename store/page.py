"""A page: an ordered byte map with history, stored in its own SQLite database.

This module owns a page's write path (implicit journals with group commit,
explicit journals for transactions, clears), its commits and heads, merging
several heads (last-one-wins for now), snapshots, history and watchers. Reads
are in :mod:`store.view`, the tree in :mod:`store.btree`, pieces in
:mod:`store.objects`.

Plain writes (implicit journal)
    A write is queued; one worker task per page takes everything queued, appends
    it to the page's implicit journal in one SQLite transaction and acknowledges
    the writers (the write is durable from then on). It commits the journal, one
    commit for everything appended since the last one, when writes pause for a
    few milliseconds, when the journal grows large, or when someone flushes
    (transactions, history and heads do), so concurrent and back-to-back writers
    share commits.
    Acknowledged but not yet committed changes are served from an in-memory
    overlay, so a caller always reads its own writes. On open, implicit journals
    left by a crash are committed.

Transactions (explicit journal)
    A transaction reads its base commit plus its own writes. Its entries and small
    values live in memory; large values are staged in SQLite as transient pieces.
    Committing creates one commit on the base; if the page moved meanwhile there
    are two heads, which are merged at once. Rollback, an exception, or a crash
    discards everything it staged.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import heapq
import logging
import sqlite3
import time
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from ledgerd.store import btree, commit, merge, split, sql
from ledgerd.store import digest as dg
from ledgerd.store.btree import EMPTY, Builder, Entry, NodeStore, Priority
from ledgerd.store.commit import Commit
from ledgerd.store.db import INLINE_MAX_ROWS, Database, Synchronous, fits_inline
from ledgerd.store.errors import (
    ClosedError,
    CommitNotFoundError,
    InvalidArgumentError,
    StoreError,
    TransactionClosedError,
)
from ledgerd.store.objects import ObjectStore, Source
from ledgerd.store.schema import LOCAL, TRANSIENT, create_page_schema
from ledgerd.store.view import KEY_LIMIT, NO_OVERLAY, Overlay, TreeView, View, check_key

log = logging.getLogger(__name__)

SMALL_VALUE = 256 * 1024
"""Values given as bytes up to this size are split in memory and written with their
journal entry in one transaction; larger ones and streams are staged first."""

RESOLVER_TIMEOUT = 30.0
"""Seconds a conflict resolver may take before the merge is abandoned (heads kept)."""

COMMIT_DELAY = 0.005
"""Seconds the write worker waits for more writes before committing the journal."""

MAX_JOURNAL_ENTRIES = 4096
"""The journal is committed at once when it holds this many keys."""

DIRECT_BATCH = 1000
"""A write of at least this many changes is committed directly, not through the journal."""

WATCH_VALUE_LIMIT = 64 * 1024
"""Watch notifications carry values up to this size; larger ones carry None."""


class _Nodes:
    def __init__(self, objects: ObjectStore) -> None:
        self.objects = objects

    async def read_node_bytes(self, digest: bytes) -> bytes:
        return await self.objects.read_all(digest)


@dataclass(slots=True)
class _Write:
    clear: bool
    changes: list[tuple[bytes, Entry | None]]
    pieces: list[split.Piece]
    tokens: list[str]
    done: asyncio.Future[None]
    flush: bool = False  # resolve only once the journal is committed
    direct: bool = False  # a large batch: committed on its own, without the journal

    @property
    def empty(self) -> bool:
        return not (self.clear or self.changes or self.pieces or self.tokens)


@dataclass(frozen=True, slots=True)
class ChangedEntry:
    key: bytes
    value: bytes | None  # None when larger than WATCH_VALUE_LIMIT: read it at the commit
    priority: Priority
    size: int


@dataclass(frozen=True, slots=True)
class Notification:
    """What one commit changed in the page (restricted to the watcher's prefix)."""

    commit: bytes
    changed: list[ChangedEntry]
    deleted: list[bytes]


class Watcher:
    """An async iterator of notifications, one per commit, in commit order."""

    def __init__(self, page: Page, prefix: bytes) -> None:
        self.page = page
        self.prefix = prefix
        self.queue: asyncio.Queue[Notification | None] = asyncio.Queue()
        self.closed = False

    def __aiter__(self) -> Watcher:
        return self

    async def __anext__(self) -> Notification:
        if self.closed and self.queue.empty():
            raise StopAsyncIteration
        note = await self.queue.get()
        if note is None:
            self.closed = True
            raise StopAsyncIteration
        return note

    def close(self) -> None:
        if not self.closed:
            self.closed = True  # what is queued is still delivered, then the end
            self.page._watchers.discard(self)
            self.page.last_used = time.monotonic()
            self.queue.put_nowait(None)

    async def __aenter__(self) -> Watcher:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


@dataclass(slots=True)
class _TxnState:
    cleared: bool = False
    entries: dict[bytes, Entry | None] = field(default_factory=dict)
    pieces: dict[bytes, list[split.Piece]] = field(default_factory=dict)  # by value digest
    staged: dict[str, bytes] = field(default_factory=dict)  # token -> its value's digest
    open: bool = True
    counted: bool = False  # counted in Page._transactions (started, not ended)

    @property
    def overlay(self) -> Overlay:
        return Overlay(self.cleared, self.entries)

    @property
    def tokens(self) -> list[str]:
        """The staged large values' tokens."""
        return list(self.staged)


class Snapshot(TreeView):
    """Reads at one commit of the page."""

    def __init__(self, page: Page, c: Commit) -> None:
        super().__init__(page.objects, page.nodes, c.root)
        self.commit = c


class Transaction(View):
    """An explicit journal: reads its base commit plus its own writes; one commit.

    The base is the page's head when the transaction starts (at ``async with``
    or its first operation), after every write acknowledged before is committed.
    """

    def __init__(self, page: Page) -> None:
        self._memory: dict[bytes, bytes] = {}  # pieces of small values, by digest
        super().__init__(page.objects.overlaid(self._memory), page.nodes)
        self.page = page
        self._base: Commit | None = None
        self.id = f"E{time.time_ns():020d}{uuid.uuid4().hex[:12]}"
        self._state_ = _TxnState()
        self.commit_id: bytes | None = None

    @property
    def base(self) -> Commit:
        if self._base is None:
            raise TransactionClosedError("the transaction has not started")
        return self._base

    async def start(self) -> Transaction:
        """Fix the base (done by ``async with`` and by the first operation)."""
        if self._base is None:
            await self.page.flush()
            if self._base is None:
                self._base = self.page.head
                if self._state_.open:  # not rolled back while the page flushed
                    self._state_.counted = True
                    self.page._transactions += 1
        return self

    def _state(self) -> tuple[bytes, Overlay]:
        return self.base.root, self._state_.overlay

    async def get_entry(self, key: bytes) -> Entry | None:
        await self.start()
        return await super().get_entry(key)

    async def iter_entries(
        self,
        start: bytes | None = None,
        end: bytes | None = None,
        prefix: bytes | None = None,
        token: bytes | None = None,
    ) -> AsyncIterator[Entry]:
        await self.start()
        async for e in super().iter_entries(start, end, prefix, token):
            yield e

    async def _check(self) -> None:
        if not self._state_.open:
            raise TransactionClosedError()
        await self.start()
        if not self._state_.open:  # committed or rolled back while it started
            raise TransactionClosedError()

    async def put(self, key: bytes, value: Source, priority: Priority = Priority.EAGER) -> None:
        """Small values stay in memory until commit; large ones and streams are staged."""
        await self._check()
        key = check_key(key)
        if type(value) is bytes and len(value) <= split.MIN_CHUNK:  # the common case
            entry, piece = _one_chunk(key, value, priority)
            st = self._state_
            if piece is not None:
                st.pieces[entry.value] = [piece]
                self._memory[piece.digest] = piece.data
            st.entries[key] = entry
            return
        entry, pieces, token = await self.page._prepare(key, value, priority)
        st = self._state_
        if not st.open:  # committed or rolled back while the value was being staged
            await self.page._discard_tokens([token] if token else [])
            raise TransactionClosedError()
        if token is not None:
            st.staged[token] = entry.value
        if pieces:
            st.pieces[entry.value] = pieces
            self._memory.update((p.digest, p.data) for p in pieces)
        st.entries[key] = entry

    async def delete(self, key: bytes) -> None:
        await self._check()
        self._state_.entries[check_key(key)] = None

    async def clear(self) -> None:
        await self._check()
        self._state_.cleared = True
        self._state_.entries.clear()

    async def commit(self) -> bytes | None:
        """Commit; returns the new commit id (None if the transaction changed nothing)."""
        await self._check()
        self._state_.open = False
        try:
            # Shielded: once started, a commit completes (memory and database agree)
            # even if the caller is cancelled, e.g. by a client disconnecting.
            self.commit_id = await asyncio.shield(self.page._committing_task(self))
        finally:
            self._ended()
        return self.commit_id

    async def rollback(self) -> None:
        if not self._state_.open:
            return
        self._state_.open = False
        try:
            await self.page._discard_tokens(self._state_.tokens)
        finally:
            self._ended()

    def _ended(self) -> None:
        """The page no longer counts this transaction as under way."""
        if self._state_.counted:
            self._state_.counted = False
            self.page._transactions -= 1
            self.page.last_used = time.monotonic()

    async def __aenter__(self) -> Transaction:
        return await self.start()

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if et is None and self._state_.open:
            await self.commit()
        elif self._state_.open:
            await asyncio.shield(self.rollback())


class Page(View):
    """One page. Obtain it from :class:`store.repository.Ledger`; close it when done."""

    def __init__(self, ledger: bytes, page_id: bytes, db: Database) -> None:
        objects = ObjectStore(db)
        super().__init__(objects, NodeStore(_Nodes(objects)))
        self.ledger = ledger
        self.id = page_id
        self.db = db
        self._commits: dict[bytes, Commit] = {}
        self._heads: list[Commit] = []
        self._overlay = NO_OVERLAY
        self._journal: str | None = None
        self._journal_rows = 0  # rows the implicit journal has staged (entries, pieces)
        self._pending: list[_Write] = []
        self._wake = asyncio.Event()
        self._worker: asyncio.Task[None] | None = None
        self._commit_lock = asyncio.Lock()
        self._watchers: set[Watcher] = set()
        self._closed = False
        self.commit_listeners: list[Callable[[Commit], None]] = []
        self.policy = merge.Policy.LAST_ONE_WINS
        self.resolver: merge.Resolver | None = None
        """Answers merges that need one (AUTOMATIC_WITH_FALLBACK, CUSTOM)."""
        self.pending_conflict: str | None = None
        self.on_close: list[Callable[[Page], None]] = []
        self._leases = 0
        self._transactions = 0  # started and neither committed nor rolled back
        # Transaction commits under way, each with an event set once flushers need not
        # wait for it any longer: when it is done, or when its merge asks a resolver.
        self._committing: dict[asyncio.Task[bytes | None], asyncio.Event] = {}
        self._asking = 0  # merges waiting for a resolver's answer
        self.last_used = time.monotonic()
        """When a lease on the page last ended (or it was opened); see :meth:`lease`."""
        self.handed_out = 0
        """How many times :meth:`Repository.open_page` returned this page."""

    # -- opening and closing ---------------------------------------------------

    @classmethod
    async def open(
        cls, path: Path, ledger: bytes, page_id: bytes, *, synchronous: Synchronous = "NORMAL"
    ) -> Page:
        db = await Database.open(path, create_page_schema, synchronous=synchronous)
        page = cls(ledger, page_id, db)
        try:
            await page._recover()
        except BaseException:
            await db.close()
            raise
        return page

    async def _recover(self) -> None:
        collected = await self.objects.recover()
        rows = await self.db.read_all("SELECT value FROM page_metadata WHERE name = 'merge_policy'")
        if rows:
            try:
                self.policy = merge.Policy(bytes(rows[0][0]).decode())
            except ValueError:
                log.warning("page %r has an unknown merge policy; using last-one-wins", self.id)
        rows = await self.db.read_all("SELECT commit_id FROM heads")
        if not rows:
            await self.db.run(
                lambda conn: sql.insert_commit(conn, commit.FIRST, unsynced=False), write=True
            )
        ids = [bytes(r[0]) for r in rows] or [commit.FIRST.id]
        self._heads = sorted([await self.load_commit(i) for i in ids], key=_order)
        journals = await self.db.read_all(
            "SELECT id, cleared FROM journals WHERE substr(id, 1, 1) = 'I' ORDER BY id"
        )
        for jid, cleared in journals:
            entries = await self.db.read_all(
                "SELECT key, value, priority FROM journal_entries WHERE journal_id = ?", (jid,)
            )
            changes = [
                (bytes(k), None if v is None else Entry(bytes(k), bytes(v), Priority(p)))
                for k, v, p in entries
            ]
            self._journal = str(jid)
            self._journal_rows = INLINE_MAX_ROWS + 1  # its pieces are unknown: not inline
            self._overlay = Overlay(bool(cleared), dict(changes))
            log.info(
                "committing implicit journal %s left by a crash (%d entries)", jid, len(changes)
            )
            await self._commit_journal()
        if collected or journals:
            log.info("page %r recovered: %d staged pieces collected", self.id, collected)
        if len(self._heads) > 1:
            async with self._commit_lock:
                await self._merge_heads()

    @property
    def closed(self) -> bool:
        return self._closed

    @contextlib.contextmanager
    def lease(self, *, use: bool = True) -> Iterator[Page]:
        """Hold the page open for the block: :meth:`Repository.close_idle` never
        closes a page while someone holds a lease on it. Unless ``use`` is false
        (a look that should not keep the page open, like a status listing), the
        page counts as used when the lease ends."""
        self._check_open()
        self._leases += 1
        try:
            yield self
        finally:
            self._leases -= 1
            if use:
                self.last_used = time.monotonic()

    @property
    def idle(self) -> bool:
        """Nobody holds the page and nothing is under way in it: closing it now
        would interrupt nobody (no lease, watcher, transaction, queued write,
        uncommitted journal or commit in progress)."""
        return not (
            self._leases
            or self._watchers
            or self._transactions
            or self._committing
            or self._pending
            or self._journal is not None
            or self._commit_lock.locked()
            or (self._worker is not None and not self._worker.done())
        )

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"page {self.id!r} is closed")

    async def close(self) -> None:
        """Finish queued writes, end watchers, close the database.

        Once begun, closing completes even if the caller is cancelled (a page left
        half closed would keep its connections, threads and files)."""
        if self._closed:
            return
        self._closed = True
        await asyncio.shield(self._close())

    async def _close(self) -> None:
        if self._worker is not None:
            await asyncio.gather(self._worker, return_exceptions=True)
        async with self._commit_lock:  # let an in-flight commit or merge finish
            pass
        for w in list(self._watchers):
            w.close()
        await self.db.close()
        for cb in self.on_close:
            cb(self)

    async def __aenter__(self) -> Page:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- state -----------------------------------------------------------------

    @property
    def head(self) -> Commit:
        """The head reads are served from: the latest (timestamp, then id) of the heads."""
        return self._heads[-1]

    def _state(self) -> tuple[bytes, Overlay]:
        return self.head.root, self._overlay

    async def heads(self) -> list[Commit]:
        return list(self._heads)

    async def load_commit(self, cid: bytes) -> Commit:
        c = self._commits.get(cid)
        if c is None:
            rows = await self.db.read_all("SELECT data FROM commits WHERE id = ?", (cid,))
            if not rows:
                raise CommitNotFoundError(f"commit {cid.hex()} is not in page {self.id!r}")
            c = commit.decode(bytes(rows[0][0]), cid)
            self._commits[cid] = c
        return c

    async def snapshot(self, commit_id: bytes | None = None) -> Snapshot:
        """Reads at ``commit_id`` (any commit of the page), or at the current head."""
        c = self.head if commit_id is None else await self.load_commit(commit_id)
        return Snapshot(self, c)

    async def log(self, start: bytes | None = None) -> AsyncIterator[Commit]:
        """Commits from the heads (or ``start``) back to the first, newest generation first."""
        tops = self._heads if start is None else [await self.load_commit(start)]
        heap = [(-c.generation, -c.timestamp, c.id) for c in tops]
        heapq.heapify(heap)
        seen = {c.id for c in tops}
        while heap:
            _, _, cid = heapq.heappop(heap)
            c = await self.load_commit(cid)
            yield c
            for pid in c.parents:
                if pid not in seen:
                    seen.add(pid)
                    p = await self.load_commit(pid)
                    heapq.heappush(heap, (-p.generation, -p.timestamp, p.id))

    async def history(self, limit: int = 100, start: bytes | None = None) -> list[Commit]:
        out: list[Commit] = []
        async for c in self.log(start):
            if len(out) >= limit:
                break
            out.append(c)
        return out

    # -- plain writes ----------------------------------------------------------

    async def put(self, key: bytes, value: Source, priority: Priority = Priority.EAGER) -> None:
        """Set ``key`` to ``value`` (bytes, an async iterator of bytes, or a file Path)."""
        await self.write([(key, value)], priority=priority)

    async def delete(self, key: bytes) -> None:
        await self.write([(key, None)])

    async def clear(self) -> None:
        """Delete every entry (one commit)."""
        self._check_open()
        await self._submit(_Write(True, [], [], [], asyncio.get_running_loop().create_future()))

    async def write(
        self,
        changes: Iterable[tuple[bytes, Source | None] | tuple[bytes, Source | None, Priority]],
        priority: Priority = Priority.EAGER,
    ) -> None:
        """Many puts (value) and deletes (None) that land in one commit.

        Each change is ``(key, value)`` or ``(key, value, priority)``.
        """
        self._check_open()
        prepared: list[tuple[bytes, Entry | None]] = []
        pieces_of: dict[bytes, list[split.Piece]] = {}  # value root digest -> its pieces
        staged: dict[str, bytes] = {}  # token -> its value's root digest
        small = split.MIN_CHUNK
        try:
            for change in changes:
                key, value = change[0], change[1]
                if type(key) is not bytes or len(key) > KEY_LIMIT:
                    key = check_key(key)
                prio = change[2] if len(change) == 3 else priority
                if value is None:
                    prepared.append((key, None))
                    continue
                if type(value) is bytes and len(value) <= small:  # the common case
                    entry, piece = _one_chunk(key, value, prio)
                    if piece is not None:
                        pieces_of[entry.value] = [piece]
                    prepared.append((key, entry))
                    continue
                entry, more, token = await self._prepare(key, value, prio)
                if more:
                    pieces_of[entry.value] = more
                if token is not None:
                    staged[token] = entry.value
                prepared.append((key, entry))
        except BaseException:
            await self._discard_tokens(list(staged))
            raise
        # The last change to a key wins: values overwritten within this same write
        # are not stored.
        live = {e.value for e in dict(prepared).values() if e is not None}
        pieces, tokens = await self._only_live(live, pieces_of, staged)
        loop = asyncio.get_running_loop()
        direct = len(prepared) >= DIRECT_BATCH
        await self._submit(
            _Write(False, prepared, pieces, tokens, loop.create_future(), direct=direct)
        )

    async def _prepare(
        self, key: bytes, value: Source, priority: Priority
    ) -> tuple[Entry, list[split.Piece], str | None]:
        """Split a value: in memory if small (pieces returned), else staged (token returned)."""
        if isinstance(value, bytes | bytearray | memoryview) and len(value) <= SMALL_VALUE:
            if len(value) > 65536:
                pieces, root = await asyncio.to_thread(split.split_bytes, bytes(value))
            else:
                pieces, root = split.split_bytes(bytes(value))
            return Entry(key, root.digest, _priority(priority)), pieces, None
        if isinstance(value, bytes | bytearray | memoryview | Path | AsyncIterable):
            token, ref = await self.objects.stage_value(value)
            return Entry(key, ref.digest, _priority(priority)), [], token
        raise InvalidArgumentError(
            f"a value is bytes, an async iterator of bytes or a Path, not {type(value).__name__}"
        )

    async def _only_live(
        self, live: set[bytes], pieces_of: dict[bytes, list[split.Piece]], staged: dict[str, bytes]
    ) -> tuple[list[split.Piece], list[str]]:
        """The pieces (held in memory) and staged tokens of the values in ``live``,
        by value root digest; staged values not in it are discarded."""
        pieces = [p for root in live for p in pieces_of.get(root, ())]
        await self._discard_tokens([t for t, root in staged.items() if root not in live])
        return pieces, [t for t, root in staged.items() if root in live]

    async def _discard_tokens(self, tokens: list[str]) -> None:
        for t in tokens:
            await asyncio.shield(self.objects.discard(t))

    async def flush(self) -> None:
        """Wait until every acknowledged plain write is committed, and every
        transaction commit under way has finished (with the merge it may need).
        While a merge waits for a resolver, return at once instead: every commit
        waits for that merge, and the resolver itself may be the one flushing.

        Only the write worker commits the implicit journal; this queues a marker
        that it resolves after its next commit attempt (raising if that failed).
        """
        if self._committing:  # their own outcome is their committers' to report
            await asyncio.gather(*(e.wait() for e in list(self._committing.values())))
        if self._asking:
            return  # commits wait for a merge that waits for a resolver (see _asker)
        if self._closed or (self._journal is None and not self._pending):
            return
        loop = asyncio.get_running_loop()
        await self._submit(_Write(False, [], [], [], loop.create_future(), flush=True))

    async def _submit(self, w: _Write) -> None:
        self._check_open()
        self._pending.append(w)
        self._wake.set()
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._run_writes(), name=f"page-writes-{self.id!r}")
        await asyncio.shield(w.done)

    async def _run_writes(self) -> None:
        """The page's write worker: the only code that appends to or commits the journal.

        Group commit: after appending, the worker keeps appending while writes keep
        coming and commits the journal once they pause for ``COMMIT_DELAY``, once it
        holds ``MAX_JOURNAL_ENTRIES`` keys, or at once when someone flushes.
        """
        while True:
            if not self._pending:
                if self._journal is None:
                    return
                if not self._closed and len(self._overlay.entries) < MAX_JOURNAL_ENTRIES:
                    # Wait for more writes or COMMIT_DELAY, whichever comes first (a
                    # timer rather than wait_for: no task per pause on the hot path).
                    self._wake.clear()
                    timer = asyncio.get_running_loop().call_later(COMMIT_DELAY, self._wake.set)
                    try:
                        await self._wake.wait()
                    finally:
                        timer.cancel()
                    if self._pending:
                        continue
                if not await self._try_commit([]):
                    return  # the journal stays; the next write, flush or open retries
                continue
            if self._pending[0].direct:
                w = self._pending.pop(0)
                await self._commit_direct(w)
                continue
            cut = next((i for i, w in enumerate(self._pending) if w.direct), len(self._pending))
            batch, self._pending = self._pending[:cut], self._pending[cut:]
            writes = [w for w in batch if not w.empty]
            flushes = [w for w in batch if w.empty]
            try:
                if writes:
                    await self._append(writes)
            except BaseException as e:
                for w in writes:
                    if not w.done.done():
                        w.done.set_exception(e)
                    for t in w.tokens:
                        await asyncio.shield(self.objects.discard(t))
                if not isinstance(e, Exception):
                    raise
            for w in writes:
                if not w.done.done():
                    w.done.set_result(None)
            if flushes or len(self._overlay.entries) >= MAX_JOURNAL_ENTRIES:
                await self._try_commit(flushes)

    async def _commit_direct(self, w: _Write) -> None:
        """A large batch becomes one commit of its own, after the journal's."""
        try:
            if self._journal is not None:
                await self._commit_journal()
            async with self._commit_lock:
                base = self.head
                builder = Builder(self.nodes)
                root = await builder.apply(EMPTY if w.clear else base.root, w.changes)
                if root == base.root:
                    await self._discard_tokens(w.tokens)
                else:
                    c = commit.child([base], root)
                    await self._store(c, builder, values=w.pieces, tokens=w.tokens)
        except BaseException as e:
            if not w.done.done():
                w.done.set_exception(e)
            await self._discard_tokens(w.tokens)
            if not isinstance(e, Exception):
                raise
            return
        if not w.done.done():
            w.done.set_result(None)

    async def _try_commit(self, flushes: list[_Write]) -> bool:
        """Commit the journal; tell the flushers how it went. False if it failed."""
        error: Exception | None = None
        try:
            await self._commit_journal()
        except Exception as e:
            log.exception("committing the implicit journal of page %r failed", self.id)
            error = e
        for w in flushes:
            if w.done.done():
                continue
            if error is None:
                w.done.set_result(None)
            else:
                w.done.set_exception(error)
        return error is None

    async def _append(self, batch: list[_Write]) -> None:
        """Append writes to the implicit journal in one transaction (they are durable after)."""
        new = self._journal is None
        jid = self._journal or f"I{time.time_ns():020d}{uuid.uuid4().hex[:12]}"
        base = self.head.id
        pieces = {p.digest: p.data for w in batch for p in w.pieces}  # one row per piece

        def work(conn: sqlite3.Connection) -> None:
            if new:
                conn.execute(
                    "INSERT INTO journals (id, base, cleared) VALUES (?, ?, 0)", (jid, base)
                )
            for w in batch:
                if w.clear:
                    conn.execute("UPDATE journals SET cleared = 1 WHERE id = ?", (jid,))
                    conn.execute("DELETE FROM journal_entries WHERE journal_id = ?", (jid,))
                if w.changes:
                    conn.executemany(
                        "INSERT OR REPLACE INTO journal_entries (journal_id, key, value, priority) "
                        "VALUES (?, ?, ?, ?)",
                        [
                            (jid, k, None if e is None else e.value, 0 if e is None else e.priority)
                            for k, e in w.changes
                        ],
                    )
                for t in w.tokens:
                    sql.adopt(conn, t, jid)
            if pieces:
                sql.put_pieces(conn, pieces.items(), TRANSIENT)
                conn.executemany(
                    "INSERT OR IGNORE INTO journal_pieces (journal_id, digest) VALUES (?, ?)",
                    [(jid, d) for d in pieces],
                )

        # Staged values (tokens) and clears move rows in proportion to their size.
        rows = sum(len(w.changes) for w in batch) + len(pieces)
        if any(w.tokens or w.clear for w in batch):
            rows += INLINE_MAX_ROWS + 1
        small = fits_inline(rows, sum(map(len, pieces.values())))
        await self.db.run(work, write=True, small=small)
        self._journal_rows = rows + (0 if new else self._journal_rows)
        self.objects.remember(pieces.items())  # read-your-writes
        overlay = self._overlay
        for w in batch:
            overlay = overlay.with_changes(w.clear, w.changes)
        self._journal = jid
        self._overlay = overlay

    async def _commit_journal(self) -> None:
        async with self._commit_lock:
            jid, overlay = self._journal, self._overlay
            if jid is None:
                return
            base = self.head
            builder = Builder(self.nodes)
            root = await builder.apply(
                EMPTY if overlay.cleared else base.root, overlay.entries.items()
            )
            if root == base.root:
                await self.db.run(lambda conn: sql.drop_journal(conn, jid), write=True)
                await self.objects.discard(jid)
                self._journal, self._overlay = None, NO_OVERLAY
                return
            c = commit.child([base], root)
            # Values a later write of this journal replaced are in no commit: their
            # pieces are collected rather than kept (and uploaded) for nothing.
            live = {e.value for e in overlay.entries.values() if e is not None}
            keep = await self.objects.value_pieces(live)
            await self._store(c, builder, journal=jid, keep=keep)

    # -- commits ---------------------------------------------------------------

    async def _store(
        self,
        c: Commit,
        builder: Builder,
        *,
        journal: str | None = None,
        keep: set[bytes] | None = None,
        values: list[split.Piece] | None = None,
        tokens: list[str] | None = None,
        notify: bool = True,
    ) -> None:
        """Write a new local commit with its new nodes and move heads. Lock held.

        With ``journal`` (the implicit journal being committed), the pieces it
        staged become local if they are in ``keep`` and are collected if not.
        Watchers are told unless ``notify`` is false (the caller merges first and
        tells them once about the merged result). Shielded from cancellation so the
        in-memory heads always match the database.
        """
        await asyncio.shield(
            self._store_unshielded(
                c, builder, journal, keep or set(), values or [], tokens or [], notify
            )
        )

    async def _store_unshielded(
        self,
        c: Commit,
        builder: Builder,
        journal: str | None,
        keep: set[bytes],
        values: list[split.Piece],
        tokens: list[str],
        notify: bool,
    ) -> None:
        # One row per distinct piece: many entries may share a value.
        pieces = list({p.digest: p for p in builder.pieces_reachable(c.root) + values}.values())
        old_root = self.head.root

        def work(conn: sqlite3.Connection) -> None:
            # Pieces are (digest, data) tuples already: no row is built in Python.
            sql.put_pieces(conn, pieces, LOCAL)
            sql.insert_commit(conn, c)
            for token in tokens:
                sql.mark_local(conn, token)
            if journal is not None:
                sql.keep_journal_pieces(conn, journal, keep)
                sql.drop_journal(conn, journal)

        # A commit of a few keys writes a few nodes: inline (see Database.run).
        small = (
            not tokens
            and (journal is None or fits_inline(self._journal_rows, 0))
            and fits_inline(len(pieces), sum(len(p.data) for p in pieces))
        )
        await self.db.run(work, write=True, small=small)
        if len(values) < DIRECT_BATCH:  # a large batch would only push the others out
            self.objects.remember(values)  # pieces are (digest, data) pairs
        self._commits[c.id] = c
        heads = [h for h in self._heads if h.id not in c.parents]
        heads.append(c)
        self._heads = sorted(heads, key=_order)
        if journal is not None:
            self._journal, self._overlay = None, NO_OVERLAY
        for cb in self.commit_listeners:
            try:
                cb(c)
            except Exception:
                log.exception("commit listener failed")
        if notify:
            await self._notify_change(old_root)

    async def _notify_change(self, old_root: bytes) -> None:
        new_root = self.head.root
        if self._watchers and new_root != old_root:
            await self._notify(self.head.id, old_root, new_root)

    async def _notify(self, cid: bytes, old_root: bytes, new_root: bytes) -> None:
        changes = [ch async for ch in btree.diff(self.nodes, old_root, new_root)]
        for w in list(self._watchers):
            changed: list[ChangedEntry] = []
            deleted: list[bytes] = []
            for ch in changes:
                if not ch.key.startswith(w.prefix):
                    continue
                if ch.new is None:
                    deleted.append(ch.key)
                    continue
                size = await self.objects.size(ch.new.value)
                value = None
                if size <= WATCH_VALUE_LIMIT:
                    with contextlib.suppress(StoreError):
                        value = await self.objects.read_all(ch.new.value)
                changed.append(ChangedEntry(ch.key, value, ch.new.priority, size))
            if changed or deleted:
                w.queue.put_nowait(Notification(cid, changed, deleted))

    # -- transactions ----------------------------------------------------------

    def transaction(self) -> Transaction:
        """A transaction on the current head: ``async with page.transaction() as txn:``."""
        self._check_open()
        return Transaction(self)

    def _committing_task(self, txn: Transaction) -> asyncio.Task[bytes | None]:
        """Commit ``txn`` in a task of its own, which :meth:`flush` waits for."""
        task = asyncio.ensure_future(self._commit_transaction(txn))
        settled = asyncio.Event()
        if self._asking:
            settled.set()  # it waits for a merge that waits for a resolver
        self._committing[task] = settled

        def done(t: asyncio.Task[bytes | None]) -> None:
            settled.set()
            del self._committing[t]

        task.add_done_callback(done)
        return task

    async def _commit_transaction(self, txn: Transaction) -> bytes | None:
        st = txn._state_
        async with self._commit_lock:
            if self._closed:
                await self._discard_tokens(st.tokens)
                raise ClosedError(f"page {self.id!r} is closed")
            builder = Builder(self.nodes)
            root = await builder.apply(EMPTY if st.cleared else txn.base.root, st.entries.items())
            if root == txn.base.root:
                await self._discard_tokens(st.tokens)
                return None
            c = commit.child([txn.base], root)
            old_root = self.head.root
            moved = txn.base.id not in {h.id for h in self._heads}
            # Values a later put of the transaction replaced are not stored.
            live = {e.value for e in st.entries.values() if e is not None}
            values, tokens = await self._only_live(live, st.pieces, st.staged)
            st.staged = {t: st.staged[t] for t in tokens}
            await self._store(c, builder, values=values, tokens=tokens, notify=not moved)
            if len(self._heads) > 1:
                await self._merge_heads()
            if moved:
                await self._notify_change(old_root)
            return c.id

    # -- remote commits (sync) ---------------------------------------------------

    async def adopt_remote(
        self, work: Callable[[sqlite3.Connection], None], new: list[Commit]
    ) -> None:
        """Store verified remote commits (``work`` writes them), then merge heads.

        Watchers hear once about the resulting state. Used by :mod:`store.exchange`.
        Shielded: once the write starts, memory follows the database even if the
        caller is cancelled (a sync that timed out).
        """
        await asyncio.shield(self._adopt_remote(work, new))

    async def _adopt_remote(
        self, work: Callable[[sqlite3.Connection], None], new: list[Commit]
    ) -> None:
        async with self._commit_lock:
            if self._closed:
                raise ClosedError(f"page {self.id!r} is closed")
            old_root = self.head.root
            try:
                await self.db.run(work, write=True)
            finally:
                for c in new:
                    self._commits[c.id] = c
                rows = await self.db.read_all("SELECT commit_id FROM heads")
                self._heads = sorted(
                    [await self.load_commit(bytes(r[0])) for r in rows], key=_order
                )
            if len(self._heads) > 1:
                await self._merge_heads()
            await self._notify_change(old_root)

    # -- merging ---------------------------------------------------------------

    async def _merge_heads(self) -> None:
        """Merge until one head remains, under the page's policy. Commit lock held.

        Under AUTOMATIC_WITH_FALLBACK and CUSTOM a merge that needs an answer waits
        for a resolver: without one, or if it fails or times out, the heads stay
        (reads serve the latest head) and nothing changes. Watchers are not told
        here: the caller tells them about the end result.
        """
        while len(self._heads) > 1:
            a, b = sorted(self._heads, key=lambda h: h.id)[:2]
            builder = Builder(self.nodes)
            base_root = await self._merge_base_root(builder, a, b, {})
            values: list[split.Piece] = []
            if self.policy is merge.Policy.LAST_ONE_WINS:
                root = await merge.last_one_wins(builder, base_root, a, b)
            else:
                try:
                    root = await merge.resolve(
                        builder,
                        base_root,
                        a,
                        b,
                        self.policy,
                        self._asker(a, b) if self.resolver else None,
                        functools.partial(self._new_value, out=values),
                    )
                except merge.NeedsResolver as e:
                    self.pending_conflict = str(e)
                    log.info("page %r keeps %d heads: %s", self.id, len(self._heads), e)
                    return
                except Exception as e:  # a resolver that failed or vanished changes nothing
                    self.pending_conflict = f"resolver failed: {type(e).__name__}: {e}"
                    log.warning("page %r: %s", self.id, self.pending_conflict)
                    return
            m = commit.merge([a, b], root)
            log.debug(
                "merging heads %s and %s into %s", a.id.hex()[:12], b.id.hex()[:12], m.id.hex()[:12]
            )
            await self._store(m, builder, values=values, notify=False)
        self.pending_conflict = None

    def _asker(
        self, left: Commit, right: Commit
    ) -> Callable[[list[merge.Conflict]], Awaitable[dict[bytes, merge.Choice]]]:
        async def ask(conflicts: list[merge.Conflict]) -> dict[bytes, merge.Choice]:
            assert self.resolver is not None
            req = merge.MergeRequest(self.ledger, self.id, left, right, self.policy, conflicts)
            # While a resolver is asked (holding the commit lock), flush waits for no
            # commit: the resolver may well read the page, and so flush, before it
            # answers, and every commit waits for this merge.
            self._asking += 1
            for settled in self._committing.values():
                settled.set()
            try:
                return await asyncio.wait_for(self.resolver(req), RESOLVER_TIMEOUT)
            finally:
                self._asking -= 1

        return ask

    def _new_value(
        self, key: bytes, data: bytes, like: Entry | None, out: list[split.Piece]
    ) -> Entry:
        pieces, root = split.split_bytes(data)
        out.extend(pieces)
        return Entry(key, root.digest, like.priority if like else Priority.EAGER)

    async def try_merge(self) -> bool:
        """Merge pending heads now (e.g. when a resolver arrives). True if one head remains."""
        async with self._commit_lock:
            if self._closed:
                return False
            old_root = self.head.root
            await self._merge_heads()
            await self._notify_change(old_root)
        return len(self._heads) == 1

    async def set_policy(self, policy: merge.Policy) -> None:
        """Remember the page's merge policy (and merge now if that settles pending heads)."""
        value = policy.value.encode()
        await self.db.run(
            lambda conn: conn.execute(
                "INSERT OR REPLACE INTO page_metadata (name, value) VALUES ('merge_policy', ?)",
                (value,),
            ),
            write=True,
        )
        self.policy = policy
        if len(self._heads) > 1:
            await self.try_merge()

    async def _merge_base_root(
        self, builder: Builder, a: Commit, b: Commit, virtual: dict[bytes, Commit]
    ) -> bytes:
        """Root of the merge base; several common ancestors are merged first (recursively)."""

        async def load(cid: bytes) -> Commit:
            return virtual[cid] if cid in virtual else await self.load_commit(cid)

        bases = await merge.common_ancestors(load, a, b)
        acc = bases[0]
        for other in bases[1:]:
            root_base = await self._merge_base_root(builder, acc, other, virtual)
            root = await merge.last_one_wins(builder, root_base, acc, other)
            acc = commit.merge([acc, other], root)
            virtual[acc.id] = acc
        return acc.root

    # -- watchers --------------------------------------------------------------

    def watch(self, prefix: bytes = b"") -> Watcher:
        """Notifications of every later commit that changes keys under ``prefix``."""
        self._check_open()
        w = Watcher(self, check_key(prefix))
        self._watchers.add(w)
        return w


_PRIORITY = {
    Priority.EAGER: Priority.EAGER,
    Priority.LAZY: Priority.LAZY,
    0: Priority.EAGER,
    1: Priority.LAZY,
}


def _priority(p: object) -> Priority:
    """``p`` as a Priority (EAGER or LAZY, or 0 or 1); anything else is refused."""
    try:
        return _PRIORITY[p]  # type: ignore[index]
    except (KeyError, TypeError):
        raise InvalidArgumentError(f"a priority is EAGER (0) or LAZY (1), not {p!r}") from None


# Made without the named tuple's Python-level __new__ (a batch makes one per value).
_new_piece = functools.partial(tuple.__new__, split.Piece)


def _one_chunk(key: bytes, value: bytes, priority: int) -> tuple[Entry, split.Piece | None]:
    """Entry and piece of a value that is a single chunk (at most ``split.MIN_CHUNK``
    bytes); no piece when the value is inline in its digest."""
    d = dg.value_chunk_digest(value)
    piece = _new_piece((d, value)) if len(value) > dg.INLINE_LIMIT else None
    return btree.new_entry((key, d, _priority(priority))), piece


def _order(c: Commit) -> tuple[int, bytes]:
    return (c.timestamp, c.id)
