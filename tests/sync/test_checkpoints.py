"""Checkpoints: a new device reads a page's state, not its history; a page joins one
whenever it needs what only a checkpoint holds."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from ledgerd.store import Page, PageUnavailableError, Priority
from ledgerd.store.page import exchange as ex
from ledgerd.store.page.check import check_page
from ledgerd.sync import layout
from ledgerd.sync.folder import FolderStore
from ledgerd.sync.layout import CheckpointName
from tests.sync.test_engine import _keys, device
from tests.sync.test_engine import encryption as encryption  # the fixture


@pytest.fixture(autouse=True)
def _plain_and_encrypted(encryption: object) -> None:
    """Every checkpoint test runs on a plain and on an encrypted bucket."""


def _checkpoints(root: Path) -> list[CheckpointName]:
    out = []
    for f in sorted((root / "checkpoints").rglob("*")):
        if f.is_file():
            cn = CheckpointName.parse(str(f.relative_to(root)))
            assert cn is not None
            out.append(cn)
    return out


async def _load(pg: object, rng: random.Random, txns: int, per: int) -> dict[bytes, bytes]:
    """``txns`` transactions of ``per`` keys each, new values of the same ``per`` keys
    every time (so that history outgrows the page); returns what the page holds."""
    live: dict[bytes, bytes] = {}
    for _ in range(txns):
        batch = {b"key%06d" % i: rng.randbytes(100) for i in range(per)}
        await pg.write(batch.items())  # type: ignore[attr-defined]
        live.update(batch)
    return live


async def _live_bytes(page: object) -> int:
    """The page's state as stored: its entries (with the values they carry inline) and
    its EAGER values' pieces, what any device must download."""
    st = await ex.state(page)  # type: ignore[arg-type]
    assert st is not None
    pieces = sum((await ex.piece_sizes(page, st.eager)).values())  # type: ignore[arg-type]
    return pieces + sum(64 + len(e[1]) for e in st.entries)


async def test_a_new_device_downloads_the_page_not_its_history(
    tmp_path: Path, bucket: FolderStore, encryption: object
) -> None:
    rng = random.Random(7)
    live: dict[bytes, bytes] = {}
    async with device(tmp_path / "a", bucket, checkpoint_interval=0) as a:
        pa = await a.repo.ledger("l").page("p")
        for _ in range(20):  # one upload round per transaction: history piles up
            live.update(await _load(pa, rng, 1, 1000))
            await a.engine.sync()
        assert a.engine.checkpoints.written >= 1
        history = sum(f.stat().st_size for f in (tmp_path / "bucket" / "packs").iterdir())
        live_bytes = await _live_bytes(pa)
    assert sum(len(k) + len(v) for k, v in live.items()) <= live_bytes
    if encryption is not None:  # nothing readable in packs or checkpoints
        sample = list(live.items())[:20]
        for f in (tmp_path / "bucket").rglob("*"):
            if f.is_file():
                data = f.read_bytes()
                assert not any(k in data or v in data for k, v in sample), f
                assert b"ledgerd-page" not in data
    assert history > live_bytes  # what a new device read before checkpoints
    assert _checkpoints(tmp_path / "bucket")

    async with device(tmp_path / "b", bucket) as b:
        await b.engine.sync()
        assert b.cloud.bytes_got <= 1.5 * live_bytes + 64 * 1024, (b.cloud.bytes_got, live_bytes)
        assert await _keys(b.repo) == live
        pb = await b.repo.ledger("l").page("p")
        assert b.engine.checkpoints.covers
        assert (await check_page(pb)).healthy
        # The new device writes, and the first device reads it.
        await pb.put(b"from b", b"1")
        await b.engine.sync()
    async with (
        device(tmp_path / "a", bucket, checkpoint_interval=0) as a,
        device(tmp_path / "b", bucket) as b,
    ):
        await a.engine.sync()
        assert (await _keys(a.repo))[b"from b"] == b"1"
        # Packs above the cover cost what they cost before checkpoints: one GET.
        pa = await a.repo.ledger("l").page("p")
        await pa.put(b"later", b"2")
        await a.engine.sync()
        b.cloud.reset()
        await b.engine.sync()
        pack_gets = [g for g in b.cloud.gets if g[0].startswith("packs/")]
        assert len(pack_gets) == 1, b.cloud.gets


