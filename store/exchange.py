"""What a page gives to and takes from sync: pending uploads and verified imports.

This module owns the store side of cloud sync without any network code: listing
what a page has not uploaded yet (commits and pieces, split into EAGER and LAZY),
recording an upload, and importing commits and pieces that came from elsewhere
after verifying them (digests, commit ids, references). Sync
(:mod:`sync.engine`) moves the bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import operator
import os
import sqlite3
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Concatenate, ParamSpec, TypeVar

from ledgerd.store import btree, commit, gc, merge, split, sql
from ledgerd.store import digest as dg
from ledgerd.store.btree import Priority
from ledgerd.store.commit import Commit
from ledgerd.store.errors import (
    CorruptObjectError,
    InvalidArgumentError,
    StoreError,
)
from ledgerd.store.objects import mismatched
from ledgerd.store.page import Page
from ledgerd.store.schema import SYNCED
from ledgerd.store.threads import OFF_LOOP_BYTES, off_loop

log = logging.getLogger(__name__)
P = ParamSpec("P")
T = TypeVar("T")


class MissingParentError(StoreError):
    """A commit's parent is not here yet: import it after the parent arrives."""


class MissingObjectError(MissingParentError):
    """A tree node or value a remote commit reaches is neither here nor in its pack.

    Another device's pack may bring it (devices that build the same node upload it
    once), so this too waits rather than refuses."""


@dataclass
class Upload:
    """What a page has not uploaded: commits (oldest first) and pieces by priority."""

    commits: list[Commit]
    eager: list[bytes] = field(default_factory=list)
    lazy: list[bytes] = field(default_factory=list)
    base_root: bytes = b""
    """Root of the newest uploaded commit the upload builds on (its tree is on every
    device that can import the upload): what tree nodes may be sent as edits of."""

    @property
    def empty(self) -> bool:
        return not self.commits and not self.eager and not self.lazy


async def pending_upload(page: Page) -> Upload:
    """Unsynced commits, and the local (not yet synced) pieces they brought.

    Nothing while the page has several heads (a conflict waiting for its
    resolver): upload waits until the page is back to one head.

    Every local piece is uploaded; LAZY values' pieces apart. Which values are
    LAZY comes from one diff: from the newest synced commit on the head's line of
    parents (through a merge, its synced parent of the highest generation: after
    merging an import, the import's head) to the head, taken only if some local
    piece is a value's. So the cost follows what changed since the last upload,
    not how many commits did it (a bulk load of 100 commits rewrites most leaves
    100 times), nor what a merge brought from other devices. The head therefore
    decides a value's priority: one that it holds as LAZY waits to be fetched,
    even if an earlier unsynced commit held it as EAGER (reading that commit
    elsewhere fetches it). Only when some local value
    is in no such change (a later unsynced commit replaced it) does it take a diff
    per unsynced commit, to learn whether that value was LAZY.
    """
    await page.flush()
    heads = await page.heads()
    if len(heads) > 1:
        return Upload([])

    def snapshot(conn: sqlite3.Connection) -> tuple[list[bytes], set[bytes]]:
        # One read transaction: the commits and the pieces they brought, as of one moment.
        conn.execute("BEGIN")
        try:
            ids = [
                bytes(r[0])
                for r in conn.execute(
                    "SELECT commit_id FROM unsynced_commits ORDER BY generation, commit_id"
                )
            ]
            return ids, {bytes(r[0]) for r in conn.execute(sql.LOCAL_PIECES)}
        finally:
            conn.execute("COMMIT")

    ids, local = await page.db.run(snapshot)
    commits = [await page.load_commit(cid) for cid in ids]
    unsynced = {c.id for c in commits}
    lazy_roots: set[bytes] = set()
    eager_roots: set[bytes] = set()

    async def changes(base_root: bytes, root: bytes) -> None:
        async for ch in btree.diff(page.nodes, base_root, root):
            if ch.new is not None:
                (lazy_roots if ch.new.priority == Priority.LAZY else eager_roots).add(ch.new.value)

    base_root = btree.EMPTY
    if heads and heads[0].id in unsynced:
        base = heads[0]
        while base.id in unsynced and base.parents:
            parents = [await page.load_commit(p) for p in base.parents]
            up = [p for p in parents if p.id not in unsynced]
            base = max(up, key=lambda p: p.generation) if up else parents[0]
        base_root = btree.EMPTY if base.id in unsynced else base.root
        if any(dg.kind_of(d) == dg.Kind.VALUE for d in local):
            await changes(base_root, heads[0].root)
    pieces_of = {root: await _value_pieces(page, root) for root in lazy_roots | eager_roots}
    seen = {d for ps in pieces_of.values() for d in ps}
    if any(dg.kind_of(d) == dg.Kind.VALUE and d not in seen for d in local):
        for c in commits:  # a value replaced since: which priority did it have?
            await changes(
                (await page.load_commit(c.parents[0])).root if c.parents else btree.EMPTY, c.root
            )
        for root in lazy_roots | eager_roots:
            if root not in pieces_of:
                pieces_of[root] = await _value_pieces(page, root)
    lazy = {d for root in lazy_roots for d in pieces_of[root] if d in local}
    if lazy:
        for root in eager_roots:  # a piece an EAGER value also uses travels EAGER
            lazy.difference_update(pieces_of[root])
    eager = sorted(local - lazy)
    # LAZY pieces in the order of their values' bytes, so that one value's pieces sit
    # next to each other in a pack and a reader fetches them with few ranged GETs.
    ordered: dict[bytes, None] = {}
    for root in sorted(lazy_roots):
        for d in await _pieces_in_order(page, root):
            if d in lazy:
                ordered[d] = None
    ordered.update(dict.fromkeys(sorted(lazy)))
    return Upload(commits, eager, list(ordered), base_root)


