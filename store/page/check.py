"""Integrity check of one page, and the repairs that need nothing but the page itself.

This module owns what "a healthy page" means on this device and how to tell:

* SQLite's own ``PRAGMA integrity_check`` of the page's database;
* every stored piece matches its digest (a scan of ``objects`` in id order, a
  bounded batch at a time);
* every piece reachable from the page's commits (all of them: history is kept)
  and from its open journals is stored here or known to be in the cloud
  (``remote_pieces``), and a piece a commit reaches is not ``transient``;
* commits decode to their ids, their parents are here with the right generation,
  ``commit_parents`` says what the commits say, ``heads`` holds exactly the
  commit without children (history is a line), ``unsynced``, ``remote_pieces``
  and the journal tables refer to what exists;
* in a document page, every document record and index definition of the head
  decodes (read by the :class:`ContentCheck` of :mod:`store.documents.doccheck`): a
  record that does not is ``damaged_document``, a definition
  ``damaged_index_definition``, either of a newer ledgerd's layout
  ``unsupported_layout``. Its pieces are sound (a piece that
  is not is reported as such, and its record is not read); these are reported,
  never repaired here (``purge`` of the documents API is the operator's way to be
  rid of a damaged document, declaring or dropping the index of a damaged definition).

It walks trees and values through the store's own modules (:mod:`store.tree.btree`,
:mod:`store.pieces.split`, :mod:`store.tree.commit`), reading pieces straight from SQLite and
never from the piece cache or the fetcher, so what it reports is what is on disk.
It only reads while checking (the page keeps serving: no lock is held, and each
query is short); :func:`restore_pieces`, :func:`requeue` and :func:`repair_local`
write. Getting pieces back from the cloud is sync's job (:mod:`sync.check`); this
module has no network code.

Why one module of about 860 lines: the checks and the local repairs read the same
tables in the same walk, and a repair is only safe next to the check that found
the problem.
"""

from __future__ import annotations

import asyncio
import functools
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from ledgerd.store.errors import CorruptObjectError, InvalidArgumentError, StoreError, named
from ledgerd.store.page.page import Page
from ledgerd.store.pieces import digest as dg
from ledgerd.store.pieces import split
from ledgerd.store.sqlite import sql
from ledgerd.store.sqlite.schema import LOCAL, SYNCED, TRANSIENT, UPLOADED_AT_ROW, UPLOADED_ROW
from ledgerd.store.tree import btree, commit, join

SCAN_ROWS = 256
"""Stored pieces read and verified per query of the scan (pieces are at most 64 KiB)."""

INTEGRITY_ERRORS = 20
"""Most lines of ``PRAGMA integrity_check`` kept in a report."""

MAX_PROBLEMS = 1000
"""Most problems one page's report lists (the count says how many there were)."""

# Problem codes (stable: the API and ``ledgerctl check --json`` carry them).
SQLITE = "sqlite"
CORRUPT_PIECE = "corrupt_piece"
MISSING_PIECE = "missing_piece"
TRANSIENT_PIECE = "transient_piece"
COMMIT = "commit"
HEADS = "heads"
JOURNAL = "journal"
UNSYNCED = "unsynced"
REMOTE = "remote_pieces"
NOT_IN_CLOUD = "not_in_cloud"
CLOUD = "cloud"
NOT_CHECKED = "not_checked"
"""The page could not be opened for its check (every open-page slot in use): nothing
is known to be wrong with it; check it again."""
DAMAGED_DOCUMENT = "damaged_document"
"""A document record of the head does not decode (its pieces are sound)."""
UNSUPPORTED_LAYOUT = "unsupported_layout"
"""A document record or index definition of the head is of a layout a newer ledgerd wrote."""
DAMAGED_INDEX_DEFINITION = "damaged_index_definition"
"""An index definition of the head does not decode (its pieces are sound)."""
DOCUMENT_CODES = (DAMAGED_DOCUMENT, UNSUPPORTED_LAYOUT, DAMAGED_INDEX_DEFINITION)
"""Problems of documents, not of pieces: reported, never repaired here."""


class ContentRecord(NamedTuple):
    """A value the content check reads: what it is (the start of a problem's message),
    and whether it counts among :attr:`PageCheck.documents`."""

    where: str
    counted: bool


