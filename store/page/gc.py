"""History retention and garbage collection of one page.

This module owns which commits a page keeps whole (retention), marking the
commits it no longer keeps as pruned, and deleting the stored pieces that no kept
commit, journal, open transaction or snapshot reaches, then giving the space back
to the file system. It does not decide when to run (the daemon's background task
and ``ledgerctl gc`` do) and never touches the network.

Retained commits
    The head; the commit the last upload was read at (the next one diffs from
    it); the bases of the transactions open on the page; the commit the document
    views' stored rows reflect (the newer one they reflect
    in memory while index rows are held keeps its tree through a snapshot, like any
    open snapshot); and every commit younger than the
    page's ``history_retention`` (seconds; the repository's, unless the page has
    its own in ``page_metadata``). Every other commit is *pruned*: its row stays
    (history still lists it) and it is listed in
    ``pruned_commits``; reading at it raises :class:`HistoryPrunedError`. Pruning
    is recorded before any piece is deleted.

Collection
    *Mark*: walk the trees and values of the retained commits, of the snapshots
    and transactions open on the page and of the journals, level by level, a
    batch of pieces per query, skipping every subtree already marked (trees share
    most nodes). *Flatten*: a marked node stored as a delta against a base nothing
    marked (:mod:`store.pieces.delta`: an older version of the node, of a pruned
    commit) is stored whole, so that the base can go: keeping it would keep the keys
    and the inline values that the pruned versions held, which a purge must remove.
    *Sweep*: the pieces stored before the mark began and not marked are deleted, the
    newest first (a delta before its base), a batch per SQLite transaction under the
    commit lock. Before each batch, under that lock, the commits, snapshots and
    journals that appeared since (every commit stored since the collection began,
    retained or not: this collection prunes none of them) are marked and flattened
    too, so a piece that a new commit reuses or builds a delta on is never deleted;
    staged (transient) pieces are never deleted here, nor pieces from the cloud while
    some wait for the entries that refer to them
    (:data:`store.sqlite.schema.PIECES_WAITING`). A batch does not run while a resolver
    round or an import is under way (they read trees without the lock); the rest
    waits for the next collection. Every step is one SQLite transaction: a crash
    (even SIGKILL) loses nothing that is reachable.
    *Vacuum*: ``PRAGMA incremental_vacuum`` 1 MiB per transaction, then a WAL
    checkpoint, so the file shrinks.

Pauses: the event loop runs between batches; queries run on the SQLite threads;
decoding a batch of nodes on the loop takes a few milliseconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from ledgerd.store.errors import CorruptObjectError, InvalidArgumentError, StoreError, named
from ledgerd.store.page.page import Page
from ledgerd.store.pieces import delta, split
from ledgerd.store.pieces import digest as dg
from ledgerd.store.pieces.sources import mismatched
from ledgerd.store.sqlite import collection, metadata
from ledgerd.store.sqlite.schema import CHAIN_IN, DIGEST_IN, UPLOADED_ROW
from ledgerd.store.tree import btree
from ledgerd.store.tree.commit import FIRST

log = logging.getLogger(__name__)

HISTORY_RETENTION = 7 * 24 * 3600.0
"""Seconds of history a page keeps by default (``history_retention``)."""
READ_BATCH = 64
"""Pieces read per query while marking."""
VALUE_BATCH = 4096
"""Value digests marked in one go while a tree is walked."""
SWEEP_BATCH = 1024
"""Pieces deleted per SQLite transaction (and per hold of the commit lock)."""
VACUUM_STEP = 256
"""File pages (4 KiB) given back per incremental-vacuum transaction (a writer of the
page waits for at most one: tens of milliseconds)."""
RETENTION_META = "history_retention"
"""The ``page_metadata`` row holding a page's own retention (seconds, as text)."""


