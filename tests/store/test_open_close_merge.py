"""Opens, closes and merges that wait on each other: a conflict resolver that opens
the page it is resolving must not hang the page's open or close."""

from __future__ import annotations

import asyncio
from pathlib import Path

from ledgerd.store import Page, Policy, Repository
from ledgerd.store.merge import Choice, MergeRequest
from tests.store.resolvers import hooks, set_resolver
from tests.store.test_repository import held_close

DETECTOR = 10.0
"""Seconds after which a test calls it a hang (RESOLVER_TIMEOUT, 30 s, would end it)."""


async def _conflicting(page: Page) -> None:
    """Two heads that change the same key differently (kept: no resolver yet)."""
    await page.put(b"k", b"base")
    await page.flush()
    a, b = page.transaction(), page.transaction()
    await a.start()
    await b.start()
    await a.put(b"k", b"a")
    await b.put(b"k", b"b")
    await a.commit()
    await b.commit()
    assert len(await page.heads()) == 2 and page.pending_conflict


async def test_a_resolver_that_opens_the_page_it_resolves_while_it_opens(
    tmp_path: Path,
) -> None:
    # Opening a page left with two heads merges them, asking the resolver; the
    # resolver opening the page waited for that open (under its lock), which waited
    # for the resolver: a hang until RESOLVER_TIMEOUT, and the merge abandoned.
    async with await Repository.open(tmp_path, hooks=hooks()) as repo:
        page = await repo.ledger("l").page("p")
        await page.set_policy(Policy.CUSTOM)
        await _conflicting(page)
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
