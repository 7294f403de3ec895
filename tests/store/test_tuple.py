"""The tuple layer: round trips, the specification's order and test vectors, bytes
identical to ``fdb.tuple``, garbage refused with TupleError, versionstamp offsets."""

from __future__ import annotations

import enum
import math
import struct
import sys
import types
import uuid
from typing import Any, NamedTuple

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ledgerd.store.keys import tuple as fdbtuple
from ledgerd.store.keys.tuple import SingleFloat, TupleError, Versionstamp

fdb_tuple: Any = pytest.importorskip("fdb.tuple")  # in the test extra: runs in CI
if not hasattr(sys.modules["fdb"], "impl"):
    # fdb.tuple's Versionstamp.to_bytes asks isinstance(tr_version, fdb.impl.Value), and
    # fdb.impl loads only with the native client: give it a class no value belongs to.
    fdb_package: Any = sys.modules["fdb"]
    fdb_package.impl = types.SimpleNamespace(Value=type("Value", (), {}))

BIG = 2**2040 - 1
"""The largest magnitude the format holds (255 bytes)."""

# -- strategies ---------------------------------------------------------------------------

doubles = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, math.inf, -math.inf, math.nan, -math.nan]),
    st.integers(0, 2**64 - 1).map(lambda b: struct.unpack(">d", b.to_bytes(8, "big"))[0]),
)
singles = st.one_of(
    st.integers(0, 2**32 - 1).map(SingleFloat.from_bits),
    st.floats(width=32).map(SingleFloat),
)
ints = st.one_of(
    st.integers(),
    st.integers(-BIG, BIG),
    st.sampled_from(
        [s * (2 ** (8 * k)) + d for k in range(10) for d in (-1, 0, 1) for s in (1, -1)]
    ),
)
stamps = st.builds(Versionstamp, st.binary(min_size=10, max_size=10), st.integers(0, 0xFFFF))
scalars = st.one_of(
    st.none(),
    st.binary(max_size=20),
    st.text(max_size=20),
    ints,
    doubles,
    singles,
    st.booleans(),
    st.uuids(),
    stamps.filter(lambda s: s.tr_version != b"\xff" * 10),
)
elements = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=5).map(tuple) | st.lists(inner, max_size=3),
    max_leaves=25,
)
tuples = st.lists(elements, max_size=8).map(tuple)


def canon(x: Any) -> Any:
    """``x`` with types made explicit and floats as bit patterns (so NaN equals itself,
    True differs from 1, and lists read back as tuples)."""
    if isinstance(x, tuple | list):
        return ("tuple", tuple(canon(e) for e in x))
    if isinstance(x, float):
        return ("float", struct.pack(">d", x))
    if isinstance(x, SingleFloat):
        return ("single", x.bits)
    return (type(x).__name__, x)


def to_fdb(x: Any) -> Any:
    """``x`` with our SingleFloat and Versionstamp replaced by fdb's."""
    if isinstance(x, tuple | list):
        return type(x)(to_fdb(e) for e in x)
    if isinstance(x, SingleFloat):
        return fdb_tuple.SingleFloat(x.value)
    if isinstance(x, Versionstamp):
        return fdb_tuple.Versionstamp(x.tr_version, x.user_version)
    return x


def from_fdb(x: Any) -> Any:
    if isinstance(x, tuple):
        return tuple(from_fdb(e) for e in x)
    if isinstance(x, fdb_tuple.SingleFloat):
        return SingleFloat(x.value)
    if isinstance(x, fdb_tuple.Versionstamp):
        return Versionstamp(x.tr_version, x.user_version)
    return x


def fdb_safe(t: Any) -> bool:
    """Whether fdb's SingleFloat carries ``t``'s floats exactly: it holds a Python float,
    which turns a signalling NaN quiet."""
    if isinstance(t, tuple | list):
        return all(fdb_safe(e) for e in t)
    if isinstance(t, SingleFloat):
        return SingleFloat(t.value).bits == t.bits
    return True


# -- the specification's order, written independently of the encoding ---------------------


def _sign(c: int) -> int:
    return (c > 0) - (c < 0)


def _cmp(a: Any, b: Any) -> int:
    return int(a > b) - int(a < b)


