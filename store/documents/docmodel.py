"""The document layer's model: documents as callers see them, validation and ids.

This module owns what a document *is* to a caller (:class:`Document`, its JSON
shape after Yoda; :class:`IndexInfo`, an index as declared) and the checks on what
callers give (JSON values, reserved names, sizes, ULIDs). It re-exports the errors
(:mod:`store.documents.docerrors`) and the revision clock
(:mod:`store.documents.docclock`). Where documents are kept in a page is
:mod:`store.documents.doclayout`; the operations are :mod:`store.documents.documents`.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ulid import ULID

from ledgerd.store.documents.docclock import RevClock as RevClock
from ledgerd.store.documents.docclock import ulid_ms as ulid_ms
from ledgerd.store.documents.docclock import ulid_text as ulid_text
from ledgerd.store.documents.docerrors import AttachmentNotFoundError as AttachmentNotFoundError
from ledgerd.store.documents.docerrors import DocumentConflictError as DocumentConflictError
from ledgerd.store.documents.docerrors import DocumentError as DocumentError
from ledgerd.store.documents.docerrors import DocumentNotFoundError as DocumentNotFoundError
from ledgerd.store.documents.docerrors import DocumentTooLargeError as DocumentTooLargeError
from ledgerd.store.documents.docerrors import IndexNotFoundError as IndexNotFoundError
from ledgerd.store.documents.docerrors import InvalidDocumentError as InvalidDocumentError
from ledgerd.store.documents.docerrors import InvalidIdError as InvalidIdError
from ledgerd.store.documents.docerrors import InvalidNameError as InvalidNameError
from ledgerd.store.documents.docerrors import MalformedRecordError as MalformedRecordError
from ledgerd.store.documents.docerrors import RevisionInFutureError as RevisionInFutureError
from ledgerd.store.documents.docerrors import RevisionInPastError as RevisionInPastError
from ledgerd.store.documents.docerrors import UnsupportedLayoutError as UnsupportedLayoutError
from ledgerd.store.documents.doclayout import AttachmentMeta, DocId, Record, State
from ledgerd.store.errors import InvalidArgumentError

LOCAL_LEDGER = "_local"
"""The ledger that is never uploaded: documents (and pages) that stay on this device."""

MAX_DOCUMENT_BYTES = 1024 * 1024
"""Default bound of one document's encoded body (data and metadata), in bytes."""
REV_TOLERANCE = 60.0
"""Default seconds a client-supplied revision may be ahead of this device's clock."""
MAX_DEPTH = 64
"""Nesting depth of a document's data."""
NAME_LIMIT = 128
"""Bytes of a collection name, an index name, a filename or a content type."""
PATH_LIMIT = 1024
"""Bytes of an index's partition or sort path (its names and the dots between them):
a definition is an entry every device stores and every error may quote."""

_INDEX_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


# -- ids ----------------------------------------------------------------------


def shown(value: object, limit: int = 60) -> str:
    """``value`` quoted for a message: its repr, or for a string over ``limit`` characters
    the repr of its first ``limit`` and a mark of the cut (``'xxx'… (300 characters)``)."""
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]!r}… ({len(value)} characters)"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def parse_ulid(value: str | bytes, what: str = "id") -> bytes:
    """The 16 bytes of a ULID given as its 26-character text (or as 16 bytes)."""
    if isinstance(value, bytes) and len(value) == 16:
        return value
    if not isinstance(value, str) or len(value) != 26:
        raise InvalidIdError(f"{what} {shown(value)} is not a ULID (26 characters)")
    try:
        return ULID.from_str(value.upper()).bytes
    except ValueError as e:
        raise InvalidIdError(f"{what} {value!r} is not a ULID: {e}") from None


ID_LIMIT = 512
"""Bytes of UTF-8 of a client-chosen document id."""


