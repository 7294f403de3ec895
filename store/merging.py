"""Merging a page's heads, under its policy, and adopting commits from elsewhere.

This module decides when a page merges and stores the result; the algorithms
(common ancestors, last-one-wins, three-way resolution) are in
:mod:`store.merge`. A page has several heads after a remote import or after a
transaction committed on a page that moved; :meth:`Merger.settle` merges them
two at a time (the pair with the smallest ids, so every device merges the same
pair) until one head remains.

A merge is computed without the commit lock: tree reads need none, and under
AUTOMATIC_WITH_FALLBACK or CUSTOM it may wait up to ``RESOLVER_TIMEOUT`` for a
resolver over the network, during which commits and imports of the page go on.
Only storing the merge commit takes the lock. A merge commit's parents need not
still be heads when it is stored (a commit may have landed on one of them
meanwhile): it is a correct commit all the same, and the loop merges what is
left. One settle runs per page at a time; a caller that finds one running
leaves the heads to it.

Without a resolver, or when it fails, times out or answers badly, the heads
stay (reads serve the latest), :attr:`Merger.pending_conflict` says why, and
nothing changes; :meth:`Merger.settle` runs again when a resolver arrives.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import sqlite3
from collections.abc import Awaitable, Callable, Collection

from ledgerd.store import btree, commit, merge, split, sql
from ledgerd.store.btree import Builder, Entry, NodeStore, Priority
from ledgerd.store.commit import Commit
from ledgerd.store.db import Database
from ledgerd.store.errors import ClosedError, CommitNotFoundError, named
from ledgerd.store.graph import CommitGraph
from ledgerd.store.hooks import ResolverSource

log = logging.getLogger(__name__)

RESOLVER_TIMEOUT = 30.0
"""Seconds a conflict resolver may take before the merge is abandoned (heads kept)."""


class Merger:
    """The merge policy of one page and the merging of its heads."""

    def __init__(
        self,
        ledger: bytes,
        name: bytes,
        db: Database,
        nodes: NodeStore,
        graph: CommitGraph,
        resolvers: ResolverSource | None,
        is_closed: Callable[[], bool],
    ) -> None:
        self.ledger = ledger
        self.name = name
        self.db = db
        self.nodes = nodes
        self.graph = graph
        self.resolvers = resolvers
        self._is_closed = is_closed
        self.policy = merge.Policy.LAST_ONE_WINS
        self.remembered = False
        """A policy was set on the page (it has a ``merge_policy`` row), even the default."""
        self.pending_conflict: str | None = None
        """Why the page keeps several heads, or None."""
        self._running = False
        self._asking: asyncio.Future[dict[bytes, merge.Choice]] | None = None
        self._abandoned = False

    def abandon(self) -> None:
        """The page is closing: a resolver asked now is cancelled, and none is asked
        from now on (the merge ends, its heads kept; a merge stored after the close
        would be dropped anyway, and a close must not wait RESOLVER_TIMEOUT for it)."""
        self._abandoned = True
        if self._asking is not None:
            self._asking.cancel()

    def abandoned(self) -> bool:
        """The page is closing: no resolver is asked (see :meth:`abandon`)."""
        return self._abandoned

    @property
    def running(self) -> bool:
        """A settle is under way (perhaps waiting for a resolver)."""
        return self._running

    async def load_policy(self) -> None:
        rows = await self.db.read_all("SELECT value FROM page_metadata WHERE name = 'merge_policy'")
        if rows:
            self.remembered = True
            try:
                self.policy = merge.Policy(bytes(rows[0][0]).decode())
            except ValueError:
                log.warning(
                    "page %s has an unknown merge policy; using last-one-wins", named(self.name)
                )

    async def set_policy(self, policy: merge.Policy) -> None:
        """Remember the page's merge policy (and merge now if that settles pending heads)."""
        value = policy.value.encode()
        await self.db.run(
            lambda conn: conn.execute(
                "INSERT OR REPLACE INTO page_metadata (name, value) VALUES ('merge_policy', ?)",
                (value,),
            ),
            write=True,
        )
        self.policy, self.remembered = policy, True
        if len(self.graph.heads) > 1:
            await self.settle()

    # -- merging -------------------------------------------------------------------

    async def settle(self) -> bool:
        """Merge the heads until one remains; tell watchers the result. True if one
        head remains. Returns at once (False) while another settle runs."""
        if self._running:
            async with self.graph.lock:
                await self.graph.tell()
            return False
        self._running = True
        try:
            return await self._settle()
        finally:
            self._running = False

    async def _settle(self) -> bool:
        graph = self.graph
        while len(graph.heads) > 1 and not self._is_closed():
            a, b = sorted(graph.heads, key=lambda h: h.id)[:2]
            try:
                m, builder, values = await self._merge(a, b)
            except ClosedError:  # closing: its resolver no longer asked (abandon)
                break
            except merge.NeedsResolver as e:
                self.pending_conflict = str(e)
                log.info("page %s keeps %d heads: %s", named(self.name), len(graph.heads), e)
                break
            except Exception as e:  # a resolver that failed or vanished changes nothing
                self.pending_conflict = f"resolver failed: {type(e).__name__}: {e}"
                log.warning("page %s: %s", named(self.name), self.pending_conflict)
                break
            async with graph.lock:
                if self._is_closed():
                    break
                log.debug(
                    "merging heads %s and %s into %s",
                    a.id.hex()[:12],
                    b.id.hex()[:12],
                    m.id.hex()[:12],
                )
                await graph.store(m, builder, values=values)
        else:
            self.pending_conflict = None
        if not self._is_closed():
            async with graph.lock:
                await graph.tell()
        return len(graph.heads) == 1

    async def _merge(self, a: Commit, b: Commit) -> tuple[Commit, Builder, list[split.Piece]]:
        """The merge commit of heads ``a`` and ``b`` (``a.id < b.id``), not stored."""
        builder = Builder(self.nodes)
        virtual: dict[bytes, Commit] = {}
        below = await self._below()
        base_root = await self._base_root(builder, a, b, virtual, below)
        values: list[split.Piece] = []
        policy = self.policy
        if policy is not merge.Policy.DOCUMENTS and await merge.holds_documents(
            self.nodes, a.root, b.root
        ):
            policy = merge.Policy.DOCUMENTS  # decided by the trees: the same on every device
        if policy is merge.Policy.DOCUMENTS:
            root = await merge.by_revision(builder, base_root, a, b)
        elif policy is merge.Policy.LAST_ONE_WINS:
            load = self._loader(virtual, below)
            root = await merge.last_one_wins(builder, base_root, a, b, load)
        else:
            resolver = self.resolvers.resolver_for(self.ledger) if self.resolvers else None

            def new_value(key: bytes, data: bytes, like: Entry | None) -> Entry:
                pieces, r = split.split_bytes(data)
                values.extend(pieces)
                return Entry(key, r.digest, like.priority if like else Priority.EAGER)

            root = await merge.resolve(
                builder,
                base_root,
                a,
                b,
                self.policy,
                self._asker(resolver, a, b) if resolver else None,
                new_value,
            )
        return commit.merge([a, b], root), builder, values

    def _asker(
        self, resolver: merge.Resolver, left: Commit, right: Commit
    ) -> Callable[[list[merge.Conflict]], Awaitable[dict[bytes, merge.Choice]]]:
        async def ask(conflicts: list[merge.Conflict]) -> dict[bytes, merge.Choice]:
            closed = ClosedError(f"page {named(self.name)} is closing: its merge is abandoned")
            if self.abandoned():
                raise closed
            req = merge.MergeRequest(self.ledger, self.name, left, right, self.policy, conflicts)
            asking = asyncio.ensure_future(asyncio.wait_for(resolver(req), RESOLVER_TIMEOUT))
            self._asking = asking
            try:
                return await asking
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if self.abandoned() and task is not None and not task.cancelling():
                    raise closed from None  # cancelled by abandon, not this task's
                raise
            finally:
                self._asking = None

        return ask

    async def _base_root(
        self,
        builder: Builder,
        a: Commit,
        b: Commit,
        virtual: dict[bytes, Commit],
        below: dict[bytes, tuple[bytes, ...]],
    ) -> bytes:
        """Root of the merge base; several common ancestors are merged first
        (recursively). ``below``: the shallow roots' recorded ancestors (:meth:`_below`),
        counted as their parents."""
        load = self._loader(virtual, below)
        if a.id in below and a.id not in virtual:
            a = await self._with_below(a, below)
        if b.id in below and b.id not in virtual:
            b = await self._with_below(b, below)
        bases = await merge.common_ancestors(load, a, b)
        if not bases:  # their histories meet below what this device holds (a checkpoint)
            return btree.EMPTY
        pruned = await self._pruned([c.id for c in bases if c.id not in virtual])
        if pruned:
            # History retention pruned the base (a device offline for longer than it
            # sent these commits): merge as if from the empty page. Deterministic, but
            # a key deleted on one side only may come back; see the README.
            log.warning(
                "page %s: the merge base %s is pruned; merging from the empty page",
                named(self.name),
                pruned[0].hex()[:12],
            )
            return btree.EMPTY
        acc = bases[0]
        for other in bases[1:]:
            root_base = await self._base_root(builder, acc, other, virtual, below)
            root = await merge.last_one_wins(builder, root_base, acc, other, load)
            acc = commit.merge([acc, other], root)
            virtual[acc.id] = acc
        return acc.root

    def _loader(
        self, virtual: dict[bytes, Commit], below: dict[bytes, tuple[bytes, ...]]
    ) -> merge.LoadCommit:
        """Loads a commit for the merge walks: a virtual merge base from ``virtual``,
        a shallow root with its recorded ancestors for more parents (``below``)."""

        async def load(cid: bytes) -> Commit:
            if cid in virtual:
                return virtual[cid]
            c = await self.graph.load(cid)
            return await self._with_below(c, below) if cid in below else c

        return load

    async def _below(self) -> dict[bytes, tuple[bytes, ...]]:
        """Per shallow root (a checkpoint's head), the commits here known to be its
        ancestors (:func:`store.sql.add_below`). Inline (a few rows by primary key):
        a merge of a page with no checkpoint pays no trip to the reader's thread."""
        rows = await self.db.read_all(
            "SELECT name, value FROM page_metadata WHERE name >= ? AND name < ?",
            (sql.BELOW, sql.BELOW[:-1] + chr(ord(sql.BELOW[-1]) + 1)),
            small=True,
        )
        return sql.below_rows(rows)

    async def _with_below(self, c: Commit, below: dict[bytes, tuple[bytes, ...]]) -> Commit:
        """``c`` (a shallow root) with its recorded ancestors for more parents, as far as
        they are here and older than it: the common ancestors of a commit built on one
        of them and of ``c`` are found (the same commit, for the merge-base walk only;
        its id and encoding are untouched)."""
        more = []
        for pid in below[c.id]:
            if pid in c.parents:
                continue
            try:
                p = await self.graph.load(pid)
            except CommitNotFoundError:
                continue
            if p.generation < c.generation:
                more.append(pid)
        return dataclasses.replace(c, parents=(*c.parents, *more)) if more else c

    async def _pruned(self, ids: list[bytes]) -> list[bytes]:
        if not ids:
            return []
        rows = await self.db.read_in(
            "SELECT commit_id FROM pruned_commits WHERE commit_id IN ({marks})", ids
        )
        return [bytes(r[0]) for r in rows]

    # -- commits from elsewhere ------------------------------------------------------

    async def rebase(self, onto: Commit, salt: bytes) -> Commit | None:
        """Carry this device's changes that ``onto`` lacks over onto it (a checkpoint's
        head, stored already, whose history is not all here): one new commit whose only
        parent is ``onto``, holding the three-way merge of this device's head and
        ``onto`` under the page's policy (last-one-wins when it needs a resolver), over
        their common ancestors as far as this device holds them (the empty page if
        none). ``onto``'s ancestors here are its parents and what its ``below/`` rows
        record (:func:`store.sql.add_below`, written by :func:`store.exchange.rejoin`:
        the checkpoint's other commits, and what this device imported from packs the
        checkpoint covers), so a value imported here and superseded since by its writer
        is no change of this device's, even when the commits between are not here. So what
        this device wrote and uploaded after the commits the checkpoint covers, what it
        has not uploaded, and what it imported that the checkpoint lacks are all kept;
        what ``onto`` holds of older commits is no change of its own. The old
        unuploaded commits stay here and are never uploaded; the new commit becomes the
        page's one head. Returns it (None if there was nothing to carry: ``onto`` is
        then the head)."""
        graph = self.graph
        await self.settle()
        async with graph.lock:
            if self._is_closed():
                raise ClosedError(f"page {named(self.name)} is closed")
            mine = graph.head
            builder = Builder(self.nodes)
            # A base below the last uploaded commit (this device's newest one the
            # checkpoint holds), not that commit: the changes uploaded since but not
            # in the checkpoint read as the checkpoint's, undoing them (and its later
            # commit won over a newer write of this device's).
            base_root = await self._base_root(builder, mine, onto, {}, await self._below())
            if base_root == mine.root:  # nothing of this device's that ``onto`` lacks
                root = onto.root
            elif await merge.holds_documents(self.nodes, mine.root, onto.root):
                root = await merge.by_revision(builder, base_root, mine, onto)
            else:
                root = await merge.last_one_wins(builder, base_root, mine, onto)
            return await self._replace_heads(onto, root, mine.timestamp, builder, salt)

    async def reparent(
        self, onto: list[Commit], salt: bytes, pinned: Callable[[], Collection[bytes]]
    ) -> Commit | None:
        """Replace this device's unuploaded commits by one commit on ``onto`` (commits from
        the bucket that the head descends from, none an ancestor of another) holding the
        head's tree as it is: for unuploaded commits built on a commit other devices may
        have pruned (``history_retention``), whose trees reuse nodes and values they may
        have deleted. The merges that brought ``onto`` in already resolved every
        conflict over the real common ancestors; the new commit only moves the result
        onto parents other devices hold, and its pieces are the head's (the ones not in
        the bucket are uploaded with it). One parent: an ordinary commit, later than it;
        several: a merge commit of them. The old commits stay here, never uploaded.
        Returns the page's new head (``onto``'s one commit itself when the head's tree
        is its), or None if the page has several heads, its head is ``onto``'s one
        commit, or an open transaction began on a commit it would replace
        (``pinned``: the bases of the page's open transactions). Such a transaction's
        commit would build on a commit no other device will have, and merge with the new
        one over ``onto``, as if this device's changes since were concurrent with it:
        try again once it ended."""
        graph = self.graph
        async with graph.lock:
            if self._is_closed():
                raise ClosedError(f"page {named(self.name)} is closed")
            if len(graph.heads) != 1 or [graph.head.id] == [c.id for c in onto]:
                return None
            mine = graph.head
            rows = await self.db.read_all("SELECT commit_id FROM unsynced_commits")
            if {mine.id, *(bytes(r[0]) for r in rows)} & set(pinned()):
                return None
            if len(onto) == 1:
                c = await self._replace_heads(
                    onto[0], mine.root, mine.timestamp, Builder(self.nodes), salt
                )
                return c or onto[0]
            c = commit.make(
                tuple(p.id for p in onto),
                max(mine.timestamp, *(p.timestamp for p in onto)),
                1 + max(p.generation for p in onto),
                mine.root,
                salt,
            )
            await self._make_head(c, None, Builder(self.nodes))
            return c

    async def _replace_heads(
        self, onto: Commit, root: bytes, mine: int, builder: Builder, salt: bytes
    ) -> Commit | None:
        """Make ``root`` (built by ``builder``; commit lock held) the page's one head, in
        a new commit on ``onto`` (no commit if ``root`` is ``onto``'s): the other heads
        are left behind and no other commit waits for upload. ``mine``: the time of the
        head whose changes it carries."""
        c = None
        if root != onto.root:
            ts = max(onto.timestamp + 1, mine)
            c = commit.make((onto.id,), ts, onto.generation + 1, root, salt)
        await self._make_head(c, onto, builder)
        return c

    async def _make_head(self, c: Commit | None, onto: Commit | None, builder: Builder) -> None:
        """Store ``c`` (built by ``builder``; commit lock held), or take ``onto`` if
        ``c`` is None, as the page's one head; the other heads are left behind and no
        other commit waits for upload."""
        graph = self.graph
        head = c or onto
        assert head is not None

        def drop(conn: sqlite3.Connection) -> None:
            old = conn.execute("SELECT commit_id FROM heads WHERE commit_id != ?", (head.id,))
            sql.leave_behind(conn, [bytes(r[0]) for r in old])
            conn.execute("DELETE FROM heads WHERE commit_id != ?", (head.id,))
            conn.execute(
                "INSERT OR IGNORE INTO heads (commit_id, timestamp) VALUES (?, ?)",
                (head.id, head.timestamp),
            )
            conn.execute("DELETE FROM unsynced_commits WHERE commit_id != ?", (head.id,))

        if c is not None:
            await graph.store(c, builder, also=drop, also_small=False, notify=False)
        else:
            await self.db.run(drop, write=True)
        await graph.load_heads()
        await graph.tell()

    async def adopt(self, work: Callable[[sqlite3.Connection], None], new: list[Commit]) -> None:
        """Store verified remote commits (``work`` writes them), then merge the heads.

        Watchers hear once about the resulting state. Shielded: once the write
        starts, memory follows the database even if the caller is cancelled (a
        sync that timed out)."""
        await asyncio.shield(self._adopt(work, new))

    async def _adopt(self, work: Callable[[sqlite3.Connection], None], new: list[Commit]) -> None:
        graph = self.graph
        async with graph.lock:
            if self._is_closed():
                raise ClosedError(f"page {named(self.name)} is closed")
            try:
                await self.db.run(work, write=True)
            finally:
                graph.remember(new)
                await graph.load_heads()
        await self.settle()
