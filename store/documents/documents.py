"""Documents after Yoda: JSON documents with ULID ids and revisions in a page.

This module owns the operations of the document layer, as an embedded API that
the HTTP API and clients map onto one to one: create, get, replace, soft delete,
purge, listing, attachments, secondary indexes and the changes feed. The model
and its checks are :mod:`store.documents.docmodel`, the layout in the tree
:mod:`store.documents.doclayout`, the local indexes :mod:`store.documents.docindex`,
kept conflicts :mod:`store.documents.docconflicts`; concurrent revisions join by
:func:`store.documents.docjoin.join_group`.

A page is one document store (documents that must change atomically together
share a page); a collection is a key range in it. One :class:`DocumentStore` per
open page (:meth:`DocumentStore.open` hands out the same one): its writes run one
at a time, each a transaction whose reads (the current revision) and writes are
one commit, so an expected ``_rev`` is checked atomically.

Why one module of about 640 lines: it is the document layer's API, one method per
operation that the HTTP API and the clients mirror; the model, the layout and the
indexes are already apart, and splitting the operations would scatter one API.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ledgerd.store.documents import docconflicts, docfind, doclayout, doctoken
from ledgerd.store.documents.docindex import (
    HELD_BYTES,
    HeldBudget,
    IndexDef,
    Views,
    partition_range,
)
from ledgerd.store.documents.doclayout import AttachmentMeta, DocId, Record, State, new_record
from ledgerd.store.documents.docmodel import (
    MAX_DOCUMENT_BYTES,
    MISSING,
    REV_TOLERANCE,
    Attachment,
    AttachmentNotFoundError,
    Document,
    DocumentConflictError,
    DocumentError,
    DocumentNotFoundError,
    DocumentTooLargeError,
    IndexInfo,
    IndexNotFoundError,
    InvalidDocumentError,
    MalformedRecordError,
    RevClock,
    UnsupportedLayoutError,
    check_collection,
    check_data,
    check_index_name,
    check_text,
    id_text,
    parse_id,
    parse_path,
    parse_ulid,
    ulid_ms,
    ulid_text,
)
from ledgerd.store.errors import ClosedError, InvalidArgumentError, StoreError, named
from ledgerd.store.page.page import Page
from ledgerd.store.page.transaction import Transaction
from ledgerd.store.page.view import RangeResult, View
from ledgerd.store.pieces.objects import Source
from ledgerd.store.tree import btree, commit
from ledgerd.store.tree.btree import Priority
from ledgerd.store.tree.commit import Commit
from ledgerd.store.tree.merge import Policy

log = logging.getLogger(__name__)

_stores: weakref.WeakKeyDictionary[Page, DocumentStore] = weakref.WeakKeyDictionary()
"""Each open page's document store. A store refers to its page, so its key never
dies on its own: the store leaves when it or its page closes."""
_opening: weakref.WeakKeyDictionary[Page, asyncio.Lock] = weakref.WeakKeyDictionary()

LIST_LIMIT = 1000
"""Most documents one listing or query returns."""
BULK_LIMIT = LIST_LIMIT * 10
"""Most documents one bulk call (:meth:`DocumentStore.create_many`, :meth:`~DocumentStore.bulk`)
takes."""
NO_REV = bytes(doclayout.ULID_SIZE)
"""The revision of a damaged body without a head, as :meth:`DocumentStore.purge` takes it."""


@dataclass(frozen=True, slots=True)
class Damaged:
    """A document whose stored body cannot be read here: listings and the changes feed
    go on past it and report it here. ``code`` is the HTTP API's: ``corrupt`` for a
    body that is not a record (written through the key API, or a peer's through
    sync; reading it alone raises MalformedRecordError), ``unsupported_layout`` for
    a record of a layout a newer ledgerd wrote (UnsupportedLayoutError). A body key
    whose id is not a ULID's 16 bytes (the key API can write one) is ``corrupt``
    whatever it holds, ``id`` then ``hex:`` and the id's bytes in hex; the changes
    feed names it so once more when that key is deleted."""

    collection: str
    id: str
    message: str
    code: str = "corrupt"

    def to_json(self) -> dict[str, str]:
        return {
            "collection": self.collection,
            "_id": self.id,
            "code": self.code,
            "message": self.message,
        }


@dataclass(frozen=True, slots=True)
class Changes:
    """Documents changed between two commits: resume the feed from ``commit``.

    ``token`` is set on a batch cut from a longer change: ``commit`` is then where
    that change started (see :meth:`DocumentStore.changes`). ``damaged``: changed
    documents whose bodies cannot be read (:class:`Damaged`)."""

    commit: bytes
    documents: list[Document]
    token: bytes | None = None
    damaged: list[Damaged] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class BulkWrite:
    """One write of :meth:`DocumentStore.bulk`: ``id`` None makes a new one; ``rev``
    None creates, else replaces that revision (soft-deletes it with ``deleted``)."""

    data: Any = None
    id: str | None = None
    rev: str | None = None
    deleted: bool = False


@dataclass(frozen=True, slots=True)
class BulkResult:
    """What became of one :class:`BulkWrite`: the document written, or the error that
    refused it (``id`` as given when it was not an id)."""

    id: str | None
    document: Document | None
    error: StoreError | None


@dataclass(frozen=True, slots=True)
class DocumentRange(RangeResult[Document]):
    """A page of a listing or query; ``damaged`` its documents whose bodies cannot be
    read (:class:`Damaged`), in their place in the order, not in ``items``."""

    damaged: list[Damaged] = field(default_factory=list)


def _encoded(r: Record, max_document_bytes: int) -> bytes:
    """The record's bytes, or the error of a document that cannot be stored."""
    try:
        body = doclayout.encode_record(r)
    except UnicodeEncodeError:  # what check_data leaves to the encoder: a lone surrogate
        raise InvalidDocumentError("a string holds a lone UTF-16 surrogate") from None
    if len(body) > max_document_bytes:
        raise DocumentTooLargeError(
            f"the document is {len(body)} bytes encoded, over the limit of {max_document_bytes}"
        )
    return body


