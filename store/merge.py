"""Merging heads: common ancestors, what a merge must decide, and the merge rules.

This module owns the commit-graph walk that finds the lowest common ancestors
of two commits, the keys a merge decides (:func:`changed_keys`: what the smaller
side changed, when the rule allows), and the rules that merge two trees over a
base (last-one-wins, by revision for documents, through a resolver). It does not
choose when to merge or store anything; :mod:`store.merging` does.
"""

from __future__ import annotations

import asyncio
import enum
import heapq
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Literal

from ledgerd.store import btree, doclayout
from ledgerd.store.btree import Builder, Entry, NodeStore
from ledgerd.store.commit import Commit
from ledgerd.store.errors import CommitNotFoundError, StoreError
from ledgerd.store.view import live

LoadCommit = Callable[[bytes], Awaitable[Commit]]

_A, _B, _STALE = 1, 2, 4


class _Walk:
    """The merge-base walk's state (git's): commits visited from the highest generation
    down, each flagged with the sides it is reached from (``_A``, ``_B``) and, for
    :func:`common_ancestors`, whether it lies below a common ancestor (``_STALE``)."""

    def __init__(self, load: LoadCommit, a: Commit, b: Commit) -> None:
        self.load = load
        self.flags: dict[bytes, int] = {a.id: _A, b.id: _B}
        self.commits: dict[bytes, Commit] = {a.id: a, b.id: b}
        self.heap: list[tuple[int, bytes]] = [(-a.generation, a.id), (-b.generation, b.id)]
        self.queued = {a.id, b.id}

    def queued_flags(self) -> Iterator[int]:
        return (self.flags[cid] for _, cid in self.heap)

    def pop(self) -> bytes:
        """The queued commit of highest generation."""
        _, cid = heapq.heappop(self.heap)
        self.queued.discard(cid)
        return cid

    async def spread(self, cid: bytes, f: int) -> None:
        """Give ``cid``'s parents its flags ``f``; queue those whose flags grew."""
        for pid in self.commits[cid].parents:
            if pid not in self.commits:
                try:
                    self.commits[pid] = await self.load(pid)
                except CommitNotFoundError:  # below a shallow root (a checkpoint)
                    continue
            old = self.flags.get(pid, 0)
            self.flags[pid] = old | f
            if pid not in self.queued and self.flags[pid] != old:
                heapq.heappush(self.heap, (-self.commits[pid].generation, pid))
                self.queued.add(pid)


async def common_ancestors(load: LoadCommit, a: Commit, b: Commit) -> list[Commit]:
    """The lowest common ancestors of ``a`` and ``b`` (git's merge-base walk).

    Commits are visited from the highest generation down; a commit reached from
    both sides is a candidate, and everything below a candidate is marked stale.
    Returns the candidates that are not ancestors of another candidate, sorted by
    id (several only in criss-cross histories).
    """
    if a.id == b.id:
        return [a]
    w = _Walk(load, a, b)
    found: list[bytes] = []
    while w.heap and any(not f & _STALE for f in w.queued_flags()):
        cid = w.pop()
        f = w.flags[cid]
        if f & (_A | _B) == _A | _B and not f & _STALE:
            found.append(cid)
            f |= _STALE
            w.flags[cid] = f
        await w.spread(cid, f)
    result = [w.commits[c] for c in found]
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
                try:
                    commits[pid] = await load(pid)
                except CommitNotFoundError:  # below a shallow root: history not here
                    continue
                heapq.heappush(heap, (-commits[pid].generation, pid))
    return False


def later(a: Commit, b: Commit) -> tuple[Commit, Commit]:
    """(later, earlier) by timestamp, then commit id."""
    return (a, b) if (a.timestamp, a.id) > (b.timestamp, b.id) else (b, a)


@dataclass(frozen=True, slots=True)
class Changed:
    """The keys a merge decides, as three-way changes (left: ``a``'s side)."""

    changes: list[btree.Change3]
    onto: Literal["left", "right"] | None
    """None: ``changes`` are every key either side changed, and the result may be
    applied to either side. Else they are the keys the smaller side changed (with
    the whole group of each, if grouped), and the result must be applied to the
    other side, named here, whose own changes it keeps."""


