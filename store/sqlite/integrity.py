"""The SQL of a page's integrity check and of the repairs that need only the page.

This module owns the statements :mod:`store.page.check` runs: SQLite's own integrity
check, the scan of stored pieces, the one read transaction over the page's small tables
(:class:`Tables`), the queries of the tree walk, and the writes of the local repairs. Each
function runs on a page database's thread (:meth:`store.sqlite.db.Database.run`); what a
row means for the page's health is the check's business, not this module's.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ledgerd.store.sqlite import sql
from ledgerd.store.sqlite.schema import (
    CHAIN_IN,
    DIGEST_IN,
    DIGEST_KEY,
    LOCAL,
    SYNCED,
    TRANSIENT,
    UPLOADED_AT_ROW,
    UPLOADED_ROW,
    chain_of,
    digest_is,
)

_THIS_DIGEST = digest_is("digest", "?1")
"""A piece by the statement's first parameter, through ``objects_digest``."""

PIECE_STATUS = (
    "SELECT o.digest, coalesce(u.status, 2) FROM objects o LEFT JOIN unsynced u "
    f"ON u.id = o.id WHERE {DIGEST_IN} "
    "UNION ALL SELECT digest, -1 FROM remote_pieces WHERE digest IN ({marks})"
)
"""For :meth:`store.sqlite.db.Database.read_in`: the status of each stored
piece named (2, synced, when it has no ``unsynced`` row), and -1 for each known as remote."""

PIECE_DATA = CHAIN_IN
"""For :meth:`store.sqlite.db.Database.read_in`: the chains of the stored pieces named
(:func:`store.sqlite.schema.chain_of`)."""

DUPLICATES = (
    f"SELECT digest FROM objects WHERE {DIGEST_KEY} IN "
    f"(SELECT {DIGEST_KEY} FROM objects GROUP BY 1 HAVING count(*) > 1) "
    "GROUP BY digest HAVING count(*) > 1"
)
"""Digests with more than one row: the inner query walks ``objects_digest`` in order
(no sort), so it costs a scan of the index, and only prefixes found twice are read."""

JOURNAL_VALUES = "SELECT value FROM journal_entries WHERE value IS NOT NULL"
"""The value digests of every open journal's entries."""

SYNCED_PIECES = (
    "SELECT o.digest FROM objects o WHERE NOT EXISTS "
    "(SELECT 1 FROM unsynced u WHERE u.id = o.id) "
    "UNION SELECT digest FROM remote_pieces"
)
"""Stored pieces without an ``unsynced`` row, and pieces known only as remote."""


def integrity_lines(conn: sqlite3.Connection, most: int) -> list[str]:
    """SQLite's ``PRAGMA integrity_check``: ``["ok"]``, or up to ``most`` problems."""
    rows = conn.execute(f"PRAGMA integrity_check({int(most)})").fetchall()
    return [str(r[0]) for r in rows]


def pieces_after(conn: sqlite3.Connection, after: int, most: int) -> tuple[list[Any], list[Any]]:
    """Up to ``most`` rows ``(id, digest, data)`` of stored pieces, of ids past ``after``,
    in one read transaction with the chains (:func:`store.sqlite.schema.chain_of`) of
    those among them stored as deltas, whose data is a delta."""
    conn.execute("BEGIN")
    try:
        rows = conn.execute(
            "SELECT id, digest, data, base IS NOT NULL FROM objects WHERE id > ? "
            "ORDER BY id LIMIT ?",
            (after, most),
        ).fetchall()
        ids = [r[0] for r in rows if r[3]]
        chains: list[Any] = []
        for i in range(0, len(ids), 400):
            part = ids[i : i + 400]
            where = f"id IN ({','.join('?' * len(part))})"
            chains.extend(conn.execute(chain_of(where), part).fetchall())
        return [r[:3] for r in rows], chains
    finally:
        conn.execute("COMMIT")


@dataclass
class Tables:
    """The page's small tables, read in one read transaction."""

    commits: list[tuple[Any, ...]]
    """(id, data, generation, timestamp, root): the last three as stored, whatever
    their type."""
    parents: set[tuple[bytes, bytes]]
    heads: set[bytes]
    dangling_unsynced: int
    stale_remote: list[bytes]
    duplicates: list[bytes]
    """Digests stored in more than one ``objects`` row (no constraint forbids it since
    schema version 2; :func:`store.sqlite.sql.put_pieces` never makes one)."""
    journals: set[str]
    journal_values: list[tuple[Any, ...]]
    orphan_entries: list[str]
    pruned: set[bytes]
    mistyped: dict[str, int]
    """Rows left out of the lists above, by table: their columns hold the wrong types."""