class ContentCheck(Protocol):
    """What the check reads in a document page's values beyond their pieces: the
    document layer's records (:data:`store.documents.doccheck.DOCUMENT_CHECK`)."""

    def record_of(self, key: bytes, value: bytes) -> ContentRecord | None:
        """The record the entry (``key``, its value's digest) holds, or None: none to read."""
        ...

    def problem_of(self, key: bytes, data: bytes) -> tuple[str, str] | None:
        """The problem code and why of the record at ``key`` whose contents are
        ``data``, or None: it reads."""
        ...


_content: list[ContentCheck] = []


def set_content_check(check: ContentCheck) -> None:
    """Make ``check`` the one that reads records (``ledgerd.store`` sets the document
    layer's when it is imported; a second, different one is refused)."""
    if _content and _content[0] is not check:
        raise ValueError("the check's content check is set already")
    _content[:] = [check]


def content_check() -> ContentCheck:
    """The check set by :func:`set_content_check`."""
    if not _content:
        raise RuntimeError("no content check: ledgerd.store sets it when it is imported")
    return _content[0]


@dataclass
class Problem:
    """One thing wrong with a page. ``digest``/``key``/``commit`` say where, when known."""

    code: str
    message: str
    digest: bytes | None = None
    key: bytes | None = None
    commit: bytes | None = None
    repaired: bool = False

    def json(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "message": self.message,
            "digest": self.digest.hex() if self.digest is not None else None,
            "key": self.key,
            "commit": self.commit.hex() if self.commit is not None else None,
            "repaired": self.repaired,
        }


@dataclass
class PageCheck:
    """What :func:`check_page` found in one page."""

    ledger: bytes
    page: bytes
    problems: list[Problem] = field(default_factory=list)
    dropped: int = 0
    """Problems found beyond MAX_PROBLEMS (not listed)."""
    commits: int = 0
    stored: int = 0
    """Stored pieces read and verified."""
    reachable: int = 0
    """Distinct hashed pieces reachable from commits and journals."""
    remote: int = 0
    """Of those, the ones known to be in the cloud only (LAZY values not fetched)."""
    documents: int = 0
    """Document records of the head read and decoded (0: not a document page)."""

    def add(self, p: Problem) -> None:
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(p)
        else:
            self.dropped += 1

    @property
    def healthy(self) -> bool:
        """Nothing is wrong, or everything that was has been repaired."""
        return not self.dropped and all(p.repaired for p in self.problems)

    def open_problems(self, *codes: str) -> list[Problem]:
        return [p for p in self.problems if not p.repaired and (not codes or p.code in codes)]

    def bad_pieces(self) -> list[bytes]:
        """Digests of pieces that are corrupt or missing here (to get from the cloud)."""
        out = [
            p.digest
            for p in self.open_problems(CORRUPT_PIECE, MISSING_PIECE)
            if p.digest is not None
        ]
        return list(dict.fromkeys(out))


# -- checking --------------------------------------------------------------------------


async def check_page(page: Page) -> PageCheck:
    """Check ``page`` (open, leased by the caller) and report what is wrong.

    Only reads, a bounded query at a time, so the page and every other page keep
    serving while it runs. Writes that land meanwhile are not reported against:
    the page's tables are read in one read transaction, and a piece reachable only
    from a journal that is gone by the end is not counted missing."""
    report = PageCheck(page.ledger, page.id)
    head = page.head  # (before the tables are read: they hold it)
    await _integrity(page, report)
    corrupt = await _scan(page, report)
    tables = await page.db.run(_read_tables)
    commits = _check_commits(tables, report)
    report.commits = len(commits)
    _check_tables(tables, report)
    walker = _Walker(page, report, corrupt)
    # The head's tree first, its document records read as its leaves come; then the
    # rest of the history, the nodes the head shares with it not read again.
    await walker.trees([head.root], documents=True)
    walker.report_documents()
    # Pruned commits (history retention, store.page.gc) keep their rows, not their trees.
    await walker.trees([c.root for c in commits.values() if c.id not in tables.pruned])
    await walker.journals(tables.journal_values)
    return report


async def _integrity(page: Page, report: PageCheck) -> None:
    def run(conn: sqlite3.Connection) -> list[str]:
        rows = conn.execute(f"PRAGMA integrity_check({INTEGRITY_ERRORS})").fetchall()
        return [str(r[0]) for r in rows]

    try:
        lines = await page.db.run(run)
    except StoreError as e:
        report.add(Problem(SQLITE, f"SQLite cannot check the database: {e}"))
        return
    if lines != ["ok"]:
        for line in lines:
            report.add(Problem(SQLITE, f"SQLite integrity_check: {line}"))


