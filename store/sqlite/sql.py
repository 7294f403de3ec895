"""Multi-statement SQL steps shared by the page's write transactions.

This module owns small synchronous functions that run on a page database's
writer thread inside one transaction (see :meth:`store.sqlite.db.Database.run`): storing
pieces and moving their sync status, adopting staged pieces, marking a journal's
pieces local (and collecting those it no longer needs), inserting a commit and
moving heads, dropping a journal. They know the schema (:mod:`store.sqlite.schema`) and
nothing else.
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Iterable, Sequence
from typing import Protocol

from ledgerd.store.sqlite.schema import LOCAL, SYNCED, TRANSIENT, digest_is

# The joins say CROSS JOIN to fix their order (SQLite keeps it as written): from the
# few rows at hand to the pieces by key, never a scan of a large table first.
LOCAL_PIECES = (
    f"SELECT o.digest FROM unsynced u CROSS JOIN objects o ON o.id = u.id WHERE u.status = {LOCAL}"
)
"""Pieces that a commit references and that are not in the cloud yet."""

ROWS_PER_STATEMENT = 256
"""Rows one statement of :func:`put_pieces` inserts when there are many."""


@functools.lru_cache(maxsize=16)
def _insert_rows_sql(rows: int) -> str:
    """Insert those of ``rows`` (digest, data) pairs whose digest is not stored: one
    statement, the test in SQLite (no UNIQUE constraint does it: see ``objects_digest``).
    The pairs must be distinct: SQLite runs the test on every row before it inserts any."""
    values = ", ".join(["(?, ?)"] * rows)
    return (
        f"INSERT INTO objects (digest, data) SELECT column1, column2 FROM (VALUES {values}) "
        f"WHERE NOT EXISTS (SELECT 1 FROM objects WHERE {digest_is('digest', 'column1')})"
    )


@functools.cache
def _values_sql(head: str, width: int, rows: int) -> str:
    row = "(" + ", ".join("?" * width) + ")"
    return head + " VALUES " + ", ".join([row] * rows)


def insert_rows(conn: sqlite3.Connection, head: str, rows: Sequence[Sequence[object]]) -> None:
    """``head`` (``INSERT ... INTO t (a, b)``) with ``rows``, ``ROWS_PER_STATEMENT``
    rows to a statement (as :func:`put_pieces`: faster than ``executemany``, which
    steps once per row and takes the GIL back after each)."""
    if not rows:
        return
    width = len(rows[0])
    for i in range(0, len(rows), ROWS_PER_STATEMENT):
        part = rows[i : i + ROWS_PER_STATEMENT]
        conn.execute(_values_sql(head, width, len(part)), [x for row in part for x in row])


def _insert_new(conn: sqlite3.Connection, rows: Sequence[tuple[bytes, bytes]]) -> None:
    """Insert those of ``rows`` not stored (at most ``ROWS_PER_STATEMENT``) in statements
    of a power of two rows each: a few statements where executemany would step, and
    take the GIL back, row by row. Only those few sizes: a cached statement keeps the
    values last bound to it (sqlite3 never clears them), and a statement for every
    size held hundreds of MiB of a big value's chunks."""
    at, size = 0, ROWS_PER_STATEMENT
    while at < len(rows):
        while at + size > len(rows):
            size //= 2
        conn.execute(_insert_rows_sql(size), [x for row in rows[at : at + size] for x in row])
        at += size