def _float_cmp(a_bits: int, b_bits: int, width: int) -> int:
    """IEEE total order on bit patterns: sign first, then magnitude, reversed if negative."""
    sign = 1 << (width - 1)
    a_neg, b_neg = bool(a_bits & sign), bool(b_bits & sign)
    if a_neg != b_neg:
        return -1 if a_neg else 1
    c = _cmp(a_bits & (sign - 1), b_bits & (sign - 1))
    return -c if a_neg else c


def _rank(x: Any) -> int:
    if x is None:
        return 0
    if isinstance(x, bytes):
        return 1
    if isinstance(x, str):
        return 2
    if isinstance(x, tuple | list):
        return 5
    if isinstance(x, bool):
        return 0x26
    if isinstance(x, int):
        return 0x14
    if isinstance(x, SingleFloat):
        return 0x20
    if isinstance(x, float):
        return 0x21
    if isinstance(x, uuid.UUID):
        return 0x30
    assert isinstance(x, Versionstamp)
    return 0x33


def spec_cmp(a: Any, b: Any) -> int:
    """The order of design/tuple.md: by type code, then by value within a type."""
    ra, rb = _rank(a), _rank(b)
    if ra != rb:
        return _cmp(ra, rb)
    if ra == 5:
        for x, y in zip(a, b, strict=False):
            c = spec_cmp(x, y)
            if c:
                return c
        return _cmp(len(a), len(b))
    if ra == 0x21:
        bits = struct.Struct(">Q")
        return _float_cmp(
            bits.unpack(struct.pack(">d", a))[0], bits.unpack(struct.pack(">d", b))[0], 64
        )
    if ra == 0x20:
        return _float_cmp(a.bits, b.bits, 32)
    if ra == 0x30:
        return _cmp(a.bytes, b.bytes)
    if ra == 0x33:
        return _cmp(a.to_bytes(), b.to_bytes())
    if ra == 0:
        return 0
    return _cmp(a, b)  # bytes, str (code points: the order of their UTF-8), ints, bools


# -- round trip and order -----------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(tuples)
def test_round_trip(t: tuple[Any, ...]) -> None:
    packed = fdbtuple.pack(t)
    assert canon(fdbtuple.unpack(packed)) == canon(t)
    assert fdbtuple.pack(fdbtuple.unpack(packed)) == packed


@settings(max_examples=100, deadline=None)
@given(tuples, st.binary(max_size=8))
def test_prefix(t: tuple[Any, ...], prefix: bytes) -> None:
    packed = fdbtuple.pack(t, prefix=prefix)
    assert packed == prefix + fdbtuple.pack(t)
    assert canon(fdbtuple.unpack(packed, prefix_len=len(prefix))) == canon(t)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(tuples, min_size=2, max_size=12))
def test_packed_order_is_the_specification_order(ts: list[tuple[Any, ...]]) -> None:
    by_bytes = sorted(ts, key=fdbtuple.pack)
    for a, b in zip(by_bytes, by_bytes[1:], strict=False):
        assert spec_cmp(a, b) <= 0, (a, b)
        assert _sign(fdbtuple.compare(a, b)) == _sign(spec_cmp(a, b))
        if fdb_safe(a) and fdb_safe(b):
            assert fdb_tuple.compare(to_fdb(a), to_fdb(b)) == _sign(spec_cmp(a, b))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(ints, doubles, singles), min_size=2, max_size=20))
def test_numbers_sort_by_value(xs: list[Any]) -> None:
    """Negative, huge and boundary ints; floats with ±0, ±inf and NaNs of both signs."""
    keys = sorted(fdbtuple.pack((x,)) for x in xs)
    values = [fdbtuple.unpack(k)[0] for k in keys]
    for a, b in zip(values, values[1:], strict=False):
        assert spec_cmp(a, b) <= 0, (a, b)


