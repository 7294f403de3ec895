"""The simulation's bucket faults and crash points do what the harness takes them to."""

from __future__ import annotations

import random

import pytest

from ledgerd.sync.errors import CloudNotFoundError, TransientCloudError
from tests.sim.bucket import LIST_LAG_MOST, CrashPoints, Faults, SimBucket, SimCrash


def _bucket(**faults: float) -> tuple[SimBucket, CrashPoints]:
    points = CrashPoints("d0")
    return SimBucket(random.Random(1), Faults(**faults), lambda line: None), points  # type: ignore[arg-type]


async def _names(b: SimBucket, points: CrashPoints) -> list[str]:
    return [n async for n in b.view("d0", lambda: points).list("packs/")]


async def test_a_put_is_listed_only_after_its_lag_but_read_at_once() -> None:
    b, points = _bucket(list_lag=3)
    b.rng = random.Random(0)
    view = b.view("d0", lambda: points)
    for i in range(20):
        await view.put(f"packs/{i:02d}", b"x")
    assert all([await view.get(f"packs/{i:02d}") == b"x" for i in range(20)])
    hidden = 20 - len(await _names(b, points))
    assert hidden > 0
    b.step += 3
    assert len(await _names(b, points)) == 20


async def test_a_put_is_listed_after_at_most_thirty_simulated_seconds() -> None:
    b, points = _bucket(list_lag=1000)
    clock = [0.0]
    b.now = lambda: clock[0]
    view = b.view("d0", lambda: points)
    for i in range(20):
        await view.put(f"packs/{i:02d}", b"x")
    assert len(await _names(b, points)) < 20
    clock[0] += LIST_LAG_MOST
    assert len(await _names(b, points)) == 20


async def test_a_deleted_object_may_stay_listed_for_a_while() -> None:
    b, points = _bucket(delete_lag=2)
    view = b.view("d0", lambda: points)
    for i in range(10):
        await view.put(f"packs/{i}", b"x")
    for i in range(10):
        await view.delete(f"packs/{i}")
    ghosts = await _names(b, points)
    assert ghosts
    with pytest.raises(CloudNotFoundError):
        await view.get(ghosts[0])
    b.settle()
    assert await _names(b, points) == []


async def test_errors_come_before_or_after_the_call_and_settling_ends_them() -> None:
    b, points = _bucket(error_rate=0.5)
    view = b.view("d0", lambda: points)
    failed = stored_anyway = 0
    for i in range(40):
        try:
            await view.put(f"o{i}", b"x")
        except TransientCloudError:
            failed += 1
            stored_anyway += f"o{i}" in b.store.objects
    assert failed and stored_anyway and stored_anyway < failed
    b.settle()
    await view.put("after", b"x")


@pytest.mark.parametrize("before", [True, False])
async def test_the_kth_request_kills_the_process(before: bool) -> None:
    b, points = _bucket()
    points.cloud_countdown, points.cloud_before = 3, before
    view = b.view("d0", lambda: points)
    await view.put("a", b"1")
    await view.put("b", b"2")
    with pytest.raises(SimCrash):
        await view.put("c", b"3")
    assert ("c" in b.store.objects) is not before
    assert points.dead and points.fired is not None
    with pytest.raises(SimCrash):  # dead: nothing more reaches the bucket
        await view.get("a")


def test_the_kth_sqlite_write_kills_the_process() -> None:
    points = CrashPoints("d0", db_countdown=2, db_before=False)
    assert points.db_write("one") is False
    assert points.db_write("two") is True  # done, then the process dies
    assert points.dead
    with pytest.raises(SimCrash):
        points.db_write("three")
