"""A repository's ledgers and pages as listings show them, and deleting them.

This module owns which ledgers and pages are listed (stored here, evicted ones
included, deleted ones left out), deleting a page or a ledger, removing what
remains of a lost page, and :class:`Ledger`, a ledger's view of its pages.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from pathlib import Path

from ledgerd.store.errors import LedgerNotFoundError, PageNotFoundError, StoreError, named
from ledgerd.store.page.page import Page
from ledgerd.store.repo.evicting import Evicting
from ledgerd.store.repo.layout import (
    PAGE_ID_SIZE,
    check_name,
    decode_name,
    encode_name,
    is_lost,
    lost_leftovers,
    remove_page_dir,
)
from ledgerd.store.repo.state import log
from ledgerd.store.sqlite import usage as usage_sql


class Listing(Evicting):
    """Listing and deleting ledgers and pages."""

    def ledger(self, name: bytes | str) -> Ledger:
        return Ledger(self, check_name(name, "ledger name"))

    async def ledgers(self, *, include_deleted: bool = False) -> list[bytes]:
        """The ledgers stored here, by name. A ledger whose every page is deleted is
        left out unless ``include_deleted`` (sync and check want every stored page)."""

        def scan() -> list[bytes]:
            out = []
            for p in self.ledgers_dir.iterdir():
                raw = decode_name(p.name)
                if raw is not None and p.is_dir() and encode_name(raw) == p.name:
                    out.append(raw)
            return sorted(out)

        # An evicted page has no directory: a ledger of evicted pages only may have
        # none either (the removal of a page nothing was written to drops an emptied
        # ledger directory).
        names = sorted({*await asyncio.to_thread(scan), *(k[0] for k in self._evicted)})
        if include_deleted:
            return names
        some_deleted = await usage_sql.ledgers_with_deleted(self.usage)
        some_deleted.update(k[0] for k in [*self._pages, *self._closed_deleted])
        return [n for n in names if n not in some_deleted or await self.ledger(n).pages()]

    async def _known_deleted(self, key: tuple[bytes, bytes]) -> bool | None:
        """Whether the page is deleted, when known without page_usage: an open page
        is asked (a closing one too: page_usage is written once it has closed), once
        its acknowledged writes are committed (a delete of its last key may make it
        a deleted page again); a page closed a moment ago remembered; None otherwise."""
        page = self._pages.get(key)
        if page is not None:
            if page.writer.uncommitted and not page.closed:
                with contextlib.suppress(StoreError):  # (it answers as it stands)
                    await page.flush()
            return page.deleted
        return self._closed_deleted.get(key)

    async def page_listed(self, ledger: bytes, page_id: bytes) -> bool:
        """The page is stored here and not deleted: listings show it."""
        if not self.page_exists(ledger, page_id):
            return False
        known = await self._known_deleted((ledger, page_id))
        if known is not None:
            return not known
        return not await usage_sql.is_deleted(self.usage, (ledger, page_id))

    async def ledger_listed(self, ledger: bytes) -> bool:
        """The ledger holds a page that listings show."""
        return self.ledger_exists(ledger) and bool(await self.ledger(ledger).pages())

    async def delete_page(self, ledger: bytes | str, page_id: bytes | str) -> None:
        """Delete a page: one commit that removes every entry and marks the page
        deleted (:mod:`store.page.deleted`), synced to the other devices like any commit,
        so they empty the page and leave it out of listings too. Listings here leave
        it out at once. A later write brings the page back with only the new keys.
        Raises :class:`PageNotFoundError` for a page that is not listed (never
        stored here, or deleted already). A lost page (:meth:`page_lost`) cannot be
        opened to commit that: what remains of it is removed (:meth:`_remove_lost`)."""
        led, pid = check_name(ledger, "ledger name"), check_name(page_id, "page id")
        if self.page_lost(led, pid) and await self._remove_lost(led, pid):
            return
        if not await self.page_listed(led, pid):
            if not await self.ledger_listed(led):
                raise LedgerNotFoundError(f"no ledger {named(led)}")
            raise PageNotFoundError(f"no page {named(pid)} in ledger {named(led)}")
        async with self.page(led, pid) as page:
            await page.delete_page()
            await self._record_deleted(page)

    async def _remove_lost(self, ledger: bytes, page_id: bytes) -> bool:
        """Remove what remains of a lost page (:meth:`page_lost`): its directory, the
        -wal in it, its page_usage row and its unwritten mark. No commit says it is
        deleted (the page cannot be opened), so a page the bucket holds comes back at
        the next sync. Returns False if the page is no longer lost (opened meanwhile)."""
        key = (ledger, page_id)
        async with self._no_open_of(key):
            if not self.page_lost(ledger, page_id):
                return False
            page_dir = self.page_path(ledger, page_id).parent
            left = await asyncio.to_thread(lost_leftovers, page_dir)
            await asyncio.to_thread(remove_page_dir, page_dir)
            await self._forget(key)
            self._closed_deleted.pop(key, None)
            self._marked.add(key)  # (a mark an earlier run left: dropped too)
            await self.written(ledger, page_id)
            log.warning(
                "page %s of ledger %s deleted while lost: its %s removed",
                named(page_id),
                named(ledger),
                ", ".join(left),
            )
            return True

    async def delete_ledger(self, ledger: bytes | str) -> int:
        """Delete every page of a ledger (:meth:`delete_page`, page by page: each is
        its own commit); returns how many. Raises :class:`LedgerNotFoundError` when
        the ledger has no listed page."""
        led = check_name(ledger, "ledger name")
        ids = await self.ledger(led).pages()
        if not ids:
            raise LedgerNotFoundError(f"no ledger {named(led)}")
        for pid in ids:
            async with self.page(led, pid) as page:
                await page.delete_page()
                await self._record_deleted(page)
        return len(ids)

    async def _record_deleted(self, page: Page) -> None:
        """Write down whether the page is deleted, for listings once it is closed."""
        await usage_sql.record_deleted(self.usage, (page.ledger, page.id), page.deleted)


class Ledger:
    """A namespace of pages (one per application)."""

    def __init__(self, repo: Listing, name: bytes) -> None:
        self.repo = repo
        self.name = name

    async def page(self, page_id: bytes | str | None = None) -> Page:
        """Open (creating on first use) a page; a fresh random id when none is given."""
        raw = os.urandom(PAGE_ID_SIZE) if page_id is None else check_name(page_id, "page id")
        return await self.repo.open_page(self.name, raw)

    async def delete_page(self, page_id: bytes | str) -> None:
        """Delete one page of the ledger (:meth:`Repository.delete_page`)."""
        await self.repo.delete_page(self.name, page_id)

    async def delete(self) -> int:
        """Delete every page of the ledger (:meth:`Repository.delete_ledger`)."""
        return await self.repo.delete_ledger(self.name)

    async def pages(self, *, include_deleted: bool = False) -> list[bytes]:
        """The ledger's pages, by id, evicted ones included; deleted ones are left out
        unless ``include_deleted``."""
        ids = sorted({*await self._stored(), *self.repo.evicted_pages(self.name)})
        if include_deleted:
            return ids
        marked = await usage_sql.deleted_pages(self.repo.usage, self.name)
        out = []
        for pid in ids:
            known = await self.repo._known_deleted((self.name, pid))
            if not (pid in marked if known is None else known):
                out.append(pid)
        return out

    async def lost_pages(self) -> list[bytes]:
        """The ledger's pages whose database file is gone while its -wal or -journal
        remains (:meth:`Repository.page_lost`): not in :meth:`pages`, damaged."""
        lost = await asyncio.to_thread(self._scan, is_lost)
        return [p for p in lost if self.repo.page_lost(self.name, p)]

    def _scan(self, test: Callable[[Path], bool]) -> list[bytes]:
        """The ids of the ledger's page directories that pass ``test``, in order
        (blocking)."""
        directory = self.repo.ledgers_dir / encode_name(self.name)
        if not directory.is_dir():
            return []
        out = []
        for p in directory.iterdir():
            raw = decode_name(p.name)
            if raw is not None and encode_name(raw) == p.name and test(p):
                out.append(raw)
        return sorted(out)

    async def _stored(self) -> list[bytes]:
        return await asyncio.to_thread(self._scan, lambda p: (p / "page.sqlite").exists())
