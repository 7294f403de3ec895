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
import contextlib
import logging
import math
import operator
import sqlite3
from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from ledgerd.store.documents import doclayout
from ledgerd.store.documents.doclayout import DocId, Record, State
from ledgerd.store.documents.docmodel import MISSING, lookup_path
from ledgerd.store.errors import ClosedError, InvalidArgumentError, StoreError, named
from ledgerd.store.keys import tuple as tup
from ledgerd.store.keys.tuple import encode_float as _encode_float
from ledgerd.store.keys.tuple import encode_str as _encode_str
from ledgerd.store.page.page import Page, Snapshot, Transaction
from ledgerd.store.page.view import live
from ledgerd.store.sqlite import schema, sql
from ledgerd.store.tree import btree
from ledgerd.store.tree.btree import EMPTY, Entry
from ledgerd.store.tree.commit import Commit

log = logging.getLogger(__name__)

T = TypeVar("T")

SMALL_ROWS = 16
"""A commit with at most this many index rows may be stored inline (see
:meth:`store.page.graph.CommitGraph.store`)."""

ROWS_PER_TURN = 1024
"""Documents a catch-up indexes between two turns it gives the event loop."""

BUILD_CHUNK = 1000
"""Documents per SQLite transaction while an index is built."""

HELD_BYTES = 2 * 1024 * 1024
"""Memory the index rows of one page's document writes may take before they are
stored with a write (see :meth:`Views.commit`): ``DocumentStore.open(held_index_bytes=...)``."""

HELD_ROW_OVERHEAD = 200
"""What a held row takes in memory beyond its key and document id (its dict entry,
tuples and bytes objects), for ``HELD_BYTES``."""

KEY_FORMAT = b"\x02"
"""How index keys are packed, in ``doc_state.key_format``: 2 packs -0.0 as 0.0 (they are
one double to JSON and to a query). Opening a page whose rows were packed otherwise
(no ``key_format``: the first format) builds its indexes again."""

INSERT_ROWS = "INSERT OR REPLACE INTO doc_index_rows (ix, doc, key, deleted)"

Scalar = str | float | bool | None


def _scalar(v: Any) -> tuple[bool, Scalar]:
    """(indexable, the value as indexed): numbers as floats, so 1 and 1.5 sort together;
    an integer past every double (only a query's, documents hold 64-bit ones) as the
    infinity of its sign, as JSON's ``1e400`` is."""
    if v is None or isinstance(v, bool | str):
        return True, v
    if isinstance(v, int | float):
        try:
            return True, float(v) + 0.0  # (-0.0 + 0.0 is 0.0)
        except OverflowError:
            return True, math.inf if v > 0 else -math.inf
    return False, None


@dataclass(frozen=True, slots=True)
class IndexDef:
    """An index: documents of ``collection`` by the value at ``partition`` (then ``sort``)."""

    collection: str
    name: str
    partition: list[str]
    sort: list[str] | None
    raw: bytes  # its definition's bytes in the tree

    def key_of(self, r: Record) -> bytes | None:
        """The index key of a document, or None if it is not indexed (sparse)."""
        if r.state is State.PURGED:
            return None
        # A packed tuple is its elements' encodings one after the other: each value
        # is encoded alone, the common kinds without the generic packer.
        parts = []
        data = r.data
        for path in (self.partition, self.sort):
            if path is None:
                continue
            if len(path) == 1 and type(data) is dict:  # the common case, without a call
                v = data.get(path[0], MISSING)
            else:
                v = lookup_path(data, path)
            kind = type(v)
            if kind is float or kind is int:
                parts.append(_encode_float(float(v) + 0.0))  # -0.0 is indexed as 0.0
            elif kind is str and "/" not in v:
                parts.append(_encode_str(v))
            else:
                if v is MISSING:
                    return None
                ok, s = _scalar(v)
                if not ok or (isinstance(s, str) and "/" in s):
                    return None
                parts.append(tup.pack((s,)))
        return b"".join(parts)

    def reserved_value(self, data: Any) -> str | None:
        """The first indexed string value of ``data`` holding a '/', or None."""
        for path in (self.partition, self.sort):
            if path is None:
                continue
            v = lookup_path(data, path)
            if isinstance(v, str) and "/" in v:
                return ".".join(path)
        return None


