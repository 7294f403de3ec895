"""What a page gives to and takes from sync: deltas, whole states, and their pieces.

This module owns the store side of cloud sync without any network code: the *delta* a
page has to upload (its entries this device wrote since its last upload, with the page's
context and the pieces of the values it wrote), recording an upload, importing another
device's delta when it is causally ready, a page's whole state for a checkpoint and
joining one, all after verifying what came in (digests, entries, dots). Sync
(:mod:`sync.engine`) moves the bytes. The design is ``docs/convergence.md``.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ledgerd.store.errors import CorruptObjectError, InvalidDigestError, StoreError, named
from ledgerd.store.page import deleted, gc
from ledgerd.store.page.page import Page
from ledgerd.store.page.view import KEY_LIMIT
from ledgerd.store.pieces import digest as dg
from ledgerd.store.pieces import split
from ledgerd.store.pieces.objects import mismatched
from ledgerd.store.sqlite import metadata, piece_rows, sql
from ledgerd.store.sqlite.schema import PIECES_WAITING as PIECES_WAITING
from ledgerd.store.sqlite.schema import SYNCED, UPLOADED_AT_ROW, UPLOADED_ROW
from ledgerd.store.tree import btree, dots, join
from ledgerd.store.tree.btree import Builder, Priority, RawEntry, Version
from ledgerd.store.tree.commit import FIRST, Commit, child

log = logging.getLogger(__name__)

VERIFY_INLINE = 256
"""An arriving batch of more pieces than this (or of 256 KiB) is verified on a thread:
hashing a pack's 100,000 pieces held the event loop 0.2 s."""


class NotReadyError(StoreError):
    """A delta needs writes this page has not seen yet (it is applied once they arrive);
    ``needs`` says, per writer tag, the clock time the page must have seen."""

    def __init__(self, message: str, needs: Mapping[bytes, int]) -> None:
        super().__init__(message)
        self.needs = dict(needs)


class MissingValueError(NotReadyError):
    """An entry a join keeps names a value that is neither here nor in what came with
    it (a damaged peer, or a delta applied out of order): it waits, as for a write."""


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
    eager = sorted(await _stored_pieces(page, eager_values))
    lazy: dict[bytes, None] = {}
    eager_set = set(eager)
    for root in sorted(lazy_values - eager_values):
        for d in await _pieces_in_order(page, root):
            if d not in eager_set:
                lazy[d] = None
    return eager, list(lazy)


async def _stored_pieces(page: Page, roots: Iterable[bytes]) -> set[bytes]:
    """The stored pieces of the values with these root digests."""
    roots = [r for r in roots if not dg.is_inline(r)]
    if not roots:
        return set()
    return await page.objects.value_pieces(roots)


async def _pieces_in_order(page: Page, root: bytes) -> list[bytes]:
    """A value's pieces in the order of its bytes (each index before what it lists);
    pieces not stored here are left out."""
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


# -- checking what arrives -----------------------------------------------------------------


def check_entries(raw: object) -> list[RawEntry]:
    """The entries of a delta or a state as received (msgpack arrays), checked: keys
    strictly increasing, each a key a write can make (or the deleted-page mark); values
    are value digests; priorities 0 or 1; dots well formed; siblings as a tree holds
    them. CorruptObjectError otherwise."""
    if not isinstance(raw, list | tuple):
        raise CorruptObjectError("entries are an array")
    out: list[RawEntry] = []
    last: bytes | None = None
    for item in raw:
        if not isinstance(item, list | tuple) or len(item) not in (4, 5):
            raise CorruptObjectError("an entry is [key, value, priority, dot(, siblings)]")
        key = item[0]
        if type(key) is not bytes or (len(key) > KEY_LIMIT and key != deleted.MARK):
            raise CorruptObjectError("an entry's key is malformed")
        if last is not None and key <= last:
            raise CorruptObjectError("entries are not in strictly increasing key order")
        last = key
        versions = [_check_version(item[1:4])]
        if len(item) == 5:
            sib = item[4]
            if not isinstance(sib, list | tuple) or not sib:
                raise CorruptObjectError("an entry's siblings are a non-empty array")
            versions.extend(_check_version(v) for v in sib)
        if len({v[2] for v in versions}) != len(versions):
            raise CorruptObjectError("an entry holds a dot twice")
        e = dots.entry(key, versions)
        assert e is not None
        out.append(e)
    return out


