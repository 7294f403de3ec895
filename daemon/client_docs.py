"""Documents in the Python clients: :class:`AsyncDocuments`.

This module owns the client side of ``/v1/ledgers/{L}/pages/{P}/docs/...``
(:mod:`daemon.docs_api`): documents as their JSON (``{"_meta", "_data",
"_attachments"}`` dicts), attachments streamed both ways, index queries and
listings paged through, and the changes feed. Their blocking
:class:`~ledgerd.daemon.client_blocking.Documents` is the blocking client's module's.
Connections, URLs and errors are :class:`~ledgerd.daemon.client_http.HttpClient`'s;
get the documents of a page from a client::

    async with AsyncClient() as c:
        docs = c.documents("app", "people")
        ann = await docs.create("people", {"name": "Ann"})
        ann = await docs.replace("people", ann["_meta"]["_id"], {"name": "Ann B."},
                                 rev=ann["_meta"]["_rev"])

    with Client() as c:
        c.documents("app", "people").get("people", doc_id)
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncGenerator, Callable, Sequence
from pathlib import Path
from typing import Any

import aiofiles

from ledgerd.daemon.client_body import Content, sending
from ledgerd.daemon.client_http import HttpClient
from ledgerd.daemon.client_types import CHUNK, LedgerError, Name, paged, quote, reaching

Doc = dict[str, Any]
"""A document as JSON: ``{"_meta": {...}, "_data": ..., "_attachments": [...]}``."""
OnDamaged = Callable[[dict[str, Any]], None]
"""Called with each ``{"collection", "_id", "code", "message"}`` a listing names under
``damaged``: a document whose stored body cannot be read (the listing goes on past it),
``code`` ``corrupt`` (not a record) or ``unsupported_layout`` (a record of a newer
ledgerd's layout). By default it is logged as a warning."""

log = logging.getLogger(__name__)


def _log_damaged(d: dict[str, Any]) -> None:
    log.warning(
        "document %s in %r cannot be read (%s): %s",
        d.get("_id"),
        d.get("collection"),
        d.get("code"),
        d.get("message"),
    )


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _find_body(
    selector: dict[str, Any],
    fields: list[str] | None,
    sort: list[Any] | None,
    limit: int | None,
    skip: int | None,
    bookmark: str | None,
    use_index: str | None,
) -> dict[str, Any]:
    given = {
        "fields": fields,
        "sort": sort,
        "limit": limit,
        "skip": skip,
        "bookmark": bookmark,
        "use_index": use_index,
    }
    return {"selector": selector, **{k: v for k, v in given.items() if v is not None}}


class AsyncDocuments:
    """The documents of one page, through an :class:`AsyncClient` (which owns the
    connection: close the client, not this)."""

    def __init__(self, client: HttpClient, ledger: Name, page: Name) -> None:
        self.client = client
        self.ledger = ledger
        self.page = page
        self.base = client.page_path(ledger, page) + "/docs"

    def _reaching(self) -> contextlib.AbstractContextManager[None]:
        return reaching(self.client.socket)

    def _path(self, collection: str, *rest: str) -> str:
        return "/".join([self.base, quote(collection), *(quote(r) for r in rest)])

    async def _call(
        self,
        method: str,
        path: str,
        query: dict[str, Any] | None = None,
        *,
        data: Any = None,
        headers: dict[str, str] | None = None,
    ) -> Any:
        resp = await self.client.request(
            method, self.client.url(path, query), data=data, headers=headers
        )
        with self._reaching():
            async with resp:
                return None if resp.status == 204 else await resp.json()

    async def _send_json(
        self, method: str, path: str, value: Any, query: dict[str, Any] | None = None
    ) -> Any:
        headers = {"Content-Type": "application/json"}
        return await self._call(method, path, query, data=_dumps(value), headers=headers)

    # -- documents ---------------------------------------------------------------------

    async def create(
        self, collection: str, data: Any, *, id: str | None = None, new_rev: str | None = None
    ) -> Doc:
        """A new document whose ``_data`` is ``data``: with a new ``_id``, or the chosen
        ``id`` (LedgerError ``conflict`` when a document that is not deleted has it)."""
        query = {"new_rev": new_rev}
        if id is not None:
            doc: Doc = await self._send_json("PUT", self._path(collection, id), data, query)
        else:
            doc = await self._send_json("POST", self._path(collection), data, query)
        return doc

    async def get(
        self,
        collection: str,
        doc_id: str,
        *,
        deleted: bool = False,
        conflicts: bool = False,
        rev: str | None = None,
    ) -> Doc:
        """The document (a deleted one only with ``deleted``); NotFoundError if none.
        ``conflicts``: with its kept conflicts' revisions in ``_meta._conflicts`` (when
        it has some); ``rev``: that revision, the current one or a kept conflict's."""
        query: dict[str, Any] = {
            "deleted": 1 if deleted else None,
            "conflicts": 1 if conflicts else None,
            "rev": rev,
        }
        doc: Doc = await self._call("GET", self._path(collection, doc_id), query)
        return doc

    async def replace(
        self,
        collection: str,
        doc_id: str,
        data: Any,
        *,
        rev: str | None = None,
        new_rev: str | None = None,
        resolves: Sequence[str] = (),
    ) -> Doc:
        """A new revision with ``data``; with ``rev``, only if that is the current one
        (else LedgerError ``conflict``). ``resolves``: the kept conflicts' revisions it
        supersedes (each must be one: else ``conflict``)."""
        path = self._path(collection, doc_id)
        query = {"rev": rev, "new_rev": new_rev, "resolves": ",".join(resolves) or None}
        # Without a revision, If-Match: * (any current one): a bare PUT creates.
        headers = {
            "Content-Type": "application/json",
            **({} if rev is not None else {"If-Match": "*"}),
        }
        doc: Doc = await self._call("PUT", path, query, data=_dumps(data), headers=headers)
        return doc

    async def bulk_docs(self, collection: str, docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Write ``docs`` in one commit, CouchDB's ``_bulk_docs``: each document's own
        fields are its data, with ``_id``, ``_rev`` and ``_deleted`` when given (no
        ``_rev``: a create). A result per document, in order: ``{"id", "rev", "ok":
        True}`` or ``{"id", "error", "reason"}``; one refused does not stop the others."""
        out: list[dict[str, Any]] = await self._send_json(
            "POST", self._path(collection, "_bulk_docs"), {"docs": docs}
        )
        return out

    async def select(
        self,
        collection: str,
        selector: dict[str, Any],
        *,
        fields: list[str] | None = None,
        sort: list[Any] | None = None,
        limit: int | None = None,
        skip: int | None = None,
        bookmark: str | None = None,
        use_index: str | None = None,
    ) -> dict[str, Any]:
        """A selector query (``_find``, as pouchdb-find's ``db.find``): ``{"docs": [...],
        "bookmark"}``, each document CouchDB's shape (``_id``, ``_rev``, its fields);
        pass ``bookmark`` back (with the same request) for the next page, while it is
        not None."""
        body = _find_body(selector, fields, sort, limit, skip, bookmark, use_index)
        out: dict[str, Any] = await self._send_json("POST", self._path(collection, "_find"), body)
        return out

    async def explain(
        self,
        collection: str,
        selector: dict[str, Any],
        *,
        fields: list[str] | None = None,
        sort: list[Any] | None = None,
        limit: int | None = None,
        skip: int | None = None,
        use_index: str | None = None,
    ) -> dict[str, Any]:
        """The plan :meth:`select` would run: ``{"index": {"name", ...}, "scan", "reason",
        ...}``."""
        body = _find_body(selector, fields, sort, limit, skip, None, use_index)
        out: dict[str, Any] = await self._send_json(
            "POST", self._path(collection, "_explain"), body
        )
        return out

    async def delete(
        self, collection: str, doc_id: str, *, rev: str | None = None, new_rev: str | None = None
    ) -> Doc:
        """Soft delete: the document stays, marked ``_deleted``. A ``rev`` that names one
        of its kept conflicts removes that conflict instead (as CouchDB's ``DELETE
        ?rev=``): a new revision of the document, otherwise as it was."""
        doc: Doc = await self._call(
            "DELETE", self._path(collection, doc_id), {"rev": rev, "new_rev": new_rev}
        )
        return doc

    async def purge(
        self, collection: str, doc_id: str, *, rev: str | None = None, new_rev: str | None = None
    ) -> Doc:
        """Remove the data and attachments, keep a ``_purged`` tombstone."""
        doc: Doc = await self._call(
            "POST", self._path(collection, doc_id, "purge"), {"rev": rev, "new_rev": new_rev}
        )
        return doc

    async def _pages(
        self,
        path: str,
        query: dict[str, Any],
        limit: int | None,
        page_size: int,
        on_damaged: OnDamaged | None = None,
    ) -> AsyncGenerator[Doc, None]:
        async def fetch(want: int, token: str | None) -> dict[str, Any]:
            page: dict[str, Any] = await self._call(
                "GET", path, {**query, "limit": want, "token": token}
            )
            for d in page.get("damaged", ()):
                (on_damaged or _log_damaged)(d)
            return page

        async for d in paged(fetch, "documents", limit, page_size):
            yield d

    async def list_documents(
        self,
        collection: str,
        *,
        deleted: bool = False,
        limit: int | None = None,
        page_size: int = 100,
        on_damaged: OnDamaged | None = None,
    ) -> AsyncGenerator[Doc, None]:
        """Documents in ``_id`` order, paging through the collection (or ``limit`` of them);
        a document whose body cannot be read is passed to ``on_damaged`` (:data:`OnDamaged`)."""
        query = {"deleted": 1 if deleted else None}
        path = self._path(collection)
        async for d in self._pages(path, query, limit, page_size, on_damaged):
            yield d

    # -- attachments ---------------------------------------------------------------------

    async def put_attachment(
        self,
        collection: str,
        doc_id: str,
        content: Content,
        *,
        filename: str,
        content_type: str = "application/octet-stream",
        attachment_id: str | None = None,
        rev: str | None = None,
    ) -> dict[str, Any]:
        """Add an attachment (or replace ``attachment_id``), streamed from bytes, a
        file or chunks (:data:`~ledgerd.daemon.client_body.Content`, as a value's):
        ``{"document": Doc, "attachment": {...}}``."""
        path = self._path(collection, doc_id, "attachments")
        if attachment_id is not None:
            path += "/" + quote(attachment_id)
        headers = {"Content-Type": content_type}
        async with sending(content) as body:
            if body.length is not None:
                headers["Content-Length"] = str(body.length)
            out: dict[str, Any] = await self._call(
                "PUT" if attachment_id else "POST",
                path,
                {"filename": filename, "rev": rev},
                data=body.data,
                headers=headers,
            )
        return out

    async def attachment_stream(
        self,
        collection: str,
        doc_id: str,
        attachment_id: str,
        *,
        offset: int = 0,
        length: int | None = None,
    ) -> AsyncGenerator[bytes, None]:
        """An attachment's content (``length`` bytes from ``offset``), as it arrives."""
        headers: dict[str, str] = {}
        if offset or length is not None:
            if offset < 0 or (length is not None and length < 1):
                raise ValueError("offset must be >= 0 and length >= 1")
            last = "" if length is None else str(offset + length - 1)
            headers["Range"] = f"bytes={offset}-{last}"
        url = self.client.url(self._path(collection, doc_id, "attachments", attachment_id))
        resp = await self.client.request("GET", url, headers=headers)
        async with resp:
            chunks = resp.content.iter_chunked(CHUNK)
            while True:
                with self._reaching():
                    try:
                        chunk = await anext(chunks)
                    except StopAsyncIteration:
                        return
                yield chunk

    async def read_attachment(
        self,
        collection: str,
        doc_id: str,
        attachment_id: str,
        *,
        offset: int = 0,
        length: int | None = None,
    ) -> bytes:
        stream = self.attachment_stream(
            collection, doc_id, attachment_id, offset=offset, length=length
        )
        return b"".join([c async for c in stream])

    async def attachment_to_file(
        self, collection: str, doc_id: str, attachment_id: str, path: Path
    ) -> int:
        """Write an attachment to ``path`` (whole or not at all); returns its size."""
        n = 0
        tmp = path.with_name(f".{path.name}.part")
        try:
            async with aiofiles.open(tmp, "wb") as f:
                async for chunk in self.attachment_stream(collection, doc_id, attachment_id):
                    await f.write(chunk)
                    n += len(chunk)
            tmp.replace(path)
        finally:
            tmp.unlink(missing_ok=True)
        return n

    async def delete_attachment(
        self, collection: str, doc_id: str, attachment_id: str, *, rev: str | None = None
    ) -> Doc:
        path = self._path(collection, doc_id, "attachments", attachment_id)
        doc: Doc = await self._call("DELETE", path, {"rev": rev})
        return doc

    # -- indexes -----------------------------------------------------------------------

    async def declare_index(
        self,
        collection: str,
        name: str,
        partition: str | list[str],
        sort: str | list[str] | None = None,
    ) -> dict[str, Any]:
        """Declare an index (paths like ``"address.city"``, or lists of names: ``["a.b"]``
        for a field named ``a.b``); built in the background. Listings show a path as
        the list of its names when one of them holds a dot, else as dotted text."""
        body: dict[str, Any] = {"partition": partition}
        if sort is not None:
            body["sort"] = sort
        info: dict[str, Any] = await self._send_json(
            "PUT", self._path(collection, "_indexes", name), body
        )
        return info

    async def drop_index(self, collection: str, name: str) -> None:
        await self._call("DELETE", self._path(collection, "_indexes", name))

    async def rebuild_index(self, collection: str, name: str) -> None:
        await self._call("POST", self._path(collection, "_indexes", name, "rebuild"))

    async def indexes(self, collection: str) -> list[dict[str, Any]]:
        """The collection's indexes by name: ``{"collection", "name", "partition",
        "sort", "ready"}``, paths as :meth:`declare_index` shows them (``sort`` null
        when there is none). An index whose definition cannot be read here (a newer
        ledgerd's, come through sync, or a damaged one) is listed too, with
        ``"partition": null``, ``"sort": null``, ``"ready": false`` and ``"code"``
        (``unsupported_layout`` or ``corrupt``) and ``"message"`` saying why: declare it
        again or drop it (a newer one: upgrade ledgerd). Only such an index has
        ``code`` and ``message``."""
        res = await self._call("GET", self._path(collection, "_indexes"))
        return list(res["indexes"])

    async def find(
        self,
        collection: str,
        index: str,
        eq: Any,
        *,
        start: Any = None,
        end: Any = None,
        deleted: bool = False,
        limit: int | None = None,
        page_size: int = 100,
        on_damaged: OnDamaged | None = None,
    ) -> AsyncGenerator[Doc, None]:
        """Documents whose partition value is ``eq`` and sort value in ``[start, end)``,
        in index order, paging through them (or ``limit`` of them); a document that
        cannot be shown is passed to ``on_damaged`` (:data:`OnDamaged`)."""
        query = {
            "eq": _dumps(eq),
            "start": None if start is None else _dumps(start),
            "end": None if end is None else _dumps(end),
            "deleted": 1 if deleted else None,
        }
        path = self._path(collection, "_indexes", index, "find")
        async for d in self._pages(path, query, limit, page_size, on_damaged):
            yield d

    # -- the changes feed ----------------------------------------------------------------

    async def changes(
        self,
        since: str | None = None,
        *,
        collection: str | None = None,
        limit: int | None = None,
        token: str | None = None,
        conflicts: bool = False,
    ) -> dict[str, Any]:
        """``{"commit", "documents", "next"}``: documents changed since commit ``since``
        (hex), at most ``limit`` (1,000). While ``next`` is not None, pass it as
        ``token`` (with the same ``since``) for the rest of the change; then pass
        ``commit`` as the next ``since``. ``conflicts``: each document with its kept
        conflicts' revisions (``_meta._conflicts``)."""
        query = {
            "since": since,
            "collection": collection,
            "limit": limit,
            "token": token,
            "conflicts": 1 if conflicts else None,
        }
        res: dict[str, Any] = await self._call("GET", self.base + "/_changes", query)
        return res

    async def all_changes(
        self, since: str | None = None, *, collection: str | None = None, conflicts: bool = False
    ) -> AsyncGenerator[dict[str, Any], None]:
        """Every page of :meth:`changes` since ``since``, up to the head of the first."""
        token = None
        while True:
            res = await self.changes(since, collection=collection, token=token, conflicts=conflicts)
            yield res
            token = res.get("next")
            if token is None:
                return

    async def follow(
        self,
        since: str | None = None,
        *,
        collection: str | None = None,
        heartbeat: float | None = None,
        conflicts: bool = False,
    ) -> AsyncGenerator[dict[str, Any], None]:
        """The changes since ``since``, then one ``{"commit", "documents"}`` per later
        change, until the daemon stops or the caller does (``conflicts`` as for
        :meth:`changes`)."""
        query: dict[str, Any] = {
            "since": since,
            "collection": collection,
            "follow": 1,
            "conflicts": 1 if conflicts else None,
            "heartbeat": None if heartbeat is None else str(heartbeat),
        }
        url = self.client.url(self.base + "/_changes", query)
        resp = await self.client.request("GET", url)
        async with resp:
            while True:
                with self._reaching():
                    line = await resp.content.readline()
                if not line:
                    return
                if line.strip():
                    doc = json.loads(line)
                    if "error" in doc:  # the feed failed after it started
                        err = doc["error"]
                        raise LedgerError(err["code"], err["message"], resp.status)
                    yield doc