def test_float_order_landmarks() -> None:
    nan_neg = struct.unpack(">d", b"\xff\xf8" + b"\x00" * 6)[0]
    nan_pos = struct.unpack(">d", b"\x7f\xf8" + b"\x00" * 6)[0]
    tiny = 5e-324
    order = [nan_neg, -math.inf, -1e308, -1.0, -tiny, -0.0, 0.0, tiny, 1.0, 1e308, math.inf]
    order.append(nan_pos)
    keys = [fdbtuple.pack((x,)) for x in order]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    singles_order = [SingleFloat(x) for x in (-math.inf, -1.5, -0.0, 0.0, 1.5, math.inf)]
    keys = [fdbtuple.pack((x,)) for x in singles_order]
    assert keys == sorted(keys)


# -- the specification's test vectors -----------------------------------------------------


@pytest.mark.parametrize(
    ("value", "packed"),
    [
        (b"foo\x00bar", b"\x01foo\x00\xffbar\x00"),
        ("F\u00d4O\u0000bar", b"\x02F\xc3\x94O\x00\xffbar\x00"),
        (
            (b"foo\x00bar", None, ()),
            b"\x05\x01foo\x00\xffbar\x00\x00\xff\x05\x00\x00",
        ),
        (-5551212, b"\x11\xabK\x93"),
        (SingleFloat(-42.0), b"\x20\x3d\xd7\xff\xff"),
        (-1, b"\x13\xfe"),
        ((), b"\x05\x00"),
        ((None,), b"\x05\x00\xff\x00"),
        (None, b"\x00"),
        (False, b"\x26"),
        (True, b"\x27"),
        (0, b"\x14"),
        (1, b"\x15\x01"),
        (2**64 - 1, b"\x1d\x08" + b"\xff" * 8),  # Python binding (Java: 0x1c ff*8)
        (-(2**64 - 1), b"\x0b\xf7" + b"\x00" * 8),  # Python binding (Java: 0x0c 00*8)
        (2**64, b"\x1d\x09\x01" + b"\x00" * 8),
        (-(2**64), b"\x0b\xf6\xfe" + b"\xff" * 8),
        (uuid.UUID(int=1), b"\x30" + b"\x00" * 15 + b"\x01"),
        (
            Versionstamp(b"\x00" * 7 + b"\x01\x00\x02", 3),
            b"\x33" + b"\x00" * 7 + b"\x01\x00\x02\x00\x03",
        ),
        (1.0, b"\x21\xbf\xf0" + b"\x00" * 6),
        (-1.0, b"\x21\x40\x0f" + b"\xff" * 6),
        (0.0, b"\x21\x80" + b"\x00" * 7),
        (-0.0, b"\x21\x7f" + b"\xff" * 7),
    ],
)
def test_vectors(value: Any, packed: bytes) -> None:
    assert fdbtuple.pack((value,)) == packed
    assert canon(fdbtuple.unpack(packed)) == canon((value,))


def test_other_bindings_big_boundaries_unpack() -> None:
    """Java's and Go's packing of ±(2**64-1) reads back as the same ints."""
    assert fdbtuple.unpack(b"\x1c" + b"\xff" * 8) == (2**64 - 1,)
    assert fdbtuple.unpack(b"\x0c" + b"\x00" * 8) == (-(2**64 - 1),)


# -- identical to fdb.tuple ----------------------------------------------------------------

EDGES: list[Any] = [
    *(s * (2 ** (8 * k)) + d for k in range(10) for d in (-1, 0, 1) for s in (1, -1)),
    2**64 - 1,
    -(2**64 - 1),
    2**64,
    -(2**64),
    BIG,
    -BIG,
    2**1000 + 12345,
    -(2**1000) - 12345,
    b"",
    "",
    "\x00",
    b"\x00",
    b"\x00\xff",
    "a\x00b\x00",
    "\U0001f600",
    None,
    (None,),
    (),
    ((),),
    ((None, ()), None),
    [1, [2, None]],
    0.0,
    -0.0,
    math.inf,
    -math.inf,
    math.nan,
    -math.nan,
    5e-324,
    SingleFloat(1e300),
    SingleFloat(-1e-50),
    SingleFloat(math.nan),
    True,
    False,
    uuid.UUID(int=0),
    uuid.UUID(int=2**128 - 1),
    Versionstamp(b"\x01" * 10, 0xFFFF),
]


