"""Commits built on history other devices have pruned (a device back after longer
than ``history_retention``) are carried over onto the bucket's newer commits before
they go up (:func:`ledgerd.store.exchange.carry_over_stale`).

Before, device A, away, wrote on commit X; B wrote on and pruned X (retention), and
deleted the tree nodes and values of X that its newer commits no longer use. A's
commit went up on X, its pack carrying only A's new nodes: B waited for the rest for
good ("waits for what no pack seen holds: tree node ... is missing"), and for every
later commit of A's on the page: A's writes after its return never reached B."""

from __future__ import annotations

import random
from pathlib import Path

from ledgerd.store import Commit, Page, Repository, gc
from ledgerd.store import exchange as ex
from ledgerd.sync import check as sc
from ledgerd.sync.folder import FolderStore
from tests.sync.test_engine import Device, _keys, device


async def shared_then_rewritten(a: Device, b: Device) -> tuple[Page, Page]:
    """A writes a page of 1,000 keys, both sync, and B rewrites a fifth of them (its
    commit X, uploaded as an edit of A's tree nodes)."""
    rng = random.Random(4)
    pa = await a.repo.ledger("l").page("p")
    async with pa.transaction() as tx:
        await tx.put_many([(b"k%04d" % i, rng.randbytes(50)) for i in range(1000)])
    await a.engine.sync()
    await b.engine.sync()
    pb = await b.repo.ledger("l").page("p")
    async with pb.transaction() as tx:
        await tx.put_many([(b"k%04d" % i, b"x") for i in range(3, 1000, 5)])
    await b.engine.sync()
    return pa, pb


async def _pruned_under(a: Device, b: Device) -> tuple[Page, Page]:
    """A and B share a page of 1,000 keys, then B's commit X; A, away, writes on X; B
    rewrites a seventh of the keys, writes twice more, and prunes all it may."""
    pa, pb = await shared_then_rewritten(a, b)
    await a.engine.sync()
    assert pa.head.id == pb.head.id
    await pa.put(b"k0001", b"from a, away")
    await pa.delete(b"k0002")
    async with pb.transaction() as tx:
        await tx.put_many([(b"k%04d" % i, b"b") for i in range(0, 1000, 7)])
    await b.engine.sync()
    for v in (b"1", b"2"):
        await pb.put(b"zz", v)
        await b.engine.sync()
    assert (await gc.collect(pb, 0)).commits_pruned >= 2
    return pa, pb


async def test_commits_on_a_parent_another_device_pruned_reach_it(
    tmp_path: Path, bucket: FolderStore
) -> None:
    async with (
        device(tmp_path / "a", bucket, history_retention=0.0) as a,
        device(tmp_path / "b", bucket) as b,
    ):
        pa, pb = await _pruned_under(a, b)
        await a.engine.sync()
        await b.engine.sync()
        await a.engine.sync()
        assert not b.engine.problems() and not a.engine.problems()
        got = await _keys(b.repo)
        assert got[b"k0001"] == b"from a, away" and b"k0002" not in got
        assert got[b"k0007"] == b"b" and got[b"k0003"] == b"x" and got[b"zz"] == b"2"
        assert got == await _keys(a.repo)
        await pa.put(b"later", b"from a")  # and what A writes next gets there too
        await a.engine.sync()
        await b.engine.sync()
        assert (await _keys(b.repo))[b"later"] == b"from a"
        assert pa.head.id == pb.head.id
        assert not b.engine.problems()
        for d, page in ((a, pa), (b, pb)):  # the commits carried over are no lack
            index = sc.BucketIndex(d.engine.store, d.engine.codec)
            checked = await sc.check_page(page, d.engine, index, cloud=True, repair=False)
            assert not checked.report.open_problems()


async def test_a_stale_parent_with_nothing_listed_goes_up_at_once(
    tmp_path: Path, bucket: FolderStore
) -> None:
    """A page whose commit builds on a stale parent, with nothing newer here and no
    pack of another device's listed, goes up on it in the round's one PUT: the
    bucket has nothing newer for the others to have moved to (a page written less
    often than the retention is the common case; it cost a second PUT)."""
    async with (
        device(tmp_path / "a", bucket, history_retention=0.0) as a,
        device(tmp_path / "b", bucket) as b,
    ):
        pa = await a.repo.ledger("l").page("p")
        await pa.put(b"k", b"1")
        await a.engine.sync()
        await b.engine.sync()
        await pa.put(b"k", b"2")  # on a parent older than no retention at all
        puts = a.cloud.counts["put"]
        stats = await a.engine.round()
        assert stats.uploaded_packs == 1 and a.cloud.counts["put"] == puts + 1
        assert not a.engine.uploader.stale_held
        await b.engine.sync()
        assert (await _keys(b.repo))[b"k"] == b"2"
        # With another device's pack listed, the page waits for the download, which
        # brings nothing of it here: it goes up after it, in the same round.
        await (await b.repo.ledger("l").page("q")).put(b"x", b"1")
        await b.engine.sync()
        await pa.put(b"k", b"3")
        stats = await a.engine.round()
        assert stats.uploaded_packs == 1 and stats.downloaded_packs == 1
        assert a.engine.uploader.stale_held == {(b"l", b"p")}
        await b.engine.sync()
        assert (await _keys(b.repo))[b"k"] == b"3"