def _check_version(v: object) -> Version:
    if not isinstance(v, list | tuple) or len(v) != 3:
        raise CorruptObjectError("a version is [value, priority, dot]")
    value, prio, dot = v
    if type(value) is not bytes:
        raise CorruptObjectError("a value is a digest")
    try:
        dg.validate(value)
    except InvalidDigestError as e:
        raise CorruptObjectError(f"a value is not a digest: {e}") from None
    if value != dg.TOMBSTONE and dg.kind_of(value) != dg.Kind.VALUE:
        raise CorruptObjectError("an entry's value is not a value")
    if type(prio) is not int or prio not in (0, 1):
        raise CorruptObjectError("a priority is 0 or 1")
    return (value, prio, dots.check_dot(dot))


async def _verify(pieces: dict[bytes, bytes]) -> None:
    bad = await mismatched(pieces, most_inline=VERIFY_INLINE)
    if bad:
        raise CorruptObjectError(f"piece {dg.short(bad[0])} does not match its digest")


# -- importing ---------------------------------------------------------------------------


def readiness(
    ctx: Mapping[bytes, int], writer: bytes, since: int, rctx: Mapping[bytes, int]
) -> dict[bytes, int]:
    """What a page of context ``ctx`` lacks to apply a delta of ``writer`` made after
    ``since`` with context ``rctx``: per writer tag, the time it must have seen (empty:
    ready). The writer's own earlier writes up to ``since``, and every other writer's as
    far as the delta's context goes."""
    needs = {t: v for t, v in rctx.items() if t != writer and ctx.get(t, -1) < v}
    if ctx.get(writer, -1) < since:
        needs[writer] = since
    return needs


async def apply_delta(
    page: Page,
    entries: list[RawEntry],
    pieces: dict[bytes, bytes],
    lazy: dict[bytes, str],
    rctx: dots.Context,
    *,
    writer: bytes,
    since: int,
    upto: int,
    markers: Sequence[tuple[str, bytes]] = (),
) -> bool:
    """Join another device's delta into the page (``entries`` checked by
    :func:`check_entries`; ``pieces`` its EAGER pieces, verified here; ``lazy`` where its
    LAZY pieces lie in the cloud; ``rctx`` its context; ``writer`` its device's tag and
    ``since``/``upto`` the range of that device's writes it holds). Raises
    :class:`NotReadyError` unless the page has seen what it needs
    (:func:`readiness`). ``markers`` are sync_metadata rows written with it. Returns
    whether the page changed; a delta whose writes the page has seen already changes
    nothing (its markers are still written)."""
    await _verify(pieces)
    if not entries and upto < 0:
        # Pieces alone (a large upload's first packs): kept for the entries that come
        # with a later pack; nothing to join.
        await _write_markers(page, markers, pieces, lazy)
        return False
    rctx = {**rctx, writer: max(rctx.get(writer, -1), upto)}
    markers = await _came_back(page, rctx, markers)
    await page.flush()  # a plain write has seen the state it is applied to: commit them first
    async with gc.held(page):
        graph = page.graph
        async with graph.lock:
            lctx = graph.ctx
            if lctx.get(writer, -1) >= upto and dots.covers_context(lctx, rctx):
                # Seen already: the pieces are kept all the same (a value's pieces
                # another pack brought may be missing here).
                await _write_markers(page, markers, pieces, lazy)
                return False
            needs = readiness(lctx, writer, since, rctx)
            if needs:
                raise NotReadyError(_needs_text(needs), needs)
            builder = Builder(page.nodes)
            head = graph.head
            changes = await join.join_delta(
                builder, head.root, entries, dots.seen_by(lctx), dots.seen_by(rctx)
            )
            changed = await _store(page, builder, head, changes, pieces, lazy, rctx, markers)
    if changed and page.graph.conflicts:
        await page.conflicts.settle()  # (a policy that asks a resolver asks it now)
    return changed