async def _value_pieces(page: Page, root: bytes) -> set[bytes]:
    """The stored pieces of one value: a value of one chunk is its own (no call for
    it: an upload of a bulk load asks for a hundred thousand)."""
    if dg.is_inline(root):
        return set()
    if not dg.is_index(root):
        return {root}
    return await page.objects.value_pieces([root])


async def _pieces_in_order(page: Page, root: bytes) -> list[bytes]:
    """A value's pieces in the order of its bytes (each index before what it lists)."""
    out: list[bytes] = []
    stack = [root]
    while stack:
        d = stack.pop()
        if dg.is_inline(d):
            continue
        out.append(d)
        if dg.is_index(d):
            children = split.decode_index(await page.objects.get_piece(d))
            stack.extend(reversed([c.digest for c in children]))
    return out


async def replaced_nodes(
    page: Page, old_root: bytes, new_nodes: list[bytes], budget: int
) -> list[bytes]:
    """Tree nodes of ``old_root``'s tree that the new nodes replace (top-down, while
    their bytes stay within ``budget``): a receiver holding the old tree rebuilds
    the new nodes from them cheaply. Nodes split into several pieces are left out."""
    if not old_root:
        return []
    refs = set(new_nodes)
    for d in new_nodes:
        if not dg.is_index(d):
            refs.update(await _children(page, d))
    out: list[bytes] = []
    total = 0
    frontier = [old_root]
    while frontier:
        d = frontier.pop()
        if d in refs or dg.is_inline(d) or dg.is_index(d):
            continue
        try:
            data = await page.objects.get_piece(d)
        except StoreError:  # pruned: send the nodes whole
            continue
        total += len(data)
        if total > budget:
            break
        out.append(d)
        refs.add(d)
        frontier.extend(c for c in btree.decode_node(data).children if c)
    return out


async def local_nodes(
    page: Page, digests: list[bytes], also: Mapping[bytes, bytes] | None = None
) -> bytes:
    """The concatenated bytes of tree nodes stored here, or in ``also`` (an edited
    section's bases); MissingObjectError if one is in neither (it arrives with the
    commits that hold it)."""
    if not digests:
        return b""
    also = also or {}
    here = [d for d in digests if d not in also]
    known = await page.objects.known(here)
    missing = [d for d in here if d not in known]
    if missing:
        raise MissingObjectError(f"tree node {dg.short(missing[0])} a pack edits is not here")
    got = {**(await page.objects.get_pieces(here) if here else {}), **also}
    return b"".join(got[d] for d in digests)


