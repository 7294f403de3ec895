"""Multi-statement SQL steps shared by the page's write transactions.

This module owns small synchronous functions that run on a page database's
writer thread inside one transaction (see :meth:`store.db.Database.run`): adopting
staged pieces, marking a journal's pieces local (and collecting those it no
longer needs), inserting a commit and moving heads, dropping a journal. They know
the schema (:mod:`store.schema`) and nothing else.
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Iterable

from store.commit import Commit
from store.schema import LOCAL, SYNCED, TRANSIENT

# Both go through the partial index objects_unsynced (whose condition they repeat),
# not through a scan of every piece of the page.
LOCAL_PIECES = (
    f"SELECT digest FROM objects WHERE status < {SYNCED} AND status = {LOCAL} AND data IS NOT NULL"
)
"""Pieces that a commit references and that are not in the cloud yet."""
DELETE_GARBAGE = (
    f"DELETE FROM objects WHERE status < {SYNCED} AND status = {TRANSIENT} "
    "AND digest NOT IN (SELECT digest FROM journal_pieces)"
)
"""Delete every transient piece that no open journal stages."""


def put_pieces_sql(status: int) -> str:
    """The statement of :func:`put_pieces`, for ``executemany`` over ``(digest, data)``."""
    return (
        f"INSERT INTO objects (digest, data, status) VALUES (?, ?, {int(status)}) "
        "ON CONFLICT (digest) DO UPDATE SET "
        "status = max(status, excluded.status), data = coalesce(data, excluded.data) "
        "WHERE status < excluded.status OR (data IS NULL AND excluded.data IS NOT NULL)"
    )


ROWS_PER_STATEMENT = 256
"""Rows one statement of :func:`put_pieces` inserts when there are many."""


@functools.cache
def _put_rows_sql(status: int, rows: int) -> str:
    one = put_pieces_sql(status)
    head, tail = one.split(" ON CONFLICT ", 1)
    row = head[head.index("VALUES ") + len("VALUES ") :]
    return f"{head}{f', {row}' * (rows - 1)} ON CONFLICT {tail}"


def put_pieces(
    conn: sqlite3.Connection, pieces: Iterable[tuple[bytes, bytes | None]], status: int
) -> None:
    """Store ``(digest, data)`` pieces with at least ``status`` (TRANSIENT for a
    journal's, LOCAL for a commit's, SYNCED for the cloud's). A piece already known
    keeps the higher status and gains its data if it had none; ``data`` may be None
    only with SYNCED (a piece known to be in the cloud, not fetched).

    Many pieces go ``ROWS_PER_STATEMENT`` to a statement: a fifth faster than a row
    per statement, and SQLite then works that long without Python's GIL.
    """
    rows = pieces if isinstance(pieces, list) else list(pieces)
    full = len(rows) - len(rows) % ROWS_PER_STATEMENT
    if full:
        statement = _put_rows_sql(status, ROWS_PER_STATEMENT)
        for i in range(0, full, ROWS_PER_STATEMENT):
            conn.execute(statement, [x for row in rows[i : i + ROWS_PER_STATEMENT] for x in row])
    if full < len(rows):
        conn.executemany(put_pieces_sql(status), rows[full:])


def store_fetched(conn: sqlite3.Connection, pieces: dict[bytes, bytes]) -> None:
    """Pieces fetched from the cloud: stored, synced, and no longer to be located there."""
    put_pieces(conn, pieces.items(), SYNCED)
    conn.executemany("DELETE FROM remote_pieces WHERE digest = ?", zip(pieces))


def mark_uploaded(conn: sqlite3.Connection, digests: Iterable[bytes]) -> None:
    """Local pieces that an upload put in the cloud become synced.

    The rows change in the order they are stored in (through objects_unsynced), not
    in the digests' random order: a large upload then writes each page of the
    table once, instead of again whenever the page cache spilled it meanwhile.
    """
    conn.execute("CREATE TEMP TABLE IF NOT EXISTS uploaded (digest BLOB PRIMARY KEY)")
    conn.executemany("INSERT OR IGNORE INTO temp.uploaded (digest) VALUES (?)", zip(digests))
    conn.execute(
        f"UPDATE objects SET status = {SYNCED} WHERE status < {SYNCED} AND status = {LOCAL} "
        "AND digest IN (SELECT digest FROM temp.uploaded)"
    )
    conn.execute("DELETE FROM temp.uploaded")


def mark_synced(conn: sqlite3.Connection, digests: Iterable[bytes]) -> None:
    """These pieces are in the cloud (uploaded, or seen in a remote pack)."""
    put_pieces(conn, ((d, None) for d in digests), SYNCED)


def adopt(conn: sqlite3.Connection, token: str, journal_id: str) -> None:
    """Move pieces staged under ``token`` to ``journal_id``."""
    conn.execute(
        "INSERT OR IGNORE INTO journal_pieces (journal_id, digest) "
        "SELECT ?, digest FROM journal_pieces WHERE journal_id = ?",
        (journal_id, token),
    )
    conn.execute("DELETE FROM journal_pieces WHERE journal_id = ?", (token,))


def mark_local(conn: sqlite3.Connection, journal_id: str) -> None:
    """The journal committed: its pieces become ``local`` and stop being staged."""
    conn.execute(
        f"UPDATE objects SET status = {LOCAL} WHERE status = {TRANSIENT} "
        f"AND digest IN (SELECT digest FROM journal_pieces WHERE journal_id = ?)",
        (journal_id,),
    )
    conn.execute("DELETE FROM journal_pieces WHERE journal_id = ?", (journal_id,))


def keep_journal_pieces(conn: sqlite3.Connection, journal_id: str, keep: Iterable[bytes]) -> int:
    """The journal committed: the pieces in ``keep`` (the pieces of the values its
    commit holds) become ``local`` if they were transient, also one that another
    open journal staged too (the commit references it: it must outlive that
    journal). Of the pieces the journal staged, the others (of values a later
    write in the same journal replaced) are collected. Returns how many."""
    conn.executemany(
        f"UPDATE objects SET status = {LOCAL} WHERE digest = ? AND status = {TRANSIENT}",
        [(d,) for d in keep],
    )
    return collect(conn, "journal_id = ?", (journal_id,))


def collect(conn: sqlite3.Connection, journals: str, params: tuple[object, ...]) -> int:
    """Drop the journals matching ``journals`` (SQL over ``journal_id``) and the
    pieces only they staged (still transient, staged by no other journal). Returns
    how many."""
    conn.execute("CREATE TEMP TABLE IF NOT EXISTS gc (digest BLOB PRIMARY KEY)")
    conn.execute(
        f"INSERT OR IGNORE INTO temp.gc SELECT digest FROM journal_pieces WHERE {journals}",
        params,
    )
    conn.execute(f"DELETE FROM journal_pieces WHERE {journals}", params)
    # Pieces by key, not by a scan of the page; the journal_pieces of the journals
    # still open are few.
    cur = conn.execute(
        f"DELETE FROM objects WHERE status = {TRANSIENT} AND digest IN (SELECT g.digest "
        "FROM temp.gc g WHERE g.digest NOT IN (SELECT digest FROM journal_pieces))"
    )
    conn.execute("DELETE FROM temp.gc")
    return int(cur.rowcount)


def drop_journal(conn: sqlite3.Connection, journal_id: str) -> None:
    conn.execute("DELETE FROM journal_entries WHERE journal_id = ?", (journal_id,))
    conn.execute("DELETE FROM journals WHERE id = ?", (journal_id,))


def insert_commit(conn: sqlite3.Connection, c: Commit, *, unsynced: bool = True) -> None:
    """Store a commit; its parents stop being heads; it becomes one unless it has a child."""
    conn.execute(
        "INSERT OR IGNORE INTO commits (id, data, generation, timestamp, root) "
        "VALUES (?, ?, ?, ?, ?)",
        (c.id, c.data, c.generation, c.timestamp, c.root),
    )
    conn.executemany(
        "INSERT OR IGNORE INTO commit_parents (child, parent) VALUES (?, ?)",
        [(c.id, p) for p in c.parents],
    )
    conn.executemany("DELETE FROM heads WHERE commit_id = ?", [(p,) for p in c.parents])
    # A commit that already has a child is not a head (it arrived after the child).
    if (
        conn.execute("SELECT 1 FROM commit_parents WHERE parent = ? LIMIT 1", (c.id,)).fetchone()
        is None
    ):
        conn.execute(
            "INSERT OR IGNORE INTO heads (commit_id, timestamp) VALUES (?, ?)", (c.id, c.timestamp)
        )
    if unsynced:
        conn.execute(
            "INSERT OR IGNORE INTO unsynced_commits (commit_id, generation) VALUES (?, ?)",
            (c.id, c.generation),
        )
