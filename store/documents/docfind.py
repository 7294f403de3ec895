"""Selector queries on a collection, in the shape of pouchdb-find and CouchDB's Mango.

This module owns ``find``: reading a request (``selector``, ``fields``, ``sort``,
``limit``, ``skip``, ``bookmark``, ``use_index``), matching documents against its
selector, CouchDB's collation of JSON values, the order and paging of the answer, and
the plan (a declared index whose partition the selector fixes, or a scan of the
collection) that :func:`explain` describes. It reads documents only through
:class:`~store.documents.documents.DocumentStore`'s listings and index queries; it stores
nothing. What differs from pouchdb-find, and why, is in docs/documents.md.
"""

from __future__ import annotations

import base64
import binascii
import functools
import heapq
import json
import math
from collections.abc import Callable
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
from ledgerd.store.errors import InvalidArgumentError
from ledgerd.store.page.page import Page
from ledgerd.store.page.view import RangeResult

DEFAULT_LIMIT = 25
"""Documents a find answers when it names no ``limit`` (CouchDB's default)."""
MAX_LIMIT = 1000
"""The largest ``limit`` of one find."""
MAX_SKIP = 100_000
"""The largest ``skip``."""
MAX_DEPTH = 32
"""Nesting of a selector's objects and lists."""
MAX_TERMS = 1000
"""Operators, fields and listed values in a selector, ``fields`` and ``sort`` together."""
PAGE = 1000
"""Documents read per listing or index query while a find gathers its candidates."""

BOOKMARK = b"B"
"""The kind of a find's bookmark (:mod:`store.documents.doctoken`)."""

_MISSING: Any = object()
"""The value of a path that leads nowhere (told from JSON's null)."""

COMPARISONS = ("$eq", "$ne", "$gt", "$gte", "$lt", "$lte")
OPERATORS = (*COMPARISONS, "$in", "$nin", "$exists", "$elemMatch", "$and", "$or", "$nor", "$not")


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


class InvalidSelectorError(InvalidArgumentError):
    """The find request is not one this store answers (400 ``bad_request``)."""


# -- collation --------------------------------------------------------------------


def _rank(v: Any) -> int:
    if v is None or v is _MISSING:
        return 0
    if v is False:
        return 1
    if v is True:
        return 2
    if isinstance(v, int | float):
        return 3
    if isinstance(v, str):
        return 4
    if isinstance(v, list):
        return 5
    return 6


def _cmp_text(a: str, b: str) -> int:
    """Strings as JavaScript orders them (by UTF-16 code units, as PouchDB compares
    them): code points give that order unless a character is past U+FFFF."""
    if a == b:
        return 0
    if a.isascii() and b.isascii():
        return -1 if a < b else 1
    x, y = a.encode("utf-16-be"), b.encode("utf-16-be")
    return -1 if x < y else 1


def collate(a: Any, b: Any) -> int:
    """CouchDB's order of JSON values (as pouchdb-collate has it): null < false < true <
    numbers < strings < arrays < objects; arrays element by element, then by length;
    objects key by key in their order, each key then its value, then by size. A missing
    value collates as null. Negative, zero or positive."""
    ra, rb = _rank(a), _rank(b)
    if ra != rb:
        return ra - rb
    if ra == 3:
        return -1 if a < b else (1 if a > b else 0)
    if ra == 4:
        return _cmp_text(a, b)
    if ra == 5:
        for x, y in zip(a, b, strict=False):
            c = collate(x, y)
            if c:
                return c
        return (len(a) > len(b)) - (len(a) < len(b))
    if ra == 6:
        for (ka, va), (kb, vb) in zip(a.items(), b.items(), strict=False):
            c = _cmp_text(ka, kb) or collate(va, vb)
            if c:
                return c
        return (len(a) > len(b)) - (len(a) < len(b))
    return 0


# -- selectors ----------------------------------------------------------------------

Cond = Callable[[Any], bool]
"""A compiled condition on a value (``_MISSING`` for a path that leads nowhere)."""


def parse_field(name: str) -> tuple[str, ...]:
    """A field path: names split at dots, ``\\.`` a dot inside a name (as in pouchdb-find)."""
    parts, cur, i = [], [], 0
    while i < len(name):
        ch = name[i]
        if ch == "\\" and i + 1 < len(name) and name[i + 1] in ".$":
            cur.append(name[i + 1])
            i += 2
            continue
        if ch == ".":
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
        i += 1
    parts.append("".join(cur))
    return tuple(parts)


def value_at(value: Any, path: tuple[str, ...]) -> Any:
    """The value at ``path`` in ``value``; :data:`_MISSING` when a step is not a field of
    an object (a step into a list, a string or a number leads nowhere)."""
    for name in path:
        if not isinstance(value, dict):
            return _MISSING
        value = value.get(name, _MISSING)
        if value is _MISSING:
            return _MISSING
    return value


