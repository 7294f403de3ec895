"""The SQL of the repository-wide ``page_usage.sqlite`` (its schema: :mod:`store.sqlite.schema`).

This module owns the statements on the usage database: each page's row in
``page_usage`` (when it was last closed, whether it is evicted or deleted) and the
small named values of ``repository`` (the device id, sync's cursors). It knows the
schema and nothing of what the repository does with the rows.
"""

from __future__ import annotations

import os

from ledgerd.store.sqlite.db import Database
from ledgerd.store.sqlite.threads import Connection

Key = tuple[bytes, bytes]
"""(ledger, page id)."""

_SET_VALUE = "INSERT OR REPLACE INTO repository (name, value) VALUES (?, ?)"
_DELETE_VALUE = "DELETE FROM repository WHERE name = ?"


# -- named values ---------------------------------------------------------------------------


async def device_id(usage: Database) -> bytes:
    """The device id, chosen at random and kept on first use."""
    rows = await usage.read_all("SELECT value FROM repository WHERE name = 'device_id'")
    if rows:
        return bytes(rows[0][0])
    async with usage.write() as conn:
        await conn.execute(
            "INSERT OR IGNORE INTO repository (name, value) VALUES ('device_id', ?)",
            (os.urandom(16),),
        )
    rows = await usage.read_all("SELECT value FROM repository WHERE name = 'device_id'")
    return bytes(rows[0][0])


async def get_value(usage: Database, name: str) -> bytes | None:
    rows = await usage.read_all("SELECT value FROM repository WHERE name = ?", (name,))
    return bytes(rows[0][0]) if rows else None


async def values(usage: Database, prefix: str) -> dict[str, bytes]:
    """The named values whose names start with ``prefix``."""
    rows = await usage.read_all(
        "SELECT name, value FROM repository WHERE name >= ? AND name < ?",
        (prefix, prefix + "\U0010ffff"),
    )
    return {str(n): bytes(v) for n, v in rows}


async def set_values(usage: Database, items: dict[str, bytes | None]) -> None:
    """Set (or, for None, delete) the named values in one transaction."""
    async with usage.write() as conn:
        for name, value in items.items():
            if value is None:
                await conn.execute(_DELETE_VALUE, (name,))
            else:
                await conn.execute(_SET_VALUE, (name, value))


# -- page_usage -----------------------------------------------------------------------------


async def closed_at(usage: Database, key: Key) -> int | None:
    """When the page was last closed (UNIX ms), 0 while open, None if unknown."""
    rows = await usage.read_all(
        "SELECT closed_at FROM page_usage WHERE ledger = ? AND page = ?", key
    )
    return int(rows[0][0]) if rows else None


async def used_since(usage: Database, since_ms: int) -> list[Key]:
    """The pages open (or left open by a crash), or closed at or after ``since_ms``."""
    rows = await usage.read_all(
        "SELECT ledger, page FROM page_usage WHERE closed_at = 0 OR closed_at >= ?",
        (since_ms,),
    )
    return [(bytes(r[0]), bytes(r[1])) for r in rows]


async def closed_pages(usage: Database) -> list[tuple[bytes, bytes, int]]:
    """(ledger, page id, closed_at) of the closed pages not evicted, oldest first."""
    rows = await usage.read_all(
        "SELECT ledger, page, closed_at FROM page_usage WHERE closed_at > 0 AND evicted = 0 "
        "ORDER BY closed_at"
    )
    return [(bytes(a), bytes(b), int(c)) for a, b, c in rows]


async def evicted(usage: Database) -> list[tuple[Key, int, int]]:
    """The evicted pages: their ``evicted`` kind and ``written`` time."""
    rows = await usage.read_all(
        "SELECT ledger, page, evicted, written FROM page_usage WHERE evicted != 0"
    )
    return [((bytes(a), bytes(b)), int(c), int(d)) for a, b, c, d in rows]


async def mark_evicted(
    usage: Database, key: Key, kind: int, written: int, now_ms: int, *, only_unset: bool
) -> None:
    """Record that the page is evicted (``only_unset``: unless it says so already)."""
    async with usage.write() as conn:
        await conn.execute(
            "INSERT OR IGNORE INTO page_usage (ledger, page, closed_at) VALUES (?, ?, ?)",
            (*key, now_ms),
        )
        where = " AND evicted = 0" if only_unset else ""
        await conn.execute(
            f"UPDATE page_usage SET evicted = ?, written = ? WHERE ledger = ? AND page = ?{where}",
            (kind, written, *key),
        )


async def record_open(usage: Database, key: Key) -> None:
    """The page is open (closed_at 0), and not evicted."""
    async with usage.write() as conn:
        await conn.execute(
            "INSERT INTO page_usage (ledger, page, closed_at) VALUES (?, ?, 0) "
            "ON CONFLICT (ledger, page) DO UPDATE SET closed_at = 0, evicted = 0",
            key,
        )


async def record_close(conn: Connection, key: Key, now_ms: int, deleted: bool) -> None:
    """The page closed at ``now_ms`` (in the caller's write transaction)."""
    await conn.execute(
        "UPDATE page_usage SET closed_at = ?, deleted = ? WHERE ledger = ? AND page = ?",
        (now_ms, int(deleted), *key),
    )


async def record_deleted(usage: Database, key: Key, deleted: bool) -> None:
    async with usage.write() as conn:
        await conn.execute(
            "UPDATE page_usage SET deleted = ? WHERE ledger = ? AND page = ?",
            (int(deleted), *key),
        )


async def forget(usage: Database, key: Key) -> None:
    """Drop the page's row."""
    async with usage.write() as conn:
        await conn.execute("DELETE FROM page_usage WHERE ledger = ? AND page = ?", key)


async def is_deleted(usage: Database, key: Key) -> bool:
    rows = await usage.read_all("SELECT deleted FROM page_usage WHERE ledger = ? AND page = ?", key)
    return bool(rows and rows[0][0])


async def deleted_pages(usage: Database, ledger: bytes) -> set[bytes]:
    rows = await usage.read_all(
        "SELECT page FROM page_usage WHERE ledger = ? AND deleted = 1", (ledger,)
    )
    return {bytes(r[0]) for r in rows}


async def ledgers_with_deleted(usage: Database) -> set[bytes]:
    rows = await usage.read_all("SELECT DISTINCT ledger FROM page_usage WHERE deleted = 1")
    return {bytes(r[0]) for r in rows}


async def truncate_wal(usage: Database) -> None:
    """Fold the WAL back into the database and empty it."""
    await usage.run(lambda conn: conn.execute("PRAGMA wal_checkpoint(TRUNCATE)"))