async def _uploaded_then_written(repo: Repository) -> tuple[Page, Commit]:
    """A page whose k = 1 is uploaded (the commit returned) and k = 2 is not."""
    page = await repo.ledger("l").page("p")
    await page.put(b"k", b"1")
    await page.flush()
    up = await ex.pending_upload(page)
    await ex.mark_uploaded(page, [c.id for c in up.commits], up.eager)
    synced = page.head
    await page.put(b"k", b"2")
    await page.flush()
    return page, synced


async def test_no_carry_over_while_a_transaction_is_open_on_a_commit_it_replaces(
    tmp_path: Path,
) -> None:
    """A transaction begun on a commit a carry-over would replace commits on it; merged
    with the carried-over head over their parent in the bucket, it undid this
    device's own later write (k = 3 back to 2). So the carry-over waits for it."""
    async with await Repository.open(tmp_path) as repo:
        page, synced = await _uploaded_then_written(repo)
        async with page.transaction() as tx:
            await page.put(b"k", b"3")
            await page.flush()
            assert await page.merger.reparent([synced], b"salt", page.pinned_commits) is None
            await tx.put(b"t", b"in the transaction")
        assert await page.merger.reparent([synced], b"salt", page.pinned_commits)
        up = await ex.pending_upload(page)
        assert [c.parents for c in up.commits] == [(synced.id,)]
        got = {kv.key: kv.value for kv in (await page.entries()).items}
        assert got == {b"k": b"3", b"t": b"in the transaction"}


async def test_a_commit_on_a_head_a_rejoin_left_behind_is_carried_over(tmp_path: Path) -> None:
    """A transaction open across a rejoin (its rebase left its base behind, never to be
    uploaded) commits on that base: the upload carries it over onto the rejoin's
    commit's parent rather than send a commit whose parent no device will have."""
    async with await Repository.open(tmp_path) as repo:
        page, synced = await _uploaded_then_written(repo)
        async with page.transaction() as tx:
            assert await page.merger.rebase(synced, b"salt")  # leaves the head behind
            await tx.put(b"t", b"in the transaction")
        assert await ex.carry_over_stale(page, 1e9) == ex.CARRIED  # no parent is stale
        up = await ex.pending_upload(page)
        assert [c.parents for c in up.commits] == [(synced.id,)]
        got = {kv.key: kv.value for kv in (await page.entries()).items}
        assert got == {b"k": b"2", b"t": b"in the transaction"}


async def test_a_carry_over_onto_two_tips_is_a_merge_commit_of_both(tmp_path: Path) -> None:
    """Carried onto parents from the bucket neither of which descends from the other,
    the new commit is a merge of them (dropping one would bring back, with it, what
    this device changed since it)."""
    async with await Repository.open(tmp_path) as repo:
        page = await repo.ledger("l").page("p")
        await page.put(b"k", b"1")
        await page.flush()
        async with page.transaction() as tx:  # a branch beside the next put
            await page.put(b"k", b"2")
            await page.flush()
            await tx.put(b"t", b"1")
        merged = page.head
        tips = [await page.load_commit(p) for p in merged.parents]
        await ex.mark_uploaded(page, [c.id for c in tips], [])
        await page.delete(b"t")  # what the device changed since one of them
        await page.flush()
        c = await page.merger.reparent(tips, b"salt", page.pinned_commits)
        assert c is not None and page.head.id == c.id
        assert sorted(c.parents) == sorted(t.id for t in tips)
        assert c.generation == 1 + max(t.generation for t in tips)
        up = await ex.pending_upload(page)
        assert [x.id for x in up.commits] == [c.id]
        assert {kv.key: kv.value for kv in (await page.entries()).items} == {b"k": b"2"}


async def test_a_carry_over_onto_the_same_tree_leaves_nothing_to_upload(tmp_path: Path) -> None:
    """Unuploaded commits that came back to their parent's tree are carried over onto
    it with no new commit: the parent is the head again, and nothing waits."""
    async with await Repository.open(tmp_path) as repo:
        page, synced = await _uploaded_then_written(repo)
        await page.put(b"k", b"1")  # back to the uploaded tree
        await page.flush()
        head = await page.merger.reparent([synced], b"salt", page.pinned_commits)
        assert head is not None and head.id == synced.id == page.head.id
        assert (await ex.pending_upload(page)).empty
