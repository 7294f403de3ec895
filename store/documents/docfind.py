"""Selector queries on a collection, in the shape of pouchdb-find and CouchDB's Mango.

This module owns ``find``: reading a request (``selector``, ``fields``, ``sort``,
``limit``, ``skip``, ``bookmark``, ``use_index``), the order and paging of the answer,
and the plan (a declared index whose partition the selector fixes, or a scan of the
collection) that :func:`explain` describes. The selector itself and CouchDB's collation
are :mod:`store.documents.docselect`'s. It reads documents only through
:class:`~store.documents.documents.DocumentStore`'s listings and index queries; it stores
nothing. What differs from pouchdb-find, and why, is in docs/documents.md.
"""

from __future__ import annotations

import base64
import binascii
import functools
import heapq
import json
from dataclasses import dataclass
from typing import Any, Protocol

from ledgerd.store.documents import doctoken
from ledgerd.store.documents.docmodel import (
    Document,
    IndexInfo,
    InvalidDocumentError,
    check_data,
    loads,
    shown,
)
from ledgerd.store.documents.docselect import MAX_DEPTH as MAX_DEPTH
from ledgerd.store.documents.docselect import MAX_TERMS as MAX_TERMS
from ledgerd.store.documents.docselect import (
    MISSING,
    Compiler,
    Cond,
    cmp_text,
    parse_field,
    value_at,
)
from ledgerd.store.documents.docselect import InvalidSelectorError as InvalidSelectorError
from ledgerd.store.documents.docselect import collate as collate
from ledgerd.store.documents.docselect import compile_selector as compile_selector
from ledgerd.store.page.page import Page
from ledgerd.store.page.view import RangeResult

DEFAULT_LIMIT = 25
"""Documents a find answers when it names no ``limit`` (CouchDB's default)."""
MAX_LIMIT = 1000
"""The largest ``limit`` of one find."""
MAX_SKIP = 100_000
"""The largest ``skip``."""
PAGE = 1000
"""Documents read per listing or index query while a find gathers its candidates."""

BOOKMARK = b"B"
"""The kind of a find's bookmark (:mod:`store.documents.doctoken`)."""


class Documents(Protocol):
    """What a find reads of a page's documents
    (:class:`store.documents.documents.DocumentStore`)."""

    @property
    def page(self) -> Page: ...

    async def list_documents(
        self, collection: str, *, limit: int = ..., token: bytes | None = ...
    ) -> RangeResult[Document]: ...

    async def query(
        self,
        collection: str,
        index: str,
        partition: Any,
        *,
        limit: int = ...,
        token: bytes | None = ...,
    ) -> RangeResult[Document]: ...

    async def indexes(self, collection: str) -> list[IndexInfo]: ...


@dataclass(frozen=True, slots=True)
class FindRequest:
    """A find, read and checked (:func:`parse_request`)."""

    selector: Any
    match: Cond
    sort: tuple[tuple[str, ...], ...]
    descending: bool
    fields: tuple[tuple[str, ...], ...] | None
    limit: int
    skip: int
    bookmark: str | None
    use_index: str | None
    canonical: str
    """The selector, sort and fields as JSON text: what a bookmark is bound to."""


_KEYS = {"selector", "fields", "sort", "limit", "skip", "bookmark", "use_index"}
_IGNORED = {"r", "conflicts", "update", "stable", "stale", "execution_stats"}
"""CouchDB's options that change nothing here (one device, one revision per document)."""


def _count_int(body: dict[str, Any], name: str, default: int, lo: int, hi: int) -> int:
    v = body.get(name, default)
    if v is None:
        return default
    if type(v) is not int or not lo <= v <= hi:
        raise InvalidSelectorError(f"{name} must be an integer {lo}-{hi}")
    return v


def parse_request(body: Any) -> FindRequest:
    """A find request as pouchdb-find and CouchDB take it; InvalidSelectorError if it is
    not one (an unknown key, a selector this store cannot answer, a bound passed)."""
    if not isinstance(body, dict):
        raise InvalidSelectorError("a find request is a JSON object")
    unknown = set(body) - _KEYS - _IGNORED
    if unknown:
        raise InvalidSelectorError(f"unknown find option {shown(sorted(unknown)[0])}")
    if "selector" not in body:
        raise InvalidSelectorError("a find request needs a selector")
    compiler = Compiler()
    match = compiler.root(body["selector"])
    sort, descending = _sort(body.get("sort"))
    fields = body.get("fields")
    if fields is not None:
        if not isinstance(fields, list) or not all(isinstance(f, str) and f for f in fields):
            raise InvalidSelectorError("fields must be a list of field names")
        compiler.count(len(fields))
    compiler.count(len(sort))
    bookmark = body.get("bookmark")
    if bookmark is not None and not isinstance(bookmark, str):
        raise InvalidSelectorError("bookmark must be the text a find answered")
    use_index = body.get("use_index")
    if isinstance(use_index, list) and use_index and all(isinstance(x, str) for x in use_index):
        use_index = use_index[-1]  # CouchDB's [design document, name]: the name
    if use_index is not None and not isinstance(use_index, str):
        raise InvalidSelectorError("use_index must be an index's name")
    canonical = json.dumps([body["selector"], body.get("sort"), fields], sort_keys=True)
    return FindRequest(
        selector=body["selector"],
        match=match,
        sort=sort,
        descending=descending,
        fields=None if fields is None else tuple(parse_field(f) for f in fields),
        limit=_count_int(body, "limit", DEFAULT_LIMIT, 0, MAX_LIMIT),
        skip=_count_int(body, "skip", 0, 0, MAX_SKIP),
        bookmark=bookmark or None,
        use_index=use_index,
        canonical=canonical,
    )


