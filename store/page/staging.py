"""Turning the changes of a write into entries and pieces, before they are committed.

This module owns the one path by which a value (bytes, an async iterator of
bytes, or a file) becomes a tree entry: split in memory when small (its pieces
travel with the write), staged in SQLite as transient pieces under a token when
large or streamed. Plain writes (:mod:`store.page.writer`) and transactions
(:mod:`store.page.transaction`) both use it; neither splits values by itself.

It also owns what a write becomes at commit (:func:`stamped`): its entries with the
write's dot, a delete as a tombstone, a clear as a tombstone over every key it saw; and
the one path by which a staged batch becomes a commit (:func:`commit_staged`), which the
implicit journal, a large plain write and a transaction all take.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
from collections.abc import AsyncIterable, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from ledgerd.store.errors import InvalidArgumentError
from ledgerd.store.page import deleted
from ledgerd.store.page.graph import CommitGraph, Work
from ledgerd.store.page.stamps import StampedKey, StampedValue, VersionstampError
from ledgerd.store.page.view import KEY_LIMIT, check_key
from ledgerd.store.pieces import digest as dg
from ledgerd.store.pieces import split
from ledgerd.store.pieces.objects import ObjectStore, Source
from ledgerd.store.sqlite.threads import OFF_LOOP_BYTES
from ledgerd.store.tree import btree, commit
from ledgerd.store.tree.btree import Entry, NodeStore, Priority, RawEntry
from ledgerd.store.tree.builder import SLICE_ENTRIES, Builder
from ledgerd.store.tree.commit import Commit

SMALL_VALUE = 256 * 1024
"""Values given as bytes up to this size are split in memory and written with their
journal entry in one transaction; larger ones and streams are staged first."""

_THREAD_SPLIT = 65536
"""Values larger than this are split on a worker thread."""

_PRIORITY = {
    Priority.EAGER: Priority.EAGER,
    Priority.LAZY: Priority.LAZY,
    0: Priority.EAGER,
    1: Priority.LAZY,
}


def priority(p: object) -> Priority:
    """``p`` as a Priority (EAGER or LAZY, or 0 or 1); anything else is refused."""
    try:
        return _PRIORITY[p]  # type: ignore[index]
    except (KeyError, TypeError):
        raise InvalidArgumentError(f"a priority is EAGER (0) or LAZY (1), not {p!r}") from None


# Made without the named tuple's Python-level __new__ (a batch makes one per value).
new_piece = functools.partial(tuple.__new__, split.Piece)

_NO_PRIORITY = object()
_ENTRY_BYTES = 64
"""What staging an entry counts for besides its value's bytes, towards the
``OFF_LOOP_BYTES`` a write stages on the loop between its turns."""


def one_chunk(key: bytes, value: bytes, prio: object) -> tuple[Entry, split.Piece | None]:
    """Entry and piece of a value that is a single chunk (at most ``split.MIN_CHUNK``
    bytes); no piece when the value is inline in its digest. The fast path of
    :func:`prepare`: both give the same entry for the same value.
    :meth:`store.page.transaction.Transaction.put_many` and :func:`stage_changes` write
    these lines out in their loops (tests/store/test_staging.py and
    tests/store/test_batch_slices.py hold each to it)."""
    d = dg.value_chunk_digest(value)
    piece = new_piece((d, value)) if len(value) > dg.INLINE_LIMIT else None
    return btree.new_entry((key, d, priority(prio))), piece


async def prepare(
    objects: ObjectStore, key: bytes, value: Source, prio: object
) -> tuple[Entry, list[split.Piece], str | None]:
    """Split a value: in memory if small (pieces returned), else staged (token returned)."""
    if isinstance(value, bytes | bytearray | memoryview) and len(value) <= SMALL_VALUE:
        if len(value) > _THREAD_SPLIT:
            pieces, root = await asyncio.to_thread(split.split_bytes, bytes(value))
        else:
            pieces, root = split.split_bytes(bytes(value))
        return Entry(key, root.digest, priority(prio)), pieces, None
    if isinstance(value, bytes | bytearray | memoryview | Path | AsyncIterable):
        p = priority(prio)
        token, ref = await objects.stage_value(value)
        return Entry(key, ref.digest, p), [], token
    raise InvalidArgumentError(
        f"a value is bytes, an async iterator of bytes or a Path, not {type(value).__name__}"
    )


Change = (
    tuple[bytes | StampedKey, Source | StampedValue | None]
    | tuple[bytes | StampedKey, Source | StampedValue | None, Priority]
)


@dataclass(frozen=True, slots=True)
class StampSlot:
    """A change of a write that is completed when the write is stamped."""

    index: int  # in the write's changes
    template: StampedKey | StampedValue
    priority: Priority


async def stage_changes(
    objects: ObjectStore, changes: Iterable[Change], prio: Priority
) -> tuple[
    list[tuple[bytes, Entry | None]],
    list[StampSlot],
    dict[bytes, list[split.Piece]],
    dict[str, bytes],
]:
    """A write's changes as entries (a stamped one as a placeholder: :class:`StampSlot`),
    the pieces of its values held in memory (by value root digest) and the tokens of
    those staged (token -> value root digest); on an error, those staged are dropped."""
    prepared: list[tuple[bytes, Entry | None]] = []
    stamps: list[StampSlot] = []
    pieces_of: dict[bytes, list[split.Piece]] = {}  # value root digest -> its pieces
    staged: dict[str, bytes] = {}  # token -> its value's root digest
    small, inline_limit = split.MIN_CHUNK, dg.INLINE_LIMIT
    digest_of, entry_of = dg.value_chunk_digest, btree.new_entry
    seen: object = _NO_PRIORITY  # the last priority given, and what it is
    level = Priority.EAGER
    taken = 0  # bytes split and hashed (and entries made) on the loop since it yielded
    try:
        for change in changes:
            if taken > OFF_LOOP_BYTES:  # a big write lets other requests in
                await asyncio.sleep(0)
                taken = 0
            key, value = change[0], change[1]
            p = change[2] if len(change) == 3 else prio
            if type(key) is not bytes or len(key) > KEY_LIMIT:
                key = _key_of(key, value, p, stamps, len(prepared))
            if type(value) is bytes and len(value) <= small:  # the common case
                # (:func:`one_chunk` written out: a batch makes one per value)
                if p is not seen:  # a write's changes mostly share one priority
                    level, seen = priority(p), p
                d = digest_of(value)
                if len(value) > inline_limit:
                    pieces_of[d] = [new_piece((d, value))]
                prepared.append((key, entry_of((key, d, level))))
                taken += len(value) + _ENTRY_BYTES
                continue
            if isinstance(value, StampedValue):
                stamps.append(StampSlot(len(prepared), value, priority(p)))
                prepared.append((key, None))  # its entry is made when it is stamped
                continue
            if value is None:
                prepared.append((key, None))
                taken += _ENTRY_BYTES
                continue
            if type(value) is bytes:
                taken += len(value)
            entry, more, token = await prepare(objects, key, value, p)
            if more:
                pieces_of[entry.value] = more
            if token is not None:
                staged[token] = entry.value
            prepared.append((key, entry))
    except BaseException:
        await discard(objects, staged)
        raise
    return prepared, stamps, pieces_of, staged


def _key_of(
    key: bytes | StampedKey,
    value: Source | StampedValue | None,
    p: object,
    stamps: list[StampSlot],
    index: int,
) -> bytes:
    """The key a change is stored under, when it is not a plain key of at most
    ``KEY_LIMIT`` bytes: a versionstamped key's template (its stamp listed in
    ``stamps`` at the change's ``index``), else the key checked (and refused)."""
    if not isinstance(key, StampedKey):
        return check_key(key)
    if isinstance(value, StampedValue):
        raise VersionstampError("a change stamps its key or its value, not both")
    if value is None:
        raise VersionstampError("a versionstamped key needs a value")
    # Stored under its template until the write is stamped.
    stamps.append(StampSlot(index, key, priority(p)))
    return key.template


