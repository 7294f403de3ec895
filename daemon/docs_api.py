"""The HTTP endpoints of documents: ``/v1/ledgers/{L}/pages/{P}/docs/{collection}[/{id}]``.

This module owns listing, creating, reading, replacing, deleting and purging documents,
and ``_bulk_docs`` (CouchDB's): how their requests are read and answered. What every
document route shares (names in the path, the document store, JSON texts) is
:mod:`daemon.docs_http`'s; indexes and queries are :mod:`daemon.indexes_api`'s,
attachments :mod:`daemon.attachments_api`'s, the changes feed :mod:`daemon.changes_api`'s.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ledgerd.daemon import errors as ae
from ledgerd.daemon.api import Api, Params
from ledgerd.daemon.codec import parse_json
from ledgerd.daemon.docs_http import (
    DEFAULT_LIMIT,
    MAX_LIMIT,
    doc_response,
    document_data,
    document_store,
    documents_page,
    dumps,
    expected_rev,
    segments,
)
from ledgerd.daemon.query import Query
from ledgerd.store import BulkWrite, DocumentStore, StoreError


async def list_documents(api: Api, request: web.Request, p: Params) -> web.Response:
    q = Query.of(request)
    (collection,) = segments(request)
    DocumentStore.check(collection)
    limit = q.utf8_int("limit", DEFAULT_LIMIT, 1, MAX_LIMIT)
    token = q.url_token()
    deleted = q.utf8_flag("deleted")
    docs = await document_store(api, p, write=False)
    return await documents_page(
        lambda n: docs.list_documents(collection, limit=n, token=token, include_deleted=deleted),
        limit,
        api.cfg.max_listing_bytes,
    )


async def create_document(api: Api, request: web.Request, p: Params) -> web.Response:
    q = Query.of(request)
    (collection,) = segments(request)
    data = await document_data(api, request)
    new_rev = q.utf8("new_rev")
    max_bytes = api.cfg.max_document_bytes  # a document too large makes no page either
    DocumentStore.check(collection, data=data, new_rev=new_rev, max_document_bytes=max_bytes)
    docs = await document_store(api, p, write=True)
    doc = await docs.create(collection, data, new_rev=new_rev)
    return doc_response(doc, 201)


async def get_document(api: Api, request: web.Request, p: Params) -> web.Response:
    """A document; ``?conflicts=1``: with its kept conflicts' revisions in
    ``_meta._conflicts``; ``?rev=R``: that revision (the current one or a kept
    conflict's, whatever its state)."""
    q = Query.of(request)
    collection, doc_id = segments(request)
    DocumentStore.check(collection, doc_id=doc_id)
    docs = await document_store(api, p, write=False)
    doc = await docs.get(
        collection,
        doc_id,
        include_deleted=q.utf8_flag("deleted"),
        conflicts=q.utf8_flag("conflicts"),
        rev=q.utf8("rev"),
    )
    return doc_response(doc)


def _resolves(request: web.Request) -> list[str]:
    """``?resolves=R1,R2``: the kept conflicts a write supersedes (none when absent)."""
    q = Query.of(request)
    v = q.utf8("resolves")
    return [] if not v else [r.strip() for r in v.split(",")]


async def replace_document(api: Api, request: web.Request, p: Params) -> web.Response:
    """PUT a document: with ``If-Match`` or ``?rev=``, a new revision of it (``If-Match:
    *``: of whatever revision is current); without either, as in CouchDB, a new document
    with the id of the path (201), 409 ``conflict`` when a document that is not deleted
    has it."""
    q = Query.of(request)
    collection, doc_id = segments(request)
    condition = request.headers.get("If-Match") is not None or q.utf8("rev") is not None
    rev = expected_rev(request)
    data = await document_data(api, request)
    new_rev = q.utf8("new_rev")
    if not condition:
        max_bytes = api.cfg.max_document_bytes  # a document too large makes no page either
        DocumentStore.check(
            collection, doc_id=doc_id, data=data, new_rev=new_rev, max_document_bytes=max_bytes
        )
        docs = await document_store(api, p, write=True)
        return doc_response(await docs.create(collection, data, id=doc_id, new_rev=new_rev), 201)
    DocumentStore.check(collection, doc_id=doc_id, data=data)
    docs = await document_store(api, p, write=False)
    doc = await docs.replace(
        collection,
        doc_id,
        data,
        expected_rev=rev,
        new_rev=new_rev,
        resolves=_resolves(request),
    )
    return doc_response(doc)


async def delete_document(api: Api, request: web.Request, p: Params) -> web.Response:
    """Soft-delete a document; as in CouchDB, ``?rev=R`` (or ``If-Match``) naming one
    of its kept conflicts removes that conflict instead (a new revision of the
    document, otherwise as it was)."""
    q = Query.of(request)
    collection, doc_id = segments(request)
    DocumentStore.check(collection, doc_id=doc_id)
    docs = await document_store(api, p, write=False)
    rev, new_rev = expected_rev(request), q.utf8("new_rev")
    if rev is not None and new_rev is None:
        return doc_response(await docs.delete_revision(collection, doc_id, rev))
    doc = await docs.delete(collection, doc_id, expected_rev=rev, new_rev=new_rev)
    return doc_response(doc)


async def purge_document(api: Api, request: web.Request, p: Params) -> web.Response:
    q = Query.of(request)
    collection, doc_id, _ = segments(request)
    DocumentStore.check(collection, doc_id=doc_id)
    docs = await document_store(api, p, write=False)
    doc = await docs.purge(
        collection, doc_id, expected_rev=expected_rev(request), new_rev=q.utf8("new_rev")
    )
    return doc_response(doc)


MAX_BULK_DOCS = 10_000
"""Most documents one ``_bulk_docs`` request takes (the store's bound on one call); its
body is bound by ``max_batch_bytes`` too."""


def _bulk_write(item: Any) -> BulkWrite | str:
    """One of ``_bulk_docs``' documents as a write: its own fields are its data, with
    ``_id``, ``_rev`` and ``_deleted`` taken out; why not, for one that is not a
    document of that shape."""
    if not isinstance(item, dict):
        return "a document is a JSON object"
    data = dict(item)
    doc_id, rev, deleted = (
        data.pop("_id", None),
        data.pop("_rev", None),
        data.pop("_deleted", False),
    )
    if doc_id is not None and not isinstance(doc_id, str):
        return "_id must be text"
    if rev is not None and not isinstance(rev, str):
        return "_rev must be text"
    if not isinstance(deleted, bool):
        return "_deleted must be true or false"
    return BulkWrite(data, id=doc_id, rev=rev, deleted=deleted)


async def bulk_docs(api: Api, request: web.Request, p: Params) -> web.Response:
    """POST ``{"docs": [...]}`` (CouchDB's ``_bulk_docs``): every document written in one
    commit, each on its own; answers (201) a list in the same order of ``{"id", "rev",
    "ok": true}`` or ``{"id", "error", "reason"}`` (``error`` the API's error code)."""
    collection, _ = segments(request)
    DocumentStore.check(collection)
    body = parse_json(
        await api.read_body(request, api.cfg.max_batch_bytes, "the _bulk_docs body"),
        "the _bulk_docs body",
    )
    if not isinstance(body, dict) or not isinstance(body.get("docs"), list):
        raise ae.BadRequest('a _bulk_docs body is {"docs": [...]}')
    if unknown := sorted(set(body) - {"docs", "new_edits"}):
        raise ae.BadRequest(f'_bulk_docs takes {{"docs": [...]}}, not {", ".join(unknown)}')
    if body.get("new_edits", True) is not True:
        raise ae.BadRequest('_bulk_docs takes {"docs": [...]} (new_edits=false is not supported)')
    items = body["docs"]
    if len(items) > MAX_BULK_DOCS:
        raise ae.BadRequest(f"_bulk_docs takes at most {MAX_BULK_DOCS} documents")
    writes = [_bulk_write(item) for item in items]
    valid = [w for w in writes if isinstance(w, BulkWrite)]
    max_bytes = api.cfg.max_document_bytes
    alone = all(_refused(collection, w, max_bytes) for w in valid)  # (to the first good one)
    if alone:  # every write is refused for what it is alone: as a single write, it makes
        valid = []  # no page (opening the store would make one)
    results = []
    done = iter(
        await (await document_store(api, p, write=True)).bulk(collection, valid) if valid else []
    )
    for item, w in zip(items, writes, strict=True):
        if not isinstance(w, BulkWrite):
            given = item.get("_id") if isinstance(item, dict) else None
            results.append({"id": given, "error": "invalid_document", "reason": w})
            continue
        if alone:
            code, reason = _refused(collection, w, max_bytes) or ("internal", "")
            results.append({"id": w.id, "error": code, "reason": reason})
            continue
        r = next(done)
        if r.document is not None:
            results.append({"id": r.id, "rev": r.document.rev, "ok": True})
        else:
            code = ae.from_store(r.error).code if r.error is not None else "internal"
            results.append({"id": r.id, "error": code, "reason": str(r.error)})
    return web.json_response(results, status=201, dumps=dumps)


def _refused(collection: str, w: BulkWrite, max_bytes: int) -> tuple[str, str] | None:
    """The error code and reason that refuse ``w`` for what it is alone (as
    :meth:`DocumentStore.check` finds them, before any page is made), or None."""
    try:
        DocumentStore.check(collection, doc_id=w.id, data=w.data, max_document_bytes=max_bytes)
    except StoreError as e:
        return ae.from_store(e).code, str(e)
    return None
