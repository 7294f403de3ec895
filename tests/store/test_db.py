"""Database: inline small writes, and their fallback to the writer's thread."""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from functools import partial
from pathlib import Path

import pytest

from ledgerd.store.errors import ClosedError, CorruptDatabaseError
from ledgerd.store.sqlite import db as store_db
from ledgerd.store.sqlite import sql
from ledgerd.store.sqlite.db import Database
from ledgerd.store.sqlite.schema import LOCAL, TRANSIENT, create_page_schema


def _schema(conn: sqlite3.Connection) -> None:
    conn.execute("CREATE TABLE IF NOT EXISTS t (k INTEGER PRIMARY KEY, thread INTEGER)")


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    d = await Database.open(tmp_path / "t.sqlite", _schema)
    try:
        yield d
    finally:
        await d.close()


def _insert(k: int) -> Callable[[sqlite3.Connection], int]:
    def work(conn: sqlite3.Connection) -> int:
        conn.execute("INSERT INTO t (k, thread) VALUES (?, ?)", (k, threading.get_ident()))
        return threading.get_ident()

    return work


async def _rows(db: Database) -> list[tuple[int, int]]:
    return [(int(k), int(t)) for k, t in await db.read_all("SELECT k, thread FROM t ORDER BY k")]


async def test_a_small_write_runs_inline_and_a_large_one_on_the_writer_thread(
    db: Database,
) -> None:
    here = threading.get_ident()
    assert await db.run(_insert(1), write=True, small=True) == here
    assert await db.run(_insert(2), write=True) != here
    assert [k for k, _ in await _rows(db)] == [1, 2]  # both committed, both visible


