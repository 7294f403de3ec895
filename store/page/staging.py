"""Turning the changes of a write into entries and pieces, before they are committed.

This module owns the one path by which a value (bytes, an async iterator of
bytes, or a file) becomes a tree entry: split in memory when small (its pieces
travel with the write), staged in SQLite as transient pieces under a token when
large or streamed. Plain writes (:mod:`store.page.writer`) and transactions
(:mod:`store.page.transaction`) both use it; neither splits values by itself.

It also owns what a write becomes at commit (:func:`stamped`): its entries with the
write's dot, a delete as a tombstone, a clear as a tombstone over every key it saw.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
from collections.abc import AsyncIterable, Iterable, Mapping
from pathlib import Path

from ledgerd.store.errors import InvalidArgumentError
from ledgerd.store.page import deleted
from ledgerd.store.pieces import digest as dg
from ledgerd.store.pieces import split
from ledgerd.store.pieces.objects import ObjectStore, Source
from ledgerd.store.tree import btree
from ledgerd.store.tree.btree import Entry, NodeStore, Priority, RawEntry

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


def one_chunk(key: bytes, value: bytes, prio: object) -> tuple[Entry, split.Piece | None]:
    """Entry and piece of a value that is a single chunk (at most ``split.MIN_CHUNK``
    bytes); no piece when the value is inline in its digest. The fast path of
    :func:`prepare`: both give the same entry for the same value.
    :meth:`store.page.transaction.Transaction.put_many` writes these lines out in its loop."""
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


async def discard(objects: ObjectStore, tokens: Iterable[str]) -> None:
    """Drop staged values (each drop completes even if the caller is cancelled)."""
    for t in tokens:
        await asyncio.shield(objects.discard(t))


async def only_live(
    objects: ObjectStore,
    live: set[bytes],
    pieces_of: dict[bytes, list[split.Piece]],
    staged: dict[str, bytes],
) -> tuple[list[split.Piece], list[str]]:
    """The pieces (held in memory) and staged tokens of the values in ``live``,
    by value root digest; staged values not in it are discarded."""
    pieces = list(
        itertools.chain.from_iterable(map(pieces_of.__getitem__, pieces_of.keys() & live))
    )
    await discard(objects, [t for t, root in staged.items() if root not in live])
    return pieces, [t for t, root in staged.items() if root in live]


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
    items = changes.items() if isinstance(changes, Mapping) else changes
    tomb = dg.TOMBSTONE
    out.extend(
        (key, (key, tomb, 0, dot) if e is None else (key, e[1], int(e[2]), dot)) for key, e in items
    )
    return out
