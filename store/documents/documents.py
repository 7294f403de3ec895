"""Documents after Yoda: JSON documents with ULID ids and revisions in a page.

This module owns :class:`DocumentStore`, the document layer's embedded API that
the HTTP API and clients map onto one to one; one store per open page is
:mod:`~store.documents.docstores`'s registry. The façade is the map: each operation
is one job module's (:mod:`~store.documents.docreads`, :mod:`~store.documents.docwrites`,
:mod:`~store.documents.docbulk`, :mod:`~store.documents.docattach`,
:mod:`~store.documents.docqueries`, :mod:`~store.documents.docchanges`), on the
shared state of :class:`~store.documents.doccore.DocCore`. The model is
:mod:`store.documents.docmodel`, the layout :mod:`store.documents.doclayout`, the
local indexes :mod:`store.documents.docindex`.

A page is one document store (documents that must change atomically together
share a page); a collection is a key range in it. One :class:`DocumentStore` per
open page (:meth:`DocumentStore.open` hands out the same one): its writes run one
at a time, each a transaction whose reads (the current revision) and writes are
one commit, so an expected ``_rev`` is checked atomically.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import Any

from ledgerd.store.documents import (
    docattach,
    docbulk,
    docchanges,
    docfind,
    doclayout,
    docqueries,
    docreads,
    docwrites,
)
from ledgerd.store.documents.docbulk import BulkResult, BulkWrite
from ledgerd.store.documents.docchanges import Changes
from ledgerd.store.documents.doccore import (
    LIST_LIMIT,
    DocCore,
    DocumentRange,
    marker_if_lost,
)
from ledgerd.store.documents.docindex import HELD_BYTES, HeldBudget
from ledgerd.store.documents.docmodel import (
    MAX_DOCUMENT_BYTES,
    MISSING,
    REV_TOLERANCE,
    Attachment,
    Document,
    IndexInfo,
    RevClock,
    check_collection,
)
from ledgerd.store.documents.docstores import Registry
from ledgerd.store.errors import named
from ledgerd.store.page.page import Page
from ledgerd.store.pieces.objects import Source
from ledgerd.store.tree.commit import Commit
from ledgerd.store.tree.merge import Policy

log = logging.getLogger(__name__)

_stores: Registry[DocumentStore] = Registry()
"""Each open page's document store."""


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
        self._core = core = DocCore(
            page,
            max_document_bytes=max_document_bytes,
            rev_tolerance=rev_tolerance,
            clock=clock,
            held_index_bytes=held_index_bytes,
            held_budget=held_budget,
        )
        self.page = page
        self.max_document_bytes = max_document_bytes
        self.rev_tolerance = rev_tolerance
        self.clock = clock
        self.views = core.views

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
        async with _stores.lock(page):
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
                await store._open_or_clean_up()
                _stores.put(page, store)
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
        docwrites.check_arguments(
            collection,
            doc_id=doc_id,
            data=data,
            new_rev=new_rev,
            max_document_bytes=max_document_bytes,
        )

    @staticmethod
    def check_index(
        collection: str, name: str, partition: str | list[str], sort: str | list[str] | None
    ) -> tuple[list[str], list[str] | None]:
        """Raise what :meth:`declare_index` would for its arguments alone, before any
        page is opened or created; the paths parsed."""
        return docqueries.check_index(collection, name, partition, sort)

    async def _open_or_clean_up(self) -> None:
        """:meth:`_open`; if it fails, nothing of it stays: the next open starts afresh."""
        try:
            await self._open()
        except BaseException:
            self.page.not_when_closing(self._page_closing)
            try:
                await self.views.close()
            except Exception:  # the open's own failure is the one to raise
                log.warning(
                    "page %s: cleaning up a failed open failed", named(self.page.id), exc_info=True
                )
            raise

    async def _open(self) -> None:
        if lost := await marker_if_lost(self.page):
            await self.page.write(lost)
            await self.page.flush()
        if self.page.policy is not Policy.DOCUMENTS:
            await self.page.set_policy(Policy.DOCUMENTS)
        await self.views.load()
        self.page.when_closing(self._page_closing)
        self._core.observe_views()
        await self.views.catch_up()
        self._core.observe_views()

    async def close(self) -> None:
        """Store the held index rows, stop index builds (the page stays open: its owner
        closes it). Its writes, queries and index calls then raise ClosedError; :meth:`open` waits
        for the close to end and returns a new store, so two never keep one page's
        indexes at once."""
        async with _stores.lock(self.page):
            self.page.not_when_closing(self._page_closing)
            try:
                await self.views.close()
            finally:
                _stores.forget(self.page, self)

    async def _page_closing(self) -> None:
        """The page closes: store the held index rows, and forget this store. The
        registry's value holds its page, so a store left there keeps the page, its
        database and its history in memory for the life of the process."""
        try:
            await self.views.page_closing()
        finally:
            _stores.forget(self.page, self)

    async def refresh(self) -> Commit:
        """Bring the indexes up to the page's head now, in storage (queries do it
        anyway); returns that head."""
        head = await self.views.catch_up(store=True)
        self._core.observe_views()
        return head

    # -- reading (docreads) ----------------------------------------------------------

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
        core = self._core
        return await docreads.get(core, collection, doc_id, include_deleted, conflicts, rev)

    async def conflicts(self, collection: str, doc_id: str) -> list[Document]:
        """The kept conflicts of a document (revisions that lost to its current one
        and that nobody resolved), highest ranked first: at most
        :data:`~store.documents.doclayout.MAX_CONFLICTS` after a write of it here."""
        return await docreads.conflicts(self._core, collection, doc_id)

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
        return await docreads.list_documents(
            self._core, collection, limit=limit, token=token, include_deleted=include_deleted
        )

    # -- writing (docwrites, docbulk) ------------------------------------------------

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
        return await docwrites.create_many(
            self._core, collection, items, new_revs=new_revs, ids=ids
        )

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
        return await docbulk.bulk(self._core, collection, writes)

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
        revs = (expected_rev, new_rev, resolves)
        return await docwrites.replace(self._core, collection, doc_id, data, *revs)

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
        return await docwrites.delete(
            self._core, collection, doc_id, expected_rev=expected_rev, new_rev=new_rev
        )

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
        return await docwrites.purge(
            self._core, collection, doc_id, expected_rev=expected_rev, new_rev=new_rev
        )

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
        return await docwrites.delete_conflict(
            self._core, collection, doc_id, rev, expected_rev=expected_rev
        )

    async def delete_revision(self, collection: str, doc_id: str, rev: str) -> Document:
        """CouchDB's ``DELETE …?rev=R``: :meth:`delete` the document if ``rev`` is its
        current revision, :meth:`delete_conflict` if it is a kept conflict's (else
        DocumentConflictError; DocumentNotFoundError if there is no such document)."""
        return await docwrites.delete_revision(self._core, collection, doc_id, rev)

    # -- attachments (docattach) -----------------------------------------------------

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
        how = (filename, content_type, attachment_id, expected_rev)
        return await docattach.put_attachment(self._core, collection, doc_id, content, *how)

    async def attachment(
        self, collection: str, doc_id: str, attachment_id: str, *, include_deleted: bool = False
    ) -> Attachment:
        """An attachment's description (of a soft-deleted document: with ``include_deleted``)."""
        return await docattach.attachment(
            self._core, collection, doc_id, attachment_id, include_deleted=include_deleted
        )

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
        where = (offset, length, include_deleted)
        return await docattach.read_attachment(
            self._core, collection, doc_id, attachment_id, *where
        )

    async def delete_attachment(
        self, collection: str, doc_id: str, attachment_id: str, *, expected_rev: str | None = None
    ) -> Document:
        """Remove an attachment in a new revision (its content leaves the head)."""
        return await docattach.delete_attachment(
            self._core, collection, doc_id, attachment_id, expected_rev=expected_rev
        )

    # -- indexes and queries (docqueries, docfind) -----------------------------------

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
        return await docqueries.declare_index(self._core, collection, name, partition, sort)

    async def drop_index(self, collection: str, name: str) -> None:
        await docqueries.drop_index(self._core, collection, name)

    async def indexes(self, collection: str) -> list[IndexInfo]:
        """The indexes of ``collection`` by name, those whose definitions cannot be read
        here among them (see :class:`IndexInfo`)."""
        return await docqueries.indexes(self._core, collection)

    async def rebuild_index(self, collection: str, name: str) -> None:
        """Drop an index's local entries and build them again from the documents."""
        await docqueries.rebuild_index(self._core, collection, name)

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
        how = (start, end, limit, token, include_deleted)
        return await docqueries.query(self._core, collection, index, partition, *how)

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

    # -- the changes feed (docchanges) -----------------------------------------------

    def changes(
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
        how = (collection, follow, batch, conflicts)
        return docchanges.changes(self._core, since, *how)

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
        how = (collection, limit, token, conflicts)
        return await docchanges.changes_page(self._core, since, *how)
