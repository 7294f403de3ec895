"""Transactions: explicit journals that read a fixed base and make one commit.

This module owns a transaction's state (its base, its changes, the values it
holds in memory or has staged) and committing it. A transaction reads its base
commit plus its own writes. Small values live in memory, up to the page's
``txn_memory`` budget per transaction; larger ones, streams, and everything past
the budget are staged in SQLite as transient pieces. Committing creates one commit
on the head; its writes supersede what the transaction saw (its base), and writes
made since (on this device or imported) that it did not see stay beside its own as
siblings (:mod:`store.tree.dots`), as if they had come from another device. Rollback, an
exception, or a crash discards everything the transaction staged.

Versionstamped keys and values (:mod:`store.page.stamps`) are held apart from the
other changes and completed at commit, under the commit lock, all with one stamp
(they differ by the user version, as in FoundationDB). Their stamp is known only
then: :meth:`Transaction.set_versionstamped_key` returns nothing, and after
:meth:`Transaction.commit` the transaction's ``versionstamp`` and
``versionstamped_keys`` hold the stamp and the completed keys. As in FoundationDB,
the transaction cannot read what it stamps: a stamped key is not among its
entries, and reading a key whose value it stamps raises
:class:`~store.page.stamps.VersionstampError`.
"""

from __future__ import annotations

import asyncio
import operator
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from types import TracebackType

from ledgerd.store.errors import ClosedError, TransactionClosedError, named
from ledgerd.store.page import staging, view
from ledgerd.store.page.graph import CommitGraph, Work
from ledgerd.store.page.staging import new_piece
from ledgerd.store.page.stamps import StampClock, StampedKey, StampedValue, VersionstampError
from ledgerd.store.page.view import Overlay, View, bounds, check_key
from ledgerd.store.pieces import digest as dg
from ledgerd.store.pieces import split
from ledgerd.store.pieces.objects import ObjectStore, Source
from ledgerd.store.tree import btree, commit, dots, join
from ledgerd.store.tree.btree import Builder, Entry, NodeStore, Priority, RawEntry, new_entry
from ledgerd.store.tree.commit import Commit

_VALUE = operator.itemgetter(1)  # an entry's value digest

TXN_MEMORY = 64 * 1024 * 1024
"""Bytes of small values a transaction keeps in memory; past that it stages them."""


@dataclass(slots=True)
class _TxnState:
    cleared: bool = False
    entries: dict[bytes, Entry | None] = field(default_factory=dict)
    pieces: dict[bytes, list[split.Piece]] = field(default_factory=dict)  # by value digest
    staged: dict[str, bytes] = field(default_factory=dict)  # token -> its value's digest
    memory: int = 0  # bytes of pieces held in memory
    stamped_keys: list[tuple[StampedKey, Entry]] = field(default_factory=list)
    stamped_values: dict[bytes, tuple[StampedValue, Priority]] = field(default_factory=dict)
    open: bool = True
    counted: bool = False  # counted in Transactions.open (started, not ended)
    also: Callable[[Commit], Work] | None = None  # more work in the commit's SQLite transaction
    also_small: bool = True

    @property
    def overlay(self) -> Overlay:
        return Overlay(self.cleared, self.entries)


