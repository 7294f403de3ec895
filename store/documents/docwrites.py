"""Writing documents one commit at a time: create (one or many), replace, soft
delete, purge (a damaged document's too) and the removal of a kept conflict. Each
write holds :class:`~store.documents.doccore.DocCore`'s write lock and is one
transaction. Bulk writes that succeed or fail each on their own are
:mod:`store.documents.docbulk`'s; attachments :mod:`store.documents.docattach`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ledgerd.store.documents import docconflicts, doclayout, docreads
from ledgerd.store.documents.doccore import BULK_LIMIT, NO_REV, DocCore, encoded
from ledgerd.store.documents.doclayout import AttachmentMeta, DocId, Record, State, new_record
from ledgerd.store.documents.docmodel import (
    MISSING,
    REV_TOLERANCE,
    Document,
    DocumentConflictError,
    DocumentNotFoundError,
    MalformedRecordError,
    RevClock,
    check_collection,
    check_data,
    id_text,
    parse_id,
    parse_ulid,
    ulid_ms,
    ulid_text,
)
from ledgerd.store.errors import InvalidArgumentError
from ledgerd.store.page.transaction import Transaction


def check_arguments(
    collection: str,
    *,
    doc_id: str | None,
    data: Any,
    new_rev: str | None,
    max_document_bytes: int | None,
) -> None:
    """:meth:`DocumentStore.check <store.documents.documents.DocumentStore.check>`."""
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
            encoded(r, max_document_bytes)


async def create_many(
    core: DocCore,
    collection: str,
    items: Sequence[Any],
    *,
    new_revs: Sequence[str] | None,
    ids: Sequence[str | None] | None,
) -> list[Document]:
    """:meth:`DocumentStore.create_many <store.documents.documents.DocumentStore.create_many>`."""
    chosen = _check_many(collection, items, new_revs, ids)
    core.check_indexed(collection, items)
    records: list[tuple[str, DocId, Record]] = []
    async with core.write, core.page.transaction() as txn:
        entries: list[tuple[bytes, bytes]] = []
        doc_ids: list[DocId] = list(core.ids.next_many(len(items)))
        over = await _write_over(core, txn, collection, chosen, doc_ids)
        revs = _revs(core, len(items), new_revs, over)
        live, limit, encode_head = State.LIVE, core.max_document_bytes, doclayout.encode_head
        keys = doclayout.doc_keys_many(collection, doc_ids)
        # DocCore.entries written out: a call less per document
        for (head, body), doc_id, rev, data in zip(keys, doc_ids, revs, items, strict=True):
            r = new_record((rev, live, ulid_ms(rev), None, None, None, data, ()))
            entries.append((head, encode_head(rev, live)))
            entries.append((body, encoded(r, limit)))
            records.append((collection, doc_id, r))
        await txn.put_many(entries)
        await core.commit(txn, records)
    await core.after_write()
    return [Document.of(*rec) for rec in records]


def _check_many(
    collection: str,
    items: Sequence[Any],
    new_revs: Sequence[str] | None,
    ids: Sequence[str | None] | None,
) -> list[DocId | None] | None:
    """Raise what :func:`create_many` would for its arguments alone; the chosen ids
    parsed (None: none chosen)."""
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
    return chosen


async def _write_over(
    core: DocCore,
    txn: Transaction,
    collection: str,
    chosen: list[DocId | None] | None,
    doc_ids: list[DocId],
) -> dict[int, Record]:
    """Put the chosen ids in ``doc_ids``; the deleted documents they write over, by
    position (their attachments' keys and kept conflicts gone from ``txn``)."""
    over: dict[int, Record] = {}
    for n, i in enumerate(chosen or ()):
        if i is None:
            continue
        doc_ids[n] = i
        cur = await core.free(txn, collection, i)
        if cur is not None:
            over[n] = cur
            for a in cur.attachments:
                await txn.delete(doclayout.attachment_key(collection, i, a.id))
            await docconflicts.carry(txn, collection, i)
    return over


def _revs(
    core: DocCore, count: int, new_revs: Sequence[str] | None, over: dict[int, Record]
) -> list[bytes]:
    """The revisions of ``count`` new documents: the clock's, or those given (checked
    against the revision of a deleted document each writes over)."""
    if new_revs is None and not over:
        return core.clock.next_many(count)
    return [
        core.next_rev(None if new_revs is None else new_revs[n], over.get(n)) for n in range(count)
    ]


async def replace(
    core: DocCore,
    collection: str,
    doc_id: str,
    data: Any,
    expected_rev: str | None,
    new_rev: str | None,
    resolves: Sequence[str],
) -> Document:
    """:meth:`DocumentStore.replace <store.documents.documents.DocumentStore.replace>`."""
    check_collection(collection)
    raw = parse_id(doc_id)
    check_data(data)
    core.check_indexed(collection, [data])
    async with core.write, core.page.transaction() as txn:
        cur = await core.current(txn, collection, raw, expected_rev)
        await docconflicts.carry(txn, collection, raw, resolves)
        rev = core.next_rev(new_rev, cur)
        r = Record(rev, State.LIVE, cur.created, ulid_ms(rev), None, None, data, cur.attachments)
        doc = await core.write_one(txn, collection, raw, r)
    await core.after_write()
    return doc


async def delete(
    core: DocCore,
    collection: str,
    doc_id: str,
    *,
    expected_rev: str | None,
    new_rev: str | None,
) -> Document:
    """:meth:`DocumentStore.delete <store.documents.documents.DocumentStore.delete>`."""
    check_collection(collection)
    raw = parse_id(doc_id)
    async with core.write, core.page.transaction() as txn:
        cur = await core.current(txn, collection, raw, expected_rev)
        await docconflicts.carry(txn, collection, raw)
        rev = core.next_rev(new_rev, cur)
        ms = ulid_ms(rev)
        r = Record(rev, State.DELETED, cur.created, ms, ms, None, cur.data, cur.attachments)
        doc = await core.write_one(txn, collection, raw, r)
    await core.after_write()
    return doc


async def purge(
    core: DocCore,
    collection: str,
    doc_id: str,
    *,
    expected_rev: str | None,
    new_rev: str | None,
) -> Document:
    """:meth:`DocumentStore.purge <store.documents.documents.DocumentStore.purge>`."""
    check_collection(collection)
    raw = parse_id(doc_id)
    async with core.write, core.page.transaction() as txn:
        try:
            cur = await core.current(txn, collection, raw, expected_rev, purge=True)
        except MalformedRecordError:
            found = await _damaged_current(core, txn, collection, raw, expected_rev)
            if found is None:
                raise
            cur = found
        await docconflicts.carry(txn, collection, raw, drop_all=True)
        rev = core.next_rev(new_rev, cur)
        ms = ulid_ms(rev)
        for a in cur.attachments:
            await txn.delete(doclayout.attachment_key(collection, raw, a.id))
        r = Record(rev, State.PURGED, cur.created, ms, cur.deleted, ms, None, ())
        doc = await core.write_one(txn, collection, raw, r)
    await core.after_write()
    return doc


async def _damaged_current(
    core: DocCore, txn: Transaction, collection: str, raw: DocId, expected_rev: str | None
) -> Record | None:
    """What :func:`purge` knows of a document whose body cannot be read: the
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
        else core.clock.now_ms()
    )
    atts = []
    async for e in txn.iter_entries(prefix=doclayout.doc_prefix(collection, raw)):
        k = doclayout.parse_doc_key(e.key)
        if k is not None and k.part == doclayout.ATTACHMENT and k.attachment is not None:
            atts.append(AttachmentMeta(k.attachment, "", "", 0))
    return Record(rev, state, created, None, None, None, None, tuple(atts))


async def delete_conflict(
    core: DocCore, collection: str, doc_id: str, rev: str, *, expected_rev: str | None
) -> Document:
    """:meth:`DocumentStore.delete_conflict
    <store.documents.documents.DocumentStore.delete_conflict>`."""
    check_collection(collection)
    raw = parse_id(doc_id)
    parse_ulid(rev, "revision")
    async with core.write, core.page.transaction() as txn:
        cur = await core.record(txn, collection, raw)
        if cur is None:
            raise DocumentNotFoundError(f"no document {doc_id} in {collection!r}")
        if expected_rev is not None and parse_ulid(expected_rev, "revision") != cur.rev:
            raise DocumentConflictError(
                f"document {doc_id} is at revision {ulid_text(cur.rev)}, not {expected_rev}"
            )
        await docconflicts.carry(txn, collection, raw, [rev])
        new = core.next_rev(None, cur)
        r = cur._replace(rev=new, updated=ulid_ms(new))
        doc = await core.write_one(txn, collection, raw, r)
    await core.after_write()
    return doc


async def delete_revision(core: DocCore, collection: str, doc_id: str, rev: str) -> Document:
    """:meth:`DocumentStore.delete_revision
    <store.documents.documents.DocumentStore.delete_revision>`."""
    raw = parse_ulid(rev, "revision")
    cur = await docreads.get(core, collection, doc_id, True, True, None)
    if cur.conflicts is not None and ulid_text(raw) in cur.conflicts:
        return await delete_conflict(core, collection, doc_id, rev, expected_rev=None)
    if cur.rev == ulid_text(raw) or cur.deleted:  # (a deleted one: not found)
        return await delete(core, collection, doc_id, expected_rev=rev, new_rev=None)
    raise DocumentConflictError(
        f"document {doc_id} is at revision {cur.rev} and keeps no conflict of "
        f"revision {ulid_text(raw)}: nothing deleted"
    )
