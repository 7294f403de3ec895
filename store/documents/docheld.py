"""Index rows held in memory before they are stored, and work run to its end.

This module owns :class:`HeldBudget` (the memory shared by the document stores given
one), :class:`Held` (one page's rows not stored yet) and :func:`to_the_end` (work a
caller's cancellation does not cut short). When rows are held or stored is
:class:`store.documents.docindex.Views`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine, Iterable
from typing import Any, TypeVar

from ledgerd.store.documents.docindexdef import Row
from ledgerd.store.documents.doclayout import DocId

T = TypeVar("T")


async def to_the_end(work: Coroutine[Any, Any, T]) -> T:
    """Await ``work`` in a task of its own that the caller's cancellation does not
    reach: a caller cancelled meanwhile waits for it to end, then raises
    CancelledError (rather than the work's own failure, if it failed)."""
    task = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        while not task.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait({task})
        if not task.cancelled():
            task.exception()  # retrieved: the caller's cancellation is what it sees
        raise


class HeldBudget:
    """Memory for the index rows document stores hold
    (:meth:`~store.documents.docindex.Views.commit`), shared by the stores given the
    same budget: the daemon gives every page the one of ``max_held_index_bytes``."""

    __slots__ = ("limit", "used")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0


class Held:
    """Index rows not stored yet: the last of each (index, document), and about what
    they take in memory (counted in a budget)."""

    __slots__ = ("budget", "rows", "since", "size")

    def __init__(self, budget: HeldBudget) -> None:
        self.budget = budget
        self.rows: dict[tuple[int, DocId], tuple[bytes | None, bool]] = {}
        self.size = 0
        self.since: bytes | None = None
        """The commit the stored rows reflect while rows are held."""

    def add(self, rows: Iterable[Row], size: int, base: bytes) -> None:
        """Hold ``rows`` of a commit on ``base``; ``size`` is what the held rows take
        with them."""
        if not self.rows:
            self.since = base
        held = self.rows
        for ix, doc, key, deleted in rows:
            held[(ix, doc)] = (key, deleted)
        self.budget.used += size - self.size
        self.size = size

    def clear(self) -> None:
        self.budget.used -= self.size
        self.rows, self.size = {}, 0

    def then(self, rows: Iterable[Row]) -> list[Row]:
        """The held rows, each replaced by the row of ``rows`` for its document if any."""
        held = dict(self.rows)
        for ix, doc, key, deleted in rows:
            held[(ix, doc)] = (key, deleted)
        return [(ix, doc, key, deleted) for (ix, doc), (key, deleted) in held.items()]
