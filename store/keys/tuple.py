"""FoundationDB's tuple layer: typed tuples packed into byte keys that sort like the tuples.

This module owns the tuple encoding and nothing else: :func:`pack`, :func:`unpack`,
:func:`range`, :func:`compare`, :func:`strinc`, the versionstamp placeholder
(:func:`pack_with_versionstamp`, :func:`complete_versionstamp`) and the two value types
the encoding adds (:class:`SingleFloat`, :class:`Versionstamp`). It does no I/O and
knows nothing of pages, transactions or where a versionstamp's ten bytes come from;
:mod:`store.keys.subspace` builds key prefixes on top of it, and :mod:`store.page.stamps` fills in
versionstamps when a page commits.

The value types and the byte layouts both sides share live in :mod:`store.keys.tuple_types`,
the decoders in :mod:`store.keys.tuple_unpack`; this module names them all, so callers
import the tuple layer from here alone. The encoders and decoders of every type code must
mirror each other byte for byte: a change to one side goes with the table below and the
other side.

Format
    Byte-identical to the ``foundationdb`` package's ``fdb.tuple`` (API version 520 and
    later), which follows FoundationDB's ``design/tuple.md``. Each element is a type
    code and a body; packed tuples compare, as bytes, in the order of the tuples:

    ==========  ========================================================================
    0x00        None (inside a nested tuple: 0x00 0xff)
    0x01, 0x02  bytes, str (UTF-8): 0x00 escaped as 0x00 0xff, ended by 0x00
    0x05        nested tuple (or list), ended by 0x00
    0x0c-0x1c   int of 0-8 bytes: big endian, one's complement when negative
    0x0b, 0x1d  int of 9-255 bytes: a length byte (bits flipped when negative) then
                the bytes; used from 2**64-1 and -(2**64-1) outwards
    0x20, 0x21  :class:`SingleFloat`, float: IEEE big endian, sign bit flipped when
                positive, every bit flipped when negative (the IEEE total order:
                -NaN < -inf < ... < -0.0 < 0.0 < ... < inf < +NaN)
    0x26, 0x27  False, True
    0x30        uuid.UUID, 16 bytes
    0x33        :class:`Versionstamp`: 10 bytes of transaction version, 2 of user version
    ==========  ========================================================================

    :func:`pack` takes those types and their subclasses (an IntEnum packs as an int, a
    NamedTuple as a nested tuple); ``fdb.tuple`` also takes ctypes floats, which are
    not accepted here (use :class:`SingleFloat` or ``float``).

    The bindings disagree at ±(2**64-1): the Java binding packs 2**64-1 in 8 bytes,
    ``0x1c ff*8``, while the Python binding packs it as ``0x1d 0x08 ff*8``, and likewise
    ``-(2**64-1)`` as ``0x0b 0xf7 00*8`` where Java writes ``0x0c 00*8``. This module packs
    as the Python binding does, and unpacks both forms to the same int. Like the
    bindings, :func:`unpack` also accepts a big-integer form longer than needed; it
    does not insist that an int is packed in the fewest bytes.

Errors
    :func:`unpack` is safe on untrusted bytes: whatever the input, it raises
    :class:`TupleError` naming the byte offset (an ``InvalidArgumentError`` of the store,
    so a ``ValueError``, which the daemon answers with 400), never ``IndexError``,
    ``struct.error``, ``UnicodeDecodeError`` or ``RecursionError``: truncated bodies,
    unterminated strings and nested tuples, invalid UTF-8, and type codes that are
    unknown or only reserved by the specification (0x03, 0x04, 0x0a, 0x1e, 0x22-0x25,
    0x31, 0x32, 0x40-0x4f, 0xff...) are all refused. Nesting is limited to
    :data:`MAX_DEPTH` levels, both ways, so that neither direction can exhaust the
    stack. :func:`pack` raises ``ValueError`` for values it cannot encode (including an
    incomplete versionstamp, as ``fdb.tuple`` does) and ``TypeError`` when ``t`` is not a
    tuple.

Why it is written here
    The one maintained implementation is ``fdb.tuple`` in the ``foundationdb`` package
    (the other Python packages that read FoundationDB tuples carry a fork of it inside
    a client of the native library, or are early betas; order-preserving encoders such
    as ``lexode`` have formats of their own). ``fdb.tuple`` imports without the native
    client, but it reads the process-wide API version that ``fdb.api_version()`` sets
    (before 500 it packs bools as ints, before 520 it writes a 2-byte versionstamp
    offset), it cannot pack a complete versionstamp unless ``fdb.impl``, which loads the
    native library, has been imported, and on untrusted input it raises ``IndexError``,
    ``struct.error`` or ``RecursionError``, or accepts truncated strings and nested
    tuples as complete. This module has no global state, refuses malformed input with
    one error type, and packs and unpacks faster (``python -m bench.tuples`` measures
    both in one run); ``tests/store/test_tuple.py`` checks its bytes against
    ``fdb.tuple``'s.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import Any, Final

from ledgerd.store.keys.tuple_types import (
    BIG_INT_BYTES,
    CODE_U32,
    CODE_U64,
    DOUBLE,
    LIMITS,
    MAX_DEPTH,
    OFFSET,
    SIGN64,
    STAMP_PLACEHOLDER,
    U64_MAX,
    SingleFloat,
    TupleError,
    Versionstamp,
)
from ledgerd.store.keys.tuple_unpack import unpack

__all__ = [
    "MAX_DEPTH",
    "SingleFloat",
    "TupleError",
    "Versionstamp",
    "compare",
    "complete_versionstamp",
    "has_incomplete_versionstamp",
    "pack",
    "pack_with_versionstamp",
    "range",
    "strinc",
    "unpack",
]

# -- packing ------------------------------------------------------------------------------
# One encoder per element type, looked up by exact type; each returns the element's
# complete encoding. Subclasses (IntEnum, NamedTuple...) go through _encode_subclass.

_Encoder = Callable[[Any], bytes]


def _encode_bytes(v: bytes) -> bytes:
    return b"\x01" + v.replace(b"\x00", b"\x00\xff") + b"\x00"


def _encode_str(v: str) -> bytes:
    return b"\x02" + v.encode().replace(b"\x00", b"\x00\xff") + b"\x00"


def _encode_int(v: int) -> bytes:
    if 0 < v < U64_MAX:
        n = (v.bit_length() + 7) >> 3
        return ((0x14 + n) << (n << 3) | v).to_bytes(n + 1, "big")
    if -U64_MAX < v < 0:
        n = (v.bit_length() + 7) >> 3
        return ((0x14 - n) << (n << 3) | (v + LIMITS[n])).to_bytes(n + 1, "big")
    if v == 0:
        return b"\x14"
    n = (v.bit_length() + 7) >> 3
    if n > BIG_INT_BYTES:
        raise TupleError(f"int of {n} bytes is too large to pack (at most 255 bytes)")
    if v > 0:
        return bytes((0x1D, n)) + v.to_bytes(n, "big")
    return bytes((0x0B, n ^ 0xFF)) + (v + (1 << (n << 3)) - 1).to_bytes(n, "big")


def _encode_float(v: float) -> bytes:
    bits = int.from_bytes(DOUBLE.pack(v), "big")
    return CODE_U64.pack(0x21, bits ^ (U64_MAX if bits & SIGN64 else SIGN64))


def _encode_single(v: SingleFloat) -> bytes:
    return CODE_U32.pack(0x20, v._order())


encode_bytes = _encode_bytes
"""The packed form of bytes as a tuple's element (``pack((b,))``, faster)."""
encode_str = _encode_str
"""The packed form of a string as a tuple's element (``pack((s,))``, faster)."""
encode_float = _encode_float
"""The packed form of a float as a tuple's element (``pack((f,))``, faster)."""