@pytest.mark.parametrize("value", EDGES, ids=repr)
def test_edges_match_fdb(value: Any) -> None:
    t = ("k", value, 7)
    packed = fdbtuple.pack(t)
    assert packed == fdb_tuple.pack(to_fdb(t))
    assert canon(from_fdb(fdb_tuple.unpack(packed))) == canon(fdbtuple.unpack(packed))


@settings(max_examples=300, deadline=None)
@given(tuples, st.binary(max_size=4) | st.none())
def test_pack_matches_fdb(t: tuple[Any, ...], prefix: bytes | None) -> None:
    assume(fdb_safe(t))
    packed = fdbtuple.pack(t, prefix)
    assert packed == fdb_tuple.pack(to_fdb(t), prefix)
    n = len(prefix or b"")
    assert canon(fdbtuple.unpack(packed, n)) == canon(from_fdb(fdb_tuple.unpack(packed, n)))


def test_single_float_rounds_like_fdb() -> None:
    for x in (0.1, 1e300, -1e300, 3.4028235e38, 3.4028236e38, 1e-50, -1e-46, 16777217):
        assert SingleFloat(x).value == fdb_tuple.SingleFloat(x).value or (
            math.isnan(SingleFloat(x).value)
        )
    assert SingleFloat(1e300).value == math.inf
    assert SingleFloat(-1e300).value == -math.inf


# -- values: types, subclasses, refusals ---------------------------------------------------


class Color(enum.IntEnum):
    RED = 5


class Point(NamedTuple):
    x: int
    y: int


class Name(str):
    pass


def test_subclasses_pack_as_their_base() -> None:
    assert fdbtuple.pack((Color.RED,)) == fdbtuple.pack((5,))
    assert fdbtuple.pack((Point(1, 2),)) == fdbtuple.pack(((1, 2),))
    assert fdbtuple.pack((Name("n"),)) == fdbtuple.pack(("n",))
    assert fdbtuple.pack(Point(1, 2)) == fdbtuple.pack((1, 2))
    assert fdbtuple.pack((True,)) != fdbtuple.pack((1,))


@pytest.mark.parametrize("value", [object(), bytearray(b"x"), {"a": 1}, {1}, 1j, 2**2040])
def test_unsupported_values_are_value_errors(value: Any) -> None:
    with pytest.raises(ValueError):
        fdbtuple.pack((value,))


def test_pack_needs_a_tuple() -> None:
    with pytest.raises(TypeError):
        fdbtuple.pack(["a"])  # type: ignore[arg-type]


def test_single_float_and_versionstamp_api() -> None:
    assert SingleFloat(1.5) == SingleFloat(1.5) and hash(SingleFloat(1.5)) == hash(SingleFloat(1.5))
    assert SingleFloat(-0.0) != SingleFloat(0.0) and SingleFloat(-0.0) < SingleFloat(0.0)
    assert SingleFloat(math.nan) == SingleFloat(math.nan)
    assert SingleFloat(math.inf) < SingleFloat(math.nan)
    assert repr(SingleFloat(1.5)) == "SingleFloat(1.5)" and not SingleFloat(0.0)
    with pytest.raises(TypeError):
        SingleFloat("1")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        SingleFloat.from_bits(2**32)

    done = Versionstamp(b"\x00" * 10, 1)
    todo = Versionstamp.incomplete(0)
    assert done.is_complete() and not todo.is_complete()
    assert done < todo and todo > done and not todo < done
    assert Versionstamp.incomplete(1) > todo
    assert todo.to_bytes() == b"\xff" * 10 + b"\x00\x00"
    assert Versionstamp.from_bytes(todo.to_bytes()) == todo
    assert Versionstamp.from_bytes(b"xx" + done.to_bytes(), 2) == done
    assert todo.completed(b"\x02" * 10) == Versionstamp(b"\x02" * 10, 0)
    assert len({done, Versionstamp(b"\x00" * 10, 1), todo}) == 2
    with pytest.raises(RuntimeError):
        done.completed(b"\x02" * 10)
    with pytest.raises(ValueError):
        Versionstamp(b"short")
    with pytest.raises(TypeError):
        Versionstamp("x" * 10)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Versionstamp(None, 0x10000)
    with pytest.raises(ValueError):
        Versionstamp.from_bytes(b"\x00" * 11)
    assert sorted([todo, done]) == [done, todo]


