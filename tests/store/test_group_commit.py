"""Concurrent puts grouped into one journal append, against the same writes one at a time.

Puts and deletes of several tasks that come in one turn of the event loop are appended
by the write worker together (:meth:`store.page.writer.JournalWriter._submit`), and the
journal's overlay is updated in place rather than copied per append: the page must read,
list and commit what the same writes made one after another do."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledgerd.store import Entry, Page, Repository

_keys = st.binary(min_size=0, max_size=3)
_values = st.none() | st.binary(max_size=200)
_rounds = st.lists(st.dictionaries(_keys, _values, min_size=1, max_size=20), min_size=1, max_size=8)


def _seen(e: Entry | None) -> tuple[object, ...] | None:
    return None if e is None else tuple(e)[:3]


async def _apply(page: Page, key: bytes, value: bytes | None) -> None:
    if value is None:
        await page.delete(key)
    else:
        await page.put(key, value)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_rounds, st.integers(0, 3))
async def test_concurrent_puts_read_and_commit_as_one_at_a_time(
    rounds: list[dict[bytes, bytes | None]], flush_after: int
) -> None:
    """Each round's writes run as concurrent tasks (distinct keys) on one page and one
    at a time on another: after every round both read the same entries, and so they
    do once both are committed."""
    with tempfile.TemporaryDirectory() as d:
        repo = await Repository.open(Path(d) / "r")
        try:
            grouped = await repo.ledger("l").page("grouped")
            plain = await repo.ledger("l").page("plain")
            model: dict[bytes, bytes] = {}
            for i, changes in enumerate(rounds):
                await asyncio.gather(*(_apply(grouped, k, v) for k, v in changes.items()))
                for k, v in changes.items():
                    await _apply(plain, k, v)
                    if v is None:
                        model.pop(k, None)
                    else:
                        model[k] = v
                for k in changes:  # acknowledged: readable at once
                    # (key, value, priority): a dot is the commit's, and either page's
                    # journal may have been committed in the background meanwhile.
                    assert _seen(await grouped.get_entry(k)) == _seen(await plain.get_entry(k))
                    if k in model:
                        assert await grouped.get(k) == model[k]
                if i == flush_after:
                    await grouped.flush()
                listed = [(e.key, e.value) async for e in grouped.iter_entries()]
                assert listed == [(e.key, e.value) async for e in plain.iter_entries()]
                assert [k for k, _ in listed] == sorted(model)
            await grouped.flush()
            await plain.flush()
            assert not grouped.writer.uncommitted
            committed = [tuple(e)[:3] async for e in grouped.iter_entries()]
            assert committed == [tuple(e)[:3] async for e in plain.iter_entries()]
        finally:
            await repo.close()