async def _scan(page: Page, report: PageCheck) -> set[bytes]:
    """Verify every stored piece against its digest; the digests of those that fail."""
    corrupt: set[bytes] = set()
    last = 0

    def batch(conn: sqlite3.Connection, after: int) -> tuple[int, int, list[bytes]]:
        rows = conn.execute(
            "SELECT id, digest, data FROM objects WHERE id > ? ORDER BY id LIMIT ?",
            (after, SCAN_ROWS),
        ).fetchall()
        bad = [bytes(d) for _, d, v in rows if not _verifies(bytes(d), v)]
        return (int(rows[-1][0]) if rows else after), len(rows), bad

    while True:
        try:
            last, n, bad = await page.db.run(functools.partial(batch, after=last))
        except StoreError as e:
            report.add(Problem(SQLITE, f"reading stored pieces after id {last} failed: {e}"))
            return corrupt
        report.stored += n
        for d in bad:
            corrupt.add(d)
        if n < SCAN_ROWS:
            return corrupt


def _verifies(digest: bytes, data: Any) -> bool:
    try:
        return not dg.is_inline(digest) and dg.verify(digest, data)
    except (TypeError, IndexError):  # a row whose columns are not what they should be
        return False


@dataclass
class _Tables:
    """The page's small tables, read in one read transaction."""

    commits: list[tuple[Any, ...]]
    """(id, data, generation, timestamp, root): the last three as stored, whatever
    their type."""
    parents: set[tuple[bytes, bytes]]
    heads: set[bytes]
    dangling_unsynced: int
    stale_remote: list[bytes]
    journals: set[str]
    journal_values: list[tuple[Any, ...]]
    orphan_entries: list[str]
    pruned: set[bytes]
    mistyped: dict[str, int]
    """Rows left out of the lists above, by table: their columns hold the wrong types."""


def _read_tables(conn: sqlite3.Connection) -> _Tables:
    conn.execute("BEGIN")
    try:
        mistyped: dict[str, int] = {}

        def rows(table: str, query: str, *types: type) -> list[tuple[Any, ...]]:
            """The rows whose columns hold the types given (``object``: any); the others
            are counted in ``mistyped``: the tables are not STRICT, so a damaged row may
            hold anything."""
            good = []
            for row in conn.execute(query):
                if all(isinstance(v, t) for v, t in zip(row, types, strict=True)):
                    good.append(tuple(row))
                else:
                    mistyped[table] = mistyped.get(table, 0) + 1
            return good

        # A commit's other columns are compared with its data as they are.
        commits = rows(
            "commits",
            "SELECT id, data, generation, timestamp, root FROM commits",
            bytes,
            bytes,
            object,
            object,
            object,
        )
        return _Tables(
            commits=commits,
            parents=set(rows("commit_parents", "SELECT * FROM commit_parents", bytes, bytes)),
            heads={r[0] for r in rows("heads", "SELECT commit_id FROM heads", bytes)},
            dangling_unsynced=int(
                conn.execute(
                    "SELECT count(*) FROM unsynced u WHERE NOT EXISTS "
                    "(SELECT 1 FROM objects o WHERE o.id = u.id)"
                ).fetchone()[0]
            ),
            stale_remote=[
                bytes(r[0])
                for r in conn.execute(
                    "SELECT r.digest FROM remote_pieces r CROSS JOIN objects o "
                    "ON o.digest = r.digest"
                )
            ],
            journals={str(r[0]) for r in conn.execute("SELECT id FROM journals")},
            journal_values=rows(
                "journal_entries",
                "SELECT journal_id, key, value FROM journal_entries WHERE value IS NOT NULL",
                str,
                bytes,
                bytes,
            ),
            orphan_entries=[
                str(r[0])
                for r in conn.execute(
                    "SELECT DISTINCT journal_id FROM journal_entries WHERE journal_id NOT IN "
                    "(SELECT id FROM journals)"
                )
            ],
            pruned={
                r[0] for r in rows("pruned_commits", "SELECT commit_id FROM pruned_commits", bytes)
            },
            mistyped=mistyped,
        )
    finally:
        conn.execute("COMMIT")


_MISTYPED_CODE = {
    "commits": COMMIT,
    "commit_parents": COMMIT,
    "pruned_commits": COMMIT,
    "heads": HEADS,
    "journal_entries": JOURNAL,
}
"""The problem code of rows of each table that hold values of the wrong type."""


