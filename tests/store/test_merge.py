"""Merging heads: common ancestors, criss-cross histories, and commits racing cancellation."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledgerd.store import Page, Repository, TransactionClosedError, btree, commit, doclayout, merge
from ledgerd.store import digest as dg
from ledgerd.store.btree import Builder, Entry
from ledgerd.store.commit import Commit


def _ent(k: bytes, v: bytes) -> tuple[bytes, Entry]:
    return k, Entry(k, dg.chunk_digest(dg.Kind.VALUE, v))


async def _commit(page: Page, parents: list[Commit], changes: list[tuple[bytes, Entry]]) -> Commit:
    """A commit as another device would have made it (stored without merging)."""
    b = Builder(page.nodes)
    root = await b.apply(parents[0].root, changes)
    c = commit.child(parents, root)
    async with page.graph.lock:
        await page.graph.store(c, b, notify=False)
    return c


async def _lww(page: Page, base: Commit, a: Commit, b: Commit) -> Commit:
    bld = Builder(page.nodes)
    root = await merge.last_one_wins(bld, base.root, a, b)
    c = commit.merge([a, b], root)
    async with page.graph.lock:
        await page.graph.store(c, bld, notify=False)
    return c


async def test_criss_cross_heads_merge_on_open(tmp_path: Path) -> None:
    async with await Repository.open(tmp_path) as repo:
        page = await repo.ledger("l").page("p")
        await page.write([(b"k%04d" % i, b"v" * 40) for i in range(300)])
        await page.flush()
        f = page.head
        p = await _commit(page, [f], [_ent(b"k0001", b"P")])
        q = await _commit(page, [f], [_ent(b"k0200", b"Q")])
        p1 = await _commit(page, [p], [_ent(b"k0002", b"P1")])
        q1 = await _commit(page, [q], [_ent(b"k0201", b"Q1")])
        h1 = await _lww(page, f, p, q1)  # device X merged P with Q1
        h2 = await _lww(page, f, p1, q)  # device Y merged P1 with Q
        lcas = await merge.common_ancestors(page.load_commit, h1, h2)
        assert {c.id for c in lcas} == {p.id, q.id}
        assert len(await page.heads()) == 2
    async with await Repository.open(tmp_path) as repo:
        page = await repo.ledger("l").page("p")  # opening merges the heads
        assert len(await page.heads()) == 1
        for k, v in [(b"k0001", b"P"), (b"k0002", b"P1"), (b"k0200", b"Q"), (b"k0201", b"Q1")]:
            assert await page.get(k) == v


async def test_same_merge_on_two_devices_is_the_same_commit(tmp_path: Path) -> None:
    async with await Repository.open(tmp_path) as repo:
        page = await repo.ledger("l").page("p")
        f = page.head
        a = await _commit(page, [f], [_ent(b"x", b"1")])
        b = await _commit(page, [f], [_ent(b"x", b"2"), _ent(b"y", b"3")])
        m1 = await _lww(page, f, a, b)
        m2 = await _lww(page, f, b, a)
        assert m1.id == m2.id and m1.salt == b""
        assert m1.timestamp == max(a.timestamp, b.timestamp)


async def test_cancelled_commit_keeps_memory_and_database_in_step(tmp_path: Path) -> None:
    async with await Repository.open(tmp_path) as repo:
        page = await repo.ledger("l").page("p")
        txn = page.transaction()
        await txn.put(b"t", b"txn")
        async with page.graph.lock:  # hold commits so the cancel lands mid-commit
            task = asyncio.ensure_future(txn.commit())
            await asyncio.sleep(0)
            task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await page.flush()
        async with page.graph.lock:  # the shielded commit finished
            pass
        assert await page.get(b"t") == b"txn"
        await page.put(b"after", b"x")
        await page.flush()
        rows = await page.db.read_all("SELECT count(*) FROM heads")
        assert rows[0][0] == len(await page.heads()) == 1


async def test_put_racing_commit_does_not_discard_committed_values(tmp_path: Path) -> None:
    async with await Repository.open(tmp_path) as repo:
        page = await repo.ledger("l").page("p")
        txn = page.transaction()
        await txn.put(b"a", b"A" * 600_000)  # staged (large)

        async def slow() -> object:
            yield b"B" * 300_000
            await asyncio.sleep(0)
            yield b"B" * 300_000

        late = asyncio.ensure_future(txn.put(b"b", slow()))  # type: ignore[arg-type]
        await asyncio.sleep(0)
        await txn.commit()
        with pytest.raises(TransactionClosedError):
            await late
        assert await page.get(b"a") == b"A" * 600_000
        assert not await page.contains(b"b")


@pytest.mark.parametrize("policy", ["lww", "documents", "resolve"])
async def test_a_merge_rewrites_what_the_smaller_side_changed(
    tmp_path: Path, policy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A device with one edit merging a large import: the merged tree is the large
    side with the one edit applied (a few nodes made), and the same tree as applying
    everything to the merge base."""
    async with await Repository.open(tmp_path) as repo:
        page = await repo.ledger("l").page("p")
        base = page.head
        big = await _commit(page, [base], [_ent(b"k%05d" % i, b"v%d" % i) for i in range(5000)])
        small = await _commit(page, [base], [_ent(b"k02500x", b"mine")])
        a, b = sorted([big, small], key=lambda c: c.id)
        made = 0
        add = Builder._add

        def counting(self: Builder, node: object) -> bytes:
            nonlocal made
            made += 1
            return add(self, node)  # type: ignore[arg-type]

        monkeypatch.setattr(Builder, "_add", counting)
        bld = Builder(page.nodes)
        if policy == "lww":
            root = await merge.last_one_wins(bld, base.root, a, b)
        elif policy == "documents":
            root = await merge.by_revision(bld, base.root, a, b)
        else:
            root = await merge.resolve(
                bld, base.root, a, b, merge.Policy.AUTOMATIC_WITH_FALLBACK, None, _no_value
            )
        assert made < 10  # a path or two; the whole tree is about a hundred nodes
        monkeypatch.setattr(Builder, "_add", add)
        everything = [
            (c.key, c.left if c.left != c.base else c.right)
            async for c in btree.diff3(page.nodes, base.root, a.root, b.root)
        ]
        assert root == await Builder(page.nodes).apply(base.root, everything)