class Transactions:
    """The transactions of one page: how many are under way, and committing them."""

    def __init__(
        self,
        name: bytes,
        objects: ObjectStore,
        nodes: NodeStore,
        graph: CommitGraph,
        clock: StampClock,
        flush_writes: Callable[[], Awaitable[None]],
        flush_journal: Callable[[], Awaitable[None]],
        settle: Callable[[], Awaitable[bool]],
        touched: Callable[[], None],
        is_closed: Callable[[], bool],
        memory_budget: int = TXN_MEMORY,
    ) -> None:
        self.name = name
        self.objects = objects
        self.nodes = nodes
        self.graph = graph
        self.clock = clock
        self._flush_writes = flush_writes
        self._flush_journal = flush_journal
        self._settle = settle
        self._touched = touched
        self._is_closed = is_closed
        self.memory_budget = memory_budget
        self.open = 0
        """Transactions started and neither committed nor rolled back."""
        # Commits under way, each with an event set once it is stored (flush waits
        # for that, not for the merge that may follow).
        self._committing: dict[asyncio.Task[bytes | None], asyncio.Event] = {}

    @property
    def busy(self) -> bool:
        return bool(self.open or self._committing)

    def begin(self) -> Transaction:
        return Transaction(self)

    async def flush(self) -> None:
        """Wait until every transaction commit under way is stored."""
        if self._committing:
            await asyncio.gather(*(e.wait() for e in list(self._committing.values())))

    def committing(self, txn: Transaction) -> asyncio.Task[bytes | None]:
        """Commit ``txn`` in a task of its own, which :meth:`flush` waits for."""
        stored = asyncio.Event()
        task = asyncio.ensure_future(self._commit(txn, stored))
        self._committing[task] = stored

        def done(t: asyncio.Task[bytes | None]) -> None:
            stored.set()
            del self._committing[t]

        task.add_done_callback(done)
        return task

    async def _commit(self, txn: Transaction, stored: asyncio.Event) -> bytes | None:
        st = txn.state
        graph = self.graph
        await self._flush_journal()  # plain writes acknowledged before it come first
        async with graph.lock:
            if self._is_closed():
                await staging.discard(self.objects, st.staged)
                raise ClosedError(f"page {named(self.name)} is closed")
            entries, at = st.entries, None
            if st.stamped_keys or st.stamped_values:
                entries = dict(entries)
                at = await self._stamp(txn, entries)
            head, base = graph.head, txn.base
            ts = graph.next_time(at)
            builder = Builder(self.nodes)
            changes = await staging.stamped(
                self.nodes, base.root, entries, graph.dot(ts), cleared=st.cleared
            )
            if head.id != base.id:  # the page moved: what the transaction did not see stays
                changes = await _onto_moved(builder, base.root, head, changes, graph.ctx, txn)
            root = await builder.apply(head.root, changes)
            if root == head.root:
                await staging.discard(self.objects, st.staged)
                return None
            c = commit.child(head, root, ts)
            # Values a later put of the transaction replaced are not stored.
            live = set(map(_VALUE, filter(None, entries.values())))  # (None: a delete)
            values, tokens = await staging.only_live(self.objects, live, st.pieces, st.staged)
            st.staged = {t: st.staged[t] for t in tokens}
            also = None if st.also is None else st.also(c)
            await graph.store(
                c,
                builder,
                values=values,
                tokens=tokens,
                also=also,
                also_small=st.also_small,
                ctx={**graph.ctx, graph.tag: c.timestamp},
                changed=changes,
            )
        stored.set()
        if graph.conflicts:  # writes it did not see stay beside its own: a resolver may decide
            await self._settle()
        return c.id

    async def _stamp(self, txn: Transaction, entries: dict[bytes, Entry | None]) -> int:
        """Complete the transaction's stamped keys and values into ``entries`` with one
        new stamp (commit lock held); returns the stamp's time."""
        st = txn.state
        t, stamp = self.clock.next()
        keys = []
        for template, e in st.stamped_keys:
            key = template.complete(stamp)
            entries[key] = new_entry((key, e.value, e.priority))
            keys.append(key)
        for key, (value, prio) in st.stamped_values.items():
            entry, pieces, _ = await staging.prepare(self.objects, key, value.complete(stamp), prio)
            st.pieces[entry.value] = pieces  # in memory: stamped values are small
            entries[key] = entry
        txn.versionstamp, txn.versionstamped_keys = stamp, keys
        return t

    def started(self, st: _TxnState) -> None:
        st.counted = True
        self.open += 1

    def ended(self, st: _TxnState) -> None:
        if st.counted:
            st.counted = False
            self.open -= 1
            self._touched()


