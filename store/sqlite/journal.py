"""The SQL of a page's implicit journal: appending plain writes and reading it back.

This module owns the statements :mod:`store.page.writer` runs on the ``journals``,
``journal_entries`` and ``journal_pieces`` tables: opening a journal, appending a
write's entries, staged values and pieces to it, and reading the implicit journals a
crash left. Committing or dropping a journal is :mod:`store.sqlite.sql`'s.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Mapping

from ledgerd.store.sqlite import sql
from ledgerd.store.sqlite.schema import TRANSIENT

IMPLICIT_JOURNALS = (
    "SELECT id, cleared, since FROM journals WHERE substr(id, 1, 1) = 'I' ORDER BY id"
)
"""The implicit journals (their ids start with ``I``), oldest first."""

JOURNAL_ENTRIES = "SELECT key, value, priority FROM journal_entries WHERE journal_id = ?"
"""A journal's entries: key, value digest (None: a delete) and priority."""


def open_journal(conn: sqlite3.Connection, jid: str, since: int | None) -> None:
    """A new, empty journal whose first write was acknowledged at ``since`` (µs)."""
    conn.execute("INSERT INTO journals (id, cleared, since) VALUES (?, 0, ?)", (jid, since))


def clear_journal(conn: sqlite3.Connection, jid: str) -> None:
    """The journal starts with a clear: it is marked cleared and its entries go."""
    conn.execute("UPDATE journals SET cleared = 1 WHERE id = ?", (jid,))
    conn.execute("DELETE FROM journal_entries WHERE journal_id = ?", (jid,))


def put_entries(
    conn: sqlite3.Connection, jid: str, entries: Iterable[tuple[bytes, bytes | None, int]]
) -> None:
    """Set the journal's entries ``(key, value digest or None, priority)``, each
    replacing the key's earlier one."""
    conn.executemany(
        "INSERT OR REPLACE INTO journal_entries (journal_id, key, value, priority) "
        "VALUES (?, ?, ?, ?)",
        [(jid, k, v, p) for k, v, p in entries],
    )


def adopt_staged(conn: sqlite3.Connection, jid: str, tokens: Iterable[str]) -> None:
    """The values staged under ``tokens`` now belong to the journal."""
    for t in tokens:
        sql.adopt(conn, t, jid)


def put_pieces(conn: sqlite3.Connection, jid: str, pieces: Mapping[bytes, bytes]) -> None:
    """Store the pieces (digest -> data) the journal's values hold, transient until
    committed, and list them as the journal's."""
    sql.put_pieces(conn, pieces.items(), TRANSIENT)
    conn.executemany(
        "INSERT OR IGNORE INTO journal_pieces (journal_id, digest) VALUES (?, ?)",
        [(jid, d) for d in pieces],
    )
