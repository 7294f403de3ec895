"""Unpacking of FoundationDB tuples (the format is described in :mod:`store.keys.tuple`).

This module owns :func:`unpack` and one decoder per type code; it is safe on untrusted
bytes, raising :class:`TupleError` naming the byte offset. Packing lives in
:mod:`store.keys.tuple`, which every caller imports :func:`unpack` through.
"""

from __future__ import annotations

import builtins
import functools
import uuid
from collections.abc import Callable
from typing import Any, Final

from ledgerd.store.keys.tuple_types import (
    DOUBLE,
    LIMITS,
    MASK32,
    MAX_DEPTH,
    SIGN32,
    SIGN64,
    STAMP_PLACEHOLDER,
    U32,
    U64,
    U64_MAX,
    SingleFloat,
    TupleError,
    Versionstamp,
)

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
    return int.from_bytes(v[pos + 1 : end], "big") - LIMITS[n], end


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
    (bits,) = U64.unpack_from(v, pos + 1)
    bits ^= SIGN64 if bits & SIGN64 else U64_MAX
    return DOUBLE.unpack(U64.pack(bits))[0], end


def _decode_single(v: bytes, pos: int, depth: int) -> tuple[SingleFloat, int]:
    end = pos + 5
    if end > len(v):
        raise _error("truncated float", pos)
    (bits,) = U32.unpack_from(v, pos + 1)
    return SingleFloat.from_bits(bits ^ (SIGN32 if bits & SIGN32 else MASK32)), end


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
    if tr_version == STAMP_PLACEHOLDER:
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