async def test_a_failing_inline_write_leaves_nothing_and_the_next_one_works(db: Database) -> None:
    def fail(conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO t (k, thread) VALUES (1, 0)")
        raise ValueError("no")

    with pytest.raises(ValueError):
        await db.run(fail, write=True, small=True)
    assert db.inline is not None and not db.inline.in_transaction
    await db.run(_insert(2), write=True, small=True)
    assert [k for k, _ in await _rows(db)] == [2]


async def test_an_inline_write_waits_on_the_writer_thread_while_another_process_writes(
    db: Database, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    other = sqlite3.connect(tmp_path / "t.sqlite", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # holds the write lock, as another process could
    other.execute("INSERT INTO t (k, thread) VALUES (1, 0)")
    caplog.set_level(logging.DEBUG, logger="ledgerd.store.sqlite.db")
    writing = asyncio.ensure_future(db.run(_insert(2), write=True, small=True))
    while not any("waits for the writer" in r.message for r in caplog.records):
        await asyncio.sleep(0)  # the loop is free: the write waits off it
        assert not writing.done()
    other.execute("COMMIT")
    other.close()
    assert await writing != threading.get_ident()
    assert [k for k, _ in await _rows(db)] == [1, 2]


async def test_write_now_runs_inline_or_does_nothing(db: Database, tmp_path: Path) -> None:
    """write_now writes inline at once, or does nothing when it would have to wait:
    another write of this database under way, or SQLite busy."""
    assert db.write_now(_insert(1)) == (True, threading.get_ident())
    async with db._lock:  # a write under way here
        assert db.write_now(_insert(2)) == (False, None)
    other = sqlite3.connect(tmp_path / "t.sqlite", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    assert db.write_now(_insert(3)) == (False, None)
    other.execute("ROLLBACK")
    other.close()
    assert db.inline is not None and not db.inline.in_transaction
    assert [k for k, _ in await _rows(db)] == [1]
    # The write whose turn it is to go to the writer's thread (which checkpoints)
    # is not taken inline: write_now leaves it to a write that may wait.
    db._inline_count = store_db.INLINE_ROUND - 1
    assert db.write_now(_insert(4)) == (False, None)
    assert await db.run(_insert(4), write=True, small=True) != threading.get_ident()


async def test_full_durability_writes_nothing_inline(tmp_path: Path) -> None:
    db = await Database.open(tmp_path / "f.sqlite", _schema, synchronous="FULL")
    try:
        assert db.inline is None
        assert await db.run(_insert(1), write=True, small=True) != threading.get_ident()
    finally:
        await db.close()


async def test_the_wal_is_checkpointed_when_every_write_is_small(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the writer's thread checkpoints, and one small write in every round goes
    there: a steady trickle of small writes keeps the WAL near its limit."""
    monkeypatch.setattr(store_db, "WAL_CHECKPOINT_PAGES", 64)  # 256 KiB
    db = await Database.open(tmp_path / "w.sqlite", _schema)
    assert db.inline is not None
    assert db.inline.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0

    def insert(k: int) -> Callable[[sqlite3.Connection], None]:
        def work(conn: sqlite3.Connection) -> None:
            conn.execute("INSERT INTO t (k, thread) VALUES (?, ?)", (k, 0))
            conn.execute("CREATE TABLE IF NOT EXISTS b (data BLOB)")
            conn.execute("INSERT INTO b VALUES (?)", (b"x" * 8000,))

        return work

    wal = tmp_path / "w.sqlite-wal"
    for k in range(1000):  # about 8 MB and 3,000 pages written in all
        await db.run(insert(k), write=True, small=True)
    assert wal.stat().st_size < 2 * 1024 * 1024
    await db.close()
    conn = sqlite3.connect(tmp_path / "w.sqlite")  # nothing lost
    assert conn.execute("SELECT count(*) FROM t").fetchone()[0] == 1000
    conn.close()


def _blobs(k: int) -> Callable[[sqlite3.Connection], None]:
    """A write of about 25 pages (100 KiB of blobs)."""

    def work(conn: sqlite3.Connection) -> None:
        conn.execute("CREATE TABLE IF NOT EXISTS b (k INTEGER, data BLOB)")
        conn.executemany("INSERT INTO b VALUES (?, ?)", [(k, bytes([k % 256]) * 5000)] * 20)

    return work


def _wal(db: Database) -> tuple[int, int]:
    """Frames in the WAL, and frames of them copied into the database."""
    assert db._wal_index is not None
    wal = store_db._wal_frames(db._wal_index)
    assert wal is not None
    return wal


def _backlog(db: Database) -> int:
    frames, copied = _wal(db)
    return frames - copied


def _copying(db: Database) -> bool:
    return db._checkpointing is not None


def test_the_wal_index_is_read_where_sqlite_keeps_its_frame_counts(tmp_path: Path) -> None:
    """_wal_frames reads mxFrame and nBackfill at the offsets of SQLite's WAL-index
    format: the figures agree with what ``PRAGMA wal_checkpoint`` reports, before
    and after a checkpoint that a reader's snapshot stops part way."""
    path = tmp_path / "w.sqlite"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    _blobs(0)(conn)
    pin = sqlite3.connect(path, isolation_level=None)
    pin.execute("BEGIN")
    pin.execute("SELECT count(*) FROM b").fetchone()
    _blobs(1)(conn)
    fd = os.open(f"{path}-shm", os.O_RDONLY)
    try:
        frames, copied = store_db._wal_frames(fd) or (-1, -1)
        assert copied == 0 and frames > 40
        busy, log, done = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        assert (busy, log) == (0, frames) and 0 < done < frames  # the reader's stop
        assert store_db._wal_frames(fd) == (frames, done)
    finally:
        os.close(fd)
        pin.close()
        conn.close()


async def test_the_wal_is_copied_beside_large_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past BACKGROUND_CHECKPOINT_PAGES pages not yet copied, a write on the writer's
    thread has them copied into the database on a connection of its own, not in a
    later commit; nothing is lost."""
    monkeypatch.setattr(store_db, "BACKGROUND_CHECKPOINT_PAGES", 64)
    path = tmp_path / "a dir?named#100%" / "c.sqlite"  # opened again by URI: kept whole
    db = await Database.open(path, _schema)
    try:
        # The writer's own checkpoint would copy them too, but only at ~64 MiB.
        assert db.writer.raw.execute("PRAGMA wal_autocheckpoint").fetchone()[0] > 1000
        for k in range(200):  # about 5,000 pages, 20 MB
            await db.run(_blobs(k), write=True)
        if db._checkpointing is not None:
            await db._checkpointing
        # More than once (how many depends on how fast each copying goes on a busy
        # machine: the writes go on while it copies).
        assert db.background_checkpoints >= 2
        await db.run(_blobs(200), write=True)
        if db._checkpointing is not None:
            await db._checkpointing
        assert _backlog(db) < 64
    finally:
        await db.close()
    assert sorted(p.name for p in path.parent.iterdir()) == ["c.sqlite"]
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT count(*), count(DISTINCT k) FROM b").fetchone() == (201 * 20, 201)
    conn.close()


async def test_small_writes_leave_the_checkpoints_to_the_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Below the limit nothing runs beside the writes: a page written a little at a
    time never opens a connection for checkpoints."""
    monkeypatch.setattr(store_db, "BACKGROUND_CHECKPOINT_PAGES", 64)
    db = await Database.open(tmp_path / "s.sqlite", _schema)
    try:
        for k in range(40):
            await db.run(_insert(k), write=True)
        assert db._checkpointing is None
        assert db.background_checkpoints == 0
        assert _backlog(db) < 64
    finally:
        await db.close()


async def test_a_reader_that_keeps_the_wal_costs_one_copying_per_limit_not_per_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a reader's snapshot keeps the WAL's newer frames from being copied, the
    backlog stays past the limit: a copying runs again once as many frames again were
    written, not after every write (each opened a connection to copy nothing). Once
    the reader is gone, the next one copies it all."""
    monkeypatch.setattr(store_db, "BACKGROUND_CHECKPOINT_PAGES", 64)
    path = tmp_path / "r.sqlite"
    db = await Database.open(path, _schema)
    pin = sqlite3.connect(path, isolation_level=None)
    try:
        await db.run(_blobs(0), write=True)
        pin.execute("BEGIN")
        assert pin.execute("SELECT count(*) FROM b").fetchone() == (20,)
        for k in range(1, 41):  # about 25 frames each
            await db.run(_blobs(k), write=True)
            if db._checkpointing is not None:
                await db._checkpointing
        frames, _ = _wal(db)
        assert frames > 40 * 20
        assert 1 <= db.background_checkpoints <= frames // 64 + 1
        pin.rollback()
        for k in range(41, 41 + 3):  # past the limit again since the last one started
            await db.run(_blobs(k), write=True)
        if db._checkpointing is not None:
            await db._checkpointing
        assert _backlog(db) < 64
    finally:
        pin.close()
        await db.close()


async def test_a_failed_checkpoint_beside_the_writes_is_logged_and_writes_go_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(store_db, "BACKGROUND_CHECKPOINT_PAGES", 64)

    def failing(path: Path, synchronous: str) -> None:
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(store_db, "_checkpoint", failing)
    db = await Database.open(tmp_path / "f.sqlite", _schema)
    try:
        with caplog.at_level(logging.WARNING, logger="ledgerd.store.sqlite.db"):
            for k in range(10):
                await db.run(_blobs(k), write=True)
                if db._checkpointing is not None:
                    await db._checkpointing
        assert db.background_checkpoints == 0
        assert "beside the writes failed: disk I/O error" in caplog.text
        await db.run(_blobs(10), write=True)
    finally:
        await db.close()
    conn = sqlite3.connect(tmp_path / "f.sqlite")
    assert conn.execute("SELECT count(DISTINCT k) FROM b").fetchone() == (11,)
    conn.close()


async def test_a_wal_index_of_another_layout_is_said_once_and_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A WAL index this ledgerd cannot read (another SQLite's layout) leaves the
    checkpoints to the writer's commits, and says so once, not silently."""
    monkeypatch.setattr(store_db, "BACKGROUND_CHECKPOINT_PAGES", 64)
    monkeypatch.setattr(store_db, "_WAL_INDEX_VERSION", 3007001)
    store_db._wal_index_unread.cache_clear()
    db = await Database.open(tmp_path / "v.sqlite", _schema)
    try:
        with caplog.at_level(logging.WARNING, logger="ledgerd.store.sqlite.db"):
            for k in range(10):
                await db.run(_blobs(k), write=True)
        assert db.background_checkpoints == 0 and not _copying(db)
        assert caplog.text.count("not in the layout this ledgerd reads") == 1
    finally:
        store_db._wal_index_unread.cache_clear()
        await db.close()


def _hold_copying(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, threading.Event]:
    """Checkpoints beside the writes past 64 pages, each of which sets ``started`` and
    then waits for ``release`` before it copies: (started, release)."""
    monkeypatch.setattr(store_db, "BACKGROUND_CHECKPOINT_PAGES", 64)
    started, release = threading.Event(), threading.Event()
    real = store_db._checkpoint

    def slow(path: Path, synchronous: store_db.Synchronous) -> None:
        started.set()
        release.wait(10)
        real(path, synchronous)

    monkeypatch.setattr(store_db, "_checkpoint", slow)
    return started, release


async def _write_until_copying(db: Database, started: threading.Event) -> int:
    """Write until a checkpoint beside the writes has started; the next ``_blobs`` key."""
    k = 0
    while not _copying(db):
        await db.run(_blobs(k), write=True)
        k += 1
    await asyncio.to_thread(started.wait, 10)
    return k


def _at_truncate(
    db: Database, monkeypatch: pytest.MonkeyPatch, look: Callable[[], Awaitable[bool]]
) -> list[bool]:
    """What ``look`` answers each time the writer is about to run a TRUNCATE checkpoint."""
    seen: list[bool] = []
    execute = db.writer.execute

    async def watched(sql: str, params: Sequence[object] = ()) -> None:
        if "TRUNCATE" in sql:
            seen.append(await look())
        await execute(sql, params)

    monkeypatch.setattr(db.writer, "execute", watched)
    return seen


async def test_closing_waits_for_a_checkpoint_beside_the_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Close waits for the copying under way (which then leaves no connection
    behind) and starts none afterwards."""
    started, release = _hold_copying(monkeypatch)
    db = await Database.open(tmp_path / "x.sqlite", _schema)
    k = await _write_until_copying(db, started)
    closing = asyncio.ensure_future(db.close())
    await asyncio.sleep(0)
    assert not closing.done()
    release.set()
    await closing
    assert db.background_checkpoints == 1
    assert not _copying(db)
    with pytest.raises(ClosedError):
        await db.run(_blobs(k), write=True)


async def test_a_truncating_checkpoint_waits_for_the_copying_beside_the_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Database.checkpoint (TRUNCATE, after a garbage collection) waits for a copying
    under way: while that holds SQLite's checkpoint lock, TRUNCATE answers busy at
    once and leaves the WAL whole, with no error (a second process holding the lock
    shows it). Then the WAL is empty."""
    started, release = _hold_copying(monkeypatch)
    path = tmp_path / "g.sqlite"
    db = await Database.open(path, _schema)
    try:
        await _write_until_copying(db, started)

        async def copying() -> bool:
            return _copying(db)

        truncating_while_copying = _at_truncate(db, monkeypatch, copying)
        checkpoint = asyncio.ensure_future(db.checkpoint())
        await asyncio.sleep(0)  # one turn of the loop: the checkpoint starts
        release.set()
        await checkpoint
        assert truncating_while_copying == [False]
        assert path.with_name("g.sqlite-wal").stat().st_size == 0
    finally:
        release.set()
        await db.close()


_DMS_PROBE = """
import fcntl, os, struct, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
lock = struct.pack("hhqqi", fcntl.F_WRLCK, os.SEEK_SET, 128, 1, 0)
print(struct.unpack("hhqqi", fcntl.fcntl(fd, fcntl.F_GETLK, lock))[0] != fcntl.F_UNLCK)
"""


def _wal_index_in_use(path: Path) -> bool:
    """Whether another process sees SQLite's lock on the WAL index's DMS byte (128 of
    the -shm file), which every connection holds while it is open."""
    probe = [sys.executable, "-c", _DMS_PROBE, f"{path}-shm"]
    out = subprocess.run(probe, capture_output=True, text=True, check=True, timeout=30)
    return out.stdout.strip() == "True"


async def test_closing_keeps_sqlites_locks_on_the_wal_index_until_the_writer_closes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The WAL index's descriptor kept for the checkpoints beside the writes is closed
    after SQLite's connections: closing any descriptor of a file drops every POSIX
    lock the process holds on it, so closing it first left the writer's last
    checkpoint running with the WAL index unlocked to other processes."""
    path = tmp_path / "l.sqlite"
    db = await Database.open(path, _schema)
    await db.run(_blobs(0), write=True)  # on the writer's thread: the -shm is open
    assert db._wal_index is not None
    seen = _at_truncate(db, monkeypatch, partial(asyncio.to_thread, _wal_index_in_use, path))
    await db.close()
    assert seen == [True]
    assert db._wal_index is None


def test_collecting_a_journal_does_not_scan_the_status_of_every_piece() -> None:
    """Collecting what a journal staged costs in proportion to the journal, not to
    the page: SQLite's own instruction count stays flat with 20,000 stored pieces,
    all of them waiting for upload."""
    conn = sqlite3.connect(":memory:", isolation_level=None)
    create_page_schema(conn)
    # Local pieces: each has an objects row and an unsynced row, neither scanned.
    sql.put_pieces(conn, [(i.to_bytes(33, "big"), b"\0") for i in range(20_000)], LOCAL)
    staged = [(b"s%032d" % i, b"x") for i in range(3)]
    sql.put_pieces(conn, staged, TRANSIENT)
    conn.executemany(
        "INSERT INTO journal_pieces (journal_id, digest) VALUES ('Ij', ?)",
        [(d,) for d, _ in staged],
    )
    steps = 0

    def count() -> int:
        nonlocal steps
        steps += 1
        return 0

    conn.set_progress_handler(count, 100)
    assert sql.keep_journal_pieces(conn, "Ij", {staged[0][0]}) == 2
    conn.set_progress_handler(None, 0)
    assert steps < 50, steps  # a scan of the pieces alone is over 1,000
    left = conn.execute(f"SELECT digest FROM piece_status WHERE status = {TRANSIENT}")
    assert left.fetchall() == []
    kept = conn.execute("SELECT status FROM piece_status WHERE digest = ?", (staged[0][0],))
    assert kept.fetchall() == [(LOCAL,)]


async def test_two_closes_during_a_write_close_once(tmp_path: Path) -> None:
    """Two closes that waited for the same write both went on to close: the second
    closed the WAL index's descriptor again (EBADF, or some other file's descriptor
    had its number been reused meanwhile). The second now finds it closed."""
    db = await Database.open(tmp_path / "c.sqlite", _schema)
    await db.run(_insert(1), write=True)
    assert db._wal_index is not None  # open since that write
    started, release = threading.Event(), threading.Event()

    def held(conn: sqlite3.Connection) -> None:
        started.set()
        release.wait(10)
        _insert(2)(conn)

    write = asyncio.ensure_future(db.run(held, write=True))
    await asyncio.to_thread(started.wait, 10)
    closes = [asyncio.ensure_future(db.close()) for _ in range(2)]
    await asyncio.sleep(0)  # both wait for the write's lock
    release.set()
    await write
    assert await asyncio.gather(*closes, return_exceptions=True) == [None, None]
    conn = sqlite3.connect(tmp_path / "c.sqlite")
    assert conn.execute("SELECT count(*) FROM t").fetchone() == (2,)
    conn.close()


def _orphan_wal(path: Path) -> None:
    """Leave at ``path`` what a lost database file leaves: its ``-wal`` (a table
    ``stale`` in it, not checkpointed), and no database file."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    conn.execute("CREATE TABLE stale (x)")
    conn.execute("INSERT INTO stale VALUES ('from the lost file')")
    wal = path.with_name(path.name + "-wal")
    saved = wal.read_bytes()  # before the close checkpoints and removes it
    conn.close()
    path.unlink()
    wal.write_bytes(saved)


async def test_a_database_made_where_a_lost_file_left_its_wal_does_not_take_that_wal(
    tmp_path: Path,
) -> None:
    # SQLite replays a -wal on the database of that name, whatever database it is: one
    # made anew where a lost file's -wal remained got that file's tables and pages
    # mixed into its own. A stale -wal (and -journal) is removed before it is made.
    path = tmp_path / "usage.sqlite"
    _orphan_wal(path)

    def schema(conn: sqlite3.Connection) -> None:
        conn.execute("CREATE TABLE t (x)")

    db = await Database.open(path, schema)
    try:
        rows = await db.read_all("SELECT name FROM sqlite_master WHERE type = 'table'")
        assert [r[0] for r in rows] == ["t"]
    finally:
        await db.close()


async def test_a_page_whose_file_is_lost_but_its_wal_is_left_is_refused_as_damaged(
    tmp_path: Path,
) -> None:
    # As a page file truncated to nothing: a -wal without its database means the page
    # was made and its file is gone, so it is not made anew over what is left.
    path = tmp_path / "page.sqlite"
    _orphan_wal(path)
    wal = path.with_name("page.sqlite-wal")
    before = wal.read_bytes()
    with pytest.raises(CorruptDatabaseError, match="-wal"):
        await Database.open(path, create_page_schema, empty_is_damage=True)
    assert not path.exists() and wal.read_bytes() == before


def _conn_closed(conn: sqlite3.Connection) -> bool:
    try:
        conn.execute("SELECT 1")
    except sqlite3.ProgrammingError:
        return True
    return False


async def test_a_close_cancelled_while_it_waits_for_the_copying_leaves_its_connections_to_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A close cancelled while it waited for the checkpoint beside the writes marked
    the database closed with nothing in ``unclosed``: a later close returned at once
    and its four connections stayed open. Now they are recorded before the wait, and
    the later close (which waits for the copying too) closes them."""
    started, release = _hold_copying(monkeypatch)
    db = await Database.open(tmp_path / "c.sqlite", _schema)
    try:
        await _write_until_copying(db, started)
        closing = asyncio.ensure_future(db.close())
        await asyncio.sleep(0)  # one turn: the close waits for the copying
        assert not closing.done()
        closing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await closing
        assert db.unclosed == ["inline writer", "inline reader", "reader", "writer"]
        assert not _conn_closed(db.writer.raw) and not _conn_closed(db.reader.raw)
        with pytest.raises(ClosedError):
            await db.run(_blobs(10_000), write=True)
    finally:
        release.set()
    await db.close()
    assert db.unclosed == [] and db.background_checkpoints == 1
    assert db.inline is not None and db.inline_reader is not None
    assert _conn_closed(db.writer.raw) and _conn_closed(db.reader.raw)
    assert _conn_closed(db.inline) and _conn_closed(db.inline_reader)