def _sort(sort: Any) -> tuple[tuple[tuple[str, ...], ...], bool]:
    """``["a", {"b": "desc"}]`` as paths and whether descending (one direction for all,
    as CouchDB and pouchdb-find require)."""
    if sort is None:
        return (), False
    if not isinstance(sort, list):
        raise InvalidSelectorError('sort must be a list: ["a", {"b": "desc"}]')
    paths, directions = [], set()
    for item in sort:
        if isinstance(item, str) and item:
            paths.append(parse_field(item))
            directions.add("asc")
        elif (
            isinstance(item, dict)
            and len(item) == 1
            and next(iter(item.values())) in ("asc", "desc")
            and next(iter(item))
        ):
            ((name, direction),) = item.items()
            paths.append(parse_field(name))
            directions.add(direction)
        else:
            raise InvalidSelectorError(f'sort item {shown(item)} is not "a" or {{"a": "desc"}}')
    if len(directions) > 1:
        raise InvalidSelectorError("sort fields must all go the same direction")
    return tuple(paths), directions == {"desc"}


# -- plans -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Plan:
    """How a find reads its candidates: a declared ``index`` (with the partition
    value the selector fixes) or, with ``index`` None, a scan of the collection."""

    index: IndexInfo | None
    partition: Any
    reason: str
    warning: str | None = None

    def to_json(self) -> dict[str, Any]:
        if self.index is None:
            index: dict[str, Any] = {"name": "_all_docs", "type": "special"}
        else:
            index = {
                "name": self.index.name,
                "type": "json",
                "partition": list(self.index.partition_path),
                "sort": None if self.index.sort_path is None else list(self.index.sort_path),
            }
        out: dict[str, Any] = {"index": index, "scan": self.index is None, "reason": self.reason}
        if self.index is not None:
            out["partition_value"] = self.partition
        if self.warning is not None:
            out["warning"] = self.warning
        return out


def _fixed(selector: dict[str, Any]) -> dict[tuple[str, ...], Any]:
    """The paths a selector fixes to one scalar at its top (a field's value or ``$eq``,
    directly or in a top ``$and``): the partitions an index can be read at."""
    out: dict[tuple[str, ...], Any] = {}
    items = list(selector.items())
    while items:
        key, arg = items.pop(0)
        if key == "$and" and isinstance(arg, list):
            items.extend(kv for s in arg if isinstance(s, dict) for kv in s.items())
            continue
        if key.startswith("$"):
            continue
        if isinstance(arg, dict) and "$eq" in arg:
            arg = arg["$eq"]
        elif isinstance(arg, dict):
            continue
        if arg is None or isinstance(arg, str | bool | int | float):
            out.setdefault(parse_field(key), arg)
    return out


def plan(request: FindRequest, indexes: list[IndexInfo]) -> Plan:
    """The index whose partition the selector fixes (``use_index`` first, then by name),
    or a scan. An index with a sort path holds only the documents whose sort value is a
    scalar, so the selector must fix that too: otherwise the index would miss
    documents that match."""
    fixed = _fixed(request.selector)
    usable = [
        i
        for i in indexes
        if i.code is None
        and i.partition_path in fixed
        and (i.sort_path is None or i.sort_path in fixed)
    ]
    warning = None
    if request.use_index is not None:
        named = [i for i in usable if i.name == request.use_index]
        if named:
            usable = named
        else:
            warning = (
                f"index {request.use_index!r} was not used: it does not exist, or the "
                "selector does not fix its partition field to one value"
            )
    if not usable:
        why = "no declared index has its partition field (and sort field) fixed to one value"
        return Plan(None, None, why, warning)
    best = min(usable, key=lambda i: i.name)
    why = f"the selector fixes {'.'.join(best.partition_path)!r}, the index's partition"
    return Plan(best, fixed[best.partition_path], why, warning)


# -- answering ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FindResult:
    """A find's answer: documents as CouchDB shows them (``_id``, ``_rev``, the data's
    fields; only ``fields`` and ``_id`` with ``fields``), the bookmark that continues
    it (None: nothing follows), and the plan it ran."""

    docs: list[dict[str, Any]]
    bookmark: str | None
    plan: Plan


def _as_couch(doc: Document) -> dict[str, Any]:
    data = doc.data if isinstance(doc.data, dict) else {}
    return {"_id": doc.id, "_rev": doc.rev, **data}


