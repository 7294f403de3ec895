"""Turning the changes of a write into entries and pieces, before they are committed.

This module owns the one path by which a value (bytes, an async iterator of
bytes, or a file) becomes a tree entry: split in memory when small (its pieces
travel with the write), staged in SQLite as transient pieces under a token when
large or streamed. Plain writes (:mod:`store.writer`) and transactions
(:mod:`store.transaction`) both use it; neither splits values by itself.

It also owns what a delete becomes at commit (:func:`with_tombstones`): the entry
is removed when the base has the key, and a tombstone is kept when it does not,
so that under last-one-wins a later delete of a key another device created
concurrently wins like a later put would (a removal of nothing would leave no
trace for the merge to weigh).
In a page deleted since it was last cleared, a delete of a key it does not hold
keeps no tombstone (it would list the deleted page again): there, as against the
page's delete itself, a key another device created concurrently survives.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
from collections.abc import AsyncIterable, Iterable, Mapping
from pathlib import Path

from ledgerd.store import btree, deleted, split
from ledgerd.store import digest as dg
from ledgerd.store.btree import Entry, NodeStore, Priority
from ledgerd.store.errors import InvalidArgumentError
from ledgerd.store.objects import ObjectStore, Source

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
    :meth:`store.transaction.Transaction.put_many` writes these lines out in its loop."""
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


async def with_tombstones(
    nodes: NodeStore,
    base_root: bytes,
    changes: Mapping[bytes, Entry | None] | Iterable[tuple[bytes, Entry | None]],
) -> list[tuple[bytes, Entry | None]]:
    """``changes`` to apply on ``base_root``, with each delete of a key the base does
    not have (or has as a tombstone already) made a tombstone entry; except in a page
    deleted since it was last cleared (the base holds :data:`store.deleted.MARK`): a
    tombstone there would be a key next to the mark, and the page, empty to every
    read, would be listed again (the delete of a key the page does not hold would
    bring a deleted page back). Given as a mapping with no delete (a bulk write), the
    changes come back as they are, with no lookup."""
    if isinstance(changes, Mapping):
        if None not in changes.values():
            return list(changes.items())  # no delete (a bulk write): nothing to look up
        changes = changes.items()
    out: list[tuple[bytes, Entry | None]] = []
    marked: bool | None = None  # the base holds the mark: asked once, when it matters
    for key, e in changes:
        if e is None:
            old = await btree.lookup(nodes, base_root, key)
            if old is None or old.value == dg.TOMBSTONE:
                if marked is None:
                    marked = await btree.lookup(nodes, base_root, deleted.MARK) is not None
                if not marked:
                    e = btree.new_entry((key, dg.TOMBSTONE, Priority.EAGER))
        out.append((key, e))
    return out