async def _children(page: Page, d: bytes) -> tuple[bytes, ...]:
    return (await page.nodes.load(d)).children


async def piece_sizes(page: Page, digests: list[bytes]) -> dict[bytes, int]:
    """Length of each stored piece, without reading its bytes."""
    rows = await page.db.read_in(
        "SELECT digest, length(data) FROM objects WHERE digest IN ({marks})", digests
    )
    return {bytes(d): int(n) for d, n in rows}


async def read_pieces(page: Page, digests: list[bytes]) -> dict[bytes, bytes]:
    return await page.objects.get_pieces(digests)


async def mark_uploaded(page: Page, commit_ids: Iterable[bytes], digests: Iterable[bytes]) -> None:
    """After a successful upload: pieces become ``synced``, commits leave ``unsynced``."""
    ids = [(c,) for c in commit_ids]

    def work(conn: sqlite3.Connection) -> None:
        sql.mark_uploaded(conn, digests)
        conn.executemany("DELETE FROM unsynced_commits WHERE commit_id = ?", ids)

    await page.db.run(work, write=True)


STALE_FRACTION = 0.5
"""An unuploaded commit's parent from the bucket is *stale* once it is older than this
share of the page's ``history_retention``: other devices may have pruned it by the
time the commit reaches them (their clocks, and when their collections run, differ
from this device's; they are taken to keep the same retention)."""

FRESH, CARRIED, STALE, BUSY = "fresh", "carried", "stale", "busy"


async def carry_over_stale(page: Page, retention: float) -> str:
    """Keep this device's unuploaded commits off parents other devices cannot build on.

    A commit built on a commit from the bucket that is older than history retention
    (a device back from a long time offline) reuses that commit's tree nodes and
    values, which the pack does not carry (the bucket has them) and which a device
    that pruned the commit deleted: that device could never import it, nor anything
    built on it, and the page stayed apart for good. A commit built on one that a
    rejoin or an earlier carry-over left behind (a transaction open across it) has
    a parent no other device will ever have.

    So when a parent of an unuploaded commit was left behind, or is *stale* (older
    than :data:`STALE_FRACTION` of the page's retention, its own or ``retention``)
    and another parent from the bucket descends from it (the merge of what a
    download brought), the unuploaded commits are replaced by one on the parents
    from the bucket that no other descends from (its *tips*), with the head's tree
    (:meth:`store.merging.Merger.reparent`): ``CARRIED``. No tip is dropped: a
    commit of the bucket the head builds on and the new one did not descend from
    would bring back what the device changed since (a deletion made after it, for
    one). ``STALE``: a tip is stale (a download may bring a newer one: upload after
    it; if none does, that tip is the newest the bucket has). ``BUSY``: it could not
    be done now (an open transaction began on a commit it would replace, or the page
    has several heads): upload nothing of the page before a later try. ``FRESH``:
    nothing to do."""
    await page.flush()
    rows = await page.db.read_all("SELECT commit_id FROM unsynced_commits")
    ids = {bytes(r[0]) for r in rows}
    if not ids:
        return FRESH
    own = await gc.page_retention(page)
    cutoff = page.stamps.now_us() - int((retention if own is None else own) * STALE_FRACTION * 1e6)
    left = await page.db.run(sql.left_behind)
    parents: dict[bytes, Commit] = {}  # parents in the bucket
    gone = False  # a parent left behind
    for cid in ids:
        for pid in (await page.load_commit(cid)).parents:
            if pid in left:
                gone = True
            elif pid not in ids and pid != commit.FIRST.id and pid not in parents:
                parents[pid] = await page.load_commit(pid)
    if not parents:
        return FRESH
    tips: list[Commit] = []  # the parents no other parent descends from
    for c in parents.values():
        others = [o for o in parents.values() if o.id != c.id]
        if not [o for o in others if await merge.is_ancestor(page.load_commit, c, o)]:
            tips.append(c)
    stale = [c for c in parents.values() if c.timestamp < cutoff]
    if gone or any(c not in tips for c in stale):
        tips.sort(key=lambda c: c.id)
        carried = await page.merger.reparent(tips, os.urandom(8), page.pinned_commits)
        return CARRIED if carried is not None else BUSY
    return STALE if stale else FRESH


