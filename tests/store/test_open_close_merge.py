"""Opens, closes and merges that wait on each other: a conflict resolver that opens
the page it is resolving must not hang the page's open or close."""

from __future__ import annotations

import asyncio
from pathlib import Path

from ledgerd.store import Page, Policy, Repository
from ledgerd.store.merge import Choice, MergeRequest
from tests.store.resolvers import hooks, set_resolver

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
