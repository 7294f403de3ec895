"""What a deleted page is: the state that deleting a page commits.

Deleting a page is a synced fact, not a local file removal: one commit, through the
page's journal like any write, that writes a tombstone over every key it holds and
puts :data:`MARK`, itself a tombstone. Every read treats a tombstone as absent, so the
page reads as empty. A page whose state holds the mark and no live entry is
*deleted*: listings leave it out. A write after the delete (on any device) makes a
live entry, and the page is listed again; a write concurrent with the delete stays,
as any write concurrent with a delete of its key does (:mod:`store.tree.dots`).

:data:`MARK` is one byte over the key limit, so no write can make or remove it: only
a page delete (which puts it) and a ``clear`` (which drops it) do.

This module owns the mark and the test; the writer makes the commit
(:meth:`store.page.writer.JournalWriter.delete_page`) and the repository keeps which
closed pages are deleted (``page_usage.deleted``).
"""

from __future__ import annotations

from ledgerd.store.page.view import KEY_LIMIT
from ledgerd.store.pieces.digest import TOMBSTONE
from ledgerd.store.tree import btree
from ledgerd.store.tree.btree import NodeLoader

_PREFIX = b"\xffledgerd:deleted-page\xff"
MARK = _PREFIX + b"\xff" * (KEY_LIMIT + 1 - len(_PREFIX))
"""The key of the tombstone a deleted page holds: longer than any key a write takes."""

assert len(MARK) == KEY_LIMIT + 1


async def is_deleted(nodes: NodeLoader, root: bytes) -> bool:
    """Whether a page whose head has this root is deleted: it holds the mark and no
    live entry (a scan that stops at the first live one)."""
    if not root or await btree.lookup(nodes, root, MARK) is None:
        return False
    async for run in btree.runs(nodes, root):
        for e in run:
            if e[1] != TOMBSTONE:  # (what reads see: the winner)
                return False
    return True
