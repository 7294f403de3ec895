"""A device back after longer than the compaction grace starts its pages again from
the checkpoints: nothing it acknowledged is lost, on it or on the others."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ledgerd.store import DocumentStore
from ledgerd.store.page import exchange as ex
from ledgerd.sync.folder import FolderStore
from tests.sync.test_compaction import Clock
from tests.sync.test_engine import _keys, device

GRACE = 3600.0


@pytest.mark.parametrize("b_writes", [False, True])
async def test_a_rejoin_keeps_uploaded_unuploaded_and_concurrent_writes(
    tmp_path: Path, bucket: FolderStore, b_writes: bool
) -> None:
    """A's checkpoint is older than A's last uploaded pack; A then writes offline (not
    uploaded), B writes meanwhile, and A comes back after the grace: after the rejoin
    both devices hold every acknowledged write, also those made while it ran."""
    clock = Clock()
    kw: dict[str, Any] = {"clock": clock, "checkpoint_interval": 0, "compaction_grace": GRACE}
    want: dict[bytes, bytes] = {}
    async with device(tmp_path / "b", bucket, **kw) as b:
        pb = await b.repo.ledger("l").page("p")
        async with device(tmp_path / "a", bucket, **kw) as a:
            pa = await a.repo.ledger("l").page("p")
            for i in range(5):
                await pa.put(b"k%d" % i, b"old")
            await a.engine.sync()
            await b.engine.sync()
            # B's checkpoint: its head is a commit A has not imported.
            await pb.put(b"bk", b"b before its checkpoint")
            await b.engine.sync()
            assert await b.engine.policy.write_for_compaction((pb.ledger, pb.id))
            # Uploaded by A (which has not read B's pack): not in the checkpoint.
            await pa.put(b"k0", b"uploaded after the checkpoint")
            await pa.delete(b"k1")
            await pa.put(b"up", b"uploaded after the checkpoint")
            await a.engine.round(download=False)
            assert not await ex.has_unuploaded(pa)
            clock.now += 10
            # Not uploaded when A stops.
            await pa.put(b"k2", b"offline on a")
            await pa.put(b"offline", b"offline on a")
        clock.now += 10
        if b_writes:
            await pb.put(b"k3", b"b while a is away")
            await pb.put(b"b", b"b while a is away")
        for _ in range(5):  # B stays present
            await b.engine.sync()
            clock.now += GRACE / 4
        async with device(tmp_path / "a", bucket, **kw) as a:
            pa = await a.repo.ledger("l").page("p")
            take = a.engine.checkpoints.take

            async def writing_take(page: Any, cp: Any, **kw: Any) -> None:
                await pa.put(b"k4", b"written while a rejoins")
                await pa.put(b"during", b"written while a rejoins")
                await take(page, cp, **kw)

            a.engine.checkpoints.take = writing_take  # type: ignore[method-assign]
            await a.engine.sync()
            a.engine.checkpoints.take = take  # type: ignore[method-assign]
            assert a.engine.checkpoints.covers  # it did take a checkpoint
            mine = {
                b"k0": b"uploaded after the checkpoint",
                b"up": b"uploaded after the checkpoint",
                b"k2": b"offline on a",
                b"offline": b"offline on a",
                b"k4": b"written while a rejoins",
                b"during": b"written while a rejoins",
            }
            got_a = await _keys(a.repo)  # at once, before B reads A's packs again
            assert {k: got_a.get(k) for k in mine} == mine
            assert b"k1" not in got_a
            await pa.put(b"after", b"written after the rejoin")
            await a.engine.sync()
            await b.engine.sync()
            await a.engine.sync()
            want = {
                b"bk": b"b before its checkpoint",
                b"k0": b"uploaded after the checkpoint",
                b"up": b"uploaded after the checkpoint",
                b"k2": b"offline on a",
                b"offline": b"offline on a",
                **({b"k3": b"b while a is away", b"b": b"b while a is away"} if b_writes else {}),
                b"k4": b"written while a rejoins",
                b"during": b"written while a rejoins",
                b"after": b"written after the rejoin",
            }
            got_a = await _keys(a.repo)
            got_b = await _keys(b.repo)
            assert {k: got_a.get(k) for k in want} == want
            assert b"k1" not in got_a
            assert got_a == got_b


async def test_a_rejoin_onto_a_newer_checkpoint_keeps_a_write_over_an_uploaded_one(
    tmp_path: Path, bucket: FolderStore
) -> None:
    """A uploads k = v1 (B has not read it), then writes k = v2 offline; B's checkpoint
    (its head committed after v2, without v1) is what A rejoins onto. The checkpoint's
    old k is no change of B's: A's v2 stays, on both devices (the carry-over took A's
    last uploaded commit for the base, saw the checkpoint "change" k back to the old
    value, and the checkpoint's later commit won)."""
    clock = Clock()
    kw: dict[str, Any] = {"clock": clock, "checkpoint_interval": 0, "compaction_grace": GRACE}
    async with device(tmp_path / "b", bucket, **kw) as b:
        pb = await b.repo.ledger("l").page("p")
        async with device(tmp_path / "a", bucket, **kw) as a:
            pa = await a.repo.ledger("l").page("p")
            await pa.put(b"k", b"old")
            await pa.put(b"gone", b"old")
            await a.engine.sync()
            await b.engine.sync()
            await pa.put(b"k", b"v1 uploaded")
            await pa.delete(b"gone")
            await a.engine.round(download=False)
            assert not await ex.has_unuploaded(pa)
            await pa.put(b"k", b"v2 offline")
            await pa.flush()
        await pb.put(b"bk", b"from b, after v2")
        await b.engine.round(download=False)
        assert await b.engine.policy.write_for_compaction((pb.ledger, pb.id))
        for _ in range(5):  # B stays present (and imports A's v1 meanwhile)
            clock.now += GRACE / 4
            await b.engine.feed.list_new()
        async with device(tmp_path / "a", bucket, **kw) as a:
            pa = await a.repo.ledger("l").page("p")
            await a.engine.sync()
            assert a.engine.checkpoints.covers
            want = {b"k": b"v2 offline", b"bk": b"from b, after v2"}
            assert await _keys(a.repo) == want
            await b.engine.sync()
            await a.engine.sync()
            assert await _keys(a.repo) == want
            assert await _keys(b.repo) == want


@pytest.mark.parametrize("later", [b"Y", None])
async def test_a_rejoin_keeps_another_devices_newer_write_over_the_value_it_held(
    tmp_path: Path, bucket: FolderStore, later: bytes | None
) -> None:
    """A imported B's k = X, then went away; B set k = Y (or deleted k) and
    checkpointed; A wrote another key offline. A holds none of the commits between
    X and the checkpoint's head, so the common ancestors it could find lay below X:
    X read as A's own change, and A's carried commit (later than B's) put X back on
    both devices. The commits A imported from packs the checkpoint's cover includes
    are ancestors of its head: X is the base, and Y (or the deletion) stays."""
    clock = Clock()
    kw: dict[str, Any] = {"clock": clock, "checkpoint_interval": 0, "compaction_grace": GRACE}
    async with device(tmp_path / "b", bucket, **kw) as b:
        pb = await b.repo.ledger("l").page("p")
        async with device(tmp_path / "a", bucket, **kw) as a:
            pa = await a.repo.ledger("l").page("p")
            await pa.put(b"a0", b"a0")
            await a.engine.sync()
            await b.engine.sync()
            await pb.put(b"k", b"X")
            await b.engine.sync()
            await a.engine.sync()
            assert (await _keys(a.repo))[b"k"] == b"X"
            if later is None:
                await pb.delete(b"k")
            else:
                await pb.put(b"k", later)
            await pb.flush()
            await pb.put(b"z", b"Z")
            await b.engine.round(download=False)
            assert await b.engine.policy.write_for_compaction((pb.ledger, pb.id))
            await pa.put(b"w", b"offline on a, after B's write")
            await pa.flush()
        for _ in range(5):
            clock.now += GRACE / 4
            await b.engine.round()
        async with device(tmp_path / "a", bucket, **kw) as a:
            await a.engine.round()
            assert a.engine.checkpoints.covers
            want = {b"a0": b"a0", b"z": b"Z", b"w": b"offline on a, after B's write"}
            if later is not None:
                want[b"k"] = later
            assert await _keys(a.repo) == want
            await a.engine.sync()
            await b.engine.sync()
            await a.engine.sync()
            assert await _keys(a.repo) == want
            assert await _keys(b.repo) == want


@pytest.mark.parametrize("offline", [False, True])
async def test_a_rejoin_keeps_documents_uploaded_after_the_checkpoint(
    tmp_path: Path, bucket: FolderStore, offline: bool
) -> None:
    """As above on a page of documents: A's revision 2 and new document (uploaded, not
    in B's checkpoint), and revision 3 (offline, if any) are kept over the checkpoint's
    revision 1, on both devices. With nothing offline A took the checkpoint's tree as
    it was: the uploaded changes were gone on A (and on B, which had not read them)."""
    clock = Clock()
    kw: dict[str, Any] = {"clock": clock, "checkpoint_interval": 0, "compaction_grace": GRACE}
    async with device(tmp_path / "b", bucket, **kw) as b:
        pb = await b.repo.ledger("l").page("docs")
        async with device(tmp_path / "a", bucket, **kw) as a:
            pa = await a.repo.ledger("l").page("docs")
            docs = await DocumentStore.open(pa)
            doc = await docs.create("c", {"n": 1})
            await a.engine.sync()
            await b.engine.sync()
            await docs.replace("c", doc.id, {"n": 2})
            new = await docs.create("c", {"n": "new"})
            await a.engine.round(download=False)
            assert not await ex.has_unuploaded(pa)
            if offline:
                await docs.replace("c", doc.id, {"n": 3})
                await pa.flush()
        bdoc = await (await DocumentStore.open(pb)).create("c", {"from": "b"})
        await b.engine.round(download=False)
        assert await b.engine.policy.write_for_compaction((pb.ledger, pb.id))
        for _ in range(5):
            clock.now += GRACE / 4
            await b.engine.feed.list_new()
        async with device(tmp_path / "a", bucket, **kw) as a:
            await a.engine.sync()
            assert a.engine.checkpoints.covers
            for d in (a, b, a):  # on A at once (before B reads A's packs), then on both
                if d is b:
                    await b.engine.sync()
                    await a.engine.sync()
                docs = await DocumentStore.open(await d.repo.ledger("l").page("docs"))
                assert (await docs.get("c", doc.id)).data == {"n": 3 if offline else 2}
                assert (await docs.get("c", new.id)).data == {"n": "new"}
                assert (await docs.get("c", bdoc.id)).data == {"from": "b"}


REJOINED = "longer than compaction_grace"


async def test_a_round_whose_imports_run_past_the_grace_is_no_absence(
    tmp_path: Path, bucket: FolderStore, caplog: pytest.LogCaptureFixture
) -> None:
    """A's first round imports a backlog of B's packs for longer than the grace (the
    soak's rounds took 18-20 s, its grace 20 s): A lists the bucket again meanwhile, so
    its next round does not take itself for away and start again from the checkpoints
    (it did, after every such round)."""
    clock = Clock()
    kw: dict[str, Any] = {"clock": clock, "checkpoint_interval": 0, "compaction_grace": GRACE}
    async with device(tmp_path / "a", bucket, **kw) as a, device(tmp_path / "b", bucket, **kw) as b:
        pb = await b.repo.ledger("l").page("p")
        for i in range(6):
            await pb.put(b"k%d" % i, b"from b")
            await b.engine.sync()
            assert await b.engine.policy.write_for_compaction((pb.ledger, pb.id))
        slow = a.engine.downloader._import_pack
        imports = 0

        async def slow_import(*args: Any, **kw: Any) -> int:
            nonlocal imports
            imports += 1
            clock.now += GRACE / 3  # each import takes a third of the grace
            return await slow(*args, **kw)

        a.engine.downloader._import_pack = slow_import  # type: ignore[method-assign]
        with caplog.at_level("WARNING"):
            await a.engine.sync()
            assert imports >= 4
            await a.engine.round()
        assert REJOINED not in caplog.text
        assert (await _keys(a.repo))[b"k5"] == b"from b"


async def test_a_short_stop_after_a_listing_not_saved_yet_is_no_absence(
    tmp_path: Path, bucket: FolderStore, caplog: pytest.LogCaptureFixture
) -> None:
    """A lists the bucket (its time saved), lists again a fifth of the grace later (not
    saved then: saved at most every quarter of it), stops and starts again after most
    of the grace: away for less than the grace since its last listing, it is no rejoin
    (it judged by the listing saved before, and was; the stop now saves the last)."""
    clock = Clock()
    kw: dict[str, Any] = {"clock": clock, "checkpoint_interval": 0, "compaction_grace": GRACE}
    async with device(tmp_path / "b", bucket, **kw) as b:
        pb = await b.repo.ledger("l").page("p")
        await pb.put(b"k", b"from b")
        await b.engine.sync()
        assert await b.engine.policy.write_for_compaction((pb.ledger, pb.id))
        async with device(tmp_path / "a", bucket, **kw) as a:
            await a.engine.sync()
            clock.now += GRACE / 5
            await a.engine.round()
            await a.engine.stop()  # as the daemon stops
        for _ in range(4):  # B stays present
            clock.now += GRACE / 5
            await b.engine.round()
        clock.now += GRACE / 10  # 1.1 grace since A's first listing, 0.9 since its last
        await pb.put(b"k", b"from b, while a is stopped")
        await b.engine.sync()
        caplog.clear()
        with caplog.at_level("WARNING"):
            async with device(tmp_path / "a", bucket, **kw) as a:
                await a.engine.sync()
                assert (await _keys(a.repo))[b"k"] == b"from b, while a is stopped"
        assert REJOINED not in caplog.text


@pytest.mark.parametrize("later", [b"Y", None])
@pytest.mark.parametrize("b_is", ["back with a write", "back", "new"])
async def test_a_pack_built_on_a_commit_a_checkpoint_brings_merges_over_it(
    tmp_path: Path, bucket: FolderStore, later: bytes | None, b_is: str
) -> None:
    """B is away (or new); A imports C's k = X and uploads its commit T on it; C makes
    a commit of its own, imports T (its head a merge: T is no parent of it), sets k = Y
    (or deletes k) and checkpoints: T comes along as A's newest commit. A then uploads
    N on T, not having read C's change. B starts from C's checkpoint (a rejoin, with or
    without a write of its own to carry, or a new device's first round) and imports N:
    T is an ancestor of the checkpoint's head, so X is no change of A's, and Y (or the
    deletion) stays. B held T only as a shallow commit that nothing linked to the
    checkpoint's head: the merge with N found no common ancestor and merged from the
    empty page, and X came back everywhere (a deletion reads as no change from the
    empty page; N, newer than C's checkpoint, won over Y). (Found by
    tests/sync/test_rejoin_causal.py.)"""
    clock = Clock()
    kw: dict[str, Any] = {"clock": clock, "checkpoint_interval": 0, "compaction_grace": GRACE}
    async with device(tmp_path / "a", bucket, **kw) as a, device(tmp_path / "c", bucket, **kw) as c:
        pa = await a.repo.ledger("l").page("p")
        pc = await c.repo.ledger("l").page("p")
        want = {b"t": b"T, on X", b"n": b"N, on T", b"c1": b"C's, concurrent with T"}
        if b_is != "new":
            async with device(tmp_path / "b", bucket, **kw) as b:
                pb = await b.repo.ledger("l").page("p")
                await pb.put(b"b0", b"b0")
                await b.engine.sync()
                await a.engine.sync()
                await c.engine.sync()
                want[b"b0"] = b"b0"
                if b_is == "back with a write":
                    await pb.put(b"w", b"offline on b")
                    await pb.flush()
                    want[b"w"] = b"offline on b"
        for _ in range(5):  # B is away; A and C stay present
            clock.now += GRACE / 4
            await a.engine.round()
            await c.engine.round()
        await pc.put(b"k", b"X")
        await c.engine.sync()
        await a.engine.sync()
        await pa.put(b"t", b"T, on X")
        await a.engine.round(download=False)
        await pc.put(b"c1", b"C's, concurrent with T")
        await c.engine.sync()
        if later is None:
            await pc.delete(b"k")
        else:
            await pc.put(b"k", later)
            want[b"k"] = later
        await pc.flush()
        await c.engine.round(download=False)
        assert await c.engine.policy.write_for_compaction((pc.ledger, pc.id))
        await pa.put(b"n", b"N, on T")
        await a.engine.round(download=False)
        async with device(tmp_path / "b", bucket, **kw) as b:
            await b.engine.round()
            assert b.engine.checkpoints.covers
            await b.engine.sync()
            assert await _keys(b.repo) == want
            for d in (a, c, b, a, c):
                await d.engine.sync()
            assert await _keys(a.repo) == want
            assert await _keys(b.repo) == want
            assert await _keys(c.repo) == want