class _TypedRows:
    """Reads rows whose columns hold the types given (``object``: any), counting the
    others in ``mistyped``: the tables are not STRICT, so a damaged row may hold anything."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.mistyped: dict[str, int] = {}

    def __call__(self, table: str, query: str, *types: type) -> list[tuple[Any, ...]]:
        good = []
        for row in self.conn.execute(query):
            if all(isinstance(v, t) for v, t in zip(row, types, strict=True)):
                good.append(tuple(row))
            else:
                self.mistyped[table] = self.mistyped.get(table, 0) + 1
        return good


def read_tables(conn: sqlite3.Connection) -> Tables:
    """The page's commits, heads, journals and sync bookkeeping, in one read transaction."""
    conn.execute("BEGIN")
    try:
        rows = _TypedRows(conn)
        # A commit's other columns are compared with its data as they are.
        commits = rows(
            "commits",
            "SELECT id, data, generation, timestamp, root FROM commits",
            *(bytes, bytes, object, object, object),
        )
        parents = set(rows("commit_parents", "SELECT * FROM commit_parents", bytes, bytes))
        heads = {r[0] for r in rows("heads", "SELECT commit_id FROM heads", bytes)}
        journal_values = rows(
            "journal_entries",
            "SELECT journal_id, key, value FROM journal_entries WHERE value IS NOT NULL",
            *(str, bytes, bytes),
        )
        pruned = {
            r[0] for r in rows("pruned_commits", "SELECT commit_id FROM pruned_commits", bytes)
        }
        return Tables(
            commits=commits,
            parents=parents,
            heads=heads,
            dangling_unsynced=int(
                conn.execute(
                    "SELECT count(*) FROM unsynced u WHERE NOT EXISTS "
                    "(SELECT 1 FROM objects o WHERE o.id = u.id)"
                ).fetchone()[0]
            ),
            stale_remote=[
                bytes(r[0])
                for r in conn.execute(
                    "SELECT r.digest FROM remote_pieces r CROSS JOIN objects o "
                    f"ON {digest_is('o.digest', 'r.digest')}"
                )
            ],
            duplicates=[bytes(r[0]) for r in conn.execute(DUPLICATES) if isinstance(r[0], bytes)],
            journals={str(r[0]) for r in conn.execute("SELECT id FROM journals")},
            journal_values=journal_values,
            orphan_entries=[
                str(r[0])
                for r in conn.execute(
                    "SELECT DISTINCT journal_id FROM journal_entries WHERE journal_id NOT IN "
                    "(SELECT id FROM journals)"
                )
            ],
            pruned=pruned,
            mistyped=rows.mistyped,
        )
    finally:
        conn.execute("COMMIT")


def read_history(conn: sqlite3.Connection) -> tuple[list[Any], list[Any], list[Any]]:
    """In one read transaction: the rows ``(child, parent)`` of ``commit_parents``,
    ``(id, root)`` of every commit not pruned, and ``(commit_id,)`` of ``heads``."""
    conn.execute("BEGIN")
    try:
        edges = conn.execute("SELECT child, parent FROM commit_parents").fetchall()
        roots = conn.execute(
            "SELECT id, root FROM commits WHERE id NOT IN (SELECT commit_id FROM pruned_commits)"
        ).fetchall()
        heads = conn.execute("SELECT commit_id FROM heads").fetchall()
    finally:
        conn.execute("COMMIT")
    return edges, roots, heads


# -- repairs (inside a write transaction) ---------------------------------------------


def restore_pieces(conn: sqlite3.Connection, good: dict[bytes, bytes]) -> None:
    """Store verified pieces from the cloud: a stored row gets the right bytes, a missing
    piece is inserted; both are ``synced``."""
    conn.executemany(sql.STORE_WHOLE, good.items())
    sql.put_pieces(conn, list(good.items()), SYNCED)
    sql.mark_synced(conn, good)


def drop_pieces(conn: sqlite3.Connection, digests: Sequence[bytes]) -> list[bytes]:
    """Delete these stored pieces, the deltas made against them down their chains (they
    cannot be read without them, even those that copy only sound bytes), and their
    ``unsynced`` rows; the digests of every piece deleted."""
    conn.execute("CREATE TEMP TABLE IF NOT EXISTS dropped (id INTEGER PRIMARY KEY)")
    conn.executemany(
        f"INSERT OR IGNORE INTO temp.dropped (id) SELECT id FROM objects WHERE {_THIS_DIGEST}",
        [(d,) for d in digests],
    )
    # Down the chains: a scan of objects per link (no index on base: repairs are rare).
    conn.execute(
        "INSERT OR IGNORE INTO temp.dropped (id) WITH RECURSIVE down(id) AS "
        "(SELECT id FROM temp.dropped UNION SELECT o.id FROM down CROSS JOIN objects o "
        "ON o.base = down.id) SELECT id FROM down"
    )
    gone = [
        bytes(r[0])
        for r in conn.execute(
            "SELECT o.digest FROM temp.dropped d CROSS JOIN objects o ON o.id = d.id"
        )
    ]
    conn.execute("DELETE FROM unsynced WHERE id IN (SELECT id FROM temp.dropped)")
    conn.execute("DELETE FROM objects WHERE id IN (SELECT id FROM temp.dropped)")
    conn.execute("DELETE FROM temp.dropped")
    return gone