class Transaction(View):
    """An explicit journal: reads its base commit plus its own writes; one commit.

    The base is the page's head when the transaction starts (at ``async with``
    or its first operation), after every write acknowledged before is committed.
    """

    def __init__(self, txns: Transactions) -> None:
        self._memory: dict[bytes, bytes] = {}  # pieces of small values, by digest
        super().__init__(txns.objects.overlaid(self._memory), txns.nodes)
        self._txns = txns
        self._base: Commit | None = None
        self._ctx: dots.Context = {}
        self.id = f"E{time.time_ns():020d}{uuid.uuid4().hex[:12]}"
        self.state = _TxnState()
        self.commit_id: bytes | None = None
        self.versionstamp: bytes | None = None
        """The ten bytes that completed the transaction's versionstamped keys and values
        (set by its commit; None before, or without any)."""
        self.versionstamped_keys: list[bytes] = []
        """The keys given to :meth:`set_versionstamped_key`, completed, in that order
        (set by the commit)."""

    @property
    def seen(self) -> dots.Context:
        """The context of the transaction's base: the writes it has seen."""
        return self._ctx

    @property
    def base(self) -> Commit:
        if self._base is None:
            raise TransactionClosedError("the transaction has not started")
        return self._base

    async def start(self) -> Transaction:
        """Fix the base (done by ``async with`` and by the first operation)."""
        if self._base is None:
            await self._txns._flush_writes()
            if self._base is None:
                self._base = self._txns.graph.head
                self._ctx = self._txns.graph.ctx
                if self.state.open:  # not rolled back while the page flushed
                    self._txns.started(self.state)
        return self

    def _state(self) -> tuple[bytes, Overlay]:
        return self.base.root, self.state.overlay

    async def get_entry(self, key: bytes) -> Entry | None:
        await self.start()
        if key in self.state.stamped_values:
            raise _unreadable(key)
        return await super().get_entry(key)

    async def entry_runs(
        self,
        start: bytes | None = None,
        end: bytes | None = None,
        prefix: bytes | None = None,
        token: bytes | None = None,
    ) -> AsyncIterator[Sequence[RawEntry]]:
        await self.start()
        if self.state.stamped_values:
            lo, hi = bounds(start, end, prefix, token)
            for key in self.state.stamped_values:
                if lo <= key and (hi is None or key < hi):
                    raise _unreadable(key)
        async for run in super().entry_runs(start, end, prefix, token):
            yield run

    async def _check(self) -> None:
        if not self.state.open:
            raise TransactionClosedError()
        await self.start()
        if not self.state.open:  # committed or rolled back while it started
            raise TransactionClosedError()

    async def put(self, key: bytes, value: Source, priority: Priority = Priority.EAGER) -> None:
        """Small values stay in memory until commit (within the page's budget); large
        ones, streams, and values past the budget are staged."""
        await self.put_many(((key, value),), priority)

    async def put_many(
        self, items: Iterable[tuple[bytes, Source]], priority: Priority = Priority.EAGER
    ) -> None:
        """:meth:`put` of each ``(key, value)`` in order, in one call (a bulk load makes
        no coroutine per value). On an error the puts before it stay in the transaction."""
        st = self.state
        if self._base is None or not st.open:  # else _check has nothing to do
            await self._check()
        prio = staging.priority(priority)
        entries, pieces, memory = st.entries, st.pieces, self._memory
        budget = self._txns.memory_budget
        # The limits read where check_key and one_chunk read them (tests may set them).
        key_limit, inline_limit, chunk_digest = (
            view.KEY_LIMIT,
            dg.INLINE_LIMIT,
            dg.value_chunk_digest,
        )
        # The fast path of :meth:`_in_memory` (a value of one chunk, held in memory:
        # :func:`staging.one_chunk`) written out here: a batch of a thousand documents
        # puts two thousand values, and the calls per value were half the puts' time.
        for key, value in items:
            if type(key) is not bytes or len(key) > key_limit:
                key = check_key(key)
            if type(value) is bytes and len(value) <= split.MIN_CHUNK and st.memory < budget:
                d = chunk_digest(value)
                if len(value) > inline_limit:
                    pieces[d] = [new_piece((d, value))]
                    memory[d] = value
                    st.memory += len(value)
                entry = new_entry((key, d, prio))
            else:
                entry = await self._prepare(key, value, prio)
            if st.stamped_values:
                st.stamped_values.pop(key, None)
            entries[key] = entry

    async def set_versionstamped_key(
        self, key: bytes, value: Source, priority: Priority = Priority.EAGER
    ) -> None:
        """Set the key that ``key`` becomes once its incomplete versionstamp is filled
        in at commit (``key`` ends in the stamp's 4-byte offset, as
        :func:`store.keys.tuple.pack_with_versionstamp` makes it). After the commit the
        completed key is in :attr:`versionstamped_keys`."""
        await self._check()
        template = StampedKey(key)
        entry = await self._prepare(template.template, value, priority)
        self.state.stamped_keys.append((template, entry))

    async def set_versionstamped_value(
        self, key: bytes, value: bytes, priority: Priority = Priority.EAGER
    ) -> None:
        """Set ``key`` to ``value`` with its incomplete versionstamp filled in at commit
        (``value`` ends in the stamp's 4-byte offset; at most
        :data:`store.page.stamps.STAMPED_VALUE_LIMIT` bytes). The transaction cannot read
        ``key`` afterwards."""
        await self._check()
        key = check_key(key)
        template = StampedValue(value)
        self.state.entries.pop(key, None)
        self.state.stamped_values[key] = (template, staging.priority(priority))

    def _in_memory(self, key: bytes, value: Source, priority: Priority) -> Entry | None:
        """The entry of a value of one chunk, its piece held in memory, if ``value`` is
        one and the budget allows; else None (see :meth:`_prepare`)."""
        st = self.state
        if type(value) is not bytes or len(value) > split.MIN_CHUNK:
            return None
        if st.memory >= self._txns.memory_budget:
            return None
        entry, piece = staging.one_chunk(key, value, priority)
        if piece is not None:
            st.pieces[entry.value] = [piece]
            self._memory[piece.digest] = piece.data
            st.memory += len(piece.data)
        return entry

    async def _prepare(self, key: bytes, value: Source, priority: Priority) -> Entry:
        """The entry of ``value``, its pieces held in memory or staged."""
        entry = self._in_memory(key, value, priority)
        if entry is not None:
            return entry
        st = self.state
        in_budget = st.memory < self._txns.memory_budget
        if not in_budget and isinstance(value, bytes | bytearray | memoryview):
            value = _Stream(bytes(value))  # staged, not held
        entry, pieces, token = await staging.prepare(self._txns.objects, key, value, priority)
        if not st.open:  # committed or rolled back while the value was being staged
            await staging.discard(self._txns.objects, [token] if token else [])
            raise TransactionClosedError()
        if token is not None:
            st.staged[token] = entry.value
        if pieces:
            st.pieces[entry.value] = pieces
            self._memory.update((p.digest, p.data) for p in pieces)
            st.memory += sum(len(p.data) for p in pieces)
        return entry

    async def delete(self, key: bytes) -> None:
        await self._check()
        key = check_key(key)
        self.state.stamped_values.pop(key, None)
        self.state.entries[key] = None

    async def clear(self) -> None:
        await self._check()
        self.state.cleared = True
        self.state.entries.clear()
        self.state.stamped_keys.clear()
        self.state.stamped_values.clear()

    async def commit(
        self, *, also: Callable[[Commit], Work] | None = None, also_small: bool = True
    ) -> bytes | None:
        """Commit; returns the new commit id (None if the transaction changed nothing).

        ``also(commit)`` gives work that runs in the SQLite transaction that stores the
        commit (so that a layer's own tables change with it, or not at all);
        ``also_small`` says it is a few rows (see :meth:`CommitGraph.store`)."""
        await self._check()
        self.state.also, self.state.also_small = also, also_small
        self.state.open = False
        try:
            # Shielded: once started, a commit completes (memory and database agree)
            # even if the caller is cancelled, e.g. by a client disconnecting.
            self.commit_id = await asyncio.shield(self._txns.committing(self))
        finally:
            self._txns.ended(self.state)
        return self.commit_id

    async def rollback(self) -> None:
        if not self.state.open:
            return
        self.state.open = False
        try:
            await staging.discard(self._txns.objects, self.state.staged)
        finally:
            self._txns.ended(self.state)

    async def __aenter__(self) -> Transaction:
        return await self.start()

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if et is None and self.state.open:
            await self.commit()
        elif self.state.open:
            await asyncio.shield(self.rollback())