def _no_value(key: bytes, data: bytes, like: Entry | None) -> Entry:
    raise AssertionError("no conflict to resolve")


def _doc(doc: int, rev: int, body: bytes) -> list[tuple[bytes, Entry]]:
    """A document's head and body, and an attachment named by the body's first byte
    (a revision may add one: a key of the document that the other side lacks)."""
    d = doc.to_bytes(16, "big")
    head = doclayout.encode_head(rev.to_bytes(16, "big"), doclayout.State.LIVE)
    att = doclayout.attachment_key("c", d, bytes([body[0] % 4]) * 16)
    return [
        (doclayout.head_key("c", d), Entry(doclayout.head_key("c", d), _value(head))),
        (doclayout.body_key("c", d), Entry(doclayout.body_key("c", d), _value(body))),
        (att, Entry(att, _value(body * 2))),
    ]


def _value(content: bytes) -> bytes:
    return dg.chunk_digest(dg.Kind.VALUE, content)


_edits = st.lists(
    st.tuples(st.integers(0, 40), st.booleans(), st.binary(min_size=1, max_size=40)), max_size=40
)


@settings(max_examples=60, deadline=None)
@given(base=_edits, left=_edits, right=_edits, seed=st.integers(0, 2**16))
async def test_a_merge_from_the_smaller_side_equals_one_from_both_diffs(
    tmp_path_factory: pytest.TempPathFactory,
    base: list[tuple[int, bool, bytes]],
    left: list[tuple[int, bool, bytes]],
    right: list[tuple[int, bool, bytes]],
    seed: int,
) -> None:
    """Documents (a revision higher than the base's on the side that edits one, as
    revisions are made) and plain keys (put or deleted), edited on two sides: the
    merge that reads only the smaller side's changes builds the tree that reading
    both diffs builds, by revision and last-one-wins, either side first."""
    rng = random.Random(seed)
    async with await Repository.open(tmp_path_factory.mktemp("m")) as repo:
        page = await repo.ledger("l").page("p")
        revs: dict[int, int] = {}

        def changes(edits: list[tuple[int, bool, bytes]], floor: dict[int, int]) -> list[Any]:
            out: list[Any] = []
            for n, is_doc, data in edits:
                if is_doc:
                    rev = floor.get(n, 0) + rng.randrange(1, 1000)
                    revs[n] = max(revs.get(n, 0), rev)
                    out.extend(_doc(n, rev, data))
                else:
                    key = b"plain/%d" % n
                    out.append((key, None if data[0] % 3 == 0 else Entry(key, _value(data))))
            return out

        root = page.head
        b0 = await _commit(page, [root], changes(base, {}))
        floor = dict(revs)
        a = await _commit(page, [b0], changes(left, floor))
        b = await _commit(page, [b0], changes(right, floor))
        a, b = sorted([a, b], key=lambda c: c.id)
        for how in (merge.by_revision, merge.last_one_wins):
            got = await how(Builder(page.nodes), b0.root, a, b)

            async def both(
                nodes: btree.NodeLoader, base_root: bytes, a_root: bytes, b_root: bytes, *_: Any
            ) -> merge.Changed:
                full = [c async for c in btree.diff3(nodes, base_root, a_root, b_root)]
                return merge.Changed(full, None)

            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(merge, "changed_keys", both)
                want = await how(Builder(page.nodes), b0.root, a, b)
            assert got == want


