"""One transaction on one connection, and what may run inline on the event loop's thread.

This module owns running a function inside ``BEGIN IMMEDIATE`` ... ``COMMIT`` (rolled
back if it fails), undoing a ``BEGIN`` whose caller was cancelled, telling SQLite's busy
answers from its errors, and the limits of the writes and reads that run inline. Which
connection runs what, under which lock, is :mod:`store.sqlite.db`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Callable
from typing import Any, TypeVar

from ledgerd.store.sqlite.threads import Connection

T = TypeVar("T")

INLINE_MAX_ROWS = 64
INLINE_MAX_BYTES = 64 * 1024
"""What a caller may write inline (see :meth:`store.sqlite.db.Database.run`): about this
many rows and bytes."""
INLINE_ROUND = 64
"""One small write in this many goes to the writer's thread, whose commit checkpoints."""
INLINE_READ_ROWS = 8
"""What a caller may read inline (``Database.run(fn, small=True)`` without ``write``):
a query of at most this many rows by primary key, each of at most 64 KiB (a piece)."""


def fits_inline(rows: int, nbytes: int) -> bool:
    """Whether a write of ``rows`` rows and ``nbytes`` bytes is small enough to run
    inline (``Database.run(..., small=True)``)."""
    return rows <= INLINE_MAX_ROWS and nbytes <= INLINE_MAX_BYTES


def is_busy(e: sqlite3.OperationalError) -> bool:
    code = getattr(e, "sqlite_errorcode", 0)  # none on errors of the module itself
    return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


def in_transaction(fn: Callable[[sqlite3.Connection], T], conn: sqlite3.Connection) -> T:
    conn.execute("BEGIN IMMEDIATE")
    return in_begun_transaction(fn, conn)


def in_begun_transaction(fn: Callable[[sqlite3.Connection], T], conn: sqlite3.Connection) -> T:
    try:
        result = fn(conn)
        conn.commit()
    except BaseException:
        if conn.in_transaction:  # fn failed, or COMMIT did (disk full, I/O error)
            conn.rollback()
        raise
    return result


async def undo_begin(conn: Connection, begin: asyncio.Future[Any]) -> None:
    with contextlib.suppress(BaseException):
        await begin
    if conn.in_transaction:
        await conn.rollback()


async def close_now(conn: sqlite3.Connection) -> None:
    """Close an inline connection (on this thread: it never runs a long call)."""
    conn.close()
