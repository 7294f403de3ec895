"""Where documents live in a page's tree, and how their entries are encoded.

This module owns the byte layout of the document layer (:mod:`store.documents.documents`):
the keys, the two small records every document keeps, and the helpers the merge
rule of document pages (:func:`store.tree.merge.by_revision`) uses to group a
three-way diff by document and rank the sides. It has no I/O.

Keys are packed tuples (:mod:`store.keys.tuple`), so a collection is one key range and
a listing in ``_id`` order is a range read::

    ("docs",)                              the marker: this page holds documents
    ("d", collection, id, 0)               head: revision + state (17 bytes, inline)
    ("d", collection, id, 1)               body: the document's record (msgpack)
    ("d", collection, id, 2, attachment)   an attachment's content (LAZY)
    ("d", collection, id, 3, conflict)     a kept conflict: a losing revision's body
    ("x", collection, index name)          an index definition (msgpack)

A body is one msgpack array whose first element is its record's layout (an
integer 1-255: :data:`LAYOUT_VERSION`, 1, for every body this ledgerd writes). That is
the one thing a later layout keeps, so a body of a layout above this one (a newer
ledgerd's, come through sync) is told from a damaged one: :func:`decode_record`
raises :class:`FutureLayoutError` for it, never reads it as layout 1.

``attachment`` is the 16 bytes of a ULID, and so is ``id`` for a document made with a
new id; a client-chosen id (:data:`DocId`, text) is a string element instead, so the
two never meet: a collection lists its ULID documents first, then its chosen ids in
UTF-8 order. Every change of a document
rewrites its head with a new, higher revision; the head's value is 17 bytes, so
it is carried *inline* in the entry's digest (:mod:`store.pieces.digest`): a merge reads
both sides' revisions from the trees alone, without reading a value.
"""

from __future__ import annotations

import enum
import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

import msgpack

from ledgerd.store.keys import tuple as tup
from ledgerd.store.pieces.digest import INLINE_LIMIT, TOMBSTONE, is_inline, value_chunk_digest
from ledgerd.store.tree.btree import DOT_SIZE, Entry

MARKER = tup.pack(("docs",))
"""Present in the tree of every page that holds documents (value: :data:`MARK`)."""
LAYOUT_VERSION = 1
MARK = bytes((LAYOUT_VERSION,))
"""The value of :data:`MARKER`: the layout version."""

DOCS = tup.pack(("d",))
"""Prefix of every document key."""
INDEXES = tup.pack(("x",))
"""Prefix of every index definition key."""

HEAD, BODY, ATTACHMENT, CONFLICT = 0, 1, 2, 3
ULID_SIZE = 16
CONFLICT_ID_SIZE = ULID_SIZE + 1 + DOT_SIZE
"""Bytes of a kept conflict's name in its key: its revision, its state, its dot."""
MAX_CONFLICTS = 16
"""Most kept conflicts a document's write carries forward (the lowest-ranked others go)."""

DocId = bytes | str
"""A document's id in keys: a ULID's 16 bytes, or a client-chosen id's text."""


class State(enum.IntEnum):
    """A revision's state (the last byte of a head)."""

    LIVE = 0
    DELETED = 1
    PURGED = 2


# A packed tuple is the concatenation of its elements' encodings, so a key is built
# from the collection's prefix (packed once per collection) and the parts after it.
_HEAD_PART = tup.pack((HEAD,))
_BODY_PART = tup.pack((BODY,))
_CONFLICT_PART = tup.pack((CONFLICT,))


@functools.lru_cache(maxsize=256)
def collection_prefix(collection: str) -> bytes:
    return tup.pack(("d", collection))


def elements_end(prefix: bytes) -> bytes:
    """The end (exclusive) of the keys that are the packed tuple ``prefix`` followed by
    more elements: ``prefix`` then 0xff, above every element's type code. Not the
    prefix's ``strinc``: a string element that continues the prefix's last string
    after a NUL (``"a\\0b"`` after ``"a"``) packs as the prefix then 0xff, so a collection
    or an index partition would take in the keys of another."""
    return prefix + b"\xff"