@dataclass
class GcResult:
    """What one collection of a page did."""

    ledger: bytes
    page: bytes
    commits_pruned: int = 0
    retained_commits: int = 0
    pieces_freed: int = 0
    bytes_freed: int = 0
    file_bytes_before: int = 0
    file_bytes_after: int = 0
    seconds: float = 0.0
    deferred: str | None = None
    """Why part of the sweep was left for the next collection (a resolver round, an
    import)."""
    extra: dict[str, Any] = field(default_factory=dict)

    def json(self) -> dict[str, Any]:
        d = asdict(self)
        d["ledger"] = self.ledger.decode(errors="replace")
        d["page"] = self.page.decode(errors="replace")
        d.pop("extra")
        return d


def check_retention(seconds: float) -> float:
    if not seconds >= 0 or seconds == float("inf"):
        raise InvalidArgumentError("history_retention must be a finite number of seconds >= 0")
    return float(seconds)


async def page_retention(page: Page) -> float | None:
    """The page's own retention (seconds), or None: the repository's applies."""
    rows = await page.db.read_all(
        "SELECT value FROM page_metadata WHERE name = ?", (RETENTION_META,)
    )
    return float(bytes(rows[0][0]).decode()) if rows else None


async def set_page_retention(page: Page, seconds: float | None) -> None:
    """Give the page its own retention (None: back to the repository's)."""

    value = None if seconds is None else repr(check_retention(seconds)).encode()
    await page.db.run(lambda conn: metadata.set_page_value(conn, RETENTION_META, value), write=True)


async def is_pruned(page: Page, commit_id: bytes) -> bool:
    return await collection.is_pruned(page.db, commit_id)


async def retained_commits(page: Page, retention: float) -> set[bytes]:
    """The ids of the commits the page keeps whole (see the module docstring)."""
    cutoff = page.graph.clock_us() - int(retention * 1_000_000)
    keep, pruned = await page.db.run(lambda conn: collection.retained_and_pruned(conn, cutoff))
    # A commit pruned before stays pruned (its pieces may be gone), even if a longer
    # retention would keep it now.
    return (keep | page.pinned_commits()) - pruned


@contextlib.asynccontextmanager
async def held(page: Page) -> AsyncIterator[None]:
    """Hold off the page's collection for the block: for an import, which checks remote
    trees without the commit lock and stores commits that reuse pieces it found stored.
    Sweep batches that start meanwhile defer; one under way when the hold begins found
    no hold and may be deleting such a piece, so it is waited for first (a batch holds
    the commit lock)."""
    page.gc_holds += 1
    try:
        async with page.graph.lock:
            pass  # only waited for: the batch under way has ended
        yield
    finally:
        page.gc_holds -= 1