async def sync_value(page: Page, name: str) -> bytes | None:
    rows = await page.db.read_all("SELECT value FROM sync_metadata WHERE name = ?", (name,))
    return bytes(rows[0][0]) if rows else None


async def set_sync_value(page: Page, name: str, value: bytes) -> None:
    await page.db.run(
        lambda conn: conn.execute(
            "INSERT OR REPLACE INTO sync_metadata (name, value) VALUES (?, ?)", (name, value)
        ),
        write=True,
    )


async def import_remote(
    page: Page,
    commit_data: list[bytes],
    pieces: dict[bytes, bytes],
    lazy: dict[bytes, str],
    marker: tuple[str, bytes] | None = None,
    more: Iterable[tuple[str, bytes]] = (),
    history: bool = False,
) -> list[Commit]:
    """Verify and store commits and pieces that came from the cloud; merge heads.

    ``pieces`` are EAGER contents (verified against their digests here); ``lazy``
    maps digests of pieces left in the cloud to their location. Every commit id is
    recomputed, its parents must be here or in the batch, and every tree node its
    root reaches must be here or in ``pieces``. Commits of the batch below one that
    is here are skipped (see :func:`_below`). A commit of the batch that is here
    already and waiting for upload (this device made the same merge of the same
    heads) is in the cloud now: it is no longer uploaded. Nothing is stored unless
    all of it checks out. ``marker`` is a sync_metadata row written in the same
    transaction (the cursor). ``history``: the commits are ancestors of the page's
    head that a page started from a checkpoint reads again (a pack its checkpoint
    covered): none becomes a head, so none is merged with the head over the part of
    the history that is here so far (over the empty page, it undid the checkpoint's
    later changes and deletions). Returns the commits that were new.
    """
    await _verify(pieces)
    # The trees are checked without the commit lock: garbage collection must not
    # delete a stored node they reuse before the commits are stored (store.gc).
    async with gc.held(page):
        return await _import(page, commit_data, pieces, lazy, marker, more, history)


async def _import(
    page: Page,
    commit_data: list[bytes],
    pieces: dict[bytes, bytes],
    lazy: dict[bytes, str],
    marker: tuple[str, bytes] | None,
    more: Iterable[tuple[str, bytes]],
    history: bool = False,
) -> list[Commit]:
    commits = [commit.decode(data) for data in commit_data]
    known = {c.id: c for c in commits}
    here = {c.id for c in commits if await _has_commit(page, c.id)}
    below = _below(known, here)
    new: list[Commit] = []
    for c in commits:
        if c.id in here or c.id in below:
            continue
        generations = []
        times = []
        for p in c.parents:
            if p in below:  # not here, and nothing in the batch that is new builds on it
                raise MissingParentError(f"commit {c.id.hex()[:12]} needs {p.hex()[:12]}")
            if p in known:
                generations.append(known[p].generation)
                times.append(known[p].timestamp)
                continue
            try:
                parent = await page.load_commit(p)
            except StoreError:
                raise MissingParentError(f"commit {c.id.hex()[:12]} needs {p.hex()[:12]}") from None
            generations.append(parent.generation)
            times.append(parent.timestamp)
        if c.parents and c.generation != 1 + max(generations):
            raise CorruptObjectError(f"commit {c.id.hex()[:12]} has a wrong generation")
        # An ordinary commit is later than its parent (the hybrid logical clock); a
        # merge carries the latest of its parents' times (store.commit).
        if times and c.timestamp < max(times) + (1 if len(times) == 1 else 0):
            raise CorruptObjectError(f"commit {c.id.hex()[:12]} is older than its parents")
        if not c.parents:
            raise CorruptObjectError(f"commit {c.id.hex()[:12]} claims to be a first commit")
        new.append(c)
    await _check_trees(page, [c.root for c in new], pieces, lazy)

    def work(conn: sqlite3.Connection) -> None:
        _store_remote(conn, pieces, lazy)
        for c in sorted(new, key=lambda c: c.generation):
            _sql_insert_commit(conn, c)
        if history:  # below the head: never heads (childless only until the rest is read)
            ids = [c.id for c in new]
            tips = [
                cid
                for cid in ids
                if conn.execute("DELETE FROM heads WHERE commit_id = ?", (cid,)).rowcount
            ]
            sql.leave_behind(conn, tips)
        # (Its pieces that the batch holds are synced by _store_remote.)
        conn.executemany(
            "DELETE FROM unsynced_commits WHERE commit_id = ?", [(cid,) for cid in here]
        )
        conn.executemany(
            "INSERT OR REPLACE INTO sync_metadata (name, value) VALUES (?, ?)",
            [marker, *more] if marker is not None else list(more),
        )

    await page.adopt_remote(work, new)
    return new


