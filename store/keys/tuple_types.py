"""The tuple layer's value types and format constants (see :mod:`store.keys.tuple`).

This module owns :class:`SingleFloat`, :class:`Versionstamp`, :class:`TupleError` and the
byte layouts that the packing (:mod:`store.keys.tuple`) and unpacking
(:mod:`store.keys.tuple_unpack`) sides share; it encodes nothing itself.
"""

from __future__ import annotations

import struct
from typing import Final

from ledgerd.store.errors import InvalidArgumentError

MAX_DEPTH: Final = 128
"""Nested tuples deeper than this many levels are refused by :func:`pack` and :func:`unpack`."""

U64_MAX: Final = (1 << 64) - 1
BIG_INT_BYTES: Final = 255
LIMITS: Final = tuple((1 << (8 * n)) - 1 for n in (0, 1, 2, 3, 4, 5, 6, 7, 8))
"""``LIMITS[n]`` is the largest magnitude an int of ``n`` bytes holds."""

DOUBLE: Final = struct.Struct(">d")
FLOAT: Final = struct.Struct(">f")
U64: Final = struct.Struct(">Q")
U32: Final = struct.Struct(">I")
CODE_U64: Final = struct.Struct(">BQ")
CODE_U32: Final = struct.Struct(">BI")
OFFSET: Final = struct.Struct("<I")
"""The versionstamp offset that :func:`pack_with_versionstamp` appends (API version >= 520)."""

SIGN64: Final = 1 << 63
SIGN32: Final = 1 << 31
MASK32: Final = (1 << 32) - 1
STAMP_PLACEHOLDER: Final = b"\xff" * 10


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
            raw = FLOAT.pack(value)
        except OverflowError:  # a C cast rounds these to infinity
            raw = FLOAT.pack(float("inf") if value > 0 else float("-inf"))
        self._bits: int = int.from_bytes(raw, "big")

    @classmethod
    def from_bits(cls, bits: int) -> SingleFloat:
        """The float whose IEEE single-precision bit pattern is ``bits`` (NaN payloads kept)."""
        if not 0 <= bits <= MASK32:
            raise ValueError(f"not a 32-bit pattern: {bits!r}")
        f = cls.__new__(cls)
        f._bits = bits
        return f

    @property
    def bits(self) -> int:
        return self._bits

    @property
    def value(self) -> float:
        return float(FLOAT.unpack(self._bits.to_bytes(4, "big"))[0])

    def _order(self) -> int:
        return self._bits ^ (MASK32 if self._bits & SIGN32 else SIGN32)

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
        if tr_version == STAMP_PLACEHOLDER:
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
        tr = STAMP_PLACEHOLDER if self.tr_version is None else self.tr_version
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
