"""Schema versions: a page database written by an older ledgerd opens and keeps
everything; one written by a newer ledgerd is refused."""

from __future__ import annotations

import random
import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from ledgerd.store import Page, Priority, Repository, SchemaError, exchange, schema, sql
from ledgerd.store.errors import CorruptDatabaseError
from ledgerd.store.schema import (
    LOCAL,
    SCHEMA_VERSION,
    SYNCED,
    TRANSIENT,
    create_page_schema,
)

V1_TO_STATUS_TABLE = """
BEGIN;
CREATE TABLE object_status (
    digest BLOB PRIMARY KEY,
    status INTEGER NOT NULL CHECK (status IN (1, 2))
) WITHOUT ROWID;
INSERT INTO object_status SELECT digest, status FROM piece_status WHERE status > 0;
DROP VIEW piece_status;
DROP TABLE unsynced;
CREATE TABLE objects_v1 (digest BLOB PRIMARY KEY, data BLOB NOT NULL);
INSERT INTO objects_v1 SELECT digest, data FROM objects ORDER BY id;
DROP TABLE objects;
ALTER TABLE objects_v1 RENAME TO objects;
DROP TABLE journals;
DROP TABLE pruned_commits;
CREATE TABLE journals (
    id      TEXT PRIMARY KEY,
    base    BLOB NOT NULL,
    cleared INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;
PRAGMA user_version = 1;
COMMIT;
"""
"""Turns an empty current page database back into version 1: every status in a
table of its own, keyed by digest; journals with a base."""


def _v1(conn: sqlite3.Connection) -> None:
    conn.executescript(V1_TO_STATUS_TABLE)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 1


async def _statuses(page: Page) -> dict[bytes, int]:
    rows = await page.db.read_all("SELECT digest, status FROM piece_status")
    return {bytes(d): s for d, s in rows}


def test_version_1_pieces_keep_their_data_and_status() -> None:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    create_page_schema(conn)
    _v1(conn)
    conn.executemany(
        "INSERT INTO objects (digest, data) VALUES (?, ?)",
        [(b"transient", b"t"), (b"local", b"l"), (b"synced", b"s")],
    )
    conn.executemany(
        "INSERT INTO object_status (digest, status) VALUES (?, ?)",
        [(b"local", LOCAL), (b"synced", SYNCED), (b"unfetched", SYNCED)],
    )
    conn.executemany(  # a location of a piece not stored, and one stored since
        "INSERT INTO remote_pieces (digest, location) VALUES (?, 'pack:0:1')",
        [(b"unstored",), (b"synced",)],
    )
    create_page_schema(conn)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 4
    rows = conn.execute("SELECT digest, data, status FROM piece_status ORDER BY id").fetchall()
    assert rows == [
        (b"transient", b"t", TRANSIENT),
        (b"local", b"l", LOCAL),
        (b"synced", b"s", SYNCED),
    ]  # the status of a piece not stored is known only where it can be fetched
    assert conn.execute("SELECT digest FROM remote_pieces").fetchall() == [(b"unstored",)]
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_schema")}
    assert "object_status" not in tables and {"unsynced", "piece_status"} <= tables
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


async def test_a_page_written_by_version_1_reads_and_syncs_the_same(tmp_path: Path) -> None:
    """Values, statuses and what waits for upload are the same after the migration."""
    big = random.Random(7).randbytes(300_000)
    async with await Repository.open(tmp_path) as repo:
        page = await repo.ledger("l").page("p")
        await page.write([(b"k%03d" % i, b"v%03d" % i * 20) for i in range(200)])
        first = await exchange.pending_upload(page)
        await exchange.mark_uploaded(page, [c.id for c in first.commits], first.eager)
        await page.put(b"big", big, Priority.LAZY)
        await page.put(b"later", b"not uploaded yet" * 10)
        before = await exchange.pending_upload(page)
        path = page.db.path
        statuses = await _statuses(page)
    assert before.lazy and before.eager and set(statuses.values()) == {LOCAL, SYNCED}
    conn = sqlite3.connect(path, isolation_level=None)
    _v1(conn)
    conn.close()
    async with await Repository.open(tmp_path) as repo:
        page = await repo.ledger("l").page("p")
        assert await page.get(b"big") == big
        assert await page.get(b"k123") == b"v123" * 20
        assert await page.get(b"later") == b"not uploaded yet" * 10
        assert await _statuses(page) == statuses
        after = await exchange.pending_upload(page)
        assert (after.eager, after.lazy) == (before.eager, before.lazy)
        assert [c.id for c in after.commits] == [c.id for c in before.commits]


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