def _encode_bool(v: bool) -> bytes:
    return b"\x27" if v else b"\x26"


def _encode_uuid(v: uuid.UUID) -> bytes:
    return b"\x30" + v.bytes


def _encode_versionstamp(v: Versionstamp) -> bytes:
    if v.tr_version is None:
        raise TupleError("incomplete versionstamp in pack(); use pack_with_versionstamp()")
    return b"\x33" + v.tr_version + v.user_version.to_bytes(2, "big")


def _encode_top_none(v: None) -> bytes:
    return b"\x00"


def _encode_nested_none(v: None) -> bytes:
    return b"\x00\xff"


_ENCODERS: Final[dict[type, _Encoder]] = {
    str: _encode_str,
    int: _encode_int,
    bytes: _encode_bytes,
    uuid.UUID: _encode_uuid,
    float: _encode_float,
    bool: _encode_bool,
    SingleFloat: _encode_single,
    Versionstamp: _encode_versionstamp,
}
_TOP_ENCODERS: Final[dict[type, _Encoder]] = {**_ENCODERS, type(None): _encode_top_none}
_NESTED_ENCODERS: Final[dict[type, _Encoder]] = {**_ENCODERS, type(None): _encode_nested_none}
_BASES: Final = (bool, int, float, str, bytes, uuid.UUID, SingleFloat, Versionstamp)
"""Checked in order for subclasses: bool before int, as bool is an int."""


def _encode_subclass(v: object) -> bytes:
    for base in _BASES:
        if isinstance(v, base):
            return _ENCODERS[base](v)
    raise TupleError(f"cannot pack a value of type {type(v).__name__}")


def _encode_into(out: list[bytes], items: Sequence[Any], depth: int) -> None:
    """Appends the encoding of ``items`` (the contents of a tuple at ``depth``) to ``out``."""
    encoders = _NESTED_ENCODERS if depth else _TOP_ENCODERS
    append = out.append
    for v in items:
        encode = encoders.get(type(v))
        if encode is not None:
            append(encode(v))
        elif isinstance(v, tuple | list):
            if depth >= MAX_DEPTH:
                raise TupleError(f"tuple nested deeper than {MAX_DEPTH} levels")
            append(b"\x05")
            _encode_into(out, v, depth + 1)
            append(b"\x00")
        else:
            append(_encode_subclass(v))