def put_pieces(
    conn: sqlite3.Connection, pieces: Iterable[tuple[bytes, bytes]], status: int
) -> None:
    """Store ``(digest, data)`` pieces with at least ``status``: TRANSIENT for a
    journal's, LOCAL for a commit's, SYNCED for the cloud's. A piece stored already
    keeps the higher of its status and ``status``; one that ``remote_pieces`` lists
    is in the cloud already, so it is synced, and its row there is dropped.

    New pieces cost one random index insert each (four bytes of their digest) and an
    append to ``unsynced``. Many go ``ROWS_PER_STATEMENT`` to a statement: a fifth faster
    than a row per statement, and SQLite then works that long without the GIL.
    """
    rows = pieces if isinstance(pieces, list) else list(pieces)
    if not rows:
        return
    if len(rows) > 1 and len(distinct := dict(rows)) < len(rows):
        rows = list(distinct.items())  # (each digest once: see _insert_rows_sql)
    last = conn.execute("SELECT coalesce(max(id), 0) FROM objects").fetchone()[0]
    changes = conn.total_changes
    for i in range(0, len(rows), ROWS_PER_STATEMENT):
        _insert_new(conn, rows[i : i + ROWS_PER_STATEMENT])
    inserted = conn.total_changes - changes  # (no triggers) the new ones: ids above last
    if inserted and status != SYNCED:
        conn.execute(
            "INSERT INTO unsynced (id, status) SELECT id, ? FROM objects WHERE id > ?",
            (status, last),
        )
    if inserted and conn.execute("SELECT 1 FROM remote_pieces LIMIT 1").fetchone():
        new_in_cloud = (
            "SELECT o.id FROM objects o CROSS JOIN remote_pieces r ON r.digest = o.digest "
            "WHERE o.id > ?"
        )
        conn.execute(f"DELETE FROM unsynced WHERE id IN ({new_in_cloud})", (last,))
        conn.execute(
            "DELETE FROM remote_pieces WHERE digest IN (SELECT digest FROM objects WHERE id > ?)",
            (last,),
        )
    if inserted < len(rows):  # some were stored already: raise those
        if status == LOCAL:
            _make_local(conn, (d for d, _ in rows))
        elif status == SYNCED:
            mark_synced(conn, (d for d, _ in rows))


_INSERT_DELTA = (
    "INSERT INTO objects (digest, data, base, depth) "
    "SELECT ?1, ?2, b.id, coalesce(b.depth, 0) + 1 FROM objects b "
    f"WHERE {digest_is('b.digest', '?3')} AND coalesce(b.depth, 0) < ?4 "
    f"AND NOT EXISTS (SELECT 1 FROM objects WHERE {digest_is('digest', '?1')}) LIMIT 1"
)


def put_deltas(
    conn: sqlite3.Connection, rows: Iterable[tuple[bytes, bytes, bytes, bytes]], depth: int
) -> None:
    """Store tree pieces ``(digest, data, base digest, delta)`` not stored yet, each as
    its delta against the base (:mod:`store.pieces.delta`) where the base is stored and
    its chain is shorter than ``depth``, else whole. In order: a piece may be the base of
    one after it. Tree pieces are synced (they never leave the device)."""
    for digest, data, base, delta in rows:
        before = conn.total_changes
        conn.execute(_INSERT_DELTA, (digest, delta, base, depth))
        if conn.total_changes == before:  # stored already, or no base to use: whole
            conn.execute(_insert_rows_sql(1), (digest, data))


STORE_WHOLE = (
    f"UPDATE objects SET data = ?2, base = NULL, depth = NULL WHERE {digest_is('digest', '?1')}"
)
"""Store a piece ``(?1 digest, ?2 data)`` whole in its row, a delta or not."""

_BY_DIGEST = f"id IN (SELECT id FROM objects WHERE {digest_is('digest', '?1')})"


def _make_local(conn: sqlite3.Connection, digests: Iterable[bytes]) -> None:
    conn.executemany(
        f"UPDATE unsynced SET status = {LOCAL} WHERE status = {TRANSIENT} AND {_BY_DIGEST}",
        zip(digests),
    )


def mark_uploaded(conn: sqlite3.Connection, digests: Iterable[bytes]) -> None:
    """Local pieces that an upload put in the cloud become synced (narrow rows of
    ``unsynced`` are deleted; the pieces' own rows are not touched)."""
    conn.executemany(f"DELETE FROM unsynced WHERE status = {LOCAL} AND {_BY_DIGEST}", zip(digests))


