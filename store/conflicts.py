"""A page's merge policy, and asking its resolver about concurrent writes.

This module owns the policy of one page (remembered in the page's database) and the
resolver's round: the keys whose entry holds siblings of different values (the
``conflicts`` table, kept by :mod:`store.graph`), two versions of each shown to the
ledger's resolver, and its answers stored as one local commit whose versions supersede
exactly what it was shown. It does not join states (:mod:`store.join` does, the same way
under every policy).

Under ``last_one_wins`` and ``documents`` nobody is asked: reads show the winner, and a
key's losing siblings stay listed as conflicts until the key is written again. Under
``automatic_with_fallback`` and ``custom`` a connected resolver is asked; without one,
or when it fails, times out or answers badly, nothing changes and
:attr:`Conflicts.pending_conflict` says why; :meth:`Conflicts.settle` runs again when a
resolver arrives. A conflict never holds back other keys: reads show each key's winner.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from ledgerd.store import btree, commit, dots, split
from ledgerd.store import digest as dg
from ledgerd.store.btree import Builder, Entry, NodeStore, Priority, RawEntry, Version
from ledgerd.store.db import Database
from ledgerd.store.errors import (
    ClosedError,
    ObjectKeyMissingError,
    ObjectNotFoundError,
    named,
)
from ledgerd.store.graph import CommitGraph
from ledgerd.store.hooks import ResolverSource
from ledgerd.store.merge import Choice, Conflict, MergeRequest, NeedsResolver, Policy
from ledgerd.store.merge import needs_resolver as _needs_resolver
from ledgerd.store.objects import ObjectStore

log = logging.getLogger(__name__)

RESOLVER_TIMEOUT = 30.0
"""Seconds a conflict resolver may take before its round is abandoned (nothing changes)."""
MAX_ASKED = 10_000
"""Keys one resolver round asks about (the rest go in the next round)."""
MAX_ROUNDS = 16
"""Resolver rounds one settle runs (a key with three siblings takes two)."""


class Conflicts:
    """The merge policy of one page, and its conflicts' resolution."""

    def __init__(
        self,
        ledger: bytes,
        name: bytes,
        db: Database,
        nodes: NodeStore,
        objects: ObjectStore,
        graph: CommitGraph,
        resolvers: ResolverSource | None,
        is_closed: Callable[[], bool],
        flush_journal: Callable[[], Awaitable[None]],
    ) -> None:
        self.ledger = ledger
        self.name = name
        self.db = db
        self.nodes = nodes
        self.objects = objects
        self.graph = graph
        self.resolvers = resolvers
        self._is_closed = is_closed
        self._flush_journal = flush_journal
        self.policy = Policy.LAST_ONE_WINS
        self.remembered = False
        """A policy was set on the page (it has a ``merge_policy`` row), even the default."""
        self.pending_conflict: str | None = None
        """Why conflicts wait for a resolver, or None."""
        self.fetch_failed = False
        """The last round could not read a value the resolver took (the network): the
        sync engine runs it again at its next round (nothing else may come to)."""
        self._running = False
        self._asking: asyncio.Future[dict[bytes, Choice]] | None = None
        self._abandoned = False

    def abandon(self) -> None:
        """The page is closing: a resolver asked now is cancelled, and none is asked
        from now on (a close must not wait RESOLVER_TIMEOUT for it)."""
        self._abandoned = True
        if self._asking is not None:
            self._asking.cancel()

    def abandoned(self) -> bool:
        """The page is closing: no resolver is asked (see :meth:`abandon`)."""
        return self._abandoned

    @property
    def running(self) -> bool:
        """A resolver round is under way."""
        return self._running

    async def load_policy(self) -> None:
        rows = await self.db.read_all("SELECT value FROM page_metadata WHERE name = 'merge_policy'")
        if rows:
            self.remembered = True
            try:
                self.policy = Policy(bytes(rows[0][0]).decode())
            except ValueError:
                log.warning(
                    "page %s has an unknown merge policy; using last-one-wins", named(self.name)
                )

    async def set_policy(self, policy: Policy) -> None:
        """Remember the page's merge policy (and ask a resolver now if it calls for one)."""
        value = policy.value.encode()
        await self.db.run(
            lambda conn: conn.execute(
                "INSERT OR REPLACE INTO page_metadata (name, value) VALUES ('merge_policy', ?)",
                (value,),
            ),
            write=True,
        )
        self.policy, self.remembered = policy, True
        await self.settle()

    # -- resolving -------------------------------------------------------------------

    async def settle(self) -> bool:
        """Ask the resolver about the page's conflicts, if the policy calls for one.
        True if none waits for a resolver. Returns at once (False) while a round runs."""
        if self._running:
            return False
        self._running = True
        try:
            for _ in range(MAX_ROUNDS):
                if self._is_closed() or self.abandoned():
                    return False
                if not self.graph.conflicts or not _needs_resolver(self.policy):
                    self.pending_conflict = None
                    return True
                if not await self._round():
                    return False
            return not self.graph.conflicts
        finally:
            self._running = False

    async def _round(self) -> bool:
        """One resolver round; False if it could not be done (the reason is pending)."""
        resolver = self.resolvers.resolver_for(self.ledger) if self.resolvers else None
        n = self.graph.conflicts
        if resolver is None:
            self.pending_conflict = f"{n} keys need a conflict resolver"
            log.info("page %s: %s", named(self.name), self.pending_conflict)
            return False
        head = self.graph.head
        rows = await self.db.read_all(
            "SELECT key FROM conflicts ORDER BY key LIMIT ?", (MAX_ASKED,)
        )
        asked: list[Conflict] = []
        shown: dict[bytes, tuple[Version, Version]] = {}
        for (key,) in rows:
            e = await btree.lookup(self.nodes, head.root, bytes(key))
            pair = _pair(e)
            if e is None or pair is None:
                continue
            shown[e.key] = pair
            asked.append(
                Conflict(e.key, None, _as_entry(e.key, pair[0]), _as_entry(e.key, pair[1]))
            )
        if not asked:
            return True
        req = MergeRequest(self.ledger, self.name, head, self.policy, asked)
        try:
            answers = await self._ask(resolver, req)
            for c in asked:
                if c.key not in answers:
                    raise NeedsResolver(f"the resolver gave no answer for {c.key[:40]!r}")
                if not (
                    answers[c.key] in ("left", "right", None) or isinstance(answers[c.key], bytes)
                ):
                    raise NeedsResolver(f"the resolver's answer for {c.key[:40]!r} is invalid")
        except ClosedError:
            return False
        except Exception as e:  # a resolver that failed or vanished changes nothing
            self.pending_conflict = f"resolver failed: {type(e).__name__}: {e}"
            log.warning("page %s: %s", named(self.name), self.pending_conflict)
            return False
        taken = [
            (left if answers[key] == "left" else right)[0]
            for key, (left, right) in shown.items()
            if answers[key] in ("left", "right")
        ]
        try:
            # The values a side's answer takes are this device's to upload now.
            await self.objects.hold(v for v in taken if v != dg.TOMBSTONE)
        except (ObjectNotFoundError, ObjectKeyMissingError) as e:
            self.pending_conflict = f"a value the resolver took cannot be read here: {e}"
            self.fetch_failed = True
            log.warning("page %s: %s", named(self.name), self.pending_conflict)
            return False
        self.fetch_failed = False
        await self._store(shown, answers)
        return True

    async def _ask(
        self, resolver: Callable[[MergeRequest], Awaitable[dict[bytes, Choice]]], req: MergeRequest
    ) -> dict[bytes, Choice]:
        if self.abandoned():
            raise ClosedError(f"page {named(self.name)} is closing")
        asking = asyncio.ensure_future(asyncio.wait_for(resolver(req), RESOLVER_TIMEOUT))
        self._asking = asking
        try:
            return await asking
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self.abandoned() and task is not None and not task.cancelling():
                raise ClosedError(f"page {named(self.name)} is closing") from None
            raise
        finally:
            self._asking = None

    async def _store(
        self, shown: dict[bytes, tuple[Version, Version]], answers: dict[bytes, Choice]
    ) -> None:
        """The resolver's answers as one commit: per key, a version that supersedes the
        two it was shown, and the versions holding the same values (a key written
        since, which no longer holds both, is left for the next round)."""
        await self._flush_journal()
        graph = self.graph
        async with graph.lock:
            if self._is_closed():
                return
            head = graph.head
            ts = graph.next_time()
            dot = graph.dot(ts)
            builder = Builder(self.nodes)
            values: list[split.Piece] = []
            changes: list[tuple[bytes, RawEntry | None]] = []
            for key, (left, right) in sorted(shown.items()):
                e = await btree.lookup(self.nodes, head.root, key)
                vs = dots.versions(e)
                if left not in vs or right not in vs:
                    continue
                choice = answers[key]
                if choice == "left":
                    new: Version = (left[0], left[1], dot)
                elif choice == "right":
                    new = (right[0], right[1], dot)
                elif choice is None:
                    new = (dg.TOMBSTONE, 0, dot)
                else:
                    assert isinstance(choice, bytes)
                    pieces, ref = split.split_bytes(choice)
                    values.extend(pieces)
                    prio = left[1] if left[0] != dg.TOMBSTONE else right[1]
                    new = (ref.digest, prio, dot)
                # (A version holding what one shown holds goes with it: the resolver
                # answered for that value.)
                seen = {left[:2], right[:2]}
                rest = [v for v in vs if v[:2] not in seen]
                changes.append((key, dots.entry(key, [new, *rest])))
            if not changes:
                return
            root = await builder.apply(head.root, changes)
            c = commit.child(head, root, ts)
            log.debug("page %s: %d conflicts resolved", named(self.name), len(changes))
            await graph.store(
                c,
                builder,
                values=values,
                ctx={**graph.ctx, graph.tag: c.timestamp},
                changed=changes,
            )


def _pair(e: Entry | None) -> tuple[Version, Version] | None:
    """The two versions a resolver is shown: the winner, and the newest sibling of
    another value (None if every version holds the same value)."""
    vs = dots.versions(e)
    if not vs:
        return None
    first = vs[0]
    for v in vs[1:]:
        if (v[0], v[1]) != (first[0], first[1]):
            return first, v
    return None


def _as_entry(key: bytes, v: Version) -> Entry | None:
    """A version as a resolver sees it (a tombstone as absent)."""
    if v[0] == dg.TOMBSTONE:
        return None
    return btree.new_entry((key, v[0], Priority(v[1]), v[2]))


def _valid(choice: object) -> bool:
    return choice is None or choice in ("left", "right") or isinstance(choice, bytes)
