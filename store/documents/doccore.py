"""What every job of a :class:`~store.documents.documents.DocumentStore` shares.

This module owns :class:`DocCore` (one page's document state: the page, the
revision clock, the local indexes, the write lock, and reading, encoding and
committing a record), the limits of a call, :class:`Damaged` and
:class:`DocumentRange`, and the small helpers the jobs share (decoding a body,
naming an odd id, binding a continuation token). It owns no operation: those are
the job modules' (reads, writes, bulk, attachments, indexes, changes).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ledgerd.store.documents import doclayout, doctoken
from ledgerd.store.documents.docindex import HeldBudget, Views
from ledgerd.store.documents.doclayout import DocId, Record, State
from ledgerd.store.documents.docmodel import (
    Document,
    DocumentConflictError,
    DocumentNotFoundError,
    DocumentTooLargeError,
    InvalidDocumentError,
    MalformedRecordError,
    RevClock,
    UnsupportedLayoutError,
    id_text,
    parse_ulid,
    ulid_text,
)
from ledgerd.store.errors import ClosedError, InvalidArgumentError, named
from ledgerd.store.page.page import Page
from ledgerd.store.page.transaction import Transaction
from ledgerd.store.page.view import RangeResult, View

log = logging.getLogger(__name__)

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
class DocumentRange(RangeResult[Document]):
    """A page of a listing or query; ``damaged`` its documents whose bodies cannot be
    read (:class:`Damaged`), in their place in the order, not in ``items``."""

    damaged: list[Damaged] = field(default_factory=list)


class DocCore:
    """One page's document state, and the steps every write and read takes."""

    def __init__(
        self,
        page: Page,
        *,
        max_document_bytes: int,
        rev_tolerance: float,
        clock: RevClock,
        held_index_bytes: int,
        held_budget: HeldBudget | None,
    ) -> None:
        self.page = page
        self.max_document_bytes = max_document_bytes
        self.rev_tolerance = rev_tolerance
        self.clock = clock
        self.views = Views(page, held_index_bytes, held_budget)
        self.ids = RevClock(clock.now_ms)
        """New documents' and attachments' ids."""
        self.write = asyncio.Lock()
        """Held by every write: they run one at a time."""

    def observe_views(self) -> None:
        """Take the highest revision the views have seen as seen by the clock."""
        if self.views.max_rev:
            self.clock.observe(self.views.max_rev)

    async def record(self, view: View, collection: str, doc_id: DocId) -> Record | None:
        """The document's record in ``view`` (None: it has no body)."""
        e = await view.get_entry(doclayout.body_key(collection, doc_id))
        if e is None:
            return None
        r = decode(collection, doc_id, await view.objects.read_all(e.value))
        self.clock.observe(r.rev)
        return r

    def next_rev(self, new_rev: str | None, current: Record | None) -> bytes:
        """The revision of a write: ``new_rev`` if given (checked), else the clock's next."""
        if current is not None:
            self.clock.observe(current.rev)
        if new_rev is None:
            return self.clock.next()
        rev = parse_ulid(new_rev, "revision")
        self.clock.check_supplied(rev, current.rev if current else None, self.rev_tolerance)
        return rev

    def check_indexed(self, collection: str, items: Sequence[Any]) -> None:
        """InvalidDocumentError if a document's indexed value holds a '/'."""
        for d in self.views.definitions(collection):
            for data in items:
                path = d.reserved_value(data)
                if path is not None:
                    raise InvalidDocumentError(
                        f"field {path!r} is indexed by {d.name!r}: its value may not contain '/'"
                    )

    async def put_record(
        self, txn: Transaction, collection: str, doc_id: DocId, r: Record
    ) -> Document:
        """Put the record's head and body in ``txn``; the document it makes."""
        await txn.put_many(self.entries(collection, doc_id, r))
        return Document.of(collection, doc_id, r)

    def entries(
        self, collection: str, doc_id: DocId, r: Record
    ) -> tuple[tuple[bytes, bytes], tuple[bytes, bytes]]:
        """The head and body entries (key, value) of a document's record."""
        body = encoded(r, self.max_document_bytes)
        head_key, body_key = doclayout.doc_keys(collection, doc_id)
        return (head_key, doclayout.encode_head(r.rev, r.state)), (body_key, body)

    async def commit(self, txn: Transaction, records: Sequence[tuple[str, DocId, Record]]) -> None:
        """Commit ``txn``, which put the bodies of ``records``, with their index rows
        (:meth:`docindex.Views.commit`), and the page's marker, written again with every
        commit: a device that deleted the page concurrently leaves it a document page
        (a join keeps the marker while any device wrote it since it saw it go)."""
        await txn.put_many([(doclayout.MARKER, doclayout.MARK)])
        await self.views.commit(txn, records)

    async def write_one(
        self, txn: Transaction, collection: str, doc_id: DocId, r: Record
    ) -> Document:
        """Put one document's record in ``txn`` and commit it."""
        doc = await self.put_record(txn, collection, doc_id, r)
        await self.commit(txn, [(collection, doc_id, r)])
        return doc

    async def after_write(self) -> None:
        """Bring the indexes to the head (a merge after a write, definitions), unless the
        store closed meanwhile: the write is done, and the next store catches up."""
        with contextlib.suppress(ClosedError):
            await self.views.catch_up()

    async def current(
        self,
        txn: Transaction,
        collection: str,
        raw: DocId,
        expected_rev: str | None,
        *,
        purge: bool = False,
    ) -> Record:
        """The record a write changes: DocumentNotFoundError if there is none (or it is
        deleted, but for a ``purge``), DocumentConflictError if it is not at ``expected_rev``."""
        r = await self.record(txn, collection, raw)
        if r is None or r.state is State.PURGED or (r.state is State.DELETED and not purge):
            raise DocumentNotFoundError(f"no document {id_text(raw)} in {collection!r}")
        if expected_rev is not None and parse_ulid(expected_rev, "revision") != r.rev:
            raise DocumentConflictError(
                f"document {id_text(raw)} is at revision {ulid_text(r.rev)}, not {expected_rev}"
            )
        return r

    async def free(self, txn: Transaction, collection: str, raw: DocId) -> Record | None:
        """DocumentConflictError if a document that is not deleted has the id ``raw``;
        else the record of the deleted or purged one a create writes over (None: none)."""
        cur = await self.record(txn, collection, raw)  # (damaged: MalformedRecordError)
        if cur is not None and cur.state is State.LIVE:
            raise DocumentConflictError(
                f"document {id_text(raw)} exists in {collection!r} (at revision "
                f"{ulid_text(cur.rev)}): name its revision to replace it"
            )
        return cur

    def binding(self, kind: str, *parts: Any) -> bytes:
        """What a token of ``kind`` continues: that listing of the page with ``parts`` (a
        changes token's are the change's ``since`` and the key prefix it covers: one
        collection's, or every one's)."""
        return doctoken.binding(kind, self.page.ledger, self.page.id, *parts)

    def damaged(
        self, collection: str, doc_id: DocId, e: MalformedRecordError | UnsupportedLayoutError
    ) -> Damaged:
        """The report of a document whose body cannot be read (logged)."""
        log.warning("page %s: %s", named(self.page.id), e)
        code = e.code if isinstance(e, UnsupportedLayoutError) else "corrupt"
        return Damaged(collection, show_id(doc_id), str(e), code)