def mark_synced(conn: sqlite3.Connection, digests: Iterable[bytes]) -> None:
    """These pieces are in the cloud (uploaded, or seen in a remote pack). Those
    not stored here are known through ``remote_pieces`` instead."""
    conn.executemany(f"DELETE FROM unsynced WHERE {_BY_DIGEST}", zip(digests))


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
        f"UPDATE unsynced SET status = {LOCAL} WHERE status = {TRANSIENT} AND id IN "
        "(SELECT o.id FROM journal_pieces j CROSS JOIN objects o "
        f"ON {digest_is('o.digest', 'j.digest')} "
        "WHERE j.journal_id = ?)",
        (journal_id,),
    )
    conn.execute("DELETE FROM journal_pieces WHERE journal_id = ?", (journal_id,))


def keep_journal_pieces(conn: sqlite3.Connection, journal_id: str, keep: Iterable[bytes]) -> int:
    """The journal committed: the pieces in ``keep`` (the pieces of the values its
    commit holds) become ``local`` if they were transient, also one that another
    open journal staged too (the commit references it: it must outlive that
    journal). Of the pieces the journal staged, the others (of values a later
    write in the same journal replaced) are collected. Returns how many."""
    _make_local(conn, keep)
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
    n = _delete(
        conn,
        "SELECT o.id FROM temp.gc g CROSS JOIN objects o "
        f"ON {digest_is('o.digest', 'g.digest')} "
        f"CROSS JOIN unsynced u ON u.id = o.id WHERE u.status = {TRANSIENT} "
        "AND g.digest NOT IN (SELECT digest FROM journal_pieces)",
    )
    conn.execute("DELETE FROM temp.gc")
    return n


GARBAGE = (
    f"SELECT u.id FROM unsynced u CROSS JOIN objects o ON o.id = u.id "
    f"WHERE u.status = {TRANSIENT} "
    "AND o.digest NOT IN (SELECT digest FROM journal_pieces)"
)
"""Ids of the transient pieces that no open journal stages (a scan of ``unsynced``,
not of the page)."""


def collect_garbage(conn: sqlite3.Connection) -> int:
    """Delete every transient piece that no open journal stages. Returns how many."""
    return _delete(conn, GARBAGE)


def _delete(conn: sqlite3.Connection, ids: str) -> int:
    """Delete the pieces whose ids ``ids`` (SQL) selects, with their ``unsynced`` rows."""
    conn.execute("CREATE TEMP TABLE IF NOT EXISTS gone (id INTEGER PRIMARY KEY)")
    conn.execute(f"INSERT OR IGNORE INTO temp.gone (id) {ids}")
    n = conn.execute("DELETE FROM objects WHERE id IN (SELECT id FROM temp.gone)").rowcount
    conn.execute("DELETE FROM unsynced WHERE id IN (SELECT id FROM temp.gone)")
    conn.execute("DELETE FROM temp.gone")
    return int(n)


def drop_journal(conn: sqlite3.Connection, journal_id: str) -> None:
    conn.execute("DELETE FROM journal_entries WHERE journal_id = ?", (journal_id,))
    conn.execute("DELETE FROM journals WHERE id = ?", (journal_id,))


class CommitRow(Protocol):
    """What :func:`insert_commit` stores of a commit (:class:`store.tree.commit.Commit`)."""

    @property
    def id(self) -> bytes: ...
    @property
    def data(self) -> bytes: ...
    @property
    def generation(self) -> int: ...
    @property
    def timestamp(self) -> int: ...
    @property
    def root(self) -> bytes: ...
    @property
    def parents(self) -> Sequence[bytes]: ...


def insert_commit(conn: sqlite3.Connection, c: CommitRow) -> None:
    """Store a commit and make it the head (history is a line: its parent was)."""
    conn.execute(
        "INSERT OR IGNORE INTO commits (id, data, generation, timestamp, root) "
        "VALUES (?, ?, ?, ?, ?)",
        (c.id, c.data, c.generation, c.timestamp, c.root),
    )
    conn.executemany(
        "INSERT OR IGNORE INTO commit_parents (child, parent) VALUES (?, ?)",
        [(c.id, p) for p in c.parents],
    )
    conn.execute("DELETE FROM heads")
    conn.execute("INSERT INTO heads (commit_id, timestamp) VALUES (?, ?)", (c.id, c.timestamp))
