"""The SQL steps of the page's write transactions (store.sqlite.sql)."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

from ledgerd.store.sqlite import sql
from ledgerd.store.sqlite.schema import LOCAL, SYNCED, TRANSIENT, create_page_schema


def _statuses(conn: sqlite3.Connection) -> dict[bytes, int]:
    return {bytes(d): s for d, s in conn.execute("SELECT digest, status FROM piece_status")}


def test_put_pieces_only_raises_a_status() -> None:
    """Against a model, over random calls of every size (a row per statement, many
    rows per statement, the same digest twice in one call), with some pieces known
    to be in the cloud already (remote_pieces) before this device stores them."""
    rnd = random.Random(5)
    conn = sqlite3.connect(":memory:", isolation_level=None)
    create_page_schema(conn)
    remote = {b"d%03d" % i for i in range(0, 600, 7)}
    conn.executemany(
        "INSERT INTO remote_pieces (digest, location) VALUES (?, 'pack:0:1')", zip(remote)
    )
    model: dict[bytes, int] = {}
    for _ in range(40):
        status = rnd.choice([TRANSIENT, LOCAL, SYNCED])
        n = rnd.choice([1, 3, sql.ROWS_PER_STATEMENT - 1, sql.ROWS_PER_STATEMENT * 2 + 7])
        rows = [(b"d%03d" % rnd.randrange(600), b"data") for _ in range(n)]
        for d, _ in rows:
            start = SYNCED if d in remote else status
            model[d] = max(model.get(d, start), status)
        conn.execute("BEGIN")
        sql.put_pieces(conn, iter(rows), status)
        conn.execute("COMMIT")
    assert _statuses(conn) == model
    local = {bytes(r[0]) for r in conn.execute(sql.LOCAL_PIECES)}
    assert local == {d for d, s in model.items() if s == LOCAL}
    left = {bytes(r[0]) for r in conn.execute("SELECT digest FROM remote_pieces")}
    assert left == remote - set(model)  # stored: located here now


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
    assert _statuses(conn) == {kept: LOCAL}


def test_a_status_change_does_not_rewrite_the_piece(tmp_path: Path) -> None:
    """A piece's status is a narrow row of its own: making large pieces local, then
    synced, writes next to nothing, where a status in the piece's row would write
    the whole piece again."""
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
            assert written < 64 * 1024, (status, written)


def test_an_upload_marks_its_local_pieces_synced() -> None:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    create_page_schema(conn)
    sql.put_pieces(conn, [(b"l%04d" % i, b"x") for i in range(3000)], LOCAL)
    sql.put_pieces(conn, [(b"staged", b"x")], TRANSIENT)
    uploaded = [b"l%04d" % i for i in range(0, 3000, 2)]
    sql.mark_uploaded(conn, [*uploaded, b"staged", b"unknown"])
    sql.mark_uploaded(conn, [b"l0001"])  # a second upload, in the same connection
    assert _statuses(conn) == {
        **{b"l%04d" % i: SYNCED if i % 2 == 0 or i == 1 else LOCAL for i in range(3000)},
        b"staged": TRANSIENT,
    }
