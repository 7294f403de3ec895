"""The SQL of a page's named rows: ``page_metadata`` and ``sync_metadata``, the
``conflicts`` table, and a look at a closed page's sync state.

This module owns the statements on those tables that the page's parts (merge
policy, retention, sync markers, conflicts) and eviction run (synchronous
functions, run through :meth:`store.sqlite.db.Database.run` or on a connection of
their own); what the rows mean is their owners'.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ledgerd.store.sqlite.db import file_uri
from ledgerd.store.sqlite.schema import CONTEXT_ROW, UPLOADED_ROW

_SET_PAGE = "INSERT OR REPLACE INTO page_metadata (name, value) VALUES (?, ?)"
_SET_SYNC = "INSERT OR REPLACE INTO sync_metadata (name, value) VALUES (?, ?)"


def set_page_value(conn: sqlite3.Connection, name: str, value: bytes | None) -> None:
    """Set (None: delete) a row of ``page_metadata``."""
    if value is None:
        conn.execute("DELETE FROM page_metadata WHERE name = ?", (name,))
    else:
        conn.execute(_SET_PAGE, (name, value))


def set_sync_values(conn: sqlite3.Connection, rows: Iterable[tuple[str, bytes]]) -> None:
    """Set rows of ``sync_metadata``."""
    conn.executemany(_SET_SYNC, rows)


def drop_imported_markers(conn: sqlite3.Connection) -> None:
    """Delete the ``imported/`` markers of ``sync_metadata``."""
    conn.execute("DELETE FROM sync_metadata WHERE name LIKE 'imported/%'")


def settle_conflicts(
    conn: sqlite3.Connection, settled: Iterable[bytes], conflicted: Iterable[bytes]
) -> int:
    """Drop the ``settled`` keys from ``conflicts`` and add the ``conflicted`` ones;
    returns how many keys are in conflict now."""
    conn.executemany("DELETE FROM conflicts WHERE key = ?", ((k,) for k in settled))
    conn.executemany("INSERT INTO conflicts (key) VALUES (?)", ((k,) for k in conflicted))
    return int(conn.execute("SELECT count(*) FROM conflicts").fetchone()[0])


def clear_conflicts(conn: sqlite3.Connection) -> None:
    conn.execute("DELETE FROM conflicts")


@dataclass(frozen=True, slots=True)
class SyncState:
    """What a closed page's database says of its sync (:func:`read_sync_state`)."""

    open_journals: int
    heads: list[bytes]
    context: bytes | None
    """The page's encoded context (``CONTEXT_ROW``), if any."""
    uploaded: bytes | None
    """``UPLOADED_ROW`` of ``sync_metadata``, if any."""


def read_sync_state(path: Path) -> SyncState:
    """Read a closed page's sync state in one read transaction, on a connection of its
    own (blocking)."""
    conn = sqlite3.connect(file_uri(path, "ro"), uri=True, isolation_level=None)
    try:
        conn.execute("BEGIN")
        journals = int(conn.execute("SELECT count(*) FROM journals").fetchone()[0])
        heads = [bytes(r[0]) for r in conn.execute("SELECT commit_id FROM heads")]
        ctx = conn.execute("SELECT value FROM page_metadata WHERE name = ?", (CONTEXT_ROW,))
        row = ctx.fetchone()
        up = conn.execute("SELECT value FROM sync_metadata WHERE name = ?", (UPLOADED_ROW,))
        uploaded = up.fetchone()
        conn.execute("COMMIT")
    finally:
        conn.close()
    return SyncState(
        journals,
        heads,
        None if row is None else bytes(row[0]),
        None if uploaded is None else bytes(uploaded[0]),
    )
