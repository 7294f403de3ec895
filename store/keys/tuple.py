"""FoundationDB's tuple layer: typed tuples packed into byte keys that sort like the tuples.

This module owns the tuple encoding and nothing else: :func:`pack`, :func:`unpack`,
:func:`range`, :func:`compare`, :func:`strinc`, the versionstamp placeholder
(:func:`pack_with_versionstamp`, :func:`complete_versionstamp`) and the two value types
the encoding adds (:class:`SingleFloat`, :class:`Versionstamp`). It does no I/O and
knows nothing of pages, transactions or where a versionstamp's ten bytes come from;
:mod:`store.keys.subspace` builds key prefixes on top of it, and :mod:`store.page.stamps` fills in
versionstamps when a page commits.

It is longer than the store's ~600 lines because it is one format: the encoders and
decoders of every type code, which must mirror each other byte for byte, are kept in
one module next to the table below, so that a change to one side is seen with the other.

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

import builtins
import functools
import struct
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Final

from ledgerd.store.errors import InvalidArgumentError

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

MAX_DEPTH: Final = 128
"""Nested tuples deeper than this many levels are refused by :func:`pack` and :func:`unpack`."""

_U64_MAX: Final = (1 << 64) - 1
_BIG_INT_BYTES: Final = 255
_LIMITS: Final = tuple((1 << (8 * n)) - 1 for n in (0, 1, 2, 3, 4, 5, 6, 7, 8))
"""``_LIMITS[n]`` is the largest magnitude an int of ``n`` bytes holds."""

_DOUBLE: Final = struct.Struct(">d")
_FLOAT: Final = struct.Struct(">f")
_U64: Final = struct.Struct(">Q")
_U32: Final = struct.Struct(">I")
_CODE_U64: Final = struct.Struct(">BQ")
_CODE_U32: Final = struct.Struct(">BI")
_OFFSET: Final = struct.Struct("<I")
"""The versionstamp offset that :func:`pack_with_versionstamp` appends (API version >= 520)."""

_SIGN64: Final = 1 << 63
_SIGN32: Final = 1 << 31
_MASK32: Final = (1 << 32) - 1
_STAMP_PLACEHOLDER: Final = b"\xff" * 10


class TupleError(InvalidArgumentError):
    """Bytes that are not a packed tuple, or a value that cannot be packed."""


class SingleFloat:
    """A 32-bit IEEE float, packed with type code 0x20 (a Python ``float`` packs as 64 bits).

    ``value`` is the float rounded to single precision (out of range: ±inf). Two
    instances are equal when their 32 bits are (so ``-0.0 != 0.0`` and a NaN equals
    itself), and order as the encoding does: the IEEE total order.
    """

    __slots__ = ("_bits",)

    def __init__(self, value: float | int) -> None:
        if isinstance(value, bool) or not isinstance(value, float | int):
            raise TypeError(f"SingleFloat needs a float or an int, not {type(value).__name__}")
        try:
            raw = _FLOAT.pack(value)
        except OverflowError:  # a C cast rounds these to infinity
            raw = _FLOAT.pack(float("inf") if value > 0 else float("-inf"))
        self._bits: int = int.from_bytes(raw, "big")

    @classmethod
    def from_bits(cls, bits: int) -> SingleFloat:
        """The float whose IEEE single-precision bit pattern is ``bits`` (NaN payloads kept)."""
        if not 0 <= bits <= _MASK32:
            raise ValueError(f"not a 32-bit pattern: {bits!r}")
        f = cls.__new__(cls)
        f._bits = bits
        return f

    @property
    def bits(self) -> int:
        return self._bits

    @property
    def value(self) -> float:
        return float(_FLOAT.unpack(self._bits.to_bytes(4, "big"))[0])

    def _order(self) -> int:
        return self._bits ^ (_MASK32 if self._bits & _SIGN32 else _SIGN32)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SingleFloat) and self._bits == other._bits

    def __hash__(self) -> int:
        return hash((SingleFloat, self._bits))

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, SingleFloat):
            return NotImplemented
        return self._order() < other._order()

    def __le__(self, other: object) -> bool:
        if not isinstance(other, SingleFloat):
            return NotImplemented
        return self._order() <= other._order()

    def __gt__(self, other: object) -> bool:
        if not isinstance(other, SingleFloat):
            return NotImplemented
        return self._order() > other._order()

    def __ge__(self, other: object) -> bool:
        if not isinstance(other, SingleFloat):
            return NotImplemented
        return self._order() >= other._order()

    def __bool__(self) -> bool:
        return bool(self.value)

    def __repr__(self) -> str:
        return f"SingleFloat({self.value!r})"


class Versionstamp:
    """A 96-bit versionstamp: 10 bytes of transaction version, 2 of user version.

    ``tr_version`` is None while the stamp is incomplete: the database fills it in at
    commit (see :func:`pack_with_versionstamp`). Complete stamps sort before incomplete
    ones; among each, by ``(tr_version, user_version)``.
    """

    __slots__ = ("tr_version", "user_version")

    LENGTH: Final = 12
    _TR_VERSION_LEN: Final = 10
    _MAX_USER_VERSION: Final = 0xFFFF

    def __init__(self, tr_version: bytes | None = None, user_version: int = 0) -> None:
        Versionstamp.validate_tr_version(tr_version)
        Versionstamp.validate_user_version(user_version)
        self.tr_version = tr_version
        self.user_version = user_version

    @classmethod
    def validate_tr_version(cls, tr_version: object) -> None:
        if tr_version is None:
            return
        if not isinstance(tr_version, bytes):
            raise TypeError(f"transaction version must be bytes, not {type(tr_version).__name__}")
        if len(tr_version) != cls._TR_VERSION_LEN:
            raise ValueError(f"transaction version must be 10 bytes, not {len(tr_version)}")

    @classmethod
    def validate_user_version(cls, user_version: object) -> None:
        if not isinstance(user_version, int) or isinstance(user_version, bool):
            raise TypeError(f"user version must be an int, not {type(user_version).__name__}")
        if not 0 <= user_version <= cls._MAX_USER_VERSION:
            raise ValueError(f"user version {user_version} is outside 0..65535")

    @staticmethod
    def incomplete(user_version: int = 0) -> Versionstamp:
        return Versionstamp(None, user_version)

    @classmethod
    def from_bytes(cls, v: bytes, start: int = 0) -> Versionstamp:
        """The stamp in ``v[start:start + 12]``; ten 0xff bytes read as incomplete."""
        if not isinstance(v, bytes):
            raise TypeError(f"versionstamp must be read from bytes, not {type(v).__name__}")
        if start < 0 or len(v) - start < cls.LENGTH:
            raise TupleError(f"versionstamp at byte {start} needs 12 bytes")
        tr_version: bytes | None = v[start : start + 10]
        if tr_version == _STAMP_PLACEHOLDER:
            tr_version = None
        return cls(tr_version, int.from_bytes(v[start + 10 : start + 12], "big"))

    def is_complete(self) -> bool:
        return self.tr_version is not None

    def completed(self, new_tr_version: bytes) -> Versionstamp:
        """This incomplete stamp with its transaction version filled in."""
        if self.tr_version is not None:
            raise RuntimeError("Versionstamp already completed")
        return Versionstamp(new_tr_version, self.user_version)

    def to_bytes(self) -> bytes:
        """The 12 bytes of the stamp; an incomplete one has ten 0xff bytes first."""
        tr = _STAMP_PLACEHOLDER if self.tr_version is None else self.tr_version
        return tr + self.user_version.to_bytes(2, "big")

    def _order(self) -> tuple[bool, bytes, int]:
        return (self.tr_version is None, self.tr_version or b"", self.user_version)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Versionstamp)
            and self.tr_version == other.tr_version
            and self.user_version == other.user_version
        )

    def __hash__(self) -> int:
        return hash((Versionstamp, self.tr_version, self.user_version))

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Versionstamp):
            return NotImplemented
        return self._order() < other._order()

    def __le__(self, other: object) -> bool:
        if not isinstance(other, Versionstamp):
            return NotImplemented
        return self._order() <= other._order()

    def __gt__(self, other: object) -> bool:
        if not isinstance(other, Versionstamp):
            return NotImplemented
        return self._order() > other._order()

    def __ge__(self, other: object) -> bool:
        if not isinstance(other, Versionstamp):
            return NotImplemented
        return self._order() >= other._order()

    def __repr__(self) -> str:
        return f"Versionstamp({self.tr_version!r}, {self.user_version!r})"


# -- packing ------------------------------------------------------------------------------
# One encoder per element type, looked up by exact type; each returns the element's
# complete encoding. Subclasses (IntEnum, NamedTuple...) go through _encode_subclass.

_Encoder = Callable[[Any], bytes]


def _encode_bytes(v: bytes) -> bytes:
    return b"\x01" + v.replace(b"\x00", b"\x00\xff") + b"\x00"


def _encode_str(v: str) -> bytes:
    return b"\x02" + v.encode().replace(b"\x00", b"\x00\xff") + b"\x00"


def _encode_int(v: int) -> bytes:
    if 0 < v < _U64_MAX:
        n = (v.bit_length() + 7) >> 3
        return ((0x14 + n) << (n << 3) | v).to_bytes(n + 1, "big")
    if -_U64_MAX < v < 0:
        n = (v.bit_length() + 7) >> 3
        return ((0x14 - n) << (n << 3) | (v + _LIMITS[n])).to_bytes(n + 1, "big")
    if v == 0:
        return b"\x14"
    n = (v.bit_length() + 7) >> 3
    if n > _BIG_INT_BYTES:
        raise TupleError(f"int of {n} bytes is too large to pack (at most 255 bytes)")
    if v > 0:
        return bytes((0x1D, n)) + v.to_bytes(n, "big")
    return bytes((0x0B, n ^ 0xFF)) + (v + (1 << (n << 3)) - 1).to_bytes(n, "big")


def _encode_float(v: float) -> bytes:
    bits = int.from_bytes(_DOUBLE.pack(v), "big")
    return _CODE_U64.pack(0x21, bits ^ (_U64_MAX if bits & _SIGN64 else _SIGN64))


def _encode_single(v: SingleFloat) -> bytes:
    return _CODE_U32.pack(0x20, v._order())


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
    out.append(_OFFSET.pack(stamps[0]))
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
    if len(tr_version10) != 10 or tr_version10 == _STAMP_PLACEHOLDER:
        raise TupleError("transaction version must be 10 bytes, not all 0xff")
    end = len(packed_with_offset) - 4
    if end < 0:
        raise TupleError("key too short to end in a versionstamp offset")
    (offset,) = _OFFSET.unpack_from(packed_with_offset, end)
    if offset + 10 > end:
        raise TupleError(f"versionstamp offset {offset} is outside the {end}-byte key")
    if packed_with_offset[offset : offset + 10] != _STAMP_PLACEHOLDER:
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


# -- unpacking ----------------------------------------------------------------------------


def _error(what: str, pos: int) -> TupleError:
    return TupleError(f"{what} at byte {pos}")


def _string_end(v: bytes, end: int, code_at: int) -> int:
    """The offset of the 0x00 that ends the string whose body holds an escaped 0x00 at
    ``end`` (the first 0x00 of the body, or -1)."""
    while end >= 0 and v[end + 1 : end + 2] == b"\xff":
        end = v.find(b"\x00", end + 2)
    if end < 0:
        raise _error("unterminated string", code_at)
    return end


# Each decoder takes the input, the offset of a type code and the depth of the tuple
# holding the element, and returns the element and the offset after it.


def _decode_bytes(v: bytes, pos: int, depth: int) -> tuple[bytes, int]:
    end = v.find(b"\x00", pos + 1)
    if end < 0 or (end + 1 < len(v) and v[end + 1] == 0xFF):
        end = _string_end(v, end, pos)
        return v[pos + 1 : end].replace(b"\x00\xff", b"\x00"), end + 1
    return v[pos + 1 : end], end + 1


def _decode_str(v: bytes, pos: int, depth: int) -> tuple[str, int]:
    # _decode_bytes written out again: calling it would cost a tenth of a 3-element unpack
    end = v.find(b"\x00", pos + 1)
    if end < 0 or (end + 1 < len(v) and v[end + 1] == 0xFF):
        end = _string_end(v, end, pos)
        body = v[pos + 1 : end].replace(b"\x00\xff", b"\x00")
    else:
        body = v[pos + 1 : end]
    try:
        return body.decode(), end + 1
    except UnicodeDecodeError as e:
        raise _error(f"invalid UTF-8 in string ({e.reason})", pos) from None


def _decode_positive(v: bytes, pos: int, depth: int) -> tuple[int, int]:
    end = pos + v[pos] - 0x13
    if end > len(v):
        raise _error("truncated integer", pos)
    return int.from_bytes(v[pos + 1 : end], "big"), end


def _decode_negative(v: bytes, pos: int, depth: int) -> tuple[int, int]:
    n = 0x14 - v[pos]
    end = pos + 1 + n
    if end > len(v):
        raise _error("truncated integer", pos)
    return int.from_bytes(v[pos + 1 : end], "big") - _LIMITS[n], end


def _decode_big_int(v: bytes, pos: int, depth: int) -> tuple[int, int]:
    if pos + 1 >= len(v):
        raise _error("truncated big integer: no length byte", pos)
    positive = v[pos] == 0x1D
    n = v[pos + 1] if positive else v[pos + 1] ^ 0xFF
    end = pos + 2 + n
    if end > len(v):
        raise _error(f"truncated big integer of {n} bytes", pos)
    value = int.from_bytes(v[pos + 2 : end], "big")
    return (value if positive else value - (1 << (n << 3)) + 1), end


def _decode_double(v: bytes, pos: int, depth: int) -> tuple[float, int]:
    end = pos + 9
    if end > len(v):
        raise _error("truncated double", pos)
    (bits,) = _U64.unpack_from(v, pos + 1)
    bits ^= _SIGN64 if bits & _SIGN64 else _U64_MAX
    return _DOUBLE.unpack(_U64.pack(bits))[0], end


def _decode_single(v: bytes, pos: int, depth: int) -> tuple[SingleFloat, int]:
    end = pos + 5
    if end > len(v):
        raise _error("truncated float", pos)
    (bits,) = _U32.unpack_from(v, pos + 1)
    return SingleFloat.from_bits(bits ^ (_SIGN32 if bits & _SIGN32 else _MASK32)), end


_UUID_FROM_BYTES: Final = functools.partial(uuid.UUID, None)
"""``uuid.UUID(None, body)``, that is ``UUID(bytes=body)`` without a Python frame."""


def _decode_uuid(v: bytes, pos: int, depth: int) -> tuple[uuid.UUID, int]:
    end = pos + 17
    if end > len(v):
        raise _error("truncated UUID", pos)
    return _UUID_FROM_BYTES(v[pos + 1 : end]), end


def _decode_false(v: bytes, pos: int, depth: int) -> tuple[bool, int]:
    return False, pos + 1


def _decode_true(v: bytes, pos: int, depth: int) -> tuple[bool, int]:
    return True, pos + 1


def _decode_none(v: bytes, pos: int, depth: int) -> tuple[None, int]:
    return None, pos + 1  # inside a nested tuple, _decode_nested reads 0x00 itself


def _decode_versionstamp(v: bytes, pos: int, depth: int) -> tuple[Versionstamp, int]:
    end = pos + 13
    if end > len(v):
        raise _error("truncated versionstamp", pos)
    tr_version = v[pos + 1 : pos + 11]
    user_version = int.from_bytes(v[pos + 11 : end], "big")
    if tr_version == _STAMP_PLACEHOLDER:
        return Versionstamp(None, user_version), end
    return Versionstamp(tr_version, user_version), end


def _decode_nested(v: bytes, pos: int, depth: int) -> tuple[tuple[Any, ...], int]:
    """The nested tuple at ``pos``: elements up to a 0x00 not followed by 0xff."""
    if depth >= MAX_DEPTH:
        raise _error(f"tuple nested deeper than {MAX_DEPTH} levels", pos)
    out: list[Any] = []
    append = out.append
    size = len(v)
    start = pos
    pos += 1
    depth += 1
    while pos < size:
        code = v[pos]
        if code == 0x00:
            if pos + 1 < size and v[pos + 1] == 0xFF:
                append(None)
                pos += 2
                continue
            return tuple(out), pos + 1
        value, pos = _DECODERS[code](v, pos, depth)
        append(value)
    raise _error("unterminated nested tuple", start)


def _decode_unknown(v: bytes, pos: int, depth: int) -> tuple[Any, int]:
    raise _error(f"unknown or reserved type code 0x{v[pos]:02x}", pos)


_Decoder = Callable[[bytes, int, int], tuple[Any, int]]


def _decoders() -> tuple[_Decoder, ...]:
    table: list[_Decoder] = [_decode_unknown] * 256
    table[0x00] = _decode_none
    table[0x01] = _decode_bytes
    table[0x02] = _decode_str
    table[0x05] = _decode_nested
    table[0x0B] = table[0x1D] = _decode_big_int
    for code in builtins.range(0x0C, 0x14):
        table[code] = _decode_negative
    table[0x14] = _decode_positive  # zero: no bytes
    for code in builtins.range(0x15, 0x1D):
        table[code] = _decode_positive
    table[0x20] = _decode_single
    table[0x21] = _decode_double
    table[0x26] = _decode_false
    table[0x27] = _decode_true
    table[0x30] = _decode_uuid
    table[0x33] = _decode_versionstamp
    return tuple(table)


_DECODERS: Final = _decoders()
"""The decoder of each type code; codes the format does not define raise TupleError."""


def unpack(key: bytes | bytearray | memoryview, prefix_len: int = 0) -> tuple[Any, ...]:
    """The tuple packed in ``key`` after its first ``prefix_len`` bytes.

    Raises :class:`TupleError` (a ``ValueError``) naming the byte offset when ``key`` is
    not exactly one packed tuple after the prefix.
    """
    v = key if type(key) is bytes else bytes(key)
    size = len(v)
    if not 0 <= prefix_len <= size:
        raise TupleError(f"prefix length {prefix_len} is outside the {size}-byte key")
    out: list[Any] = []
    append = out.append
    pos = prefix_len
    while pos < size:
        value, pos = _DECODERS[v[pos]](v, pos, 0)
        append(value)
    return tuple(out)


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