def collection_end(collection: str) -> bytes:
    """The end (exclusive) of the keys of ``collection`` (see :func:`elements_end`)."""
    return elements_end(collection_prefix(collection))


def _encode_id(doc_id: DocId) -> bytes:
    if isinstance(doc_id, str):
        return tup.encode_str(doc_id)
    return tup.encode_bytes(doc_id)


def doc_prefix(collection: str, doc_id: DocId) -> bytes:
    """Every key of one document starts with this (its group in a merge): the
    collection's prefix, then ``doc_id`` packed as a tuple's element (a packed tuple
    is its elements' encodings one after the other)."""
    return collection_prefix(collection) + _encode_id(doc_id)


def head_key(collection: str, doc_id: DocId) -> bytes:
    return doc_prefix(collection, doc_id) + _HEAD_PART


def body_key(collection: str, doc_id: DocId) -> bytes:
    return doc_prefix(collection, doc_id) + _BODY_PART


def doc_keys(collection: str, doc_id: DocId) -> tuple[bytes, bytes]:
    """The head key and the body key of a document."""
    prefix = doc_prefix(collection, doc_id)
    return prefix + _HEAD_PART, prefix + _BODY_PART


def doc_keys_many(collection: str, doc_ids: Iterable[DocId]) -> list[tuple[bytes, bytes]]:
    """:func:`doc_keys` of each document of a batch, the collection's prefix packed once."""
    c = collection_prefix(collection)
    return [(p + _HEAD_PART, p + _BODY_PART) for p in [c + _encode_id(d) for d in doc_ids]]


def attachment_key(collection: str, doc_id: DocId, att_id: bytes) -> bytes:
    return tup.pack(("d", collection, doc_id, ATTACHMENT, att_id))


def conflict_prefix(collection: str, doc_id: DocId) -> bytes:
    """Every kept conflict's key of a document starts with this."""
    return conflicts_of_group(doc_prefix(collection, doc_id))


def conflict_key_in(group: bytes, conflict_id: bytes) -> bytes:
    """The key of a kept conflict named ``conflict_id`` in the document whose keys start
    with ``group`` (:func:`doc_prefix`)."""
    return group + _CONFLICT_PART + tup.encode_bytes(conflict_id)


def conflict_id(rev: bytes, state: State, dot: bytes) -> bytes:
    """A kept conflict's name: its revision, its state and the dot of the write that
    made it (two writes of one revision, a client's ``new_rev`` on two devices, are two)."""
    return rev + bytes((state,)) + dot


def parse_conflict_id(cid: bytes) -> tuple[bytes, State, bytes] | None:
    """(revision, state, dot) of a kept conflict's name; None if it is malformed."""
    if len(cid) != CONFLICT_ID_SIZE or cid[ULID_SIZE] > State.PURGED:
        return None
    return cid[:ULID_SIZE], State(cid[ULID_SIZE]), cid[ULID_SIZE + 1 :]


def conflict_head(cid: bytes) -> bytes:
    """The head value a kept conflict's revision had (the inline digest of its revision
    and state), to rank it as a head is ranked (:func:`rank`)."""
    return value_chunk_digest(cid[: ULID_SIZE + 1])


def index_key(collection: str, name: str) -> bytes:
    return tup.pack(("x", collection, name))


class DocKey(NamedTuple):
    """A document key, unpacked."""

    collection: str
    doc_id: DocId
    part: int
    attachment: bytes | None = None
    conflict: bytes | None = None
    """A kept conflict's name (:func:`conflict_id`), for a key of part :data:`CONFLICT`."""


_PARTS = {_HEAD_PART: HEAD, _BODY_PART: BODY}
_COLLECTION_AT = len(DOCS) + 1  # after DOCS and the string's type code


