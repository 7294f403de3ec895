"""The SQL of the document layer's local views (:mod:`store.documents.docindex`).

This module owns the statements on the ``doc_state``, ``doc_indexes`` and
``doc_index_rows`` tables (their schema and invariants are
:mod:`store.sqlite.schema`'s): reading the views' state and definitions, the range
query of an index's rows, and small synchronous steps that run on a page
database's writer thread inside one transaction (see
:meth:`store.sqlite.db.Database.run`). What the rows and keys mean is
:mod:`store.documents.docindex`'s.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence

from ledgerd.store.sqlite import sql

STATE = "SELECT name, value FROM doc_state"
"""The views' state: (name, value) rows (``reflected``, ``max_rev``, ``key_format``)."""

INDEXES = "SELECT id, collection, name, definition, ready FROM doc_indexes"
"""The indexes this device keeps."""

INSERT_ROWS = "INSERT OR REPLACE INTO doc_index_rows (ix, doc, key, deleted)"

_PUT_STATE = "INSERT OR REPLACE INTO doc_state (name, value) VALUES (?, ?)"


def rows_query(*, below: bool, after: bool, include_deleted: bool) -> str:
    """The query of an index's rows, in (key, doc) order; its parameters: the index,
    the lowest key, the key ``below`` which rows stop (if), the (key, doc) ``after``
    which they start (if), and the limit."""
    query = "SELECT doc, key FROM doc_index_rows WHERE ix = ? AND key >= ?"
    if below:
        query += " AND key < ?"
    if after:
        query += " AND (key, doc) > (?, ?)"
    if not include_deleted:
        query += " AND deleted = 0"
    return query + " ORDER BY key, doc LIMIT ?"


def clear(conn: sqlite3.Connection) -> None:
    """Forget the views' state, indexes and rows."""
    conn.execute("DELETE FROM doc_state")
    conn.execute("DELETE FROM doc_index_rows")
    conn.execute("DELETE FROM doc_indexes")


def new_key_format(conn: sqlite3.Connection, key_format: bytes) -> None:
    """Every index is to be built again, its rows packed as ``key_format`` says."""
    conn.execute("UPDATE doc_indexes SET ready = 0")
    conn.execute(_PUT_STATE, ("key_format", key_format))


def put_state(conn: sqlite3.Connection, state: Iterable[tuple[str, bytes]]) -> None:
    """Store (name, value) pairs of the views' state."""
    conn.executemany(_PUT_STATE, state)


def drop_indexes(conn: sqlite3.Connection, ixs: Iterable[int]) -> None:
    """Remove the indexes ``ixs`` and their rows."""
    for ix in ixs:
        conn.execute("DELETE FROM doc_index_rows WHERE ix = ?", (ix,))
        conn.execute("DELETE FROM doc_indexes WHERE id = ?", (ix,))


def add_indexes(conn: sqlite3.Connection, defs: Iterable[tuple[str, str, bytes]]) -> list[int]:
    """Add indexes (collection, name, definition), not ready; their row ids."""
    ids = []
    for d in defs:
        cur = conn.execute(
            "INSERT INTO doc_indexes (collection, name, definition, ready) VALUES (?, ?, ?, 0)", d
        )
        assert cur.lastrowid is not None
        ids.append(cur.lastrowid)
    return ids


def mark_ready(conn: sqlite3.Connection, ix: int) -> None:
    """Index ``ix``'s rows reflect the views' state: it is built."""
    conn.execute("UPDATE doc_indexes SET ready = 1 WHERE id = ?", (ix,))


def write_rows(
    conn: sqlite3.Connection,
    drop: Sequence[tuple[int, object]],
    put: Sequence[tuple[int, object, bytes | None, bool]],
) -> None:
    """Delete the rows (index, doc) ``drop``; insert or replace the rows
    (index, doc, key, deleted) ``put``."""
    conn.executemany("DELETE FROM doc_index_rows WHERE ix = ? AND doc = ?", drop)
    sql.insert_rows(conn, INSERT_ROWS, put)
