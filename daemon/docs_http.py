"""What every document route shares: ``/v1/ledgers/{L}/pages/{P}/docs/...``.

This module owns how the document layer (:class:`ledgerd.store.DocumentStore`) meets
HTTP in every document route: names in the path, the page's document store, a document's
JSON body in and its JSON text out (pages of them under ``max_listing_bytes``), and the
expected revision of a write. The routes are :mod:`daemon.docs_api` (documents),
:mod:`daemon.indexes_api` (indexes and queries), :mod:`daemon.attachments_api` and
:mod:`daemon.changes_api`; their plumbing is :mod:`daemon.api`'s, their query strings
:class:`daemon.query.Query`'s (strict UTF-8), the error codes :mod:`daemon.errors`'.

Names in the path (collection, document id, attachment id, index name) are
percent-encoded UTF-8. A document's body is its ``_data``; the expected revision
of a write is ``If-Match: "REV"`` or ``?rev=REV``, a client-supplied new one
``?new_rev=REV``. Continuation tokens are opaque URL-safe base64 (bound to the
listing they continue: :mod:`store.documents.doctoken`), commit ids hex.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import unquote_to_bytes

from aiohttp import web

from ledgerd.daemon import errors as ae
from ledgerd.daemon.api import Api, Params
from ledgerd.daemon.codec import parse_json
from ledgerd.daemon.query import Query, url_token_text
from ledgerd.store import (
    Changes,
    Damaged,
    Document,
    DocumentRange,
    DocumentStore,
    Page,
    RangeResult,
)
from ledgerd.store.errors import named

log = logging.getLogger(__name__)

DEFAULT_LIMIT, MAX_LIMIT = 100, 1000
"""Documents per listing or query page (the store's bound is 1,000)."""
DOCS_PREFIX = 7
"""Segments of ``/v1/ledgers/L/pages/P/docs`` in a split raw path (the leading '' included)."""
DOCUMENT_BODY_FACTOR = 4
"""A document's JSON text may be this many times ``max_document_bytes`` (escapes and
blanks make it longer than the encoded document), and no more: a body is parsed
whole, in memory and on the event loop, so ``max_batch_bytes`` (64 MiB) of it would
take a gigabyte and seconds before the document was found too large."""
JSON_TYPE = "application/json"


def segments(request: web.Request) -> list[str]:
    """The path's segments after ``docs/``, percent-decoded UTF-8."""
    parts = request.raw_path.split("?", 1)[0].split("/")[DOCS_PREFIX:]
    try:
        return [unquote_to_bytes(s).decode() for s in parts]
    except UnicodeDecodeError:
        raise ae.BadRequest("names in a document path must be UTF-8") from None


def expected_rev(request: web.Request) -> str | None:
    """``If-Match: "REV"`` (or ``?rev=REV``): the revision a write expects to replace.
    An empty one (``?rev=``, ``If-Match: ""``) is kept, so that the store refuses it
    (``invalid_id``) instead of the write going ahead unconditionally; ``If-Match: *``
    is any current revision (the document must exist, as for every write)."""
    q = Query.of(request)
    header = request.headers.get("If-Match")
    param = q.utf8("rev")
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


async def document_data(api: Api, request: web.Request) -> Any:
    """The request's JSON body (a document's ``_data``), at most :func:`body_limit`."""
    body = await api.read_body(request, body_limit(api), "the document's JSON text")
    try:
        return parse_json(body, "the document")
    except ae.BadRequest as e:
        raise ae.InvalidDocument(str(e)) from None


async def document_store(api: Api, p: Params, *, write: bool) -> DocumentStore:
    """The page's document store. A write makes the page (and ledger) if needed; a read
    needs a page that is a document page already (opening one makes it one)."""
    if write:  # opening the store writes its marker: a page made here is not empty
        async with api.first_write(p.ledger, p.page) as page:
            return await open_store(api, page)
    page = await api.page(p.ledger, p.page, create=False)
    if not await DocumentStore.holds_documents(page):
        raise ae.NotDocuments(
            f"page {named(p.page)} of ledger {named(p.ledger)} holds no documents"
        )
    return await open_store(api, page)


async def open_store(api: Api, page: Page) -> DocumentStore:
    return await DocumentStore.open(
        page,
        max_document_bytes=api.cfg.max_document_bytes,
        held_budget=api.held_budget,
    )


def doc_response(doc: Document, status: int = 200) -> web.Response:
    text = document_text(doc)
    if text is None:
        raise ae.Corrupt(not_json(doc).message)
    return web.Response(
        text=text, status=status, content_type=JSON_TYPE, headers={"ETag": f'"{doc.rev}"'}
    )


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def document_text(doc: Document) -> str | None:
    """The document's JSON text; None if its data has no JSON form (bytes, NaN, a key
    that is not text: a record written through the key API, or come from a peer,
    that decodes but holds what no write of the document layer stores)."""
    try:
        return json.dumps(doc.to_json(), ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return None


def not_json(doc: Document) -> Damaged:
    message = f"document {doc.id} in {doc.collection!r} is damaged: its data is not JSON"
    log.warning("%s", message)
    return Damaged(doc.collection, doc.id, message)


async def documents_page(
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
            t = document_text(d)
            if t is None:
                damaged.append(not_json(d))
            elif texts and used + len(t) > budget:
                break
            else:
                texts.append(t)
                used += len(t)
            taken += 1
        if taken == len(found):
            lead = f'"commit":"{res.commit.hex()}",' if isinstance(res, Changes) else ""
            nxt = None if res.token is None else url_token_text(res.token)
            bad = f'"damaged":{dumps([d.to_json() for d in damaged])},' if damaged else ""
            body = f'{{{lead}"documents":[{",".join(texts)}],{bad}"next":{dumps(nxt)}}}'
            return web.Response(text=body, content_type=JSON_TYPE)
        limit = taken