@functools.lru_cache(maxsize=256)
def _collection_name(encoded: bytes) -> str | None:
    try:
        return encoded.decode()
    except UnicodeDecodeError:
        return None


def parse_doc_key(key: bytes) -> DocKey | None:
    """The parts of a document key, or None for any other key (or a malformed one).

    A head or body key whose collection and id hold no 0x00 byte (nearly all) is cut
    where its parts end, without unpacking the tuple: a catch-up or a merge parses
    a key per changed entry. Any other key is unpacked."""
    if not key.startswith(DOCS):
        return None
    if key[len(DOCS) : _COLLECTION_AT] == b"\x02":
        end = key.find(0, _COLLECTION_AT)
        if 0 < end < len(key) - 1 and key[end + 1] == 0x01:
            id_end = key.find(0, end + 2)
            part = _PARTS.get(key[id_end + 1 :]) if id_end > 0 else None
            if part is not None:
                collection = _collection_name(key[_COLLECTION_AT:end])
                if collection is not None:
                    return DocKey(collection, key[end + 2 : id_end], part)
    return _parse_doc_key(key)


def _parse_doc_key(key: bytes) -> DocKey | None:
    try:
        t = tup.unpack(key)
    except tup.TupleError:
        return None
    if len(t) < 4 or not isinstance(t[1], str) or not isinstance(t[2], bytes | str):
        return None
    part = t[3]
    if part in (HEAD, BODY) and len(t) == 4 and type(part) is int:
        return DocKey(t[1], t[2], part)
    if part == ATTACHMENT and type(part) is int and len(t) == 5 and isinstance(t[4], bytes):
        return DocKey(t[1], t[2], part, t[4])
    if (
        part == CONFLICT
        and type(part) is int
        and len(t) == 5
        and isinstance(t[4], bytes)
        and parse_conflict_id(t[4]) is not None
    ):
        return DocKey(t[1], t[2], part, None, t[4])
    return None


def parse_index_key(key: bytes) -> tuple[str, str] | None:
    """(collection, name) of an index definition key, or None."""
    if not key.startswith(INDEXES):
        return None
    try:
        t = tup.unpack(key)
    except tup.TupleError:
        return None
    if len(t) == 3 and isinstance(t[1], str) and isinstance(t[2], str):
        return t[1], t[2]
    return None


# -- heads --------------------------------------------------------------------


def encode_head(rev: bytes, state: State) -> bytes:
    assert len(rev) == ULID_SIZE and ULID_SIZE + 1 <= INLINE_LIMIT
    return rev + bytes((state,))


def head_of(entry: Entry | None) -> tuple[bytes, State] | None:
    """(revision, state) carried inline by a head entry; None if absent or malformed."""
    if entry is None or entry.value == TOMBSTONE or not is_inline(entry.value):
        return None
    content = entry.value[1:]
    if len(content) != ULID_SIZE + 1 or content[-1] > State.PURGED:
        return None
    return content[:ULID_SIZE], State(content[-1])


def group_of(key: bytes) -> bytes | None:
    """The merge group of ``key``: the key prefix of its document, or None."""
    k = parse_doc_key(key)
    return None if k is None else doc_prefix(k.collection, k.doc_id)


def head_key_of_group(group: bytes) -> bytes:
    return group + _HEAD_PART


def body_key_of_group(group: bytes) -> bytes:
    return group + _BODY_PART


def conflicts_of_group(group: bytes) -> bytes:
    """The prefix of the kept conflicts' keys of the document whose keys start with
    ``group``."""
    return group + _CONFLICT_PART


def rank(entry: Entry | None) -> tuple[bytes, bytes]:
    """How a side's head compares in a merge: by revision, then by the entry's digest
    (only a tie of equal revisions, which two devices cannot normally make, gets
    there). An absent or malformed head ranks lowest."""
    h = head_of(entry)
    if h is None or entry is None:
        return b"", b""
    return h[0], entry.value