@dataclass(frozen=True, slots=True)
class IndexRow:
    doc: DocId
    key: bytes


Row = tuple[int, DocId, bytes | None, bool]
"""An index row to write: (index, document id, key or None to remove it, deleted). A
chosen id (text) is stored as SQLite text, a ULID's bytes as a blob: SQLite orders text
before blobs, so each document keeps one place in the index order."""


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
        self._held = _Held(self.budget)
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
        rows = await db.read_all("SELECT name, value FROM doc_state")
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
            conn.execute("DELETE FROM doc_state")
            conn.execute("DELETE FROM doc_index_rows")
            conn.execute("DELETE FROM doc_indexes")
            _new_key_format(conn)

        await self.page.db.run(work, write=True)
        self.reflected, self.max_rev, self.indexes = None, b"", {}
        self._held.clear()
        self._pin = None

    async def _load_indexes(self) -> None:
        rows = await self.page.db.read_all(
            "SELECT id, collection, name, definition, ready FROM doc_indexes"
        )
        unread: list[int] = []
        for ix, coll, name, raw, ready in rows:
            d = _definition(coll, name, bytes(raw))
            if isinstance(d, IndexDef):
                self.indexes[(coll, name)] = (ix, d, bool(ready))
            else:  # (an older ledgerd stored what it misread): its rows go
                unread.append(ix)
        if unread:

            def drop(conn: sqlite3.Connection) -> None:
                for ix in unread:
                    conn.execute("DELETE FROM doc_index_rows WHERE ix = ?", (ix,))
                    conn.execute("DELETE FROM doc_indexes WHERE id = ?", (ix,))

            await self.page.db.run(drop, write=True)
        # Definitions and rows as of `reflected`: the tree's definitions there decide.
        root = EMPTY
        if self.reflected is not None:
            root = (await self.page.load_commit(self.reflected)).root
        want: dict[tuple[str, str], bytes] = {}
        async for e in btree.iterate(
            self.page.nodes, root, doclayout.INDEXES, btree.prefix_end(doclayout.INDEXES)
        ):
            name = doclayout.parse_index_key(e.key)
            if name is not None and live(e) is not None:
                want[name] = await self.page.objects.read_all(e.value)
        changes: list[tuple[tuple[str, str], bytes | None]] = []
        for name, (_, d, ready) in self.indexes.items():
            if want.get(name) != d.raw or not ready:
                changes.append((name, None))  # stale or half built: built again
        changes.extend((name, raw) for name, raw in want.items())
        await self._apply_definitions(changes)

    # -- definitions -----------------------------------------------------------------

    async def _apply_definitions(self, changes: list[tuple[tuple[str, str], bytes | None]]) -> None:
        """Drop removed or changed indexes, add new ones (not ready) and start their builds.

        The views in memory follow the database only once it has the change, and
        follow it even if the caller is cancelled meanwhile (the SQLite transaction
        goes on to its end): the caller may be the build of an index this drops, which
        it cancels; that task then ends at its next wait, not in the middle of this."""
        if not changes:
            return
        await self._store_held()  # the held rows' indexes may be dropped
        plan = {name: (ix, d) for name, (ix, d, _) in self.indexes.items()}
        added: dict[tuple[str, str], IndexDef] = {}
        dropped: list[int] = []
        unreadable = dict(self.unreadable)
        for name, raw in changes:
            cur = plan.get(name)
            if cur is not None and (raw is None or cur[1].raw != raw):
                del plan[name]
                if added.pop(name, None) is None:
                    dropped.append(cur[0])
            if raw is None or name not in plan:
                unreadable.pop(name, None)
            if raw is not None and name not in plan:
                d = _definition(name[0], name[1], raw)
                if isinstance(d, IndexDef):
                    added[name] = d
                    plan[name] = (0, d)
                else:  # no entries here: see `unreadable`
                    unreadable[name] = d

        def work(conn: sqlite3.Connection) -> list[int]:
            for ix in dropped:
                conn.execute("DELETE FROM doc_index_rows WHERE ix = ?", (ix,))
                conn.execute("DELETE FROM doc_indexes WHERE id = ?", (ix,))
            ids = []
            for (coll, name), d in added.items():
                cur = conn.execute(
                    "INSERT INTO doc_indexes (collection, name, definition, ready)"
                    " VALUES (?, ?, ?, 0)",
                    (coll, name, d.raw),
                )
                assert cur.lastrowid is not None
                ids.append(cur.lastrowid)
            return ids

        async def store() -> None:
            self._adopt_definitions(dropped, added, await self.page.db.run(work, write=True))
            self.unreadable = unreadable

        await _to_the_end(store())

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
        rows, max_rev, defs = await self._changes(old, head.root, ready)
        max_rev = max(self.max_rev, max_rev)
        await _to_the_end(self._reflect(head.id, rows, max_rev, defs))
        return head

    async def _reflect(
        self,
        cid: bytes,
        rows: list[Row],
        max_rev: bytes,
        defs: list[tuple[tuple[str, str], bytes | None]],
    ) -> None:
        """Store ``rows`` with the held ones as of commit ``cid``; then the views in memory
        reflect it and follow its definition changes. Run to its end (:func:`_to_the_end`):
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
            by_coll = _by_collection(self._ready())
            rows: list[Row] = []
            max_rev = self.max_rev
            size = self._held.size
            deleted_state = State.DELETED
            for coll, doc_id, r in records:
                if r.rev > max_rev:
                    max_rev = r.rev
                views = by_coll.get(coll)
                if views is None:
                    continue
                deleted = r.state is deleted_state
                for ix, d in views:
                    key = d.key_of(r)
                    rows.append((ix, doc_id, key, deleted))
                    # what the row takes held in memory (HELD_ROW_OVERHEAD: see there)
                    size += HELD_ROW_OVERHEAD + len(doc_id) + (0 if key is None else len(key))
            more = size - self._held.size
            if size > self.held_bytes or self.budget.used + more > self.budget.limit:
                return await _to_the_end(self._commit_storing(txn, rows, max_rev))
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
        the views reflect the commit, nothing held. Run to its end (:func:`_to_the_end`):
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

    async def _changes(
        self, old: bytes, new: bytes, indexes: list[tuple[int, IndexDef]]
    ) -> tuple[list[Row], bytes, list[tuple[tuple[str, str], bytes | None]]]:
        """Index rows to write, the highest revision among new heads, and the
        definitions that changed, from old to new."""
        by_coll = _by_collection(indexes)
        max_rev = b""
        bodies: list[tuple[doclayout.DocKey, Entry | None]] = []
        defs: list[tuple[tuple[str, str], bytes | None]] = []
        async for c in btree.diff(self.page.nodes, old, new):
            k = doclayout.parse_doc_key(c.key)
            if k is not None:
                if k.part == doclayout.HEAD:
                    h = doclayout.head_of(c.new)
                    if h is not None and h[0] > max_rev:
                        max_rev = h[0]
                elif k.part == doclayout.BODY and k.collection in by_coll:
                    bodies.append((k, live(c.new)))
                continue
            name = doclayout.parse_index_key(c.key)
            if name is not None:
                e = live(c.new)
                defs.append(
                    (name, None if e is None else await self.page.objects.read_all(e.value))
                )
        rows = await self._rows(bodies, by_coll)
        return rows, max_rev, defs

    async def _rows(
        self,
        bodies: list[tuple[doclayout.DocKey, Entry | None]],
        by_coll: dict[str, list[tuple[int, IndexDef]]],
    ) -> list[Row]:
        values = await self.page.objects.read_many(e.value for _, e in bodies if e is not None)
        rows: list[Row] = []
        for i, (k, e) in enumerate(bodies):
            if i % ROWS_PER_TURN == ROWS_PER_TURN - 1:
                await asyncio.sleep(0)  # a large catch-up lets others run meanwhile
            r = None
            if e is not None:
                try:  # (data with no JSON form is indexed: a query names it damaged)
                    r = doclayout.decode_record(values[e.value], json_data=False)
                except ValueError as e:  # damaged, or of a newer layout: in no index
                    log.warning(
                        "page %s: a document body is not indexed: %s", named(self.page.id), e
                    )
            for ix, d in by_coll[k.collection]:
                rows.append(_row(ix, d, k.doc_id, r))
        return rows

    # -- building --------------------------------------------------------------------

    async def _build(self, ix: int, d: IndexDef) -> None:
        try:
            async with self.lock:
                start = await self._catch_up()
            snap = await self.page.snapshot(start.id)
            start_key = doclayout.collection_prefix(d.collection)
            end_key = doclayout.collection_end(d.collection)
            chunk: list[tuple[doclayout.DocKey, Entry | None]] = []
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
                rows, _, _ = await self._changes(start.root, root, [(ix, d)])

                def work(conn: sqlite3.Connection) -> None:
                    _write_rows(conn, rows)
                    conn.execute("UPDATE doc_indexes SET ready = 1 WHERE id = ?", (ix,))

                await self.page.db.run(work, write=True)
                self.indexes[(d.collection, d.name)] = (ix, d, True)
                log.info("page %s: index %s/%s built", named(self.page.id), d.collection, d.name)
        finally:
            if self._builds.get(ix) is asyncio.current_task():
                del self._builds[ix]

    async def _store_chunk(
        self, ix: int, d: IndexDef, chunk: list[tuple[doclayout.DocKey, Entry | None]]
    ) -> None:
        rows = await self._rows(chunk, {d.collection: [(ix, d)]})
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
        sql = "SELECT doc, key FROM doc_index_rows WHERE ix = ? AND key >= ?"
        params: list[object] = [ix, lo]
        if hi is not None:
            sql += " AND key < ?"
            params.append(hi)
        if after is not None:
            sql += " AND (key, doc) > (?, ?)"
            params.extend(after)
        if not include_deleted:
            sql += " AND deleted = 0"
        sql += " ORDER BY key, doc LIMIT ?"
        params.append(limit)
        async with self.lock:
            head = await self._catch_up()
            if self.indexes.get((d.collection, d.name)) != (ix, d, True):
                return None
            await self._store_held()
            rows = await self.page.db.read_all(sql, params)
        return head, [IndexRow(_doc_id(r[0]), bytes(r[1])) for r in rows]


def _doc_id(value: Any) -> DocId:
    """A row's document id as SQLite gives it back: text for a chosen id, else bytes."""
    return value if isinstance(value, str) else bytes(value)


