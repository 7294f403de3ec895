"""How a document's body and an index definition are encoded.

This module owns the record a document's body entry holds (:class:`Record`), its
encoding, and the checks that decoding it makes; the encoding of an index definition;
and a revision's time. Where these live in a page's tree is
:mod:`store.documents.doclayout`'s. It has no I/O.

A body is one msgpack array whose first element is its record's layout (an
integer 1-255: :data:`LAYOUT_VERSION`, 1, for every body this ledgerd writes). That is
the one thing a later layout keeps, so a body of a layout above this one (a newer
ledgerd's, come through sync) is told from a damaged one: :func:`decode_record`
raises :class:`FutureLayoutError` for it, never reads it as layout 1.
"""

from __future__ import annotations

import enum
import functools
import re
from dataclasses import dataclass
from typing import Any, NamedTuple

import msgpack

LAYOUT_VERSION = 1
"""The layout of every body this ledgerd writes (and of a document page's marker)."""
ULID_SIZE = 16


class State(enum.IntEnum):
    """A revision's state (the last byte of a head)."""

    LIVE = 0
    DELETED = 1
    PURGED = 2


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
