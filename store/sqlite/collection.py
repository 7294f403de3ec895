"""The SQL of a page's garbage collection: retained and pruned commits, the sweep of
unreached pieces, the incremental vacuum, and what a page holds.

This module owns the statements :mod:`store.page.gc` runs on a page's database
(synchronous functions, run through :meth:`store.sqlite.db.Database.run`); which
commits and pieces to keep is gc's.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable

from ledgerd.store.sqlite import sql
from ledgerd.store.sqlite.db import Database
from ledgerd.store.sqlite.schema import PIECES_WAITING, UPLOADED_AT_ROW, digest_is

CANDIDATES = 4096
"""Pieces :func:`candidates` returns at most."""


def retained_and_pruned(conn: sqlite3.Connection, cutoff_us: int) -> tuple[set[bytes], set[bytes]]:
    """(ids of the commits kept by the page's own state, pruned commit ids) as of one
    read transaction: the heads, the commit the last upload was read at, the commits
    at or after ``cutoff_us``, and the one the document views reflect."""
    conn.execute("BEGIN")
    try:
        keep: set[bytes] = set()
        for q, p in (
            ("SELECT commit_id FROM heads", ()),
            ("SELECT value FROM sync_metadata WHERE name = ?", (UPLOADED_AT_ROW,)),
            ("SELECT id FROM commits WHERE timestamp >= ?", (cutoff_us,)),
        ):
            keep.update(bytes(r[0]) for r in conn.execute(q, p))
        has_docs = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'doc_state'"
        ).fetchone()
        if has_docs:
            keep.update(
                bytes(r[0])
                for r in conn.execute("SELECT value FROM doc_state WHERE name = 'reflected'")
                if r[0] is not None
            )
        pruned = {bytes(r[0]) for r in conn.execute("SELECT commit_id FROM pruned_commits")}
        return keep, pruned
    finally:
        conn.execute("COMMIT")


async def is_pruned(db: Database, commit_id: bytes) -> bool:
    """Whether the commit is pruned (its contents no longer kept)."""
    rows = await db.read_all(
        "SELECT 1 FROM pruned_commits WHERE commit_id = ?", (commit_id,), small=True
    )
    return bool(rows)


def prune(conn: sqlite3.Connection, ids: Iterable[bytes]) -> int:
    """Record these commits as pruned; returns how many were new."""
    before = conn.total_changes
    conn.executemany(
        "INSERT OR IGNORE INTO pruned_commits (commit_id) VALUES (?)", [(c,) for c in ids]
    )
    return conn.total_changes - before


def candidates(conn: sqlite3.Connection, after: int, upto: int) -> tuple[list[int], list[bytes]]:
    """Ids and digests of the next pieces after ``after``, up to ``upto``: two flat lists,
    not a tuple per row (fewer objects for Python's cyclic collector to walk)."""
    ids: list[int] = []
    digests: list[bytes] = []
    for i, d in conn.execute(
        f"SELECT id, digest FROM objects WHERE id > ? AND id <= ? ORDER BY id LIMIT {CANDIDATES}",
        (after, upto),
    ):
        ids.append(i)
        digests.append(d)
    return ids, digests


def delete(conn: sqlite3.Connection, ids: list[int]) -> tuple[int, int]:
    """Delete these pieces unless staged by a journal (transient, or in
    journal_pieces), or from the cloud while pieces wait for their entries
    (:data:`store.sqlite.schema.PIECES_WAITING`); returns (pieces, bytes) deleted. Their
    bytes are overwritten (``secure_delete``), so that a purged value leaves nothing
    in the file."""
    conn.execute("PRAGMA secure_delete = ON")
    try:
        return _delete_rows(conn, ids)
    finally:
        conn.execute("PRAGMA secure_delete = OFF")


def _delete_rows(conn: sqlite3.Connection, ids: list[int]) -> tuple[int, int]:
    conn.execute("CREATE TEMP TABLE IF NOT EXISTS gc_gone (id INTEGER PRIMARY KEY)")
    conn.executemany("INSERT OR IGNORE INTO temp.gc_gone (id) VALUES (?)", [(i,) for i in ids])
    waiting = conn.execute(
        "SELECT 1 FROM sync_metadata WHERE substr(name, 1, ?) = ? AND value != ? LIMIT 1",
        (len(PIECES_WAITING), PIECES_WAITING, b"0"),
    ).fetchone()
    if waiting:  # (a piece from the cloud has no unsynced row)
        conn.execute("DELETE FROM temp.gc_gone WHERE id NOT IN (SELECT id FROM unsynced)")
    conn.execute(
        "DELETE FROM temp.gc_gone WHERE id IN (SELECT id FROM unsynced WHERE status = 0) "
        "OR id IN (SELECT o.id FROM journal_pieces j CROSS JOIN objects o "
        f"ON {digest_is('o.digest', 'j.digest')})"
    )
    nbytes = conn.execute(
        "SELECT coalesce(sum(length(o.data)), 0) FROM temp.gc_gone g "
        "CROSS JOIN objects o ON o.id = g.id"
    ).fetchone()[0]
    n = conn.execute("DELETE FROM objects WHERE id IN (SELECT id FROM temp.gc_gone)").rowcount
    conn.execute("DELETE FROM unsynced WHERE id IN (SELECT id FROM temp.gc_gone)")
    conn.execute("DELETE FROM temp.gc_gone")
    return int(n), int(nbytes)


def flatten(conn: sqlite3.Connection, pieces: Iterable[tuple[bytes, bytes]]) -> int:
    """Store these tree pieces ``(digest, whole data)`` whole where they are deltas, so
    that the bases of their chains may be deleted; returns how many were. The deltas'
    bytes are overwritten (``secure_delete``), as deleted pieces' are."""
    conn.execute("PRAGMA secure_delete = ON")
    try:
        return int(conn.executemany(f"{sql.STORE_WHOLE} AND base IS NOT NULL", pieces).rowcount)
    finally:
        conn.execute("PRAGMA secure_delete = OFF")


def vacuum_step(conn: sqlite3.Connection, pages: int) -> int:
    """Give back up to ``pages`` free file pages; returns how many are left."""
    conn.execute(f"PRAGMA incremental_vacuum({int(pages)})").fetchall()
    return int(conn.execute("PRAGMA freelist_count").fetchone()[0])


def counts(conn: sqlite3.Connection) -> dict[str, int]:
    """What the page holds, as of one read transaction."""
    conn.execute("BEGIN")
    try:
        q = {
            "stored_bytes": "SELECT coalesce(sum(length(data)), 0) FROM objects",
            "pieces": "SELECT count(*) FROM objects",
            "commits": "SELECT count(*) FROM commits",
            "pruned_commits": "SELECT count(*) FROM pruned_commits",
            "unsynced_pieces": "SELECT count(*) FROM unsynced",
            "journals": "SELECT count(*) FROM journals",
            "free_file_pages": "PRAGMA freelist_count",
        }
        return {k: int(conn.execute(v).fetchone()[0]) for k, v in q.items()}
    finally:
        conn.execute("COMMIT")
