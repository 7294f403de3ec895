"""A page's local history: its commits, its head, its context, and storing a new commit.

This module owns the in-memory view of a page's head (kept equal to the ``heads``
table) and context (what writes the page's state has seen: :mod:`store.tree.dots`), the
page's clock, the cache of loaded commits, walking history, and the one routine that
writes a local commit with its new pieces and moves the head. History is a line: a
commit has one parent (none for the first), and every commit is made here, by a write,
a transaction or an import; commits never leave the device. The head moves only under
:attr:`CommitGraph.lock` (the *commit lock*); every writer of commits takes it around
the moment it stores, and never while it waits for something outside the page (a
resolver, the network).

It does not decide what to commit (:mod:`store.page.writer`, :mod:`store.page.transaction`,
:mod:`store.page.conflicts` and :mod:`store.page.exchange` do) nor how the tree is built.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import sqlite3
from collections.abc import AsyncIterator, Callable, Sequence

from ledgerd.store.errors import (
    AmbiguousCommitError,
    CommitNotFoundError,
    CorruptObjectError,
    InvalidArgumentError,
    named,
)
from ledgerd.store.page import deleted
from ledgerd.store.page.watch import Watchers
from ledgerd.store.pieces import delta, split
from ledgerd.store.pieces.objects import ObjectStore
from ledgerd.store.sqlite import metadata, sql
from ledgerd.store.sqlite.db import Database, fits_inline
from ledgerd.store.sqlite.schema import CONTEXT_ROW, LOCAL, SYNCED
from ledgerd.store.tree import commit, dots, join
from ledgerd.store.tree.btree import NodeStore, RawEntry
from ledgerd.store.tree.builder import Builder
from ledgerd.store.tree.commit import Commit

log = logging.getLogger(__name__)

MIN_PREFIX = 4
"""The fewest hex digits a commit id prefix may have (as git's abbreviations)."""

DIRECT_BATCH = 1000
"""A write of at least this many changes is committed directly, not through the
journal; its values are not kept in the piece cache (they would only push the
others out)."""

Work = Callable[[sqlite3.Connection], None]


class CommitGraph:
    """The commits, head and context of one page."""

    def __init__(
        self,
        name: bytes,
        db: Database,
        objects: ObjectStore,
        nodes: NodeStore,
        watchers: Watchers,
        committed: Callable[[Commit], None],
        *,
        tag: bytes,
        clock_us: Callable[[], int],
    ) -> None:
        self.name = name
        self.db = db
        self.objects = objects
        self.nodes = nodes
        self.watchers = watchers
        self._committed = committed
        self.tag = tag
        """This device's writer tag (:func:`store.tree.dots.tag_of_device`)."""
        self.clock_us = clock_us
        """The wall clock, in microseconds (the repository's: tests skew it)."""
        self.lock = asyncio.Lock()
        """The commit lock: held while the head moves."""
        self._commits: dict[bytes, Commit] = {}
        self.head: Commit = commit.FIRST
        """The page's current commit."""
        self.ctx: dots.Context = {}
        """What writes the head's state has seen, per writer tag."""
        self.deleted = False
        """The head is a deleted page's state (:func:`store.page.deleted.is_deleted`)."""
        self.conflicts = 0
        """Keys of the head whose siblings hold different values (``conflicts`` rows)."""
        self.last_kind = "local"
        """What made the last commit stored: ``local`` (a write, a transaction, a
        resolver's answer) or ``import`` (writes of other devices)."""
        self._told = b""  # the root watchers last heard about

    @property
    def heads(self) -> list[Commit]:
        """The head, as a list (history is a line: there is one)."""
        return [self.head]

    @property
    def notified_root(self) -> bytes:
        """The root watchers last heard about (the next notification diffs from it)."""
        return self._told

    def next_time(self, at: int | None = None) -> int:
        """The clock time of a new commit: ``at`` (when its writes were acknowledged,
        µs) or now, but after the head, whose time is at least every time its state has
        seen (a hybrid logical clock: a write is later than everything it saw)."""
        return max(self.clock_us() if at is None else at, 1 + self.head.timestamp)

    def dot(self, time_us: int) -> bytes:
        return dots.make(time_us, self.tag)

    async def load_heads(self) -> None:
        """Read the head and the context from the database (a new page gets the
        well-known first commit). A row that names no stored commit (a damaged file)
        is left out, with a warning; ``ledgerctl check`` reports it."""
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
            await self.db.run(lambda conn: sql.insert_commit(conn, commit.FIRST), write=True)
        heads = [await self.load(i) for i in ids] or [commit.FIRST]
        self.head = max(heads, key=lambda c: (c.generation, c.timestamp, c.id))
        got = await self.db.read_all(
            "SELECT value FROM page_metadata WHERE name = ?", (CONTEXT_ROW,), small=True
        )
        try:
            self.ctx = dots.decode_context(bytes(got[0][0])) if got else {}
        except CorruptObjectError as e:
            log.warning(
                "page %s: its context is damaged (%s); it is read as empty", named(self.name), e
            )
            self.ctx = {}
        try:
            self.deleted = await deleted.is_deleted(self.nodes, self.head.root)
        except CorruptObjectError as e:  # the page opens, so that check --repair can mend it
            log.error(
                "page %s: its tree is damaged (%s); reads of it fail until "
                "ledgerctl check --repair fetches it again from the bucket",
                named(self.name),
                e,
            )
            self.deleted = False
        got = await self.db.read_all("SELECT count(*) FROM conflicts", small=True)
        self.conflicts = int(got[0][0])
        if not self._told:
            self._told = self.head.root

    async def tell(self) -> None:
        """Tell watchers what changed since they last heard (commit lock held).

        Every notification runs from the state watchers last heard about to the
        current head, so commits stored without telling reach them once, as their
        result."""
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
                if cid == commit.FIRST.id:  # a page restored from a checkpoint may lack it
                    return commit.FIRST
                raise CommitNotFoundError(f"commit {cid.hex()} is not in page {named(self.name)}")
            c = commit.decode(bytes(rows[0][0]), cid)
            self._commits[cid] = c
        return c

    async def find(self, text: str) -> bytes:
        """The id of the one commit whose hex id starts with ``text`` (lowercase or
        uppercase hex, :data:`MIN_PREFIX` digits or more): CommitNotFoundError when none
        does, AmbiguousCommitError when several do; InvalidArgumentError when ``text`` is
        not such a prefix."""
        digits = len(commit.FIRST.id) * 2
        if not (MIN_PREFIX <= len(text) <= digits) or text.strip("0123456789abcdefABCDEF"):
            raise InvalidArgumentError(
                f"{text[:80]!r} is not a commit id: {MIN_PREFIX} to {digits} hex digits"
            )
        text = text.lower()
        if len(text) == digits:
            return bytes.fromhex(text)
        lo, hi = bytes.fromhex(text.ljust(digits, "0")), bytes.fromhex(text.ljust(digits, "f"))
        rows = await self.db.read_all(
            "SELECT id FROM commits WHERE id BETWEEN ? AND ? LIMIT 2", (lo, hi), small=True
        )
        found = {bytes(r[0]) for r in rows}
        if lo <= commit.FIRST.id <= hi:  # (a page restored from a checkpoint may lack it)
            found.add(commit.FIRST.id)
        if not found:
            raise CommitNotFoundError(f"no commit {text} in page {named(self.name)}")
        if len(found) > 1:
            raise AmbiguousCommitError(
                f"commit id prefix {text} is ambiguous in page {named(self.name)}: "
                f"{' and '.join(sorted(c.hex()[: len(text) + 4] for c in found))}..."
                " start with it; give more digits"
            )
        return found.pop()

    async def log(self, start: bytes | None = None) -> AsyncIterator[Commit]:
        """Commits from the head (or ``start``) back to the first, newest first."""
        c: Commit | None = self.head if start is None else await self.load(start)
        while c is not None:
            yield c
            if not c.parents:
                return
            try:
                c = await self.load(c.parents[0])
            except CommitNotFoundError:  # the first commit of a restored page: none before
                return

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
        ctx: dots.Context | None = None,
        changed: Sequence[tuple[bytes, RawEntry | None]] = (),
        kind: str = "local",
    ) -> None:
        """Write a new local commit on the head, with its new nodes and values, and
        move the head (and the context to ``ctx``, if given) to it. ``changed``: the
        entries it changed (key, new entry or None), for the ``conflicts`` table; ``kind``
        is :attr:`last_kind`.

        Commit lock held. ``tokens`` are staged values the commit references (they
        become local); ``also`` runs in the same SQLite transaction (the journal
        writer drops its journal there; ``also_small`` says whether it is small
        enough to run inline) and ``then`` right after the head moves. Watchers are
        told unless ``notify`` is false. Shielded from cancellation, so the head in
        memory always matches the database.
        """
        if c.parents != (self.head.id,):
            raise CorruptObjectError(f"commit {c.id.hex()[:12]} is not on the head")
        await asyncio.shield(
            self._store(
                c, builder, values, tokens, also, also_small, then, notify, ctx, changed, kind
            )
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
        ctx: dots.Context | None,
        changed: Sequence[tuple[bytes, RawEntry | None]],
        kind: str,
    ) -> None:
        # One row per distinct piece: many entries may share a value. Tree nodes never
        # leave the device (a delta carries entries and values): nothing to upload.
        nodes = list({p.digest: p for p in builder.pieces_reachable(c.root)}.values())
        whole, spliced = builder.split_deltas(nodes)
        encoded_ctx = None if ctx is None else dots.encode_context(ctx)
        is_deleted = await deleted.is_deleted(builder, c.root)
        conflicted = await _conflicted(changed)
        settled = [k for k, _ in changed] if self.conflicts or conflicted else []

        def work(conn: sqlite3.Connection) -> None:
            # Pieces are (digest, data) tuples already: no row is built in Python. The
            # values are told apart here, on the thread, by put_pieces: a big batch has
            # 250,000, and on the event loop that held it for a tenth of a second.
            sql.put_pieces(conn, whole, SYNCED)
            sql.put_deltas(conn, spliced, delta.MAX_DEPTH)
            sql.put_pieces(conn, values, LOCAL)
            sql.insert_commit(conn, c)
            if encoded_ctx is not None:
                metadata.set_page_value(conn, CONTEXT_ROW, encoded_ctx)
            for token in tokens:
                sql.mark_local(conn, token)
            if settled:
                count[0] = metadata.settle_conflicts(conn, settled, conflicted)
            if also is not None:
                also(conn)

        count = [self.conflicts]
        # A commit of a few keys writes a few nodes: inline (see Database.run).
        small = not settled and not tokens and also_small and _fit_inline(nodes, values)
        await self.db.run(work, write=True, small=small)
        if len(values) < DIRECT_BATCH:
            self.objects.remember(values)  # pieces are (digest, data) pairs
        self._commits[c.id] = c
        self.head = c
        if ctx is not None:
            self.ctx = ctx
        self.deleted = is_deleted
        self.conflicts = count[0]
        self.last_kind = kind
        if then is not None:
            then()
        self._committed(c)
        if notify:
            await self.tell()


def _fit_inline(nodes: Sequence[split.Piece], values: Sequence[split.Piece]) -> bool:
    pieces = itertools.chain(nodes, values)
    return fits_inline(len(nodes) + len(values), sum(len(p.data) for p in pieces))


def _conflict(e: RawEntry) -> bool:
    return dots.distinct_values(e) > 1


CONFLICT_TURN = 16384
"""Changes :func:`_conflicted` looks at before it gives the event loop a turn."""


async def _conflicted(changed: Sequence[tuple[bytes, RawEntry | None]]) -> list[bytes]:
    """The keys of ``changed`` whose new entry holds siblings of different values, a
    turn of the event loop every :data:`CONFLICT_TURN` changes (a big batch has
    250,000: one pass held the loop for tens of milliseconds)."""
    out: list[bytes] = []
    async for part in join.in_turns(changed, CONFLICT_TURN):
        out += [k for k, e in part if e is not None and len(e) > 4 and _conflict(e)]
    return out
