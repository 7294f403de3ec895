"""Schema versions: a page database of this version opens, one written by a newer
ledgerd (or damaged) is refused clearly, and so is a data directory of an unreleased
format."""

from __future__ import annotations

import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from ledgerd.store import Repository, SchemaError
from ledgerd.store.errors import CorruptDatabaseError
from ledgerd.store.sqlite import schema, sql
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


async def test_a_data_directory_of_an_unreleased_format_is_refused(tmp_path: Path) -> None:
    """Pages kept under ``1/`` (an unreleased development format, with no dots in its
    entries) are not read: the repository refuses to open, saying what to do."""
    (tmp_path / "1" / "ledgers").mkdir(parents=True)
    with pytest.raises(SchemaError, match="unreleased development version"):
        await Repository.open(tmp_path)
