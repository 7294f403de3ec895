"""Resolving conflicts by hand (``Page.resolve``): what it supersedes, and what it
refuses. Two repositories write a page without seeing each other and exchange their
deltas by hand (:mod:`tests.exchanges`), as sync would."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ledgerd.store import (
    AmbiguousTakeError,
    KeyNotFoundError,
    NotInConflictError,
    Page,
    Policy,
    Repository,
    SiblingsChangedError,
    expect_of,
)
from tests.exchanges import Bucket, exchange_all
from tests.store.resolvers import hooks


@pytest.fixture
async def two(tmp_path: Path) -> AsyncIterator[tuple[Page, Page]]:
    """Two devices' copies of a page on ``automatic_with_fallback`` with no resolver:
    ``k`` written on both (a conflict), ``only-a`` and ``only-b`` on one each."""
    ra = await Repository.open(tmp_path / "a", hooks=hooks())
    rb = await Repository.open(tmp_path / "b", hooks=hooks())
    try:
        a, b = await ra.ledger("l").page("p"), await rb.ledger("l").page("p")
        for p in (a, b):
            await p.set_policy(Policy.AUTOMATIC_WITH_FALLBACK)
        await a.write([(b"k", b"from a"), (b"only-a", b"a")])
        await b.write([(b"k", b"from b"), (b"only-b", b"b")])  # later: the winner
        await exchange_all(a, b)
        yield a, b
    finally:
        await ra.close()
        await rb.close()


async def _values(page: Page) -> dict[bytes, bytes]:
    return {kv.key: kv.value for kv in (await page.entries()).items}


async def _value(page: Page, digest: bytes) -> bytes:
    return await page.objects.read_all(digest)


async def test_the_listing_shows_ours_first_and_reads_show_every_key(
    two: tuple[Page, Page],
) -> None:
    a, b = two
    for p in (a, b):
        assert await _values(p) == {b"k": b"from b", b"only-a": b"a", b"only-b": b"b"}
        (c,) = await p.list_conflicts()
        assert c.key == b"k" and len(c.theirs) == 1 and len(c.versions) == 2
        assert await _value(p, c.ours[0]) == b"from b"  # what reads show
        assert await _value(p, c.theirs[0][0]) == b"from a"
        assert p.pending_conflict is not None  # no resolver: it waits
    # The same siblings everywhere: the same expect.
    assert (await a.list_conflicts())[0].expect == (await b.list_conflicts())[0].expect


@pytest.mark.parametrize(
    ("take", "value"),
    [("ours", b"from b"), ("theirs", b"from a"), (b"both", b"both"), (b"ours", b"ours")],
)
async def test_a_resolution_supersedes_the_siblings_on_both_devices(
    two: tuple[Page, Page], take: str | bytes, value: bytes
) -> None:
    a, b = two
    (c,) = await a.list_conflicts()
    (done,) = await a.resolve(b"k", take, expect=c.expect)  # type: ignore[arg-type]
    assert done.key == b"k"
    assert a.conflict_count == 0 and await a.get(b"k") == value
    await exchange_all(a, b)
    for p in (a, b):
        assert p.conflict_count == 0 and await p.list_conflicts() == []
        assert p.pending_conflict is None  # (b: the import ended its conflict)
        assert await _values(p) == {b"k": value, b"only-a": b"a", b"only-b": b"b"}
        e = await p.get_entry(b"k")
        assert e is not None and e.siblings == ()


async def test_a_delete_resolves_and_the_whole_page_at_once(tmp_path: Path) -> None:
    ra = await Repository.open(tmp_path / "a", hooks=hooks())
    rb = await Repository.open(tmp_path / "b", hooks=hooks())
    try:
        a, b = await ra.ledger("l").page("p"), await rb.ledger("l").page("p")
        await a.write([(b"x", b"1"), (b"y", b"1"), (b"z", b"1")])
        await b.write([(b"x", b"2"), (b"y", b"2"), (b"z", None)])
        await exchange_all(a, b)
        await b.set_policy(Policy.AUTOMATIC_WITH_FALLBACK)
        found = await b.list_conflicts()
        assert [c.key for c in found] == [b"x", b"y", b"z"]
        assert b.pending_conflict == "3 keys need a conflict resolver"
        with pytest.raises(SiblingsChangedError):
            await b.resolve(None, "theirs", expect=found[0].expect)  # one key's
        await b.resolve(b"z", None)  # a delete against a put: deleted
        assert b.pending_conflict == "2 keys need a conflict resolver"
        await b.resolve(None, "theirs", expect=expect_of(found[:2]))
        assert await _values(b) == {b"x": b"1", b"y": b"1"}
        await exchange_all(a, b)
        assert await _values(a) == await _values(b) and a.conflict_count == 0
        with pytest.raises(NotInConflictError):
            await a.resolve(b"x", "ours")
        with pytest.raises(NotInConflictError):
            await a.resolve(None, "ours")
        with pytest.raises(KeyNotFoundError):
            await a.resolve(b"z", "ours")
    finally:
        await ra.close()
        await rb.close()


async def test_siblings_that_changed_are_refused_and_nothing_is_written(
    tmp_path: Path,
) -> None:
    rs = [await Repository.open(tmp_path / n, hooks=hooks()) for n in "abc"]
    bucket = Bucket()  # one for the test: c takes a's and b's writes at the end
    try:
        a, b, c = [await r.ledger("l").page("p") for r in rs]
        await a.put(b"k", b"a")
        await b.put(b"k", b"b")
        await bucket.sync(a, b)
        (seen,) = await a.list_conflicts()
        head = a.head
        await c.put(b"k", b"c")  # a third sibling arrives after the listing
        await bucket.sync(a, c)
        with pytest.raises(SiblingsChangedError):
            await a.resolve(b"k", "ours", expect=seen.expect)
        (now,) = await a.list_conflicts()
        assert len(now.theirs) == 2 and a.conflict_count == 1
        assert a.head.id != head.id  # (the exchange's commit; no resolution after it)
        with pytest.raises(AmbiguousTakeError, match="2 siblings"):
            await a.resolve(b"k", "theirs")
        await a.resolve(b"k", "ours", expect=now.expect)  # supersedes all three
        await bucket.sync(a, b, c)
        for p in (a, b, c):
            assert p.conflict_count == 0 and await p.get(b"k") == await a.get(b"k")
    finally:
        for r in rs:
            await r.close()
