"""The SQL of piece rows outside a commit's write: staging pieces under a token,
handing them to a journal, and pieces known to be in the cloud but not stored here.

This module owns those statements on ``journal_pieces`` and ``remote_pieces`` (the
multi-statement steps of a commit are :mod:`store.sqlite.sql`'s); when to stage or
adopt is :mod:`store.pieces.objects`'s.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Mapping

from ledgerd.store.sqlite.schema import digest_is
from ledgerd.store.sqlite.threads import Connection

_ADOPT = (
    "INSERT OR IGNORE INTO journal_pieces (journal_id, digest) "
    "SELECT ?, digest FROM journal_pieces WHERE journal_id = ?"
)


def stage(conn: sqlite3.Connection, token: str, digests: Iterable[bytes]) -> None:
    """List these pieces as staged under ``token``."""
    conn.executemany(
        "INSERT OR IGNORE INTO journal_pieces (journal_id, digest) VALUES (?, ?)",
        [(token, d) for d in digests],
    )


async def adopt(conn: Connection, token: str, journal_id: str) -> None:
    """Move the pieces staged under ``token`` to ``journal_id`` (in the caller's write
    transaction)."""
    await conn.execute(_ADOPT, (journal_id, token))
    await conn.execute("DELETE FROM journal_pieces WHERE journal_id = ?", (token,))


def note_remote(conn: sqlite3.Connection, lazy: Mapping[bytes, str]) -> None:
    """Record where in the cloud the pieces of ``lazy`` are, those not stored here."""
    conn.executemany(
        "INSERT OR REPLACE INTO remote_pieces (digest, location) SELECT ?1, ?2 "
        f"WHERE NOT EXISTS (SELECT 1 FROM objects WHERE {digest_is('digest', '?1')})",
        list(lazy.items()),
    )