def parse_id(value: str) -> DocId:
    """A document id as keys hold it: text that reads as a ULID (26 characters of
    Crockford's base 32, any case) is that ULID's 16 bytes, as every id this store
    makes; any other text is a client-chosen id, kept as it is: 1-:data:`ID_LIMIT`
    bytes of UTF-8, no NUL, not starting with ``_`` (reserved, as in CouchDB: the
    API's own paths, ``_find``, ``_bulk_docs``, start so)."""
    if not isinstance(value, str):
        raise InvalidIdError(f"id {shown(value)} is not text")
    if len(value) == 26:
        with contextlib.suppress(ValueError):
            return ULID.from_str(value.upper()).bytes
    size = _utf8_size(value)
    if size < 0:
        raise InvalidIdError(f"id {shown(value)} is not UTF-8 text (a lone surrogate)")
    if not 1 <= size <= ID_LIMIT:
        raise InvalidIdError(f"id {shown(value)} must be 1-{ID_LIMIT} bytes of UTF-8")
    if "\0" in value:
        raise InvalidIdError(f"id {shown(value)} holds a NUL character")
    if value.startswith("_"):
        raise InvalidIdError(f"id {shown(value)}: ids starting with '_' are reserved")
    return value


def id_text(doc_id: DocId) -> str:
    """A document id as callers see it: a ULID's 26 characters, or the chosen text."""
    return doc_id if isinstance(doc_id, str) else ulid_text(doc_id)


def iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    t = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def _utf8_size(text: str) -> int:
    """The UTF-8 size of ``text``, or -1 if it has none (a lone surrogate)."""
    try:
        return len(text.encode())
    except UnicodeEncodeError:
        return -1


def check_collection(name: object) -> str:
    if not isinstance(name, str) or not 1 <= _utf8_size(name) <= NAME_LIMIT:
        raise InvalidNameError(
            f"collection name {shown(name)} must be 1-{NAME_LIMIT} bytes of UTF-8 text"
        )
    if name.startswith("_"):
        raise InvalidNameError(f"collection name {name!r}: a leading '_' is reserved")
    return name


def check_index_name(name: object) -> str:
    if not isinstance(name, str) or not _INDEX_NAME.fullmatch(name):
        raise InvalidNameError(
            f"index name {shown(name)} must be 1-64 letters, digits, '_', '.' or '-',"
            " not starting with '_' ('_primary' is reserved)"
        )
    return name


def check_text(value: object, what: str) -> str:
    if not isinstance(value, str) or not 0 <= _utf8_size(value) <= NAME_LIMIT:
        raise InvalidArgumentError(
            f"{what} must be a string of at most {NAME_LIMIT} bytes of UTF-8 text"
        )
    return value


# -- data ---------------------------------------------------------------------


def loads(text: str | bytes) -> Any:
    """A JSON value from its text; raises InvalidDocumentError."""
    try:
        return json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError) as e:
        raise InvalidDocumentError(f"invalid JSON: {e}") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def check_data(data: Any) -> Any:
    """``data`` if it is a JSON value whose top level uses no reserved name."""
    if type(data) is dict:
        for k in data:
            if isinstance(k, str) and k.startswith("_"):
                raise InvalidDocumentError(
                    f"field {k!r}: names starting with '_' are reserved at the top of _data"
                )
    _check_value(data, 0)
    return data


_INT_MIN, _INT_END = -(2**63), 2**64
"""A document's integers: what msgpack stores, signed and unsigned 64-bit ones."""
_isfinite = math.isfinite


def _check_value(v: Any, depth: int) -> None:
    """Raise InvalidDocumentError unless ``v``, found ``depth`` levels down, is JSON.

    A container passes over its strings, booleans and nulls in its own loop (the common
    case, no call per value), checks its numbers with :func:`_check_scalar` and
    recurses into the containers it holds."""
    t = type(v)
    if t is dict:
        values: Any = v.values()
        for k in v:
            if type(k) is not str:
                raise InvalidDocumentError(f"object keys are strings, not {shown(k, 40)}")
    elif t is list:
        values = v
    else:
        _check_scalar(v, t)
        return
    if values and depth >= MAX_DEPTH:
        raise InvalidDocumentError(f"the document nests deeper than {MAX_DEPTH} levels")
    for item in values:
        t = type(item)
        if t is str or t is bool or item is None:
            continue
        if t is int:  # the numbers' tests written out: a call each was a tenth of a batch
            if not _INT_MIN <= item < _INT_END:
                _check_scalar(item, t)  # raises
        elif t is float:
            if not _isfinite(item):
                _check_scalar(item, t)  # raises
        elif t is dict or t is list:
            _check_value(item, depth + 1)
        else:
            _check_scalar(item, t)