async def test_a_write_made_before_a_checkpoint_it_never_saw_reaches_a_new_device(
    tmp_path: Path, bucket: FolderStore
) -> None:
    """C writes concurrently with A's history, without seeing A's latest writes; a new
    device that started from A's checkpoint takes C's write as it comes, and ends where
    the others do."""
    rng = random.Random(8)
    async with (
        device(tmp_path / "a", bucket, checkpoint_interval=0) as a,
        device(tmp_path / "c", bucket) as c,
    ):
        pa = await a.repo.ledger("l").page("p")
        await pa.put(b"start", b"0")
        await a.engine.sync()
        await c.engine.sync()
        pc = await c.repo.ledger("l").page("p")
        await pc.put(b"from c", b"offline")  # C does not sync until A's checkpoint is up
        for _ in range(6):
            await _load(pa, rng, 1, 500)
            await a.engine.sync()
        assert a.engine.checkpoints.written >= 1
        async with device(tmp_path / "b", bucket) as b:
            await b.engine.sync()  # starts from A's checkpoint
            assert b.engine.checkpoints.covers
            await c.engine.sync()  # C's write goes up
            await a.engine.sync()
            await b.engine.sync()
            await b.engine.sync()
            assert not b.engine.problems()
            want = await _keys(a.repo)
            assert want[b"from c"] == b"offline"
            assert await _keys(b.repo) == want
            assert (await check_page(await b.repo.ledger("l").page("p"))).healthy


async def test_lazy_values_come_with_the_checkpoint(tmp_path: Path, bucket: FolderStore) -> None:
    rng = random.Random(9)
    big = rng.randbytes(2_000_000)
    async with device(tmp_path / "a", bucket, checkpoint_interval=0) as a:
        pa = await a.repo.ledger("l").page("p")
        await pa.put(b"lazy", big, Priority.LAZY)
        for _ in range(4):
            await _load(pa, rng, 1, 800)
            await a.engine.sync()
        assert a.engine.checkpoints.written >= 1
    async with device(tmp_path / "b", bucket) as b:
        await b.engine.sync()
        assert b.cloud.bytes_got < len(big) / 2  # LAZY: not fetched with the page
        b.cloud.reset()
        pb = await b.repo.ledger("l").page("p")
        assert await pb.get(b"lazy") == big
        assert b.cloud.bytes_got >= len(big)
        assert all(n.startswith(layout.CHECKPOINTS) for n, _, _ in b.cloud.gets)


def test_checkpoint_names_parse_strictly() -> None:
    tag = layout.page_tag(b"l", b"p")
    cn = CheckpointName.make(tag, 1234, "0" * 32, 20, 30)
    assert CheckpointName.parse(cn.name) == cn
    for bad in [
        cn.name.replace(tag, tag[:-1]),
        cn.name + ".1",
        cn.name.replace("0000000001234", "1234"),
        "checkpoints/" + tag,
        cn.name.replace(".20.30", ".30.20"),
    ]:
        assert CheckpointName.parse(bad) is None
    assert layout.page_tag(b"l", b"p") != layout.page_tag(b"lp", b"")


async def test_an_evicted_page_comes_back_from_its_checkpoint(
    tmp_path: Path, bucket: FolderStore, encryption: object
) -> None:
    """Eviction's restore (PageHooks.restorer): the page's checkpoint and the packs
    above its cover, no more; without the bucket, the use is ``unavailable``."""
    rng = random.Random(12)
    async with (
        device(tmp_path / "a", bucket, checkpoint_interval=0) as a,
        device(tmp_path / "b", bucket) as b,
    ):
        pa = await a.repo.ledger("l").page("p")
        for _ in range(12):
            await _load(pa, rng, 1, 1000)
            await a.engine.sync()
        await b.engine.sync()
        pb = await b.repo.ledger("l").page("p")
        await pb.put(b"after the checkpoint", b"from b")
        await b.engine.sync()
        await a.engine.sync()
        want = await _keys(a.repo)
        live = await _live_bytes(pa)
        assert await a.repo.evict(b"l", b"p") > 0
        assert a.repo.is_evicted(b"l", b"p")
        a.cloud.reset()
        assert await _keys(a.repo) == want  # the next use restores it
        assert a.cloud.bytes_got <= 1.5 * live + 64 * 1024, (a.cloud.bytes_got, live)
        assert not a.engine.problems()

        assert await a.repo.evict(b"l", b"p") > 0
        (tmp_path / "bucket").rename(tmp_path / "away")
        with pytest.raises(PageUnavailableError):
            await a.repo.ledger("l").page("p")