def _check_commits(t: _Tables, report: PageCheck) -> dict[bytes, commit.Commit]:
    """Decode every commit; check ids, columns, parents, generations and edges."""
    good: dict[bytes, commit.Commit] = {}
    for cid, data, generation, timestamp, root in t.commits:
        try:
            c = commit.decode(data, cid)
        except CorruptObjectError as e:
            report.add(Problem(COMMIT, f"commit {cid.hex()[:12]}: {e}", commit=cid))
            continue
        if (c.generation, c.timestamp, c.root) != (generation, timestamp, root):
            report.add(
                Problem(
                    COMMIT, f"commit {cid.hex()[:12]}: its columns differ from its data", commit=cid
                )
            )
        good[cid] = c
    ids = {row[0] for row in t.commits}
    for c in good.values():
        for p in c.parents:
            if p not in ids and p != commit.FIRST.id:
                report.add(
                    Problem(
                        COMMIT,
                        f"commit {c.id.hex()[:12]}: its parent {p.hex()[:12]} is not stored",
                        commit=c.id,
                    )
                )
        known = [good[p].generation for p in c.parents if p in good]
        if known and len(known) == len(c.parents) and c.generation != 1 + max(known):
            report.add(Problem(COMMIT, f"commit {c.id.hex()[:12]}: wrong generation", commit=c.id))
    edges = {(c.id, p) for c in good.values() for p in c.parents}
    if edges != {e for e in t.parents if e[0] in good}:
        report.add(Problem(COMMIT, "commit_parents does not match the commits' parents"))
    childless = set(good) - {p for _, p in edges}
    expected = childless
    if not t.heads:
        report.add(Problem(HEADS, "the page has no head"))
    elif t.heads != expected:
        extra = sorted(t.heads - expected)
        missing = sorted(expected - t.heads)
        report.add(
            Problem(
                HEADS,
                "heads do not match the commits without children "
                f"({len(extra)} listed that have children or are unknown, "
                f"{len(missing)} childless not listed)",
            )
        )
    return good


def _check_tables(t: _Tables, report: PageCheck) -> None:
    for table, n in t.mistyped.items():
        report.add(
            Problem(_MISTYPED_CODE[table], f"{n} rows of {table} hold values of the wrong type")
        )
    if t.dangling_unsynced:
        report.add(
            Problem(UNSYNCED, f"{t.dangling_unsynced} rows of unsynced name no stored piece")
        )
    for d in t.stale_remote:
        report.add(
            Problem(REMOTE, f"piece {dg.short(d)} is stored and still listed as remote", digest=d)
        )
    for j in t.orphan_entries:
        report.add(Problem(JOURNAL, f"journal entries of {j!r}, a journal that does not exist"))


class _Walker:
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
        rows = await self.page.db.read_in(
            "SELECT o.digest, coalesce(u.status, 2) FROM objects o LEFT JOIN unsynced u "
            "ON u.id = o.id WHERE o.digest IN ({marks}) "
            "UNION ALL SELECT digest, -1 FROM remote_pieces WHERE digest IN ({marks})",
            digests,
            repeat=2,
        )
        out: dict[bytes, int] = {}
        for d, s in rows:
            out[bytes(d)] = max(out.get(bytes(d), -1), int(s))
        return out

    async def _read(self, digests: list[bytes]) -> dict[bytes, bytes]:
        """Contents of stored pieces that verify (others are reported by the scan)."""
        rows = await self.page.db.read_in(
            "SELECT digest, data FROM objects WHERE digest IN ({marks})", digests
        )
        return {bytes(d): bytes(v) for d, v in rows if _verifies(bytes(d), v)}

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
        rows = await self.page.db.read_all(
            "SELECT value FROM journal_entries WHERE value IS NOT NULL"
        )
        still = {bytes(r[0]) for r in rows}
        # A piece belongs to a value still in a journal if its key's value is there.
        keys_left = {k for _, k, v in entries if v in still}
        self.report.problems[before:] = [p for p in new if p.key in keys_left]


# -- repairs -------------------------------------------------------------------------------