def _check_scalar(v: Any, t: type) -> None:
    if t is str or t is bool or v is None:
        return
    if t is int:
        if not _INT_MIN <= v < _INT_END:
            raise InvalidDocumentError(
                f"integer {v} is outside -2**63 .. 2**64-1 (signed and unsigned 64 bits)"
            )
    elif t is float:
        if not math.isfinite(v):
            raise InvalidDocumentError(f"{v} is not a JSON number")
    else:
        raise InvalidDocumentError(f"a {t.__name__} is not a JSON value")


def lookup_path(data: Any, path: list[str]) -> Any:
    """The value at ``path`` in ``data``, or ``_MISSING``."""
    if len(path) == 1 and type(data) is dict:  # the common case, without the loop
        return data.get(path[0], _MISSING)
    v = data
    for part in path:
        if not isinstance(v, dict):
            return _MISSING
        v = v.get(part, _MISSING)
        if v is _MISSING:
            break
    return v


class _Missing:
    pass


_MISSING: Any = _Missing()
MISSING = _MISSING


def parse_path(path: str | list[str]) -> list[str]:
    """A JSON path into ``_data``: ``"a.b"`` or ``["a", "b"]``."""
    parts = path.split(".") if isinstance(path, str) else path
    if not isinstance(parts, list) or not parts or not all(isinstance(p, str) and p for p in parts):
        raise InvalidArgumentError(f"path {shown(path)} must be 'a.b' or a list of names")
    sizes = [_utf8_size(p) for p in parts]
    if min(sizes) < 0:
        raise InvalidArgumentError(f"path {shown(path)} is not UTF-8 text (a lone surrogate)")
    if sum(sizes) + len(parts) - 1 > PATH_LIMIT:
        raise InvalidArgumentError(
            f"path {shown(path)} is over {PATH_LIMIT} bytes of UTF-8 (its names and dots)"
        )
    if parts[0].startswith("_"):
        raise InvalidArgumentError(f"path {shown(path)}: names starting with '_' are reserved")
    return parts


# -- documents as callers see them ------------------------------------------------


@dataclass(frozen=True, slots=True)
class Attachment:
    id: str
    filename: str
    content_type: str
    length: int

    @classmethod
    def of(cls, a: AttachmentMeta) -> Attachment:
        return cls(ulid_text(a.id), a.filename, a.content_type, a.length)

    def to_json(self) -> dict[str, Any]:
        return {
            "_id": self.id,
            "_filename": self.filename,
            "_contentType": self.content_type,
            "_length": self.length,
        }


