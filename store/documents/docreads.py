"""Reading documents: one by id (with its kept conflicts, or at a revision), a
document's kept conflicts, the listing of a collection, and the documents an index
query's rows name. It writes nothing; the state it reads through is
:class:`~store.documents.doccore.DocCore`'s.
"""

from __future__ import annotations

from ledgerd.store.documents import docconflicts, doclayout, doctoken
from ledgerd.store.documents.doccore import (
    Damaged,
    DocCore,
    DocumentRange,
    check_id,
    check_limit,
    decode,
    show_id,
)
from ledgerd.store.documents.doclayout import DocId, State
from ledgerd.store.documents.docmodel import (
    Document,
    DocumentNotFoundError,
    MalformedRecordError,
    UnsupportedLayoutError,
    check_collection,
    parse_id,
    parse_ulid,
)
from ledgerd.store.page.view import View
from ledgerd.store.tree.commit import Commit


async def get(
    core: DocCore,
    collection: str,
    doc_id: str,
    include_deleted: bool,
    conflicts: bool,
    rev: str | None,
) -> Document:
    """:meth:`DocumentStore.get <store.documents.documents.DocumentStore.get>`."""
    check_collection(collection)
    raw = parse_id(doc_id)
    wanted = None if rev is None else parse_ulid(rev, "revision")
    snap: View = core.page
    reads_kept = conflicts or wanted is not None
    if reads_kept:  # (the record and its conflicts of one commit)
        snap = await core.page.snapshot()
    r = await core.record(snap, collection, raw)
    kept = await docconflicts.kept(snap, collection, raw) if reads_kept else []
    if wanted is not None and (r is None or r.rev != wanted):
        found = [k for k in kept if k.rev == wanted]
        if not found:
            raise DocumentNotFoundError(
                f"document {doc_id} in {collection!r} has no revision {rev}"
            )
        r = decode(collection, raw, await snap.objects.read_all(found[0].value))
    elif r is None or (r.state is not State.LIVE and not include_deleted and wanted is None):
        raise DocumentNotFoundError(f"no document {doc_id} in {collection!r}")
    doc = Document.of(collection, raw, r)
    # (a kept conflict read by its revision: the others, not itself)
    return doc.with_conflicts(k.rev for k in kept if k.rev != r.rev) if conflicts else doc


async def conflicts(core: DocCore, collection: str, doc_id: str) -> list[Document]:
    """:meth:`DocumentStore.conflicts <store.documents.documents.DocumentStore.conflicts>`."""
    check_collection(collection)
    raw = parse_id(doc_id)
    snap = await core.page.snapshot()
    kept = await docconflicts.kept(snap, collection, raw)
    values = await snap.objects.read_many(k.value for k in kept)
    return [Document.of(collection, raw, decode(collection, raw, values[k.value])) for k in kept]


async def list_documents(
    core: DocCore, collection: str, *, limit: int, token: bytes | None, include_deleted: bool
) -> DocumentRange:
    """:meth:`DocumentStore.list_documents
    <store.documents.documents.DocumentStore.list_documents>`."""
    check_collection(collection)
    check_limit(limit)
    bound = core.binding("list", collection, include_deleted)
    snap = await core.page.snapshot()
    start = doclayout.collection_prefix(collection)
    if token is not None:
        (after,) = doctoken.decode(token, doctoken.LIST, bound, 1)
        start = doclayout.doc_prefix(collection, after)  # (any id: the key API's too)
    found, nxt = await _listed(snap, collection, start, limit, include_deleted)
    values = await snap.objects.read_many(d for _, d in found)
    docs, damaged = [], []
    for doc_id, d in found:
        try:
            check_id(collection, doc_id)
            r = decode(collection, doc_id, values[d])
        except (MalformedRecordError, UnsupportedLayoutError) as e:
            damaged.append(core.damaged(collection, doc_id, e))
            continue
        core.clock.observe(r.rev)
        if include_deleted or r.state is State.LIVE:  # (a head may be missing: key API)
            docs.append(Document.of(collection, doc_id, r))
    token_out = None if nxt is None else doctoken.encode(doctoken.LIST, bound, [nxt])
    return DocumentRange(docs, token_out, damaged)


async def _listed(
    snap: View, collection: str, start: bytes, limit: int, include_deleted: bool
) -> tuple[list[tuple[DocId, bytes]], DocId | None]:
    """The (doc id, body digest) of at most ``limit`` documents from key ``start`` on,
    and the id the next listing starts from (None: none left)."""
    end = doclayout.collection_end(collection)
    found: list[tuple[DocId, bytes]] = []
    state, head_doc = State.LIVE, b""  # the last head's state, and whose it is
    head_doc_id: DocId = head_doc
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
                return found, k.doc_id
            found.append((k.doc_id, e.value))
    return found, None


async def documents_at(
    core: DocCore, head: Commit, collection: str, ids: list[DocId]
) -> tuple[list[Document], list[Damaged]]:
    """The documents ``ids`` at commit ``head`` (an index query's rows), and those of
    them whose bodies cannot be read."""
    snap = await core.page.snapshot(head.id)
    entries = [await snap.get_entry(doclayout.body_key(collection, i)) for i in ids]
    values = await snap.objects.read_many(e.value for e in entries if e is not None)
    out, damaged = [], []
    for doc_id, e in zip(ids, entries, strict=True):
        if e is None:  # cannot happen: the rows reflect this very commit
            raise AssertionError(f"index row of a missing document {show_id(doc_id)}")
        try:
            check_id(collection, doc_id)
            r = decode(collection, doc_id, values[e.value])
        except (MalformedRecordError, UnsupportedLayoutError) as err:
            damaged.append(core.damaged(collection, doc_id, err))
            continue
        core.clock.observe(r.rev)
        out.append(Document.of(collection, doc_id, r))
    return out, damaged
