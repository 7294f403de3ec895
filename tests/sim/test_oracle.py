"""The oracle's rules on hand-made states: what a history must end with."""

from __future__ import annotations

from tests.sim import adapter, oracle
from tests.sim.oracle import Model, Write

P = b"p0"


def _state(entries: dict[bytes, bytes]) -> dict[bytes, adapter.PageState]:
    return {P: adapter.PageState(entries, b"root", 1, 1, None)}


def _check(model: Model, entries: dict[bytes, bytes]) -> list[str]:
    return [f.category for f in oracle.check_values(model, _state(entries), {P: "kv"})]


def test_a_key_one_device_wrote_holds_its_last_acknowledged_write() -> None:
    m = Model()
    m.key(P, b"k", Write(0, b"1", True, 1, 0))
    m.key(P, b"k", Write(0, b"2", True, 2, 0))
    assert _check(m, {b"k": b"2"}) == []
    assert _check(m, {b"k": b"1"}) == [oracle.LOST_WRITE]
    assert _check(m, {}) == [oracle.LOST_WRITE]
    m.key(P, b"k", Write(0, b"3", False, 3, 0))  # cut short by a crash: maybe
    assert _check(m, {b"k": b"2"}) == [] and _check(m, {b"k": b"3"}) == []
    m.key(P, b"k", Write(0, None, True, 4, 0))
    assert _check(m, {}) == [] and _check(m, {b"k": b"2"}) == [oracle.LOST_WRITE]


def test_a_key_several_devices_wrote_holds_one_of_their_values() -> None:
    m = Model()
    m.key(P, b"k", Write(0, b"a", True, 1, 0))
    m.key(P, b"k", Write(1, b"b", True, 2, 0))
    assert _check(m, {b"k": b"a"}) == [] and _check(m, {b"k": b"b"}) == []
    assert _check(m, {b"k": b"c"}) == [oracle.BAD_VALUE]
    assert _check(m, {}) == [oracle.BAD_VALUE]  # no delete among them
    assert _check(m, {b"k": b"a", b"x": b"1"}) == [oracle.PHANTOM]


def test_after_a_barrier_the_one_later_write_wins() -> None:
    m = Model()
    m.key(P, b"k", Write(0, b"a", True, 1, 0))
    m.key(P, b"k", Write(1, b"b", True, 2, 0))
    m.barrier(_state({b"k": b"b"}))
    assert _check(m, {b"k": b"b"}) == []
    assert _check(m, {b"k": b"a"}) == [oracle.BAD_VALUE]  # settled on b, nobody wrote since
    m.key(P, b"k", Write(0, b"c", True, 3, 0))
    assert _check(m, {b"k": b"c"}) == []
    assert _check(m, {b"k": b"b"}) == [oracle.BAD_VALUE]
    m.key(P, b"k", Write(1, b"d", True, 4, 0))  # two since the barrier: either
    assert _check(m, {b"k": b"c"}) == [] and _check(m, {b"k": b"d"}) == []


def test_devices_that_differ_are_found() -> None:
    a = _state({b"k": b"1"})
    b = _state({b"k": b"2"})
    same = _state({b"k": b"1"})
    assert [f.category for f in oracle.compare([a, b], ["d0", "d1"])] == [oracle.DIVERGED]
    assert oracle.compare([a, same], ["d0", "d1"]) == []
    other_root = {P: adapter.PageState({b"k": b"1"}, b"other", 1, 1, None)}
    assert [f.category for f in oracle.compare([a, other_root], ["d0", "d1"])] == [
        oracle.ROOT_DIVERGED
    ]
