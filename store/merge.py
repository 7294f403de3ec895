"""Merging heads: common ancestors and the last-one-wins resolution.

This module owns the commit-graph walk that finds the lowest common ancestors
of two commits, and the last-one-wins merge of two trees over a base. It does
not choose when to merge or store anything; :mod:`store.page` does.
"""

from __future__ import annotations

import heapq
from collections.abc import Awaitable, Callable

from store import btree
from store.btree import Builder, Entry
from store.commit import Commit

LoadCommit = Callable[[bytes], Awaitable[Commit]]

_A, _B, _STALE = 1, 2, 4


async def common_ancestors(load: LoadCommit, a: Commit, b: Commit) -> list[Commit]:
    """The lowest common ancestors of ``a`` and ``b`` (git's merge-base walk).

    Commits are visited from the highest generation down; a commit reached from
    both sides is a candidate, and everything below a candidate is marked stale.
    Returns the candidates that are not ancestors of another candidate, sorted by
    id (several only in criss-cross histories).
    """
    if a.id == b.id:
        return [a]
    flags: dict[bytes, int] = {a.id: _A, b.id: _B}
    commits: dict[bytes, Commit] = {a.id: a, b.id: b}
    heap: list[tuple[int, bytes]] = [(-a.generation, a.id), (-b.generation, b.id)]
    queued = {a.id, b.id}
    found: list[bytes] = []
    while heap and any(not flags[cid] & _STALE for _, cid in heap):
        _, cid = heapq.heappop(heap)
        queued.discard(cid)
        f = flags[cid]
        if f & (_A | _B) == _A | _B and not f & _STALE:
            found.append(cid)
            f |= _STALE
            flags[cid] = f
        for pid in commits[cid].parents:
            if pid not in commits:
                commits[pid] = await load(pid)
            old = flags.get(pid, 0)
            flags[pid] = old | f
            if pid not in queued and flags[pid] != old:
                heapq.heappush(heap, (-commits[pid].generation, pid))
                queued.add(pid)
    result = [commits[c] for c in found]
    # A candidate may still be an ancestor of another one: keep only the lowest.
    lowest = []
    for c in result:
        others = [o for o in result if o.id != c.id]
        if not any([await is_ancestor(load, c, o) for o in others]):
            lowest.append(c)
    return sorted(lowest, key=lambda c: c.id)


async def is_ancestor(load: LoadCommit, maybe: Commit, of: Commit) -> bool:
    """True if ``maybe`` is ``of`` or one of its ancestors."""
    if maybe.id == of.id:
        return True
    heap: list[tuple[int, bytes]] = [(-of.generation, of.id)]
    seen = {of.id}
    commits = {of.id: of}
    while heap:
        _, cid = heapq.heappop(heap)
        c = commits[cid]
        if c.generation <= maybe.generation:
            continue
        for pid in c.parents:
            if pid == maybe.id:
                return True
            if pid not in seen:
                seen.add(pid)
                commits[pid] = await load(pid)
                heapq.heappush(heap, (-commits[pid].generation, pid))
    return False


def later(a: Commit, b: Commit) -> tuple[Commit, Commit]:
    """(later, earlier) by timestamp, then commit id."""
    return (a, b) if (a.timestamp, a.id) > (b.timestamp, b.id) else (b, a)


async def last_one_wins(builder: Builder, base_root: bytes, a: Commit, b: Commit) -> bytes:
    """Merged tree of ``a`` and ``b`` over ``base_root``: per key, the later commit wins.

    Keys changed on one side only take that side's entry; keys changed on both
    sides take the later commit's entry (a delete included).
    """
    win, lose = later(a, b)
    changes: list[tuple[bytes, Entry | None]] = []
    # Through the builder: a virtual merge base's nodes exist only in it.
    async for c in btree.diff3(builder, base_root, win.root, lose.root):
        # left is the winner's side, right the loser's.
        if c.left == c.base and c.right != c.base:
            changes.append((c.key, c.right))
    return await builder.apply(win.root, changes)
