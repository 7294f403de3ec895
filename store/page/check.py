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

The report (codes, :class:`Problem`, :class:`PageCheck`) lives in
:mod:`store.page.checkreport` and the walk of trees and values in
:mod:`store.page.checkwalk`; this module names them all, so callers import the check
from here alone. Its SQL is in :mod:`store.sqlite.integrity`. A repair is only safe
next to the check that found the problem, so both stay here.
"""

from __future__ import annotations

import asyncio
import functools
import sqlite3
from collections.abc import Iterable

from ledgerd.store.errors import CorruptObjectError, StoreError
from ledgerd.store.page.checkreport import (
    CLOUD,
    COMMIT,
    CORRUPT_PIECE,
    DAMAGED_DOCUMENT,
    DAMAGED_INDEX_DEFINITION,
    DOCUMENT_CODES,
    DUPLICATE_PIECE,
    HEADS,
    INTEGRITY_ERRORS,
    JOURNAL,
    MAX_PROBLEMS,
    MISSING_PIECE,
    NOT_CHECKED,
    NOT_IN_CLOUD,
    REMOTE,
    SCAN_ROWS,
    SQLITE,
    TRANSIENT_PIECE,
    UNSUPPORTED_LAYOUT,
    UNSYNCED,
    ContentCheck,
    ContentRecord,
    PageCheck,
    Problem,
    content_check,
    set_content_check,
)
from ledgerd.store.page.checkwalk import Walker, verifies
from ledgerd.store.page.page import Page
from ledgerd.store.pieces import delta
from ledgerd.store.pieces import digest as dg
from ledgerd.store.sqlite import integrity
from ledgerd.store.tree import commit

__all__ = [
    "CLOUD",
    "COMMIT",
    "CORRUPT_PIECE",
    "DAMAGED_DOCUMENT",
    "DAMAGED_INDEX_DEFINITION",
    "DOCUMENT_CODES",
    "DUPLICATE_PIECE",
    "HEADS",
    "INTEGRITY_ERRORS",
    "JOURNAL",
    "MAX_PROBLEMS",
    "MISSING_PIECE",
    "NOT_CHECKED",
    "NOT_IN_CLOUD",
    "REMOTE",
    "SCAN_ROWS",
    "SQLITE",
    "TRANSIENT_PIECE",
    "UNSUPPORTED_LAYOUT",
    "UNSYNCED",
    "ContentCheck",
    "ContentRecord",
    "PageCheck",
    "Problem",
    "check_page",
    "check_quietly",
    "content_check",
    "drop_pieces",
    "history",
    "prune_lost_history",
    "reachable",
    "repair_local",
    "requeue",
    "restore_pieces",
    "set_content_check",
    "synced_pieces",
]


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
    tables = await page.db.run(integrity.read_tables)
    commits = _check_commits(tables, report)
    report.commits = len(commits)
    _check_tables(tables, report)
    walker = Walker(page, report, corrupt)
    # The head's tree first, its document records read as its leaves come; then the
    # rest of the history, the nodes the head shares with it not read again.
    await walker.trees([head.root], documents=True)
    walker.report_documents()
    # Pruned commits (history retention, store.page.gc) keep their rows, not their trees.
    await walker.trees([c.root for c in commits.values() if c.id not in tables.pruned])
    await walker.journals(tables.journal_values)
    return report


async def _integrity(page: Page, report: PageCheck) -> None:
    try:
        lines = await page.db.run(
            functools.partial(integrity.integrity_lines, most=INTEGRITY_ERRORS)
        )
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
        rows, chains = integrity.pieces_after(conn, after, SCAN_ROWS)
        broken: set[bytes] = set()
        rebuilt = delta.assemble(chains, broken)  # those stored as deltas
        bad = [
            bytes(d)
            for _, d, v in rows
            if bytes(d) in broken or not verifies(bytes(d), rebuilt.get(bytes(d), v))
        ]
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


_MISTYPED_CODE = {
    "commits": COMMIT,
    "commit_parents": COMMIT,
    "pruned_commits": COMMIT,
    "heads": HEADS,
    "journal_entries": JOURNAL,
}
"""The problem code of rows of each table that hold values of the wrong type."""


def _check_commits(t: integrity.Tables, report: PageCheck) -> dict[bytes, commit.Commit]:
    """Decode every commit; check ids, columns, parents, generations and edges."""
    good = _decode_commits(t, report)
    _check_parents(t, good, report)
    edges = {(c.id, p) for c in good.values() for p in c.parents}
    if edges != {e for e in t.parents if e[0] in good}:
        report.add(Problem(COMMIT, "commit_parents does not match the commits' parents"))
    _check_heads(t, set(good) - {p for _, p in edges}, report)
    return good


def _decode_commits(t: integrity.Tables, report: PageCheck) -> dict[bytes, commit.Commit]:
    """The commits that decode to their ids, their other columns checked against their data."""
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
    return good


def _check_parents(
    t: integrity.Tables, good: dict[bytes, commit.Commit], report: PageCheck
) -> None:
    """Every parent is stored, and every generation is one more than its parents' largest."""
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