def test_versionstamp_order_matches_fdb() -> None:
    stamps_ = [
        Versionstamp(b"\x00" * 10, 2),
        Versionstamp(b"\x00" * 10, 1),
        Versionstamp(b"\x01" + b"\x00" * 9, 0),
        Versionstamp.incomplete(3),
        Versionstamp.incomplete(0),
    ]
    ours = sorted(stamps_)
    theirs = sorted(to_fdb(s) for s in stamps_)
    assert [to_fdb(s) for s in ours] == theirs


# -- garbage ------------------------------------------------------------------------------


def unpack_or_tuple_error(data: bytes) -> None:
    """Unpacking ``data`` returns a tuple or raises TupleError naming a byte offset; what
    it accepts, ``fdb.tuple`` (which accepts more) reads the same."""
    try:
        result = fdbtuple.unpack(data)
    except TupleError as e:
        assert "at byte" in str(e), e
    else:
        if fdb_safe(result):  # fdb.tuple turns a signalling single-float NaN quiet
            assert canon(result) == canon(from_fdb(fdb_tuple.unpack(data)))


@settings(max_examples=2000, deadline=None)
@given(st.binary(max_size=64))
def test_random_bytes(data: bytes) -> None:
    unpack_or_tuple_error(data)


@settings(max_examples=500, deadline=None)
@given(
    st.lists(st.sampled_from(b"\x00\x01\x02\x05\x0b\x0c\x14\x1d\x20\x21\x30\x33\xff"), max_size=40)
)
def test_random_type_codes(codes: list[int]) -> None:
    unpack_or_tuple_error(bytes(codes))


@settings(max_examples=500, deadline=None)
@given(tuples.filter(bool), st.data())
def test_mutated_encodings(t: tuple[Any, ...], data: st.DataObject) -> None:
    packed = fdbtuple.pack(t)
    cut = data.draw(st.integers(0, len(packed) - 1))
    unpack_or_tuple_error(packed[:cut])
    at = data.draw(st.integers(0, len(packed) - 1))
    byte = data.draw(st.integers(0, 255))
    unpack_or_tuple_error(packed[:at] + bytes((byte,)) + packed[at + 1 :])
    unpack_or_tuple_error(packed[:at] + bytes((byte,)) + packed[at:])
    unpack_or_tuple_error(packed[:at] + packed[at + 1 :])


@pytest.mark.parametrize(
    ("data", "offset"),
    [
        (b"\x02abc", 0),  # unterminated string
        (b"\x15\x01\x01abc\x00\xff", 2),  # unterminated bytes after an escaped 0x00
        (b"\x02\xff\x00", 0),  # invalid UTF-8
        (b"\x15", 0),  # truncated int
        (b"\x14\x0c\x00", 1),  # truncated negative int
        (b"\x1d\x09\x01", 0),  # truncated big int
        (b"\x0b", 0),  # big int without a length byte
        (b"\x21\x00", 0),  # truncated double
        (b"\x20\x00", 0),  # truncated float
        (b"\x30" + b"\x00" * 15, 0),  # truncated UUID
        (b"\x33" + b"\x00" * 11, 0),  # truncated versionstamp
        (b"\x05\x02a\x00", 0),  # unterminated nested tuple
        (b"\x14\x03", 1),  # reserved code (deprecated nested tuple)
        (b"\x25", 0),  # reserved code (deprecated true)
        (b"\x00\xff", 1),  # nested-null escape outside a nested tuple: 0xff is no type
        (b"\x40", 0),  # user type code
    ],
)
def test_bad_input_names_the_offset(data: bytes, offset: int) -> None:
    with pytest.raises(TupleError, match=f"at byte {offset}$"):
        fdbtuple.unpack(data)


def test_unpack_takes_bytes_like_and_checks_prefix_len() -> None:
    packed = fdbtuple.pack(("a", 1))
    assert fdbtuple.unpack(bytearray(packed)) == ("a", 1)
    assert fdbtuple.unpack(memoryview(packed)) == ("a", 1)
    assert fdbtuple.unpack(packed, prefix_len=len(packed)) == ()
    for bad in (-1, len(packed) + 1):
        with pytest.raises(TupleError):
            fdbtuple.unpack(packed, prefix_len=bad)