async def test_hundreds_of_pages_under_a_disk_budget(tmp_path: Path, bucket: FolderStore) -> None:
    """The budget holds once the least recently used pages are evicted, and evicted
    pages come back on use, whole."""
    from ledgerd.store.repo import eviction

    rng = random.Random(13)
    # 300 pages, not the 1,000 this test began with: 300 still fail the budget under
    # the eviction it was written for (three passes, the usage WAL not folded back:
    # 8.1 MB left over a budget of 7.4 MB, checked by putting that code back), and
    # take a third of the time.
    values = {f"p{i:04d}": rng.randbytes(2000) for i in range(300)}
    async with device(tmp_path / "a", bucket) as a:
        for name, v in values.items():
            async with a.repo.page(b"l", name.encode()) as pg:
                await pg.put(b"k", v)
        await a.engine.sync()
        await a.repo.close_idle(0)  # evictable pages are closed ones
        before = eviction.directory_bytes(a.repo.root)
        budget = before // 3
        evicted = await a.repo.evict_by_policy(disk_budget=budget)
        assert evicted > len(values) // 2
        assert eviction.directory_bytes(a.repo.root) <= budget
        for name in rng.sample(sorted(values), 25):
            pg = await a.repo.ledger("l").page(name)
            assert await pg.get(b"k") == values[name]
        assert not a.engine.problems()


async def test_a_checkpoint_needs_no_history(tmp_path: Path, bucket: FolderStore) -> None:
    """With history retention at zero and a collection after every write, a device still
    writes checkpoints (a state is the head's entries, nothing older), and a new device
    starts from one."""
    from ledgerd.store.page import gc

    rng = random.Random(3)
    async with device(tmp_path / "a", bucket) as a, device(tmp_path / "b", bucket) as b:
        pa = await a.repo.ledger("l").page("p")
        await _load(pa, rng, 1, 1000)  # a tree of several levels
        await a.engine.sync()
        await b.engine.sync()
        pb = await b.repo.ledger("l").page("p")
        await pb.put(b"on b", b"1")
        await b.engine.sync()
        assert (await gc.collect(pb, 0)).commits_pruned >= 1
    async with device(tmp_path / "b", bucket) as b:  # no tree node cached
        await b.engine.sync()
        assert await b.engine.policy.write_for_compaction((b"l", b"p"))
        want = await _keys(b.repo)
    async with device(tmp_path / "c", bucket) as c:  # a new device starts from it
        await c.engine.sync()
        assert await _keys(c.repo) == want
        assert not c.engine.problems()


@pytest.mark.parametrize("later", [b"Y", None])
async def test_writes_older_than_a_checkpoint_never_undo_what_it_holds(
    tmp_path: Path, bucket: FolderStore, later: bytes | None
) -> None:
    """A uploads k = X, x1 and x2 in three packs; B imports them, sets k = Y (or deletes
    k) and then z, and checkpoints. A uploads n after seeing B's k. C starts from the
    checkpoint and also reads every pack: A's old write of k (which the checkpoint has
    seen) never brings X back (with commit graphs, it merged over the empty page and
    came back everywhere)."""
    async with device(tmp_path / "a", bucket) as a, device(tmp_path / "b", bucket) as b:
        pa = await a.repo.ledger("l").page("p")
        pb = await b.repo.ledger("l").page("p")
        for k, v in ((b"k", b"X"), (b"x1", b"1"), (b"x2", b"2")):
            await pa.put(k, v)
            await a.engine.round(download=False)
        await b.engine.sync()
        if later is None:
            await pb.delete(b"k")
        else:
            await pb.put(b"k", later)
        await pb.flush()
        await b.engine.round(download=False)
        await a.engine.sync()  # A's head is P
        await pb.put(b"z", b"Z")
        await b.engine.round(download=False)
        assert await b.engine.policy.write_for_compaction((pb.ledger, pb.id))
        await pa.put(b"n", b"N, on P")
        await a.engine.round(download=False)
        want = {b"x1": b"1", b"x2": b"2", b"z": b"Z", b"n": b"N, on P"}
        if later is not None:
            want[b"k"] = later
        async with device(tmp_path / "c", bucket) as c:
            await c.engine.sync()
            assert await _keys(c.repo) == want
            for d in (a, b, c, a, b):
                await d.engine.sync()
            for d in (a, b, c):
                assert await _keys(d.repo) == want