def _check_heads(t: integrity.Tables, expected: set[bytes], report: PageCheck) -> None:
    """``heads`` holds exactly the commits without children."""
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


def _check_tables(t: integrity.Tables, report: PageCheck) -> None:
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
    for d in t.duplicates:
        report.add(
            Problem(
                DUPLICATE_PIECE, f"piece {dg.short(d)} is stored in more than one row", digest=d
            )
        )
    for j in t.orphan_entries:
        report.add(Problem(JOURNAL, f"journal entries of {j!r}, a journal that does not exist"))


# -- repairs -------------------------------------------------------------------------------


async def restore_pieces(page: Page, pieces: dict[bytes, bytes]) -> list[bytes]:
    """Store pieces that came back from the cloud in place of corrupt or missing ones.

    Each is verified first (one that does not match is skipped). A corrupt row gets
    the right bytes; a missing piece is inserted. Both are ``synced`` (the cloud has
    them). Returns the digests restored."""
    good = {d: v for d, v in pieces.items() if not dg.is_inline(d) and dg.verify(d, v)}
    if not good:
        return []

    await page.db.run(functools.partial(integrity.restore_pieces, good=good), write=True)
    page.objects.clear_cache()
    return list(good)


async def drop_pieces(page: Page, digests: Iterable[bytes]) -> list[bytes]:
    """Delete stored pieces that are damaged (before the page is rebuilt: what is made
    again is then stored, where a damaged row of the same digest would stay), with the
    deltas made against them; the digests of every piece deleted."""
    ds = list(digests)
    gone = await page.db.run(functools.partial(integrity.drop_pieces, digests=ds), write=True)
    page.objects.clear_cache()
    page.nodes.clear_cache()
    return gone


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
        walker = Walker(page, PageCheck(page.ledger, page.id), set())
        walker.done = set(clean)  # (trees share most nodes: each is walked once)
        await walker.trees([root])
        if any(p.code == MISSING_PIECE and p.digest in gone for p in walker.report.problems):
            prune.append(cid)
        else:
            clean = walker.done

    if prune:
        await page.db.run(functools.partial(integrity.prune_commits, commits=prune), write=True)
    return len(prune)


async def synced_pieces(page: Page) -> list[bytes]:
    """Digests this page counts as in the cloud: stored pieces without an ``unsynced``
    row (tree nodes among them, which never leave the device), and pieces known only
    through ``remote_pieces``."""
    rows = await page.db.read_all(integrity.SYNCED_PIECES)
    return [bytes(r[0]) for r in rows]


async def history(page: Page) -> tuple[dict[bytes, list[bytes]], dict[bytes, bytes], set[bytes]]:
    """The page's commit graph as stored: each commit's parents, the tree root of each
    commit whose tree is kept (not pruned), and the heads."""

    edges, roots, heads = await page.db.run(integrity.read_history)
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
    walker = Walker(page, PageCheck(page.ledger, page.id), set())
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
    work = functools.partial(integrity.requeue_pieces, digests=ds, uploaded_upto=uploaded_upto)
    return await page.db.run(work, write=True)


def _of_pieces(report: PageCheck, code: str) -> tuple[list[Problem], list[bytes]]:
    """The open problems of ``code`` that name a piece, and those pieces."""
    problems = [p for p in report.open_problems(code) if p.digest is not None]
    return problems, [p.digest for p in problems if p.digest is not None]


async def repair_local(page: Page, report: PageCheck) -> None:
    """Repair what needs no cloud: a transient piece a commit reaches becomes local,
    stale ``remote_pieces`` rows, ``unsynced`` rows of no piece and second rows of a
    digest go, ``heads`` is rebuilt from the commits (under the commit lock, and the
    page reloads them). Marks those problems repaired."""
    transient, transient_ds = _of_pieces(report, TRANSIENT_PIECE)
    remote, remote_ds = _of_pieces(report, REMOTE)
    twice, twice_ds = _of_pieces(report, DUPLICATE_PIECE)
    dangling = report.open_problems(UNSYNCED)
    heads = report.open_problems(HEADS)
    if not (transient or remote or dangling or heads or twice):
        return
    work = functools.partial(
        integrity.repair_rows,
        transient=transient_ds,
        remote=remote_ds,
        heads=bool(heads),
        duplicates=twice_ds,
    )
    async with page.graph.lock:
        await page.db.run(work, write=True)
        if heads:
            await page.graph.load_heads()
    for p in [*transient, *remote, *heads, *twice]:
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