def _below(known: dict[bytes, Commit], here: set[bytes]) -> set[bytes]:
    """The batch's commits that are not here but are ancestors, within the batch, of
    one that is. A page with its whole history has every ancestor of what it holds,
    so this is empty there; a page started from a checkpoint does not hold the
    commits below its root, and another device may upload them again (two devices
    that merged the same heads made the same merge commits): their changes are in
    the page already, and their parents may be compacted away, so they are skipped."""
    below: set[bytes] = set()
    todo = [p for cid in here for p in known[cid].parents]
    while todo:
        cid = todo.pop()
        if cid in known and cid not in here and cid not in below:
            below.add(cid)
            todo.extend(known[cid].parents)
    return below


@dataclass
class Snapshot:
    """A page's single head and every piece its tree reaches, for a checkpoint."""

    commit: Commit
    eager: list[bytes]  # tree nodes and EAGER values' pieces
    lazy: list[bytes]  # LAZY values' pieces (an EAGER value's pieces excepted)
    also: list[Commit] = field(default_factory=list)


async def head_snapshot(page: Page, also: Iterable[bytes] = ()) -> Snapshot | None:
    """The page's head and the pieces it reaches, if the page has exactly one head,
    nothing waiting to be uploaded and anything in it (else None).

    ``also``: ancestors of the head that other devices may still build on (the
    newest commit seen from each); the snapshot takes them and the pieces their
    trees add (few: they are close to the head), so that a device starting from it
    can import what those devices write next. One that history retention pruned is
    left out: its tree may be gone (reading it failed every checkpoint of the page)."""
    await page.flush()
    heads = await page.heads()
    if len(heads) != 1 or heads[0].id == commit.FIRST.id or await unsynced_count(page):
        return None
    head = heads[0]
    nodes: list[bytes] = []
    eager_values: set[bytes] = set()
    lazy_values: set[bytes] = set()
    extra = []
    for cid in dict.fromkeys(also):
        if cid != head.id and cid != commit.FIRST.id and not await gc.is_pruned(page, cid):
            with contextlib.suppress(StoreError):
                extra.append(await page.load_commit(cid))
    seen: set[bytes] = set()
    frontier = [c.root for c in [head, *extra] if c.root]
    while frontier:
        nxt: list[bytes] = []
        for d in frontier:
            if d in seen:
                continue
            seen.add(d)
            if not dg.is_inline(d):
                nodes.append(d)
            if len(seen) % btree.DIFF_TURN_NODES == 0:
                await asyncio.sleep(0)  # a whole tree: others run meanwhile
            node = await page.nodes.load(d)
            nxt.extend(c for c in node.children if c and c not in seen)
            for e in node.entries:
                (lazy_values if e[2] == Priority.LAZY else eager_values).add(e[1])
        frontier = nxt
    eager = await page.objects.value_pieces([*nodes, *eager_values])
    lazy: dict[bytes, None] = {}
    for root in sorted(lazy_values):
        for d in await _pieces_in_order(page, root):
            if d not in eager:
                lazy[d] = None
    return Snapshot(head, sorted(eager), list(lazy), extra)


def _holding_gc(
    fn: Callable[Concatenate[Page, P], Awaitable[T]],
) -> Callable[Concatenate[Page, P], Awaitable[T]]:
    """Run ``fn(page, ...)`` with the page's garbage collection held off: imports
    check trees without the commit lock, and a stored node they reuse must stay."""

    async def held(page: Page, /, *args: P.args, **kwargs: P.kwargs) -> T:
        async with gc.held(page):
            return await fn(page, *args, **kwargs)

    held.__name__, held.__doc__ = fn.__name__, fn.__doc__
    return held