class Document:
    """One revision of a document (immutable). ``data`` is None once purged.

    A view of the stored record: the text forms of its ids and its attachments are
    made when read, not when the document is, since a bulk write returns a thousand
    documents whose fields the caller may never read (making them all took a fifth
    of a batch's time)."""

    __slots__ = ("collection", "_raw_id", "_record", "_kept")
    collection: str
    _raw_id: DocId
    _record: Record
    _kept: tuple[bytes, ...]
    """The revisions of its kept conflicts, when it was read with them (unset: not asked)."""

    def __init__(self, collection: str, raw_id: DocId, record: Record) -> None:
        object.__setattr__(self, "collection", collection)
        object.__setattr__(self, "_raw_id", raw_id)
        object.__setattr__(self, "_record", record)

    @staticmethod
    def of(collection: str, doc_id: DocId, r: Record) -> Document:
        """The document ``doc_id`` (16 bytes, or a chosen id's text) of ``collection`` as
        its record ``r`` has it.

        Made through the slots' own setters, not ``__init__``'s three
        ``object.__setattr__`` calls: a third of the time, for a bulk write's thousand
        documents. Always a Document (the class has no subclasses)."""
        d = _new_document(Document)
        _set_collection(d, collection)
        _set_raw_id(d, doc_id)
        _set_record(d, r)
        return d

    def with_conflicts(self, revs: Iterable[bytes]) -> Document:
        """This revision, with the revisions of the document's kept conflicts (highest
        ranked first) as its :attr:`conflicts`."""
        d = Document.of(self.collection, self._raw_id, self._record)
        _set_kept(d, tuple(revs))
        return d

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"a Document is immutable: cannot set {name}")

    @property
    def conflicts(self) -> tuple[str, ...] | None:
        """The revisions of the document's kept conflicts, highest ranked first, if it
        was read with them (``get(…, conflicts=True)``); else None."""
        kept: tuple[bytes, ...] | None = getattr(self, "_kept", None)
        return None if kept is None else tuple([ulid_text(r) for r in kept])

    @property
    def id(self) -> str:
        return id_text(self._raw_id)

    @property
    def rev(self) -> str:
        return ulid_text(self._record.rev)

    @property
    def state(self) -> State:
        return self._record.state

    @property
    def created_at(self) -> int:
        return self._record.created

    @property
    def updated_at(self) -> int | None:
        return self._record.updated

    @property
    def deleted_at(self) -> int | None:
        return self._record.deleted

    @property
    def purged_at(self) -> int | None:
        return self._record.purged

    @property
    def data(self) -> Any:
        return self._record.data

    @property
    def attachments(self) -> tuple[Attachment, ...]:
        return tuple([Attachment.of(a) for a in self._record.attachments])

    @property
    def deleted(self) -> bool:
        return self.state is not State.LIVE

    @property
    def purged(self) -> bool:
        return self.state is State.PURGED

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Document):
            return NotImplemented
        return (self.collection, self._raw_id, self._record) == (
            other.collection,
            other._raw_id,
            other._record,
        )

    def __hash__(self) -> int:
        return hash((self.collection, self._raw_id, self._record.rev))

    def __repr__(self) -> str:
        return (
            f"Document(collection={self.collection!r}, id={self.id!r}, rev={self.rev!r},"
            f" state={self.state!r}, data={self.data!r:.200})"
        )

    def to_json(self) -> dict[str, Any]:
        """The document in Yoda's shape: ``{"_meta": ..., "_data": ..., "_attachments": ...}``
        (times as ISO 8601 strings in UTC; optional fields left out when unset)."""
        meta: dict[str, Any] = {
            "_id": self.id,
            "_rev": self.rev,
            "_createdAt": iso(self.created_at),
        }
        if self.updated_at is not None:
            meta["_updatedAt"] = iso(self.updated_at)
        if self.deleted_at is not None:
            meta["_deleted"] = True
            meta["_deletedAt"] = iso(self.deleted_at)
        if self.purged_at is not None:
            meta["_purged"] = True
            meta["_purgedAt"] = iso(self.purged_at)
        conflicts = self.conflicts
        if conflicts:  # (as CouchDB: only when there are some)
            meta["_conflicts"] = list(conflicts)
        return {
            "_meta": meta,
            "_data": self.data,
            "_attachments": [a.to_json() for a in self.attachments],
        }


_new_document = object.__new__
_slot: dict[str, Any] = dict(vars(Document))  # the slots' member descriptors, by name
_set_collection = _slot["collection"].__set__
_set_raw_id = _slot["_raw_id"].__set__
_set_record = _slot["_record"].__set__
_set_kept = _slot["_kept"].__set__
del _slot


@dataclass(frozen=True, slots=True)
class IndexInfo:
    """An index as declared: its paths as the names themselves (``partition_path``,
    ``sort_path``), which tell a field named ``"a.b"`` from ``["a", "b"]``, and as
    dotted text for reading (``partition``, ``sort``: ``"address.city"``).

    An index whose definition cannot be read here has empty paths, is not ``ready``
    and names why in ``code`` and ``message``: ``unsupported_layout`` (a newer
    ledgerd's definition, come through sync) or ``corrupt`` (damaged)."""

    collection: str
    name: str
    partition_path: tuple[str, ...]
    sort_path: tuple[str, ...] | None
    ready: bool
    code: str | None = None
    message: str | None = None

    @property
    def partition(self) -> str:
        return ".".join(self.partition_path)

    @property
    def sort(self) -> str | None:
        return None if self.sort_path is None else ".".join(self.sort_path)