async def changed_keys(
    nodes: btree.NodeLoader,
    base_root: bytes,
    a_root: bytes,
    b_root: bytes,
    group_of: Callable[[bytes], bytes | None] | None = None,
) -> Changed:
    """What a merge of ``a`` and ``b`` over ``base_root`` must decide, at a cost that
    follows the smaller side's change.

    The two diffs from the base are read side by side; when one ends, the other is
    left there. The keys the ended (smaller) side changed are then looked up in the
    larger side's tree, and a key of a group (``group_of``: a document's keys) brings
    the whole group, read from the three trees. A key changed on the larger side
    alone takes that side's entry under every policy that uses this (last-one-wins;
    by revision, where the side that changed a document has its newest revision),
    so the result is applied to that side. A device with a few commits of its own
    that merges a large import (or whose first commit meets one, over the empty
    page) no longer diffs the import."""
    da, db = btree.diff(nodes, base_root, a_root), btree.diff(nodes, base_root, b_root)
    ca: list[btree.Change] = []
    cb: list[btree.Change] = []
    a_ended = b_ended = False
    try:
        while not (a_ended or b_ended):
            try:
                ca.append(await anext(da))
            except StopAsyncIteration:
                a_ended = True
            try:
                cb.append(await anext(db))
            except StopAsyncIteration:
                b_ended = True
    finally:
        await da.aclose()
        await db.aclose()
    if a_ended and b_ended:
        return Changed(btree.join3(ca, cb), None)
    small, small_root, big_root = (ca, a_root, b_root) if a_ended else (cb, b_root, a_root)
    found: dict[bytes, tuple[Entry | None, Entry | None, Entry | None]] = {}
    groups: dict[bytes, None] = {}
    for c in small:
        group = None if group_of is None else group_of(c.key)
        if group is None:
            found[c.key] = (c.old, c.new, await btree.lookup(nodes, big_root, c.key))
        else:
            groups[group] = None
    for i, group in enumerate(groups):
        if i % TURN_KEYS == TURN_KEYS - 1:
            await asyncio.sleep(0)
        end = btree.prefix_end(group)
        base, mine, theirs = [
            {e.key: e async for e in btree.iterate(nodes, root, group, end)}
            for root in (base_root, small_root, big_root)
        ]
        for key in {**base, **mine, **theirs}:
            trio = base.get(key), mine.get(key), theirs.get(key)
            if not trio[0] == trio[1] == trio[2]:
                found[key] = trio
    changes = [
        btree.Change3(k, b, s, g) if a_ended else btree.Change3(k, b, g, s)
        for k, (b, s, g) in sorted(found.items())
    ]
    return Changed(changes, "right" if a_ended else "left")


TURN_KEYS = 2048
"""Keys (or documents) a merge handles between two turns it gives the event loop."""

Chosen = tuple[bytes, Entry | None, Entry | None, Entry | None]
"""A changed key of a merge: (key, the merged entry, the left's, the right's); None
where the key is absent."""


async def apply_to_nearer(
    builder: Builder,
    left_root: bytes,
    right_root: bytes,
    chosen: Iterable[Chosen],
    onto: Literal["left", "right"] | None = None,
) -> bytes:
    """The merged tree: the merge's entries applied to the side they differ from in
    fewer keys (or to ``onto``, when they cover only what the other side changed:
    :class:`Changed`). Trees are canonical (the same entries make the same tree
    whatever it was made from), so the result is the same from either side, and a
    merge costs what the smaller side changed: a device with a few edits of its
    own that merges a large import rewrites a few paths, not the whole page."""
    onto_left: list[tuple[bytes, Entry | None]] = []
    onto_right: list[tuple[bytes, Entry | None]] = []
    for i, (key, take, left, right) in enumerate(chosen):
        if i % TURN_KEYS == TURN_KEYS - 1:
            await asyncio.sleep(0)
        if take != left:
            onto_left.append((key, take))
        if take != right:
            onto_right.append((key, take))
    if onto == "left" or (onto is None and len(onto_left) <= len(onto_right)):
        return await builder.apply(left_root, onto_left)
    return await builder.apply(right_root, onto_right)


async def last_one_wins(
    builder: Builder, base_root: bytes, a: Commit, b: Commit, load: LoadCommit | None = None
) -> bytes:
    """Merged tree of ``a`` and ``b`` over ``base_root``: per key, the later commit wins.

    Keys changed on one side only take that side's entry; keys changed on both
    sides take the later commit's entry (a delete included). Except (with
    ``load``, to walk the history: :func:`write_times`) a key the later side holds
    through merges alone, no commit of its own history (not the other's) having
    written that entry, and that the earlier side wrote: there the write wins.
    The later side then holds the result of an older conflict, both of whose
    writes the other side has too, resolved otherwise than the base (devices
    merging in another order, or a virtual base, resolve it differently); the
    other side's write, made after both, is the later one, even where the later
    head wrote other keys since.
    """
    win, lose = later(a, b)
    chosen: list[Chosen] = []
    # Through the builder: a virtual merge base's nodes exist only in it.
    changed = await changed_keys(builder, base_root, win.root, lose.root)
    both = [
        c.key
        for c in changed.changes
        if c.left != c.base and c.right != c.base and c.left != c.right
    ]
    times: dict[bytes, tuple[int, int]] = {}
    if both and load is not None:
        wt, lt = await write_times(load, builder, win, lose, both)
        times = {k: (wt[k], lt[k]) for k in both}
    for c in changed.changes:
        # left is the winner's side, right the loser's.
        take = c.right if c.left == c.base and c.right != c.base else c.left
        if c.key in times and times[c.key][0] < 0 <= times[c.key][1]:
            take = c.right  # the winner holds it through merges only; the loser wrote it
        chosen.append((c.key, take, c.left, c.right))
    return await apply_to_nearer(builder, win.root, lose.root, chosen, changed.onto)