async def _to_the_end(work: Coroutine[Any, Any, T]) -> T:
    """Await ``work`` in a task of its own that the caller's cancellation does not
    reach: a caller cancelled meanwhile waits for it to end, then raises
    CancelledError (rather than the work's own failure, if it failed)."""
    task = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        while not task.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait({task})
        if not task.cancelled():
            task.exception()  # retrieved: the caller's cancellation is what it sees
        raise


class HeldBudget:
    """Memory for the index rows document stores hold (:meth:`Views.commit`), shared
    by the stores given the same budget: the daemon gives every page the one of
    ``max_held_index_bytes``."""

    __slots__ = ("limit", "used")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0


class _Held:
    """Index rows not stored yet: the last of each (index, document), and about what
    they take in memory (counted in a budget)."""

    __slots__ = ("budget", "rows", "since", "size")

    def __init__(self, budget: HeldBudget) -> None:
        self.budget = budget
        self.rows: dict[tuple[int, DocId], tuple[bytes | None, bool]] = {}
        self.size = 0
        self.since: bytes | None = None
        """The commit the stored rows reflect while rows are held."""

    def add(self, rows: Iterable[Row], size: int, base: bytes) -> None:
        """Hold ``rows`` of a commit on ``base``; ``size`` is what the held rows take
        with them."""
        if not self.rows:
            self.since = base
        held = self.rows
        for ix, doc, key, deleted in rows:
            held[(ix, doc)] = (key, deleted)
        self.budget.used += size - self.size
        self.size = size

    def clear(self) -> None:
        self.budget.used -= self.size
        self.rows, self.size = {}, 0

    def then(self, rows: Iterable[Row]) -> list[Row]:
        """The held rows, each replaced by the row of ``rows`` for its document if any."""
        held = dict(self.rows)
        for ix, doc, key, deleted in rows:
            held[(ix, doc)] = (key, deleted)
        return [(ix, doc, key, deleted) for (ix, doc), (key, deleted) in held.items()]


