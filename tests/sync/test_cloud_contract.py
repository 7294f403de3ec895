"""The CloudStore contract, run against every backend (folder, moto, moto's HTTP server)."""

from __future__ import annotations

import pytest

from ledgerd.sync.cloud import CloudStore
from ledgerd.sync.errors import (
    AlreadyExistsError,
    CloudNotFoundError,
    InvalidNameError,
    RangeNotInObjectError,
)


async def _names(store: CloudStore, prefix: str = "", after: str = "") -> list[str]:
    return [n async for n in store.list(prefix, after)]


async def test_put_get_round_trip(store: CloudStore) -> None:
    data = bytes(range(256)) * 1000
    await store.put("a/b/object-1", data)
    await store.put("empty", b"")
    assert await store.get("a/b/object-1") == data
    assert await store.get("empty") == b""


async def test_ranged_get(store: CloudStore) -> None:
    data = bytes(range(256)) * 100
    await store.put("r", data)
    assert await store.get("r", 10, 20) == data[10:30]
    assert await store.get("r", 25000) == data[25000:]
    assert await store.get("r", len(data) - 5, 100) == data[-5:]
    assert await store.get("r", 3, 0) == b""


async def test_objects_are_written_once(store: CloudStore) -> None:
    await store.put("once", b"first")
    with pytest.raises(AlreadyExistsError):
        await store.put("once", b"second")
    assert await store.get("once") == b"first"


async def test_missing_object(store: CloudStore) -> None:
    with pytest.raises(CloudNotFoundError):
        await store.get("nope/nothing")


async def test_list_is_ordered_and_filtered(store: CloudStore) -> None:
    names = [f"log/dev{d}/{i:08d}" for d in (2, 1) for i in range(5)] + ["other/x", "log2"]
    for n in names:
        await store.put(n, n.encode())
    assert await _names(store, "log/") == sorted(n for n in names if n.startswith("log/"))
    assert await _names(store, "log/dev1/", after="log/dev1/00000002") == [
        "log/dev1/00000003",
        "log/dev1/00000004",
    ]
    assert await _names(store) == sorted(names)
    assert await _names(store, "nothing/") == []


async def test_delete(store: CloudStore) -> None:
    await store.put("d", b"x")
    await store.delete("d")
    await store.delete("d")  # absent: no error
    assert await _names(store) == []
    with pytest.raises(CloudNotFoundError):
        await store.get("d")


@pytest.mark.parametrize(
    "bad", ["", "/abs", "a//b", "../up", "a/./b", "sp ace", "a/b/", "x" * 1100]
)
async def test_names_are_validated(store: CloudStore, bad: str) -> None:
    with pytest.raises(InvalidNameError):
        await store.put(bad, b"x")
    with pytest.raises(InvalidNameError):
        await store.get(bad)


async def test_a_range_past_the_end_is_an_error(store: CloudStore) -> None:
    await store.put("short", b"12345")
    await store.put("empty", b"")
    for name, offset in (("short", 5), ("short", 100), ("empty", 0)):
        with pytest.raises(RangeNotInObjectError):
            await store.get(name, offset, 10)
