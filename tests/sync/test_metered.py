"""The one Metered: what it counts, under retries and over them."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from ledgerd.sync.cloud import Retrying
from ledgerd.sync.errors import AlreadyExistsError, CloudNotFoundError, TransientCloudError
from ledgerd.sync.folder import FolderStore
from ledgerd.sync.metered import CloudCounters, Metered
from tests.sync.doubles import FaultyStore


async def test_metered_counts_requests_bytes_and_failures(tmp_path: Path) -> None:
    counters = CloudCounters()
    store = Metered(FolderStore(tmp_path), counters)
    await store.create_bucket()
    await store.put("a/1", b"12345")
    await store.put("a/2", b"678")
    assert await store.get("a/1", 1, 2) == b"23"
    assert [n async for n in store.list("a/")] == ["a/1", "a/2"]
    with pytest.raises(CloudNotFoundError):
        await store.get("a/missing")
    await store.delete("a/2")
    assert counters.requests == {"create_bucket": 1, "put": 2, "get": 2, "list": 1, "delete": 1}
    assert counters.errors == {("get", "CloudNotFoundError"): 1} and counters.retried == 0
    assert (counters.bytes_up, counters.bytes_down) == (8, 2)
    assert set(counters.seconds) == set(counters.requests)
    before = store.snapshot()
    await store.get("a/1")
    assert store.since(before) == {
        "put": 0,
        "get": 1,
        "list": 0,
        "delete": 0,
        "bytes_up": 0,
        "bytes_down": 5,
    }


async def test_under_retries_every_attempt_counts_over_them_one(tmp_path: Path) -> None:
    """The daemon's metrics count under Retrying (each attempt, and its transient
    failure), the engine's round costs over it (a request once, however retried)."""
    attempts = CloudCounters()
    faulty = FaultyStore(FolderStore(tmp_path), rate=0.5, seed=3)
    over = Metered(Retrying(Metered(faulty, attempts), deadline=30, first=0.001, most=0.01))
    for i in range(20):
        with contextlib.suppress(AlreadyExistsError):  # stored, then its reply was "lost"
            await over.put(f"o/{i:02d}", b"x")
    assert [n async for n in over.list("o/")] == [f"o/{i:02d}" for i in range(20)]
    assert over.counters.requests == {"put": 20, "list": 1}
    transient = sum(n for (_, e), n in attempts.errors.items() if e == "TransientCloudError")
    assert transient == attempts.retried == faulty.failures > 0
    assert sum(attempts.requests.values()) > sum(over.counters.requests.values())


async def test_a_failed_listing_counts_as_an_error(tmp_path: Path) -> None:
    counters = CloudCounters()
    store = Metered(FaultyStore(FolderStore(tmp_path), rate=1.0), counters)
    with pytest.raises(TransientCloudError):
        [n async for n in store.list()]
    assert counters.requests == {"list": 1}
    assert counters.errors == {("list", "TransientCloudError"): 1} and counters.retried == 1