# -- bodies -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AttachmentMeta:
    id: bytes
    filename: str
    content_type: str
    length: int


class Record(NamedTuple):
    """What the body entry holds: the document as of its revision.

    Times are milliseconds since 1970 (UTC). ``data`` is None once purged. A named
    tuple, not a frozen dataclass: made twice as fast (a bulk write makes one per
    document, a listing one per document read).
    """

    rev: bytes
    state: State
    created: int
    updated: int | None
    deleted: int | None
    purged: int | None
    data: Any
    attachments: tuple[AttachmentMeta, ...] = ()


new_record = functools.partial(tuple.__new__, Record)
"""A Record from a tuple of all eight fields, without the named tuple's Python-level
``__new__`` (a bulk write makes one per document)."""

_packer = msgpack.Packer(use_bin_type=True)


def encode_record(r: Record) -> bytes:
    """``[version, rev, state, created, updated, deleted, purged, data, attachments]``
    in msgpack: about half the size of the JSON text and several times faster to
    read and write than JSON in Python."""
    atts = [[a.id, a.filename, a.content_type, a.length] for a in r.attachments]
    out: bytes = _packer.pack(
        [
            LAYOUT_VERSION,
            r.rev,
            int(r.state),
            r.created,
            r.updated,
            r.deleted,
            r.purged,
            r.data,
            atts,
        ]
    )
    return out


class FutureLayoutError(ValueError):
    """A body whose record (or an index definition) is of a layout above
    :data:`LAYOUT_VERSION`: a newer ledgerd wrote it. Not damaged, but nothing of it
    can be read here."""

    def __init__(self, layout: int, what: str = "record") -> None:
        self.layout = layout
        super().__init__(
            f"its {what} is of layout {layout}, a newer ledgerd's "
            f"(this one reads layout {LAYOUT_VERSION})"
        )


def record_layout(data: bytes) -> int | None:
    """The layout a body says its record is of: the first element of the one msgpack
    array the body is, an integer 1-255 (as the page's :data:`MARK` holds it); None
    for a body that is not one such array (damaged: bytes that only start like one
    are not a record of any layout, so that the documents API can purge them)."""
    try:
        v = msgpack.unpackb(data, raw=True, strict_map_key=False)
    except (ValueError, TypeError, msgpack.UnpackException):
        return None
    if not isinstance(v, list) or not v or type(v[0]) is not int or not 1 <= v[0] <= 255:
        return None
    layout: int = v[0]
    return layout


def decode_record(data: bytes, *, json_data: bool = True) -> Record:
    """Raises ValueError for bytes that are not a record: not msgpack, not nine fields,
    not of layout 1, a field of the wrong kind (a revision or attachment id not 16
    bytes, a time not an integer, an attachment's names not text or its length not a
    count), or data with no JSON form (bytes, NaN or an infinity, a msgpack extension,
    a key that is not text: nothing a document write stores). A body written through
    the key API, or a peer's, may be anything: what decodes here is what a document's
    JSON and its readers can show. A body of a
    later layout (:func:`record_layout` above :data:`LAYOUT_VERSION`) raises
    :class:`FutureLayoutError`, a ValueError too, whatever follows its layout.

    ``json_data=False`` leaves the data unchecked: the indexes (:mod:`store.documents.docindex`)
    index such a record by its values that are JSON, so that a query meets it and
    names it damaged, as a listing does."""
    try:
        return _decode_record(data, json_data)
    except _NotJSON as e:
        raise ValueError(f"its data has no JSON form: {e}") from None
    except (ValueError, TypeError, msgpack.UnpackException) as e:
        layout = record_layout(data)
        if layout is not None and layout > LAYOUT_VERSION:
            raise FutureLayoutError(layout) from None
        if json_data and _decodes(data):  # the limits on bins and extensions refused it
            raise ValueError("its data has no JSON form: it holds bytes or an extension") from None
        raise ValueError(f"not a document record: {e}") from None


