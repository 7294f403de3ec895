"""Child process for the page-making crash tests: make a page and die at a chosen step.

``python -m tests.store.making_crash_child DATA_DIR POINT`` opens the repository and
opens (so makes) the page ``p`` of ledger ``l`` as a policy PUT or a sync download does
(no unwritten mark), killing itself with SIGKILL at ``POINT`` of the database file's
making (store.sqlite.db._create_private): ``made`` once the ``.new`` file is created,
``header`` once SQLite wrote its header (its journal may be left), ``rename`` just
before the rename into place. Exits 0 if it was never killed (the point was missed).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import sys
from pathlib import Path
from typing import Any
from unittest.mock import patch

from ledgerd.store import Repository
from ledgerd.store.sqlite.db import NEW_SUFFIX


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class _Dying:
    """A connection to the file being made that dies once its header is written."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        cursor = self.conn.execute(sql, *args)
        if "journal_mode" in sql:
            die()
        return cursor

    def close(self) -> None:
        self.conn.close()


def main(data: Path, point: str) -> None:
    connect, rename = sqlite3.connect, os.rename

    def connecting(path: Any, *args: Any, **kwargs: Any) -> Any:
        conn = connect(path, *args, **kwargs)
        if str(path).endswith(NEW_SUFFIX):
            if point == "made":
                die()
            if point == "header":
                return _Dying(conn)
        return conn

    def renaming(src: Any, dst: Any) -> None:
        if point == "rename" and str(src).endswith(NEW_SUFFIX):
            die()
        rename(src, dst)

    async def run() -> None:
        repo = await Repository.open(data)
        # store.sqlite.db calls sqlite3.connect and os.rename through their modules
        with patch.object(sqlite3, "connect", connecting), patch.object(os, "rename", renaming):
            await repo.open_page(b"l", b"p")

    asyncio.run(run())


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