async def write_times(
    load: LoadCommit, nodes: btree.NodeLoader, a: Commit, b: Commit, keys: list[bytes]
) -> tuple[dict[bytes, int], dict[bytes, int]]:
    """Per key, on each side, when that side wrote the entry it holds: the timestamp
    of the newest commit of its own history (an ancestor of it, itself included,
    and not of the other side) that has one parent and changed the key to that
    entry; -1 if none did (the side holds it from the common history, or through
    merges). Found by the merge-base walk (generation order, both sides' flags);
    a parent not here (below a shallow root) counts as the empty page."""
    w = _Walk(load, a, b)
    own: dict[int, list[Commit]] = {_A: [], _B: []}
    while w.heap and any(f & (_A | _B) != _A | _B for f in w.queued_flags()):
        cid = w.pop()
        f = w.flags[cid]
        c = w.commits[cid]
        if f in own and len(c.parents) == 1:
            own[f].append(c)
        await w.spread(cid, f)
    commits = w.commits
    result: list[dict[bytes, int]] = []
    wanted = set(keys)
    for side, head in ((_A, a), (_B, b)):
        held = {k: await btree.lookup(nodes, head.root, k) for k in keys}
        times = dict.fromkeys(keys, -1)
        for i, c in enumerate(own[side]):
            if i % TURN_KEYS == TURN_KEYS - 1:
                await asyncio.sleep(0)
            p = commits.get(c.parents[0])
            before = btree.EMPTY if p is None else p.root
            if len(keys) <= FEW_KEYS:  # a few lookups, else the commit's own change
                for k in keys:
                    e = await btree.lookup(nodes, c.root, k)
                    if e == held[k] and await btree.lookup(nodes, before, k) != e:
                        times[k] = max(times[k], c.timestamp)
            else:
                async for d in btree.diff(nodes, before, c.root):
                    if d.key in wanted and d.new == held[d.key]:
                        times[d.key] = max(times[d.key], c.timestamp)
        result.append(times)
    return result[0], result[1]


FEW_KEYS = 16
"""Conflicting keys :func:`write_times` looks up in each commit; more, and it reads
each commit's change instead (the same answer)."""


class Policy(enum.Enum):
    """How a page merges concurrent changes (remembered per page)."""

    LAST_ONE_WINS = "last_one_wins"
    AUTOMATIC_WITH_FALLBACK = "automatic_with_fallback"
    CUSTOM = "custom"
    DOCUMENTS = "documents"
    """Per document, the side with the higher ``_rev`` wins, whole (:func:`by_revision`).
    A page whose tree holds :data:`store.doclayout.MARKER` merges so whatever its
    remembered policy."""


@dataclass(frozen=True, slots=True)
class Conflict:
    """One key for a resolver: its entry at the merge base and on each side (None: absent)."""

    key: bytes
    base: Entry | None
    left: Entry | None
    right: Entry | None


@dataclass
class MergeRequest:
    """What a resolver decides. ``left`` is the head with the smaller commit id, so
    every device sees the same orientation and, resolving the same way, creates
    the same merge commit."""

    ledger: bytes
    page: bytes
    left: Commit
    right: Commit
    policy: Policy
    conflicts: list[Conflict]


Choice = Literal["left", "right"] | bytes | None
"""A resolver's answer for a key: take a side, a new value (bytes), or delete (None)."""

Resolver = Callable[[MergeRequest], Awaitable[dict[bytes, Choice]]]


class NeedsResolver(StoreError):
    """The page's policy needs a resolver and none gave an answer; heads are kept."""


