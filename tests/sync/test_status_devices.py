"""What sync tells of the devices sharing a bucket and of every page without opening it:
each device's newest pack and clock (from what rounds learned, no request of its own),
each page's state and last sync time, kept across restarts."""

from __future__ import annotations

import time
from pathlib import Path

from ledgerd.sync.folder import FolderStore
from tests.sync.test_engine import device


async def test_every_device_has_its_newest_pack_and_a_clock_figure(
    tmp_path: Path, bucket: FolderStore
) -> None:
    # b's clock is 100 s behind a's: b sees a's writes stamped that far ahead.
    def late() -> float:
        return time.time() - 100

    async with (
        device(tmp_path / "a", bucket) as a,
        device(tmp_path / "b", bucket, clock=late) as b,
    ):
        assert [d["this_device"] for d in b.engine.devices()] == [True]  # nothing listed yet
        pa = await a.repo.ledger("l").page("p")
        await pa.put(b"k", b"v")
        await pa.flush()
        await a.engine.sync()
        await b.engine.sync()
        own, other = b.engine.devices()
        assert own["this_device"] and own["device"] == b.engine.device
        assert other["device"] == a.engine.device and not other["this_device"]
        assert other["last_seq"] == 1
        # The pack's feed time: a's clock when it named it.
        assert abs(other["last_pack_at"] - time.time()) < 30, other
        assert 90 < other["clock_ahead_s"] < 101, other
        assert other["error"] is None
        # a has imported nothing of b (b wrote nothing): its clock is unknown there.
        pb = await b.repo.ledger("l").page("q")
        await pb.put(b"k", b"v")
        await pb.flush()
        await b.engine.sync()
        await a.engine.sync()
        (other_a,) = [d for d in a.engine.devices() if not d["this_device"]]
        assert other_a["device"] == b.engine.device
        # b's writes carry its own commit clock (the repository's, not skewed): a sees
        # them at most the transfer behind.
        assert -30 < other_a["clock_ahead_s"] < 2, other_a
        # Status asks the bucket nothing of its own.
        snapshot = b.engine.store.snapshot()
        b.engine.devices()
        b.engine.status()
        assert not any(b.engine.store.since(snapshot).values())


async def test_a_page_s_last_sync_time_outlives_a_restart(
    tmp_path: Path, bucket: FolderStore
) -> None:
    async with device(tmp_path / "a", bucket) as a:
        pa = await a.repo.ledger("l").page("p")
        await pa.put(b"k", b"v")
        await pa.flush()
        await a.engine.sync()
        key = (b"l", b"p")
        (state,) = a.engine.page_states([key])
        assert state["sync"] == "synced" and state["last_sync"], state
        synced_at = state["last_sync"]
        await pa.put(b"k2", b"v")
        await pa.flush()
        (state,) = a.engine.page_states([key])
        assert state["sync"] == "pending" and state["last_sync"] == synced_at, state
        await a.engine.sync()
        (state,) = a.engine.page_states([key])
        synced_at = state["last_sync"]
    async with device(tmp_path / "a", bucket) as a:
        # Used lately, the page is a candidate of the first round, which looks at it.
        (state,) = a.engine.page_states([key])
        assert state == {
            "sync": "pending",
            "last_sync": synced_at,
            "last_error": None,
            "conflicts": 0,
            "conflict": None,
        }
        await a.engine.sync()
        (state,) = a.engine.page_states([key])
        assert state["sync"] == "synced" and state["last_sync"] == synced_at, state
        # _local pages are never uploaded (and not pending, even if used since the save).
        loc = await a.repo.ledger("_local").page("cfg")
        await loc.put(b"k", b"v")
        await loc.flush()
        await a.engine.sync()
    async with device(tmp_path / "a", bucket) as a:
        (state,) = a.engine.page_states([(b"_local", b"cfg")])
        assert state["sync"] == "local", state
        await a.engine.sync()
        assert a.engine.status()["pending_uploads"] == 0
        assert a.engine.health()["synced"], a.engine.health()
