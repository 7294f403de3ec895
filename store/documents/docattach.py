"""A document's attachments: adding or replacing one (its content staged before
the write lock, stored LAZY), describing, streaming and removing one. Each change
is a new revision of the document. The documents themselves are
:mod:`store.documents.docwrites`'s.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from ledgerd.store.documents import docconflicts, doclayout, docreads
from ledgerd.store.documents.doccore import DocCore
from ledgerd.store.documents.doclayout import AttachmentMeta, DocId, Record, State
from ledgerd.store.documents.docmodel import (
    Attachment,
    AttachmentNotFoundError,
    Document,
    check_collection,
    check_text,
    parse_id,
    parse_ulid,
    ulid_ms,
    ulid_text,
)
from ledgerd.store.page.transaction import Transaction
from ledgerd.store.pieces.objects import Source
from ledgerd.store.tree.btree import Priority


async def put_attachment(
    core: DocCore,
    collection: str,
    doc_id: str,
    content: Source,
    filename: str,
    content_type: str,
    attachment_id: str | None,
    expected_rev: str | None,
) -> tuple[Document, Attachment]:
    """:meth:`DocumentStore.put_attachment
    <store.documents.documents.DocumentStore.put_attachment>`."""
    check_collection(collection)
    raw = parse_id(doc_id)
    check_text(filename, "filename")
    check_text(content_type, "content type")
    att = parse_ulid(attachment_id, "attachment id") if attachment_id else core.ids.next()
    key = doclayout.attachment_key(collection, raw, att)
    # The content is staged before the write lock, so a slow upload holds up no write.
    staging = core.page.transaction()
    try:
        await staging.put(key, content, Priority.LAZY)
        meta = AttachmentMeta(att, filename, content_type, await staging.size(key))
        async with core.write:
            if core.page.head.id == staging.base.id:
                txn, copy = staging, False
            else:  # the page moved: a fresh transaction on the head, the content copied
                txn, copy = core.page.transaction(), True
            try:
                if copy:
                    await txn.put(key, await staging.read(key), Priority.LAZY)
                doc = await _attach(core, txn, collection, raw, meta, attachment_id, expected_rev)
            finally:
                await txn.rollback()
    finally:
        await staging.rollback()
    await core.after_write()
    return doc, Attachment.of(meta)


async def _attach(
    core: DocCore,
    txn: Transaction,
    collection: str,
    raw: DocId,
    meta: AttachmentMeta,
    attachment_id: str | None,
    expected_rev: str | None,
) -> Document:
    """Commit the revision that adds ``meta`` (replaces ``attachment_id``) in ``txn``,
    which holds its content."""
    cur = await core.current(txn, collection, raw, expected_rev)
    if attachment_id and not any(a.id == meta.id for a in cur.attachments):
        raise AttachmentNotFoundError(f"no attachment {attachment_id}")
    await docconflicts.carry(txn, collection, raw)
    atts = tuple(a for a in cur.attachments if a.id != meta.id) + (meta,)
    rev = core.next_rev(None, cur)
    r = Record(rev, State.LIVE, cur.created, ulid_ms(rev), None, None, cur.data, atts)
    return await core.write_one(txn, collection, raw, r)


async def attachment(
    core: DocCore, collection: str, doc_id: str, attachment_id: str, *, include_deleted: bool
) -> Attachment:
    """:meth:`DocumentStore.attachment <store.documents.documents.DocumentStore.attachment>`."""
    att = ulid_text(parse_ulid(attachment_id, "attachment id"))  # (malformed: invalid_id)
    doc = await docreads.get(
        core, collection, doc_id, include_deleted=include_deleted, conflicts=False, rev=None
    )
    for a in doc.attachments:
        if a.id == att:
            return a
    raise AttachmentNotFoundError(f"document {doc_id} has no attachment {attachment_id}")


async def read_attachment(
    core: DocCore,
    collection: str,
    doc_id: str,
    attachment_id: str,
    offset: int,
    length: int | None,
    include_deleted: bool,
) -> AsyncIterator[bytes]:
    """:meth:`DocumentStore.read_attachment
    <store.documents.documents.DocumentStore.read_attachment>`."""
    a = await attachment(core, collection, doc_id, attachment_id, include_deleted=include_deleted)
    key = doclayout.attachment_key(collection, parse_id(doc_id), parse_ulid(a.id))
    return await core.page.read(key, offset, length)


async def delete_attachment(
    core: DocCore, collection: str, doc_id: str, attachment_id: str, *, expected_rev: str | None
) -> Document:
    """:meth:`DocumentStore.delete_attachment
    <store.documents.documents.DocumentStore.delete_attachment>`."""
    check_collection(collection)
    raw = parse_id(doc_id)
    att = parse_ulid(attachment_id, "attachment id")
    async with core.write, core.page.transaction() as txn:
        cur = await core.current(txn, collection, raw, expected_rev)
        if not any(a.id == att for a in cur.attachments):
            raise AttachmentNotFoundError(f"document {doc_id} has no attachment {attachment_id}")
        await txn.delete(doclayout.attachment_key(collection, raw, att))
        await docconflicts.carry(txn, collection, raw)
        rev = core.next_rev(None, cur)
        atts = tuple(a for a in cur.attachments if a.id != att)
        r = Record(rev, State.LIVE, cur.created, ulid_ms(rev), None, None, cur.data, atts)
        doc = await core.write_one(txn, collection, raw, r)
    await core.after_write()
    return doc