def _encode_stamped(
    out: list[bytes], items: Sequence[Any], depth: int, at: int, stamps: list[int]
) -> int:
    """Like :func:`_encode_into`, but packs incomplete versionstamps too.

    ``at`` is the length already in ``out``; returns the length after ``items``. The
    offset of the ten placeholder bytes of each incomplete stamp is appended to ``stamps``.
    """
    for v in items:
        if isinstance(v, Versionstamp) and v.tr_version is None:
            stamps.append(at + 1)
            out.append(b"\x33" + v.to_bytes())
            at += 13
        elif isinstance(v, tuple | list):
            if depth >= MAX_DEPTH:
                raise TupleError(f"tuple nested deeper than {MAX_DEPTH} levels")
            out.append(b"\x05")
            at = _encode_stamped(out, v, depth + 1, at + 1, stamps) + 1
            out.append(b"\x00")
        else:
            _encode_into(out, (v,), depth)
            at += len(out[-1])
    return at


def _check_tuple(t: object) -> None:
    if not isinstance(t, tuple):
        raise TypeError(f"expected a tuple, got {type(t).__name__}")


def pack(t: tuple[Any, ...], prefix: bytes | None = None) -> bytes:
    """The key for ``t``, after ``prefix``. An incomplete versionstamp is a ``ValueError``."""
    _check_tuple(t)
    out = [prefix] if prefix else []
    _encode_into(out, t, 0)
    return b"".join(out)


def pack_with_versionstamp(t: tuple[Any, ...], prefix: bytes | None = None) -> bytes:
    """The key for ``t`` (after ``prefix``), ready for a versionstamped write.

    ``t`` must hold exactly one incomplete :class:`Versionstamp`, at any depth. The key
    is followed by 4 bytes, little endian: the offset in the key of the stamp's ten
    placeholder bytes, which :func:`complete_versionstamp` replaces at commit.
    """
    _check_tuple(t)
    out = [prefix] if prefix else []
    stamps: list[int] = []
    _encode_stamped(out, t, 0, len(prefix or b""), stamps)
    if not stamps:
        raise TupleError("no incomplete versionstamp in tuple for pack_with_versionstamp()")
    if len(stamps) > 1:
        raise TupleError(f"{len(stamps)} incomplete versionstamps in tuple; at most one")
    out.append(OFFSET.pack(stamps[0]))
    return b"".join(out)


def complete_versionstamp(packed_with_offset: bytes, tr_version10: bytes) -> bytes:
    """The final key: ``pack_with_versionstamp``'s output with the stamp filled in.

    Reads the trailing 4-byte offset, checks that ten placeholder bytes (0xff) lie
    there inside the key, writes ``tr_version10`` over them and drops the offset.
    ``tr_version10`` is the 8-byte big-endian commit version and the 2-byte
    big-endian batch order; it may not be ten 0xff bytes, which read as incomplete.
    """
    if not isinstance(packed_with_offset, bytes) or not isinstance(tr_version10, bytes):
        raise TypeError("complete_versionstamp() takes bytes")
    if len(tr_version10) != 10 or tr_version10 == STAMP_PLACEHOLDER:
        raise TupleError("transaction version must be 10 bytes, not all 0xff")
    end = len(packed_with_offset) - 4
    if end < 0:
        raise TupleError("key too short to end in a versionstamp offset")
    (offset,) = OFFSET.unpack_from(packed_with_offset, end)
    if offset + 10 > end:
        raise TupleError(f"versionstamp offset {offset} is outside the {end}-byte key")
    if packed_with_offset[offset : offset + 10] != STAMP_PLACEHOLDER:
        raise TupleError(f"no incomplete versionstamp at byte {offset}")
    return packed_with_offset[:offset] + tr_version10 + packed_with_offset[offset + 10 : end]


def has_incomplete_versionstamp(t: Sequence[Any]) -> bool:
    """Whether ``t`` holds an incomplete :class:`Versionstamp`, at any depth."""
    for v in t:
        if isinstance(v, Versionstamp):
            if v.tr_version is None:
                return True
        elif isinstance(v, tuple | list) and has_incomplete_versionstamp(v):
            return True
    return False


# -- ranges and order ---------------------------------------------------------------------


def range(t: tuple[Any, ...]) -> slice:
    """The keys of every tuple that starts with ``t`` and is longer (``t`` itself excluded)."""
    p = pack(t)
    return slice(p + b"\x00", p + b"\xff")


def strinc(key: bytes) -> bytes:
    """The first key after every key that starts with ``key``."""
    key = key.rstrip(b"\xff")
    if not key:
        raise ValueError("Key must contain at least one byte not equal to 0xFF.")
    return key[:-1] + bytes((key[-1] + 1,))


def compare(a: tuple[Any, ...], b: tuple[Any, ...]) -> int:
    """-1, 0 or 1 as ``a`` sorts before, with or after ``b`` (incomplete stamps allowed)."""
    ka, kb = _pack_any(a), _pack_any(b)
    return (ka > kb) - (ka < kb)


def _pack_any(t: tuple[Any, ...]) -> bytes:
    _check_tuple(t)
    out: list[bytes] = []
    _encode_stamped(out, t, 0, 0, [])
    return b"".join(out)