class _Marker:
    """The set of stored pieces reachable from what was marked so far (``marked``, the
    pieces walked), and the base of each marked node stored as a delta (``bases_of``,
    not marked for that; see :meth:`stale`). With ``chains``, every base the marked
    nodes' chains pass through too (``chain_bases``: :func:`live_bytes`)."""

    def __init__(self, page: Page, *, chains: bool = False) -> None:
        self.page = page
        self.marked: set[bytes] = set()
        self.bases_of: dict[bytes, bytes] = {}
        """A marked node stored as a delta, not checked yet by :meth:`stale` -> its base."""
        self.chain_bases: set[bytes] | None = set() if chains else None
        self.roots: set[bytes] = set()

    def stale(self) -> list[bytes]:
        """The marked nodes stored as deltas against a base nothing marked: each must be
        stored whole before that base is deleted (:func:`_flatten`). A base that is
        marked was walked, so its own base is checked in turn: a chain through kept
        versions stays as it is. Each node is checked once (what is marked stays so)."""
        marked = self.marked
        out = [d for d, base in self.bases_of.items() if base not in marked]
        self.bases_of.clear()
        return out

    async def _yield(self) -> None:
        await asyncio.sleep(0)

    async def _read(self, digests: list[bytes]) -> dict[bytes, bytes]:
        """Stored contents of ``digests`` (not verified: marking only needs references)."""
        out: dict[bytes, bytes] = {}
        for i in range(0, len(digests), READ_BATCH):
            part = digests[i : i + READ_BATCH]
            rows = await self.page.db.read_in(
                f"SELECT digest, data FROM objects WHERE {DIGEST_IN}", part, chunk=READ_BATCH
            )
            out.update((bytes(d), bytes(v)) for d, v in rows)
            await self._yield()
        return out

    async def _read_nodes(self, digests: list[bytes]) -> dict[bytes, bytes]:
        """Stored tree nodes, rebuilt from their chains (:mod:`store.pieces.delta`); the
        base of each is noted (``bases_of``; every base on the chain in ``chain_bases``)."""
        out: dict[bytes, bytes] = {}
        for i in range(0, len(digests), READ_BATCH):
            rows = await self.page.db.read_in(
                CHAIN_IN, digests[i : i + READ_BATCH], chunk=READ_BATCH
            )
            for r in rows:
                if r[3] == 1:  # (at depth 0 the node itself, at 1 its base)
                    self.bases_of[bytes(r[0])] = bytes(r[4])
                if r[3] and self.chain_bases is not None:
                    self.chain_bases.add(bytes(r[4]))
            out.update(delta.assemble(rows))
            await self._yield()
        return out

    async def trees(self, roots: Iterable[bytes]) -> None:
        """Mark the trees under ``roots`` (and the values they hold)."""
        frontier = [r for r in roots if r and r not in self.roots]
        self.roots.update(frontier)
        values: list[bytes] = []
        while frontier:
            todo = [d for d in dict.fromkeys(frontier) if d not in self.marked]
            frontier = []
            plain = [d for d in todo if not dg.is_inline(d) and not dg.is_index(d)]
            data = await self._read_nodes(plain)
            nodes: list[bytes] = []
            for d in todo:
                if dg.is_inline(d):
                    nodes.append(dg.inline_content(d))
                elif dg.is_index(d):  # a large node, split: its pieces, then its bytes
                    await self.values([d])
                    nodes.append(await self.page.objects.local_only().read_all(d, remember=False))
                elif d in data:
                    nodes.append(data[d])
                else:
                    raise StoreError(f"tree node {dg.short(d)} of a kept commit is not stored")
                self.marked.add(d)
            for i, raw in enumerate(nodes):
                node = btree.decode_node(raw)
                frontier.extend(c for c in node.children if c)
                values.extend(btree.values_of(node.entries))
                if i % 64 == 63:
                    await self._yield()
                if len(values) >= VALUE_BATCH:  # a level can hold every value of the page
                    await self.values(values)
                    values = []
            await self._yield()
        await self.values(values)

    async def values(self, roots: Iterable[bytes]) -> None:
        """Mark the pieces of the values with these root digests (index pieces are read;
        one not stored here is a LAZY value not fetched: nothing of it to keep)."""
        frontier = list(roots)
        while frontier:
            todo = [
                d for d in dict.fromkeys(frontier) if not dg.is_inline(d) and d not in self.marked
            ]
            self.marked.update(todo)
            frontier = []
            index = [d for d in todo if dg.is_index(d)]
            if index:
                for raw in (await self._read(index)).values():
                    frontier.extend(c.digest for c in split.decode_index(raw))


async def live_bytes(page: Page) -> int:
    """Bytes of the stored pieces the page's heads and journals reach, with the bases
    their chains of deltas pass through, as stored: what the page needs now (a
    collection with no history kept stores those chains' nodes whole instead)."""
    marker = _Marker(page, chains=True)
    await marker.trees([page.graph.head.root])
    await marker.values(await _journal_values(page))
    assert marker.chain_bases is not None
    digests = sorted(d for d in marker.marked | marker.chain_bases if not dg.is_inline(d))
    total = 0
    for i in range(0, len(digests), READ_BATCH):
        rows = await page.db.read_in(
            f"SELECT coalesce(sum(length(data)), 0) FROM objects WHERE {DIGEST_IN}",
            digests[i : i + READ_BATCH],
            chunk=READ_BATCH,
        )
        total += int(rows[0][0])
    return total


def file_bytes(page: Page) -> int:
    """Bytes of the page's files on disk (database and WAL)."""
    total = 0
    for suffix in ("", "-wal"):
        with contextlib.suppress(FileNotFoundError):
            total += page.db.path.with_name(page.db.path.name + suffix).stat().st_size
    return total