def prune_commits(conn: sqlite3.Connection, commits: Iterable[bytes]) -> None:
    """Mark these commits pruned (their rows stay, their trees no longer count)."""
    conn.executemany(
        "INSERT OR IGNORE INTO pruned_commits (commit_id) VALUES (?)", [(c,) for c in commits]
    )


def requeue_pieces(
    conn: sqlite3.Connection, digests: Iterable[bytes], uploaded_upto: int | None
) -> list[bytes]:
    """Make the stored pieces among ``digests`` ``local`` again (and, with
    ``uploaded_upto``, the page's writes after it to upload again); those requeued."""
    done = []
    for d in digests:
        row = conn.execute(f"SELECT id FROM objects WHERE {_THIS_DIGEST}", (d,)).fetchone()
        if row is None:
            continue
        conn.execute(
            "INSERT INTO unsynced (id, status) VALUES (?, ?) "
            "ON CONFLICT (id) DO UPDATE SET status = max(status, excluded.status)",
            (row[0], LOCAL),
        )
        done.append(d)
    if uploaded_upto is not None:
        conn.execute(
            "INSERT OR REPLACE INTO sync_metadata (name, value) VALUES (?, ?)",
            (UPLOADED_ROW, str(uploaded_upto).encode()),
        )
        conn.execute("DELETE FROM sync_metadata WHERE name = ?", (UPLOADED_AT_ROW,))
    return done


def drop_duplicates(conn: sqlite3.Connection, digests: Sequence[bytes]) -> None:
    """Keep one row of each digest stored twice or more (the first stored): the others
    go with their ``unsynced`` rows, and the one kept is ``local`` if any was (uploading
    a piece again is harmless; not uploading one is not)."""
    for d in digests:
        ids = [
            int(r[0])
            for r in conn.execute(f"SELECT id FROM objects WHERE {_THIS_DIGEST} ORDER BY id", (d,))
        ]
        if len(ids) < 2:
            continue
        keep, extra = ids[0], ids[1:]
        marks = ",".join("?" * len(extra))
        local = conn.execute(
            f"SELECT 1 FROM unsynced WHERE id IN ({marks}) AND status = {LOCAL}", extra
        ).fetchone()
        conn.execute(f"DELETE FROM unsynced WHERE id IN ({marks})", extra)
        conn.execute(f"DELETE FROM objects WHERE id IN ({marks})", extra)
        # (a scan: repairs are rare) deltas against a row dropped use the one kept, one
        # link deeper or shallower than before (their own deltas' depths stay: reads
        # follow up to schema.CHAIN_LIMIT rows, and depth only bounds new chains)
        conn.execute(
            f"UPDATE objects SET base = ?1, depth = 1 + coalesce((SELECT depth FROM objects "
            f"WHERE id = ?1), 0) WHERE base IN ({','.join(['?'] * len(extra))})",
            [keep, *extra],
        )
        if local:
            conn.execute(
                "INSERT INTO unsynced (id, status) VALUES (?, ?) "
                "ON CONFLICT (id) DO UPDATE SET status = max(status, excluded.status)",
                (keep, LOCAL),
            )


def repair_rows(
    conn: sqlite3.Connection,
    transient: Sequence[bytes],
    remote: Sequence[bytes],
    heads: bool,
    duplicates: Sequence[bytes] = (),
) -> None:
    """The local repairs: ``transient`` pieces become local, the ``remote`` rows of stored
    pieces go, ``unsynced`` rows of no piece go, and with ``heads`` the heads are rebuilt
    as the commits without children; ``duplicates``: see :func:`drop_duplicates`."""
    drop_duplicates(conn, duplicates)
    conn.executemany(
        f"UPDATE unsynced SET status = {LOCAL} WHERE status = {TRANSIENT} AND id IN "
        f"(SELECT id FROM objects WHERE {_THIS_DIGEST})",
        [(d,) for d in transient],
    )
    conn.executemany(
        "DELETE FROM remote_pieces WHERE digest = ?1 AND EXISTS "
        f"(SELECT 1 FROM objects WHERE {_THIS_DIGEST})",
        [(d,) for d in remote],
    )
    conn.execute(
        "DELETE FROM unsynced WHERE NOT EXISTS (SELECT 1 FROM objects o WHERE o.id = unsynced.id)"
    )
    if heads:
        expected = {  # a damaged row may hold anything
            r[0]
            for r in conn.execute(
                "SELECT id FROM commits WHERE id NOT IN (SELECT parent FROM commit_parents)"
            )
            if isinstance(r[0], bytes)
        }
        conn.execute("DELETE FROM heads")
        conn.executemany(
            "INSERT INTO heads (commit_id, timestamp) SELECT id, timestamp FROM commits "
            "WHERE id = ?",
            [(h,) for h in sorted(expected)],
        )
