"""Where documents live in a page's tree, and how their entries are encoded.

This module owns the byte layout of the document layer (:mod:`store.documents.documents`):
the keys, a document's head, and the helpers the merge rule of document pages
(:func:`store.tree.merge.by_revision`) uses to group a three-way diff by document and
rank the sides. How a body and an index definition are encoded is
:mod:`store.documents.docrecord`'s (every name of it can be imported from here). It
has no I/O.

Keys are packed tuples (:mod:`store.keys.tuple`), so a collection is one key range and
a listing in ``_id`` order is a range read::

    ("docs",)                              the marker: this page holds documents
    ("d", collection, id, 0)               head: revision + state (17 bytes, inline)
    ("d", collection, id, 1)               body: the document's record (msgpack)
    ("d", collection, id, 2, attachment)   an attachment's content (LAZY)
    ("d", collection, id, 3, conflict)     a kept conflict: a losing revision's body
    ("x", collection, index name)          an index definition (msgpack)

``attachment`` is the 16 bytes of a ULID, and so is ``id`` for a document made with a
new id; a client-chosen id (:data:`DocId`, text) is a string element instead, so the
two never meet: a collection lists its ULID documents first, then its chosen ids in
UTF-8 order. Every change of a document
rewrites its head with a new, higher revision; the head's value is 17 bytes, so
it is carried *inline* in the entry's digest (:mod:`store.pieces.digest`): a merge reads
both sides' revisions from the trees alone, without reading a value.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import NamedTuple

from ledgerd.store.documents.docrecord import LAYOUT_VERSION as LAYOUT_VERSION
from ledgerd.store.documents.docrecord import TIME_LIMIT as TIME_LIMIT
from ledgerd.store.documents.docrecord import ULID_SIZE as ULID_SIZE
from ledgerd.store.documents.docrecord import AttachmentMeta as AttachmentMeta
from ledgerd.store.documents.docrecord import FutureLayoutError as FutureLayoutError
from ledgerd.store.documents.docrecord import Record as Record
from ledgerd.store.documents.docrecord import State as State
from ledgerd.store.documents.docrecord import decode_definition as decode_definition
from ledgerd.store.documents.docrecord import decode_record as decode_record
from ledgerd.store.documents.docrecord import encode_definition as encode_definition
from ledgerd.store.documents.docrecord import encode_record as encode_record
from ledgerd.store.documents.docrecord import new_record as new_record
from ledgerd.store.documents.docrecord import record_layout as record_layout
from ledgerd.store.documents.docrecord import rev_in_time as rev_in_time
from ledgerd.store.documents.docrecord import rev_ms as rev_ms
from ledgerd.store.keys import tuple as tup
from ledgerd.store.pieces.digest import INLINE_LIMIT, TOMBSTONE, is_inline, value_chunk_digest
from ledgerd.store.tree.btree import DOT_SIZE, Entry

MARKER = tup.pack(("docs",))
"""Present in the tree of every page that holds documents (value: :data:`MARK`)."""
MARK = bytes((LAYOUT_VERSION,))
"""The value of :data:`MARKER`: the layout version."""

DOCS = tup.pack(("d",))
"""Prefix of every document key."""
INDEXES = tup.pack(("x",))
"""Prefix of every index definition key."""

HEAD, BODY, ATTACHMENT, CONFLICT = 0, 1, 2, 3
CONFLICT_ID_SIZE = ULID_SIZE + 1 + DOT_SIZE
"""Bytes of a kept conflict's name in its key: its revision, its state, its dot."""
MAX_CONFLICTS = 16
"""Most kept conflicts a document's write carries forward (the lowest-ranked others go)."""

DocId = bytes | str
"""A document's id in keys: a ULID's 16 bytes, or a client-chosen id's text."""


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
