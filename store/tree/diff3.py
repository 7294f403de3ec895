"""Three-way diffs of page trees: the keys two trees changed from one base.

This module owns :class:`Change3`, :func:`diff3` and :func:`join3`, built on the two-way
:func:`store.tree.btree.diff`; it knows nothing of merging or resolving (see
:mod:`store.tree.merge`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from ledgerd.store.tree.btree import Change, Entry, NodeLoader, diff


@dataclass(frozen=True, slots=True)
class Change3:
    """A key changed on at least one side of a three-way diff."""

    key: bytes
    base: Entry | None
    left: Entry | None
    right: Entry | None


async def diff3(
    nodes: NodeLoader, base: bytes, left: bytes, right: bytes
) -> AsyncIterator[Change3]:
    """Keys changed base→left or base→right, in key order, with all three entries."""
    lefts = [c async for c in diff(nodes, base, left)]
    rights = [c async for c in diff(nodes, base, right)]
    for c in join3(lefts, rights):
        yield c


def join3(lefts: Sequence[Change], rights: Sequence[Change]) -> list[Change3]:
    """Two diffs from one base (each in key order) as three-way changes."""
    out: list[Change3] = []
    i = j = 0
    while i < len(lefts) or j < len(rights):
        if j == len(rights) or (i < len(lefts) and lefts[i].key < rights[j].key):
            c = lefts[i]
            out.append(Change3(c.key, c.old, c.new, c.old))
            i += 1
        elif i == len(lefts) or rights[j].key < lefts[i].key:
            c = rights[j]
            out.append(Change3(c.key, c.old, c.old, c.new))
            j += 1
        else:
            out.append(Change3(lefts[i].key, lefts[i].old, lefts[i].new, rights[j].new))
            i += 1
            j += 1
    return out