async def test_a_restore_without_every_own_write_leaves_the_page_evicted(
    tmp_path: Path, bucket: FolderStore
) -> None:
    """A restore must bring back every write this device made to the page: the next
    local write would claim them all seen, and one missing then (a pack of its own not
    readable now) would never be imported. Short of them, the use is ``unavailable``
    and the page stays evicted; once the pack is back, the next use restores it whole."""
    async with device(tmp_path / "a", bucket) as a:
        pa = await a.repo.ledger("l").page("p")
        await pa.put(b"first", b"1")
        await a.engine.sync()
        await pa.put(b"second", b"2")
        await a.engine.sync()
        want = await _keys(a.repo)
        assert await a.repo.evict(b"l", b"p") > 0
        newest = max((tmp_path / "bucket" / "packs").iterdir())
        aside = tmp_path / "aside"
        newest.rename(aside)
        with pytest.raises(PageUnavailableError, match="own writes"):
            await a.repo.ledger("l").page("p")
        assert a.repo.is_evicted(b"l", b"p")
        aside.rename(newest)
        assert await _keys(a.repo) == want


async def test_a_checkpoint_never_holds_a_write_not_uploaded(
    tmp_path: Path, bucket: FolderStore
) -> None:
    """A checkpoint holds only writes that some pack holds: a device that joined a state
    with writes of another's not uploaded yet could make packs that wait for each other's
    writes for good (tests/store/test_join.py::test_states_joined_both_ways_before_any_upload).
    One asked for while a write waits for its upload is not written; the write's upload
    round writes it."""
    async with device(tmp_path / "a", bucket, checkpoint_interval=0) as a:
        pa = await a.repo.ledger("l").page("p")
        await pa.put(b"k", b"1")
        await a.engine.sync()
        await pa.put(b"k", b"2")  # not uploaded
        assert not await a.engine.policy.write_for_compaction((b"l", b"p"))
        assert a.engine.checkpoints.unuploaded == 1
        await a.engine.sync()  # uploads k=2
        assert await a.engine.policy.write_for_compaction((b"l", b"p"))
    async with device(tmp_path / "b", bucket) as b:
        await b.engine.sync()
        assert await _keys(b.repo) == {b"k": b"2"}
        assert not b.engine.problems()


async def test_the_round_after_a_write_writes_the_checkpoint_it_missed(
    tmp_path: Path, bucket: FolderStore
) -> None:
    """A write that lands between a page's upload and its checkpoint defers the
    checkpoint to the next upload, not to a checkpoint interval later."""
    async with device(tmp_path / "a", bucket, checkpoint_interval=3600) as a:
        pa = await a.repo.ledger("l").page("p")
        rng = random.Random(5)
        upload = a.engine.checkpoints.write
        late: list[bool] = []

        async def write_after_a_late_write(page: Page, *args: Any, **kw: Any) -> str | None:
            if not a.engine.checkpoints.unuploaded:  # its state sees one more write
                late.append(True)
                await pa.put(b"late", b"%d" % len(late))
            return await upload(page, *args, **kw)

        a.engine.checkpoints.write = write_after_a_late_write  # type: ignore[method-assign]
        while not a.engine.checkpoints.unuploaded:  # history piles up until one is due
            await _load(pa, rng, 1, 1000)
            await a.engine.sync()
        # The same sync's next round uploaded the late write, then wrote the checkpoint.
        assert a.engine.checkpoints.unuploaded == 1 and a.engine.checkpoints.written == 1
        want = await _keys(a.repo)
    async with device(tmp_path / "b", bucket) as b:
        await b.engine.sync()
        assert b.engine.checkpoints.joined and await _keys(b.repo) == want