async def resolve(
    builder: Builder,
    base_root: bytes,
    left: Commit,
    right: Commit,
    policy: Policy,
    ask: Callable[[list[Conflict]], Awaitable[dict[bytes, Choice]]] | None,
    new_value: Callable[[bytes, bytes, Entry | None], Entry],
) -> bytes:
    """Merged tree of two heads under ``policy`` (``left.id < right.id``).

    AUTOMATIC_WITH_FALLBACK: keys changed on one side (or the same way on both)
    merge by themselves; the rest go to ``ask``. CUSTOM: every changed key goes to
    ``ask``. Raises NeedsResolver when an answer is needed and ``ask`` is None.
    """
    changes = [c async for c in btree.diff3(builder, base_root, left.root, right.root)]
    sides = {c.key: (c.left, c.right) for c in changes}
    result: dict[bytes, Entry | None] = {}
    pending: list[Conflict] = []
    for c in changes:
        # A resolver sees a tombstone (a delete kept for merges) as absent.
        conflict = Conflict(c.key, live(c.base), live(c.left), live(c.right))
        if policy is Policy.CUSTOM:
            pending.append(conflict)
        elif c.left == c.base:
            result[c.key] = c.right
        elif c.right == c.base or c.left == c.right:
            result[c.key] = c.left
        else:
            pending.append(conflict)
    if pending:
        if ask is None:
            raise NeedsResolver(f"{len(pending)} keys need a conflict resolver")
        answers = await ask(pending)
        for conflict in pending:
            if conflict.key not in answers:
                raise NeedsResolver(f"the resolver gave no answer for {conflict.key[:40]!r}")
            choice = answers[conflict.key]
            if choice == "left":
                result[conflict.key] = conflict.left
            elif choice == "right":
                result[conflict.key] = conflict.right
            elif choice is None:
                result[conflict.key] = None
            elif isinstance(choice, bytes):
                result[conflict.key] = new_value(
                    conflict.key, choice, conflict.left or conflict.right
                )
            else:
                raise NeedsResolver(f"the resolver's answer for {conflict.key[:40]!r} is invalid")
    chosen = [(k, e, *sides[k]) for k, e in result.items()]
    return await apply_to_nearer(builder, left.root, right.root, chosen)


# -- documents -------------------------------------------------------------------


async def holds_documents(nodes: NodeStore, *roots: bytes) -> bool:
    """True if any of the trees is a document page's (holds the marker)."""
    for root in roots:
        if await btree.lookup(nodes, root, doclayout.MARKER) is not None:
            return True
    return False


async def by_revision(builder: Builder, base_root: bytes, a: Commit, b: Commit) -> bytes:
    """Merged tree of a document page: per document, every key of the side whose
    head has the higher revision (body, attachments, a deletion or purge alike).

    Keys are grouped by document (:func:`store.doclayout.group_of`); a group takes
    all its changed keys from one side, so a document is never a mix of two
    revisions. The marker stays while either side has it (a page deleted on one
    device and written on another keeps the other's documents, and is still a
    document page); other keys (index definitions) merge last-one-wins.
    Everything comes from the trees and the commits, so every device merging the
    same heads builds the same tree.
    """
    win, _ = later(a, b)
    a_wins = win is a
    result: list[Chosen] = []
    groups: dict[bytes, list[btree.Change3]] = {}
    changed = await changed_keys(builder, base_root, a.root, b.root, doclayout.group_of)
    for c in changed.changes:
        group = doclayout.group_of(c.key)
        if group is not None:
            groups.setdefault(group, []).append(c)
        elif c.key == doclayout.MARKER:
            continue  # below
        elif c.left == c.base:
            result.append((c.key, c.right, c.left, c.right))
        elif c.right == c.base or c.left == c.right:
            result.append((c.key, c.left, c.left, c.right))
        else:
            result.append((c.key, c.left if a_wins else c.right, c.left, c.right))
    for i, (group, changes) in enumerate(groups.items()):
        if i % TURN_KEYS == TURN_KEYS - 1:
            await asyncio.sleep(0)  # a merge of a large import lets others run meanwhile
        head = doclayout.head_key_of_group(group)
        hc = next((c for c in changes if c.key == head), None)
        left, right = (None, None) if hc is None else (hc.left, hc.right)
        lr, rr = doclayout.rank(left), doclayout.rank(right)
        take_left = lr > rr if lr != rr else a_wins  # equal heads: the later commit's keys
        result.extend((c.key, c.left if take_left else c.right, c.left, c.right) for c in changes)
    # The marker stays while either side has it (looked up: the changes cover one side
    # only): a page deleted on one device and written on another keeps the other's
    # documents and stays a document page.
    left = await btree.lookup(builder, a.root, doclayout.MARKER)
    right = await btree.lookup(builder, b.root, doclayout.MARKER)
    result.append((doclayout.MARKER, left if left is not None else right, left, right))
    return await apply_to_nearer(builder, a.root, b.root, result, changed.onto)