@_holding_gc
async def import_checkpoint(
    page: Page,
    commit_data: list[bytes],
    pieces: dict[bytes, bytes],
    lazy: dict[bytes, str],
    markers: list[tuple[str, bytes]],
) -> list[Commit]:
    """Store a checkpoint (a commit whose ancestors stay in the cloud, its whole tree)
    into a page that has nothing yet: the commit becomes the page's head and a
    shallow root (history below it is not here). Verified like :func:`import_remote`.
    ``markers`` are sync_metadata rows written in the same transaction. Returns the
    commit if it was new; nothing if the page already has it; raises
    InvalidArgumentError if the page already has other commits.
    """
    await _verify(pieces)
    c, *also = _checkpoint_commits(commit_data)
    if any(x.generation >= c.generation for x in also):
        raise CorruptObjectError("a checkpoint's other commits are not older than its head")
    if await _has_commit(page, c.id):
        return []
    heads = await page.heads()
    if [h.id for h in heads] != [commit.FIRST.id]:
        raise InvalidArgumentError("a checkpoint goes only into a page that has nothing yet")
    await _check_trees(page, [c.root, *(x.root for x in also)], pieces, lazy)

    def work(conn: sqlite3.Connection) -> None:
        if conn.execute("SELECT count(*) FROM commits").fetchone()[0] > 1:
            raise InvalidArgumentError("a checkpoint goes only into a page that has nothing yet")
        _store_remote(conn, pieces, lazy)
        sql.insert_commit(conn, c, unsynced=False)
        for x in also:  # ancestors of the head: commits, never heads
            sql.insert_commit(conn, x, unsynced=False)
            conn.execute("DELETE FROM heads WHERE commit_id = ?", (x.id,))
            sql.add_shallow_root(conn, x.id)
        sql.leave_behind(conn, [x.id for x in also])
        conn.execute("DELETE FROM heads WHERE commit_id = ?", (commit.FIRST.id,))
        conn.execute("DELETE FROM commits WHERE id = ?", (commit.FIRST.id,))
        sql.add_shallow_root(conn, c.id)
        sql.add_below(conn, c.id, [x.id for x in also])
        conn.executemany(
            "INSERT OR REPLACE INTO sync_metadata (name, value) VALUES (?, ?)", markers
        )

    await page.adopt_remote(work, [c])
    return [c]


@_holding_gc
async def rejoin(
    page: Page,
    commit_data: list[bytes],
    pieces: dict[bytes, bytes],
    lazy: dict[bytes, str],
    markers: list[tuple[str, bytes]],
    covered: Sequence[bytes] = (),
) -> Commit | None:
    """Take a checkpoint into a page that has history of its own, for a device that
    was away longer than the bucket keeps history: the checkpoint's commits are
    stored as shallow roots, and this device's unuploaded changes are carried over
    onto its head (:meth:`store.merging.Merger.rebase`), never uploaded on their old
    parents, which other devices may no longer have. ``covered``: commits of this
    page the caller knows the checkpoint's head descends from (what this device
    imported from packs the checkpoint covers). Returns the new commit, if there
    were changes to carry."""
    await _verify(pieces)
    c, *also = _checkpoint_commits(commit_data)
    if any(x.generation >= c.generation for x in also):  # (they are the merge's ancestors)
        raise CorruptObjectError("a checkpoint's other commits are not older than its head")
    if await _has_commit(page, c.id):
        return None
    await _check_trees(page, [c.root, *(x.root for x in also)], pieces, lazy)
    new = [x for x in (c, *also) if not await _has_commit(page, x.id)]

    def work(conn: sqlite3.Connection) -> None:
        _store_remote(conn, pieces, lazy)
        for x in new:  # not heads: the rebase below decides the head
            sql.insert_commit(conn, x, unsynced=False)
            conn.execute("DELETE FROM heads WHERE commit_id = ?", (x.id,))
            sql.add_shallow_root(conn, x.id)
        sql.leave_behind(conn, [x.id for x in new if x.id != c.id])
        sql.add_below(conn, c.id, [*(x.id for x in also), *covered])
        conn.executemany(
            "INSERT OR REPLACE INTO sync_metadata (name, value) VALUES (?, ?)", markers
        )

    await page.adopt_remote(work, new)
    return await page.merger.rebase(c, os.urandom(8))  # over the below/ rows just written


