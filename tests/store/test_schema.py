"""Schema versions: a page database of this version opens, one written by a newer
ledgerd (or damaged) is refused clearly, and so is a data directory of an unreleased
format."""

from __future__ import annotations

import re
import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from ledgerd.store import Repository, SchemaError
from ledgerd.store.errors import CorruptDatabaseError
from ledgerd.store.pieces import delta
from ledgerd.store.sqlite import integrity, schema, sql
from ledgerd.store.sqlite.schema import (
    SCHEMA_VERSION,
    SYNCED,
    create_page_schema,
)


def test_a_newer_schema_is_refused() -> None:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(SchemaError, match="newer than this ledgerd supports"):
        create_page_schema(conn)


@pytest.mark.parametrize("query", [sql.LOCAL_PIECES, sql.GARBAGE])
def test_finding_unsynced_pieces_does_not_scan_the_page(query: str) -> None:
    """What waits for upload, and what may be garbage, is found by a scan of the
    narrow unsynced table and lookups of those pieces, not by a scan of every piece."""
    conn = sqlite3.connect(":memory:", isolation_level=None)
    create_page_schema(conn)
    plan = [str(row[-1]) for row in conn.execute(f"EXPLAIN QUERY PLAN {query}")]
    assert "SCAN u" in plan and not [step for step in plan if step.startswith("SCAN o")], plan


def test_two_connections_creating_a_page_at_once(tmp_path: Path) -> None:
    """One creates the schema; the other, which saw version 0 too, finds it done once it
    has the write lock instead of creating it again."""
    path = tmp_path / "page.sqlite"
    first = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    first.execute("PRAGMA journal_mode = WAL")
    waiting = threading.Event()

    class Second(sqlite3.Connection):
        def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
            if sql == "BEGIN IMMEDIATE":
                waiting.set()  # it has read the version: 0
            return super().execute(sql, *args)

    second = sqlite3.connect(path, isolation_level=None, factory=Second, check_same_thread=False)
    first.execute("BEGIN IMMEDIATE")  # the first one's creation is under way
    for statement in schema._statements(schema.PAGE_SCHEMA):
        first.execute(statement)
    first.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    first.execute("INSERT INTO objects (digest, data) VALUES (x'01', x'02')")
    with ThreadPoolExecutor(1) as pool:
        opened = pool.submit(create_page_schema, second)
        assert waiting.wait(30)
        first.execute("COMMIT")
        opened.result(timeout=30)
    rows = second.execute("SELECT data, status FROM piece_status").fetchall()
    assert rows == [(b"\x02", SYNCED)]


async def _stored_page(root: Path, value: bytes) -> Path:
    """The file of page "p" of ledger "l" in a repository at ``root``, closed, after one
    put of ``k``."""
    async with await Repository.open(root) as repo:
        page = await repo.ledger("l").page("p")
        await page.put(b"k", value)
        await page.flush()
        return page.db.path


@pytest.mark.parametrize("version", [-1, 0])
async def test_a_page_whose_schema_version_is_wrong_is_refused_clearly(
    tmp_path: Path, version: int
) -> None:
    """A damaged user_version (negative, or 0 with the tables there) is a
    CorruptDatabaseError naming the file and the version, never
    SQLite's own error or a KeyError; the page's data stays as it was."""
    path = await _stored_page(tmp_path, b"v")
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(f"PRAGMA user_version = {version}")
    conn.close()
    async with await Repository.open(tmp_path) as repo:
        with pytest.raises(CorruptDatabaseError, match=f"schema version {version}") as e:
            await repo.ledger("l").page("p")
        assert str(path) in str(e.value)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    conn.close()
    async with await Repository.open(tmp_path) as repo:
        assert await (await repo.ledger("l").page("p")).get(b"k") == b"v"


@pytest.mark.parametrize(
    "damage",
    ["DROP TABLE pruned_commits", "DROP VIEW piece_status", "DROP TABLE conflicts"],
)
async def test_a_page_missing_a_table_is_refused_clearly(tmp_path: Path, damage: str) -> None:
    """A page at the current version that lacks a table (dropped by hand, or lost to
    damage) is a CorruptDatabaseError naming the file and what is missing, not
    SQLite's "no such table" at some later request (500 internal, "a bug")."""
    path = await _stored_page(tmp_path, b"v")
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(damage)
    conn.close()
    missing = damage.split()[-1]
    async with await Repository.open(tmp_path) as repo:
        with pytest.raises(CorruptDatabaseError, match=f"has no {missing}") as e:
            await repo.ledger("l").page("p")
        assert str(path) in str(e.value)


@pytest.mark.parametrize("old", ["1", "2"])
async def test_a_data_directory_of_an_unreleased_format_is_refused(
    tmp_path: Path, old: str
) -> None:
    """Pages kept under ``1/`` (no dots in their entries) or ``2/`` (values of 33 to 128
    bytes stored as pieces, under other digests) are not read: the repository refuses
    to open, saying what to do."""
    (tmp_path / old / "ledgers").mkdir(parents=True)
    with pytest.raises(SchemaError, match=f"unreleased development version.*{old}"):
        await Repository.open(tmp_path)
    assert schema.FORMAT_VERSION == 3


_DELTA_COLUMNS = ",\n    base   INTEGER,\n    depth  INTEGER\n"
"""What version 3 added to objects."""


