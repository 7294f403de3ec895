"""The SQL steps of the page's write transactions (store.sql)."""

from __future__ import annotations

import random
import sqlite3

from store import sql
from store.schema import LOCAL, SYNCED, TRANSIENT, create_page_schema


def test_put_pieces_only_raises_a_status_and_only_adds_data() -> None:
    """Against a model, over random calls of every size (a row per statement, many
    rows per statement, the same digest twice in one statement)."""
    rnd = random.Random(5)
    conn = sqlite3.connect(":memory:", isolation_level=None)
    create_page_schema(conn)
    model: dict[bytes, tuple[bytes | None, int]] = {}
    for _ in range(40):
        status = rnd.choice([0, 1, 2])
        n = rnd.choice([1, 3, sql.ROWS_PER_STATEMENT - 1, sql.ROWS_PER_STATEMENT * 2 + 7])
        rows: list[tuple[bytes, bytes | None]] = []
        for _ in range(n):
            d = b"d%03d" % rnd.randrange(600)
            data = None if status == SYNCED and rnd.random() < 0.5 else b"data of " + d
            rows.append((d, data))
            old_data, old_status = model.get(d, (None, TRANSIENT))
            model[d] = (old_data if old_data is not None else data, max(old_status, status))
        conn.execute("BEGIN")
        sql.put_pieces(conn, iter(rows), status)
        conn.execute("COMMIT")
    stored = {bytes(d): (v, s) for d, v, s in conn.execute("SELECT * FROM objects")}
    assert stored == model
    unsynced = conn.execute("SELECT count(*) FROM objects WHERE status < 2 AND status = 1")
    assert unsynced.fetchone()[0] == sum(1 for _, s in model.values() if s == 1)


def test_a_committed_journal_keeps_what_its_commit_references() -> None:
    """A piece of a value the commit holds becomes local, even one that another open
    journal staged too, so that discarding that journal keeps it; a piece of a value
    the journal replaced is collected, unless another journal still stages it."""
    conn = sqlite3.connect(":memory:", isolation_level=None)
    create_page_schema(conn)
    kept, replaced, shared = b"kept", b"replaced", b"shared"
    sql.put_pieces(conn, [(d, b"data") for d in (kept, replaced, shared)], TRANSIENT)
    conn.executemany(
        "INSERT INTO journal_pieces (journal_id, digest) VALUES (?, ?)",
        [("Ia", kept), ("Ia", replaced), ("Ia", shared), ("Eb", kept), ("Eb", shared)],
    )
    assert sql.keep_journal_pieces(conn, "Ia", {kept}) == 1  # replaced
    assert sql.collect(conn, "journal_id = ?", ("Eb",)) == 1  # shared, staged by Eb alone
    assert conn.execute("SELECT digest, status FROM objects").fetchall() == [(kept, LOCAL)]