async def _journal_values(page: Page) -> list[bytes]:
    rows = await page.db.read_all("SELECT value FROM journal_entries WHERE value IS NOT NULL")
    return [bytes(r[0]) for r in rows]


async def _mark_current(
    page: Page, marker: _Marker, retention: float, known: set[bytes] | None = None
) -> set[bytes]:
    """Mark everything retained now, and the commits stored since ``known`` was read
    (not pruned by this collection: they stay readable); returns the retained ids."""
    keep = await retained_commits(page, retention)
    since = set() if known is None else await _stored_since(page, known)
    roots = [(await page.graph.load(cid)).root for cid in keep | since]
    await marker.trees([*roots, *page.pinned_roots()])
    await marker.values(await _journal_values(page))
    return keep


async def _stored_since(page: Page, known: set[bytes]) -> set[bytes]:
    """The commits stored since ``known`` was read: history is a line, so those from the
    head back to the first one known."""
    out: set[bytes] = set()
    c = page.graph.head
    while c.id not in known and c.parents:
        out.add(c.id)
        c = await page.graph.load(c.parents[0])
    return out


def _never() -> bool:
    return False


async def collect(page: Page, retention: float, *, stop: Callable[[], bool] = _never) -> GcResult:
    """Prune the history older than the retention (the page's own, else ``retention``)
    and collect what nothing retained reaches; then shrink the file. The caller holds
    the page (a lease). Once ``stop()`` is true (the daemon is stopping) it ends
    after the current batch, leaving the rest for the next collection."""
    started = time.monotonic()
    own = await page_retention(page)
    retention = check_retention(retention if own is None else own)
    result = GcResult(page.ledger, page.id, file_bytes_before=file_bytes(page))
    await page.flush()
    rows = await page.db.read_all("SELECT coalesce(max(id), 0) FROM objects")
    upto = int(rows[0][0])
    # Only commits stored before the retained ones are read may be pruned: one stored
    # while the mark walks (the loop runs) is not in ``keep`` but is new.
    known = {bytes(r[0]) for r in await page.db.read_all("SELECT id FROM commits")}
    marker = _Marker(page)
    keep = await _mark_current(page, marker, retention)
    result.retained_commits = len(keep)
    result.commits_pruned = await _prune(page, known - keep)
    garbage = await _unmarked(page, marker, upto)
    await _flatten(page, marker)
    await _sweep(page, marker, retention, known, garbage, result, stop)
    while await page.db.run(_vacuum_step, write=True) and not stop():
        await marker._yield()
    await page.db.checkpoint()
    result.file_bytes_after = file_bytes(page)
    result.seconds = time.monotonic() - started
    if result.pieces_freed or result.commits_pruned:
        log.info(
            "gc of page %s: %d commits pruned, %d pieces (%d bytes) freed, file %d -> %d bytes",
            named(page.id),
            result.commits_pruned,
            result.pieces_freed,
            result.bytes_freed,
            result.file_bytes_before,
            result.file_bytes_after,
        )
    return result


async def _unmarked(page: Page, marker: _Marker, upto: int) -> tuple[list[int], list[bytes]]:
    """Ids and digests of the pieces stored up to id ``upto`` that the mark did not reach,
    the newest first: a delta is newer than its base, so a sweep cut short never leaves
    a delta without its base."""
    garbage: list[int] = []
    garbage_digests: list[bytes] = []
    after = 0
    marked = marker.marked
    while True:
        ids, digests = await page.db.run(
            lambda conn, a=after: collection.candidates(conn, a, upto)  # type: ignore[misc]
        )
        if not ids:
            break
        after = ids[-1]
        for i, d in zip(ids, digests, strict=True):
            if d not in marked:
                garbage.append(i)
                garbage_digests.append(d)
        await marker._yield()
    return garbage[::-1], garbage_digests[::-1]


