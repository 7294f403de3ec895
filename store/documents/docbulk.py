"""Bulk writes as CouchDB's ``_bulk_docs`` makes them: creates, replaces, soft
deletes and removals of kept conflicts in one commit, each refused or done on its
own (:class:`BulkWrite` in, :class:`BulkResult` out). Writes that succeed or fail
together are :mod:`store.documents.docwrites`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ledgerd.store.documents import docconflicts, doclayout
from ledgerd.store.documents.doccore import BULK_LIMIT, DocCore
from ledgerd.store.documents.doclayout import DocId, Record, State
from ledgerd.store.documents.docmodel import (
    Document,
    DocumentConflictError,
    DocumentError,
    DocumentNotFoundError,
    MalformedRecordError,
    check_collection,
    check_data,
    id_text,
    parse_id,
    parse_ulid,
    ulid_ms,
)
from ledgerd.store.errors import InvalidArgumentError, StoreError
from ledgerd.store.page.transaction import Transaction


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


async def bulk(core: DocCore, collection: str, writes: Sequence[BulkWrite]) -> list[BulkResult]:
    """:meth:`DocumentStore.bulk <store.documents.documents.DocumentStore.bulk>`."""
    check_collection(collection)
    if len(writes) > BULK_LIMIT:
        raise InvalidArgumentError(f"at most {BULK_LIMIT} documents in one call")
    results: list[BulkResult] = []
    records: list[tuple[str, DocId, Record]] = []
    async with core.write, core.page.transaction() as txn:
        made = iter(core.ids.next_many(sum(1 for w in writes if w.id is None)))
        seen: set[DocId] = set()
        for w in writes:
            shown_id = w.id
            try:
                raw = next(made) if w.id is None else parse_id(w.id)
                shown_id = id_text(raw)
                r = await _one(core, txn, collection, raw, w, seen)
                entries = core.entries(collection, raw, r)
            except (DocumentError, InvalidArgumentError, MalformedRecordError) as e:
                results.append(BulkResult(shown_id, None, e))
                continue
            await txn.put_many(entries)
            records = [x for x in records if x[1] != raw or x[0] != collection]
            records.append((collection, raw, r))
            results.append(BulkResult(shown_id, Document.of(collection, raw, r), None))
        if records:
            await core.commit(txn, records)
    if records:
        await core.after_write()
    return results


async def _one(
    core: DocCore, txn: Transaction, collection: str, raw: DocId, w: BulkWrite, seen: set[DocId]
) -> Record:
    """The record one write puts (``seen``: the ids written before it in the call)."""
    removes = await _removes_conflict(txn, collection, raw, w)
    if raw in seen and not removes:
        raise DocumentConflictError(f"document {id_text(raw)} is written twice")
    seen.add(raw)
    if removes:
        return await _without_conflict(core, txn, collection, raw, w)
    return await _bulk_record(core, txn, collection, raw, w)


async def _removes_conflict(txn: Transaction, collection: str, raw: DocId, w: BulkWrite) -> bool:
    """Whether ``w`` deletes one of the document's kept conflicts (CouchDB's way
    to resolve: ``{"_id", "_rev": a losing revision, "_deleted": true}``, in the
    same call as a write of the winner or not)."""
    if not w.deleted or w.rev is None:
        return False
    rev = parse_ulid(w.rev, "revision")
    return any(k.rev == rev for k in await docconflicts.kept(txn, collection, raw))


async def _without_conflict(
    core: DocCore, txn: Transaction, collection: str, raw: DocId, w: BulkWrite
) -> Record:
    """The record of a new revision, the document otherwise as it is (in ``txn``:
    after an earlier write of the call), that removes the kept conflict ``w.rev``."""
    assert w.rev is not None
    cur = await core.record(txn, collection, raw)
    if cur is None:
        raise DocumentNotFoundError(f"no document {id_text(raw)} in {collection!r}")
    await docconflicts.carry(txn, collection, raw, [w.rev])
    new = core.next_rev(None, cur)
    return cur._replace(rev=new, updated=ulid_ms(new))


async def _bulk_record(
    core: DocCore, txn: Transaction, collection: str, raw: DocId, w: BulkWrite
) -> Record:
    """The record one write of :func:`bulk` puts (its attachments' keys deleted
    from ``txn`` when it writes over a deleted document)."""
    if not w.deleted:
        check_data(w.data)
        core.check_indexed(collection, [w.data])
    if w.rev is None:
        if w.deleted:
            raise DocumentConflictError(
                f"deleting document {id_text(raw)} needs its current revision"
            )
        over = await core.free(txn, collection, raw)
        for a in () if over is None else over.attachments:
            await txn.delete(doclayout.attachment_key(collection, raw, a.id))
        if over is not None:
            await docconflicts.carry(txn, collection, raw)
        rev = core.next_rev(None, over)
        return Record(rev, State.LIVE, ulid_ms(rev), None, None, None, w.data)
    cur = await core.current(txn, collection, raw, w.rev)
    await docconflicts.carry(txn, collection, raw)
    rev = core.next_rev(None, cur)
    ms = ulid_ms(rev)
    if w.deleted:
        return Record(rev, State.DELETED, cur.created, ms, ms, None, cur.data, cur.attachments)
    return Record(rev, State.LIVE, cur.created, ms, None, None, w.data, cur.attachments)
