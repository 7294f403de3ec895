"""Merge policies on hand-built histories: last-one-wins, automatic with fallback, custom."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from ledgerd.store import Page, Policy, Repository, commit
from ledgerd.store import digest as dg
from ledgerd.store.btree import Builder, Entry
from ledgerd.store.commit import Commit
from ledgerd.store.merge import Choice, MergeRequest
from tests.store.resolvers import hooks, set_resolver


def _ent(k: bytes, v: bytes) -> tuple[bytes, Entry | None]:
    return k, Entry(k, dg.chunk_digest(dg.Kind.VALUE, v))


async def _commit(
    page: Page, parent: Commit, changes: list[tuple[bytes, Entry | None]], clear: bool = False
) -> Commit:
    """A commit made elsewhere, stored without merging (as sync delivers it)."""
    b = Builder(page.nodes)
    root = await b.apply(b"" if clear else parent.root, changes)
    c = commit.child([parent], root)
    async with page.graph.lock:
        await page.graph.store(c, b, notify=False)
    return c


async def _forked(tmp_path: Path) -> tuple[Repository, Page, Commit]:
    repo = await Repository.open(tmp_path, hooks=hooks())
    page = await repo.ledger("l").page("p")
    await page.write([(b"a", b"base-a"), (b"b", b"base-b"), (b"c", b"base-c")])
    await page.flush()
    return repo, page, page.head


def _pending(page: Page) -> str | None:
    return page.pending_conflict


async def _values(page: Page) -> dict[bytes, bytes]:
    return {kv.key: kv.value for kv in (await page.entries()).items}


async def test_last_one_wins_updates_deletes_and_clears(tmp_path: Path) -> None:
    repo, page, base = await _forked(tmp_path)
    x = await _commit(page, base, [_ent(b"a", b"x"), (b"b", None), _ent(b"new-x", b"1")])
    y = await _commit(page, base, [_ent(b"a", b"y"), _ent(b"b", b"y-b")])
    await page.try_merge()
    later = y if (y.timestamp, y.id) > (x.timestamp, x.id) else x
    got = await _values(page)
    assert got[b"a"] == (b"y" if later is y else b"x")
    assert (b"b" in got) == (later is y)  # the later side wins, delete or update
    assert got[b"new-x"] == b"1" and got[b"c"] == b"base-c"
    # A clear against an update: per key, the later commit wins.
    base2 = page.head
    cl = await _commit(page, base2, [], clear=True)
    up = await _commit(page, base2, [_ent(b"c", b"updated")])
    await page.try_merge()
    got = await _values(page)
    if (up.timestamp, up.id) > (cl.timestamp, cl.id):
        assert got == {b"c": b"updated"}
    else:
        assert got == {}
    await repo.close()


async def test_fast_forward_makes_no_merge_commit(tmp_path: Path) -> None:
    repo, page, base = await _forked(tmp_path)
    child = await _commit(page, base, [_ent(b"a", b"next")])
    heads = await page.heads()
    assert [h.id for h in heads] == [child.id] and not heads[0].is_merge
    await repo.close()


async def test_automatic_with_fallback(tmp_path: Path) -> None:
    repo, page, base = await _forked(tmp_path)
    await page.set_policy(Policy.AUTOMATIC_WITH_FALLBACK)
    left_side = await _commit(
        page, base, [_ent(b"a", b"L"), _ent(b"b", b"same"), _ent(b"only-l", b"1")]
    )
    right_side = await _commit(page, base, [_ent(b"a", b"R"), _ent(b"b", b"same"), (b"c", None)])
    # No resolver: the heads stay, reads serve the latest head, the conflict is visible.
    assert not await page.try_merge()
    assert len(await page.heads()) == 2 and page.pending_conflict
    latest = max((left_side, right_side), key=lambda c: (c.timestamp, c.id))
    assert page.head.id == latest.id
    asked: list[MergeRequest] = []

    async def concat(req: MergeRequest) -> dict[bytes, Choice]:
        asked.append(req)
        out: dict[bytes, Choice] = {}
        for c in req.conflicts:
            lv = await page.objects.read_all(c.left.value) if c.left else b""
            rv = await page.objects.read_all(c.right.value) if c.right else b""
            out[c.key] = lv + rv
        return out

    set_resolver(repo, concat)
    assert await page.try_merge()
    assert [c.key for c in asked[0].conflicts] == [b"a"]  # only the real conflict
    left, right = sorted((left_side, right_side), key=lambda c: c.id)
    assert asked[0].left.id == left.id and asked[0].right.id == right.id
    got = await _values(page)
    expected_a = (b"L" + b"R") if left is left_side else (b"R" + b"L")
    assert got == {b"a": expected_a, b"b": b"same", b"only-l": b"1"}
    assert (await page.heads())[0].is_merge and _pending(page) is None
    await repo.close()


async def test_custom_gets_the_full_diff_and_choices_apply(tmp_path: Path) -> None:
    repo, page, base = await _forked(tmp_path)
    await page.set_policy(Policy.CUSTOM)
    x = await _commit(page, base, [_ent(b"a", b"x"), _ent(b"only-x", b"1")])
    y = await _commit(page, base, [_ent(b"b", b"y"), (b"c", None)])
    left, right = sorted((x, y), key=lambda c: c.id)

    async def resolver(req: MergeRequest) -> dict[bytes, Choice]:
        keys = [c.key for c in req.conflicts]
        assert keys == [b"a", b"b", b"c", b"only-x"]
        return {
            b"a": "left" if left is x else "right",
            b"b": None,
            b"c": b"restored",
            b"only-x": "right" if left is x else "left",
        }

    set_resolver(repo, resolver)
    assert await page.try_merge()
    got = await _values(page)
    assert got[b"a"] == b"x" and b"b" not in got and got[b"c"] == b"restored"
    assert b"only-x" not in got  # the side without it was chosen
    await repo.close()


@pytest.mark.parametrize("failure", ["raises", "times out", "no answer"])
async def test_a_failing_resolver_changes_nothing(
    tmp_path: Path, failure: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ledgerd.store import merging

    monkeypatch.setattr(merging, "RESOLVER_TIMEOUT", 0.2)
    repo, page, base = await _forked(tmp_path)
    await page.set_policy(Policy.AUTOMATIC_WITH_FALLBACK)
    await _commit(page, base, [_ent(b"a", b"1")])
    await _commit(page, base, [_ent(b"a", b"2")])
    heads_before = {h.id for h in await page.heads()}
    never = asyncio.Event()

    async def bad(req: MergeRequest) -> dict[bytes, Choice]:
        if failure == "raises":
            raise ConnectionResetError("the resolver went away")
        if failure == "times out":
            await never.wait()
        return {}

    set_resolver(repo, bad)
    assert not await page.try_merge()
    assert {h.id for h in await page.heads()} == heads_before and page.pending_conflict
    commits = await page.db.read_all("SELECT count(*) FROM commits")
    await repo.close()
    async with await Repository.open(tmp_path) as repo2:  # and nothing was written
        p2 = await repo2.ledger("l").page("p")
        assert p2.policy is Policy.AUTOMATIC_WITH_FALLBACK  # remembered
        assert (await p2.db.read_all("SELECT count(*) FROM commits")) == commits


@pytest.mark.parametrize("what", ["delete", "put"])
async def test_last_one_wins_a_later_delete_beats_an_earlier_put_like_a_later_put(
    tmp_path: Path, what: str
) -> None:
    """Device X puts a new key; device Y, which never saw it, deletes (or puts) that
    key later. Under last-one-wins the later side wins, a delete included: the
    delete of a key Y did not have is kept (as a tombstone) instead of vanishing."""
    repo, page, base = await _forked(tmp_path)
    later = page.transaction()
    await later.start()  # Y's view: the base, without the key
    earlier = await _commit(page, base, [_ent(b"new", b"from x")])  # X, earlier
    if what == "delete":
        await later.delete(b"new")
    else:
        await later.put(b"new", b"from y")
    y = await later.commit()
    assert y is not None and (await page.load_commit(y)).timestamp > earlier.timestamp
    assert len(await page.heads()) == 1
    got = await _values(page)
    assert got.get(b"new") == (None if what == "delete" else b"from y")
    assert not await page.contains(b"new") if what == "delete" else True
    assert b"new" not in (await page.keys()).items or what == "put"
    await repo.close()


async def test_a_tombstone_reads_as_absent_everywhere(tmp_path: Path) -> None:
    repo, page, base = await _forked(tmp_path)
    notes = page.watch()
    await page.delete(b"never-there")  # a delete of an absent key leaves a tombstone
    await page.put(b"z", b"1")
    await page.flush()
    assert not await page.contains(b"never-there")
    assert [e.key async for e in page.iter_entries()] == [b"a", b"b", b"c", b"z"]
    snap = await page.snapshot()
    assert not await snap.contains(b"never-there")
    note = await asyncio.wait_for(notes.__anext__(), 10)
    assert note.deleted == [] and [c.key for c in note.changed] == [b"z"]
    await page.put(b"never-there", b"now")  # a tombstone replaced by a value
    await page.flush()
    assert await page.get(b"never-there") == b"now"
    await repo.close()