def test_two_connections_opening_a_version_1_page_at_once(tmp_path: Path) -> None:
    """One migrates; the other, which saw version 1 too, finds it done once it has
    the write lock instead of migrating again."""
    path = tmp_path / "page.sqlite"
    first = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    first.execute("PRAGMA journal_mode = WAL")
    create_page_schema(first)
    _v1(first)
    first.execute("INSERT INTO objects (digest, data) VALUES (x'01', x'02')")
    waiting = threading.Event()

    class Second(sqlite3.Connection):
        def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
            if sql == "BEGIN IMMEDIATE":
                waiting.set()  # it has read the version: 1
            return super().execute(sql, *args)

    second = sqlite3.connect(path, isolation_level=None, factory=Second, check_same_thread=False)
    first.execute("BEGIN IMMEDIATE")  # the first one's migration is under way
    for version in range(1, SCHEMA_VERSION):
        for statement in schema._statements(schema._MIGRATIONS[version]):
            first.execute(statement)
    first.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    with ThreadPoolExecutor(1) as pool:
        opened = pool.submit(create_page_schema, second)
        assert waiting.wait(30)
        first.execute("COMMIT")
        opened.result(timeout=30)  # used to fail: no such table: object_status
    rows = second.execute("SELECT data, status FROM piece_status").fetchall()
    assert rows == [(b"\x02", TRANSIENT)]


async def _stored_page(root: Path, value: bytes) -> Path:
    """The file of page "p" of ledger "l" in a repository at ``root``, closed, after one
    put of ``k``."""
    async with await Repository.open(root) as repo:
        page = await repo.ledger("l").page("p")
        await page.put(b"k", value)
        await page.flush()
        return page.db.path


async def test_version_2_journal_left_by_a_crash_is_committed(tmp_path: Path) -> None:
    """Version 3 drops journals.base (never read) and adds since: a version 2 page
    with an implicit journal left by a crash migrates, and the journal commits."""
    from ledgerd.store import Repository

    path = await _stored_page(tmp_path, b"before")
    conn = sqlite3.connect(path, isolation_level=None)
    conn.executescript(
        """
        BEGIN;
        DROP TABLE journals;
        DROP TABLE pruned_commits;
        CREATE TABLE journals (
            id TEXT PRIMARY KEY, base BLOB NOT NULL, cleared INTEGER NOT NULL DEFAULT 0
        ) WITHOUT ROWID;
        INSERT INTO journals VALUES ('I1', x'00', 0);
        INSERT INTO journal_entries VALUES ('I1', x'6b', x'016e6577', 0);
        PRAGMA user_version = 2;
        COMMIT;
        """
    )
    conn.close()
    async with await Repository.open(tmp_path) as repo:
        page = await repo.ledger("l").page("p")
        assert await page.get(b"k") == b"new"
        assert await page.db.read_all("SELECT count(*) FROM journals") == [(0,)]
        columns = [r[1] for r in await page.db.read_all("PRAGMA table_info(journals)")]
        assert columns == ["id", "cleared", "since"]
        assert await page.db.read_all("SELECT count(*) FROM pruned_commits") == [(0,)]


@pytest.mark.parametrize("version", [-1, 0, 2])
async def test_a_page_whose_schema_version_is_wrong_is_refused_clearly(
    tmp_path: Path, version: int
) -> None:
    """A damaged user_version (negative, 0 with the tables there, or older than the
    tables are) is a CorruptDatabaseError naming the file and the version, never
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


def test_a_migrated_page_has_every_table_of_a_new_one(tmp_path: Path) -> None:
    """The open of a page at the current version checks that every table, index and
    view of the schema is there: a page migrated from version 1 has them all."""
    conn = sqlite3.connect(tmp_path / "page.sqlite", isolation_level=None)
    create_page_schema(conn)
    _v1(conn)
    create_page_schema(conn)  # migrates
    create_page_schema(conn)  # and opens again: checked
    names = {r[0] for r in conn.execute(schema._NAMES)}
    assert names >= schema._names(schema.PAGE_SCHEMA)
    conn.close()


@pytest.mark.parametrize(
    "damage",
    ["DROP TABLE pruned_commits", "DROP VIEW piece_status", "DROP TABLE unsynced_commits"],
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
