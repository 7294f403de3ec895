"""What a page takes from sync: deltas and whole states of other devices, verified.

This module owns checking what arrives (entries, digests, dots, the pieces against their
digests), whether a delta is causally ready (:func:`readiness`), joining a delta or a
checkpoint's state into the page in one import commit with the pieces that came, and
emptying a page to rebuild it from the bucket. Reading what to upload is
:mod:`store.page.outgoing`'s; sync reaches both through :mod:`store.page.exchange`.
The design is ``docs/convergence.md``.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Mapping, Sequence

from ledgerd.store.errors import CorruptObjectError, InvalidDigestError, StoreError
from ledgerd.store.page import deleted, gc
from ledgerd.store.page.outgoing import uploaded_upto
from ledgerd.store.page.page import Page
from ledgerd.store.page.view import KEY_LIMIT
from ledgerd.store.pieces import digest as dg
from ledgerd.store.pieces import split
from ledgerd.store.pieces.objects import mismatched
from ledgerd.store.sqlite import metadata, piece_rows, sql
from ledgerd.store.sqlite.schema import SYNCED, UPLOADED_AT_ROW, UPLOADED_ROW
from ledgerd.store.tree import btree, dots, join
from ledgerd.store.tree.btree import RawEntry, Version
from ledgerd.store.tree.builder import Builder
from ledgerd.store.tree.commit import Commit, child

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


# -- checking what arrives -----------------------------------------------------------------


async def check_entries(raw: object) -> list[RawEntry]:
    """The entries of a delta or a state as received (msgpack arrays), checked: keys
    strictly increasing, each a key a write can make (or the deleted-page mark); values
    are value digests; priorities 0 or 1; dots well formed; siblings as a tree holds
    them. CorruptObjectError otherwise. The event loop gets a turn every
    :data:`~store.tree.join.TURN_KEYS` entries (a first sync brings every key)."""
    if not isinstance(raw, list | tuple):
        raise CorruptObjectError("entries are an array")
    out: list[RawEntry] = []
    last: bytes | None = None
    async for part in join.in_turns(raw, join.TURN_KEYS):
        last = _check_run(part, last, out)
    return out


def _check_run(raw: Sequence[object], last: bytes | None, out: list[RawEntry]) -> bytes | None:
    """Check ``raw``'s entries (following one keyed ``last``) into ``out``; the last key."""
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
    return last


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
    # The join's entries are plain tuples already (RawEntry): no conversion per entry.
    root = await builder.apply_raw(head.root, dict(changes)) if changes else head.root
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
    wanted = await _new_values(page, head, changes)
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


async def _new_values(
    page: Page, head: Commit, changes: Sequence[tuple[bytes, RawEntry | None]]
) -> set[bytes]:
    """The value digests (not inline) of the versions ``changes`` keep that ``head``'s
    entries do not hold."""
    wanted: set[bytes] = set()
    for i, (key, e) in enumerate(changes):
        if i % join.TURN_KEYS == join.TURN_KEYS - 1:
            await asyncio.sleep(0)  # a first sync's join keeps every key: let others in
        if e is None:
            continue
        old = await btree.lookup(page.nodes, head.root, key) if head.root else None
        had = {v[2] for v in dots.versions(old)}
        for v in dots.versions(e):
            if v[2] not in had and not dg.is_inline(v[0]):
                wanted.add(v[0])
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


async def remote_locations(page: Page, digests: list[bytes]) -> dict[bytes, str]:
    """Where the cloud holds pieces that are not stored here (LAZY values)."""
    rows = await page.db.read_in(
        "SELECT digest, location FROM remote_pieces WHERE digest IN ({marks})", digests
    )
    return {bytes(d): str(loc) for d, loc in rows}


def index_children(data: bytes) -> list[bytes]:
    """The digests an index piece lists (its value's next level), for prefetching."""
    return [c.digest for c in split.decode_index(data)]
