"""A page's merge policy, and asking its resolver about concurrent writes.

This module owns the policy of one page (remembered in the page's database) and the
resolver's round: the keys whose entry holds siblings of different values (the
``conflicts`` table, kept by :mod:`store.page.graph`), two versions of each shown to the
ledger's resolver, and its answers stored as one local commit whose versions supersede
exactly what it was shown. It does not join states (:mod:`store.tree.join` does, the same way
under every policy).

Under ``last_one_wins`` and ``documents`` nobody is asked: reads show the winner, and a
key's losing siblings stay listed as conflicts until the key is written again. Under
``automatic_with_fallback`` and ``custom`` a connected resolver is asked; without one,
or when it fails, times out or answers badly, nothing changes and
:attr:`Conflicts.pending_conflict` says why; :meth:`Conflicts.settle` runs again when a
resolver arrives. A conflict never holds back other keys: reads show each key's winner.
Conflicts are also listed and resolved by hand (:meth:`Conflicts.listing`,
:meth:`Conflicts.resolve`), stored the way a resolver's answers are.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from ledgerd.store.errors import (
    AmbiguousTakeError,
    ClosedError,
    KeyNotFoundError,
    NotInConflictError,
    NotResolvableError,
    ObjectKeyMissingError,
    ObjectNotFoundError,
    SiblingsChangedError,
    named,
)
from ledgerd.store.page.graph import CommitGraph
from ledgerd.store.pieces import digest as dg
from ledgerd.store.pieces import split
from ledgerd.store.pieces.objects import ObjectStore
from ledgerd.store.sqlite import metadata
from ledgerd.store.sqlite.db import Database
from ledgerd.store.tree import btree, commit, dots, join
from ledgerd.store.tree.btree import Builder, Entry, NodeStore, Priority, RawEntry, Version
from ledgerd.store.tree.merge import (
    Choice,
    Conflict,
    MergeRequest,
    NeedsResolver,
    Policy,
    ResolverSource,
)
from ledgerd.store.tree.merge import needs_resolver as _needs_resolver

log = logging.getLogger(__name__)

RESOLVER_TIMEOUT = 30.0
"""Seconds a conflict resolver may take before its round is abandoned (nothing changes)."""
MAX_ASKED = 10_000
"""Keys one resolver round asks about (the rest go in the next round)."""
MAX_ROUNDS = 16
"""Resolver rounds one settle runs (a key with three siblings takes two)."""

Take = Literal["ours", "theirs"] | bytes | None
"""A resolution chosen by hand (:meth:`Conflicts.resolve`): the value reads show now,
the one other sibling's, a new value (bytes), or a delete (None)."""
Shown = dict[bytes, tuple[Version, ...]]
"""Per key, the versions a resolution was chosen from (the first is ``left``, the second
``right`` in a :data:`Choice`): it supersedes them, and the versions holding their values."""


@dataclass(frozen=True, slots=True)
class KeyConflict:
    """A key whose siblings hold different values, as :meth:`Conflicts.listing` shows it.

    ``sides`` holds one version per value (and priority), newest first: the first is what
    reads show now (``ours``), the others are ``theirs``. ``versions`` are all the key's
    versions; ``expect`` names them (it changes when any write of the key comes)."""

    key: bytes
    sides: tuple[Version, ...]
    versions: tuple[Version, ...]

    @property
    def ours(self) -> Version:
        return self.sides[0]

    @property
    def theirs(self) -> tuple[Version, ...]:
        return self.sides[1:]

    @property
    def expect(self) -> str:
        return expect_of([self])


def expect_of(found: Iterable[KeyConflict]) -> str:
    """What names the versions of conflicts (one key's, or a page's, in key order): 16
    hex digits, checked by :meth:`Conflicts.resolve`'s ``expect``."""
    h = hashlib.blake2b(digest_size=8)
    for c in found:
        h.update(len(c.key).to_bytes(4, "big") + c.key)
        for v in sorted(c.versions, key=lambda v: v[2]):
            h.update(v[2] + v[0] + bytes([v[1]]))
    return h.hexdigest()