async def restore_pieces(page: Page, pieces: dict[bytes, bytes]) -> list[bytes]:
    """Store pieces that came back from the cloud in place of corrupt or missing ones.

    Each is verified first (one that does not match is skipped). A corrupt row gets
    the right bytes; a missing piece is inserted. Both are ``synced`` (the cloud has
    them). Returns the digests restored."""
    good = {d: v for d, v in pieces.items() if not dg.is_inline(d) and dg.verify(d, v)}
    if not good:
        return []

    def work(conn: sqlite3.Connection) -> None:
        conn.executemany(
            "UPDATE objects SET data = ? WHERE digest = ?", [(v, d) for d, v in good.items()]
        )
        sql.put_pieces(conn, list(good.items()), SYNCED)
        sql.mark_synced(conn, good)

    await page.db.run(work, write=True)
    page.objects.clear_cache()
    return list(good)


async def drop_pieces(page: Page, digests: Iterable[bytes]) -> None:
    """Delete stored pieces that are damaged (before the page is rebuilt: what is made
    again is then stored, where a damaged row of the same digest would stay)."""
    ds = [(d,) for d in digests]

    def work(conn: sqlite3.Connection) -> None:
        conn.executemany(
            "DELETE FROM unsynced WHERE id = (SELECT id FROM objects WHERE digest = ?)", ds
        )
        conn.executemany("DELETE FROM objects WHERE digest = ?", ds)

    await page.db.run(work, write=True)
    page.objects.clear_cache()
    page.nodes.clear_cache()


async def prune_lost_history(page: Page, lost: Iterable[bytes]) -> int:
    """After a page's tree was rebuilt from the bucket, prune the commits (never the
    head) whose trees still reach one of the dropped pieces ``lost`` that did not come
    back: the bucket holds states as they were uploaded, not every commit of this
    device's history (two commits uploaded in one pack come back as one), so such a
    tree cannot be made again. Their rows stay, as history retention prunes
    (:mod:`store.page.gc`). Returns how many commits were pruned."""
    gone = set(lost)
    if not gone:
        return 0
    _, roots, _ = await history(page)
    head = page.graph.head.id
    clean: set[bytes] = set()  # tree nodes walked from a commit that reaches none of gone
    prune: list[bytes] = []
    for cid, root in roots.items():
        if cid == head or not root:
            continue
        walker = _Walker(page, PageCheck(page.ledger, page.id), set())
        walker.done = set(clean)  # (trees share most nodes: each is walked once)
        await walker.trees([root])
        if any(p.code == MISSING_PIECE and p.digest in gone for p in walker.report.problems):
            prune.append(cid)
        else:
            clean = walker.done

    def work(conn: sqlite3.Connection) -> None:
        conn.executemany(
            "INSERT OR IGNORE INTO pruned_commits (commit_id) VALUES (?)", [(c,) for c in prune]
        )

    if prune:
        await page.db.run(work, write=True)
    return len(prune)


async def synced_pieces(page: Page) -> list[bytes]:
    """Digests this page counts as in the cloud: stored pieces without an ``unsynced``
    row (tree nodes among them, which never leave the device), and pieces known only
    through ``remote_pieces``."""
    rows = await page.db.read_all(
        "SELECT o.digest FROM objects o WHERE NOT EXISTS "
        "(SELECT 1 FROM unsynced u WHERE u.id = o.id) "
        "UNION SELECT digest FROM remote_pieces"
    )
    return [bytes(r[0]) for r in rows]


async def history(page: Page) -> tuple[dict[bytes, list[bytes]], dict[bytes, bytes], set[bytes]]:
    """The page's commit graph as stored: each commit's parents, the tree root of each
    commit whose tree is kept (not pruned), and the heads."""

    def work(conn: sqlite3.Connection) -> tuple[Any, Any, Any]:
        conn.execute("BEGIN")
        try:
            edges = conn.execute("SELECT child, parent FROM commit_parents").fetchall()
            roots = conn.execute(
                "SELECT id, root FROM commits "
                "WHERE id NOT IN (SELECT commit_id FROM pruned_commits)"
            ).fetchall()
            heads = conn.execute("SELECT commit_id FROM heads").fetchall()
        finally:
            conn.execute("COMMIT")
        return edges, roots, heads

    edges, roots, heads = await page.db.run(work)
    parents: dict[bytes, list[bytes]] = {}
    for child, parent in edges:
        if isinstance(child, bytes) and isinstance(parent, bytes):
            parents.setdefault(child, []).append(parent)
    return (
        parents,
        {c: r for c, r in roots if isinstance(c, bytes) and isinstance(r, bytes)},
        {h for (h,) in heads if isinstance(h, bytes)},
    )


