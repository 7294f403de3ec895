"""Regression tests for defects found by the review of the page (issue 13): a resolver
round that waits holds up nothing, watchers never fetch, a journal's commit carries the
time of its first acknowledged write, a transaction's memory is bounded."""

from __future__ import annotations

import asyncio
from pathlib import Path

from ledgerd.store import PageHooks, Policy, Priority, Repository
from ledgerd.store.pieces import digest as dg
from ledgerd.store.tree import commit
from ledgerd.store.tree.btree import Builder, Entry
from ledgerd.store.tree.merge import Choice, MergeRequest
from tests.exchanges import exchange_all
from tests.store.resolvers import hooks, set_resolver


async def test_a_resolver_round_waiting_for_its_resolver_holds_up_no_commit(
    tmp_path: Path,
) -> None:
    """While a resolver round waits for its answer, plain writes commit, and a
    transaction started then sees the caller's acknowledged writes."""
    repo = await Repository.open(tmp_path / "a", hooks=hooks())
    other = await Repository.open(tmp_path / "b")
    page = await repo.ledger("l").page("p")
    await page.set_policy(Policy.AUTOMATIC_WITH_FALLBACK)
    await page.put(b"a", b"1")
    await (await other.ledger("l").page("p")).put(b"a", b"2")
    await exchange_all(page, await other.ledger("l").page("p"))
    await other.close()
    asked = asyncio.Event()
    answer = asyncio.Event()

    async def slow(req: MergeRequest) -> dict[bytes, Choice]:
        asked.set()
        await answer.wait()
        return {c.key: "left" for c in req.conflicts}

    set_resolver(repo, slow)
    merging = asyncio.create_task(page.try_merge())
    await asyncio.wait_for(asked.wait(), 10)
    await asyncio.wait_for(page.put(b"meanwhile", b"x"), 5)
    await asyncio.wait_for(page.flush(), 5)  # committed: the commit lock is free
    async with page.transaction() as txn:
        assert await asyncio.wait_for(txn.get(b"meanwhile"), 5) == b"x"
        await txn.put(b"from-txn", b"y")
    answer.set()
    assert await asyncio.wait_for(merging, 10) or await page.try_merge()
    assert page.conflict_count == 0
    assert await page.get(b"meanwhile") == b"x" and await page.get(b"from-txn") == b"y"
    await repo.close()


class _Recorder:
    def __init__(self) -> None:
        self.asked: list[list[bytes]] = []

    async def fetch_pieces(self, page: object, digests: list[bytes]) -> dict[bytes, bytes]:
        self.asked.append(digests)
        raise ConnectionError("offline")


async def test_watchers_never_fetch_a_value_this_device_lacks(tmp_path: Path) -> None:
    fetcher = _Recorder()
    async with await Repository.open(tmp_path, hooks=PageHooks(fetcher=fetcher)) as repo:
        page = await repo.ledger("l").page("p")
        w = page.watch()
        absent = dg.chunk_digest(dg.Kind.VALUE, b"a LAZY value stored elsewhere" * 10)
        b = Builder(page.nodes)
        ts = page.graph.next_time()
        entry = Entry(b"lazy", absent, Priority.LAZY, page.graph.dot(ts))
        root = await b.apply(page.head.root, [(b"lazy", entry)])
        c = commit.child(page.head, root, ts)
        async with page.graph.lock:  # as an import stores it
            await page.graph.store(c, b)
        note = await asyncio.wait_for(w.__anext__(), 5)
        [changed] = note.changed
        assert changed.key == b"lazy" and changed.value is None and changed.size is None
        assert fetcher.asked == []  # nothing was fetched for the watcher


async def test_a_journal_commit_is_stamped_with_its_first_acknowledged_write(
    tmp_path: Path,
) -> None:
    now = [commit.now_us() + 10_000_000]
    async with await Repository.open(tmp_path, clock=lambda: now[0] / 1e6) as repo:
        page = await repo.ledger("l").page("p")
        first = now[0]
        await page.put(b"a", b"1")  # acknowledged at `first`
        now[0] += 5_000_000  # the group commit runs 5 s later
        await page.put(b"b", b"2")
        await page.flush()
        assert page.head.timestamp == first
        b = await page.get_entry(b"b")
        assert b is not None and b.dot[:8] == first.to_bytes(8, "big")  # its writes too


async def test_a_transaction_stages_its_values_past_its_memory_budget(tmp_path: Path) -> None:
    async with await Repository.open(tmp_path, hooks=hooks(), txn_memory=2000) as repo:
        page = await repo.ledger("l").page("p")
        async with page.transaction() as txn:
            for i in range(20):
                await txn.put(b"k%02d" % i, bytes([i]) * 300)
            assert txn.state.memory <= 2000 + 300  # what it holds stays within the budget
            assert txn.state.staged  # the rest was staged in SQLite
            assert await txn.get(b"k19") == bytes([19]) * 300
        for i in range(20):
            assert await page.get(b"k%02d" % i) == bytes([i]) * 300
