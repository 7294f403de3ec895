"""What a deleted page is: the tree that deleting a page commits.

Deleting a page is a synced fact, not a local file removal: one commit, through the
page's journal like any write, whose tree holds nothing but :data:`MARK` as a
tombstone. Every read treats a tombstone as absent, so the page reads as empty; and
because the tree is history-independent, that tree has one root digest on every
device, :data:`DELETED_ROOT`. A page whose head has that root is *deleted*: listings
leave it out. A write after the delete (on any device) adds keys next to the mark,
the root differs, and the page is listed again; a concurrent write merges with the
delete like any concurrent write (the mark, changed on one side only, stays).

:data:`MARK` is one byte over the key limit, so no write can make or remove it: only
a page delete (which puts it) and a ``clear`` (which empties the tree) do.

This module owns the mark and the root; the writer makes the commit
(:meth:`store.writer.JournalWriter.delete_page`) and the repository keeps which
closed pages are deleted (``page_usage.deleted``).
"""

from __future__ import annotations

from ledgerd.store.btree import Entry, Node, Priority, encode_node, key_level, node_pieces
from ledgerd.store.digest import TOMBSTONE
from ledgerd.store.view import KEY_LIMIT

_PREFIX = b"\xffledgerd:deleted-page\xff"
MARK = _PREFIX + b"\xff" * (KEY_LIMIT + 1 - len(_PREFIX))
"""The key of the tombstone a deleted page holds: longer than any key a write takes."""

assert len(MARK) == KEY_LIMIT + 1 and key_level(MARK) == 0  # one leaf: the root below

DELETED_ROOT = node_pieces(encode_node(Node(0, (Entry(MARK, TOMBSTONE, Priority.EAGER),), ())))[0]
"""The root digest of a deleted page's tree (the mark alone), the same on every device."""


def is_deleted(root: bytes) -> bool:
    """Whether a page whose head has this root is deleted."""
    return root == DELETED_ROOT