class DocumentStore:
    """The documents of one page."""

    def __init__(
        self,
        page: Page,
        *,
        max_document_bytes: int,
        rev_tolerance: float,
        clock: RevClock,
        held_index_bytes: int = HELD_BYTES,
        held_budget: HeldBudget | None = None,
    ) -> None:
        self.page = page
        self.max_document_bytes = max_document_bytes
        self.rev_tolerance = rev_tolerance
        self.clock = clock
        self.views = Views(page, held_index_bytes, held_budget)
        self._ids = RevClock(clock.now_ms)
        self._write = asyncio.Lock()

    @classmethod
    async def open(
        cls,
        page: Page,
        *,
        max_document_bytes: int = MAX_DOCUMENT_BYTES,
        rev_tolerance: float = REV_TOLERANCE,
        clock: RevClock | None = None,
        held_index_bytes: int = HELD_BYTES,
        held_budget: HeldBudget | None = None,
    ) -> DocumentStore:
        """The page's document store (the same object for every call on one open page).

        The first call marks the page as a document page (an entry in its tree, so
        every device merges it by revision) and loads or builds its local indexes.
        ``held_index_bytes`` bounds the memory of index rows held between the
        commits that store them (:meth:`store.documents.docindex.Views.commit`); a
        ``held_budget`` shared by several stores bounds them all together."""
        lock = _opening.setdefault(page, asyncio.Lock())
        async with lock:
            store = _stores.get(page)
            if store is None or page.closed:
                store = cls(
                    page,
                    max_document_bytes=max_document_bytes,
                    rev_tolerance=rev_tolerance,
                    # (the page's clock: the repository's, which tests set)
                    clock=clock or RevClock(lambda: page.graph.clock_us() // 1000),
                    held_index_bytes=held_index_bytes,
                    held_budget=held_budget,
                )
                try:
                    await store._open()
                except BaseException:  # nothing of it stays: the next open starts afresh
                    page.not_when_closing(store._page_closing)
                    try:
                        await store.views.close()
                    except Exception:  # the open's own failure is the one to raise
                        log.warning(
                            "page %s: cleaning up a failed open failed",
                            named(page.id),
                            exc_info=True,
                        )
                    raise
                _stores[page] = store
            return store

    @staticmethod
    async def holds_documents(page: Page) -> bool:
        """Whether ``page`` is a document page (its tree holds the marker), without
        making it one as :meth:`open` does."""
        return await page.get_entry(doclayout.MARKER) is not None

    @staticmethod
    def check(
        collection: str,
        *,
        doc_id: str | None = None,
        data: Any = MISSING,
        new_rev: str | None = None,
        max_document_bytes: int | None = None,
    ) -> None:
        """Raise what a call would for its arguments alone (collection name, id, the
        document's JSON and reserved names, a given revision's form and that it is not
        more than ``REV_TOLERANCE`` ahead of the clock; with ``max_document_bytes``, the
        size of ``data`` as a new document), before any page is opened or created. The
        indexed-field and revision-order checks need the page: they come with the write."""
        check_collection(collection)
        if doc_id is not None:
            parse_id(doc_id)
        rev = None if new_rev is None else parse_ulid(new_rev, "revision")
        if rev is not None:
            RevClock().check_supplied(rev, None, REV_TOLERANCE)
        if data is not MISSING:
            check_data(data)
            if max_document_bytes is not None:  # encoded as create encodes it
                rev = rev or RevClock().next()
                r = Record(rev, State.LIVE, ulid_ms(rev), None, None, None, data)
                _encoded(r, max_document_bytes)

    @staticmethod
    def check_index(
        collection: str, name: str, partition: str | list[str], sort: str | list[str] | None
    ) -> tuple[list[str], list[str] | None]:
        """Raise what :meth:`declare_index` would for its arguments alone, before any
        page is opened or created; the paths parsed."""
        check_collection(collection)
        check_index_name(name)
        return parse_path(partition), None if sort is None else parse_path(sort)

    async def _open(self) -> None:
        if lost := await _marker_if_lost(self.page):
            await self.page.write(lost)
            await self.page.flush()
        if self.page.policy is not Policy.DOCUMENTS:
            await self.page.set_policy(Policy.DOCUMENTS)
        await self.views.load()
        self.page.when_closing(self._page_closing)
        if self.views.max_rev:
            self.clock.observe(self.views.max_rev)
        await self.views.catch_up()
        if self.views.max_rev:
            self.clock.observe(self.views.max_rev)

    async def close(self) -> None:
        """Store the held index rows, stop index builds (the page stays open: its owner
        closes it). Its writes, queries and index calls then raise ClosedError; :meth:`open` waits
        for the close to end and returns a new store, so two never keep one page's
        indexes at once."""
        async with _opening.setdefault(self.page, asyncio.Lock()):
            self.page.not_when_closing(self._page_closing)
            try:
                await self.views.close()
            finally:
                if _stores.get(self.page) is self:
                    del _stores[self.page]

    async def _page_closing(self) -> None:
        """The page closes: store the held index rows, and forget this store. The
        registry's value holds its page, so a store left there keeps the page, its
        database and its history in memory for the life of the process."""
        try:
            await self.views.page_closing()
        finally:
            if _stores.get(self.page) is self:
                del _stores[self.page]

    async def refresh(self) -> Commit:
        """Bring the indexes up to the page's head now, in storage (queries do it
        anyway); returns that head."""
        head = await self.views.catch_up(store=True)
        if self.views.max_rev:
            self.clock.observe(self.views.max_rev)
        return head

    # -- reading ---------------------------------------------------------------------

    async def _record(self, view: View, collection: str, doc_id: DocId) -> Record | None:
        e = await view.get_entry(doclayout.body_key(collection, doc_id))
        if e is None:
            return None
        r = _decode(collection, doc_id, await view.objects.read_all(e.value))
        self.clock.observe(r.rev)
        return r

    async def get(
        self,
        collection: str,
        doc_id: str,
        *,
        include_deleted: bool = False,
        conflicts: bool = False,
        rev: str | None = None,
    ) -> Document:
        """The document's current revision; a deleted or purged one only if asked.
        ``conflicts``: with the revisions of its kept conflicts (:attr:`Document.conflicts`,
        highest ranked first). ``rev``: that revision, the current one or a kept
        conflict, whatever its state (DocumentNotFoundError if it is neither)."""
        check_collection(collection)
        raw = parse_id(doc_id)
        wanted = None if rev is None else parse_ulid(rev, "revision")
        snap: View = self.page
        reads_kept = conflicts or wanted is not None
        if reads_kept:  # (the record and its conflicts of one commit)
            snap = await self.page.snapshot()
        r = await self._record(snap, collection, raw)
        kept = await docconflicts.kept(snap, collection, raw) if reads_kept else []
        if wanted is not None and (r is None or r.rev != wanted):
            found = [k for k in kept if k.rev == wanted]
            if not found:
                raise DocumentNotFoundError(
                    f"document {doc_id} in {collection!r} has no revision {rev}"
                )
            r = _decode(collection, raw, await snap.objects.read_all(found[0].value))
        elif r is None or (r.state is not State.LIVE and not include_deleted and wanted is None):
            raise DocumentNotFoundError(f"no document {doc_id} in {collection!r}")
        doc = Document.of(collection, raw, r)
        # (a kept conflict read by its revision: the others, not itself)
        return doc.with_conflicts(k.rev for k in kept if k.rev != r.rev) if conflicts else doc

    async def conflicts(self, collection: str, doc_id: str) -> list[Document]:
        """The kept conflicts of a document (revisions that lost to its current one
        and that nobody resolved), highest ranked first: at most
        :data:`~store.documents.doclayout.MAX_CONFLICTS` after a write of it here."""
        check_collection(collection)
        raw = parse_id(doc_id)
        snap = await self.page.snapshot()
        kept = await docconflicts.kept(snap, collection, raw)
        values = await snap.objects.read_many(k.value for k in kept)
        return [
            Document.of(collection, raw, _decode(collection, raw, values[k.value])) for k in kept
        ]

    async def list_documents(
        self,
        collection: str,
        *,
        limit: int = 100,
        token: bytes | None = None,
        include_deleted: bool = False,
    ) -> DocumentRange:
        """Documents in ``_id`` order, ``limit`` at a time; ``token`` continues (the
        same collection and ``include_deleted``: another's is InvalidArgumentError)."""
        check_collection(collection)
        _check_limit(limit)
        bound = _binding(self.page, "list", collection, include_deleted)
        snap = await self.page.snapshot()
        start = doclayout.collection_prefix(collection)
        if token is not None:
            (after,) = doctoken.decode(token, doctoken.LIST, bound, 1)
            start = doclayout.doc_prefix(collection, after)  # (any id: the key API's too)
        end = doclayout.collection_end(collection)
        found: list[tuple[DocId, bytes]] = []  # (doc id, body digest)
        state, head_doc = State.LIVE, b""  # the last head's state, and whose it is
        head_doc_id: DocId = head_doc
        nxt: DocId | None = None
        async for e in snap.iter_entries(start=start, end=end):
            k = doclayout.parse_doc_key(e.key)
            if k is None:
                continue
            if k.part == doclayout.HEAD:
                h = doclayout.head_of(e)
                state, head_doc_id = State.LIVE if h is None else h[1], k.doc_id
            elif k.part == doclayout.BODY and (
                include_deleted or head_doc_id != k.doc_id or state is State.LIVE
            ):
                if len(found) == limit:
                    nxt = k.doc_id
                    break
                found.append((k.doc_id, e.value))
        values = await snap.objects.read_many(d for _, d in found)
        docs, damaged = [], []
        for doc_id, d in found:
            try:
                _check_id(collection, doc_id)
                r = _decode(collection, doc_id, values[d])
            except (MalformedRecordError, UnsupportedLayoutError) as e:
                damaged.append(_damaged(self.page, collection, doc_id, e))
                continue
            self.clock.observe(r.rev)
            if include_deleted or r.state is State.LIVE:  # (a head may be missing: key API)
                docs.append(Document.of(collection, doc_id, r))
        token_out = None if nxt is None else doctoken.encode(doctoken.LIST, bound, [nxt])
        return DocumentRange(docs, token_out, damaged)

    # -- writing ---------------------------------------------------------------------

    def _next_rev(self, new_rev: str | None, current: Record | None) -> bytes:
        if current is not None:
            self.clock.observe(current.rev)
        if new_rev is None:
            return self.clock.next()
        rev = parse_ulid(new_rev, "revision")
        self.clock.check_supplied(rev, current.rev if current else None, self.rev_tolerance)
        return rev

    def _check_indexed(self, collection: str, items: Sequence[Any]) -> None:
        for d in self.views.definitions(collection):
            for data in items:
                path = d.reserved_value(data)
                if path is not None:
                    raise InvalidDocumentError(
                        f"field {path!r} is indexed by {d.name!r}: its value may not contain '/'"
                    )

    async def _put_record(
        self, txn: Transaction, collection: str, doc_id: DocId, r: Record
    ) -> Document:
        await self._put(txn, collection, doc_id, r)
        return Document.of(collection, doc_id, r)

    async def _put(self, txn: Transaction, collection: str, doc_id: DocId, r: Record) -> None:
        await txn.put_many(self._entries(collection, doc_id, r))

    def _entries(
        self, collection: str, doc_id: DocId, r: Record
    ) -> tuple[tuple[bytes, bytes], tuple[bytes, bytes]]:
        """The head and body entries (key, value) of a document's record."""
        body = _encoded(r, self.max_document_bytes)
        head_key, body_key = doclayout.doc_keys(collection, doc_id)
        return (head_key, doclayout.encode_head(r.rev, r.state)), (body_key, body)

    async def _commit(self, txn: Transaction, records: Sequence[tuple[str, DocId, Record]]) -> None:
        """Commit ``txn``, which put the bodies of ``records``, with their index rows
        (:meth:`docindex.Views.commit`), and the page's marker, written again with every
        commit: a device that deleted the page concurrently leaves it a document page
        (a join keeps the marker while any device wrote it since it saw it go)."""
        await txn.put_many([(doclayout.MARKER, doclayout.MARK)])
        await self.views.commit(txn, records)

    async def _after_write(self) -> None:
        """Bring the indexes to the head (a merge after a write, definitions), unless the
        store closed meanwhile: the write is done, and the next store catches up."""
        with contextlib.suppress(ClosedError):
            await self.views.catch_up()

    async def create(
        self, collection: str, data: Any, *, id: str | None = None, new_rev: str | None = None
    ) -> Document:
        """A new document: with a new ``_id``, or the client-chosen ``id`` (see
        :func:`~store.documents.docmodel.parse_id`), DocumentConflictError if a document that is
        not deleted has it (a deleted or purged one is written over, as in CouchDB)."""
        (doc,) = await self.create_many(
            collection,
            [data],
            new_revs=None if new_rev is None else [new_rev],
            ids=None if id is None else [id],
        )
        return doc

    async def create_many(
        self,
        collection: str,
        items: Sequence[Any],
        *,
        new_revs: Sequence[str] | None = None,
        ids: Sequence[str | None] | None = None,
    ) -> list[Document]:
        """New documents, all in one commit (all or none); ``ids`` chooses theirs (None
        in it: a new one), as :meth:`create` does."""
        check_collection(collection)
        if len(items) > BULK_LIMIT:
            raise InvalidArgumentError(f"at most {BULK_LIMIT} documents in one call")
        if new_revs is not None and len(new_revs) != len(items):
            raise InvalidArgumentError("one revision per document")
        if ids is not None and len(ids) != len(items):
            raise InvalidArgumentError("one id (or None) per document")
        chosen = None if ids is None else [None if i is None else parse_id(i) for i in ids]
        if chosen is not None:
            given = [i for i in chosen if i is not None]
            if len(set(given)) != len(given):
                raise InvalidArgumentError("an id is given twice")
        for data in items:
            check_data(data)
        self._check_indexed(collection, items)
        records: list[tuple[str, DocId, Record]] = []
        async with self._write, self.page.transaction() as txn:
            entries: list[tuple[bytes, bytes]] = []
            made = self._ids.next_many(len(items))
            doc_ids: list[DocId] = list(made)
            over: dict[int, Record] = {}  # the deleted documents a chosen id writes over
            if chosen is not None:
                for n, i in enumerate(chosen):
                    if i is None:
                        continue
                    doc_ids[n] = i
                    cur = await self._free(txn, collection, i)
                    if cur is not None:
                        over[n] = cur
                        for a in cur.attachments:
                            await txn.delete(doclayout.attachment_key(collection, i, a.id))
                        await docconflicts.carry(txn, collection, i)
            if new_revs is None and not over:
                revs = self.clock.next_many(len(items))
            else:
                revs = [
                    self._next_rev(None if new_revs is None else new_revs[n], over.get(n))
                    for n in range(len(items))
                ]
            live, limit, encode_head = State.LIVE, self.max_document_bytes, doclayout.encode_head
            keys = doclayout.doc_keys_many(collection, doc_ids)
            # _entries written out: a call less per document
            for (head, body), doc_id, rev, data in zip(keys, doc_ids, revs, items, strict=True):
                r = new_record((rev, live, ulid_ms(rev), None, None, None, data, ()))
                entries.append((head, encode_head(rev, live)))
                entries.append((body, _encoded(r, limit)))
                records.append((collection, doc_id, r))
            await txn.put_many(entries)
            await self._commit(txn, records)
        await self._after_write()
        return [Document.of(*rec) for rec in records]

    async def _free(self, txn: Transaction, collection: str, raw: DocId) -> Record | None:
        """DocumentConflictError if a document that is not deleted has the id ``raw``;
        else the record of the deleted or purged one a create writes over (None: none)."""
        cur = await self._record(txn, collection, raw)  # (damaged: MalformedRecordError)
        if cur is not None and cur.state is State.LIVE:
            raise DocumentConflictError(
                f"document {id_text(raw)} exists in {collection!r} (at revision "
                f"{ulid_text(cur.rev)}): name its revision to replace it"
            )
        return cur

    async def bulk(self, collection: str, writes: Sequence[BulkWrite]) -> list[BulkResult]:
        """Create, replace and delete documents in one commit, each on its own: a write
        that is refused (a bad id or document, a stale or missing revision) is reported
        in its result and the others go ahead, as CouchDB's ``_bulk_docs`` does. A write
        without ``rev`` creates (its id must be free, or a deleted document's); with
        ``rev``, it replaces (or with ``deleted``, soft-deletes) that revision; with
        ``deleted`` and the revision of a kept conflict, it removes that conflict (a
        new revision, the document otherwise as it is). A second write of one id in a
        call is a ``conflict``, but one that removes a kept conflict. No write
        succeeding: no commit."""
        check_collection(collection)
        if len(writes) > BULK_LIMIT:
            raise InvalidArgumentError(f"at most {BULK_LIMIT} documents in one call")
        results: list[BulkResult] = []
        records: list[tuple[str, DocId, Record]] = []
        async with self._write, self.page.transaction() as txn:
            made = iter(self._ids.next_many(sum(1 for w in writes if w.id is None)))
            seen: set[DocId] = set()
            for w in writes:
                shown_id = w.id
                try:
                    raw = next(made) if w.id is None else parse_id(w.id)
                    shown_id = id_text(raw)
                    removes = await self._removes_conflict(txn, collection, raw, w)
                    if raw in seen and not removes:
                        raise DocumentConflictError(f"document {shown_id} is written twice")
                    seen.add(raw)
                    if removes:
                        r = await self._without_conflict(txn, collection, raw, w)
                    else:
                        r = await self._bulk_record(txn, collection, raw, w)
                    entries = self._entries(collection, raw, r)
                except (DocumentError, InvalidArgumentError, MalformedRecordError) as e:
                    results.append(BulkResult(shown_id, None, e))
                    continue
                await txn.put_many(entries)
                records = [x for x in records if x[1] != raw or x[0] != collection]
                records.append((collection, raw, r))
                results.append(BulkResult(shown_id, Document.of(collection, raw, r), None))
            if records:
                await self._commit(txn, records)
        if records:
            await self._after_write()
        return results

    async def _removes_conflict(
        self, txn: Transaction, collection: str, raw: DocId, w: BulkWrite
    ) -> bool:
        """Whether ``w`` deletes one of the document's kept conflicts (CouchDB's way
        to resolve: ``{"_id", "_rev": a losing revision, "_deleted": true}``, in the
        same call as a write of the winner or not)."""
        if not w.deleted or w.rev is None:
            return False
        rev = parse_ulid(w.rev, "revision")
        return any(k.rev == rev for k in await docconflicts.kept(txn, collection, raw))

    async def _without_conflict(
        self, txn: Transaction, collection: str, raw: DocId, w: BulkWrite
    ) -> Record:
        """The record of a new revision, the document otherwise as it is (in ``txn``:
        after an earlier write of the call), that removes the kept conflict ``w.rev``."""
        assert w.rev is not None
        cur = await self._record(txn, collection, raw)
        if cur is None:
            raise DocumentNotFoundError(f"no document {id_text(raw)} in {collection!r}")
        await docconflicts.carry(txn, collection, raw, [w.rev])
        new = self._next_rev(None, cur)
        return cur._replace(rev=new, updated=ulid_ms(new))

    async def _bulk_record(
        self, txn: Transaction, collection: str, raw: DocId, w: BulkWrite
    ) -> Record:
        """The record one write of :meth:`bulk` puts (its attachments' keys deleted
        from ``txn`` when it writes over a deleted document)."""
        if not w.deleted:
            check_data(w.data)
            self._check_indexed(collection, [w.data])
        if w.rev is None:
            if w.deleted:
                raise DocumentConflictError(
                    f"deleting document {id_text(raw)} needs its current revision"
                )
            over = await self._free(txn, collection, raw)
            for a in () if over is None else over.attachments:
                await txn.delete(doclayout.attachment_key(collection, raw, a.id))
            if over is not None:
                await docconflicts.carry(txn, collection, raw)
            rev = self._next_rev(None, over)
            return Record(rev, State.LIVE, ulid_ms(rev), None, None, None, w.data)
        cur = await self._current(txn, collection, raw, w.rev)
        await docconflicts.carry(txn, collection, raw)
        rev = self._next_rev(None, cur)
        ms = ulid_ms(rev)
        if w.deleted:
            return Record(rev, State.DELETED, cur.created, ms, ms, None, cur.data, cur.attachments)
        return Record(rev, State.LIVE, cur.created, ms, None, None, w.data, cur.attachments)

    async def _current(
        self,
        txn: Transaction,
        collection: str,
        raw: DocId,
        expected_rev: str | None,
        *,
        purge: bool = False,
    ) -> Record:
        r = await self._record(txn, collection, raw)
        if r is None or r.state is State.PURGED or (r.state is State.DELETED and not purge):
            raise DocumentNotFoundError(f"no document {id_text(raw)} in {collection!r}")
        if expected_rev is not None and parse_ulid(expected_rev, "revision") != r.rev:
            raise DocumentConflictError(
                f"document {id_text(raw)} is at revision {ulid_text(r.rev)}, not {expected_rev}"
            )
        return r

    async def _damaged_current(
        self, txn: Transaction, collection: str, raw: DocId, expected_rev: str | None
    ) -> Record | None:
        """What :meth:`purge` knows of a document whose body cannot be read: the
        revision and state its head carries (none, all zeros, without a head: the body
        alone is still listed as damaged), its attachments' keys (creation time: its
        id's, or now if that is past what a record carries); None if its head is a
        purged one's."""
        head = doclayout.head_of(await txn.get_entry(doclayout.head_key(collection, raw)))
        if head is None:
            head = NO_REV, State.LIVE
        elif head[1] is State.PURGED:
            return None
        rev, state = head
        if expected_rev is not None and parse_ulid(expected_rev, "revision") != rev:
            at = "carries no revision" if rev == NO_REV else f"is at revision {ulid_text(rev)}"
            raise DocumentConflictError(f"document {id_text(raw)} {at}, not {expected_rev}")
        created = (
            ulid_ms(raw)
            if isinstance(raw, bytes) and doclayout.rev_in_time(raw)
            else self.clock.now_ms()
        )
        atts = []
        async for e in txn.iter_entries(prefix=doclayout.doc_prefix(collection, raw)):
            k = doclayout.parse_doc_key(e.key)
            if k is not None and k.part == doclayout.ATTACHMENT and k.attachment is not None:
                atts.append(AttachmentMeta(k.attachment, "", "", 0))
        return Record(rev, state, created, None, None, None, None, tuple(atts))

    async def replace(
        self,
        collection: str,
        doc_id: str,
        data: Any,
        *,
        expected_rev: str | None = None,
        new_rev: str | None = None,
        resolves: Sequence[str] = (),
    ) -> Document:
        """A new revision with ``data`` (attachments kept). With ``expected_rev``, only
        if the current revision is that one (else DocumentConflictError). The
        document's kept conflicts stay, but those whose revisions ``resolves`` names:
        this revision supersedes them (DocumentConflictError if one is not kept)."""
        check_collection(collection)
        raw = parse_id(doc_id)
        check_data(data)
        self._check_indexed(collection, [data])
        async with self._write, self.page.transaction() as txn:
            cur = await self._current(txn, collection, raw, expected_rev)
            await docconflicts.carry(txn, collection, raw, resolves)
            rev = self._next_rev(new_rev, cur)
            r = Record(
                rev, State.LIVE, cur.created, ulid_ms(rev), None, None, data, cur.attachments
            )
            doc = await self._put_record(txn, collection, raw, r)
            await self._commit(txn, [(collection, raw, r)])
        await self._after_write()
        return doc

    async def delete(
        self,
        collection: str,
        doc_id: str,
        *,
        expected_rev: str | None = None,
        new_rev: str | None = None,
    ) -> Document:
        """Soft delete: a revision marked ``_deleted``, hidden from reads, listings and
        queries unless asked for; its data and attachments stay until a purge."""
        check_collection(collection)
        raw = parse_id(doc_id)
        async with self._write, self.page.transaction() as txn:
            cur = await self._current(txn, collection, raw, expected_rev)
            await docconflicts.carry(txn, collection, raw)
            rev = self._next_rev(new_rev, cur)
            ms = ulid_ms(rev)
            r = Record(rev, State.DELETED, cur.created, ms, ms, None, cur.data, cur.attachments)
            doc = await self._put_record(txn, collection, raw, r)
            await self._commit(txn, [(collection, raw, r)])
        await self._after_write()
        return doc

    async def purge(
        self,
        collection: str,
        doc_id: str,
        *,
        expected_rev: str | None = None,
        new_rev: str | None = None,
    ) -> Document:
        """Remove the data and attachments from the head, keep a ``_purged`` tombstone
        (a revision like any other, so the purge wins over older revisions elsewhere).
        A document whose body cannot be read (:class:`Damaged`) is purged too, after
        the revision its head carries: the documents API's way to be rid of it."""
        check_collection(collection)
        raw = parse_id(doc_id)
        async with self._write, self.page.transaction() as txn:
            try:
                cur = await self._current(txn, collection, raw, expected_rev, purge=True)
            except MalformedRecordError:
                found = await self._damaged_current(txn, collection, raw, expected_rev)
                if found is None:
                    raise
                cur = found
            await docconflicts.carry(txn, collection, raw, drop_all=True)
            rev = self._next_rev(new_rev, cur)
            ms = ulid_ms(rev)
            for a in cur.attachments:
                await txn.delete(doclayout.attachment_key(collection, raw, a.id))
            r = Record(rev, State.PURGED, cur.created, ms, cur.deleted, ms, None, ())
            doc = await self._put_record(txn, collection, raw, r)
            await self._commit(txn, [(collection, raw, r)])
        await self._after_write()
        return doc

    async def delete_conflict(
        self,
        collection: str,
        doc_id: str,
        rev: str,
        *,
        expected_rev: str | None = None,
    ) -> Document:
        """Resolve a kept conflict by removing it: a new revision of the document, as
        it is otherwise (data, state, attachments), that supersedes the conflict of
        revision ``rev`` (DocumentConflictError if the document keeps none; with
        ``expected_rev``, only if the current revision is that one)."""
        check_collection(collection)
        raw = parse_id(doc_id)
        parse_ulid(rev, "revision")
        async with self._write, self.page.transaction() as txn:
            cur = await self._record(txn, collection, raw)
            if cur is None:
                raise DocumentNotFoundError(f"no document {doc_id} in {collection!r}")
            if expected_rev is not None and parse_ulid(expected_rev, "revision") != cur.rev:
                raise DocumentConflictError(
                    f"document {doc_id} is at revision {ulid_text(cur.rev)}, not {expected_rev}"
                )
            await docconflicts.carry(txn, collection, raw, [rev])
            new = self._next_rev(None, cur)
            r = cur._replace(rev=new, updated=ulid_ms(new))
            doc = await self._put_record(txn, collection, raw, r)
            await self._commit(txn, [(collection, raw, r)])
        await self._after_write()
        return doc

    async def delete_revision(self, collection: str, doc_id: str, rev: str) -> Document:
        """CouchDB's ``DELETE …?rev=R``: :meth:`delete` the document if ``rev`` is its
        current revision, :meth:`delete_conflict` if it is a kept conflict's (else
        DocumentConflictError; DocumentNotFoundError if there is no such document)."""
        raw = parse_ulid(rev, "revision")
        cur = await self.get(collection, doc_id, include_deleted=True, conflicts=True)
        if cur.conflicts is not None and ulid_text(raw) in cur.conflicts:
            return await self.delete_conflict(collection, doc_id, rev)
        if cur.rev == ulid_text(raw) or cur.deleted:  # (a deleted one: not found)
            return await self.delete(collection, doc_id, expected_rev=rev)
        raise DocumentConflictError(
            f"document {doc_id} is at revision {cur.rev} and keeps no conflict of "
            f"revision {ulid_text(raw)}: nothing deleted"
        )

    # -- attachments -----------------------------------------------------------------

    async def put_attachment(
        self,
        collection: str,
        doc_id: str,
        content: Source,
        *,
        filename: str,
        content_type: str = "application/octet-stream",
        attachment_id: str | None = None,
        expected_rev: str | None = None,
    ) -> tuple[Document, Attachment]:
        """Add an attachment (or replace ``attachment_id``) in a new revision. The
        content (bytes, an async iterator of bytes, or a file) is streamed and stored
        LAZY: other devices fetch it on first read."""
        check_collection(collection)
        raw = parse_id(doc_id)
        check_text(filename, "filename")
        check_text(content_type, "content type")
        att = parse_ulid(attachment_id, "attachment id") if attachment_id else self._ids.next()
        key = doclayout.attachment_key(collection, raw, att)
        # The content is staged before the write lock, so a slow upload holds up no write.
        staging = self.page.transaction()
        try:
            await staging.put(key, content, Priority.LAZY)
            length = await staging.size(key)
            async with self._write:
                if self.page.head.id == staging.base.id:
                    txn, copy = staging, False
                else:  # the page moved: a fresh transaction on the head, the content copied
                    txn, copy = self.page.transaction(), True
                try:
                    if copy:
                        await txn.put(key, await staging.read(key), Priority.LAZY)
                    cur = await self._current(txn, collection, raw, expected_rev)
                    if attachment_id and not any(a.id == att for a in cur.attachments):
                        raise AttachmentNotFoundError(f"no attachment {attachment_id}")
                    await docconflicts.carry(txn, collection, raw)
                    meta = AttachmentMeta(att, filename, content_type, length)
                    atts = tuple(a for a in cur.attachments if a.id != att) + (meta,)
                    rev = self._next_rev(None, cur)
                    r = Record(
                        rev, State.LIVE, cur.created, ulid_ms(rev), None, None, cur.data, atts
                    )
                    doc = await self._put_record(txn, collection, raw, r)
                    await self._commit(txn, [(collection, raw, r)])
                finally:
                    await txn.rollback()
        finally:
            await staging.rollback()
        await self._after_write()
        return doc, Attachment.of(meta)

    async def attachment(
        self, collection: str, doc_id: str, attachment_id: str, *, include_deleted: bool = False
    ) -> Attachment:
        """An attachment's description (of a soft-deleted document: with ``include_deleted``)."""
        att = ulid_text(parse_ulid(attachment_id, "attachment id"))  # (malformed: invalid_id)
        doc = await self.get(collection, doc_id, include_deleted=include_deleted)
        for a in doc.attachments:
            if a.id == att:
                return a
        raise AttachmentNotFoundError(f"document {doc_id} has no attachment {attachment_id}")

    async def read_attachment(
        self,
        collection: str,
        doc_id: str,
        attachment_id: str,
        offset: int = 0,
        length: int | None = None,
        *,
        include_deleted: bool = False,
    ) -> AsyncIterator[bytes]:
        """Stream an attachment's content (``length`` bytes from ``offset``); a soft-deleted
        document keeps its attachments, read with ``include_deleted``."""
        a = await self.attachment(
            collection, doc_id, attachment_id, include_deleted=include_deleted
        )
        key = doclayout.attachment_key(collection, parse_id(doc_id), parse_ulid(a.id))
        return await self.page.read(key, offset, length)

    async def delete_attachment(
        self, collection: str, doc_id: str, attachment_id: str, *, expected_rev: str | None = None
    ) -> Document:
        """Remove an attachment in a new revision (its content leaves the head)."""
        check_collection(collection)
        raw = parse_id(doc_id)
        att = parse_ulid(attachment_id, "attachment id")
        async with self._write, self.page.transaction() as txn:
            cur = await self._current(txn, collection, raw, expected_rev)
            if not any(a.id == att for a in cur.attachments):
                raise AttachmentNotFoundError(
                    f"document {doc_id} has no attachment {attachment_id}"
                )
            await txn.delete(doclayout.attachment_key(collection, raw, att))
            await docconflicts.carry(txn, collection, raw)
            rev = self._next_rev(None, cur)
            atts = tuple(a for a in cur.attachments if a.id != att)
            r = Record(rev, State.LIVE, cur.created, ulid_ms(rev), None, None, cur.data, atts)
            doc = await self._put_record(txn, collection, raw, r)
            await self._commit(txn, [(collection, raw, r)])
        await self._after_write()
        return doc

    # -- indexes ---------------------------------------------------------------------

    async def declare_index(
        self,
        collection: str,
        name: str,
        partition: str | list[str],
        sort: str | list[str] | None = None,
    ) -> IndexInfo:
        """Declare an index (it travels with the page); its entries are built here, in
        the background, from the documents already there. Queries wait for it.

        Returns the index as declared (``ready`` if it is built already), even if a
        drop or another declaration of the same name came in meanwhile."""
        part, by = self.check_index(collection, name, partition, sort)
        raw = doclayout.encode_definition(part, by)
        async with self._write:
            await self._readable_definition(collection, name)
            changes = [(doclayout.index_key(collection, name), raw)]
            await self.page.write(changes + await _marker_if_lost(self.page))
            await self.page.flush()
        await self._after_write()
        found = self.views.indexes.get((collection, name))
        ready = found is not None and found[1].raw == raw and found[2]
        return IndexInfo(collection, name, tuple(part), None if by is None else tuple(by), ready)

    async def drop_index(self, collection: str, name: str) -> None:
        check_collection(collection)
        key = doclayout.index_key(collection, check_index_name(name))
        async with self._write:
            if await self.page.get_entry(key) is None:
                raise IndexNotFoundError(f"no index {name!r} on {collection!r}")
            await self._readable_definition(collection, name)
            await self.page.delete(key)
            await self.page.flush()
        await self._after_write()

    async def indexes(self, collection: str) -> list[IndexInfo]:
        """The indexes of ``collection`` by name, those whose definitions cannot be read
        here among them (see :class:`IndexInfo`)."""
        check_collection(collection)
        await self.views.catch_up()
        out = {
            name: IndexInfo(
                d.collection,
                d.name,
                tuple(d.partition),
                None if d.sort is None else tuple(d.sort),
                ready,
            )
            for (coll, name), (_, d, ready) in self.views.indexes.items()
            if coll == collection
        }
        for (coll, name), e in self.views.unreadable.items():
            if coll == collection:
                err = _unreadable_index(coll, name, e)
                code = err.code if isinstance(err, UnsupportedLayoutError) else "corrupt"
                out[name] = IndexInfo(coll, name, (), None, False, code, str(err))
        return [out[name] for name in sorted(out)]

    async def rebuild_index(self, collection: str, name: str) -> None:
        """Drop an index's local entries and build them again from the documents."""
        check_collection(collection)
        await self.views.catch_up()
        if not await self.views.rebuild(collection, check_index_name(name)):
            self._refuse_unreadable(collection, name)
            raise IndexNotFoundError(f"no index {name!r} on {collection!r}")

    async def _index(self, collection: str, name: str) -> tuple[int, IndexDef]:
        check_collection(collection)
        check_index_name(name)
        await self.views.catch_up()  # a definition that just arrived is known
        found = await self.views.index(collection, name)
        if found is None:
            self._refuse_unreadable(collection, name)
            raise IndexNotFoundError(f"no index {name!r} on {collection!r}")
        return found

    def _refuse_unreadable(self, collection: str, name: str) -> None:
        """Raise why the index's definition cannot be read here, if it cannot (as of
        the views' catch-up)."""
        e = self.views.unreadable.get((collection, name))
        if e is not None:
            raise _unreadable_index(collection, name, e)

    async def _readable_definition(self, collection: str, name: str) -> None:
        """UnsupportedLayoutError if the head's definition of the index is a newer
        ledgerd's: it is neither replaced nor deleted here (write lock held). A damaged
        one may be: declaring or dropping the index is how it is repaired."""
        e = await self.page.get_entry(doclayout.index_key(collection, name))
        if e is None:
            return
        try:
            doclayout.decode_definition(await self.page.objects.read_all(e.value))
        except doclayout.FutureLayoutError as err:
            raise _unreadable_index(collection, name, err) from None
        except ValueError:  # damaged: declaring or dropping it again repairs it
            return

    async def query(
        self,
        collection: str,
        index: str,
        partition: Any,
        *,
        start: Any = None,
        end: Any = None,
        limit: int = 100,
        token: bytes | None = None,
        include_deleted: bool = False,
    ) -> DocumentRange:
        """Documents whose partition value equals ``partition`` and whose sort value is in
        ``[start, end)``, in index order (sort value, then ``_id``), ``limit`` at a time;
        those whose bodies cannot be read (a record whose data has no JSON form is
        indexed by its other values) are named in ``damaged``, as a listing names them.
        Reflects exactly the documents of the page's head. ``token`` continues the same
        query (collection, index and its definition, partition value, range and
        ``include_deleted``): another's is InvalidArgumentError."""
        _check_limit(limit)
        while True:  # again if the index changed before the query had the lock
            ix, d = await self._index(collection, index)
            lo, hi = partition_range(partition, start, end, d)
            bound = _binding(self.page, "find", collection, index, d.raw, lo, hi, include_deleted)
            after = None
            if token is not None:
                key, doc = doctoken.decode(token, doctoken.FIND, bound, 2)
                after = (key, doc)
            got = await self.views.query(ix, d, lo, hi, after, limit + 1, include_deleted)
            if got is not None:
                break
        head, rows = got
        nxt = None
        if len(rows) > limit:
            last = rows[limit - 1]
            nxt = doctoken.encode(doctoken.FIND, bound, [last.key, last.doc])
        docs, damaged = await self._documents_at(head, collection, [r.doc for r in rows[:limit]])
        return DocumentRange(docs, nxt, damaged)

    async def find(self, collection: str, request: Any) -> docfind.FindResult:
        """A selector query (pouchdb-find's and CouchDB Mango's ``{"selector", "fields",
        "sort", "limit", "skip", "bookmark", "use_index"}``, :mod:`store.documents.docfind`):
        served from a declared index whose partition the selector fixes, by a scan of
        the collection otherwise (the answer's ``plan`` says which)."""
        check_collection(collection)
        return await docfind.find(self, collection, docfind.parse_request(request))

    async def explain(self, collection: str, request: Any) -> dict[str, Any]:
        """How :meth:`find` would answer ``request``: its index (or a scan) and why."""
        check_collection(collection)
        return await docfind.explain(self, collection, docfind.parse_request(request))

    async def _documents_at(
        self, head: Commit, collection: str, ids: list[DocId]
    ) -> tuple[list[Document], list[Damaged]]:
        snap = await self.page.snapshot(head.id)
        entries = [await snap.get_entry(doclayout.body_key(collection, i)) for i in ids]
        values = await snap.objects.read_many(e.value for e in entries if e is not None)
        out, damaged = [], []
        for doc_id, e in zip(ids, entries, strict=True):
            if e is None:  # cannot happen: the rows reflect this very commit
                raise AssertionError(f"index row of a missing document {_id_text(doc_id)}")
            try:
                _check_id(collection, doc_id)
                r = _decode(collection, doc_id, values[e.value])
            except (MalformedRecordError, UnsupportedLayoutError) as err:
                damaged.append(_damaged(self.page, collection, doc_id, err))
                continue
            self.clock.observe(r.rev)
            out.append(Document.of(collection, doc_id, r))
        return out, damaged

    # -- the changes feed --------------------------------------------------------------

    async def changes(
        self,
        since: bytes | None = None,
        *,
        collection: str | None = None,
        follow: bool = True,
        batch: int = LIST_LIMIT,
        conflicts: bool = False,
    ) -> AsyncGenerator[Changes, None]:
        """Every document changed since commit ``since`` (None: since the beginning),
        deleted and purged ones included, in batches of at most ``batch``; then, with
        ``follow``, the documents of each later change of the head, until the page
        closes. Resume after a disconnect from the last batch's ``commit``: a batch cut
        from a longer change (its ``token`` set) carries the commit the change started
        from, so resuming there sends the rest again, and this batch once more. The
        cost follows the change (a tree diff). ``conflicts``: each document with the
        revisions of its kept conflicts (:attr:`Document.conflicts`)."""
        _check_limit(batch)
        prefix = self._changes_prefix(collection)
        watcher = self.page.watch(prefix) if follow else None
        try:
            resume = commit.FIRST.id if since is None else since
            root = (await self.page.load_commit(resume)).root
            while True:
                head = self.page.head
                start: bytes | None = prefix
                while head.root != root and start is not None:
                    got, start = await self._changed(
                        resume, root, head, prefix, start, batch, conflicts
                    )
                    if got.documents or got.damaged:
                        yield got
                if head.root != root:
                    resume, root = head.id, head.root
                if watcher is None:
                    return
                if watcher.closed and watcher.queue.empty():
                    if self.page.closed:
                        return
                    watcher = self.page.watch(prefix)  # it fell behind: the diff catches up
                    continue
                await watcher.wake()
        finally:
            if watcher is not None:
                watcher.close()

    async def changes_page(
        self,
        since: bytes | None = None,
        *,
        collection: str | None = None,
        limit: int = LIST_LIMIT,
        token: bytes | None = None,
        conflicts: bool = False,
    ) -> Changes:
        """One batch of :meth:`changes` without ``follow``: the documents changed from
        ``since`` to the head, at most ``limit``; when more remain, ``token`` is set and
        the next call with it (and the same ``since`` and ``collection``: another's is
        InvalidArgumentError) continues up to the same head."""
        _check_limit(limit)
        prefix = self._changes_prefix(collection)
        resume = commit.FIRST.id if since is None else since
        root = (await self.page.load_commit(resume)).root
        if token is None:
            head, start = self.page.head, prefix
        else:
            bound = _binding(self.page, "changes", resume, prefix)
            head_id, start = doctoken.decode(token, doctoken.CHANGES, bound, 2)
            if not isinstance(head_id, bytes) or not isinstance(start, bytes):
                raise doctoken.TokenError("malformed continuation token")  # made up
            if not start.startswith(prefix):
                raise InvalidArgumentError("the continuation token is for another collection")
            head = await self.page.load_commit(head_id)
        got, _ = await self._changed(resume, root, head, prefix, start, limit, conflicts)
        return got

    @staticmethod
    def _changes_prefix(collection: str | None) -> bytes:
        if collection is None:
            return doclayout.DOCS
        check_collection(collection)
        return doclayout.collection_prefix(collection)

    async def _changed(
        self,
        resume: bytes,
        old_root: bytes,
        head: Commit,
        prefix: bytes,
        start: bytes,
        limit: int,
        conflicts: bool = False,
    ) -> tuple[Changes, bytes | None]:
        """The documents changed from ``old_root`` to ``head`` from key ``start`` on, at
        most ``limit``, and where the next batch starts (None: this one ends the change)."""
        found: dict[tuple[str, DocId], None] = {}
        nxt: bytes | None = None
        end = doclayout.elements_end(prefix)
        async for c in btree.diff(self.page.nodes, old_root, head.root, start):
            if c.key >= end:
                break
            k = doclayout.parse_doc_key(c.key)
            if k is None or (k.collection, k.doc_id) in found:
                continue
            if len(found) == limit:
                nxt = doclayout.doc_prefix(k.collection, k.doc_id)
                break
            found[(k.collection, k.doc_id)] = None
        out: list[Document] = []
        damaged: list[Damaged] = []
        snap = await self.page.snapshot(head.id)
        old: View | None = None
        for coll, doc_id in found:
            if isinstance(doc_id, bytes) and len(doc_id) != doclayout.ULID_SIZE:  # key API's
                body = doclayout.body_key(coll, doc_id)
                if await snap.get_entry(body) is not None:
                    damaged.append(_damaged(self.page, coll, doc_id, _odd_id(coll, doc_id)))
                    continue
                # Its body deleted since the feed's start (through the key API): named
                # once more, as a ULID's document is reported purged, so that a follower
                # that was told of it learns it is gone.
                if old is None:
                    old = await self.page.snapshot(resume)
                if await old.get_entry(body) is not None:
                    damaged.append(
                        _damaged(self.page, coll, doc_id, _odd_id(coll, doc_id, deleted=True))
                    )
                continue
            try:
                r = await self._record(snap, coll, doc_id)
                if r is None:  # its keys left without a revision: reported once as purged
                    if old is None:
                        old = await self.page.snapshot(resume)
                    r = _gone(await self._record(old, coll, doc_id), head)
            except (MalformedRecordError, UnsupportedLayoutError) as e:
                damaged.append(_damaged(self.page, coll, doc_id, e))
                continue
            if r is not None:
                doc = Document.of(coll, doc_id, r)
                if conflicts:
                    doc = doc.with_conflicts(
                        k.rev for k in await docconflicts.kept(snap, coll, doc_id)
                    )
                out.append(doc)
        if nxt is None:
            return Changes(head.id, out, None, damaged), None
        token = doctoken.encode(
            doctoken.CHANGES, _binding(self.page, "changes", resume, prefix), [head.id, nxt]
        )
        return Changes(resume, out, token, damaged), nxt


async def _marker_if_lost(view: View) -> list[tuple[bytes, bytes]]:
    """The marker's entry to put if ``view``'s page does not hold it (a new page, or one
    deleted or cleared since its store opened: reads look for the marker, and merges
    take a page's documents whole only where it is); else nothing."""
    if await view.get_entry(doclayout.MARKER) is not None:
        return []
    return [(doclayout.MARKER, doclayout.MARK)]


def _decode(collection: str, doc_id: DocId, body: bytes) -> Record:
    """The record of a document's stored ``body``; MalformedRecordError if it is not one,
    UnsupportedLayoutError if it is one of a later layout."""
    try:
        return doclayout.decode_record(body)
    except doclayout.FutureLayoutError as e:
        raise UnsupportedLayoutError(
            f"document {_id_text(doc_id)} in {collection!r} cannot be read or changed by "
            f"this ledgerd: {e}; upgrade ledgerd on this device"
        ) from None
    except ValueError as e:
        raise MalformedRecordError(
            f"document {_id_text(doc_id)} in {collection!r} is damaged: {e}"
        ) from None


def _unreadable_index(
    collection: str, name: str, e: ValueError
) -> UnsupportedLayoutError | MalformedRecordError:
    """The error of a query or change of an index whose definition cannot be read here."""
    if isinstance(e, doclayout.FutureLayoutError):
        return UnsupportedLayoutError(
            f"index {name!r} on {collection!r} cannot be read or changed by this ledgerd: "
            f"{e}; upgrade ledgerd on this device"
        )
    return MalformedRecordError(
        f"index {name!r} on {collection!r} is damaged: {e}; declare it again or drop it"
    )


def _binding(page: Page, kind: str, *parts: Any) -> bytes:
    """What a token of ``kind`` continues: that listing of ``page`` with ``parts`` (a
    changes token's are the change's ``since`` and the key prefix it covers: one
    collection's, or every one's)."""
    return doctoken.binding(kind, page.ledger, page.id, *parts)


def _damaged(
    page: Page, collection: str, doc_id: DocId, e: MalformedRecordError | UnsupportedLayoutError
) -> Damaged:
    log.warning("page %s: %s", named(page.id), e)
    code = e.code if isinstance(e, UnsupportedLayoutError) else "corrupt"
    return Damaged(collection, _id_text(doc_id), str(e), code)


def _id_text(doc_id: DocId) -> str:
    """A document id as the API shows it: a ULID's text, or ``hex:`` and the bytes of
    an id that is not 16 bytes (a key written through the key API may hold any id;
    its hex could otherwise read as a ULID's 26 characters)."""
    if isinstance(doc_id, str) or len(doc_id) == doclayout.ULID_SIZE:
        return id_text(doc_id)
    return "hex:" + doc_id.hex()


def _odd_id(collection: str, doc_id: bytes, *, deleted: bool = False) -> MalformedRecordError:
    """The error of a body key whose id is not a ULID's 16 bytes; ``deleted``: the
    changes feed's, for such a key deleted since the feed's start."""
    why = f"its id is {len(doc_id)} bytes, not a ULID's 16 (a key written through the key API)"
    if deleted:
        return MalformedRecordError(
            f"document {_id_text(doc_id)} in {collection!r} is gone: its body key, "
            f"damaged ({why}), was deleted"
        )
    return MalformedRecordError(
        f"document {_id_text(doc_id)} in {collection!r} is damaged: {why}; "
        "delete its keys through the key API"
    )


def _check_id(collection: str, doc_id: DocId) -> None:
    """MalformedRecordError for a document key whose id is not a ULID's 16 bytes: no
    document can be shown, changed or purged under it."""
    if isinstance(doc_id, bytes) and len(doc_id) != doclayout.ULID_SIZE:
        raise _odd_id(collection, doc_id)


def _gone(last: Record | None, head: Commit) -> Record | None:
    """What the changes feed reports for a document whose keys are no longer in the
    page at ``head`` though no revision removed them (the page was deleted or
    cleared, or its keys deleted through the key API): its ``last`` record, purged at
    the head's time; None if it had none at the feed's start either."""
    if last is None or last.state is State.PURGED:
        return last
    at = head.timestamp // 1000
    deleted = last.deleted if last.deleted is not None else at
    return last._replace(state=State.PURGED, deleted=deleted, purged=at, data=None, attachments=())


def _check_limit(limit: int) -> None:
    if not isinstance(limit, int) or not 1 <= limit <= LIST_LIMIT:
        raise InvalidArgumentError(f"limit must be 1-{LIST_LIMIT}")
