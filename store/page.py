"""A page: an ordered byte map with history, stored in its own SQLite database.

:class:`Page` is a façade: it opens and closes the page, counts who holds it,
serves reads of its current state, and hands each job to the part that owns it:

=========================  ==================================================
:mod:`store.page.writer`        plain writes: the implicit journal, group commit
:mod:`store.page.transaction`   transactions (explicit journals)
:mod:`store.page.graph`         commits, heads, storing a commit (the commit lock)
:mod:`store.merging`       merge policy, merging heads, adopting remote commits
:mod:`store.page.watch`         watchers and their notifications
:mod:`store.page.stamps`        versionstamps: the page's stamp clock
:mod:`store.page.view`          reads over a root plus an overlay
:mod:`store.pieces.objects`       pieces and values
=========================  ==================================================

What a page reaches outside the store (fetching pieces, resolvers, telling sync
about commits) is given when the repository opens, as :class:`store.page.hooks.PageHooks`.
Reads see the head plus the implicit journal's acknowledged writes, so a caller
always reads its own writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from pathlib import Path

from ledgerd.store.errors import (
    ClosedError,
    HistoryPrunedError,
    InvalidArgumentError,
    TransactionClosedError,
    named,
)
from ledgerd.store.page.conflicts import RESOLVER_TIMEOUT, Conflicts, KeyConflict, Take
from ledgerd.store.page.graph import DIRECT_BATCH, CommitGraph
from ledgerd.store.page.hooks import NO_HOOKS, PageHooks
from ledgerd.store.page.staging import SMALL_VALUE
from ledgerd.store.page.stamps import StampClock, StampedKey, StampedValue
from ledgerd.store.page.transaction import TXN_MEMORY, Transaction, Transactions
from ledgerd.store.page.view import Overlay, TreeView, View, check_key
from ledgerd.store.page.watch import (
    MAX_WATCH_QUEUE,
    MAX_WATCH_QUEUE_BYTES,
    WATCH_VALUE_LIMIT,
    ChangedEntry,
    Notification,
    Watcher,
    Watchers,
)
from ledgerd.store.page.writer import COMMIT_DELAY, MAX_JOURNAL_ENTRIES, Change, JournalWriter
from ledgerd.store.pieces.cache import Cache
from ledgerd.store.pieces.objects import ObjectStore, Source
from ledgerd.store.sqlite.db import Database, Synchronous
from ledgerd.store.sqlite.schema import create_page_schema
from ledgerd.store.tree import dots, merge
from ledgerd.store.tree.btree import NodeStore, Priority
from ledgerd.store.tree.commit import FIRST, Commit

log = logging.getLogger(__name__)

__all__ = [
    "COMMIT_DELAY",
    "DIRECT_BATCH",
    "MAX_JOURNAL_ENTRIES",
    "RESOLVER_TIMEOUT",
    "SMALL_VALUE",
    "WATCH_VALUE_LIMIT",
    "ChangedEntry",
    "Notification",
    "Page",
    "Snapshot",
    "Transaction",
    "Watcher",
]


class _Nodes:
    def __init__(self, objects: ObjectStore) -> None:
        self.objects = objects

    async def read_node_bytes(self, digest: bytes) -> bytes:
        # The node cache keeps the decoded node: its bytes need not stay as a piece.
        return await self.objects.read_all(digest, remember=False)


class Snapshot(TreeView):
    """Reads at one commit of the page."""

    def __init__(self, page: Page, c: Commit) -> None:
        super().__init__(page.objects, page.nodes, c.root)
        self.commit = c


class Page(View):
    """One page. Obtain it from :class:`store.repo.repository.Ledger`; close it when done."""

    def __init__(
        self,
        ledger: bytes,
        page_id: bytes,
        db: Database,
        hooks: PageHooks = NO_HOOKS,
        *,
        txn_memory: int = TXN_MEMORY,
        max_watch_queue: int = MAX_WATCH_QUEUE,
        max_watch_queue_bytes: int = MAX_WATCH_QUEUE_BYTES,
        on_close: Callable[[Page], None] | None = None,
        device_id: bytes = b"",
        cache: Cache | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        fetcher = hooks.fetcher
        cache = cache if cache is not None else Cache()
        objects = ObjectStore(
            db,
            fetcher=None if fetcher is None else lambda ds: fetcher.fetch_pieces(self, ds),
            cache=cache.space(),
        )
        super().__init__(objects, NodeStore(_Nodes(objects), cache.space()))
        self.ledger = ledger
        self.id = page_id
        self.db = db
        self._hooks = hooks
        self._on_close = on_close
        self._closing: list[Callable[[], Awaitable[None]]] = []
        self._closed = False
        self._close_done: asyncio.Future[None] | None = None
        self._leases = 0
        self.on_release: Callable[[Page], None] | None = None
        """Called when the page's last lease ends (the repository: an open waiting
        for room, :meth:`Repository.page`'s ``wait``, looks again)."""
        self._readers: weakref.WeakSet[Snapshot | Transaction] = weakref.WeakSet()
        self.gc_holds = 0
        """Imports checking remote trees without the commit lock: garbage collection
        deletes nothing meanwhile (see :mod:`store.page.gc`)."""
        self.last_used = time.monotonic()
        """When a lease on the page last ended (or it was opened); see :meth:`lease`."""
        self.watchers = Watchers(
            self.nodes, objects, self._touch, max_watch_queue, max_watch_queue_bytes
        )
        clock_us = lambda: int(clock() * 1_000_000)  # noqa: E731
        self.graph = CommitGraph(
            page_id,
            db,
            objects,
            self.nodes,
            self.watchers,
            self._committed,
            tag=dots.tag_of_device(device_id),
            clock_us=clock_us,
        )
        self.stamps = StampClock(device_id, lambda: self.graph.head.timestamp, clock_us)
        """Where the page's versionstamps come from (``device_id``: the repository's)."""
        self.writer = JournalWriter(
            page_id, db, objects, self.nodes, self.graph, self.stamps, self._check_open
        )
        self.conflicts = Conflicts(
            ledger,
            page_id,
            db,
            self.nodes,
            objects,
            self.graph,
            hooks.resolvers,
            lambda: self._closed,
            self.writer.flush,
        )
        self.transactions = Transactions(
            page_id,
            objects,
            self.nodes,
            self.graph,
            self.stamps,
            self.flush,
            self.writer.flush,
            self.conflicts.settle,
            self._touch,
            lambda: self._closed,
            txn_memory,
        )

    # -- opening and closing ---------------------------------------------------

    @classmethod
    async def open(
        cls,
        path: Path,
        ledger: bytes,
        page_id: bytes,
        *,
        synchronous: Synchronous = "NORMAL",
        hooks: PageHooks = NO_HOOKS,
        txn_memory: int = TXN_MEMORY,
        max_watch_queue: int = MAX_WATCH_QUEUE,
        max_watch_queue_bytes: int = MAX_WATCH_QUEUE_BYTES,
        on_close: Callable[[Page], None] | None = None,
        device_id: bytes = b"",
        cache: Cache | None = None,
        settle: bool = True,
        clock: Callable[[], float] = time.time,
    ) -> Page:
        """Open the page's database (``on_close`` is called once it is closed: the
        repository that owns the page's lifetime; ``device_id`` ends its versionstamps;
        ``cache`` is the repository's read cache, shared by its pages: by default the
        page gets one of its own, of the default budget). Several heads left from
        before are merged before it returns, unless ``settle`` is false: the repository
        merges them once the page is published, so that a conflict resolver that opens
        the page gets it rather than waiting for the open that waits for it."""
        db = await Database.open(
            path, create_page_schema, synchronous=synchronous, empty_is_damage=True
        )
        page = cls(
            ledger,
            page_id,
            db,
            hooks,
            txn_memory=txn_memory,
            max_watch_queue=max_watch_queue,
            max_watch_queue_bytes=max_watch_queue_bytes,
            on_close=on_close,
            device_id=device_id,
            cache=cache,
            clock=clock,
        )
        try:
            await page._recover(settle)
        except BaseException:
            await db.close()
            raise
        return page

    async def _recover(self, settle: bool = True) -> None:
        collected = await self.objects.recover()
        await self.conflicts.load_policy()
        await self.graph.load_heads()
        journals = await self.writer.recover()
        if collected or journals:
            log.info("page %s recovered: %d staged pieces collected", named(self.id), collected)
        if settle and self.graph.conflicts:
            await self.conflicts.settle()

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"page {named(self.id)} is closed")

    def _touch(self) -> None:
        self.last_used = time.monotonic()

    def _committed(self, c: Commit) -> None:
        if self._hooks.listener is not None:
            try:
                self._hooks.listener.page_committed(self, c)
            except Exception:
                log.exception("commit listener failed")

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
                self._touch()
            if not self._leases and self.on_release is not None:
                self.on_release(self)

    @property
    def idle(self) -> bool:
        """Nobody holds the page and nothing is under way in it: closing it now
        would interrupt nobody (no lease, watcher, transaction, queued write,
        uncommitted journal, merge or commit in progress)."""
        return self.quiet and not self.writer.busy

    @property
    def quiet(self) -> bool:
        """Nobody holds the page, though acknowledged writes may still wait in its
        journal for their commit: closing it commits them first (:meth:`close`), so a
        close for room interrupts nobody either (a page just written stays busy for
        the journal's commit delay)."""
        return not (
            self._leases
            or self.watchers
            or self.transactions.busy
            or self.graph.lock.locked()
            or self.conflicts.running
        )

    @property
    def unheld(self) -> bool:
        """Nobody holds the page and no merge runs in it, though a commit of its
        journal may be under way (the commit lock held): a close waits for that commit
        (:meth:`_close`), so a close for room interrupts nobody either. (An open for
        room that came during such a commit was refused: 'all 1 open pages are in
        use', 503 in the daemon, though nobody held the page.)"""
        return not (
            self._leases or self.watchers or self.transactions.busy or self.conflicts.running
        )

    async def close(self) -> None:
        """Finish queued writes, end watchers, close the database.

        Once begun, closing completes even if the caller is cancelled (a page left
        half closed would keep its connections, threads and files). A call while the
        page is closing returns once the close has ended, however it ended (so that
        the file is not opened again while this page still writes to it)."""
        if self._closed:
            if self._close_done is not None:
                await asyncio.wait([self._close_done])
            return
        await asyncio.shield(self.start_close())

    def start_close(self) -> asyncio.Future[None]:
        """Begin closing the page, at once (it is :attr:`closed` on return), and return
        what ends when the close has ended (the close under way, if one is)."""
        if self._close_done is None:
            self._closed = True
            self.conflicts.abandon()  # a resolver asked now is no longer waited for
            self._close_done = asyncio.ensure_future(self._close())
            self._close_done.add_done_callback(self._closed_with)
        return self._close_done

    def _closed_with(self, done: asyncio.Future[None]) -> None:
        # Logged here too: a close begun for room (Repository._make_room) has no caller
        # that sees its error. A caller of close() still gets it raised.
        if not done.cancelled() and done.exception() is not None:
            left = self.db.unclosed
            log.error(
                "page %s of ledger %s: closing failed: %s%s",
                named(self.id),
                named(self.ledger),
                done.exception(),
                f" (its {', '.join(left)} connection left open: the page is not opened "
                "again until a close of it succeeds)"
                if left
                else "",
            )

    def when_closing(self, fn: Callable[[], Awaitable[None]]) -> None:
        """Run ``fn`` when the page closes, after its queued writes, before its database
        closes (the document layer stores its held index rows); its errors are logged."""
        self._closing.append(fn)

    def not_when_closing(self, fn: Callable[[], Awaitable[None]]) -> None:
        """Undo :meth:`when_closing`."""
        with contextlib.suppress(ValueError):
            self._closing.remove(fn)

    async def _close(self) -> None:
        try:
            await self.writer.stop()
            for fn in list(self._closing):  # a hook may undo itself, or another
                if fn not in self._closing:
                    continue  # undone meanwhile
                try:
                    await fn()
                except Exception:
                    log.exception("page %s: closing", named(self.id))
        finally:  # its database closes however the steps before ended
            try:
                async with self.graph.lock:  # let an in-flight commit or merge finish
                    pass
                self.watchers.close_all()
                await self.db.close()
            finally:  # closed however it went: its owner stops counting it as open
                if self._on_close is not None:
                    self._on_close(self)

    async def __aenter__(self) -> Page:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- state and history -----------------------------------------------------

    @property
    def head(self) -> Commit:
        """The head reads are served from: the latest (timestamp, then id) of the heads."""
        return self.graph.head

    def _state(self) -> tuple[bytes, Overlay]:
        # Every read starts here: a closed page refuses it, whether or not what it
        # would read is in the shared cache (it answered from the cache, and failed
        # with "database ... is closed" past it).
        self._check_open()
        return self.graph.head.root, self.writer.overlay

    async def heads(self) -> list[Commit]:
        return list(self.graph.heads)

    async def load_commit(self, cid: bytes) -> Commit:
        return await self.graph.load(cid)

    async def find_commit(self, text: str) -> bytes:
        """The id of the commit that ``text`` names: its hex id, or a unique prefix of it
        of 4 digits or more (as git takes them); see :meth:`CommitGraph.find`."""
        return await self.graph.find(text)

    async def snapshot(self, commit_id: bytes | None = None) -> Snapshot:
        """Reads at ``commit_id`` (any commit of the page), or at the current head."""
        c = self.head if commit_id is None else await self.graph.load(commit_id)
        if commit_id is not None and c not in self.graph.heads:
            rows = await self.db.read_all(
                "SELECT 1 FROM pruned_commits WHERE commit_id = ?", (c.id,), small=True
            )
            if rows:
                raise HistoryPrunedError(
                    f"commit {c.id.hex()} of page {self.id!r} is older than the page's "
                    "history retention: its contents are no longer kept"
                )
        snap = Snapshot(self, c)
        self._readers.add(snap)  # what it reads is kept while it lives (store.gc)
        return snap

    def pinned_roots(self) -> set[bytes]:
        """Tree roots that something open on the page may still read: live snapshots,
        transactions' bases, the state watchers last heard about (for :mod:`store.page.gc`)."""
        roots = {self.graph.notified_root}
        for r in list(self._readers):
            if isinstance(r, Snapshot):
                roots.add(r.commit.root)
            else:
                with contextlib.suppress(TransactionClosedError):  # not started: none yet
                    roots.add(r.base.root)
        roots.discard(b"")
        return roots

    def pinned_commits(self) -> set[bytes]:
        """The bases of open transactions: a transaction's commit is merged with the
        heads from its base, so history retention must not prune it (for
        :mod:`store.page.gc`)."""
        ids: set[bytes] = set()
        for r in list(self._readers):
            if not isinstance(r, Snapshot) and r.state.open:  # (an ended one may live on)
                with contextlib.suppress(TransactionClosedError):  # not started: none yet
                    ids.add(r.base.id)
        return ids

    def log(self, start: bytes | None = None) -> AsyncIterator[Commit]:
        """Commits from the heads (or ``start``) back to the first, newest generation first."""
        return self.graph.log(start)

    async def history(self, limit: int = 100, start: bytes | None = None) -> list[Commit]:
        out: list[Commit] = []
        async for c in self.graph.log(start):
            if len(out) >= limit:
                break
            out.append(c)
        return out

    # -- writes ----------------------------------------------------------------

    async def put(self, key: bytes, value: Source, priority: Priority = Priority.EAGER) -> None:
        """Set ``key`` to ``value`` (bytes, an async iterator of bytes, or a file Path).
        None is refused, as :meth:`Transaction.put` refuses it: in :meth:`write` it means
        a delete, which a put of a value that happens to be None must not do."""
        if value is None:
            raise InvalidArgumentError(
                "a value is bytes, an async iterator of bytes or a Path, not NoneType"
            )
        await self.write([(key, value)], priority=priority)

    async def delete(self, key: bytes) -> None:
        await self.write([(key, None)])

    async def clear(self) -> None:
        """Delete every entry (one commit)."""
        self._check_open()
        await self.writer.clear()

    async def delete_page(self) -> None:
        """Delete the page: one commit that removes every entry and marks the page
        deleted (:mod:`store.page.deleted`), synced like any commit. Returns once it is
        committed. Prefer :meth:`store.repo.repository.Repository.delete_page`, which also
        records it for listings of closed pages."""
        self._check_open()
        await self.writer.delete_page()

    @property
    def deleted(self) -> bool:
        """The page is deleted (its head is a deleted page's tree) and no write since
        is waiting to be committed: listings leave it out."""
        return self.graph.deleted and not self.writer.uncommitted

    @property
    def never_written(self) -> bool:
        """The page holds nothing but its first commit, and no merge policy was set on
        it (a policy is remembered without a commit)."""
        return self.graph.head.id == FIRST.id and not self.conflicts.remembered

    async def write(
        self, changes: Iterable[Change], priority: Priority = Priority.EAGER
    ) -> list[bytes]:
        """Many puts (value) and deletes (None) that land in one commit.

        Each change is ``(key, value)`` or ``(key, value, priority)``. A key given as
        :class:`~store.page.stamps.StampedKey`, or a value as
        :class:`~store.page.stamps.StampedValue`, is completed with the write's one
        versionstamp; returns those completed keys and values, in order.

        Deletes alone on a deleted page (which holds no key) change nothing: they are
        not journaled, so that the page does not show in listings meanwhile.
        """
        self._check_open()
        if self.deleted:
            changes = list(changes)
            keys = [k for k, v, *_ in changes if v is None and isinstance(k, bytes)]
            if changes and len(keys) == len(changes):
                for key in keys:
                    check_key(key)
                return []
        return await self.writer.write(changes, priority)

    async def set_versionstamped_key(
        self, key: bytes, value: Source, priority: Priority = Priority.EAGER
    ) -> bytes:
        """Set the key ``key`` becomes once its incomplete versionstamp is filled in
        (``key`` ends in the stamp's 4-byte offset, as
        :func:`store.keys.tuple.pack_with_versionstamp` makes it); returns that key."""
        (done,) = await self.write([(StampedKey(key), value, priority)])
        return done

    async def set_versionstamped_value(
        self, key: bytes, value: bytes, priority: Priority = Priority.EAGER
    ) -> bytes:
        """Set ``key`` to ``value`` with its incomplete versionstamp filled in (``value``
        ends in the stamp's 4-byte offset); returns the value stored."""
        (done,) = await self.write([(key, StampedValue(value), priority)])
        return done

    async def flush(self) -> None:
        """Wait until every acknowledged plain write is committed, and every
        transaction commit under way is stored."""
        await self.transactions.flush()
        if not self._closed:
            await self.writer.flush()

    def transaction(self) -> Transaction:
        """A transaction on the current head: ``async with page.transaction() as txn:``."""
        self._check_open()
        txn = self.transactions.begin()
        self._readers.add(txn)  # its base is kept while it lives (store.gc)
        return txn

    def watch(self, prefix: bytes = b"") -> Watcher:
        """Notifications of every later commit that changes keys under ``prefix``."""
        self._check_open()
        return self.watchers.add(check_key(prefix))

    # -- policy and conflicts ----------------------------------------------------

    @property
    def policy(self) -> merge.Policy:
        return self.conflicts.policy

    @property
    def pending_conflict(self) -> str | None:
        """Why conflicts wait for a resolver (under a policy that asks one), or None."""
        return self.conflicts.pending_conflict

    @property
    def resolution_fetch_failed(self) -> bool:
        """The last resolver round could not read a value it took: run :meth:`try_merge`
        again when the network may be back (the sync engine does, each round)."""
        return self.conflicts.fetch_failed

    @property
    def conflict_count(self) -> int:
        """Keys holding concurrent writes of different values (under every policy)."""
        return self.graph.conflicts

    async def set_policy(self, policy: merge.Policy) -> None:
        """Remember the page's merge policy (and ask a resolver now if it calls for one)."""
        await self.conflicts.set_policy(policy)

    async def list_conflicts(self, start: bytes = b"", limit: int = 1000) -> list[KeyConflict]:
        """The page's conflicts from ``start`` on, in key order (see
        :meth:`Conflicts.listing`)."""
        self._check_open()
        return await self.conflicts.listing(start, limit)

    async def resolve(
        self, key: bytes | None, take: Take, expect: str | None = None
    ) -> list[KeyConflict]:
        """Resolve a key's conflict (every one of the page when ``key`` is None) by
        hand: a write superseding exactly its siblings (see :meth:`Conflicts.resolve`)."""
        self._check_open()
        return await self.conflicts.resolve(key, take, expect)

    async def try_merge(self) -> bool:
        """Ask the resolver about conflicts now (e.g. when one arrives). True if none
        waits for a resolver."""
        if self._closed:
            return False
        return await self.conflicts.settle()