async def shallow_roots(page: Page) -> set[bytes]:
    """Commits of the page whose history is not here (checkpoints it started from)."""
    rows = await page.db.read_all("SELECT value FROM page_metadata WHERE name = 'shallow'")
    return sql.shallow_roots(rows[0] if rows else None)


VERIFY_INLINE = 256
"""An arriving batch of more pieces than this (or of 256 KiB) is verified on a thread:
hashing a pack's 100,000 pieces held the event loop 0.2 s."""


async def _verify(pieces: dict[bytes, bytes]) -> None:
    bad = await mismatched(pieces, most_inline=VERIFY_INLINE)
    if bad:
        raise CorruptObjectError(f"piece {dg.short(bad[0])} does not match its digest")


def _checkpoint_commits(commit_data: list[bytes]) -> list[Commit]:
    """A checkpoint's head, then its other commits; CorruptObjectError if malformed."""
    if not commit_data:
        raise CorruptObjectError("a checkpoint without a commit")
    commits = [commit.decode(data) for data in commit_data]
    if any(not x.parents for x in commits):
        raise CorruptObjectError("a checkpoint's commit claims to be a first commit")
    return commits


def _store_remote(
    conn: sqlite3.Connection, pieces: dict[bytes, bytes], lazy: dict[bytes, str]
) -> None:
    """Store verified pieces from the cloud, and where the LAZY ones left there lie."""
    sql.put_pieces(conn, pieces.items(), SYNCED)
    sql.mark_synced(conn, lazy)
    conn.executemany(
        "INSERT OR IGNORE INTO remote_pieces (digest, location) SELECT ?, ? "
        "WHERE NOT EXISTS (SELECT 1 FROM objects WHERE digest = ?)",
        [(d, loc, d) for d, loc in lazy.items()],
    )


async def _has_commit(page: Page, cid: bytes) -> bool:
    try:
        await page.load_commit(cid)
    except StoreError:
        return False
    return True


def _sql_insert_commit(conn: sqlite3.Connection, c: Commit) -> None:
    sql.insert_commit(conn, c, unsynced=False)


_VALUE = operator.itemgetter(1)


async def _check_trees(
    page: Page, roots: list[bytes], pieces: dict[bytes, bytes], lazy: dict[bytes, str]
) -> None:
    """Every tree node reachable from ``roots`` is here or arriving, every arriving one is
    the node the canonical tree of its entries has where it sits, and values are somewhere.

    Walks level by level with one existence query per level (not one per entry). A node
    is checked at each slot it is reached at (:class:`btree.Slot`: its level and the keys
    its parent bounds it by): its encoding, split, keys and children
    (:func:`btree.check_node`), on a thread for a large level. Nodes already stored were
    checked when they arrived (or made here) and are not opened: only their level and
    their first and last keys are checked against the slot (:func:`btree.check_stored`),
    so the cost follows the nodes imported, not the size of the tree. A tree that fails
    raises :class:`NonCanonicalTreeError`: nothing of the import is stored.
    """
    for r in roots:
        btree.check_root_digest(r)
    seen: set[btree.Slot] = set()
    frontier = [btree.Slot(r, None) for r in roots if r]
    while frontier:
        frontier = [s for s in dict.fromkeys(frontier) if s not in seen]
        seen.update(frontier)
        stored = await page.objects.known(
            list({s.digest for s in frontier if not dg.is_inline(s.digest)} - pieces.keys())
        )
        arriving: list[tuple[btree.Slot, bytes]] = []
        here: list[btree.Slot] = []
        for i, s in enumerate(frontier):
            if i % btree.DIFF_TURN_NODES == btree.DIFF_TURN_NODES - 1:
                await asyncio.sleep(0)  # a level of a large import: others run meanwhile
            d = s.digest
            if not dg.is_inline(d) and d not in pieces:
                if d not in stored:
                    raise MissingObjectError(
                        f"tree node {dg.short(d)} of a remote commit is missing"
                    )
                here.append(s)
                continue
            arriving.append((s, await _node_bytes(page, d, pieces)))
        await btree.check_stored(functools.partial(_stored_nodes, page), here)
        big = len(arriving) > VERIFY_INLINE or sum(len(b) for _, b in arriving) > OFF_LOOP_BYTES
        children, referenced = await off_loop(big, _check_nodes, arriving)
        referenced.difference_update(pieces)
        referenced.difference_update(lazy)
        values = [v for v in referenced if not dg.is_inline(v)]
        if values:
            known = await page.objects.known(values)
            missing = [v for v in values if v not in known]
            if missing:
                raise MissingObjectError(
                    f"value {dg.short(missing[0])} of a remote commit is nowhere"
                )
        frontier = children


