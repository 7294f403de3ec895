"""Property: devices editing concurrently converge, whatever the order of exchanges."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledgerd.store import Repository
from ledgerd.sync import crypto
from ledgerd.sync.engine import SyncEngine
from ledgerd.sync.folder import FolderStore

DEVICES = 3
KEY = crypto.new_key()
keys = st.sampled_from([b"a", b"b", b"c", b"d", b"e"])
op = st.one_of(
    st.tuples(st.just("put"), keys, st.binary(max_size=6)),
    st.tuples(st.just("delete"), keys, st.just(b"")),
    st.tuples(st.just("clear"), st.just(b""), st.just(b"")),
    st.tuples(st.just("txn"), keys, st.binary(max_size=6)),
)
step = st.one_of(
    st.tuples(st.just("op"), st.integers(0, DEVICES - 1), op),
    st.tuples(st.just("sync"), st.integers(0, DEVICES - 1), st.none()),
)


@pytest.mark.parametrize("encrypted", [False, True], ids=["plain", "encrypted"])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(step, min_size=1, max_size=30))
async def test_devices_converge_without_merge_storms(encrypted: bool, steps) -> None:
    with tempfile.TemporaryDirectory() as d:
        base = Path(d)
        bucket = FolderStore(base / "bucket")
        ring = crypto.parse_key_file(crypto.key_line(KEY), "test keys") if encrypted else None
        engines = [SyncEngine(bucket, keys=ring) for _ in range(DEVICES)]
        repos = [
            await Repository.open(base / f"dev{i}", hooks=e.hooks()) for i, e in enumerate(engines)
        ]
        for e, r in zip(engines, repos, strict=True):
            await e.start(r, background=False)
        pages = [await r.ledger("l").page("p") for r in repos]
        syncs = txns = 0
        try:
            for kind, dev, arg in steps:
                page = pages[dev]
                if kind == "sync":  # an exchange, in whatever order the steps say
                    await engines[dev].sync()
                    syncs += 1
                    continue
                what, key, value = arg
                if what == "put":
                    await page.put(key, value)
                elif what == "delete":
                    await page.delete(key)
                elif what == "clear":
                    await page.clear()
                else:
                    txns += 1
                    async with page.transaction() as txn:
                        await txn.put(key, value)
                        await txn.delete(b"e")
            # Final exchange: everyone uploads, then everyone downloads.
            for _ in range(2):
                for e in engines:
                    await e.sync()
                    syncs += 1
            roots = {p.head.root for p in pages}
            assert len(roots) == 1, "devices did not converge"
            # No storms: a device's history holds its own writes and one commit per
            # import that brought something; every device makes each change once.
            for p in pages:
                commits = len(await p.history(100_000))
                assert commits <= 1 + len(steps) + syncs, (commits, len(steps), syncs)
            # Quiet: another exchange changes nothing.
            before = [p.head.id for p in pages]
            for e in engines:
                await e.sync()
            assert [p.head.id for p in pages] == before
        finally:
            for r in repos:
                await r.close()
