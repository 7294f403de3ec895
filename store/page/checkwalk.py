"""The integrity check's walk of a page's trees and values (:mod:`store.page.check`).

This module owns :class:`Walker`: it reads trees level by level and values index by
index, one query per batch, straight from SQLite (never from the piece cache or the
fetcher, so what it reports is what is on disk), checks each piece's status, and reads
a document page's records through the :class:`~store.page.checkreport.ContentCheck`.
What the tables themselves must hold is checked in :mod:`store.page.check`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ledgerd.store.errors import CorruptObjectError, InvalidArgumentError, named
from ledgerd.store.page.checkreport import (
    CORRUPT_PIECE,
    MISSING_PIECE,
    SCAN_ROWS,
    TRANSIENT_PIECE,
    PageCheck,
    Problem,
    content_check,
)
from ledgerd.store.page.page import Page
from ledgerd.store.pieces import delta, split
from ledgerd.store.pieces import digest as dg
from ledgerd.store.sqlite import integrity
from ledgerd.store.sqlite.schema import TRANSIENT
from ledgerd.store.tree import btree, join


def verifies(digest: bytes, data: Any) -> bool:
    """Whether ``data`` is the stored piece ``digest`` names (never an inline one)."""
    try:
        return not dg.is_inline(digest) and dg.verify(digest, data)
    except (TypeError, IndexError):  # a row whose columns are not what they should be
        return False


class Walker:
    """Walks trees level by level and values index by index, one query per batch."""

    def __init__(self, page: Page, report: PageCheck, corrupt: set[bytes]) -> None:
        self.page = page
        self.report = report
        self.corrupt = corrupt
        self.seen: set[bytes] = set()
        self.reported: set[bytes] = set()
        self.done: set[bytes] = set()
        """Tree nodes walked (by every call of :meth:`trees`)."""
        self.marked = False
        """Whether a tree walked with ``documents`` holds the document marker."""
        self.documents: list[Problem] = []
        """Its records that do not decode (reported if it is a document page)."""

    async def _status(self, digests: list[bytes]) -> dict[bytes, int]:
        """Status of each digest this page knows (stored: its status; remote: -1)."""
        rows = await self.page.db.read_in(integrity.PIECE_STATUS, digests)
        out: dict[bytes, int] = {}
        for d, s in rows:
            out[bytes(d)] = max(out.get(bytes(d), -1), int(s))
        return out

    async def _read(self, digests: list[bytes]) -> dict[bytes, bytes]:
        """Contents of stored pieces that verify (others are reported by the scan)."""
        rows = await self.page.db.read_in(integrity.PIECE_DATA, digests)
        pieces = delta.assemble(rows, broken=set())  # (a broken chain: the scan's)
        return {d: v for d, v in pieces.items() if verifies(d, v)}

    def _problem(self, code: str, message: str, d: bytes, key: bytes | None) -> None:
        if d not in self.reported:
            self.reported.add(d)
            self.report.add(Problem(code, message, digest=d, key=key))

    async def _visit(
        self, want: dict[bytes, bytes | None], what: str, committed: bool
    ) -> dict[bytes, int]:
        """Check the pieces ``want`` (digest -> key it serves); their statuses."""
        fresh = [d for d in want if d not in self.seen and not dg.is_inline(d)]
        self.seen.update(fresh)
        self.report.reachable += len(fresh)
        status = await self._status(fresh)
        for d in fresh:
            key = want[d]
            s = status.get(d)
            where = f" (key {named(key[:64])})" if key is not None else ""
            if s is None:
                self._problem(
                    MISSING_PIECE, f"{what} piece {dg.short(d)}{where} is missing", d, key
                )
            elif s == -1:
                self.report.remote += 1
            elif d in self.corrupt:
                self._problem(
                    CORRUPT_PIECE,
                    f"{what} piece {dg.short(d)}{where} does not match its digest",
                    d,
                    key,
                )
            elif committed and s == TRANSIENT:
                self._problem(
                    TRANSIENT_PIECE,
                    f"{what} piece {dg.short(d)}{where} is reached by a commit but transient",
                    d,
                    key,
                )
        return status

    async def trees(self, roots: Iterable[bytes], *, documents: bool = False) -> None:
        """Walk the trees of ``roots``, their values' pieces checked; with ``documents``,
        read their document records too (:meth:`report_documents`)."""
        frontier = list(dict.fromkeys(r for r in roots if r))
        done = self.done
        rule = join.group_rule()
        while frontier:
            frontier = [d for d in frontier if d not in done]
            done.update(frontier)
            nodes = await self._nodes(frontier)
            children: list[bytes] = []
            values: dict[bytes, bytes | None] = {}
            bodies: list[tuple[bytes, bytes]] = []
            for node in nodes:
                children.extend(c for c in node.children if c and c not in done)
                for e in node.entries:
                    key, value = e[0], e[1]
                    for v in btree.values_of((e,)):
                        if v not in self.seen and v not in values:
                            values[v] = key
                    if documents and key == rule.marker:
                        self.marked = True
                    elif documents and rule.owns(key):
                        bodies.append((key, value))
            await self.values(values, committed=True)
            for i in range(0, len(bodies), SCAN_ROWS):
                await self._records(bodies[i : i + SCAN_ROWS])
            frontier = list(dict.fromkeys(children))

    async def _records(self, entries: list[tuple[bytes, bytes]]) -> None:
        """Read the records among ``entries`` (key, value digest) by the content check;
        keep a problem for each that does not read. A record with a piece that is not
        stored here or does not verify is not read (the walk reports the piece)."""
        reader = content_check()
        found = [
            (key, value, r)
            for key, value in entries
            if (r := reader.record_of(key, value)) is not None
        ]
        got = await self._contents([v for _, v, _ in found])
        for key, value, r in found:
            data = got.get(value)
            if data is None:
                continue
            if r.counted:
                self.report.documents += 1
            problem = reader.problem_of(key, data)
            if problem is not None:
                code, why = problem
                self.documents.append(Problem(code, f"{r.where} {why}", key=key))

    def report_documents(self) -> None:
        """Report the records :meth:`trees` found that do not decode, if the tree it
        walked with ``documents`` is a document page's (holds the marker)."""
        if self.marked:
            for p in self.documents:
                self.report.add(p)
        else:
            self.report.documents = 0
        self.documents = []

    async def _contents(self, digests: list[bytes]) -> dict[bytes, bytes]:
        """The whole values named, from the stored pieces that verify; a value one of
        whose pieces is not stored here or does not verify is left out."""
        out = {d: dg.inline_content(d) for d in digests if dg.is_inline(d)}
        hashed = list(dict.fromkeys(d for d in digests if not dg.is_inline(d)))
        got = await self._read(hashed) if hashed else {}
        for d in hashed:
            if d not in got:
                continue
            if not dg.is_index(d):
                out[d] = got[d]
                continue
            try:
                children = [c.digest for c in split.decode_index(got[d])]
            except (CorruptObjectError, InvalidArgumentError):
                continue
            parts = await self._contents(children)  # (a large record: a few pieces)
            if all(c in parts for c in children):
                out[d] = b"".join(parts[c] for c in children)
        return out

    async def _nodes(self, digests: list[bytes]) -> list[btree.Node]:
        """The nodes named, their pieces checked; a node that cannot be read is reported
        (by its missing or corrupt piece) and its subtree is not walked."""
        out: list[btree.Node] = []
        pending = {d: [d] for d in digests}  # node digest -> its pieces, in order
        while pending:
            hashed = [p for ps in pending.values() for p in ps if not dg.is_inline(p)]
            await self._visit(dict.fromkeys(hashed), "tree node", True)
            got = await self._read(hashed) if hashed else {}
            nxt: dict[bytes, list[bytes]] = {}
            for node, ps in pending.items():
                if any(not dg.is_inline(p) and p not in got for p in ps):
                    continue
                try:
                    if any(dg.is_index(p) for p in ps):
                        expanded: list[bytes] = []
                        for p in ps:
                            if dg.is_index(p):
                                expanded.extend(c.digest for c in split.decode_index(got[p]))
                            else:
                                expanded.append(p)
                        nxt[node] = expanded
                        continue
                    data = b"".join(dg.inline_content(p) if dg.is_inline(p) else got[p] for p in ps)
                    out.append(btree.decode_node(data))
                except (CorruptObjectError, InvalidArgumentError) as e:
                    self._problem(CORRUPT_PIECE, f"tree node {dg.short(node)}: {e}", node, None)
            pending = nxt
        return out

    async def values(self, roots: dict[bytes, bytes | None], committed: bool) -> None:
        """Every piece of the values named (root digest -> a key holding it)."""
        level = {d: k for d, k in roots.items() if d not in self.seen and not dg.is_inline(d)}
        while level:
            status = await self._visit(level, "value", committed)
            indexes = [d for d in level if dg.is_index(d) and status.get(d, -1) >= 0]
            got = await self._read(indexes) if indexes else {}
            nxt: dict[bytes, bytes | None] = {}
            for d in indexes:
                if d not in got:
                    continue
                try:
                    children = split.decode_index(got[d])
                except (CorruptObjectError, InvalidArgumentError) as e:
                    self._problem(CORRUPT_PIECE, f"value index {dg.short(d)}: {e}", d, level[d])
                    continue
                for c in children:
                    if c.digest not in self.seen and not dg.is_inline(c.digest):
                        nxt.setdefault(c.digest, level[d])
            level = nxt

    async def journals(self, entries: list[tuple[str, bytes, bytes]]) -> None:
        """Pieces of values written but not committed yet; a problem counts only if the
        journal entry is still there at the end (it may have committed meanwhile)."""
        before = len(self.report.problems)
        await self.values({v: k for _, k, v in entries}, committed=False)
        new = self.report.problems[before:]
        if not new:
            return
        rows = await self.page.db.read_all(integrity.JOURNAL_VALUES)
        still = {bytes(r[0]) for r in rows}
        # A piece belongs to a value still in a journal if its key's value is there.
        keys_left = {k for _, k, v in entries if v in still}
        self.report.problems[before:] = [p for p in new if p.key in keys_left]
