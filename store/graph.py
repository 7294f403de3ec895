"""A page's commit graph: its commits, its heads, and storing a new commit.

This module owns the in-memory view of a page's heads (kept equal to the
``heads`` table), the cache of loaded commits, walking history, and the one
routine that writes a local commit with its new pieces and moves the heads.
Heads move only under :attr:`CommitGraph.lock` (the *commit lock*); every writer
of commits (the journal writer, transactions, merges, remote imports) takes it
around the moment it stores, and never while it waits for something outside the
page (a resolver, the network).

It does not decide what to commit (:mod:`store.writer`,
:mod:`store.transaction`, :mod:`store.merging` do) nor how the tree is built.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import sqlite3
from collections.abc import AsyncIterator, Callable, Sequence

from ledgerd.store import commit, split, sql
from ledgerd.store.btree import Builder
from ledgerd.store.commit import Commit
from ledgerd.store.db import Database, fits_inline
from ledgerd.store.errors import CommitNotFoundError, named
from ledgerd.store.objects import ObjectStore
from ledgerd.store.schema import LOCAL
from ledgerd.store.watch import Watchers

log = logging.getLogger(__name__)

DIRECT_BATCH = 1000
"""A write of at least this many changes is committed directly, not through the
journal; its values are not kept in the piece cache (they would only push the
others out)."""

Work = Callable[[sqlite3.Connection], None]


def order(c: Commit) -> tuple[int, bytes]:
    """The order of heads: reads are served from the last (timestamp, then id)."""
    return (c.timestamp, c.id)


class CommitGraph:
    """The commits and heads of one page."""

    def __init__(
        self,
        name: bytes,
        db: Database,
        objects: ObjectStore,
        watchers: Watchers,
        committed: Callable[[Commit], None],
    ) -> None:
        self.name = name
        self.db = db
        self.objects = objects
        self.watchers = watchers
        self._committed = committed
        self.lock = asyncio.Lock()
        """The commit lock: held while heads move."""
        self._commits: dict[bytes, Commit] = {}
        self.heads: list[Commit] = []
        """Sorted by :func:`order`; never empty once loaded."""
        self._told = b""  # the root watchers last heard about

    @property
    def notified_root(self) -> bytes:
        """The root watchers last heard about (the next notification diffs from it)."""
        return self._told

    @property
    def head(self) -> Commit:
        """The head reads are served from: the latest (timestamp, then id) of the heads."""
        return self.heads[-1]

    async def load_heads(self) -> None:
        """Read the heads from the database (a new page gets the well-known first commit).

        A row that names no stored commit (a damaged file) is left out, with a warning:
        the page opens on the other heads, or on the first commit as when the table is
        empty, and ``ledgerctl check`` reports the heads (its repair rebuilds them)."""
        rows = await self.db.read_all(
            "SELECT h.commit_id, c.id IS NOT NULL FROM heads h LEFT JOIN commits c "
            "ON c.id = h.commit_id"
        )
        ids = [r[0] for r in rows if isinstance(r[0], bytes) and (r[1] or r[0] == commit.FIRST.id)]
        if len(ids) < len(rows):
            log.warning(
                "page %s: %d of its heads name no stored commit; they are left out "
                "(ledgerctl check --repair rebuilds the heads)",
                named(self.name),
                len(rows) - len(ids),
            )
        if not rows:
            await self.db.run(
                lambda conn: sql.insert_commit(conn, commit.FIRST, unsynced=False), write=True
            )
        ids = ids or [commit.FIRST.id]
        self.heads = sorted([await self.load(i) for i in ids], key=order)
        if not self._told:
            self._told = self.head.root

    async def tell(self) -> None:
        """Tell watchers what changed since they last heard (commit lock held).

        Every notification runs from the state watchers last heard about to the
        current head, so commits stored without telling (an import, a transaction
        on a page that moved, merged next) reach them once, as their result."""
        root = self.head.root
        if root != self._told:
            old, self._told = self._told, root
            await self.watchers.notify(self.head.id, old, root)

    def remember(self, commits: Sequence[Commit]) -> None:
        for c in commits:
            self._commits[c.id] = c

    async def load(self, cid: bytes) -> Commit:
        c = self._commits.get(cid)
        if c is None:
            rows = await self.db.read_all("SELECT data FROM commits WHERE id = ?", (cid,))
            if not rows:
                if cid == commit.FIRST.id:  # a page started from a checkpoint drops it
                    return commit.FIRST
                raise CommitNotFoundError(f"commit {cid.hex()} is not in page {named(self.name)}")
            c = commit.decode(bytes(rows[0][0]), cid)
            self._commits[cid] = c
        return c

    async def log(self, start: bytes | None = None) -> AsyncIterator[Commit]:
        """Commits from the heads (or ``start``) back to the first, newest generation first."""
        tops = self.heads if start is None else [await self.load(start)]
        heap = [(-c.generation, -c.timestamp, c.id) for c in tops]
        heapq.heapify(heap)
        seen = {c.id for c in tops}
        while heap:
            _, _, cid = heapq.heappop(heap)
            c = await self.load(cid)
            yield c
            for pid in c.parents:
                if pid not in seen:
                    seen.add(pid)
                    try:
                        p = await self.load(pid)
                    except CommitNotFoundError:  # a shallow root's parents are not here
                        continue
                    heapq.heappush(heap, (-p.generation, -p.timestamp, p.id))

    async def store(
        self,
        c: Commit,
        builder: Builder,
        *,
        values: Sequence[split.Piece] = (),
        tokens: Sequence[str] = (),
        also: Work | None = None,
        also_small: bool = True,
        then: Callable[[], None] | None = None,
        notify: bool = True,
    ) -> None:
        """Write a new local commit with its new nodes and values, and move the heads.

        Commit lock held. ``tokens`` are staged values the commit references (they
        become local); ``also`` runs in the same SQLite transaction (the journal
        writer drops its journal there; ``also_small`` says whether it is small
        enough to run inline) and ``then`` right after the heads move. Watchers are
        told unless ``notify`` is false (the caller merges first and tells them once
        about the result). Shielded from cancellation, so the heads in memory always
        match the database.
        """
        await asyncio.shield(
            self._store(c, builder, values, tokens, also, also_small, then, notify)
        )

    async def _store(
        self,
        c: Commit,
        builder: Builder,
        values: Sequence[split.Piece],
        tokens: Sequence[str],
        also: Work | None,
        also_small: bool,
        then: Callable[[], None] | None,
        notify: bool,
    ) -> None:
        # One row per distinct piece: many entries may share a value.
        reachable = builder.pieces_reachable(c.root)
        pieces = list({p.digest: p for p in [*reachable, *values]}.values())

        def work(conn: sqlite3.Connection) -> None:
            # Pieces are (digest, data) tuples already: no row is built in Python.
            sql.put_pieces(conn, pieces, LOCAL)
            sql.insert_commit(conn, c)
            for token in tokens:
                sql.mark_local(conn, token)
            if also is not None:
                also(conn)

        # A commit of a few keys writes a few nodes: inline (see Database.run).
        small = (
            not tokens and also_small and fits_inline(len(pieces), sum(len(p.data) for p in pieces))
        )
        await self.db.run(work, write=True, small=small)
        if len(values) < DIRECT_BATCH:
            self.objects.remember(values)  # pieces are (digest, data) pairs
        self.add_head(c)
        if then is not None:
            then()
        self._committed(c)
        if notify:
            await self.tell()

    def add_head(self, c: Commit) -> None:
        """``c`` is stored: it replaces its parents among the heads."""
        self._commits[c.id] = c
        heads = [h for h in self.heads if h.id not in c.parents]
        heads.append(c)
        self.heads = sorted(heads, key=order)
