"""What a page gives to sync: the delta it has to upload, and its whole state.

This module owns reading what this device wrote since its last upload (the entries, the
page's context, the pieces of the values it wrote), recording an upload, and a page's
whole state for a checkpoint, with the pieces of every value. Importing what comes from
other devices is :mod:`store.page.incoming`'s; sync reaches both through
:mod:`store.page.exchange`. The design is ``docs/convergence.md``.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass, field

from ledgerd.store.errors import StoreError
from ledgerd.store.page import gc
from ledgerd.store.page.page import Page
from ledgerd.store.pieces import digest as dg
from ledgerd.store.pieces import split
from ledgerd.store.sqlite import metadata, sql
from ledgerd.store.sqlite.schema import UPLOADED_AT_ROW, UPLOADED_ROW
from ledgerd.store.tree import btree, dots, join
from ledgerd.store.tree.btree import Priority, RawEntry
from ledgerd.store.tree.commit import FIRST, Commit

# -- uploading --------------------------------------------------------------------------


@dataclass
class Delta:
    """What a page has to upload: the entries this device wrote since ``since`` (its
    clock time at the last upload), up to ``upto``, in key order; the page's context;
    and the pieces of the values it wrote, by priority (LAZY ones in the order of their
    values' bytes). ``at``: the commit it was read at."""

    entries: list[RawEntry]
    ctx: dots.Context
    since: int
    upto: int
    at: bytes
    eager: list[bytes] = field(default_factory=list)
    lazy: list[bytes] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.entries and self.upto <= self.since


async def uploaded_upto(page: Page) -> int:
    """The clock time up to which this device's writes to the page are uploaded (-1:
    none are)."""
    v = await sync_value(page, UPLOADED_ROW)
    try:
        return int(v) if v is not None else -1
    except ValueError:
        return -1


async def has_unuploaded(page: Page) -> bool:
    """Whether the page holds committed writes of this device not uploaded yet (writes
    still in its journal are the writer's to tell: ``page.writer.uncommitted``)."""
    return page.graph.ctx.get(page.graph.tag, -1) > await uploaded_upto(page)


async def pending_delta(page: Page) -> Delta | None:
    """The page's delta, or None if this device wrote nothing since its last upload.

    The keys are those that changed since the commit the last upload was read at
    (:data:`store.sqlite.schema.UPLOADED_AT_ROW`; the first commit if none, or if it was
    pruned) whose entry holds a version of this device's newer than the last upload;
    on a document page each such document goes whole. A key carries all its versions
    (siblings written elsewhere included: the receiver has seen them, or will first)."""
    await page.flush()
    graph = page.graph
    head, ctx, tag = graph.head, dict(graph.ctx), graph.tag
    since = await uploaded_upto(page)
    upto = ctx.get(tag, -1)
    if upto <= since:
        return None
    base = await _delta_base(page)
    ordered = await _changed_entries(page, base, head.root, tag, since)
    eager, lazy = await _delta_pieces(page, ordered, tag, since)
    return Delta(ordered, ctx, since, upto, head.id, eager, lazy)


async def _delta_base(page: Page) -> bytes:
    """The root the delta diffs from: the commit the last upload was read at, or the
    first commit's (none, or pruned, or not loaded)."""
    at = await sync_value(page, UPLOADED_AT_ROW)
    if at is not None and len(at) == 32 and not await gc.is_pruned(page, at):
        try:
            return (await page.load_commit(at)).root
        except StoreError:
            return FIRST.root
    return FIRST.root


async def _changed_entries(
    page: Page, base: bytes, root: bytes, tag: bytes, since: int
) -> list[RawEntry]:
    """The entries changed from ``base`` to ``root`` that hold a version of this device
    (``tag``) newer than ``since``, in key order; on a document page, whole documents."""
    nodes = page.nodes

    def mine(e: RawEntry) -> bool:
        return any(v[2][8:] == tag and dots.time_of(v[2]) > since for v in dots.versions(e))

    entries: dict[bytes, RawEntry] = {}
    groups: dict[bytes, None] = {}
    doc_page = await join.is_document_page(nodes, root)
    rule = join.group_rule()
    async for c in btree.diff(nodes, base, root):
        if c.new is None or not mine(c.new):
            continue
        group = rule.group_of(c.key) if doc_page else None
        if group is not None:
            groups[group] = None
        else:
            entries[c.key] = btree.raw(c.new)
    for group in groups:
        async for g in btree.iterate(nodes, root, group, rule.group_end(group)):
            entries[g.key] = btree.raw(g)
    return [entries[k] for k in sorted(entries)]


async def _delta_pieces(
    page: Page, ordered: list[RawEntry], tag: bytes, since: int
) -> tuple[list[bytes], list[bytes]]:
    """(eager, lazy) pieces of the values this device wrote after ``since``: the eager
    ones stored here, sorted; the lazy ones in the order of their values' bytes."""
    eager_values: set[bytes] = set()
    lazy_values: set[bytes] = set()
    for e in ordered:
        for v in dots.versions(e):
            if v[2][8:] == tag and dots.time_of(v[2]) > since and not dg.is_inline(v[0]):
                (lazy_values if v[1] == Priority.LAZY else eager_values).add(v[0])
    return await _eager_and_lazy(page, eager_values, lazy_values, missing_ok=True)


async def _eager_and_lazy(
    page: Page, eager_values: set[bytes], lazy_values: set[bytes], *, missing_ok: bool
) -> tuple[list[bytes], list[bytes]]:
    """The stored pieces of the EAGER values, sorted, and the pieces of the LAZY ones
    that are not among them, in each value's byte order (``missing_ok``: as
    :func:`_pieces_in_order`)."""
    eager = sorted(await _stored_pieces(page, eager_values))
    seen = set(eager)
    lazy: dict[bytes, None] = {}
    for root in sorted(lazy_values - eager_values):
        for d in await _pieces_in_order(page, root, missing_ok=missing_ok):
            if d not in seen:
                lazy[d] = None
    return eager, list(lazy)


async def _stored_pieces(page: Page, roots: Iterable[bytes]) -> set[bytes]:
    """The stored pieces of the values with these root digests."""
    roots = [r for r in roots if not dg.is_inline(r)]
    if not roots:
        return set()
    return await page.objects.value_pieces(roots)


async def _pieces_in_order(page: Page, root: bytes, *, missing_ok: bool) -> list[bytes]:
    """A value's pieces in the order of its bytes (each index before what it lists). An
    index piece this device cannot read (not stored here, nor fetched: it never read
    the value) leaves out what it lists if ``missing_ok``, else raises."""
    out: list[bytes] = []
    stack = [root]
    while stack:
        d = stack.pop()
        if dg.is_inline(d):
            continue
        out.append(d)
        if dg.is_index(d):
            try:
                children = split.decode_index(await page.objects.get_piece(d))
            except StoreError:
                if not missing_ok:
                    raise
                continue
            stack.extend(reversed([c.digest for c in children]))
    return out


async def mark_uploaded(page: Page, delta: Delta) -> None:
    """After a successful upload: this device's writes up to ``delta.upto`` are in the
    cloud, and so are the delta's pieces."""
    rows = [(UPLOADED_ROW, str(delta.upto).encode()), (UPLOADED_AT_ROW, delta.at)]

    def work(conn: sqlite3.Connection) -> None:
        sql.mark_uploaded(conn, [*delta.eager, *delta.lazy])
        metadata.set_sync_values(conn, rows)

    await page.db.run(work, write=True)


# -- whole states (checkpoints) ------------------------------------------------------------


@dataclass
class State:
    """A page's whole state for a checkpoint: every entry (siblings included), the
    context, and the pieces of every value (EAGER ones, then LAZY ones in the order of
    their values' bytes)."""

    head: Commit
    entries: list[RawEntry]
    ctx: dots.Context
    eager: list[bytes]
    lazy: list[bytes]


async def state(page: Page) -> State | None:
    """The page's whole state (None if it has nothing: its first commit)."""
    await page.flush()
    head, ctx = page.head, dict(page.graph.ctx)
    if head.id == FIRST.id:
        return None
    entries: list[RawEntry] = []
    n = 0
    async for run in btree.runs(page.nodes, head.root):
        entries.extend(run)
        n += len(run)
        if n >= join.TURN_KEYS:
            n = 0
            await asyncio.sleep(0)
    eager_values: set[bytes] = set()
    lazy_values: set[bytes] = set()
    for v in btree.versions_of(entries):
        if not dg.is_inline(v[0]):
            (lazy_values if v[1] == Priority.LAZY else eager_values).add(v[0])
    eager, lazy = await _eager_and_lazy(page, eager_values, lazy_values, missing_ok=False)
    return State(head, entries, ctx, eager, lazy)


# -- the sync rows it reads ----------------------------------------------------------------


async def sync_value(page: Page, name: str) -> bytes | None:
    """The value of the page's ``sync_metadata`` row ``name`` (None if there is none)."""
    rows = await page.db.read_all("SELECT value FROM sync_metadata WHERE name = ?", (name,))
    return bytes(rows[0][0]) if rows else None