async def discard(objects: ObjectStore, tokens: Iterable[str]) -> None:
    """Drop staged values (each drop completes even if the caller is cancelled)."""
    for t in tokens:
        await asyncio.shield(objects.discard(t))


async def only_live(
    objects: ObjectStore,
    live: set[bytes] | None,
    pieces_of: dict[bytes, list[split.Piece]],
    staged: dict[str, bytes],
) -> tuple[list[split.Piece], list[str]]:
    """The pieces (held in memory) and staged tokens of the values in ``live``,
    by value root digest (None: every value is live); staged values not in it are
    discarded."""
    if live is None:
        return list(itertools.chain.from_iterable(pieces_of.values())), list(staged)
    pieces = list(
        itertools.chain.from_iterable(map(pieces_of.__getitem__, pieces_of.keys() & live))
    )
    await discard(objects, [t for t, root in staged.items() if root not in live])
    return pieces, [t for t, root in staged.items() if root in live]


RELEASE_SLICE = 16384
"""Objects :func:`released` frees between turns of the event loop."""


async def released(*held: list[Any] | dict[Any, Any]) -> None:
    """Empty ``held`` (a big write's changes and pieces, once committed) a slice at a
    time, the event loop given a turn between slices: the 250,000 changes of a 55 MB
    batch are about two million objects, and freeing them in one go when the write
    returned held the loop for 75 ms."""
    for each in held:
        while len(each) > RELEASE_SLICE:
            if isinstance(each, list):
                del each[-RELEASE_SLICE:]
            else:
                for _ in range(RELEASE_SLICE):
                    each.popitem()
            await asyncio.sleep(0)
        each.clear()