async def _stored_nodes(page: Page, digests: list[bytes]) -> dict[bytes, btree.Node]:
    """Stored tree nodes by digest: from the node cache, else in one query (and cached:
    the next import's checks, and the merge after this one, read them again)."""
    out: dict[bytes, btree.Node] = {}
    want: list[bytes] = []
    for d in digests:
        node = page.nodes.cache.get(d)
        if node is not None:
            out[d] = node
        elif dg.is_inline(d) or dg.is_index(d):
            out[d] = await page.nodes.load(d)
        else:
            want.append(d)
    if want:
        got = await page.objects.get_pieces(want)
        for d in want:
            node = out[d] = btree.decode_node(got[d])
            page.nodes.cache.put(d, node, btree.node_cost(node, len(got[d])))
    return out


def _check_nodes(
    arriving: list[tuple[btree.Slot, bytes]],
) -> tuple[list[btree.Slot], set[bytes]]:
    """Decode and check arriving nodes at their slots: their children's slots, and the
    values they reference."""
    children: list[btree.Slot] = []
    referenced: set[bytes] = set()
    for slot, data in arriving:
        node = btree.decode_node(data)
        btree.check_encoding(slot.digest, data, node)
        children.extend(btree.check_node(node, slot))
        referenced.update(map(_VALUE, node.entries))  # every version of a leaf repeats most
    return children, referenced


async def _node_bytes(page: Page, d: bytes, pieces: dict[bytes, bytes]) -> bytes:
    """Content of an arriving node (a large one is assembled from its pieces)."""
    if dg.is_inline(d):
        return dg.inline_content(d)
    if not dg.is_index(d):
        return pieces[d] if d in pieces else await page.objects.get_piece(d)
    index = pieces[d] if d in pieces else await page.objects.get_piece(d)
    parts = [await _node_bytes(page, c.digest, pieces) for c in split.decode_index(index)]
    return b"".join(parts)


async def remote_locations(page: Page, digests: list[bytes]) -> dict[bytes, str]:
    """Where the cloud holds pieces that are not stored here (LAZY values)."""
    rows = await page.db.read_in(
        "SELECT digest, location FROM remote_pieces WHERE digest IN ({marks})", digests
    )
    return {bytes(d): str(loc) for d, loc in rows}


async def unsynced_count(page: Page) -> int:
    rows = await page.db.read_all("SELECT count(*) FROM unsynced_commits")
    return int(rows[0][0])


def index_children(data: bytes) -> list[bytes]:
    """The digests an index piece lists (its value's next level), for prefetching."""
    return [c.digest for c in split.decode_index(data)]


def newest_commit(commit_data: list[bytes]) -> bytes | None:
    """The id of the commit of highest generation among these (a pack section's)."""
    cs = [commit.decode(d) for d in commit_data]
    return max(cs, key=lambda c: (c.generation, c.id)).id if cs else None


async def sync_values(page: Page, prefix: str) -> list[tuple[str, bytes]]:
    """The page's sync metadata rows whose names start with ``prefix``."""
    rows = await page.db.read_all(
        "SELECT name, value FROM sync_metadata WHERE substr(name, 1, ?) = ?", (len(prefix), prefix)
    )
    return [(str(n), bytes(v)) for n, v in rows]
