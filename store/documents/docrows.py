"""The index rows and definitions the document views derive from a page's documents.

This module owns making, for :class:`store.documents.docindex.Views`, the index rows
of a write's records, and reading the index definitions a commit's tree holds and
the rows, highest revision and definition changes of a tree diff between two
commits. It writes nothing: storing the rows and following the definitions is the
views' job.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from ledgerd.store.documents import doclayout
from ledgerd.store.documents.docindexdef import IndexDef, Row
from ledgerd.store.documents.doclayout import DocId, Record, State
from ledgerd.store.errors import named
from ledgerd.store.page.page import Page
from ledgerd.store.page.view import live
from ledgerd.store.tree import btree
from ledgerd.store.tree.btree import Entry

log = logging.getLogger(__name__)

ROWS_PER_TURN = 1024
"""Documents a catch-up indexes between two turns it gives the event loop."""

HELD_ROW_OVERHEAD = 200
"""What a held row takes in memory beyond its key and document id (its dict entry,
tuples and bytes objects), for ``docindex.HELD_BYTES``."""

Defs = list[tuple[tuple[str, str], bytes | None]]
"""Definition changes: (collection, name) and the new definition (None: dropped)."""
Bodies = list[tuple[doclayout.DocKey, Entry | None]]
"""Documents' body entries to index (None: the body is gone)."""


async def tree_definitions(page: Page, root: bytes) -> dict[tuple[str, str], bytes]:
    """The index definitions the tree at ``root`` holds: (collection, name) -> raw."""
    want: dict[tuple[str, str], bytes] = {}
    async for e in btree.iterate(
        page.nodes, root, doclayout.INDEXES, btree.prefix_end(doclayout.INDEXES)
    ):
        name = doclayout.parse_index_key(e.key)
        if name is not None and live(e) is not None:
            want[name] = await page.objects.read_all(e.value)
    return want


def record_rows(
    by_coll: dict[str, list[tuple[int, IndexDef]]],
    records: Sequence[tuple[str, DocId, Record]],
    max_rev: bytes,
    size: int,
) -> tuple[list[Row], bytes, int]:
    """The rows of ``by_coll``'s indexes for the records a write put (collection,
    document id, record), the highest of their revisions and ``max_rev``, and ``size``
    plus what the rows take held in memory."""
    rows: list[Row] = []
    deleted_state = State.DELETED
    for coll, doc_id, r in records:
        if r.rev > max_rev:
            max_rev = r.rev
        views = by_coll.get(coll)
        if views is None:
            continue
        deleted = r.state is deleted_state
        for ix, d in views:
            key = d.key_of(r)
            rows.append((ix, doc_id, key, deleted))
            # what the row takes held in memory (HELD_ROW_OVERHEAD: see there)
            size += HELD_ROW_OVERHEAD + len(doc_id) + (0 if key is None else len(key))
    return rows, max_rev, size


async def read_diff(
    page: Page, old: bytes, new: bytes, indexes: list[tuple[int, IndexDef]]
) -> tuple[list[Row], bytes, Defs]:
    """Index rows to write, the highest revision among new heads, and the
    definitions that changed, from old to new."""
    by_coll = by_collection(indexes)
    max_rev = b""
    bodies: Bodies = []
    defs: Defs = []
    async for c in btree.diff(page.nodes, old, new):
        k = doclayout.parse_doc_key(c.key)
        if k is not None:
            if k.part == doclayout.HEAD:
                h = doclayout.head_of(c.new)
                if h is not None and h[0] > max_rev:
                    max_rev = h[0]
            elif k.part == doclayout.BODY and k.collection in by_coll:
                bodies.append((k, live(c.new)))
            continue
        name = doclayout.parse_index_key(c.key)
        if name is not None:
            e = live(c.new)
            defs.append((name, None if e is None else await page.objects.read_all(e.value)))
    rows = await body_rows(page, bodies, by_coll)
    return rows, max_rev, defs


async def body_rows(
    page: Page,
    bodies: Bodies,
    by_coll: dict[str, list[tuple[int, IndexDef]]],
) -> list[Row]:
    """The rows of ``by_coll``'s indexes for the documents whose bodies are ``bodies``."""
    values = await page.objects.read_many(e.value for _, e in bodies if e is not None)
    rows: list[Row] = []
    for i, (k, e) in enumerate(bodies):
        if i % ROWS_PER_TURN == ROWS_PER_TURN - 1:
            await asyncio.sleep(0)  # a large catch-up lets others run meanwhile
        r = None
        if e is not None:
            try:  # (data with no JSON form is indexed: a query names it damaged)
                r = doclayout.decode_record(values[e.value], json_data=False)
            except ValueError as e:  # damaged, or of a newer layout: in no index
                log.warning("page %s: a document body is not indexed: %s", named(page.id), e)
        for ix, d in by_coll[k.collection]:
            rows.append(row(ix, d, k.doc_id, r))
    return rows


def by_collection(indexes: list[tuple[int, IndexDef]]) -> dict[str, list[tuple[int, IndexDef]]]:
    """``indexes`` by their collection."""
    by_coll: dict[str, list[tuple[int, IndexDef]]] = {}
    for ix, d in indexes:
        by_coll.setdefault(d.collection, []).append((ix, d))
    return by_coll


def row(ix: int, d: IndexDef, doc_id: DocId, r: Record | None) -> Row:
    """The row of index ``ix`` for a document whose body is ``r`` (None: no body)."""
    key = None if r is None else d.key_of(r)
    return ix, doc_id, key, r is not None and r.state is State.DELETED


def doc_id(value: Any) -> DocId:
    """A row's document id as SQLite gives it back: text for a chosen id, else bytes."""
    return value if isinstance(value, str) else bytes(value)