def _version_1(conn: sqlite3.Connection) -> None:
    """A page database as schema version 1 made it: a unique index on the whole
    digest, no objects_digest."""
    old = schema.PAGE_SCHEMA.replace("digest BLOB NOT NULL,", "digest BLOB NOT NULL UNIQUE,", 1)
    old = old.replace(f"CREATE INDEX objects_digest ON objects ({schema.DIGEST_KEY});", "")
    assert _DELTA_COLUMNS in old
    old = old.replace(_DELTA_COLUMNS, "\n", 1)
    for statement in schema._statements(old):
        conn.execute(statement)
    conn.execute("PRAGMA user_version = 1")


def test_version_1_migrates_to_the_prefix_index_keeping_ids_and_statuses() -> None:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    _version_1(conn)
    pieces = [(bytes([1]) + bytes([i]) * 32, b"data %d" % i) for i in range(5)]
    conn.executemany(
        "INSERT INTO objects (id, digest, data) VALUES (?, ?, ?)",
        [(10 * (i + 1), d, v) for i, (d, v) in enumerate(pieces)],
    )
    conn.execute("INSERT INTO unsynced (id, status) VALUES (20, 1), (40, 0)")
    before = conn.execute(
        "SELECT id, digest, data, status FROM piece_status ORDER BY id"
    ).fetchall()
    create_page_schema(conn)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 3
    after = conn.execute("SELECT id, digest, data, status FROM piece_status ORDER BY id").fetchall()
    assert after == before
    indexes = {r[1]: r[2] for r in conn.execute("PRAGMA index_list(objects)")}
    assert indexes == {"objects_digest": 0}  # not unique, and the old one is gone
    sql.put_pieces(conn, pieces[:2] + [(bytes([1]) + b"\xee" * 32, b"new")], SYNCED)
    assert conn.execute("SELECT count(*) FROM objects").fetchone()[0] == 6
    assert conn.execute("SELECT max(id) FROM objects").fetchone()[0] == 51


def test_a_digest_is_stored_once_whatever_the_batches() -> None:
    """No constraint keeps a digest to one row any more: put_pieces does, for pieces
    given twice in one call, across its statements, and across calls."""
    conn = sqlite3.connect(":memory:", isolation_level=None)
    create_page_schema(conn)
    pieces = [(bytes([1]) + i.to_bytes(32, "big"), b"v%d" % i) for i in range(600)]
    sql.put_pieces(conn, pieces[:300] + pieces[:300] + pieces[250:400], schema.TRANSIENT)
    sql.put_pieces(conn, pieces[250:], schema.LOCAL)
    sql.put_pieces(conn, pieces[599:] * 3, schema.TRANSIENT)
    rows = conn.execute("SELECT digest, count(*) FROM objects GROUP BY digest").fetchall()
    assert len(rows) == 600 and {n for _, n in rows} == {1}
    status = dict(conn.execute("SELECT digest, status FROM piece_status"))
    assert status == {
        d: schema.TRANSIENT if i < 250 else schema.LOCAL for i, (d, _) in enumerate(pieces)
    }


def test_two_digests_sharing_a_prefix_are_two_pieces() -> None:
    """The index holds eight bytes of the hash; lookups compare the whole digest."""
    conn = sqlite3.connect(":memory:", isolation_level=None)
    create_page_schema(conn)
    a, b = bytes([1]) + b"\x07" * 8 + b"\x00" * 24, bytes([1]) + b"\x07" * 8 + b"\x01" * 24
    sql.put_pieces(conn, [(a, b"a")], SYNCED)
    sql.put_pieces(conn, [(b, b"b"), (a, b"a")], SYNCED)
    got = conn.execute(
        f"SELECT data FROM objects WHERE {schema.digest_is('digest', '?1')}", (b,)
    ).fetchall()
    assert got == [(b"b",)]
    assert conn.execute("SELECT count(*) FROM objects").fetchone()[0] == 2


def test_the_schema_and_the_migration_index_what_lookups_name() -> None:
    statement = f"CREATE INDEX objects_digest ON objects ({schema.DIGEST_KEY});"
    assert statement in schema.PAGE_SCHEMA and statement in schema._MIGRATIONS[2]


def _in(query: str) -> str:
    key = schema.digest_key("?")
    return query.format(marks="?,?", keys=f"{key},{key}")


@pytest.mark.parametrize(
    "query",
    [
        delta._ONE_PIECE,
        _in(delta._PIECES),
        delta._ONE_CHAIN,
        _in(schema.CHAIN_IN),
        sql._INSERT_DELTA,
        _in(integrity.PIECE_STATUS),
        _in(integrity.PIECE_DATA),
        sql._insert_rows_sql(2),
        f"DELETE FROM unsynced WHERE {sql._BY_DIGEST}",
        "SELECT o.id FROM journal_pieces j CROSS JOIN objects o "
        f"ON {schema.digest_is('o.digest', 'j.digest')} WHERE j.journal_id = ?",
    ],
)
def test_a_piece_is_found_by_digest_through_the_prefix_index(query: str) -> None:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    create_page_schema(conn)
    params = [bytes(33)] * (
        len(set(re.findall(r"\?\d", query))) + len(re.findall(r"\?(?!\d)", query))
    )
    plan = [str(row[-1]) for row in conn.execute(f"EXPLAIN QUERY PLAN {query}", params)]
    assert any("USING INDEX objects_digest" in step for step in plan), plan
    assert not [s for s in plan if s.startswith(("SCAN objects", "SCAN o"))], plan
