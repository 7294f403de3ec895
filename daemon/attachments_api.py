"""The HTTP endpoints of attachments: ``.../docs/{collection}/{id}/attachments/...``.

This module owns how an attachment travels: a raw body, streamed both ways, with its
content type and file name (ranged reads as for keys). What every document route shares
is :mod:`daemon.docs_http`'s; the routes' plumbing is :mod:`daemon.api`'s.
"""

from __future__ import annotations

from urllib.parse import quote

from aiohttp import web

from ledgerd.daemon import errors as ae
from ledgerd.daemon.api import Api, Params, stream_body
from ledgerd.daemon.docs_http import (
    JSON_TYPE,
    doc_response,
    document_store,
    document_text,
    dumps,
    expected_rev,
    not_json,
    segments,
)
from ledgerd.daemon.query import Query, requested_range
from ledgerd.store import DocumentStore


async def add_attachment(api: Api, request: web.Request, p: Params) -> web.Response:
    """POST ``…/{id}/attachments`` adds one; PUT ``…/attachments/{att}`` replaces it."""
    q = Query.of(request)
    collection, doc_id, _, *att = segments(request)
    DocumentStore.check(collection, doc_id=doc_id)
    filename = q.utf8("filename")
    if not filename:
        raise ae.BadRequest("query parameter filename is required")
    content_type = request.headers.get("Content-Type", "")
    if not content_type.strip():  # absent, or empty: no media type to keep
        content_type = "application/octet-stream"
    docs = await document_store(api, p, write=False)
    await docs.get(collection, doc_id)  # a missing document is refused before the upload
    doc, a = await docs.put_attachment(
        collection,
        doc_id,
        api.body_chunks(request),
        filename=filename,
        content_type=content_type,
        attachment_id=att[0] if att else None,
        expected_rev=expected_rev(request),
    )
    text = document_text(doc)
    if text is None:
        raise ae.Corrupt(not_json(doc).message)
    return web.Response(
        text=f'{{"document":{text},"attachment":{dumps(a.to_json())}}}',
        status=200 if att else 201,
        content_type=JSON_TYPE,
        headers={"ETag": f'"{doc.rev}"'},
    )


def _header_text(value: str, default: str) -> str:
    return value if value.isprintable() else default


async def get_attachment(api: Api, request: web.Request, p: Params) -> web.StreamResponse:
    q = Query.of(request)
    collection, doc_id, _, att_id = segments(request)
    DocumentStore.check(collection, doc_id=doc_id)
    docs = await document_store(api, p, write=False)
    deleted = q.utf8_flag("deleted")  # a soft-deleted document keeps its attachments
    a = await docs.attachment(collection, doc_id, att_id, include_deleted=deleted)
    size = a.length
    offset, length, status = 0, size, 200
    if (part := requested_range(request.headers, size, None, q)) is not None:
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
    await stream_body(api, request, resp, aiter(stream))
    return resp


async def delete_attachment(api: Api, request: web.Request, p: Params) -> web.Response:
    collection, doc_id, _, att_id = segments(request)
    DocumentStore.check(collection, doc_id=doc_id)
    docs = await document_store(api, p, write=False)
    doc = await docs.delete_attachment(
        collection, doc_id, att_id, expected_rev=expected_rev(request)
    )
    return doc_response(doc)