def _decodes(data: bytes) -> bool:
    """Whether ``data`` is a record, its data left unchecked."""
    try:
        _decode_record(data, False)
    except (ValueError, TypeError, msgpack.UnpackException):
        return False
    return True


class _NotJSON(ValueError):
    """A record whose data has no JSON form (told from one that is no record)."""


def _decode_record(data: bytes, json_data: bool) -> Record:
    if json_data:
        v = msgpack.unpackb(
            data, raw=False, strict_map_key=True, max_bin_len=_BIN_LIMIT, max_ext_len=0
        )
    else:
        v = msgpack.unpackb(data, raw=False, strict_map_key=True)
    version, rev, state, created, updated, deleted, purged, body, atts = v
    if type(version) is not int or version != LAYOUT_VERSION:
        raise ValueError(f"its layout is {version!r}, not {LAYOUT_VERSION}")
    if type(rev) is not bytes or len(rev) != ULID_SIZE:
        raise ValueError("the revision is not 16 bytes")
    if not _time(rev_ms(rev)):  # (the revision clock would follow it past the limit)
        raise ValueError("the revision's time is past the year 9999")
    if not _time(created) or not all(t is None or _time(t) for t in (updated, deleted, purged)):
        raise ValueError("a time is not milliseconds from 1970 to 9999")
    r = Record(
        rev,
        State(state),
        created,
        updated,
        deleted,
        purged,
        body,
        tuple(_attachment(a) for a in atts),
    )
    if json_data and not _json_data(data, r):
        raise _NotJSON("it holds bytes, NaN, an infinity or a key that is not text")
    return r


_BIN_LIMIT = ULID_SIZE
"""The longest bin a record's msgpack holds: its revision and attachment ids."""
_SUSPECT = re.compile(
    rb"[\xc4-\xc6\xca\xcb]"
    rb"(?:(?<=\xc4)[\x00-\x0f]|(?<=[\xc5\xc6])\x00|(?<=[\xca\xcb])[\x7f\xff])"
)
_SUSPECT_16 = re.compile(
    rb"[\xc4-\xc6\xca\xcb]"
    rb"(?:(?<=\xc4)[\x00-\x10]|(?<=[\xc5\xc6])\x00|(?<=[\xca\xcb])[\x7f\xff])"
)
""":data:`_SUSPECT` with the 16-byte bin8s: for a record without attachments, whose
bytes after the revision hold no 16-byte bin."""
"""Bytes in a record's msgpack that may be a bin of at most :data:`_BIN_LIMIT` bytes
(longer ones the unpacker refuses; 16-byte bin8s, ``c4 10``, are counted apart) or a
NaN or an infinity (a float whose sign and exponent bytes are ``7f``/``ff``: also a
float past about 1e304, looked at value by value then). None of them can be in a
string's UTF-8 (a lead byte is followed by a continuation byte, 0x80-0xbf). It
starts with one class of bytes, so that the search skips the others in C."""
_BIN16 = b"\xc4\x10"
_HEAD = b"\x99\x01\xc4\x10"
"""How a record of layout 1 starts when packed as this ledgerd packs it: nine fields,
the layout, the revision's 16 bytes, which :func:`_json_data` passes over."""


def _json_data(data: bytes, r: Record) -> bool:
    """Whether the data of record ``r``, unpacked from ``data`` with bins of at most
    :data:`_BIN_LIMIT` bytes and no extensions, has a JSON form: no bytes, NaN or
    infinity (its keys are text or bytes, as the unpacker keeps them). A search of the
    bytes in C decides for nearly every record: after the revision, none of
    :data:`_SUSPECT` and no 16-byte bin8 but the attachment ids. Otherwise (an
    integer's or a float's bytes may look so) the values are looked at, one by one."""
    start = len(_HEAD) + ULID_SIZE if data.startswith(_HEAD) else 0
    if start and not r.attachments:
        if _SUSPECT_16.search(data, start) is None:
            return True
    elif _SUSPECT.search(data, start) is None and data.count(_BIN16, start) == len(
        r.attachments
    ) + (start == 0):
        return True
    try:
        return _json_value(r.data)
    except RecursionError:
        return False


