"""Opens, closes and merges that wait on each other: a conflict resolver that opens
the page it is resolving must not hang the page's open or close."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from ledgerd.store import Page, Policy, Repository
from ledgerd.store.repo.repository import MAX_OPEN_PAGES
from ledgerd.store.tree.merge import Choice, MergeRequest
from tests.store.resolvers import hooks, set_resolver
from tests.store.test_repository import held_close

DETECTOR = 10.0
"""Seconds after which a test calls it a hang (RESOLVER_TIMEOUT, 30 s, would end it)."""


async def _conflicting(page: Page) -> None:
    """Two transactions that change the same key differently: a conflict (kept: no
    resolver yet)."""
    await page.put(b"k", b"base")
    await page.flush()
    a, b = page.transaction(), page.transaction()
    await a.start()
    await b.start()
    await a.put(b"k", b"a")
    await b.put(b"k", b"b")
    await a.commit()
    await b.commit()
    assert page.conflict_count == 1 and page.pending_conflict


async def _left_with_two_heads(tmp_path: Path) -> None:
    """Page l/p of the repository at ``tmp_path`` left closed with a conflict (custom
    policy: a resolver decides it at its next open)."""
    async with await Repository.open(tmp_path, hooks=hooks()) as repo:
        page = await repo.ledger("l").page("p")
        await page.set_policy(Policy.CUSTOM)
        await _conflicting(page)


async def test_a_resolver_that_opens_the_page_it_resolves_while_it_opens(
    tmp_path: Path,
) -> None:
    # Opening a page left with two heads merges them, asking the resolver; the
    # resolver opening the page waited for that open (under its lock), which waited
    # for the resolver: a hang until RESOLVER_TIMEOUT, and the merge abandoned.
    await _left_with_two_heads(tmp_path)
    async with await Repository.open(tmp_path, hooks=hooks()) as repo:
        seen: list[Page] = []

        async def resolver(req: MergeRequest) -> dict[bytes, Choice]:
            same = await repo.ledger(req.ledger).page(req.page)
            assert await same.get(b"k") in (b"a", b"b")
            seen.append(same)
            return {c.key: b"resolved" for c in req.conflicts}

        set_resolver(repo, resolver)
        page = await asyncio.wait_for(repo.ledger("l").page("p"), DETECTOR)
        # The resolver got the very page being opened: one Page on the file.
        assert seen == [page] and len(await page.heads()) == 1
        assert await page.get(b"k") == b"resolved"


async def test_pages_closing_slowly_make_room_for_others_rather_than_refusing_them(
    tmp_path: Path,
) -> None:
    # Every open page closing (slow when_closing hooks): they still hold their files
    # and count against max_open_pages, but none is in use. An open of another page
    # failed at once with "all 2 open pages are in use"; it now waits for a close to
    # end, and never more than max_open_pages pages are open.
    async with await Repository.open(tmp_path, max_open_pages=2) as repo:
        pages = [await repo.ledger("l").page(f"p{i}") for i in range(2)]
        gates = [held_close(p) for p in pages]
        closing = [asyncio.create_task(p.close()) for p in pages]
        try:
            for _, entered, _ in gates:
                await asyncio.wait_for(entered.wait(), DETECTOR)
            open_new, most = repo._open_new, [0]

            async def counting(ledger: bytes, page_id: bytes) -> Page:
                most[0] = max(most[0], 1 + sum(not p.db.closed for p in pages))
                return await open_new(ledger, page_id)

            repo._open_new = counting  # type: ignore[method-assign]
            third = asyncio.create_task(repo.ledger("l").page("p2"))
            for _ in range(50):  # loop turns: it runs as far as it can
                await asyncio.sleep(0)
            assert not third.done()  # waits: neither refused nor opened past the bound
            gates[1][0].set()
            page = await asyncio.wait_for(third, DETECTOR)
            assert not page.closed and pages[1].db.closed and not pages[0].db.closed
            assert most[0] == 2
        finally:
            for gate, _, _ in gates:
                gate.set()
            await asyncio.wait_for(asyncio.gather(*closing), DETECTOR)


async def _reopened_with_a_held_resolver(
    tmp_path: Path, max_open_pages: int = MAX_OPEN_PAGES
) -> tuple[Repository, asyncio.Event, asyncio.Event, list[Page]]:
    """A repository reopened on page l/p left with two heads, its resolver (custom
    policy) opening the page and then, once ``gate`` is set, resolving; ``entered``
    is set once it runs. The caller closes the repository."""
    await _left_with_two_heads(tmp_path)
    repo = await Repository.open(tmp_path, hooks=hooks(), max_open_pages=max_open_pages)
    gate, entered, seen = asyncio.Event(), asyncio.Event(), []

    async def resolver(req: MergeRequest) -> dict[bytes, Choice]:
        seen.append(await repo.ledger(req.ledger).page(req.page))
        entered.set()
        await gate.wait()
        return {c.key: b"resolved" for c in req.conflicts}

    set_resolver(repo, resolver)
    return repo, gate, entered, seen


async def test_an_open_cancelled_while_it_merges_leaves_the_page_to_those_that_hold_it(
    tmp_path: Path,
) -> None:
    # The page is published before its left heads merge, so others (here its own
    # resolver) hold it meanwhile. The opener going away (a client that disconnected)
    # closed the page under them, and the merge was abandoned with it. The merge now
    # goes on and the page stays open.
    repo, gate, entered, seen = await _reopened_with_a_held_resolver(tmp_path)
    async with repo:
        opening = asyncio.create_task(repo.ledger("l").page("p"))
        await asyncio.wait_for(entered.wait(), DETECTOR)
        opening.cancel()
        await asyncio.gather(opening, return_exceptions=True)
        assert opening.cancelled()
        [held] = seen
        assert not held.closed and repo.is_open(b"l", b"p")
        gate.set()
        page = await asyncio.wait_for(repo.ledger("l").page("p"), DETECTOR)
        assert page is held
        while page.conflict_count:  # the resolver's round, going on without its opener
            await asyncio.sleep(0.01)
        assert await page.get(b"k") == b"resolved"


async def test_a_page_merging_after_its_open_counts_once_against_max_open_pages(
    tmp_path: Path,
) -> None:
    # While the heads a page was opened with merge, the page is published (it counts
    # as open) and its open's reservation was still held: it counted twice, so a
    # resolver opening one other page with max_open_pages=2 was refused ("all 2 open
    # pages are in use") though only one page was open.
    repo, gate, entered, _ = await _reopened_with_a_held_resolver(tmp_path, max_open_pages=2)
    async with repo:
        opening = asyncio.create_task(repo.ledger("l").page("p"))
        await asyncio.wait_for(entered.wait(), DETECTOR)
        other = await repo.ledger("l").page("q")
        assert not other.closed and repo.is_open(b"l", b"p")
        gate.set()
        page = await asyncio.wait_for(opening, DETECTOR)
        assert len(await page.heads()) == 1


async def test_a_page_whose_close_ended_in_its_hooks_does_not_hold_an_open_forever(
    tmp_path: Path,
) -> None:
    # A close that ended before its database step (a when_closing hook ending with
    # a BaseException, here a cancellation of what it awaited) left the page in the
    # open set, closed, its close done: an open needing room waited for that close
    # again and again, at once each time, for ever. Such a page leaves the open set.
    async with await Repository.open(tmp_path, max_open_pages=1) as repo:
        page = await repo.ledger("l").page("p")

        async def hook() -> None:
            gone: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            gone.cancel()
            await gone

        page.when_closing(hook)
        closing = page.start_close()
        await asyncio.gather(closing, return_exceptions=True)
        other = await asyncio.wait_for(repo.ledger("l").page("q"), DETECTOR)
        assert not other.closed and not repo.is_open(b"l", b"p")


async def test_nothing_closes_a_page_between_its_opening_merge_and_its_handing_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The merge of the heads a page was opened with ends before its opener resumes:
    # in between, the page was idle (no lease, no merge), and an idle sweep or an open
    # needing room could close it, handing the opener a closed page. It is leased
    # while it merges. Here the sweep runs right as the merge ends.
    await _left_with_two_heads(tmp_path)
    async with await Repository.open(tmp_path, hooks=hooks()) as repo:

        async def resolver(req: MergeRequest) -> dict[bytes, Choice]:
            return {c.key: b"resolved" for c in req.conflicts}

        set_resolver(repo, resolver)
        settle, swept = Repository._settle_opened, []

        async def then_sweep(self: Repository, opened: Page) -> None:
            await settle(self, opened)
            swept.append(await self.close_idle(0))

        monkeypatch.setattr(Repository, "_settle_opened", then_sweep)
        page = await asyncio.wait_for(repo.ledger("l").page("p"), DETECTOR)
        assert swept == [0] and not page.closed
        assert await page.get(b"k") == b"resolved"