class _Compiler:
    """Compiles a selector into nested :data:`Cond` closures, counting its terms."""

    def __init__(self) -> None:
        self.terms = 0

    def _count(self, n: int = 1) -> None:
        self.terms += n
        if self.terms > MAX_TERMS:
            raise InvalidSelectorError(f"the request has over {MAX_TERMS} operators and values")

    def root(self, selector: Any) -> Cond:
        if not isinstance(selector, dict):
            raise InvalidSelectorError("selector must be a JSON object")
        for key in selector:
            if key.startswith("$") and key not in ("$and", "$or", "$nor", "$not"):
                raise InvalidSelectorError(
                    f"{shown(key)} at the top of a selector: only fields, $and, $or, $nor "
                    "and $not go there"
                )
        return self.cond(selector, 0)

    def cond(self, spec: Any, depth: int) -> Cond:
        """The condition an operator object (or a value: implicit ``$eq``) puts on a value."""
        if depth > MAX_DEPTH:
            raise InvalidSelectorError(f"the selector is nested over {MAX_DEPTH} levels")
        self._count()
        if not isinstance(spec, dict):
            _check_value(spec, depth)
            return _comparison("$eq", spec)
        conds = [self._one(key, arg, depth + 1) for key, arg in spec.items()]
        if len(conds) == 1:
            return conds[0]
        return lambda v: all(c(v) for c in conds)

    def _list(self, op: str, arg: Any, depth: int) -> list[Cond]:
        if not isinstance(arg, list) or not arg:
            raise InvalidSelectorError(f"{op} takes a non-empty list of selectors")
        return [self.cond(_selector(op, s), depth + 1) for s in arg]

    def _one(self, key: str, arg: Any, depth: int) -> Cond:
        if not key.startswith("$"):  # a field of the value
            path = parse_field(key)
            inner = self.cond(arg, depth)
            return lambda v: inner(value_at(v, path))
        if key in COMPARISONS:
            _check_value(arg, depth)
            self._count()
            return _comparison(key, arg)
        if key in ("$in", "$nin"):
            if not isinstance(arg, list):
                raise InvalidSelectorError(f"{key} takes a list of values")
            self._count(len(arg))
            _check_value(arg, depth)
            return _membership(arg, key == "$in")
        if key == "$exists":
            if not isinstance(arg, bool):
                raise InvalidSelectorError("$exists takes true or false")
            return lambda v: (v is not _MISSING) is arg
        if key == "$elemMatch":
            inner = self.cond(_selector(key, arg), depth)
            return lambda v: isinstance(v, list) and any(inner(x) for x in v)
        if key == "$and":
            conds = self._list(key, arg, depth)
            return lambda v: all(c(v) for c in conds)
        if key == "$or":
            conds = self._list(key, arg, depth)
            return lambda v: any(c(v) for c in conds)
        if key == "$nor":
            conds = self._list(key, arg, depth)
            return lambda v: not any(c(v) for c in conds)
        if key == "$not":
            inner = self.cond(_selector(key, arg), depth)
            return lambda v: not inner(v)
        raise InvalidSelectorError(
            f"unknown or unsupported operator {shown(key)} (supported: {', '.join(OPERATORS)})"
        )


def _selector(op: str, arg: Any) -> dict[str, Any]:
    if not isinstance(arg, dict):
        raise InvalidSelectorError(f"{op} takes a selector (a JSON object)")
    return arg


def _check_value(v: Any, depth: int) -> None:
    """Refuse an operand that is not JSON or nests too deeply."""
    stack = [(v, depth)]
    while stack:
        x, d = stack.pop()
        if d > MAX_DEPTH:
            raise InvalidSelectorError(f"the selector is nested over {MAX_DEPTH} levels")
        if isinstance(x, float) and not math.isfinite(x):
            raise InvalidSelectorError("a selector's numbers must be finite")
        if isinstance(x, str) and not _is_text(x):
            raise InvalidSelectorError("a selector's strings must be UTF-8 text (a lone surrogate)")
        if isinstance(x, list):
            stack.extend((y, d + 1) for y in x)
        elif isinstance(x, dict):
            stack.extend((y, d + 1) for y in x.values())


def _is_text(s: str) -> bool:
    try:
        s.encode()
    except UnicodeEncodeError:
        return False
    return True


def _comparison(op: str, operand: Any) -> Cond:
    if op == "$eq":
        return lambda v: v is not _MISSING and collate(v, operand) == 0
    if op == "$ne":
        return lambda v: collate(v, operand) != 0  # (a missing value collates as null)
    if op == "$gt":
        return lambda v: v is not _MISSING and collate(v, operand) > 0
    if op == "$gte":
        return lambda v: v is not _MISSING and collate(v, operand) >= 0
    if op == "$lt":
        return lambda v: v is not _MISSING and collate(v, operand) < 0
    return lambda v: v is not _MISSING and collate(v, operand) <= 0


def _membership(values: list[Any], inside: bool) -> Cond:
    """``$in`` (``inside``) or ``$nin``: a value that is present and not null, equal to
    one of ``values`` (a list: one of its elements equal to one of them) or not."""

    def cond(v: Any) -> bool:
        if v is _MISSING or v is None:
            return False
        items = v if isinstance(v, list) else [v]
        found = any(collate(x, y) == 0 for y in values for x in items)
        return found is inside

    return cond


def compile_selector(selector: Any) -> Cond:
    """The condition a selector puts on a document (its data, with ``_id`` and
    ``_rev``); InvalidSelectorError for one this store does not answer."""
    return _Compiler().root(selector)


# -- requests ----------------------------------------------------------------------


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
    compiler = _Compiler()
    match = compiler.root(body["selector"])
    sort, descending = _sort(body.get("sort"))
    fields = body.get("fields")
    if fields is not None:
        if not isinstance(fields, list) or not all(isinstance(f, str) and f for f in fields):
            raise InvalidSelectorError("fields must be a list of field names")
        compiler._count(len(fields))
    compiler._count(len(sort))
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
        if v is _MISSING:
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
    return _cmp_text(a[-1], b[-1])


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
        if any(v is _MISSING for v in key[:-1]):
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