def _project(doc: dict[str, Any], fields: tuple[tuple[str, ...], ...]) -> dict[str, Any]:
    out: dict[str, Any] = {"_id": doc["_id"]}
    for path in fields:
        v = value_at(doc, path)
        if v is MISSING:
            continue
        at = out
        for name in path[:-1]:
            nxt = at.get(name)
            if not isinstance(nxt, dict):
                nxt = at[name] = {}
            at = nxt
        at[path[-1]] = v
    return out


def _order_key(request: FindRequest, doc: dict[str, Any]) -> list[Any]:
    return [*(value_at(doc, p) for p in request.sort), doc["_id"]]


def _cmp_keys(a: list[Any], b: list[Any]) -> int:
    for x, y in zip(a[:-1], b[:-1], strict=True):
        c = collate(x, y)
        if c:
            return c
    return cmp_text(a[-1], b[-1])


def _cmp_keyed(a: tuple[list[Any], Any], b: tuple[list[Any], Any]) -> int:
    return _cmp_keys(a[0], b[0])


async def _candidates(store: Documents, collection: str, p: Plan) -> list[Document]:
    """The documents a plan reads: the index's partition, or the whole collection."""
    out: list[Document] = []
    token: bytes | None = None
    while True:
        if p.index is None:
            got = await store.list_documents(collection, limit=PAGE, token=token)
        else:
            got = await store.query(collection, p.index.name, p.partition, limit=PAGE, token=token)
        out.extend(got.items)
        token = got.token
        if token is None:
            return out


def _bound(store: Documents, collection: str, request: FindRequest) -> bytes:
    page = store.page
    return doctoken.binding("find", page.ledger, page.id, collection, request.canonical)


async def find(store: Documents, collection: str, request: FindRequest) -> FindResult:
    """Answer ``request`` on ``collection``: candidates by :func:`plan`, kept when the
    selector matches them (and, with ``sort``, when they have every sort field: CouchDB
    sorts through an index that holds only such documents), ordered by the sort
    fields' collation then ``_id`` (``_id`` alone without ``sort``), from the bookmark
    on, ``skip`` then ``limit`` of them."""
    indexes = await store.indexes(collection)
    p = plan(request, indexes)
    bound = _bound(store, collection, request)
    after = None
    if request.bookmark is not None:
        (raw,) = doctoken.decode(_bookmark_bytes(request.bookmark), BOOKMARK, bound, 1)
        after = _position(raw, len(request.sort))
    keyed: list[tuple[list[Any], dict[str, Any]]] = []
    for d in await _candidates(store, collection, p):
        doc = _as_couch(d)
        if not request.match(doc):
            continue
        key = _order_key(request, doc)
        if any(v is MISSING for v in key[:-1]):
            continue
        if after is not None:
            c = _cmp_keys(key, after)
            if (c <= 0) if not request.descending else (c >= 0):
                continue
        keyed.append((key, doc))
    want = request.skip + request.limit
    order = functools.cmp_to_key(_cmp_keyed)
    if request.descending:
        top = heapq.nlargest(want, keyed, key=order)
    else:
        top = heapq.nsmallest(want, keyed, key=order)
    page = top[request.skip :]
    mark = None
    if request.limit and len(page) == request.limit and len(keyed) > want:
        last = json.dumps(page[-1][0]).encode()
        mark = _bookmark_text(doctoken.encode(BOOKMARK, bound, [last]))
    docs = [d if request.fields is None else _project(d, request.fields) for _, d in page]
    return FindResult(docs, mark, p)


async def explain(store: Documents, collection: str, request: FindRequest) -> dict[str, Any]:
    """Which plan :func:`find` would run for ``request``, and the request as read."""
    p = plan(request, await store.indexes(collection))
    return {
        **p.to_json(),
        "selector": request.selector,
        "sort": [".".join(s) for s in request.sort],
        "descending": request.descending,
        "fields": None if request.fields is None else [".".join(f) for f in request.fields],
        "limit": request.limit,
        "skip": request.skip,
    }


def _position(raw: Any, sort_fields: int) -> list[Any]:
    """The order key a bookmark holds: the sort fields' values, then the ``_id``. A
    bookmark's check is no signature (a client can make one that passes it), so its
    values are read as a document's are: JSON that a document could hold (no NaN, no
    lone surrogate, no deeper nesting), never compared when they are not."""
    try:
        after = check_data(loads(raw)) if isinstance(raw, bytes) else None
        if after is not None:
            json.dumps(after, ensure_ascii=False).encode()  # a lone surrogate raises
    except (InvalidDocumentError, UnicodeEncodeError):
        after = None
    if not isinstance(after, list) or len(after) != sort_fields + 1:
        raise InvalidSelectorError("malformed bookmark")
    if not isinstance(after[-1], str):
        raise InvalidSelectorError("malformed bookmark")
    return after


def _bookmark_text(token: bytes) -> str:
    return base64.urlsafe_b64encode(token).decode().rstrip("=")


def _bookmark_bytes(text: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise InvalidSelectorError("malformed bookmark") from None