async def _sweep(
    page: Page,
    marker: _Marker,
    retention: float,
    known: set[bytes],
    unmarked: tuple[list[int], list[bytes]],
    result: GcResult,
    stop: Callable[[], bool],
) -> None:
    """Delete the ``unmarked`` pieces still unreached, a batch per transaction under the
    commit lock, unless a merge or an import is under way or ``stop()`` is true.
    ``known``: the commits there were when the collection began."""
    garbage, garbage_digests = unmarked
    marked = marker.marked
    done = 0
    while done < len(garbage):
        if stop():
            result.deferred = "stopped"
            break
        async with page.graph.lock:
            if page.conflicts.running or page.gc_holds:
                result.deferred = "a merge or an import was under way"
                break
            # What appeared since the mark began (commits, snapshots, journals): a new
            # commit may reuse a piece found unreachable before; it is kept.
            await _mark_current(page, marker, retention, known)
            await _flatten(page, marker)  # (its nodes' chains: usually none to flatten)
            part = slice(done, done + SWEEP_BATCH)
            ids = [
                i
                for i, d in zip(garbage[part], garbage_digests[part], strict=True)
                if d not in marked
            ]
            n, nbytes = await page.db.run(
                lambda conn, ids=ids: _delete(conn, ids),  # type: ignore[misc]
                write=True,
            )
        done += SWEEP_BATCH
        result.pieces_freed += n
        result.bytes_freed += nbytes
        await marker._yield()


async def _flatten(page: Page, marker: _Marker) -> None:
    """Store whole the marked nodes stored as deltas against a base nothing marked
    (:meth:`_Marker.stale`), before any such base is deleted. Each is rebuilt and
    verified first: a damaged chain stops the collection (``ledgerctl check`` repairs
    it) rather than be stored whole as it reads."""
    stale = marker.stale()
    for i in range(0, len(stale), READ_BATCH):
        part = stale[i : i + READ_BATCH]
        whole = await delta.read_whole(page.db, part)
        if bad := await mismatched(whole):
            raise CorruptObjectError(
                f"tree node {dg.short(bad[0])} of page {named(page.id)} does not match its "
                "digest: run ledgerctl check"
            )
        rows = list(whole.items())
        await page.db.run(lambda conn, rows=rows: collection.flatten(conn, rows), write=True)  # type: ignore[misc]
        await marker._yield()
    if stale:
        log.debug("gc of page %s: %d nodes stored whole", named(page.id), len(stale))


def _delete(conn: sqlite3.Connection, ids: list[int]) -> tuple[int, int]:
    return collection.delete(conn, ids)


def _vacuum_step(conn: sqlite3.Connection) -> int:
    return collection.vacuum_step(conn, VACUUM_STEP)


async def _prune(page: Page, ids: set[bytes]) -> int:
    """Record these commits as pruned; returns how many were new."""
    pruned = [c for c in ids if c != FIRST.id]  # FIRST: nothing to free
    return int(await page.db.run(lambda conn: collection.prune(conn, pruned), write=True))


async def usage(page: Page, retention: float) -> dict[str, Any]:
    """What the page holds and what its files take (``ledgerctl du``, status):
    ``file_bytes`` (database and WAL), ``stored_bytes`` (every stored piece),
    ``live_bytes`` (the pieces the heads and journals reach), commits retained and
    pruned, and whether everything is uploaded (``synced``: nothing unsynced, no
    journal), which is what eviction needs of a closed page (``evictable``)."""
    await page.flush()
    own = await page_retention(page)
    counts = await page.db.run(collection.counts)
    rows = await page.db.read_all(
        "SELECT value FROM sync_metadata WHERE name = ?", (UPLOADED_ROW,), small=True
    )
    uploaded = int(bytes(rows[0][0])) if rows and bytes(rows[0][0]).isdigit() else -1
    counts["unuploaded_writes"] = int(page.graph.ctx.get(page.graph.tag, -1) > uploaded)
    keep = await retained_commits(page, retention if own is None else own)
    synced = not any(counts[k] for k in ("unuploaded_writes", "journals"))
    return {
        "file_bytes": file_bytes(page),
        "live_bytes": await live_bytes(page),
        **counts,
        "retained_commits": len(keep),
        "history_retention": retention if own is None else own,
        "synced": synced,
        "evictable": synced,
    }
