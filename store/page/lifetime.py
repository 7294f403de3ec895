"""A page's lifetime: who holds it, whether it is idle, and closing it.

This module owns the page's leases (:meth:`PageLifetime.lease`), what idle, quiet
and unheld mean for the repository that closes pages for room, the hooks run as it
closes, and the close itself (queued writes, hooks, in-flight commit, database).
What a page serves while open is :mod:`store.page.page`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Self

from ledgerd.store.errors import ClosedError, named
from ledgerd.store.page.conflicts import Conflicts
from ledgerd.store.page.graph import CommitGraph
from ledgerd.store.page.transaction import Transactions
from ledgerd.store.page.watch import Watchers
from ledgerd.store.page.writer import JournalWriter
from ledgerd.store.sqlite.db import Database

log = logging.getLogger("ledgerd.store.page.page")
"""The page's logger (its façade's name): one logger for every part of a page's life."""


class PageLifetime:
    """The leases and the close of a page (a base of :class:`store.page.page.Page`)."""

    id: bytes
    ledger: bytes
    db: Database
    graph: CommitGraph
    writer: JournalWriter
    conflicts: Conflicts
    transactions: Transactions
    watchers: Watchers
    last_used: float
    on_release: Callable[[Self], None] | None
    _on_close: Callable[[Self], None] | None
    _closing: list[Callable[[], Awaitable[None]]]
    _closed: bool
    _close_done: asyncio.Future[None] | None
    _leases: int

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"page {named(self.id)} is closed")

    def _touch(self) -> None:
        self.last_used = time.monotonic()

    @contextlib.contextmanager
    def lease(self, *, use: bool = True) -> Iterator[Self]:
        """Hold the page open for the block: :meth:`Repository.close_idle` never
        closes a page while someone holds a lease on it. Unless ``use`` is false
        (a look that should not keep the page open, like a status listing), the
        page counts as used when the lease ends."""
        self._check_open()
        self._leases += 1
        try:
            yield self
        finally:
            self._leases -= 1
            if use:
                self._touch()
            if not self._leases and self.on_release is not None:
                self.on_release(self)

    @property
    def idle(self) -> bool:
        """Nobody holds the page and nothing is under way in it: closing it now
        would interrupt nobody (no lease, watcher, transaction, queued write,
        uncommitted journal, merge or commit in progress)."""
        return self.quiet and not self.writer.busy

    @property
    def quiet(self) -> bool:
        """Nobody holds the page, though acknowledged writes may still wait in its
        journal for their commit: closing it commits them first (:meth:`close`), so a
        close for room interrupts nobody either (a page just written stays busy for
        the journal's commit delay)."""
        return not (
            self._leases
            or self.watchers
            or self.transactions.busy
            or self.graph.lock.locked()
            or self.conflicts.running
        )

    @property
    def unheld(self) -> bool:
        """Nobody holds the page and no merge runs in it, though a commit of its
        journal may be under way (the commit lock held): a close waits for that commit
        (:meth:`_close`), so a close for room interrupts nobody either. (An open for
        room that came during such a commit was refused: 'all 1 open pages are in
        use', 503 in the daemon, though nobody held the page.)"""
        return not (
            self._leases or self.watchers or self.transactions.busy or self.conflicts.running
        )

    async def close(self) -> None:
        """Finish queued writes, end watchers, close the database.

        Once begun, closing completes even if the caller is cancelled (a page left
        half closed would keep its connections, threads and files). A call while the
        page is closing returns once the close has ended, however it ended (so that
        the file is not opened again while this page still writes to it)."""
        if self._closed:
            if self._close_done is not None:
                await asyncio.wait([self._close_done])
            return
        await asyncio.shield(self.start_close())

    def start_close(self) -> asyncio.Future[None]:
        """Begin closing the page, at once (it is :attr:`closed` on return), and return
        what ends when the close has ended (the close under way, if one is)."""
        if self._close_done is None:
            self._closed = True
            self.conflicts.abandon()  # a resolver asked now is no longer waited for
            self._close_done = asyncio.ensure_future(self._close())
            self._close_done.add_done_callback(self._closed_with)
        return self._close_done

    def _closed_with(self, done: asyncio.Future[None]) -> None:
        # Logged here too: a close begun for room (Repository._make_room) has no caller
        # that sees its error. A caller of close() still gets it raised.
        if not done.cancelled() and done.exception() is not None:
            left = self.db.unclosed
            log.error(
                "page %s of ledger %s: closing failed: %s%s",
                named(self.id),
                named(self.ledger),
                done.exception(),
                f" (its {', '.join(left)} connection left open: the page is not opened "
                "again until a close of it succeeds)"
                if left
                else "",
            )

    def when_closing(self, fn: Callable[[], Awaitable[None]]) -> None:
        """Run ``fn`` when the page closes, after its queued writes, before its database
        closes (the document layer stores its held index rows); its errors are logged."""
        self._closing.append(fn)

    def not_when_closing(self, fn: Callable[[], Awaitable[None]]) -> None:
        """Undo :meth:`when_closing`."""
        with contextlib.suppress(ValueError):
            self._closing.remove(fn)

    async def _close(self: Self) -> None:
        try:
            await self.writer.stop()
            for fn in list(self._closing):  # a hook may undo itself, or another
                if fn not in self._closing:
                    continue  # undone meanwhile
                try:
                    await fn()
                except Exception:
                    log.exception("page %s: closing", named(self.id))
        finally:  # its database closes however the steps before ended
            try:
                async with self.graph.lock:  # let an in-flight commit or merge finish
                    pass
                self.watchers.close_all()
                await self.db.close()
            finally:  # closed however it went: its owner stops counting it as open
                if self._on_close is not None:
                    self._on_close(self)