async def apply_state(
    page: Page,
    entries: list[RawEntry],
    pieces: dict[bytes, bytes],
    lazy: dict[bytes, str],
    rctx: dots.Context,
    markers: Sequence[tuple[str, bytes]] = (),
) -> bool:
    """Join a whole state (a checkpoint's: ``entries`` checked by :func:`check_entries`,
    with its pieces and context) into the page; always allowed, however far behind or
    ahead of it the page is. Returns whether the page changed."""
    await _verify(pieces)
    markers = await _came_back(page, rctx, markers)
    await page.flush()
    async with gc.held(page):
        graph = page.graph
        async with graph.lock:
            lctx = graph.ctx
            builder = Builder(page.nodes)
            head = graph.head
            remote_root = await join.state_tree(builder, entries)
            changes = await join.join_state(
                builder, head.root, remote_root, dots.seen_by(lctx), dots.seen_by(rctx)
            )
            changed = await _store(page, builder, head, changes, pieces, lazy, rctx, markers)
    if changed and page.graph.conflicts:
        await page.conflicts.settle()
    return changed


async def _store(
    page: Page,
    builder: Builder,
    head: Commit,
    changes: list[tuple[bytes, RawEntry | None]],
    pieces: dict[bytes, bytes],
    lazy: dict[bytes, str],
    rctx: dots.Context,
    markers: Sequence[tuple[str, bytes]],
) -> bool:
    """Store a join's result (commit lock held): one import commit whose context is the
    join of both, with the pieces that came and where the LAZY ones lie."""
    graph = page.graph
    lctx = graph.ctx
    ctx = dots.join_contexts(lctx, rctx)
    wanted = await _check_values(page, head, changes, pieces, lazy)
    pieces = _pieces_of(wanted, pieces)  # not those of versions the join dropped
    root = await builder.apply(head.root, changes) if changes else head.root
    if root == head.root and ctx == lctx:
        await _write_markers(page, markers, pieces, lazy)
        return False
    ts = max(graph.next_time(), dots.latest(ctx))
    c = child(head, root, ts)

    def work(conn: sqlite3.Connection) -> None:
        _store_remote(conn, pieces, lazy)
        _markers(conn, markers)

    await graph.store(
        c, builder, also=work, also_small=False, ctx=ctx, changed=changes, kind="import"
    )
    return root != head.root


async def _check_values(
    page: Page,
    head: Commit,
    changes: Sequence[tuple[bytes, RawEntry | None]],
    pieces: Mapping[bytes, bytes],
    lazy: Mapping[bytes, str],
) -> set[bytes]:
    """The values a join keeps that are new here; each must be here, in what came, or
    in the cloud (``lazy``), the pieces its index pieces list too: else
    :class:`MissingValueError`."""
    wanted: set[bytes] = set()
    for key, e in changes:
        if e is None:
            continue
        old = await btree.lookup(page.nodes, head.root, key)
        had = {v[2] for v in dots.versions(old)}
        for v in dots.versions(e):
            if v[2] not in had and not dg.is_inline(v[0]):
                wanted.add(v[0])
    elsewhere = wanted - pieces.keys() - lazy.keys()
    # An index piece that came names the rest of its value, which must be somewhere too:
    # the packs that brought those pieces before this one may be compacted away.
    todo = [d for d in wanted if d in pieces and dg.is_index(d)]
    walked: set[bytes] = set()
    while todo:
        d = todo.pop()
        if d in walked:
            continue
        walked.add(d)
        for c in index_children(pieces[d]):
            if c in pieces:
                if dg.is_index(c):
                    todo.append(c)
            elif not dg.is_inline(c) and c not in lazy:
                elsewhere.add(c)
    if not elsewhere:
        return wanted
    known = await page.objects.known(list(elsewhere))
    missing = elsewhere - set(known)
    if missing:
        located = await remote_locations(page, list(missing))
        missing -= located.keys()
    if missing:
        raise MissingValueError(
            f"value {dg.short(next(iter(missing)))} of an entry it keeps is nowhere", {}
        )
    return wanted


