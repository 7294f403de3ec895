"""The SQL steps of the page's write transactions (store.sql)."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

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
        status = rnd.choice([TRANSIENT, LOCAL, SYNCED])
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
    unsynced = conn.execute(sql.LOCAL_PIECES).fetchall()
    assert len(unsynced) == sum(1 for v, s in model.values() if s == LOCAL and v is not None)


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


def test_marking_a_large_piece_synced_rewrites_only_its_first_page(tmp_path: Path) -> None:
    """Every status takes the same room in the row, so SQLite changes it in place:
    the chunk's overflow pages are not written again (they were, with codes 0-2)."""
    conn = sqlite3.connect(tmp_path / "page.sqlite", isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    create_page_schema(conn)
    chunks = [(b"c%02d" % i, random.Random(i).randbytes(64 * 1024)) for i in range(16)]
    for status in (TRANSIENT, LOCAL, SYNCED):
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.execute("BEGIN")
        sql.put_pieces(conn, chunks, status)
        conn.execute("COMMIT")
        written = (tmp_path / "page.sqlite-wal").stat().st_size
        if status == TRANSIENT:
            assert written > 1024 * 1024  # the chunks themselves
        else:
            assert written < 16 * 3 * 4096 + 64 * 1024, (status, written)


def test_an_upload_marks_its_local_pieces_synced() -> None:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    create_page_schema(conn)
    sql.put_pieces(conn, [(b"l%04d" % i, b"x") for i in range(3000)], LOCAL)
    sql.put_pieces(conn, [(b"staged", b"x")], TRANSIENT)
    uploaded = [b"l%04d" % i for i in range(0, 3000, 2)]
    sql.mark_uploaded(conn, [*uploaded, b"staged", b"unknown"])
    sql.mark_uploaded(conn, [b"l0001"])  # a second upload, in the same connection
    statuses = dict(conn.execute("SELECT digest, status FROM objects"))
    assert statuses == {
        **{b"l%04d" % i: SYNCED if i % 2 == 0 or i == 1 else LOCAL for i in range(3000)},
        b"staged": TRANSIENT,
    }
