"""Client-supplied revisions (``new_rev``) on a create: a new document has no current
revision to be after, so this device's clock (less the tolerance) stands for it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from ulid import ULID

from ledgerd.store import (
    DocumentStore,
    Page,
    Repository,
    RevisionInFutureError,
    RevisionInPastError,
)
from ledgerd.store.docmodel import RevClock

NOW = 1_800_000_000_000  # ms


@pytest.fixture
async def page(tmp_path: Path) -> AsyncIterator[Page]:
    async with await Repository.open(tmp_path) as repo:
        yield await repo.ledger("app").page("docs")


def rev_at(ms: int) -> str:
    return str(ULID.from_timestamp(ms / 1000))


async def test_a_create_refuses_a_revision_far_in_the_past(page: Page) -> None:
    """``create(new_rev=...)`` took any revision at all, all zeros included: a document
    born at 1970 loses every merge to any other edit, and a bulk of them pins nothing
    of the clock. A new document's revision must be at most ``rev_tolerance`` behind
    this device's clock (as it may be at most that far ahead)."""
    docs = await DocumentStore.open(page, clock=RevClock(lambda: NOW), rev_tolerance=5)
    head = page.head.id
    for old in ("0" * 26, rev_at(0), rev_at(NOW - 6_000), rev_at(NOW - 3600_000)):
        with pytest.raises(RevisionInPastError) as e:
            await docs.create("c", {"v": 1}, new_rev=old)
        assert e.value.code == "conflict" and "behind" in str(e.value), str(e.value)
        with pytest.raises(RevisionInPastError):
            await docs.create_many("c", [{"v": 1}, {"v": 2}], new_revs=[rev_at(NOW), old])
    with pytest.raises(RevisionInFutureError):
        await docs.create("c", {"v": 1}, new_rev=rev_at(NOW + 6_000))
    assert page.head.id == head  # nothing stored
    for ok in (rev_at(NOW - 4_000), rev_at(NOW), rev_at(NOW + 4_000)):
        doc = await docs.create("c", {"v": 1}, new_rev=ok)
        assert doc.rev == ok
    # A replace still compares with the document's revision only: one a little behind
    # the clock but after the current one is taken.
    a = await docs.create("c", {"v": 1}, new_rev=rev_at(NOW - 4_500))
    b = await docs.replace("c", a.id, {"v": 2}, new_rev=rev_at(NOW - 4_400))
    assert b.rev > a.rev