@pytest.mark.parametrize("resolved_by", ["head time", "merger"])
async def test_a_write_after_both_sides_of_a_conflict_wins_over_a_later_head(
    tmp_path: Path, resolved_by: str
) -> None:
    """Y puts k (t1), Z deletes it (t2); X merges Z's delete with Y's later commit (Y
    wrote another key at t3), and W merges it with Y's put: they may resolve the
    conflict differently (by head times: X to Y's put, W to the delete). W's device
    then writes k (t4) over what it saw, and X's device writes another key (t5). The
    merge of the two (their base: the conflict resolved, the delete) used to take X's
    value for k, its head being later, though the write at t4 followed both writes
    of k: the write at t4 wins, whatever X resolved, in either orientation."""
    async with await Repository.open(tmp_path) as repo:
        page = await repo.ledger("l").page("p")
        await page.write([(b"k", b"old"), (b"other", b"0")])
        await page.flush()
        f = page.head
        t = f.timestamp + 1_000_000

        async def at(parent: Commit, changes: list[tuple[bytes, Entry]], dt: int) -> Commit:
            b = Builder(page.nodes)
            c = commit.child([parent], await b.apply(parent.root, changes), at=t + dt)
            async with page.graph.lock:
                await page.graph.store(c, b, notify=False)
            return c

        async def merged(a: Commit, b: Commit, by_head_time: bool) -> Commit:
            if by_head_time:  # as a device that compared the heads' times did
                base = (await merge.common_ancestors(page.load_commit, a, b))[0]
                return await _lww(page, base, a, b)
            m, bld, _ = await page.merger._merge(*sorted([a, b], key=lambda c: c.id))
            async with page.graph.lock:
                await page.graph.store(m, bld, notify=False)
            return m

        y = await at(f, [_ent(b"k", b"y")], 1)
        z = await at(f, [(b"k", Entry(b"k", dg.TOMBSTONE))], 2)
        y2 = await at(y, [_ent(b"other", b"y2")], 3)
        x = await merged(z, y2, resolved_by == "head time")
        w = await merged(z, y, resolved_by == "head time")
        w2 = await at(w, [_ent(b"k", b"w")], 4)
        x2 = await at(x, [_ent(b"other", b"x")], 5)
        assert {h.id for h in await page.heads()} == {w2.id, x2.id}
        for a, b in ((w2, x2), (x2, w2)):
            m, bld, _ = await page.merger._merge(a, b)
            assert await btree.lookup(bld, m.root, b"k") == _ent(b"k", b"w")[1]
        await page.merger.settle()
        assert await page.get(b"k") == b"w" and await page.get(b"other") == b"x"
