"""Local materialized views of a document page: secondary indexes and the revision floor.

This module owns the tables the document layer adds to a page's SQLite database,
keeping them equal to the documents of the page's head, and querying the
indexes. Index *definitions* are entries of the page's tree (they travel with the
page, :mod:`store.documents.doclayout`); index *entries* live only here, derived from the
documents, never in the tree and never uploaded.

Everything here reflects one commit, ``doc_state.reflected``. :meth:`Views.catch_up`
brings it to the current head with the tree diff from that commit, so its cost
follows the change, whatever brought it (a local write, a merge, a remote import,
a purge), and writes the new entries and the new ``reflected`` in one SQLite
transaction: after a crash the views are those of the old commit or of the new
one, never a mix, and the next catch-up goes on from there. Once that transaction
has begun, memory follows it even if the caller is cancelled. A write of the
document layer on the commit the views reflect commits through :meth:`Views.commit`:
the records it wrote are exactly the diff, so their rows are made without diffing
or reading the bodies back. They are held in memory (the last of each document)
and stored in the SQLite transaction of a later commit, or before a query, a
catch-up, a definition change or closing; meanwhile ``doc_state`` names the older
commit the stored rows reflect (a crash catches up from it), and a snapshot keeps
the tree of the newer one from history collection. Every query catches up and
stores first, under the same lock, so it reflects exactly the head it runs at.

An index declared on a collection that already has documents is *built*: a scan
of the collection at one commit, a thousand documents per SQLite transaction,
without the lock (writes go on), then, under the lock, the diff from that commit
to ``reflected``. A page that closes stops its builds. An index whose build a
crash or closing interrupted, or whose rows cannot be trusted (its definition
changed, ``reflected`` is not a commit of the page), is built again.
"""

from __future__ import annotations

import asyncio
import logging
import operator
import sqlite3
from collections.abc import Callable, Iterable, Sequence

from ledgerd.store.documents import doclayout, docrows
from ledgerd.store.documents.docheld import Held, to_the_end
from ledgerd.store.documents.docheld import HeldBudget as HeldBudget
from ledgerd.store.documents.docindexdef import (
    KEY_FORMAT,
    IndexDef,
    IndexRow,
    Row,
    definition,
    plan_changes,
)
from ledgerd.store.documents.doclayout import DocId, Record
from ledgerd.store.documents.docrows import HELD_ROW_OVERHEAD as HELD_ROW_OVERHEAD
from ledgerd.store.documents.docrows import Bodies, Defs
from ledgerd.store.errors import ClosedError, StoreError, named
from ledgerd.store.page.page import Page, Snapshot, Transaction
from ledgerd.store.sqlite import docindex_sql, schema
from ledgerd.store.sqlite.docindex_sql import INSERT_ROWS as INSERT_ROWS  # (bench.docs's)
from ledgerd.store.tree.btree import EMPTY
from ledgerd.store.tree.commit import Commit

log = logging.getLogger(__name__)

SMALL_ROWS = 16
"""A commit with at most this many index rows may be stored inline (see
:meth:`store.page.graph.CommitGraph.store`)."""

BUILD_CHUNK = 1000
"""Documents per SQLite transaction while an index is built."""

HELD_BYTES = 2 * 1024 * 1024
"""Memory the index rows of one page's document writes may take before they are
stored with a write (see :meth:`Views.commit`): ``DocumentStore.open(held_index_bytes=...)``."""


