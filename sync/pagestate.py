"""A page's sync state as status shows it, kept across restarts in repository meta.

This module owns :class:`PageState` (when a page last synced, why its last upload
failed, its conflicts then) and how it is kept (:data:`SYNCED_PREFIX`, one meta per
page). What is recorded when, and the reports, are :mod:`sync.status`'s.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

Key = tuple[bytes, bytes]

SYNCED_PREFIX = "sync/synced/"
"""Repository meta: per page (``{ledger hex}.{page hex}``), the UNIX time of its last
upload or import, and its conflicts then (:class:`PageState`, JSON): what status shows of
a page that is not open, also after a restart."""


@dataclass
class PageState:
    last_sync: float | None = None
    last_error: str | None = None  # why the page could not be uploaded
    conflicts: int | None = None  # keys with concurrent values at its last sync (None: unknown)
    waiting: bool = False  # ... and its policy asks a resolver about them

    def encode(self) -> bytes:
        return json.dumps([self.last_sync, self.conflicts, self.waiting]).encode()

    @classmethod
    def decode(cls, raw: bytes) -> PageState:
        """Raises ValueError unless ``raw`` is what :meth:`encode` wrote (or a time alone)."""
        v = json.loads(raw)
        if isinstance(v, int | float):
            return cls(float(v))
        t, conflicts, waiting = v
        return cls(
            None if t is None else float(t),
            None,
            None if conflicts is None else int(conflicts),
            bool(waiting),
        )


def waiting_reason(st: PageState | None) -> str | None:
    """Why a page's conflicts wait (as :attr:`ledgerd.store.Page.pending_conflict`)."""
    if st is None or not st.waiting:
        return None
    return f"{st.conflicts} keys need a conflict resolver"


def meta_name(key: Key) -> str:
    return f"{SYNCED_PREFIX}{key[0].hex()}.{key[1].hex()}"


def meta_key(name: str) -> Key | None:
    ledger, dot, page = name.removeprefix(SYNCED_PREFIX).partition(".")
    try:
        return (bytes.fromhex(ledger), bytes.fromhex(page)) if dot else None
    except ValueError:
        return None
