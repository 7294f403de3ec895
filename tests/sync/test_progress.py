"""A device log's gaps and saves: what a device full of holes costs."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledgerd.sync.feed import Feed
from ledgerd.sync.folder import FolderStore
from ledgerd.sync.layout import PackName
from ledgerd.sync.progress import RETRY, DeviceLog, Gap, Held
from tests.sync.doubles import mark_plain
from tests.sync.test_engine import _keys, device


def _fill_by_scan(gaps: list[Gap], seq: int, feed_time: int) -> list[Gap]:
    """What ``DeviceLog.fill`` did with a scan of every gap (the reference)."""
    out: list[Gap] = []
    for g in gaps:
        if g.first <= seq <= g.last:
            if g.first < seq:
                out.append(Gap(g.first, seq - 1, g.since, g.after, feed_time or g.until))
            if seq < g.last:
                out.append(Gap(seq + 1, g.last, g.since, max(g.after, feed_time), g.until))
        else:
            out.append(g)
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 60), st.integers(0, 1000)), max_size=80))
def test_gaps_found_by_search_are_the_gaps_a_scan_finds(seen: list[tuple[int, int]]) -> None:
    """Packs listed in any order: the gaps (and their feed-time bounds) are what a scan
    of every gap made of them, and a sequence is in a gap exactly when it was skipped
    and not seen since. The log also survives encoding."""
    dl = DeviceLog("d")
    ref: list[Gap] = []
    listed: set[int] = set()
    for seq, t in seen:
        if seq > dl.max_seq + 1:
            ref.append(Gap(dl.max_seq + 1, seq - 1, 0.0, dl.max_time, t))
        ref = _fill_by_scan(ref, seq, t)
        dl.saw(seq, t)
        for g in dl.gaps:
            g.since = 0.0  # (the wall time it was made)
        listed.add(seq)
        assert dl.gaps == ref
        for s in range(1, dl.max_seq + 2):
            assert dl.in_gap(s) == (s <= dl.max_seq and s not in listed), s
    again = DeviceLog.decode("d", dl.encode())
    assert again.gaps == dl.gaps and again.max_seq == dl.max_seq


async def test_many_refused_packs_save_the_device_log_a_few_times_not_once_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A device names 300 packs at every other sequence, each of them unreadable:
    300 gaps, and 300 refused packs held in its log. b refuses them all and still
    takes a's page, saving that log a few times in the download (every second at
    most), where it saved the whole log after each pack (quadratic in the packs)."""
    (tmp_path / "bucket").mkdir()
    bucket = FolderStore(tmp_path / "bucket")
    liar, now = os.urandom(16).hex(), int(time.time() * 1000)
    names = [PackName.make(now + i, liar, 2 * i + 2, 12, 12).name for i in range(300)]
    await mark_plain(bucket)
    for name in names:
        await bucket.put(name, b"x" * 12)
    saves: list[str] = []
    real_save = Feed.save_log

    async def counted(self: Feed, dl: DeviceLog) -> Any:
        saves.append(dl.device)
        return await real_save(self, dl)

    monkeypatch.setattr(Feed, "save_log", counted)
    async with device(tmp_path / "a", bucket) as a:
        pa = await a.repo.ledger("l").page("p")
        await pa.put(b"k", b"v")
        await pa.flush()
        await a.engine.sync()
        async with device(tmp_path / "b", bucket, retry_first=3600) as b:
            saves.clear()
            await b.engine.sync()
            assert await _keys(b.repo) == {b"k": b"v"}
            packs = b.engine.status()["packs"]
            assert sorted(p["pack"] for p in packs if p["state"] == "refused") == sorted(names)
            assert len(b.engine.feed.logs[liar].gaps) == 300
            assert saves.count(liar) < 30, len(saves)


async def test_a_device_full_of_old_gaps_is_probed_with_one_listing(tmp_path: Path) -> None:
    """A device that left a gap at every other sequence an hour ago: a forced probe
    lists their stretch of the feed once (a page of names or two), not once per gap,
    and finds a pack that appeared in one of them."""
    (tmp_path / "bucket").mkdir()
    bucket = FolderStore(tmp_path / "bucket")
    liar, then = os.urandom(16).hex(), int(time.time() * 1000) - 3_600_000
    await mark_plain(bucket)
    for i in range(200):
        await bucket.put(PackName.make(then + 10 * i, liar, 2 * i + 2, 12, 12).name, b"x" * 12)
    now = PackName.make(int(time.time() * 1000), os.urandom(16).hex(), 1, 12, 12).name
    await bucket.put(now, b"x" * 12)  # the feed has moved on: the gaps are old
    async with device(tmp_path / "b", bucket, retry_first=3600) as b:
        await b.engine.sync()
        assert len(b.engine.feed.logs[liar].gaps) == 200
        late = PackName.make(then + 10 * 50 + 5, liar, 101, 12, 12).name  # a slow PUT
        await bucket.put(late, b"x" * 12)
        b.cloud.reset()
        await b.engine.sync()
        assert b.cloud.counts["list"] <= 3, b.cloud.counts
        assert len(b.engine.feed.logs[liar].gaps) == 199
        assert late in {p["pack"] for p in b.engine.status()["packs"]}


def test_a_pack_held_whole_and_for_one_page_saves() -> None:
    """A listed pack not imported yet is held whole; the same pack can be held for one
    page too (a page that reads its whole history again, or one refused or deferred on
    its own). The log's encoding sorts the held packs and must not compare that page's
    key with the whole pack's none: the save raised TypeError, so every sync round
    failed from then on."""
    device = "ab" * 16
    pn = PackName.parse(f"packs/{1_700_000_000_000:013d}.{device}.{7:016d}.100.200")
    assert pn is not None
    dl = DeviceLog(device)
    for key in (None, (b"l", b"p"), (b"l", b"q")):
        h = Held(pn, key, RETRY, "")
        dl.held[h.id] = h
    again = DeviceLog.decode(device, dl.encode())
    assert sorted(again.held) == sorted(dl.held)