def _pieces_of(roots: set[bytes], pieces: dict[bytes, bytes]) -> dict[bytes, bytes]:
    """The pieces among ``pieces`` of the values with these root digests (an index
    piece brings the pieces it lists)."""
    if len(roots) == len(pieces) and roots == pieces.keys():
        return pieces
    out: dict[bytes, bytes] = {}
    todo = [r for r in roots if r in pieces]
    while todo:
        d = todo.pop()
        if d in out:
            continue
        out[d] = pieces[d]
        if dg.is_index(d):
            todo.extend(c for c in index_children(pieces[d]) if c in pieces)
    return out


async def _came_back(
    page: Page, rctx: Mapping[bytes, int], markers: Sequence[tuple[str, bytes]]
) -> Sequence[tuple[str, bytes]]:
    """``markers``, and the page's upload mark moved up when this device's own writes
    came back through the bucket that the page did not have (a restored page, a page
    rebuilt): what came from the bucket is in it, and is not uploaded again. Writes
    the page has are not: a checkpoint this device wrote holds its writes not
    uploaded yet, which the devices that read packs get only from a pack."""
    tag = page.graph.tag
    back = rctx.get(tag, -1)
    if back > page.graph.ctx.get(tag, -1) and back > await uploaded_upto(page):
        return [*markers, (UPLOADED_ROW, str(back).encode())]
    return markers


def _needs_text(needs: Mapping[bytes, int]) -> str:
    parts = [f"writer {t.hex()} up to {dots.format_time(v)}" for t, v in sorted(needs.items())]
    return "needs writes it has not seen yet: " + ", ".join(parts)


async def _write_markers(
    page: Page,
    markers: Sequence[tuple[str, bytes]],
    pieces: dict[bytes, bytes] | None = None,
    lazy: dict[bytes, str] | None = None,
) -> None:
    """Write ``markers``, and store ``pieces`` and ``lazy`` locations, with no commit."""
    if not (markers or pieces or lazy):
        return

    def work(conn: sqlite3.Connection) -> None:
        _store_remote(conn, pieces or {}, lazy or {})
        _markers(conn, markers)

    await page.db.run(work, write=True)


def _markers(conn: sqlite3.Connection, markers: Sequence[tuple[str, bytes]]) -> None:
    metadata.set_sync_values(conn, list(markers))


def _store_remote(
    conn: sqlite3.Connection, pieces: dict[bytes, bytes], lazy: dict[bytes, str]
) -> None:
    """Store verified pieces from the cloud, and where the LAZY ones left there lie."""
    sql.put_pieces(conn, pieces.items(), SYNCED)
    sql.mark_synced(conn, lazy)
    piece_rows.note_remote(conn, lazy)


async def forget(page: Page) -> None:
    """Make the page's state empty, as a page that has seen nothing (its history and
    what it uploaded stay): the first step of rebuilding a page whose tree is damaged
    from the bucket, which holds all of it (the caller checked that nothing of this
    device's waits for upload). Its own writes come back from the bucket like anyone's."""
    await page.flush()
    graph = page.graph
    async with graph.lock:
        head = graph.head
        c = child(head, btree.EMPTY, graph.next_time())

        def work(conn: sqlite3.Connection) -> None:
            metadata.clear_conflicts(conn)
            metadata.set_sync_values(conn, [(UPLOADED_AT_ROW, c.id)])
            metadata.drop_imported_markers(conn)

        await graph.store(c, Builder(page.nodes), also=work, also_small=False, ctx={})
        graph.conflicts = 0


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
    eager = sorted(await _stored_pieces(page, eager_values))
    seen = set(eager)
    lazy: dict[bytes, None] = {}
    for root in sorted(lazy_values - eager_values):
        for d in await _value_pieces_anywhere(page, root):
            if d not in seen:
                lazy[d] = None
    return State(head, entries, ctx, eager, list(lazy))


