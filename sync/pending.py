"""Which pages have commits not uploaded yet, kept across restarts.

This module owns :class:`Pending`: per page, a count of the commits heard of (it
changes on every commit, so an upload that raced a commit does not clear the
page), saved in repository meta (``sync/pending``) with the time it was saved, so
that an upload round opens only those pages and the pages used since the save.
Without a saved list (an older ledgerd ran here) every page is a candidate once.
It uploads nothing (:mod:`sync.upload` does) and never counts the ``_local``
ledger.
"""

from __future__ import annotations

import logging
import time

import msgpack

from ledgerd.sync.context import LOCAL, Key, SyncContext

log = logging.getLogger(__name__)

PENDING_SLACK_MS = 60_000
"""Pages closed this long before the pending list was saved count as changed (clock steps)."""


class Pending:
    """The pages with uploads pending. ``slack_ms``: see :data:`PENDING_SLACK_MS`."""

    def __init__(self, ctx: SyncContext, slack_ms: int = PENDING_SLACK_MS) -> None:
        self.ctx = ctx
        self.slack_ms = slack_ms
        self.counts: dict[Key, int] = {}  # page -> commits seen (changes on every commit)
        self.loaded = False
        self._saved: list[Key] | None = None

    def __len__(self) -> int:
        return len(self.counts)

    def __contains__(self, key: object) -> bool:
        return key in self.counts

    def changed(self, key: Key) -> bool:
        """A commit in ``key``; False for a page that is never uploaded."""
        if key[0] == LOCAL:  # the _local ledger never leaves this device
            return False
        self.counts[key] = self.counts.get(key, 0) + 1
        return True

    def again(self, key: Key) -> None:
        """A round could not upload ``key`` (its error is in status): it is a candidate
        of the next round, which retries it, even if nothing was pending in it (an open
        page, visited because it was open, that could not be opened again)."""
        if key[0] != LOCAL:
            self.counts.setdefault(key, 0)

    def seen(self, key: Key) -> int | None:
        """The page's count now: give it to :meth:`done` when its upload is recorded."""
        return self.counts.get(key)

    def done(self, key: Key, seen: int | None, left: int) -> None:
        """The page's upload of what was pending at ``seen`` is recorded; ``left``
        commits are still unsynced (a conflict keeps some)."""
        if not left and key in self.counts and self.counts[key] == seen:
            del self.counts[key]

    def forget(self, key: Key) -> None:
        """The page is gone from this device (deleted or evicted)."""
        self.counts.pop(key, None)

    async def load(self) -> None:
        """Pages that may hold commits not uploaded yet: the saved list, and the pages
        open or closed since it was saved (a commit after the save was made in a page
        open then). Without a saved list (an older ledgerd ran here), every page."""
        repo = self.ctx.repo
        raw = await repo.get_meta("sync/pending")
        keys: list[Key]
        try:
            if raw is None:
                raise ValueError("no saved list")
            d = msgpack.unpackb(raw, raw=False)
            keys = [(bytes(a), bytes(b)) for a, b in d["pages"]]
            keys += await repo.pages_used_since(int(d["saved_at"]) - self.slack_ms)
        except Exception as e:  # msgpack raises several unrelated types
            log.info("looking for unsynced commits in every page (%s)", e)
            keys = await self._all_pages()
        for key in keys:
            if key[0] != LOCAL:  # (pages used since the save include the _local ledger's)
                self.counts.setdefault(key, 0)
        self.loaded = True

    async def save(self) -> None:
        keys = sorted(self.counts)
        if keys == self._saved:
            return
        saved_at = int(time.time() * 1000)  # before the write: commits after it are newer
        data = msgpack.packb({"saved_at": saved_at, "pages": [list(k) for k in keys]})
        await self.ctx.repo.set_meta("sync/pending", bytes(data))
        self._saved = keys

    async def _all_pages(self) -> list[Key]:
        """Every page stored here: directory listings, no page opened."""
        repo = self.ctx.repo
        keys: list[Key] = []
        for led in await repo.ledgers(include_deleted=True):
            pages = await repo.ledger(led).pages(include_deleted=True)
            keys.extend((led, pid) for pid in pages)
        return keys