async def reachable(page: Page, roots: Iterable[bytes]) -> set[bytes]:
    """The hashed pieces reachable from these tree roots, walked as the check walks them
    (the subtree of a node that cannot be read is left out: the check reports it)."""
    walker = _Walker(page, PageCheck(page.ledger, page.id), set())
    await walker.trees(roots)
    return walker.seen


async def requeue(
    page: Page, digests: Iterable[bytes], uploaded_upto: int | None = None
) -> list[bytes]:
    """The cloud lacks these pieces (or this device's writes past ``uploaded_upto``)
    although the page counts them as there: make them pending again, so that the next
    upload round puts them in the bucket.

    Pieces go back to ``local`` (the one move of a status backwards: the bucket lost
    what it had). With ``uploaded_upto``, the page's writes after that time are
    uploaded again (the next upload reads every key from the first commit). A piece
    that is not stored here cannot be uploaded: it is left out of the result."""
    ds = list(dict.fromkeys(digests))

    def work(conn: sqlite3.Connection) -> list[bytes]:
        done = []
        for d in ds:
            row = conn.execute("SELECT id FROM objects WHERE digest = ?", (d,)).fetchone()
            if row is None:
                continue
            conn.execute(
                "INSERT INTO unsynced (id, status) VALUES (?, ?) "
                "ON CONFLICT (id) DO UPDATE SET status = max(status, excluded.status)",
                (row[0], LOCAL),
            )
            done.append(d)
        if uploaded_upto is not None:
            conn.execute(
                "INSERT OR REPLACE INTO sync_metadata (name, value) VALUES (?, ?)",
                (UPLOADED_ROW, str(uploaded_upto).encode()),
            )
            conn.execute("DELETE FROM sync_metadata WHERE name = ?", (UPLOADED_AT_ROW,))
        return done

    return await page.db.run(work, write=True)


async def repair_local(page: Page, report: PageCheck) -> None:
    """Repair what needs no cloud: a transient piece a commit reaches becomes local,
    stale ``remote_pieces`` rows and ``unsynced`` rows of no piece go, ``heads`` is
    rebuilt from the commits (under the commit lock, and the page reloads them).
    Marks those problems repaired."""
    transient = [p for p in report.open_problems(TRANSIENT_PIECE) if p.digest is not None]
    remote = [p for p in report.open_problems(REMOTE) if p.digest is not None]
    dangling = report.open_problems(UNSYNCED)
    heads = report.open_problems(HEADS)

    def work(conn: sqlite3.Connection) -> None:
        conn.executemany(
            f"UPDATE unsynced SET status = {LOCAL} WHERE status = {TRANSIENT} AND id = "
            "(SELECT id FROM objects WHERE digest = ?)",
            [(p.digest,) for p in transient],
        )
        conn.executemany(
            "DELETE FROM remote_pieces WHERE digest = ? AND EXISTS "
            "(SELECT 1 FROM objects WHERE digest = ?)",
            [(p.digest, p.digest) for p in remote],
        )
        conn.execute(
            "DELETE FROM unsynced WHERE NOT EXISTS "
            "(SELECT 1 FROM objects o WHERE o.id = unsynced.id)"
        )
        if heads:

            def ids(query: str) -> set[bytes]:  # a damaged row may hold anything
                return {r[0] for r in conn.execute(query) if isinstance(r[0], bytes)}

            expected = ids(
                "SELECT id FROM commits WHERE id NOT IN (SELECT parent FROM commit_parents)"
            )
            conn.execute("DELETE FROM heads")
            conn.executemany(
                "INSERT INTO heads (commit_id, timestamp) SELECT id, timestamp FROM commits "
                "WHERE id = ?",
                [(h,) for h in sorted(expected)],
            )

    if not (transient or remote or dangling or heads):
        return
    async with page.graph.lock:
        await page.db.run(work, write=True)
        if heads:
            await page.graph.load_heads()
    for p in [*transient, *remote, *heads]:
        p.repaired = True
    for p in dangling:
        if p.code == UNSYNCED and not any(
            w in p.message for w in ("wrong generation", "wrong type")
        ):
            p.repaired = True


async def check_quietly(page: Page) -> PageCheck:
    """:func:`check_page`, with an unexpected failure reported rather than raised."""
    try:
        return await check_page(page)
    except asyncio.CancelledError:
        raise
    except StoreError as e:
        report = PageCheck(page.ledger, page.id)
        report.add(Problem(SQLITE, f"the check could not finish: {e}"))
        return report