def test_depth_limit() -> None:
    deepest: Any = ()
    for _ in range(fdbtuple.MAX_DEPTH - 1):
        deepest = (deepest,)
    packed = fdbtuple.pack((deepest,))
    assert fdbtuple.unpack(packed) == (deepest,)
    with pytest.raises(TupleError, match="nested deeper"):
        fdbtuple.pack(((deepest,),))
    with pytest.raises(TupleError, match="nested deeper"):
        fdbtuple.unpack(b"\x05" + packed + b"\x00")
    with pytest.raises(TupleError, match="nested deeper"):
        fdbtuple.unpack(b"\x05" * 100_000)
    with pytest.raises(TupleError, match="nested deeper"):
        fdbtuple.unpack(b"\x05" * 100_000 + b"\x00" * 100_000)
    with pytest.raises(TupleError, match="nested deeper"):
        fdbtuple.pack_with_versionstamp(((deepest, Versionstamp.incomplete()),))


# -- versionstamps ------------------------------------------------------------------------

STAMP = b"\x00\x00\x00\x00\x00\x00\x12\x34\x00\x07"


def offset_of(packed: bytes) -> int:
    return int.from_bytes(packed[-4:], "little")


def test_versionstamp_offset_with_prefix() -> None:
    t = ("events", Versionstamp.incomplete(9), "x")
    packed = fdbtuple.pack_with_versionstamp(t, prefix=b"pre")
    off = offset_of(packed)
    assert off == len(b"pre") + len(fdbtuple.pack(("events",))) + 1
    assert packed[off - 1] == 0x33 and packed[off : off + 10] == b"\xff" * 10
    assert packed == fdb_tuple.pack_with_versionstamp(to_fdb(t), prefix=b"pre")
    done = fdbtuple.complete_versionstamp(packed, STAMP)
    assert fdbtuple.unpack(done, prefix_len=3) == ("events", Versionstamp(STAMP, 9), "x")


def test_versionstamp_offset_inside_nested_tuples() -> None:
    t = (1, (None, ("deep", Versionstamp.incomplete(2))), b"z")
    packed = fdbtuple.pack_with_versionstamp(t)
    off = offset_of(packed)
    before = fdbtuple.pack((1,)) + b"\x05\x00\xff\x05" + fdbtuple.pack(("deep",))
    assert off == len(before) + 1
    assert packed == fdb_tuple.pack_with_versionstamp(to_fdb(t))
    done = fdbtuple.complete_versionstamp(packed, STAMP)
    assert fdbtuple.unpack(done) == (1, (None, ("deep", Versionstamp(STAMP, 2))), b"z")


@settings(max_examples=200, deadline=None)
@given(tuples, st.data(), st.binary(max_size=6), st.integers(0, 0xFFFF))
def test_versionstamp_anywhere(
    t: tuple[Any, ...], data: st.DataObject, prefix: bytes, user: int
) -> None:
    """An incomplete stamp put at any position of any nesting gets the right offset."""
    path: list[int] = []
    here: Any = t
    while True:
        at = data.draw(st.integers(0, len(here)))
        nested = [i for i, e in enumerate(here) if isinstance(e, tuple)]
        deeper = data.draw(st.booleans())
        if nested and deeper:
            i = data.draw(st.sampled_from(nested))
            path.append(i)
            here = here[i]
            continue
        break

    def insert(x: tuple[Any, ...], depth: int, value: Any) -> tuple[Any, ...]:
        if depth == len(path):
            return x[:at] + (value,) + x[at:]
        i = path[depth]
        return x[:i] + (insert(x[i], depth + 1, value),) + x[i + 1 :]

    with_stamp = insert(t, 0, Versionstamp.incomplete(user))
    packed = fdbtuple.pack_with_versionstamp(with_stamp, prefix=prefix)
    assert fdbtuple.has_incomplete_versionstamp(with_stamp)
    if fdb_safe(t):
        assert packed == fdb_tuple.pack_with_versionstamp(to_fdb(with_stamp), prefix=prefix)
    done = fdbtuple.complete_versionstamp(packed, STAMP)
    expected = insert(t, 0, Versionstamp(STAMP, user))
    assert done == fdbtuple.pack(expected, prefix=prefix)
    assert canon(fdbtuple.unpack(done, prefix_len=len(prefix))) == canon(expected)