def _unreadable(key: bytes) -> VersionstampError:
    return VersionstampError(
        f"key {key!r} is set to a versionstamped value: it cannot be read in the"
        " transaction that sets it"
    )


class _Stream(AsyncIterator[bytes]):
    """Bytes given as an async iterator of one block, so that they are staged."""

    def __init__(self, data: bytes) -> None:
        self._data: bytes | None = data

    def __aiter__(self) -> _Stream:
        return self

    async def __anext__(self) -> bytes:
        if self._data is None:
            raise StopAsyncIteration
        data, self._data = self._data, None
        return data


async def _onto_moved(
    builder: Builder,
    base_root: bytes,
    head: Commit,
    changes: list[tuple[bytes, RawEntry | None]],
    head_ctx: dots.Context,
    txn: Transaction,
) -> list[tuple[bytes, RawEntry | None]]:
    """A transaction's stamped changes (made on ``base_root``) as changes of ``head``,
    which moved since the transaction started: its writes join the head as a delta made
    with what it saw (:func:`store.tree.join.join_delta`); on a document page, each document
    it wrote goes whole, as it saw it."""
    puts = [e for _, e in changes if e is not None]
    if await join.is_document_page(builder, head.root, puts):
        puts = await _whole_documents(builder, base_root, puts)
    out = await join.join_delta(
        builder, head.root, puts, dots.seen_by(head_ctx), dots.seen_by(txn.seen)
    )
    for key, e in changes:  # a clear drops a deleted page's mark it saw
        if e is None:
            mark = await btree.lookup(builder, head.root, key)
            if mark is not None and dots.covers(txn.seen, mark.dot):
                out.append((key, None))
    return out


async def _whole_documents(
    builder: Builder, base_root: bytes, puts: list[RawEntry]
) -> list[RawEntry]:
    """``puts`` with each document key replaced by its document, whole, as the
    transaction saw it (its base, then its writes)."""
    mine = {e[0]: e for e in puts}
    rule = join.group_rule()
    groups = {g for e in puts if (g := rule.group_of(e[0])) is not None}
    out = [e for e in puts if rule.group_of(e[0]) is None]
    for g in sorted(groups):
        seen = {
            e[0]: btree.raw(e)
            async for e in btree.iterate(builder, base_root, g, rule.group_end(g))
        }
        seen.update((k, e) for k, e in mine.items() if k.startswith(g))
        out.extend(seen.values())
    out.sort(key=lambda e: e[0])
    return out
