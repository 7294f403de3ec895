"""A database file on disk: making it, preparing its schema, naming it, and the
store's errors for what SQLite and the file system say of it.

This module owns making a database file private (``0600``) and never empty, the
schema's first preparation, the URI a connection opens it by, the connections of
inline writes and reads, and :func:`translating` errors (blocking functions, run on
a thread). The connections' discipline is :mod:`store.sqlite.db`'s.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal

from ledgerd.store.errors import CorruptDatabaseError, from_os, from_sqlite

log = logging.getLogger("ledgerd.store.sqlite.db")
"""The database's logger (as before this module was split from :mod:`store.sqlite.db`)."""

PAGE_SIZE = 4096


@contextlib.contextmanager
def translating(path: Path) -> Iterator[None]:
    """SQLite's and the file system's errors on ``path`` as the store's own (see
    :func:`store.errors.from_sqlite`); errors that are bugs pass unchanged."""
    try:
        yield
    except sqlite3.Error as e:
        err = from_sqlite(e, path)
        if err is None:
            raise
        raise err from e
    except OSError as e:
        raise from_os(e, path) from e


NEW_SUFFIX = ".new"
"""Suffix of a database file being made, renamed to its name once it has a header."""


def create_private(path: Path, empty_is_damage: bool) -> None:
    """Create the database file ``0600`` (and missing directories ``0700``) whatever the
    umask, before SQLite opens it: SQLite gives its -wal and -shm files the database's
    mode. It is made under another name and renamed once SQLite has written its header
    (page size, WAL), so a database file is never empty: with ``empty_is_damage``, one
    found empty lost what it held (a truncation) and is refused rather than made anew."""
    try:
        size: int | None = os.stat(path).st_size
    except FileNotFoundError:
        size = None
    if size:
        return
    if size == 0 and empty_is_damage:
        log.error("%s is empty: its contents were lost (refused, not made anew)", path)
        raise CorruptDatabaseError(
            f"{path} is damaged: the file is empty (truncated; what it held is lost "
            "unless restored), so it is not opened as a new database"
        )
    # SQLite would replay a -wal or -journal left by a lost file of this name onto the
    # new database, mixing that file's pages into it.
    stale = [path.with_name(path.name + s) for s in ("-wal", "-journal")]
    if empty_is_damage and (found := [p for p in stale if p.exists()]):
        log.error("%s is missing but its %s remains (refused, not made anew)", path, found[0])
        raise CorruptDatabaseError(
            f"{path} is damaged: the file is missing but its {found[0].name} remains (the "
            "database was lost; what it held is lost unless restored), so it is not made anew"
        )
    for leftover in stale:
        leftover.unlink(missing_ok=True)
    missing = [d for d in (path.parent, *path.parent.parents) if not d.exists()]
    for d in reversed(missing):
        d.mkdir(mode=0o700, exist_ok=True)
    new = path.with_name(path.name + NEW_SUFFIX)
    for leftover in (new, *(new.with_name(new.name + s) for s in ("-wal", "-shm", "-journal"))):
        leftover.unlink(missing_ok=True)  # a making cut short
    os.close(os.open(new, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
    conn = sqlite3.connect(new, isolation_level=None)
    try:
        conn.execute(f"PRAGMA page_size = {PAGE_SIZE}")
        # Free pages can be given back (store.page.gc); set before the first table.
        conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
        conn.execute("PRAGMA journal_mode = WAL")  # writes the header
    finally:
        conn.close()
    os.rename(new, path)


def prepare(path: Path, create_schema: Callable[[sqlite3.Connection], None]) -> None:
    """Create or migrate the schema (the file has its page size and WAL from
    create_private)."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        create_schema(conn)
    finally:
        conn.close()


def connect_inline(path: Path, pragmas: list[str]) -> sqlite3.Connection:
    """The connection for inline writes, with the writer's ``pragmas``: it never
    checkpoints (the writer on its thread does) and never waits for a lock (the
    caller falls back to the writer)."""
    conn = sqlite3.connect(path, isolation_level=None, timeout=0, check_same_thread=False)
    try:
        for pragma in pragmas:
            conn.execute(pragma)
        conn.execute("PRAGMA wal_autocheckpoint = 0")
        conn.execute("PRAGMA cache_size = -2048")  # 2 MiB: it writes a few rows at a time
    except BaseException:
        conn.close()
        raise
    return conn


def connect_inline_reader(path: Path) -> sqlite3.Connection:
    """The connection for inline reads: read only, and it never waits for a lock."""
    conn = sqlite3.connect(path, isolation_level=None, timeout=0, check_same_thread=False)
    try:
        conn.execute("PRAGMA query_only = 1")
        conn.execute("PRAGMA cache_size = -16384")  # 16 MiB, as the reader's
    except BaseException:
        conn.close()
        raise
    return conn


def file_uri(path: Path, mode: Literal["ro", "rw"]) -> str:
    """The SQLite URI that opens ``path`` read-only (``ro``) or read-write without
    creating it (``rw``); the path percent-encoded, so that a ``?``, ``#`` or ``%``
    in a directory's name stays part of the name."""
    return f"{path.absolute().as_uri()}?mode={mode}"