def test_versionstamp_errors() -> None:
    todo = Versionstamp.incomplete()
    with pytest.raises(ValueError, match="no incomplete versionstamp"):
        fdbtuple.pack_with_versionstamp(("a", Versionstamp(STAMP)))
    with pytest.raises(ValueError, match="2 incomplete versionstamps"):
        fdbtuple.pack_with_versionstamp((todo, todo))
    with pytest.raises(ValueError, match="2 incomplete versionstamps"):
        fdbtuple.pack_with_versionstamp((todo, ("x", [todo])))
    with pytest.raises(ValueError, match="incomplete versionstamp"):
        fdbtuple.pack(("a", (todo,)))
    assert not fdbtuple.has_incomplete_versionstamp(("a", (Versionstamp(STAMP),)))
    assert fdbtuple.has_incomplete_versionstamp(("a", [None, (todo,)]))


def test_complete_versionstamp_checks_its_input() -> None:
    packed = fdbtuple.pack_with_versionstamp(("a", Versionstamp.incomplete()))
    for bad_stamp in (b"\x00" * 9, b"\xff" * 10):
        with pytest.raises(TupleError):
            fdbtuple.complete_versionstamp(packed, bad_stamp)
    with pytest.raises(TupleError, match="too short"):
        fdbtuple.complete_versionstamp(b"\x00\x00", STAMP)
    with pytest.raises(TupleError, match="outside"):
        fdbtuple.complete_versionstamp(packed[:-4] + (100).to_bytes(4, "little"), STAMP)
    with pytest.raises(TupleError, match="no incomplete versionstamp at byte 1"):
        fdbtuple.complete_versionstamp(packed[:-4] + (1).to_bytes(4, "little"), STAMP)
    once = fdbtuple.complete_versionstamp(packed, STAMP)
    with pytest.raises(TupleError):
        fdbtuple.complete_versionstamp(once, STAMP)  # the offset is gone with the placeholder


def test_compare_allows_incomplete_versionstamps() -> None:
    todo = Versionstamp.incomplete()
    assert fdbtuple.compare(("a", Versionstamp(STAMP)), ("a", todo)) == -1
    assert fdbtuple.compare(("a", todo), ("a", todo)) == 0
    assert fdbtuple.compare(("b",), ("a", todo)) == 1


# -- range and strinc ---------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(tuples, elements, tuples)
def test_range_holds_the_longer_tuples(t: tuple[Any, ...], x: Any, rest: tuple[Any, ...]) -> None:
    r = fdbtuple.range(t)
    assert not fdb_safe(t) or r == fdb_tuple.range(to_fdb(t))
    assert r.start <= fdbtuple.pack(t + (x,) + rest) < r.stop
    assert not r.start <= fdbtuple.pack(t) < r.stop


def test_strinc() -> None:
    assert fdbtuple.strinc(b"a") == b"b"
    assert fdbtuple.strinc(b"a\xff\xff") == b"b"
    assert fdbtuple.strinc(b"\x00\xfe") == b"\x00\xff"
    for bad in (b"", b"\xff\xff"):
        with pytest.raises(ValueError):
            fdbtuple.strinc(bad)


def test_fdb_tuple_runs_without_an_api_version() -> None:
    """The comparisons above run ``fdb.tuple`` as the ``foundationdb`` package ships it,
    with no API version selected: the behaviour of API version 520 and later."""
    import fdb

    assert not fdb.is_api_version_selected()


def test_tuple_errors_are_the_stores_invalid_arguments() -> None:
    """So the daemon answers them with 400 bad_request, and they stay ValueErrors."""
    from ledgerd.daemon import errors as api_errors
    from ledgerd.store.errors import InvalidArgumentError

    with pytest.raises(TupleError) as info:
        fdbtuple.unpack(b"\x02abc")
    assert isinstance(info.value, InvalidArgumentError)
    assert isinstance(info.value, ValueError)
    api = api_errors.from_store(info.value)
    assert (api.status, api.code) == (400, "bad_request")
    assert str(info.value) == "unterminated string at byte 0"