def encoded(r: Record, max_document_bytes: int) -> bytes:
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


async def marker_if_lost(view: View) -> list[tuple[bytes, bytes]]:
    """The marker's entry to put if ``view``'s page does not hold it (a new page, or one
    deleted or cleared since its store opened: reads look for the marker, and merges
    take a page's documents whole only where it is); else nothing."""
    if await view.get_entry(doclayout.MARKER) is not None:
        return []
    return [(doclayout.MARKER, doclayout.MARK)]


def decode(collection: str, doc_id: DocId, body: bytes) -> Record:
    """The record of a document's stored ``body``; MalformedRecordError if it is not one,
    UnsupportedLayoutError if it is one of a later layout."""
    try:
        return doclayout.decode_record(body)
    except doclayout.FutureLayoutError as e:
        raise UnsupportedLayoutError(
            f"document {show_id(doc_id)} in {collection!r} cannot be read or changed by "
            f"this ledgerd: {e}; upgrade ledgerd on this device"
        ) from None
    except ValueError as e:
        raise MalformedRecordError(
            f"document {show_id(doc_id)} in {collection!r} is damaged: {e}"
        ) from None


def show_id(doc_id: DocId) -> str:
    """A document id as the API shows it: a ULID's text, or ``hex:`` and the bytes of
    an id that is not 16 bytes (a key written through the key API may hold any id;
    its hex could otherwise read as a ULID's 26 characters)."""
    if isinstance(doc_id, str) or len(doc_id) == doclayout.ULID_SIZE:
        return id_text(doc_id)
    return "hex:" + doc_id.hex()


def odd_id(collection: str, doc_id: bytes, *, deleted: bool = False) -> MalformedRecordError:
    """The error of a body key whose id is not a ULID's 16 bytes; ``deleted``: the
    changes feed's, for such a key deleted since the feed's start."""
    why = f"its id is {len(doc_id)} bytes, not a ULID's 16 (a key written through the key API)"
    if deleted:
        return MalformedRecordError(
            f"document {show_id(doc_id)} in {collection!r} is gone: its body key, "
            f"damaged ({why}), was deleted"
        )
    return MalformedRecordError(
        f"document {show_id(doc_id)} in {collection!r} is damaged: {why}; "
        "delete its keys through the key API"
    )


def check_id(collection: str, doc_id: DocId) -> None:
    """MalformedRecordError for a document key whose id is not a ULID's 16 bytes: no
    document can be shown, changed or purged under it."""
    if isinstance(doc_id, bytes) and len(doc_id) != doclayout.ULID_SIZE:
        raise odd_id(collection, doc_id)


def check_limit(limit: int) -> None:
    """InvalidArgumentError unless ``limit`` is 1 to :data:`LIST_LIMIT`."""
    if not isinstance(limit, int) or not 1 <= limit <= LIST_LIMIT:
        raise InvalidArgumentError(f"limit must be 1-{LIST_LIMIT}")