async def _value_pieces_anywhere(page: Page, root: bytes) -> list[bytes]:
    """A value's pieces in byte order, fetched if this device never read it."""
    out: list[bytes] = []
    stack = [root]
    while stack:
        d = stack.pop()
        if dg.is_inline(d):
            continue
        out.append(d)
        if dg.is_index(d):
            children = split.decode_index(await page.objects.get_piece(d))
            stack.extend(reversed([c.digest for c in children]))
    return out


# -- small accessors ---------------------------------------------------------------------


async def sync_value(page: Page, name: str) -> bytes | None:
    rows = await page.db.read_all("SELECT value FROM sync_metadata WHERE name = ?", (name,))
    return bytes(rows[0][0]) if rows else None


async def set_sync_value(page: Page, name: str, value: bytes) -> None:
    await page.db.run(
        lambda conn: metadata.set_sync_values(conn, [(name, value)]),
        write=True,
    )


def waiting_seqs(raw: bytes | None) -> list[int]:
    """The packs of one device whose value pieces wait for their entries: the value of
    its ``PIECES_WAITING`` row (their sequence numbers, ascending, space-separated;
    ``0`` for none), parsed. One that cannot be read counts as a wait on the first
    pack, so garbage collection keeps the pieces until the row is written again."""
    if not raw:
        return []
    try:
        return sorted({n for n in map(int, raw.split()) if n > 0})
    except ValueError:
        return [1]


def waiting_value(seqs: Sequence[int]) -> bytes:
    """The ``PIECES_WAITING`` row's value for these sequence numbers (``0``: none)."""
    return b" ".join(str(n).encode() for n in sorted(set(seqs))) or b"0"


async def sync_values(page: Page, prefix: str) -> list[tuple[str, bytes]]:
    """The page's sync metadata rows whose names start with ``prefix``."""
    rows = await page.db.read_all(
        "SELECT name, value FROM sync_metadata WHERE substr(name, 1, ?) = ?", (len(prefix), prefix)
    )
    return [(str(n), bytes(v)) for n, v in rows]


async def piece_sizes(page: Page, digests: list[bytes]) -> dict[bytes, int]:
    """Length of each stored piece, without reading its bytes."""
    rows = await page.db.read_in(
        "SELECT digest, length(data) FROM objects WHERE digest IN ({marks})", digests
    )
    return {bytes(d): int(n) for d, n in rows}


async def read_pieces(page: Page, digests: list[bytes]) -> dict[bytes, bytes]:
    return await page.objects.get_pieces(digests)


async def remote_locations(page: Page, digests: list[bytes]) -> dict[bytes, str]:
    """Where the cloud holds pieces that are not stored here (LAZY values)."""
    rows = await page.db.read_in(
        "SELECT digest, location FROM remote_pieces WHERE digest IN ({marks})", digests
    )
    return {bytes(d): str(loc) for d, loc in rows}


def index_children(data: bytes) -> list[bytes]:
    """The digests an index piece lists (its value's next level), for prefetching."""
    return [c.digest for c in split.decode_index(data)]


format_time = dots.format_time


def context(page: Page) -> dots.Context:
    """The page's context: per writer tag, the clock time of its writes it has seen."""
    return dict(page.graph.ctx)


def describe_page(page: Page) -> str:
    return f"page {named(page.id)} of ledger {named(page.ledger)}"