class Views:
    """The document layer's local state of one page."""

    def __init__(
        self, page: Page, held_bytes: int = HELD_BYTES, budget: HeldBudget | None = None
    ) -> None:
        self.page = page
        self.held_bytes = held_bytes
        self.budget = budget if budget is not None else HeldBudget(held_bytes)
        self.lock = asyncio.Lock()
        self.reflected: bytes | None = None
        """The commit the views reflect, counting the rows held in memory."""
        self.max_rev = b""
        self._held = Held(self.budget)
        """Rows of the commits after the one the database's rows reflect."""
        self._pin: Snapshot | None = None
        """A snapshot of ``reflected`` while the database names an older commit, so
        that :mod:`store.page.gc` keeps its tree (the next catch-up diffs from it)."""
        self.indexes: dict[tuple[str, str], tuple[int, IndexDef, bool]] = {}
        """(collection, name) -> (row id, definition, ready)."""
        self.unreadable: dict[tuple[str, str], ValueError] = {}
        """(collection, name) -> why its definition in the tree cannot be read here:
        FutureLayoutError (a newer ledgerd's) or another ValueError (damaged). Such an
        index has no row in ``doc_indexes`` and no entries here: index maintenance
        passes it over, and its queries are refused until a ledgerd that reads it (or
        a new definition) comes."""
        self._builds: dict[int, asyncio.Task[None]] = {}
        self._closed = False
        """Closing (the page, or the document store): no build starts any more."""

    # -- loading ---------------------------------------------------------------------

    async def load(self) -> None:
        db = self.page.db
        await db.run(schema.create_doc_index_schema, write=True)
        rows = await db.read_all(docindex_sql.STATE)
        state = {r[0]: bytes(r[1]) for r in rows}
        self.reflected = state.get("reflected")
        self.max_rev = state.get("max_rev", b"")
        if state.get("key_format") != KEY_FORMAT:  # rows packed otherwise: built again
            await db.run(_new_key_format, write=True)
        if self.reflected is not None:
            try:
                await self.page.load_commit(self.reflected)
            except StoreError:
                log.warning(
                    "page %s: document views reflect an unknown commit; rebuilt",
                    named(self.page.id),
                )
                await self._reset()
        await self._load_indexes()

    async def _reset(self) -> None:
        def work(conn: sqlite3.Connection) -> None:
            docindex_sql.clear(conn)
            _new_key_format(conn)

        await self.page.db.run(work, write=True)
        self.reflected, self.max_rev, self.indexes = None, b"", {}
        self._held.clear()
        self._pin = None

    async def _load_indexes(self) -> None:
        rows = await self.page.db.read_all(docindex_sql.INDEXES)
        unread: list[int] = []
        for ix, coll, name, raw, ready in rows:
            d = definition(coll, name, bytes(raw))
            if isinstance(d, IndexDef):
                self.indexes[(coll, name)] = (ix, d, bool(ready))
            else:  # (an older ledgerd stored what it misread): its rows go
                unread.append(ix)
        if unread:
            await self.page.db.run(lambda conn: docindex_sql.drop_indexes(conn, unread), write=True)
        # Definitions and rows as of `reflected`: the tree's definitions there decide.
        root = EMPTY
        if self.reflected is not None:
            root = (await self.page.load_commit(self.reflected)).root
        want = await docrows.tree_definitions(self.page, root)
        changes: Defs = []
        for name, (_, d, ready) in self.indexes.items():
            if want.get(name) != d.raw or not ready:
                changes.append((name, None))  # stale or half built: built again
        changes.extend((name, raw) for name, raw in want.items())
        await self._apply_definitions(changes)

    # -- definitions -----------------------------------------------------------------

    async def _apply_definitions(self, changes: Defs) -> None:
        """Drop removed or changed indexes, add new ones (not ready) and start their builds.

        The views in memory follow the database only once it has the change, and
        follow it even if the caller is cancelled meanwhile (the SQLite transaction
        goes on to its end): the caller may be the build of an index this drops, which
        it cancels; that task then ends at its next wait, not in the middle of this."""
        if not changes:
            return
        await self._store_held()  # the held rows' indexes may be dropped
        current = {name: (ix, d) for name, (ix, d, _) in self.indexes.items()}
        dropped, added, unreadable = plan_changes(current, self.unreadable, changes)

        def work(conn: sqlite3.Connection) -> list[int]:
            docindex_sql.drop_indexes(conn, dropped)
            return docindex_sql.add_indexes(conn, [(c, n, d.raw) for (c, n), d in added.items()])

        async def store() -> None:
            self._adopt_definitions(dropped, added, await self.page.db.run(work, write=True))
            self.unreadable = unreadable

        await to_the_end(store())

    def _adopt_definitions(
        self, dropped: list[int], added: dict[tuple[str, str], IndexDef], ids: list[int]
    ) -> None:
        """The views in memory after :meth:`_apply_definitions` stored its change."""
        gone = set(dropped)
        for name in [name for name, (ix, _, _) in self.indexes.items() if ix in gone]:
            del self.indexes[name]
        for ix in dropped:
            self._cancel(ix)
        for (key, d), ix in zip(added.items(), ids, strict=True):
            self.indexes[key] = (ix, d, False)
            if not (self._closed or self.page.closed):  # closing stops builds: none starts after
                self._start_build(ix, d)

    def _start_build(self, ix: int, d: IndexDef) -> asyncio.Task[None]:
        """Build index ``ix`` in the background. A build that fails is logged here (a
        query waiting for it gets the error too) and the next query starts another."""
        task = asyncio.create_task(self._build(ix, d), name=f"index-{d.collection}/{d.name}")
        self._builds[ix] = task

        def report(t: asyncio.Task[None]) -> None:
            e = None if t.cancelled() else t.exception()  # (retrieved: asyncio stays quiet)
            if e is not None and not isinstance(e, ClosedError):  # closing is no failure
                log.error(
                    "page %s: building index %s/%s failed (the next query builds it again)",
                    named(self.page.id),
                    d.collection,
                    d.name,
                    exc_info=e,
                )

        task.add_done_callback(report)
        return task

    def _cancel(self, ix: int) -> None:
        task = self._builds.pop(ix, None)
        if task is not None:
            task.cancel()

    def definitions(self, collection: str) -> list[IndexDef]:
        return [d for (coll, _), (_, d, _) in self.indexes.items() if coll == collection]

    async def page_closing(self) -> None:
        """Store the rows held in memory, and release them even if that fails: the page
        is closing (after a failure, opening it again catches up from the stored rows).
        A write under way holds the lock until its rows are held: they are stored too.
        Then stop the builds under way (opening the page again builds them again)."""
        self._closed = True
        try:
            async with self.lock:
                await self._store_held()
        finally:
            if self._held.rows:  # not stored: the views reflect what the database holds
                self.reflected = self._held.since
            self._held.clear()
            self._pin = None
            await self._stop_builds()

    async def close(self) -> None:
        """Store the held rows (releasing them even if that fails, as
        :meth:`page_closing`), stop the builds and wait for the store under way."""
        self._closed = True
        try:
            if not self.page.closed:
                await self.page_closing()
        finally:
            await self._stop_builds()

    async def _stop_builds(self) -> None:
        """Cancel the builds under way and wait for them to end."""
        tasks = list(self._builds.values())
        self._builds.clear()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- catching up -----------------------------------------------------------------

    async def catch_up(self, *, store: bool = False) -> Commit:
        """Bring every ready view to the page's head (by the tree diff from the commit
        they reflect); returns that head. With ``store``, the rows held in memory are
        stored too."""
        async with self.lock:
            head = await self._catch_up()
            if store:
                await self._store_held()
            return head

    def _check_open(self) -> None:
        """ClosedError once the page or the document store is closing: these views no
        longer follow the page (a store opened again has views of its own)."""
        if self._closed or self.page.closed:
            raise ClosedError(f"page {self.page.id!r}: the document store is closed")

    async def _catch_up(self) -> Commit:
        self._check_open()
        head = self.page.head
        if head.id == self.reflected:
            return head
        ready = self._ready()
        old = (
            EMPTY if self.reflected is None else (await self.page.load_commit(self.reflected)).root
        )
        rows, max_rev, defs = await docrows.read_diff(self.page, old, head.root, ready)
        max_rev = max(self.max_rev, max_rev)
        await to_the_end(self._reflect(head.id, rows, max_rev, defs))
        return head

    async def _reflect(
        self,
        cid: bytes,
        rows: list[Row],
        max_rev: bytes,
        defs: Defs,
    ) -> None:
        """Store ``rows`` with the held ones as of commit ``cid``; then the views in memory
        reflect it and follow its definition changes. Run to its end (:func:`to_the_end`):
        once the database names ``cid``, memory must too (the older commit may no longer
        be kept), and the definitions must follow (the next diff starts at ``cid``)."""
        await self.page.db.run(_storing(self._held.then(rows), cid, max_rev), write=True)
        self.reflected, self.max_rev = cid, max_rev
        self._held.clear()
        self._pin = None
        await self._apply_definitions(defs)

    async def _store_held(self) -> None:
        """Store the rows held in memory (lock held): the database's rows then reflect
        ``reflected``."""
        if self._held.rows:
            assert self.reflected is not None
            rows = self._held.then([])
            await self.page.db.run(_storing(rows, self.reflected, self.max_rev), write=True)
            self._held.clear()
            self._pin = None

    def _ready(self) -> list[tuple[int, IndexDef]]:
        """The indexes that are built: (row id, definition)."""
        return [(ix, d) for ix, d, ready in self.indexes.values() if ready]

    async def commit(
        self, txn: Transaction, records: Sequence[tuple[str, DocId, Record]]
    ) -> bytes | None:
        """Commit a transaction of the document layer that put ``records`` (collection,
        document id, record: every body it wrote) and nothing else the views read.

        If the views reflect the transaction's base, the commit is exactly the base
        plus these documents: their rows are made from the records and the views
        reflect the commit. The rows are held in memory, and stored in the SQLite
        transaction of the commit that would take them over ``held_bytes``, or its page's
        share over the budget shared with other pages: a thousand random
        index keys dirty most pages of the ordered index, so storing eight batches at
        once writes about a sixth of the pages. A query, a definition, a catch-up or
        closing stores them first; after a crash the database's rows reflect an older
        commit, and the catch-up diffs from there. Otherwise the next catch-up diffs,
        as for any commit."""
        async with self.lock:
            self._check_open()
            if self.reflected != txn.base.id:
                return await txn.commit()
            by_coll = docrows.by_collection(self._ready())
            rows, max_rev, size = docrows.record_rows(
                by_coll, records, self.max_rev, self._held.size
            )
            more = size - self._held.size
            if size > self.held_bytes or self.budget.used + more > self.budget.limit:
                return await to_the_end(self._commit_storing(txn, rows, max_rev))
            # A caller cancelled from here on leaves the views at the base, which the
            # database names or the snapshot of the held rows keeps.
            cid = await txn.commit()
            if cid is not None:
                pin = await self._snapshot(cid)
                self._held.add(rows, size, txn.base.id)
                self._pin = pin
                self.reflected, self.max_rev = cid, max_rev
            return cid

    async def _commit_storing(
        self, txn: Transaction, rows: list[Row], max_rev: bytes
    ) -> bytes | None:
        """Commit ``txn`` with ``rows`` and every held row in its SQLite transaction; then
        the views reflect the commit, nothing held. Run to its end (:func:`to_the_end`):
        once the database names the commit, memory must too (the base may no longer be
        kept)."""
        rows = self._held.then(rows)
        cid = await txn.commit(
            also=lambda c: _storing(rows, c.id, max_rev),
            also_small=len(rows) <= SMALL_ROWS,
        )
        if cid is not None:
            self._held.clear()
            self._pin = None
            self.reflected, self.max_rev = cid, max_rev
        return cid

    async def _snapshot(self, cid: bytes) -> Snapshot:
        """A snapshot of commit ``cid``, just made: without a pause if it is the head."""
        if self.page.head.id == cid:
            return await self.page.snapshot()
        return await self.page.snapshot(cid)

    # -- building --------------------------------------------------------------------

    async def _build(self, ix: int, d: IndexDef) -> None:
        try:
            async with self.lock:
                start = await self._catch_up()
            snap = await self.page.snapshot(start.id)
            start_key = doclayout.collection_prefix(d.collection)
            end_key = doclayout.collection_end(d.collection)
            chunk: Bodies = []
            async for e in snap.iter_entries(start=start_key, end=end_key):
                k = doclayout.parse_doc_key(e.key)
                if k is not None and k.part == doclayout.BODY:
                    chunk.append((k, e))
                if len(chunk) >= BUILD_CHUNK:
                    await self._store_chunk(ix, d, chunk)
                    chunk = []
            await self._store_chunk(ix, d, chunk)
            async with self.lock:
                if self.indexes.get((d.collection, d.name), (None,))[0] != ix:
                    return  # dropped meanwhile
                await self._store_held()
                now = self.reflected
                assert now is not None
                root = (await self.page.load_commit(now)).root
                rows, _, _ = await docrows.read_diff(self.page, start.root, root, [(ix, d)])

                def work(conn: sqlite3.Connection) -> None:
                    _write_rows(conn, rows)
                    docindex_sql.mark_ready(conn, ix)

                await self.page.db.run(work, write=True)
                self.indexes[(d.collection, d.name)] = (ix, d, True)
                log.info("page %s: index %s/%s built", named(self.page.id), d.collection, d.name)
        finally:
            if self._builds.get(ix) is asyncio.current_task():
                del self._builds[ix]

    async def _store_chunk(self, ix: int, d: IndexDef, chunk: Bodies) -> None:
        rows = await docrows.body_rows(self.page, chunk, {d.collection: [(ix, d)]})
        if rows:
            await self.page.db.run(lambda conn: _write_rows(conn, rows), write=True)

    async def index(self, collection: str, name: str) -> tuple[int, IndexDef] | None:
        """A ready index (waiting for its build), or None if there is no such index."""
        while True:
            found = self.indexes.get((collection, name))
            if found is None:
                return None
            ix, d, ready = found
            if ready:
                return ix, d
            task = self._builds.get(ix)
            if task is None:  # cancelled or failed: build it again
                self._check_open()  # closing: no build starts after
                task = self._start_build(ix, d)
            await asyncio.wait({task})  # (its cancellation is not this caller's)
            if not task.cancelled():  # cancelled: dropped or redefined, look again
                task.result()  # its failure, if it failed

    async def rebuild(self, collection: str, name: str) -> bool:
        """Build an index again from the documents; False if there is no such index."""
        async with self.lock:
            await self._catch_up()
            # Read under the lock: a catch-up that waited for it may have redefined or
            # dropped the index meanwhile.
            found = self.indexes.get((collection, name))
            if found is None:
                return False
            raw = found[1].raw
            await self._apply_definitions([((collection, name), None), ((collection, name), raw)])
        return await self.index(collection, name) is not None

    # -- queries ---------------------------------------------------------------------

    async def query(
        self,
        ix: int,
        d: IndexDef,
        lo: bytes,
        hi: bytes | None,
        after: tuple[bytes, bytes] | None,
        limit: int,
        include_deleted: bool,
    ) -> tuple[Commit, list[IndexRow]] | None:
        """Rows with ``lo <= key < hi`` after ``after`` (key, doc), in (key, doc) order,
        as of the head (which is returned); None if the catch-up under the lock found
        the ready index ``ix`` (defined as ``d``) dropped or redefined: look it up again."""
        sql = docindex_sql.rows_query(
            below=hi is not None, after=after is not None, include_deleted=include_deleted
        )
        params: list[object] = [ix, lo]
        if hi is not None:
            params.append(hi)
        if after is not None:
            params.extend(after)
        params.append(limit)
        async with self.lock:
            head = await self._catch_up()
            if self.indexes.get((d.collection, d.name)) != (ix, d, True):
                return None
            await self._store_held()
            rows = await self.page.db.read_all(sql, params)
        return head, [IndexRow(docrows.doc_id(r[0]), bytes(r[1])) for r in rows]


def _storing(
    rows: list[Row], reflected: bytes, max_rev: bytes
) -> Callable[[sqlite3.Connection], None]:
    """The SQLite work that stores ``rows`` and the views' new state."""
    state = [("reflected", reflected), ("max_rev", max_rev)]

    def work(conn: sqlite3.Connection) -> None:
        _write_rows(conn, rows)
        docindex_sql.put_state(conn, state)

    return work


def _new_key_format(conn: sqlite3.Connection) -> None:
    """Every index is to be built again (its rows packed as :data:`KEY_FORMAT` packs)."""
    docindex_sql.new_key_format(conn, KEY_FORMAT)


def _write_rows(conn: sqlite3.Connection, rows: Iterable[Row]) -> None:
    rows = list(rows)
    drop = [(ix, doc) for ix, doc, key, _ in rows if key is None]
    put = [row for row in rows if row[2] is not None]
    put.sort(key=_IN_INDEX_ORDER)  # neighbours in the ordered index are written together
    docindex_sql.write_rows(conn, drop, put)


_IN_INDEX_ORDER = operator.itemgetter(0, 2, 1)  # (ix, key, doc)