def _json_value(v: Any) -> bool:
    """Whether ``v`` has a JSON form, value by value (see :func:`_json_data`)."""
    t = type(v)
    if t is dict:
        for k in v:
            if type(k) is not str:
                return False
        items: Any = v.values()
    elif t is list:
        items = v
    else:
        return t is str or t is int or t is bool or v is None or (t is float and v - v == 0.0)
    for x in items:
        t = type(x)
        if t is str or t is int or t is bool or x is None:
            continue
        if t is float:
            if x - x != 0.0:  # NaN and the infinities (inf - inf is NaN)
                return False
        elif not (t is dict or t is list) or not _json_value(x):
            return False
    return True


TIME_LIMIT = 253_402_300_800_000
"""Milliseconds since 1970 of the year 10000: a record's times are below it (the
ISO text a document shows them as has four digits of year)."""


def _time(t: Any) -> bool:
    return type(t) is int and 0 <= t < TIME_LIMIT


def rev_ms(rev: bytes) -> int:
    """The milliseconds of a revision (a ULID's first 48 bits)."""
    return int.from_bytes(rev[:6], "big")


def rev_in_time(rev: bytes) -> bool:
    """Whether a revision's time is one a record can carry (below :data:`TIME_LIMIT`):
    a ULID can name times up to the year 10889, and the revisions made after one past
    the limit, and so the times of the records they make, would be past it too."""
    return rev_ms(rev) < TIME_LIMIT


def _attachment(a: Any) -> AttachmentMeta:
    att_id, filename, content_type, length = a
    if type(att_id) is not bytes or len(att_id) != ULID_SIZE:
        raise ValueError("an attachment id is not 16 bytes")
    if type(filename) is not str or type(content_type) is not str:
        raise ValueError("an attachment's filename or content type is not text")
    if type(length) is not int or length < 0:
        raise ValueError("an attachment's length is not a count")
    return AttachmentMeta(att_id, filename, content_type, length)


def encode_definition(partition: list[str], sort: list[str] | None) -> bytes:
    out: bytes = _packer.pack([LAYOUT_VERSION, partition, sort])
    return out


def decode_definition(data: bytes) -> tuple[list[str], list[str] | None]:
    """``(partition, sort)`` of an index definition: ``[layout, partition, sort]`` in
    msgpack, its paths lists of text (``sort`` may be null). Raises ValueError for bytes
    that are not one (damaged: not msgpack, another shape, a path not a list of text),
    and :class:`FutureLayoutError`, a ValueError too, for a definition of a layout
    above :data:`LAYOUT_VERSION` (a newer ledgerd's), whatever follows its layout: it
    is never read as layout 1."""
    layout = record_layout(data)  # (a definition leads with its layout, as a body)
    if layout is not None and layout > LAYOUT_VERSION:
        raise FutureLayoutError(layout, "definition")
    try:
        version, partition, sort = msgpack.unpackb(data, raw=False)
        if type(version) is not int or version != LAYOUT_VERSION:
            raise ValueError(f"its layout is {version!r}, not {LAYOUT_VERSION}")
        if not _path(partition) or not (sort is None or _path(sort)):
            raise ValueError("its paths are not lists of names")
        return partition, sort
    except (ValueError, TypeError, msgpack.UnpackException) as e:
        raise ValueError(f"not an index definition: {e}") from None


def _path(p: Any) -> bool:
    return type(p) is list and bool(p) and all(type(n) is str for n in p)
