"""A page: an ordered byte map with history, stored in its own SQLite database.

:class:`Page` is a façade: it opens and closes the page, counts who holds it,
serves reads of its current state, and hands each job to the part that owns it:

=============================  ====================================================
:mod:`store.page.writer`       plain writes: the implicit journal, group commit
:mod:`store.page.transaction`  transactions (explicit journals)
:mod:`store.page.graph`        commits, heads, storing a commit (the commit lock)
:mod:`store.page.conflicts`    merge policy, merging heads, adopting remote commits
:mod:`store.page.watch`        watchers and their notifications
:mod:`store.page.stamps`       versionstamps: the page's stamp clock
:mod:`store.page.view`         reads over a root plus an overlay
:mod:`store.pieces.objects`    pieces and values
=============================  ====================================================

What a page reaches outside the store (fetching pieces, resolvers, telling sync
about commits) is given when it opens: the repository passes its
:class:`store.page.hooks.PageHooks`.
Reads see the head plus the implicit journal's acknowledged writes, so a caller
always reads its own writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from pathlib import Path

from ledgerd.store.errors import (
    HistoryPrunedError,
    InvalidArgumentError,
    TransactionClosedError,
    named,
)
from ledgerd.store.page.conflicts import RESOLVER_TIMEOUT, Conflicts, KeyConflict, Take
from ledgerd.store.page.graph import DIRECT_BATCH, CommitGraph
from ledgerd.store.page.lifetime import PageLifetime
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
from ledgerd.store.sqlite import collection
from ledgerd.store.sqlite.db import Database, Synchronous
from ledgerd.store.sqlite.schema import create_page_schema
from ledgerd.store.tree import dots, merge
from ledgerd.store.tree.btree import NodeStore, Priority
from ledgerd.store.tree.commit import FIRST, Commit

log = logging.getLogger(__name__)

FetchPieces = Callable[["Page", list[bytes]], Awaitable[dict[bytes, bytes]]]
"""Brings pieces this device does not store (:meth:`store.page.hooks.PieceFetcher.fetch_pieces`)."""
CommitCallback = Callable[["Page", Commit], None]
"""Told of every commit the page stores (:meth:`store.page.hooks.CommitListener.page_committed`)."""

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


class Page(PageLifetime, View):
    """One page. Obtain it from :class:`store.repo.repository.Ledger`; close it when done."""

    def __init__(
        self,
        ledger: bytes,
        page_id: bytes,
        db: Database,
        *,
        fetch: FetchPieces | None = None,
        on_commit: CommitCallback | None = None,
        resolvers: merge.ResolverSource | None = None,
        txn_memory: int = TXN_MEMORY,
        max_watch_queue: int = MAX_WATCH_QUEUE,
        max_watch_queue_bytes: int = MAX_WATCH_QUEUE_BYTES,
        on_close: Callable[[Page], None] | None = None,
        device_id: bytes = b"",
        cache: Cache | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        cache = cache if cache is not None else Cache()
        objects = ObjectStore(
            db,
            fetcher=None if fetch is None else lambda ds: fetch(self, ds),
            cache=cache.space(),
        )
        super().__init__(objects, NodeStore(_Nodes(objects), cache.space()))
        self.ledger = ledger
        self.id = page_id
        self.db = db
        self._on_commit = on_commit
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
        self._build_parts(device_id, resolvers, txn_memory, clock)

    def _build_parts(
        self,
        device_id: bytes,
        resolvers: merge.ResolverSource | None,
        txn_memory: int,
        clock: Callable[[], float],
    ) -> None:
        """Make the parts the page hands its jobs to: its commit graph, stamp clock,
        journal writer, conflicts and transactions."""
        objects, page_id, db, ledger = self.objects, self.id, self.db, self.ledger
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
            resolvers,
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
        fetch: FetchPieces | None = None,
        on_commit: CommitCallback | None = None,
        resolvers: merge.ResolverSource | None = None,
        txn_memory: int = TXN_MEMORY,
        max_watch_queue: int = MAX_WATCH_QUEUE,
        max_watch_queue_bytes: int = MAX_WATCH_QUEUE_BYTES,
        on_close: Callable[[Page], None] | None = None,
        device_id: bytes = b"",
        cache: Cache | None = None,
        settle: bool = True,
        clock: Callable[[], float] = time.time,
    ) -> Page:
        """Open the page's database (``fetch``, ``on_commit`` and ``resolvers``: what it
        reaches outside the store, see :mod:`store.page.hooks`; ``on_close`` is called
        once it is closed: the
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
            fetch=fetch,
            on_commit=on_commit,
            resolvers=resolvers,
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

    def _committed(self, c: Commit) -> None:
        if self._on_commit is not None:
            try:
                self._on_commit(self, c)
            except Exception:
                log.exception("commit listener failed")

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
        pruned = commit_id is not None and c not in self.graph.heads
        if pruned and await collection.is_pruned(self.db, c.id):
            raise HistoryPrunedError(
                f"commit {c.id.hex()} of page {self.id!r} is older than the page's "
                "history retention: its contents are no longer kept"
            )
        snap = Snapshot(self, c)
        self._readers.add(snap)  # what it reads is kept while it lives (store.page.gc)
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
        self._readers.add(txn)  # its base is kept while it lives (store.page.gc)
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