async def stamped(
    nodes: NodeStore,
    base_root: bytes,
    changes: Mapping[bytes, Entry | None] | Iterable[tuple[bytes, Entry | None]],
    dot: bytes,
    *,
    cleared: bool = False,
) -> list[tuple[bytes, RawEntry | None]]:
    """A local write's changes as the entries it puts on ``base_root``, each with the
    write's ``dot``: a put as its value, a delete as a tombstone (a delete must beat an
    older concurrent put of the key, even one this device never saw). ``cleared``: the
    write starts with a clear, which writes a tombstone over every key of the base that
    holds anything but one (the keys it saw; keys created elsewhere concurrently stay),
    and drops a deleted page's mark (:mod:`store.page.deleted`)."""
    out: list[tuple[bytes, RawEntry | None]] = []
    if cleared:
        async for run in btree.runs(nodes, base_root):
            for e in run:
                if e[0] == deleted.MARK:
                    out.append((e[0], None))
                elif e[1] != dg.TOMBSTONE or len(e) > 4:
                    out.append((e[0], (e[0], dg.TOMBSTONE, 0, dot)))
    items = iter(changes.items() if isinstance(changes, Mapping) else changes)
    tomb = dg.TOMBSTONE
    while True:  # a slice at a time, the event loop given a turn between slices
        n = len(out)
        out.extend(
            (key, (key, tomb, 0, dot) if e is None else (key, e[1], int(e[2]), dot))
            for key, e in itertools.islice(items, SLICE_ENTRIES)
        )
        if len(out) - n < SLICE_ENTRIES:
            return out
        await asyncio.sleep(0)


Changes = list[tuple[bytes, RawEntry | None]]
"""A batch's changes as a commit applies them: key -> entry with its dot, or None."""


class Storing(NamedTuple):
    """What storing a batch's commit takes besides the commit and its nodes (see
    :meth:`store.page.graph.CommitGraph.store`)."""

    values: Sequence[split.Piece] = ()
    tokens: Sequence[str] = ()
    also: Work | None = None
    also_small: bool = True
    then: Callable[[], None] | None = None


async def commit_staged(
    graph: CommitGraph,
    nodes: NodeStore,
    entries: Mapping[bytes, Entry | None] | Iterable[tuple[bytes, Entry | None]],
    storing: Callable[[Commit], Awaitable[Storing]],
    *,
    cleared: bool = False,
    at: int | None = None,
    base: Commit | None = None,
    onto: Callable[[Builder, Commit, Changes], Awaitable[Changes]] | None = None,
) -> Commit | None:
    """Commit a staged batch on the head (commit lock held): its changes, made on
    ``base`` (None: the head), are stamped with the commit's dot (:func:`stamped`), moved
    onto the head by ``onto`` when the head is no longer ``base``, applied to the head's
    tree, and stored as a child of the head at a time no older than ``at``, with what
    ``storing(commit)`` gives. None, and nothing stored, when the batch changes nothing."""
    head = graph.head
    base = head if base is None else base
    ts = graph.next_time(at)
    builder = Builder(nodes)
    changes = await stamped(nodes, base.root, entries, graph.dot(ts), cleared=cleared)
    if head.id != base.id:
        if onto is None:
            raise ValueError("a batch made on an older commit needs a way onto the head")
        changes = await onto(builder, head, changes)
    root = await builder.apply_raw(head.root, dict(changes))
    if root == head.root:
        return None
    c = commit.child(head, root, ts)
    s = await storing(c)
    await graph.store(
        c,
        builder,
        values=s.values,
        tokens=s.tokens,
        also=s.also,
        also_small=s.also_small,
        then=s.then,
        ctx={**graph.ctx, graph.tag: c.timestamp},
        changed=changes,
    )
    return c
