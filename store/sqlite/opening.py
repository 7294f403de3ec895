"""Opening the connections of one database file.

This module owns making the file (if there is none) and its schema, then opening its
writer and reader connections on the shared SQLite threads with their settings, and the
inline writer and reader, closing those already open if a later one fails. What the
connections are for, and closing them, is :mod:`store.sqlite.db`'s.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from ledgerd.store.sqlite import files
from ledgerd.store.sqlite.threads import Connection


class Connections(NamedTuple):
    """A database's connections: ``inline`` is None when its writes may not run inline."""

    writer: Connection
    reader: Connection
    inline: sqlite3.Connection | None
    inline_reader: sqlite3.Connection


async def connect(
    path: Path,
    create_schema: Callable[[sqlite3.Connection], None],
    pragmas: list[str],
    *,
    inline: bool,
    empty_is_damage: bool,
) -> Connections:
    """Make ``path`` if there is none (see :func:`store.sqlite.files.create_private`),
    prepare its schema, and open its connections: the writer with ``pragmas``, the
    reader, the inline reader and, with ``inline``, the inline writer."""
    await asyncio.to_thread(files.create_private, path, empty_is_damage)
    await asyncio.to_thread(files.prepare, path, create_schema)
    writer = await Connection.connect(path, isolation_level=None)
    try:
        for pragma in pragmas:
            await writer.execute(pragma)
        reader = await Connection.connect(path, isolation_level=None)
    except BaseException:
        await writer.close()
        raise
    inline_writer = inline_reader = None
    try:
        await reader.execute("PRAGMA query_only = 1")
        await reader.execute("PRAGMA cache_size = -16384")
        inline_reader = await asyncio.to_thread(files.connect_inline_reader, path)
        if inline:
            inline_writer = await asyncio.to_thread(files.connect_inline, path, pragmas)
    except BaseException:
        if inline_reader is not None:
            inline_reader.close()
        await reader.close()
        await writer.close()
        raise
    return Connections(writer, reader, inline_writer, inline_reader)
