"""A repository's small named values, its device id, and when its pages were used.

This module owns what the repository answers from ``page_usage.sqlite`` without
opening a page: the named values sync keeps its cursors in, the device id, and
when each page was last closed.
"""

from __future__ import annotations

from ledgerd.store.repo.layout import check_name
from ledgerd.store.repo.state import RepositoryState
from ledgerd.store.sqlite import usage as usage_sql


class Metas(RepositoryState):
    """Named values and page usage, read from the usage database."""

    async def _load_device_id(self) -> None:
        self.device_id = await usage_sql.device_id(self.usage)

    async def get_meta(self, name: str) -> bytes | None:
        """A small named value of the repository (sync keeps its cursors here)."""
        return await usage_sql.get_value(self.usage, name)

    async def metas(self, prefix: str) -> dict[str, bytes]:
        """The named values whose names start with ``prefix``."""
        return await usage_sql.values(self.usage, prefix)

    async def set_meta(self, name: str, value: bytes) -> None:
        await usage_sql.set_values(self.usage, {name: value})

    async def delete_meta(self, name: str) -> None:
        await usage_sql.set_values(self.usage, {name: None})

    async def set_metas(self, values: dict[str, bytes | None]) -> None:
        """Set (or, for None, delete) several named values in one transaction."""
        if not values:
            return
        await usage_sql.set_values(self.usage, values)

    async def usage_of(self, ledger: bytes | str, page_id: bytes | str) -> int | None:
        """When the page was last closed (UNIX ms), 0 while open, None if unknown."""
        key = (check_name(ledger, "ledger name"), check_name(page_id, "page id"))
        return await usage_sql.closed_at(self.usage, key)

    async def pages_used_since(self, since_ms: int) -> list[tuple[bytes, bytes]]:
        """(ledger, page id) of the pages open now, or left open by a crash, or closed
        at or after ``since_ms`` (UNIX ms): those that can have changed since then.
        One query on ``page_usage``; no page is opened."""
        return await usage_sql.used_since(self.usage, since_ms)