def _by_collection(indexes: list[tuple[int, IndexDef]]) -> dict[str, list[tuple[int, IndexDef]]]:
    by_coll: dict[str, list[tuple[int, IndexDef]]] = {}
    for ix, d in indexes:
        by_coll.setdefault(d.collection, []).append((ix, d))
    return by_coll


def _row(ix: int, d: IndexDef, doc_id: DocId, r: Record | None) -> Row:
    """The row of index ``ix`` for a document whose body is ``r`` (None: no body)."""
    key = None if r is None else d.key_of(r)
    return ix, doc_id, key, r is not None and r.state is State.DELETED


def _storing(
    rows: list[Row], reflected: bytes, max_rev: bytes
) -> Callable[[sqlite3.Connection], None]:
    """The SQLite work that stores ``rows`` and the views' new state."""
    state = [("reflected", reflected), ("max_rev", max_rev)]

    def work(conn: sqlite3.Connection) -> None:
        _write_rows(conn, rows)
        conn.executemany("INSERT OR REPLACE INTO doc_state (name, value) VALUES (?, ?)", state)

    return work


def _new_key_format(conn: sqlite3.Connection) -> None:
    """Every index is to be built again (its rows packed as :data:`KEY_FORMAT` packs)."""
    conn.execute("UPDATE doc_indexes SET ready = 0")
    conn.execute(
        "INSERT OR REPLACE INTO doc_state (name, value) VALUES ('key_format', ?)", (KEY_FORMAT,)
    )


