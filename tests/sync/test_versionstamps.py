"""Two devices append to one versionstamped log while offline, then sync (in process,
through a folder bucket): nothing is lost, keys are distinct, each device's order is
kept, and the merged log interleaves by time."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from ledgerd.store import Page, Repository
from ledgerd.store.keys import tuple as fdbtuple
from ledgerd.store.keys.subspace import Subspace
from ledgerd.store.keys.tuple import Versionstamp
from ledgerd.store.page.stamps import device_tag
from ledgerd.store.tree import commit
from ledgerd.sync.engine import SyncEngine
from ledgerd.sync.folder import FolderStore

LOG = Subspace(("log",))


async def _log(page: Page) -> list[tuple[bytes, bytes]]:
    res = await page.entries(prefix=LOG.key(), limit=10_000)
    assert res.token is None
    return [(kv.key, kv.value) for kv in res.items]


async def _append(page: Page, entry: str, user_version: int = 0) -> bytes:
    template = LOG.pack_with_versionstamp((Versionstamp.incomplete(user_version),))
    return await page.set_versionstamped_key(template, fdbtuple.pack((entry,)))


async def test_offline_appends_merge_into_one_log_in_time_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = FolderStore(tmp_path / "bucket")
    engines = [SyncEngine(bucket) for _ in range(2)]
    repos = [
        await Repository.open(tmp_path / n, hooks=e.hooks())
        for n, e in zip("ab", engines, strict=True)
    ]
    try:
        for e, r in zip(engines, repos, strict=True):
            await e.start(r, background=False)
        a, b = [await r.ledger("l").page("p") for r in repos]
        written: list[str] = []  # every entry, in the order it was acknowledged

        # Offline: the devices take turns, with plain writes (alone and concurrent,
        # sharing group commits) and transactions (one stamp, user versions).
        for rnd in range(6):
            for name, page in (("a", a), ("b", b)):
                entry = f"{name}{rnd}-plain"
                await _append(page, entry)
                written.append(entry)
                batch = [f"{name}{rnd}-c{i}" for i in range(3)]
                await asyncio.gather(*(_append(page, e) for e in batch))
                written += batch
                async with page.transaction() as txn:
                    for u in (0, 1):
                        await txn.set_versionstamped_key(
                            LOG.pack_with_versionstamp((Versionstamp.incomplete(u),)),
                            fdbtuple.pack((f"{name}{rnd}-t{u}",)),
                        )
                written += [f"{name}{rnd}-t0", f"{name}{rnd}-t1"]
                if rnd % 2:
                    await page.flush()  # several commits, not one journal

        offline = {"a": await _log(a), "b": await _log(b)}
        for _ in range(2):
            for e in engines:
                await e.sync()
        log_a, log_b = await _log(a), await _log(b)
        assert log_a == log_b, "the devices did not converge"
        entries = [fdbtuple.unpack(v)[0] for _, v in log_a]
        # Nothing lost, nothing doubled: every key distinct.
        assert sorted(entries) == sorted(written)
        assert len({k for k, _ in log_a}) == len(written)
        # Each device's own order is kept, and is what it saw offline.
        for name in ("a", "b"):
            mine = [kv for kv in log_a if fdbtuple.unpack(kv[1])[0].startswith(name)]
            assert mine == offline[name]
        # The merged log interleaves by time: it is the order the writes were made in.
        assert entries == written
        tags = {LOG.unpack(k)[0].tr_version[8:] for k, _ in log_a}
        assert tags == {device_tag(r.device_id) for r in repos}

        # A device whose clock is an hour slow still appends after what it has seen.
        real = commit.now_us
        monkeypatch.setattr(commit, "now_us", lambda: real() - 3_600_000_000)
        late = await _append(b, "b-slow")
        assert late > log_a[-1][0]
        monkeypatch.setattr(commit, "now_us", real)
        await _append(a, "a-after")
        for _ in range(2):
            for e in engines:
                await e.sync()
        tail = [fdbtuple.unpack(v)[0] for _, v in (await _log(a))[-2:]]
        assert tail == ["b-slow", "a-after"]
        assert await _log(a) == await _log(b)
    finally:
        for r in repos:
            await r.close()
