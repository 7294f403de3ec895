"""What a page gives to and takes from sync: deltas, whole states, and their pieces.

This is the module sync reaches a page's side of cloud sync through, without any network
code: the *delta* a page has to upload and its whole state for a checkpoint
(:mod:`store.page.outgoing`), verified imports of other devices' deltas and checkpoints
(:mod:`store.page.incoming`), and here the small reads and writes of a page's sync rows
and pieces. Sync (:mod:`sync.engine`) moves the bytes. The design is
``docs/convergence.md``.
"""

from __future__ import annotations

from collections.abc import Sequence

from ledgerd.store.errors import named
from ledgerd.store.page.incoming import VERIFY_INLINE as VERIFY_INLINE
from ledgerd.store.page.incoming import MissingValueError as MissingValueError
from ledgerd.store.page.incoming import NotReadyError as NotReadyError
from ledgerd.store.page.incoming import apply_delta as apply_delta
from ledgerd.store.page.incoming import apply_state as apply_state
from ledgerd.store.page.incoming import check_entries as check_entries
from ledgerd.store.page.incoming import forget as forget
from ledgerd.store.page.incoming import index_children as index_children
from ledgerd.store.page.incoming import readiness as readiness
from ledgerd.store.page.incoming import remote_locations as remote_locations
from ledgerd.store.page.outgoing import Delta as Delta
from ledgerd.store.page.outgoing import State as State
from ledgerd.store.page.outgoing import has_unuploaded as has_unuploaded
from ledgerd.store.page.outgoing import mark_uploaded as mark_uploaded
from ledgerd.store.page.outgoing import pending_delta as pending_delta
from ledgerd.store.page.outgoing import state as state
from ledgerd.store.page.outgoing import sync_value as sync_value
from ledgerd.store.page.outgoing import uploaded_upto as uploaded_upto
from ledgerd.store.page.page import Page
from ledgerd.store.sqlite import metadata
from ledgerd.store.sqlite.schema import DIGEST_IN
from ledgerd.store.sqlite.schema import PIECES_WAITING as PIECES_WAITING
from ledgerd.store.tree import dots

# -- small accessors ---------------------------------------------------------------------


async def set_sync_value(page: Page, name: str, value: bytes) -> None:
    await page.db.run(
        lambda conn: metadata.set_sync_values(conn, [(name, value)]),
        write=True,
    )


def waiting_seqs(raw: bytes | None) -> list[int]:
    """The packs of one device whose value pieces wait for their entries: the value of
    its ``PIECES_WAITING`` row (their sequence numbers, ascending, space-separated;
    ``0`` for none), parsed. One that cannot be read counts as a wait on the first
    pack, so garbage collection keeps the pieces until the row is written again."""
    if not raw:
        return []
    try:
        return sorted({n for n in map(int, raw.split()) if n > 0})
    except ValueError:
        return [1]


def waiting_value(seqs: Sequence[int]) -> bytes:
    """The ``PIECES_WAITING`` row's value for these sequence numbers (``0``: none)."""
    return b" ".join(str(n).encode() for n in sorted(set(seqs))) or b"0"


async def sync_values(page: Page, prefix: str) -> list[tuple[str, bytes]]:
    """The page's sync metadata rows whose names start with ``prefix``."""
    rows = await page.db.read_all(
        "SELECT name, value FROM sync_metadata WHERE substr(name, 1, ?) = ?", (len(prefix), prefix)
    )
    return [(str(n), bytes(v)) for n, v in rows]


async def piece_sizes(page: Page, digests: list[bytes]) -> dict[bytes, int]:
    """Length of each stored piece, without reading its bytes."""
    rows = await page.db.read_in(
        f"SELECT digest, length(data) FROM objects WHERE {DIGEST_IN}", digests
    )
    return {bytes(d): int(n) for d, n in rows}


async def read_pieces(page: Page, digests: list[bytes]) -> dict[bytes, bytes]:
    return await page.objects.get_pieces(digests)


format_time = dots.format_time


def context(page: Page) -> dots.Context:
    """The page's context: per writer tag, the clock time of its writes it has seen."""
    return dict(page.graph.ctx)


def describe_page(page: Page) -> str:
    return f"page {named(page.id)} of ledger {named(page.ledger)}"