def _write_rows(conn: sqlite3.Connection, rows: Iterable[Row]) -> None:
    rows = list(rows)
    drop = [(ix, doc) for ix, doc, key, _ in rows if key is None]
    conn.executemany("DELETE FROM doc_index_rows WHERE ix = ? AND doc = ?", drop)
    put = [row for row in rows if row[2] is not None]
    put.sort(key=_IN_INDEX_ORDER)  # neighbours in the ordered index are written together
    sql.insert_rows(conn, INSERT_ROWS, put)


def _definition(collection: str, name: str, raw: bytes) -> IndexDef | ValueError:
    """The index a definition's bytes define; the error if they cannot be read here
    (FutureLayoutError: a newer ledgerd's; another ValueError: damaged)."""
    try:
        partition, sort = doclayout.decode_definition(raw)
    except ValueError as e:
        log.warning("index %s/%s is not kept here (%s)", collection, name, e)
        return e
    return IndexDef(collection, name, partition, sort, raw)


def partition_range(
    partition: Any, start: Any, end: Any, d: IndexDef
) -> tuple[bytes, bytes | None]:
    """The keys of one partition value, narrowed to ``start <= sort < end``."""
    try:
        return _partition_range(partition, start, end, d)
    except UnicodeEncodeError:  # a str the tuple layer cannot encode: a lone surrogate
        raise InvalidArgumentError("a query's strings must be UTF-8 text") from None


def _partition_range(
    partition: Any, start: Any, end: Any, d: IndexDef
) -> tuple[bytes, bytes | None]:
    ok, p = _scalar(partition)
    if not ok:
        raise InvalidArgumentError("an index is queried by a string, number, boolean or null")
    prefix = tup.pack((p,))
    if d.sort is None:
        if start is not None or end is not None:
            raise InvalidArgumentError(f"index {d.name!r} has no sort key to range over")
        return prefix, doclayout.elements_end(prefix)
    lo, hi = prefix, doclayout.elements_end(prefix)
    for bound, is_start in ((start, True), (end, False)):
        if bound is None:
            continue
        ok, s = _scalar(bound)
        if not ok:
            raise InvalidArgumentError("a sort range is bounded by scalars")
        if is_start:
            lo = tup.pack((p, s))
        else:
            hi = tup.pack((p, s))
    return lo, hi


_IN_INDEX_ORDER = operator.itemgetter(0, 2, 1)  # (ix, key, doc)