def key_conflict(key: bytes, e: Entry | None) -> KeyConflict | None:
    """The conflict an entry holds, or None when its versions hold one value."""
    vs = dots.versions(e)
    sides: list[Version] = []
    for v in vs:
        if all(v[:2] != s[:2] for s in sides):
            sides.append(v)
    if len(sides) < 2:
        return None
    return KeyConflict(key, tuple(sides), tuple(vs))


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
        self._pending: str | None = None
        self.fetch_failed = False
        """The last round could not read a value the resolver took (the network): the
        sync engine runs it again at its next round (nothing else may come to)."""
        self._running = False
        self._asking: asyncio.Future[dict[bytes, Choice]] | None = None
        self._abandoned = False

    @property
    def pending_conflict(self) -> str | None:
        """Why conflicts wait for a resolver, or None: always None once none is left (a
        write, an import or a resolution by hand ended the last one)."""
        return self._pending if self.graph.conflicts else None

    @pending_conflict.setter
    def pending_conflict(self, why: str | None) -> None:
        self._pending = why

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
            lambda conn: metadata.set_page_value(conn, "merge_policy", value),
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
            self.pending_conflict = _unresolved(n)
            log.info("page %s: %s", named(self.name), self.pending_conflict)
            return False
        head = self.graph.head
        rows = await self.db.read_all(
            "SELECT key FROM conflicts ORDER BY key LIMIT ?", (MAX_ASKED,)
        )
        asked: list[Conflict] = []
        shown: Shown = {}
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
        try:
            await self._hold(shown, answers)
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

    async def _hold(self, shown: Shown, answers: dict[bytes, Choice]) -> None:
        """Keep the values that answers taking a side take: they are this device's to
        upload now (ObjectNotFoundError when one cannot be read here)."""
        taken = [
            vs[0 if answers[key] == "left" else 1][0]
            for key, vs in shown.items()
            if answers[key] in ("left", "right")
        ]
        await self.objects.hold(v for v in taken if v != dg.TOMBSTONE)

    async def _store(
        self, shown: Shown, answers: dict[bytes, Choice], *, exact: bool = False
    ) -> list[bytes]:
        """The answers as one commit: per key, a version that supersedes the versions
        shown, and the versions holding the same values. A key written since, which no
        longer holds every version shown, is left out (for the next round); with
        ``exact``, a key holding other versions than those shown too, and nothing is
        stored. Returns the keys stored."""
        await self._flush_journal()
        graph = self.graph
        async with graph.lock:
            if self._is_closed():
                return []
            head = graph.head
            ts = graph.next_time()
            dot = graph.dot(ts)
            builder = Builder(self.nodes)
            values: list[split.Piece] = []
            changes: list[tuple[bytes, RawEntry | None]] = []
            for key, were in sorted(shown.items()):
                e = await btree.lookup(self.nodes, head.root, key)
                vs = dots.versions(e)
                if any(v not in vs for v in were) or (exact and len(vs) != len(were)):
                    if exact:  # all or nothing
                        return []
                    continue
                choice = answers[key]
                if choice == "left" or choice == "right":
                    side = were[0 if choice == "left" else 1]
                    new: Version = (side[0], side[1], dot)
                elif choice is None:
                    new = (dg.TOMBSTONE, 0, dot)
                else:
                    assert isinstance(choice, bytes)
                    pieces, ref = split.split_bytes(choice)
                    values.extend(pieces)
                    prio = next((v[1] for v in were if v[0] != dg.TOMBSTONE), Priority.EAGER)
                    new = (ref.digest, prio, dot)
                # (A version holding what one shown holds goes with it: the answer was
                # for that value.)
                seen = {v[:2] for v in were}
                rest = [v for v in vs if v[:2] not in seen]
                changes.append((key, dots.entry(key, [new, *rest])))
            if not changes:
                return []
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
            return [k for k, _ in changes]

    # -- by hand ---------------------------------------------------------------------

    async def listing(self, start: bytes = b"", limit: int = MAX_ASKED) -> list[KeyConflict]:
        """The page's conflicts, in key order, from ``start`` on (at most ``limit``),
        with their sides; the writes acknowledged before are committed first."""
        await self._flush_journal()
        head = self.graph.head
        rows = await self.db.read_all(
            "SELECT key FROM conflicts WHERE key >= ? ORDER BY key LIMIT ?", (start, limit)
        )
        found: list[KeyConflict] = []
        for (key,) in rows:
            c = key_conflict(bytes(key), await btree.lookup(self.nodes, head.root, bytes(key)))
            if c is not None:
                found.append(c)
        return found

    async def resolve(
        self, key: bytes | None, take: Take, expect: str | None = None
    ) -> list[KeyConflict]:
        """Resolve ``key``'s conflict, or every conflict of the page (``key`` None; the
        first :data:`MAX_ASKED` of them in one call), as a resolver's answer is stored:
        one commit whose version supersedes exactly the siblings resolved, synced like
        any write. ``ours`` takes what reads show now, ``theirs`` the one other value
        (AmbiguousTakeError when there are more), bytes a new value, None a delete.
        With ``expect`` (:attr:`KeyConflict.expect`, or :func:`expect_of` the page's
        listing), or when a write comes meanwhile, siblings that changed are
        SiblingsChangedError and nothing is written. Returns the conflicts resolved, as
        they were."""
        found = await self._to_resolve(key)
        what = f"key {named(key)}" if key is not None else f"page {named(self.name)}"
        changed = (
            f"the conflicts of {what} changed since they were listed (a write or a sync"
            " came): nothing was resolved; list them again"
        )
        if expect is not None and expect_of(found) != expect:
            raise SiblingsChangedError(changed)
        _check_take(found, take)
        # The sides shown, then every other version (the resolution supersedes all).
        shown: Shown = {
            c.key: (*c.sides[:2], *(v for v in c.versions if v not in c.sides[:2])) for c in found
        }
        choice: Choice = "left" if take == "ours" else "right" if take == "theirs" else take
        answers = {c.key: choice for c in found}
        await self._hold(shown, answers)
        stored = await self._store(shown, answers, exact=True)
        if len(stored) != len(found):
            if self._is_closed():
                raise ClosedError(f"page {named(self.name)} is closing")
            raise SiblingsChangedError(changed)
        if self._pending == _unresolved(len(found) + self.graph.conflicts):
            self._pending = _unresolved(self.graph.conflicts)  # (the count it shows)
        return found

    async def _to_resolve(self, key: bytes | None) -> list[KeyConflict]:
        """The conflicts :meth:`resolve` resolves: ``key``'s, or the page's (those of
        its document keys left out); refused when there is none, or a document's."""
        documents = self.policy is Policy.DOCUMENTS or (
            await join.is_document_page(self.nodes, self.graph.head.root)
        )
        refused = NotResolvableError(
            f"page {named(self.name)} holds documents: each is resolved whole, by its higher _rev"
        )
        if documents and key is not None and _document_key(key):
            raise refused
        if key is None:
            found = await self.listing()
            if documents:  # (its keys outside the documents are resolved as on any page)
                found = [c for c in found if not _document_key(c.key)]
                if not found:
                    raise refused
            if not found:
                raise NotInConflictError(f"page {named(self.name)} holds no conflict")
        else:
            await self._flush_journal()
            e = await btree.lookup(self.nodes, self.graph.head.root, key)
            c = key_conflict(key, e)
            if c is None:
                if e is None or (e.value == dg.TOMBSTONE and len(dots.versions(e)) == 1):
                    raise KeyNotFoundError(f"key {named(key)} is not in page {named(self.name)}")
                raise NotInConflictError(f"key {named(key)} holds no conflict")
            found = [c]
        return found


def _check_take(found: list[KeyConflict], take: Take) -> None:
    """``theirs`` names one sibling of each key, or the take is refused."""
    if take == "theirs":
        many = [c for c in found if len(c.theirs) != 1]
        if many:
            raise AmbiguousTakeError(
                f"theirs names {len(many[0].theirs)} siblings of {named(many[0].key)}"
                f"{f' (and of {len(many) - 1} other keys)' if len(many) > 1 else ''}:"
                " take ours or give a value"
            )


def _document_key(key: bytes) -> bool:
    """Whether ``key`` is one the document layer keeps (its marker, a document's or an
    index definition's): on a document page those merge whole, by ``_rev``, and are
    never resolved by key; the page's other keys are keys like any page's."""
    return join.group_rule().owns(key)


def _unresolved(n: int) -> str:
    """Why ``n`` conflicts wait, when no resolver is connected."""
    return f"{n} keys need a conflict resolver"


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
