"""Merge policies over concurrent writes of two devices: last-one-wins, resolvers.

Two repositories write the same page without seeing each other, then exchange their
deltas by hand (:mod:`tests.exchanges`), as sync would.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ledgerd.store import Page, Policy, Repository
from ledgerd.store.tree.merge import Choice, MergeRequest
from tests.exchanges import exchange_all, ship
from tests.store.resolvers import hooks, set_resolver


@pytest.fixture
async def two(tmp_path: Path) -> AsyncIterator[tuple[Repository, Page, Repository, Page]]:
    """Two devices that share ``a``, ``b`` and ``c``."""
    ra = await Repository.open(tmp_path / "a", hooks=hooks())
    rb = await Repository.open(tmp_path / "b", hooks=hooks())
    a, b = await ra.ledger("l").page("p"), await rb.ledger("l").page("p")
    await a.write([(b"a", b"base-a"), (b"b", b"base-b"), (b"c", b"base-c")])
    await ship(a, b)
    try:
        yield ra, a, rb, b
    finally:
        await ra.close()
        await rb.close()


async def _values(page: Page) -> dict[bytes, bytes]:
    return {kv.key: kv.value for kv in (await page.entries()).items}


async def test_last_one_wins_takes_the_later_write_a_delete_included(
    two: tuple[Repository, Page, Repository, Page],
) -> None:
    _, a, _, b = two
    await a.write([(b"a", b"x"), (b"b", None), (b"new-x", b"1")])
    await b.write([(b"a", b"y"), (b"b", b"y-b")])  # later: b's clock reads after a's
    await exchange_all(a, b)
    got = await _values(a)
    assert got == await _values(b) and a.head.root == b.head.root
    assert got == {b"a": b"y", b"b": b"y-b", b"c": b"base-c", b"new-x": b"1"}
    # The losing writes stay as siblings, listed as conflicts (nobody is asked).
    assert a.conflict_count == b.conflict_count == 2 and a.pending_conflict is None
    e = await a.get_entry(b"a")
    assert e is not None and len(e.siblings) == 1
    # A write of the key (here, on a) supersedes them.
    await a.put(b"a", b"settled")
    await exchange_all(a, b)
    assert a.conflict_count == b.conflict_count == 1
    assert (await b.get_entry(b"a")).siblings == ()  # type: ignore[union-attr]


async def test_a_clear_against_a_later_update_keeps_the_update(
    two: tuple[Repository, Page, Repository, Page],
) -> None:
    _, a, _, b = two
    await a.clear()
    await b.put(b"c", b"updated")  # later than the clear
    await b.put(b"new", b"made concurrently")
    await exchange_all(a, b)
    assert await _values(a) == await _values(b) == {b"c": b"updated", b"new": b"made concurrently"}


async def test_a_write_made_after_seeing_the_other_wins_whatever_the_clocks(
    tmp_path: Path,
) -> None:
    """A device whose clock is an hour behind writes a key after it received the other's
    write of it: its write wins (the clock never runs behind what a page has seen)."""
    now = [1_800_000_000.0]
    ra = await Repository.open(tmp_path / "a", clock=lambda: now[0] + 3600)
    rb = await Repository.open(tmp_path / "b", clock=lambda: now[0])
    try:
        a, b = await ra.ledger("l").page("p"), await rb.ledger("l").page("p")
        await a.put(b"k", b"ahead")
        await ship(a, b)
        await b.put(b"k", b"after seeing it")
        await exchange_all(a, b)
        assert await a.get(b"k") == await b.get(b"k") == b"after seeing it"
        assert a.conflict_count == 0
    finally:
        await ra.close()
        await rb.close()


async def test_automatic_with_fallback_asks_the_resolver_about_real_conflicts(
    two: tuple[Repository, Page, Repository, Page],
) -> None:
    ra, a, _, b = two
    await a.set_policy(Policy.AUTOMATIC_WITH_FALLBACK)
    await a.write([(b"a", b"L"), (b"b", b"same"), (b"only-a", b"1")])
    await b.write([(b"a", b"R"), (b"b", b"same"), (b"c", None)])
    await exchange_all(a, b)
    # No resolver: reads show the later write, the conflict is visible, nothing else waits.
    assert a.pending_conflict and await a.get(b"a") == b"R"
    assert await a.get(b"only-a") == b"1" and not await a.contains(b"c")
    asked: list[MergeRequest] = []

    async def concat(req: MergeRequest) -> dict[bytes, Choice]:
        asked.append(req)
        out: dict[bytes, Choice] = {}
        for c in req.conflicts:
            lv = await a.objects.read_all(c.left.value) if c.left else b""
            rv = await a.objects.read_all(c.right.value) if c.right else b""
            out[c.key] = lv + rv
        return out

    set_resolver(ra, concat)
    assert await a.try_merge()
    assert [c.key for c in asked[0].conflicts] == [b"a"]  # only the real conflict
    assert asked[0].conflicts[0].base is None
    assert await a.get(b"a") == b"RL"  # left: the one reads showed (the later write)
    assert _settled(a)
    await exchange_all(a, b)  # the answer is a write like any other
    assert await _values(a) == await _values(b) and b.conflict_count == 0


async def test_custom_asks_about_concurrent_writes_and_choices_apply(
    two: tuple[Repository, Page, Repository, Page],
) -> None:
    ra, a, _, b = two
    await a.set_policy(Policy.CUSTOM)
    await a.write([(b"a", b"x"), (b"b", b"x"), (b"c", b"x"), (b"only-a", b"1")])
    await b.write([(b"a", b"y"), (b"b", b"y"), (b"c", None)])
    await exchange_all(a, b)

    async def resolver(req: MergeRequest) -> dict[bytes, Choice]:
        assert sorted(c.key for c in req.conflicts) == [b"a", b"b", b"c"]
        return {b"a": "right", b"b": None, b"c": b"restored"}

    set_resolver(ra, resolver)
    assert await a.try_merge()
    got = await _values(a)
    assert got[b"a"] == b"x" and b"b" not in got and got[b"c"] == b"restored"
    assert got[b"only-a"] == b"1"


@pytest.mark.parametrize("failure", ["raises", "times out", "no answer"])
async def test_a_failing_resolver_changes_nothing(
    two: tuple[Repository, Page, Repository, Page],
    failure: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    from ledgerd.store.page import conflicts

    monkeypatch.setattr(conflicts, "RESOLVER_TIMEOUT", 0.2)
    ra, a, _, b = two
    await a.set_policy(Policy.AUTOMATIC_WITH_FALLBACK)
    await a.put(b"a", b"1")
    await b.put(b"a", b"2")
    await exchange_all(a, b)
    head = a.head.id
    never = asyncio.Event()

    async def bad(req: MergeRequest) -> dict[bytes, Choice]:
        if failure == "raises":
            raise ConnectionResetError("the resolver went away")
        if failure == "times out":
            await never.wait()
        return {}

    set_resolver(ra, bad)
    assert not await a.try_merge()
    assert a.head.id == head and a.pending_conflict and a.conflict_count == 1
    await ra.close()
    async with await Repository.open(tmp_path / "a") as again:  # and it is remembered
        p = await again.ledger("l").page("p")
        assert p.policy is Policy.AUTOMATIC_WITH_FALLBACK and p.head.id == head


@pytest.mark.parametrize("what", ["delete", "put"])
async def test_last_one_wins_a_later_delete_beats_an_earlier_put_like_a_later_put(
    two: tuple[Repository, Page, Repository, Page], what: str
) -> None:
    """Device A puts a new key; device B, which never saw it, deletes (or puts) that key
    later. Under last-one-wins the later write wins, a delete included: the delete of a
    key B did not have is kept (as a tombstone) instead of vanishing."""
    _, a, _, b = two
    await a.put(b"new", b"from a")
    if what == "delete":
        await b.delete(b"new")
    else:
        await b.put(b"new", b"from b")
    await exchange_all(a, b)
    for p in (a, b):
        assert (await p.get(b"new") if what == "put" else None) == (
            b"from b" if what == "put" else None
        )
        assert await p.contains(b"new") == (what == "put")
        assert (b"new" in (await p.keys()).items) == (what == "put")


async def test_a_transaction_on_a_moved_page_keeps_what_it_did_not_see(tmp_path: Path) -> None:
    """A transaction writes what it saw; a write made meanwhile on the same device stays
    beside its own as a sibling (concurrent), and reads show the later one."""
    async with await Repository.open(tmp_path, hooks=hooks()) as repo:
        page = await repo.ledger("l").page("p")
        await page.write([(b"k", b"base"), (b"other", b"base")])
        async with page.transaction() as txn:
            assert await txn.get(b"k") == b"base"
            await page.put(b"k", b"written meanwhile")
            await page.put(b"other", b"written meanwhile")
            await txn.put(b"k", b"the transaction's")
        assert await page.get(b"k") == b"the transaction's"  # the later commit
        assert await page.get(b"other") == b"written meanwhile"
        e = await page.get_entry(b"k")
        assert e is not None and len(e.siblings) == 1 and page.conflict_count == 1


async def test_a_tombstone_reads_as_absent_everywhere(tmp_path: Path) -> None:
    async with await Repository.open(tmp_path) as repo:
        page = await repo.ledger("l").page("p")
        await page.write([(b"a", b"1"), (b"b", b"2"), (b"c", b"3")])
        await page.flush()
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


def _settled(p: Page) -> bool:
    """No conflict waits for a resolver (read afresh: mypy keeps an earlier narrowing)."""
    return p.pending_conflict is None and p.conflict_count == 0
