"""The HTTP endpoints of documents: ``/v1/ledgers/{L}/pages/{P}/docs/...``.

This module owns how the document layer (:class:`ledgerd.store.DocumentStore`) maps
onto HTTP: documents as JSON bodies, attachments as raw streamed bodies with their
content type (ranged reads), index declarations and queries, and the changes feed
(JSON, or newline-delimited JSON while following). Its handlers are entries of
:data:`ledgerd.daemon.api.ROUTES`; the routes' matching, page leases, error
responses and request bodies are :mod:`daemon.api`'s, the error codes
:mod:`daemon.errors`'.

Names in the path (collection, document id, attachment id, index name) are
percent-encoded UTF-8. A document's body is its ``_data``; the expected revision
of a write is ``If-Match: "REV"`` or ``?rev=REV``, a client-supplied new one
``?new_rev=REV``. Continuation tokens are opaque URL-safe base64 (bound to the
listing they continue: :mod:`store.documents.doctoken`), commit ids hex.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import math
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, quote, unquote_to_bytes

from aiohttp import web

from ledgerd.daemon import errors as ae
from ledgerd.daemon.codec import (
    flag_param,
    from_hex,
    integer_param,
    number_param,
    parse_json,
    repeated_param,
    token_param,
)
from ledgerd.daemon.config import MIN_HEARTBEAT
from ledgerd.daemon.protocol import connection_lost
from ledgerd.store import (
    BulkWrite,
    Changes,
    CommitNotFoundError,
    Damaged,
    Document,
    DocumentRange,
    DocumentStore,
    RangeResult,
    StoreError,
)
from ledgerd.store.errors import named

if TYPE_CHECKING:
    from ledgerd.daemon.api import Api, Params
    from ledgerd.store import Page

log = logging.getLogger(__name__)

DEFAULT_LIMIT, MAX_LIMIT = 100, 1000
"""Documents per listing or query page (the store's bound is 1,000)."""
HEARTBEAT = 10.0
"""Seconds between the empty lines a followed changes feed sends while nothing changes
(``?heartbeat=`` sets it, at least :data:`MIN_HEARTBEAT`): they keep proxies and idle
timers of clients from closing a quiet feed."""
DOCS_PREFIX = 7
"""Segments of ``/v1/ledgers/L/pages/P/docs`` in a split raw path (the leading '' included)."""
DOCUMENT_BODY_FACTOR = 4
"""A document's JSON text may be this many times ``max_document_bytes`` (escapes and
blanks make it longer than the encoded document), and no more: a body is parsed
whole, in memory and on the event loop, so ``max_batch_bytes`` (64 MiB) of it would
take a gigabyte and seconds before the document was found too large."""
JSON_TYPE = "application/json"
NDJSON_TYPE = "application/x-ndjson"


# -- request parts -----------------------------------------------------------------


def _segments(request: web.Request) -> list[str]:
    """The path's segments after ``docs/``, percent-decoded UTF-8."""
    parts = request.raw_path.split("?", 1)[0].split("/")[DOCS_PREFIX:]
    try:
        return [unquote_to_bytes(s).decode() for s in parts]
    except UnicodeDecodeError:
        raise ae.BadRequest("names in a document path must be UTF-8") from None


_PARAMS = "ledgerd.docs_params"
"""Where a request keeps its decoded query parameters (:func:`_params`)."""


def _params(request: web.Request) -> dict[str, str | None]:
    """The query parameters, decoded as strict UTF-8: aiohttp's ``request.query`` turns
    bytes that are not UTF-8 into U+FFFD, so a collection, an ``eq`` value or a revision
    would silently name something the client never sent. A name given more than once
    is kept once, with ``None`` for its value: :func:`_query` refuses it."""
    found: dict[str, str | None] | None = request.get(_PARAMS)
    if found is None:
        found = {}
        try:
            pairs = parse_qsl(
                request.rel_url.raw_query_string,
                keep_blank_values=True,
                encoding="utf-8",
                errors="strict",
            )
        except UnicodeDecodeError:
            raise ae.BadRequest("query parameters must be percent-encoded UTF-8") from None
        for k, v in pairs:
            found[k] = None if k in found else v
        request[_PARAMS] = found
    return found


def _query(request: web.Request, name: str) -> str | None:
    """The query parameter ``name`` (None when absent); 400 when given more than once
    (each takes one value: the first winning would act on what the client may not
    have meant)."""
    params = _params(request)
    v = params.get(name)
    if v is None and name in params:
        raise repeated_param(name)
    return v


def _flag(request: web.Request, name: str) -> bool:
    """A flag (:func:`codec.flag_param`); false when absent."""
    v = _query(request, name)
    return v is not None and flag_param(name, v)


def _int(request: web.Request, name: str, default: int, lo: int, hi: int) -> int:
    v = _query(request, name)
    if v is None or v == "":
        return default
    n = integer_param(name, v)
    if not lo <= n <= hi:
        raise ae.BadRequest(f"query parameter {name} must be {lo}-{hi}")
    return n


def _seconds(request: web.Request, name: str, default: float, lo: float) -> float:
    v = _query(request, name)
    if v is None or v == "":
        return default
    n = number_param(name, v)
    if not math.isfinite(n) or n < lo:
        raise ae.BadRequest(f"query parameter {name} must be a number of seconds, at least {lo:g}")
    return n


def _json_param(request: web.Request, name: str) -> Any:
    v = _query(request, name)
    what = f"query parameter {name} (JSON: a string is quoted, {name}=%22Oslo%22)"
    return None if v is None else parse_json(v, what)


def _bound(request: web.Request, name: str) -> Any:
    """``start`` or ``end`` of a query's sort range (JSON), None when left out. ``null``
    and an empty value are 400: null is a sort value (the lowest), so ``end=null``
    read as "no bound" would answer documents the range excludes, and read as a value
    would answer none; an open range leaves the parameter out."""
    v = _query(request, name)
    if v is None:
        return None
    if v.strip() == "":
        raise ae.BadRequest(f"query parameter {name} is empty: leave it out for an open range")
    value = _json_param(request, name)
    if value is None:
        raise ae.BadRequest(
            f"query parameter {name} is null: leave it out for an open range"
            " (null is the lowest sort value, not a bound)"
        )
    return value


def _token(request: web.Request) -> bytes | None:
    """``?token=``: the ``next`` of the page before, URL-safe base64 without padding
    (a token in standard base64, as ledgerd sent them before, is read too)."""
    t = _query(request, "token")
    if not t:
        return None
    t = t.replace("-", "+").replace("_", "/")
    return token_param(t + "=" * (-len(t) % 4))


def _token_text(token: bytes) -> str:
    """A continuation token as ``next`` carries it: URL-safe base64 without padding, so
    that it goes into a query string as it is."""
    return base64.urlsafe_b64encode(token).decode().rstrip("=")


def _expected_rev(request: web.Request) -> str | None:
    """``If-Match: "REV"`` (or ``?rev=REV``): the revision a write expects to replace.
    An empty one (``?rev=``, ``If-Match: ""``) is kept, so that the store refuses it
    (``invalid_id``) instead of the write going ahead unconditionally; ``If-Match: *``
    is any current revision (the document must exist, as for every write)."""
    header = request.headers.get("If-Match")
    param = _query(request, "rev")
    if header is not None:
        if header.strip() == "*" and param is None:  # RFC 9110: any current revision
            return None
        header = header.strip().removeprefix("W/").strip('"')
        if param is not None and param != header:
            raise ae.BadRequest("If-Match and ?rev= name different revisions")
        return header
    return param


def body_limit(api: Api) -> int:
    """The longest JSON body of a document or an index declaration:
    :data:`DOCUMENT_BODY_FACTOR` times ``max_document_bytes``."""
    return DOCUMENT_BODY_FACTOR * api.cfg.max_document_bytes


async def _data(api: Api, request: web.Request) -> Any:
    """The request's JSON body (a document's ``_data``), at most :func:`body_limit`."""
    body = await api.read_body(request, body_limit(api), "the document's JSON text")
    try:
        return parse_json(body, "the document")
    except ae.BadRequest as e:
        raise ae.InvalidDocument(str(e)) from None


async def _store(api: Api, p: Params, *, write: bool) -> DocumentStore:
    """The page's document store. A write makes the page (and ledger) if needed; a read
    needs a page that is a document page already (opening one makes it one)."""
    if write:  # opening the store writes its marker: a page made here is not empty
        async with api.first_write(p.ledger, p.page) as page:
            return await _open_store(api, page)
    page = await api.page(p.ledger, p.page, create=False)
    if not await DocumentStore.holds_documents(page):
        raise ae.NotDocuments(
            f"page {named(p.page)} of ledger {named(p.ledger)} holds no documents"
        )
    return await _open_store(api, page)


async def _open_store(api: Api, page: Page) -> DocumentStore:
    return await DocumentStore.open(
        page,
        max_document_bytes=api.cfg.max_document_bytes,
        held_budget=api.held_budget,
    )


def _doc_response(doc: Document, status: int = 200) -> web.Response:
    text = _document_text(doc)
    if text is None:
        raise ae.Corrupt(_not_json(doc).message)
    return web.Response(
        text=text, status=status, content_type=JSON_TYPE, headers={"ETag": f'"{doc.rev}"'}
    )


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _document_text(doc: Document) -> str | None:
    """The document's JSON text; None if its data has no JSON form (bytes, NaN, a key
    that is not text: a record written through the key API, or come from a peer,
    that decodes but holds what no write of the document layer stores)."""
    try:
        return json.dumps(doc.to_json(), ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return None


def _not_json(doc: Document) -> Damaged:
    message = f"document {doc.id} in {doc.collection!r} is damaged: its data is not JSON"
    log.warning("%s", message)
    return Damaged(doc.collection, doc.id, message)


async def _documents_page(
    fetch: Callable[[int], Awaitable[RangeResult[Document] | Changes]], limit: int, budget: int
) -> web.Response:
    """``{"documents": [...], "next": token}`` (for changes, ``"commit"`` first) of at
    most ``limit`` documents whose JSON stays under ``budget`` bytes (at least one
    document): a page that would pass it is asked again, shorter, so that its token
    continues right after the last one sent."""
    while True:
        res = await fetch(limit)
        found = res.documents if isinstance(res, Changes) else res.items
        texts: list[str] = []
        damaged = list(res.damaged) if isinstance(res, Changes | DocumentRange) else []
        used = taken = 0
        for d in found:
            t = _document_text(d)
            if t is None:
                damaged.append(_not_json(d))
            elif texts and used + len(t) > budget:
                break
            else:
                texts.append(t)
                used += len(t)
            taken += 1
        if taken == len(found):
            lead = f'"commit":"{res.commit.hex()}",' if isinstance(res, Changes) else ""
            nxt = None if res.token is None else _token_text(res.token)
            bad = f'"damaged":{_dumps([d.to_json() for d in damaged])},' if damaged else ""
            body = f'{{{lead}"documents":[{",".join(texts)}],{bad}"next":{_dumps(nxt)}}}'
            return web.Response(text=body, content_type=JSON_TYPE)
        limit = taken


# -- documents ---------------------------------------------------------------------


async def list_documents(api: Api, request: web.Request, p: Params) -> web.Response:
    (collection,) = _segments(request)
    DocumentStore.check(collection)
    limit = _int(request, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT)
    token = _token(request)
    deleted = _flag(request, "deleted")
    docs = await _store(api, p, write=False)
    return await _documents_page(
        lambda n: docs.list_documents(collection, limit=n, token=token, include_deleted=deleted),
        limit,
        api.cfg.max_listing_bytes,
    )


async def create_document(api: Api, request: web.Request, p: Params) -> web.Response:
    (collection,) = _segments(request)
    data = await _data(api, request)
    new_rev = _query(request, "new_rev")
    max_bytes = api.cfg.max_document_bytes  # a document too large makes no page either
    DocumentStore.check(collection, data=data, new_rev=new_rev, max_document_bytes=max_bytes)
    docs = await _store(api, p, write=True)
    doc = await docs.create(collection, data, new_rev=new_rev)
    return _doc_response(doc, 201)


async def get_document(api: Api, request: web.Request, p: Params) -> web.Response:
    """A document; ``?conflicts=1``: with its kept conflicts' revisions in
    ``_meta._conflicts``; ``?rev=R``: that revision (the current one or a kept
    conflict's, whatever its state)."""
    collection, doc_id = _segments(request)
    DocumentStore.check(collection, doc_id=doc_id)
    docs = await _store(api, p, write=False)
    doc = await docs.get(
        collection,
        doc_id,
        include_deleted=_flag(request, "deleted"),
        conflicts=_flag(request, "conflicts"),
        rev=_query(request, "rev"),
    )
    return _doc_response(doc)


def _resolves(request: web.Request) -> list[str]:
    """``?resolves=R1,R2``: the kept conflicts a write supersedes (none when absent)."""
    v = _query(request, "resolves")
    return [] if not v else [r.strip() for r in v.split(",")]


async def replace_document(api: Api, request: web.Request, p: Params) -> web.Response:
    """PUT a document: with ``If-Match`` or ``?rev=``, a new revision of it (``If-Match:
    *``: of whatever revision is current); without either, as in CouchDB, a new document
    with the id of the path (201), 409 ``conflict`` when a document that is not deleted
    has it."""
    collection, doc_id = _segments(request)
    condition = request.headers.get("If-Match") is not None or _query(request, "rev") is not None
    rev = _expected_rev(request)
    data = await _data(api, request)
    new_rev = _query(request, "new_rev")
    if not condition:
        max_bytes = api.cfg.max_document_bytes  # a document too large makes no page either
        DocumentStore.check(
            collection, doc_id=doc_id, data=data, new_rev=new_rev, max_document_bytes=max_bytes
        )
        docs = await _store(api, p, write=True)
        return _doc_response(await docs.create(collection, data, id=doc_id, new_rev=new_rev), 201)
    DocumentStore.check(collection, doc_id=doc_id, data=data)
    docs = await _store(api, p, write=False)
    doc = await docs.replace(
        collection,
        doc_id,
        data,
        expected_rev=rev,
        new_rev=new_rev,
        resolves=_resolves(request),
    )
    return _doc_response(doc)


async def delete_document(api: Api, request: web.Request, p: Params) -> web.Response:
    """Soft-delete a document; as in CouchDB, ``?rev=R`` (or ``If-Match``) naming one
    of its kept conflicts removes that conflict instead (a new revision of the
    document, otherwise as it was)."""
    collection, doc_id = _segments(request)
    DocumentStore.check(collection, doc_id=doc_id)
    docs = await _store(api, p, write=False)
    rev, new_rev = _expected_rev(request), _query(request, "new_rev")
    if rev is not None and new_rev is None:
        return _doc_response(await docs.delete_revision(collection, doc_id, rev))
    doc = await docs.delete(collection, doc_id, expected_rev=rev, new_rev=new_rev)
    return _doc_response(doc)


async def purge_document(api: Api, request: web.Request, p: Params) -> web.Response:
    collection, doc_id, _ = _segments(request)
    DocumentStore.check(collection, doc_id=doc_id)
    docs = await _store(api, p, write=False)
    doc = await docs.purge(
        collection, doc_id, expected_rev=_expected_rev(request), new_rev=_query(request, "new_rev")
    )
    return _doc_response(doc)


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
    collection, _ = _segments(request)
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
    done = iter(await (await _store(api, p, write=True)).bulk(collection, valid) if valid else [])
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
    return web.json_response(results, status=201, dumps=_dumps)


def _refused(collection: str, w: BulkWrite, max_bytes: int) -> tuple[str, str] | None:
    """The error code and reason that refuse ``w`` for what it is alone (as
    :meth:`DocumentStore.check` finds them, before any page is made), or None."""
    try:
        DocumentStore.check(collection, doc_id=w.id, data=w.data, max_document_bytes=max_bytes)
    except StoreError as e:
        return ae.from_store(e).code, str(e)
    return None


async def _find_request(api: Api, request: web.Request) -> tuple[str, Any]:
    collection, _ = _segments(request)
    DocumentStore.check(collection)
    body = parse_json(await api.read_body(request, body_limit(api), "find request"), "find request")
    if not isinstance(body, dict):
        raise ae.BadRequest("a find request is a JSON object")
    return collection, body


async def find_documents(api: Api, request: web.Request, p: Params) -> web.Response:
    """POST ``{"selector", "fields", "sort", "limit", "skip", "bookmark", "use_index"}``
    (CouchDB's and pouchdb-find's ``_find``): ``{"docs": [...], "bookmark"}``, each
    document with its ``_id``; ``"warning"`` when ``use_index`` could not be used. An
    answer whose JSON would pass ``max_listing_bytes`` is cut short (at least one
    document), its bookmark continuing after the last one sent."""
    collection, body = await _find_request(api, request)
    docs = await _store(api, p, write=False)
    limit = body.get("limit")
    while True:
        res = await docs.find(collection, body if limit is None else {**body, "limit": limit})
        texts: list[str] = []
        used = 0
        for d in res.docs:
            t = _dumps(d)
            if texts and used + len(t) > api.cfg.max_listing_bytes:
                break
            texts.append(t)
            used += len(t)
        if len(texts) == len(res.docs):
            break
        limit = len(texts)
    warning = "" if res.plan.warning is None else f',"warning":{_dumps(res.plan.warning)}'
    text = f'{{"docs":[{",".join(texts)}],"bookmark":{_dumps(res.bookmark)}{warning}}}'
    return web.Response(text=text, content_type=JSON_TYPE)


async def explain_find(api: Api, request: web.Request, p: Params) -> web.Response:
    """POST a find request (as ``_find``): the plan it would run, ``"scan": true`` when no
    declared index serves it, with the index's name and why."""
    collection, body = await _find_request(api, request)
    docs = await _store(api, p, write=False)
    return web.json_response(await docs.explain(collection, body), dumps=_dumps)


# -- attachments -------------------------------------------------------------------


async def add_attachment(api: Api, request: web.Request, p: Params) -> web.Response:
    """POST ``…/{id}/attachments`` adds one; PUT ``…/attachments/{att}`` replaces it."""
    collection, doc_id, _, *att = _segments(request)
    DocumentStore.check(collection, doc_id=doc_id)
    filename = _query(request, "filename")
    if not filename:
        raise ae.BadRequest("query parameter filename is required")
    content_type = request.headers.get("Content-Type", "")
    if not content_type.strip():  # absent, or empty: no media type to keep
        content_type = "application/octet-stream"
    docs = await _store(api, p, write=False)
    await docs.get(collection, doc_id)  # a missing document is refused before the upload
    doc, a = await docs.put_attachment(
        collection,
        doc_id,
        api.body_chunks(request),
        filename=filename,
        content_type=content_type,
        attachment_id=att[0] if att else None,
        expected_rev=_expected_rev(request),
    )
    text = _document_text(doc)
    if text is None:
        raise ae.Corrupt(_not_json(doc).message)
    return web.Response(
        text=f'{{"document":{text},"attachment":{_dumps(a.to_json())}}}',
        status=200 if att else 201,
        content_type=JSON_TYPE,
        headers={"ETag": f'"{doc.rev}"'},
    )


def _header_text(value: str, default: str) -> str:
    return value if value.isprintable() else default


async def get_attachment(api: Api, request: web.Request, p: Params) -> web.StreamResponse:
    from ledgerd.daemon.api import Query, requested_range  # (api imports this module)

    collection, doc_id, _, att_id = _segments(request)
    DocumentStore.check(collection, doc_id=doc_id)
    docs = await _store(api, p, write=False)
    deleted = _flag(request, "deleted")  # a soft-deleted document keeps its attachments
    a = await docs.attachment(collection, doc_id, att_id, include_deleted=deleted)
    size = a.length
    offset, length, status = 0, size, 200
    if (part := requested_range(request.headers, size, None, Query.of(request))) is not None:
        (offset, length), status = part, 206
    resp = web.StreamResponse(status=status)
    resp.headers["Content-Type"] = _header_text(a.content_type, "application/octet-stream")
    resp.headers["Accept-Ranges"] = "bytes"
    # RFC 8187: every byte but its attr-chars percent-encoded ('/' too, which quote keeps)
    resp.headers["Content-Disposition"] = f"inline; filename*=UTF-8''{quote(a.filename, safe='')}"
    resp.content_length = length
    if status == 206:
        resp.headers["Content-Range"] = f"bytes {offset}-{offset + length - 1}/{size}"
    if request.method == "HEAD":
        await resp.prepare(request)
        return resp
    stream = await docs.read_attachment(
        collection, doc_id, a.id, offset, length, include_deleted=deleted
    )
    chunks = aiter(stream)
    first = await anext(chunks, b"")  # a fetch or check that fails is still a clean error
    await resp.prepare(request)
    try:
        await api.send(request, resp, first)
        async for chunk in chunks:
            await api.send(request, resp, chunk)
        await resp.write_eof()
    except ConnectionError as e:
        log.debug("the client of %s %s left before the end: %s", request.method, request.path, e)
    except Exception:
        # The headers are out: abort, so that the client sees a short body.
        log.exception("aborted %s %s mid-body", request.method, request.path)
        if request.transport is not None:
            request.transport.abort()
    return resp


async def delete_attachment(api: Api, request: web.Request, p: Params) -> web.Response:
    collection, doc_id, _, att_id = _segments(request)
    DocumentStore.check(collection, doc_id=doc_id)
    docs = await _store(api, p, write=False)
    doc = await docs.delete_attachment(
        collection, doc_id, att_id, expected_rev=_expected_rev(request)
    )
    return _doc_response(doc)


# -- indexes -----------------------------------------------------------------------


def _path_json(path: str | list[str]) -> str | list[str]:
    """An index path as the API shows it: dotted text (``"address.city"``), unless a
    name in it holds a dot (a field named ``"a.b"``), then the list of its names
    (``["a.b"]``), since the text would read as ``["a", "b"]``. Either form declares
    the same index again. A path given as text (split at its dots) stays as given."""
    if isinstance(path, str) or any("." in part for part in path):
        return path
    return ".".join(path)


def _index_json(
    collection: str,
    name: str,
    partition: str | list[str],
    sort: str | list[str] | None,
    ready: bool,
) -> Any:
    return {
        "collection": collection,
        "name": name,
        "partition": _path_json(partition),
        "sort": None if sort is None else _path_json(sort),
        "ready": ready,
    }


async def list_indexes(api: Api, request: web.Request, p: Params) -> web.Response:
    collection, _ = _segments(request)
    DocumentStore.check(collection)
    docs = await _store(api, p, write=False)
    out = []
    for i in await docs.indexes(collection):
        if i.code is not None:  # its definition cannot be read here: why, not its paths
            out.append(
                {
                    "collection": i.collection,
                    "name": i.name,
                    "partition": None,
                    "sort": None,
                    "ready": False,
                    "code": i.code,
                    "message": i.message,
                }
            )
            continue
        out.append(
            _index_json(
                i.collection,
                i.name,
                list(i.partition_path),
                None if i.sort_path is None else list(i.sort_path),
                i.ready,
            )
        )
    return web.json_response({"indexes": out})


async def declare_index(api: Api, request: web.Request, p: Params) -> web.Response:
    """PUT ``{"partition": PATH, "sort": PATH?}`` (paths as ``"a.b"`` or ``["a", "b"]``);
    answers the index as declared, its paths as given."""
    collection, _, name = _segments(request)
    DocumentStore.check(collection)
    body = parse_json(await api.read_body(request, body_limit(api), "index body"), "index body")
    if not isinstance(body, dict) or "partition" not in body or set(body) - {"partition", "sort"}:
        raise ae.BadRequest('index body must be {"partition": PATH, "sort": PATH?}')
    partition, sort = body["partition"], body.get("sort")
    DocumentStore.check_index(collection, name, partition, sort)  # a bad one makes no page
    docs = await _store(api, p, write=True)
    i = await docs.declare_index(collection, name, partition, sort)
    return web.json_response(_index_json(collection, name, partition, sort, i.ready))


async def drop_index(api: Api, request: web.Request, p: Params) -> web.Response:
    collection, _, name = _segments(request)
    DocumentStore.check(collection)
    docs = await _store(api, p, write=False)
    await docs.drop_index(collection, name)
    return web.Response(status=204)


async def rebuild_index(api: Api, request: web.Request, p: Params) -> web.Response:
    collection, _, name, _ = _segments(request)
    DocumentStore.check(collection)
    docs = await _store(api, p, write=False)
    await docs.rebuild_index(collection, name)
    return web.Response(status=204)


async def find(api: Api, request: web.Request, p: Params) -> web.Response:
    """``?eq=JSON`` the partition value, ``start``/``end`` (JSON) the sort range."""
    collection, _, name, _ = _segments(request)
    DocumentStore.check(collection)
    eq = _json_param(request, "eq")
    if "eq" not in _params(request):
        raise ae.BadRequest("query parameter eq (the partition value, as JSON) is required")
    start, end = _bound(request, "start"), _bound(request, "end")
    limit = _int(request, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT)
    token = _token(request)
    deleted = _flag(request, "deleted")
    docs = await _store(api, p, write=False)
    return await _documents_page(
        lambda n: docs.query(
            collection,
            name,
            eq,
            start=start,
            end=end,
            limit=n,
            token=token,
            include_deleted=deleted,
        ),
        limit,
        api.cfg.max_listing_bytes,
    )


# -- the changes feed --------------------------------------------------------------


def _changes_line(batch: Changes) -> bytes:
    texts, damaged = [], list(batch.damaged)
    for d in batch.documents:
        t = _document_text(d)
        if t is None:
            damaged.append(_not_json(d))
        else:
            texts.append(t)
    bad = f',"damaged":{_dumps([d.to_json() for d in damaged])}' if damaged else ""
    line = f'{{"commit":"{batch.commit.hex()}","documents":[{",".join(texts)}]{bad}}}'
    return line.encode() + b"\n"


async def changes(api: Api, request: web.Request, p: Params) -> web.StreamResponse:
    """Documents changed since ``?since=COMMIT`` (every one without it), deleted and
    purged ones included, as ``{"commit", "documents", "next"}``: at most ``?limit=``
    (1,000) documents, and ``next``, a token for ``?token=``, while the change goes on
    (up to the same head); ``commit`` is where to resume. With ``?follow=1``, lines of
    ``{"commit", "documents"}`` (at most ``limit`` documents each) as newline-delimited
    JSON, until the client leaves or the daemon stops (an empty line every
    ``heartbeat`` seconds); a line cut from a longer change carries the commit it
    started from, so resuming there sends its documents at least once. ``?conflicts=1``:
    each document with its kept conflicts' revisions (``_meta._conflicts``)."""
    since_text = _query(request, "since")
    try:
        since = from_hex(since_text) if since_text else None
    except ValueError:
        raise ae.BadRequest("since must be a commit id in hex") from None
    collection = _query(request, "collection")
    if collection is not None:  # (an empty one is no collection's name: invalid_name)
        DocumentStore.check(collection)
    follow = _flag(request, "follow")
    if follow and _query(request, "token"):
        raise ae.BadRequest("a followed changes feed takes since, not a page's token")
    heartbeat = _seconds(request, "heartbeat", HEARTBEAT, MIN_HEARTBEAT)
    docs = await _store(api, p, write=False)
    if since is not None:
        await docs.page.load_commit(since)  # an unknown commit: 404 before anything is sent
    limit = _int(request, "limit", MAX_LIMIT, 1, MAX_LIMIT)
    conflicts = _flag(request, "conflicts")
    if not follow:
        token = _token(request)
        try:
            return await _documents_page(
                lambda n: docs.changes_page(
                    since, collection=collection, limit=n, token=token, conflicts=conflicts
                ),
                limit,
                api.cfg.max_listing_bytes,
            )
        except CommitNotFoundError:
            if token is None:
                raise
            # (``since`` was found above): the token's commit is not of this page
            raise ae.BadRequest("the continuation token is not one of this page's") from None
    with api.following():
        return await _follow(api, request, docs, since, collection, limit, heartbeat, conflicts)


async def _follow(
    api: Api,
    request: web.Request,
    docs: DocumentStore,
    since: bytes | None,
    collection: str | None,
    limit: int,
    heartbeat: float,
    conflicts: bool,
) -> web.StreamResponse:
    """The followed changes feed (see :func:`changes`), one of ``max_followers``."""
    resp = web.StreamResponse(headers={"Content-Type": NDJSON_TYPE})
    await resp.prepare(request)
    feed = docs.changes(since, collection=collection, follow=True, batch=limit, conflicts=conflicts)
    nxt: asyncio.Future[Any] | None = None
    # It ends as soon as the client leaves or the daemon stops, whatever the heartbeat.
    gone = connection_lost(request)
    stopping = asyncio.ensure_future(api.state.stopping.wait())
    try:
        while not api.state.shutting_down:
            if nxt is None:
                nxt = asyncio.ensure_future(feed.__anext__())
            await asyncio.wait(
                {nxt, gone, stopping}, timeout=heartbeat, return_when=asyncio.FIRST_COMPLETED
            )
            if gone.done():
                raise ConnectionResetError("the client left")
            if stopping.done():
                break
            if not nxt.done():
                await api.send(request, resp, b"\n")
                continue
            try:
                batch = nxt.result()
            except StopAsyncIteration:  # the page closed
                break
            nxt = None
            await api.send(request, resp, _changes_line(batch))
        await resp.write_eof()
    except ConnectionError:
        log.debug("the client of %s %s left", request.method, request.path)
    except StoreError as e:  # the status is out: the error is the last line
        err = ae.from_store(e)
        log.error("changes feed of %s ended: %s", request.path, e)
        with contextlib.suppress(ConnectionError):
            await resp.write(_dumps(err.body()).encode() + b"\n")
            await resp.write_eof()
    finally:
        stopping.cancel()
        if nxt is not None and not nxt.done():
            nxt.cancel()
            await asyncio.wait({nxt})
        await feed.aclose()
    return resp
