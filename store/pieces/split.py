"""Content-defined splitting of large objects into pieces.

This module owns how bytes become pieces: FastCDC chunk boundaries, the index
tree over the chunks, and the index encoding. It does no I/O: callers feed it
bytes and store the pieces it returns (see :mod:`store.pieces.objects`).

Chunks
    FastCDC (the compiled ``pyfastcdc``) with a 16 KiB target, 4 KiB minimum and
    64 KiB maximum. The last chunk of an object may be shorter than 4 KiB.

Index tree
    Chunk digests are grouped into index pieces. Whether a node ends after a
    child is decided by that child's digest (see :func:`boundary_level`), so the
    boundaries are content-defined at every level, like a skip list: an edit in
    the middle of a large value changes only the chunks around it and the index
    pieces on the path from them to the root.

These parameters are part of the on-disk and on-the-wire format: changing any of
them moves chunk boundaries and silently breaks dedup against every existing
repository. ``tests/store/test_split.py`` pins them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import msgpack
import xxhash
from pyfastcdc import FastCDC

from ledgerd.store.errors import CorruptObjectError
from ledgerd.store.pieces import digest as dg

MIN_CHUNK = 4 * 1024
AVG_CHUNK = 16 * 1024
MAX_CHUNK = 64 * 1024

FANOUT_BITS = 6
"""An index node ends after a child with probability 2**-FANOUT_BITS (~64 children)."""

MAX_FANOUT = 1024
"""A node is closed by force at this many children (bounds index piece size to ~40 KiB)."""

MAX_LEVEL = 8

_BLOCK = 1024 * 1024
"""Bytes accumulated before cutting; cuts are only accepted when MAX_CHUNK bytes follow."""

_cdc = FastCDC(AVG_CHUNK, min_size=MIN_CHUNK, max_size=MAX_CHUNK, normalized_chunking=1, seed=0)


class Piece(NamedTuple):
    """One storable piece: a chunk or an index. ``data`` is its exact content.

    A tuple, so that making one per small value stays cheap.
    """

    digest: bytes
    data: bytes


@dataclass(frozen=True, slots=True)
class Child:
    """One entry of an index piece: a child digest and the bytes it covers."""

    digest: bytes
    size: int


def zero_groups(h: int, bits: int, cap: int) -> int:
    """How many low groups of ``bits`` bits of ``h`` are all zero (at most ``cap``)."""
    level = 0
    mask = (1 << bits) - 1
    while level < cap and h & mask == 0:
        level += 1
        h >>= bits
    return level


def boundary_level(digest: bytes) -> int:
    """How many index levels end after the child named ``digest`` (0 = none)."""
    return zero_groups(xxhash.xxh64_intdigest(digest), FANOUT_BITS, MAX_LEVEL)


def encode_index(children: list[Child]) -> bytes:
    flat: list[bytes | int] = []
    for c in children:
        flat.append(c.digest)
        flat.append(c.size)
    return msgpack.packb(flat, use_bin_type=True)  # type: ignore[no-any-return]


def decode_index(data: bytes) -> list[Child]:
    """Parse an index piece; raises :class:`CorruptObjectError` on anything malformed."""
    try:
        flat = msgpack.unpackb(data, raw=False, use_list=True)
    except Exception as e:  # msgpack raises several unrelated types
        raise CorruptObjectError(f"undecodable index piece: {e}") from e
    if not isinstance(flat, list) or len(flat) % 2 or not flat:
        raise CorruptObjectError("index piece is not a non-empty list of (digest, size)")
    out = []
    for i in range(0, len(flat), 2):
        d, size = flat[i], flat[i + 1]
        if not isinstance(d, bytes) or not isinstance(size, int) or size < 0:
            raise CorruptObjectError("index piece has a malformed child")
        out.append(Child(dg.validate(d), size))
    return out


class _IndexBuilder:
    """Builds the index tree over a stream of children, bottom-up, level by level."""

    def __init__(self, kind: dg.Kind) -> None:
        self.kind = kind
        self.levels: list[list[Child]] = [[]]
        self.out: list[Piece] = []

    def _close(self, level: int) -> None:
        children = self.levels[level]
        self.levels[level] = []
        data = encode_index(children)
        piece = Piece(dg.index_digest(self.kind, data), data)
        self.out.append(piece)
        if level + 1 == len(self.levels):
            self.levels.append([])
        self.levels[level + 1].append(Child(piece.digest, sum(c.size for c in children)))
        if len(self.levels[level + 1]) >= MAX_FANOUT:
            self._close(level + 1)

    def add(self, child: Child) -> None:
        self.levels[0].append(child)
        cut = boundary_level(child.digest)
        for level in range(cut):
            if level >= len(self.levels) or not self.levels[level]:
                break
            self._close(level)
        if len(self.levels[0]) >= MAX_FANOUT:
            self._close(0)

    def finish(self) -> Child:
        level = 0
        while True:
            higher = any(self.levels[level + 1 :])
            here = self.levels[level]
            if not higher:
                if not here:
                    return Child(dg.chunk_digest(self.kind, b""), 0)
                if len(here) == 1:
                    return here[0]
            if here:
                self._close(level)
            level += 1


class Splitter:
    """Incremental splitter: ``feed`` bytes, then ``finish`` for the root.

    Each call returns the pieces completed so far, in an order where every index
    piece follows the pieces it references. Inline chunks are not returned (they
    live inside their digest). Memory held is bounded by ~1 MiB plus the block
    most recently fed.
    """

    def __init__(self, kind: dg.Kind = dg.Kind.VALUE) -> None:
        self.kind = kind
        self._buf = bytearray()
        self._index = _IndexBuilder(kind)
        self._size = 0

    def _cut(self, final: bool) -> list[Piece]:
        out: list[Piece] = []
        buf = self._buf
        end = len(buf)
        consumed = 0
        mv = memoryview(buf)
        chunks = _cdc.cut_buf(mv)
        c = None
        for c in chunks:
            if not final and end - c.offset < MAX_CHUNK:
                break  # the cut here could still move once more bytes arrive
            data = bytes(c.data)
            d = dg.chunk_digest(self.kind, data)
            if not dg.is_inline(d):
                out.append(Piece(d, data))
            self._index.add(Child(d, len(data)))
            consumed = c.offset + c.length
        del chunks, c  # the chunker and the chunks' views pin the buffer
        mv.release()
        del buf[:consumed]
        out.extend(self._index.out)
        self._index.out = []
        return out

    def feed(self, data: bytes | bytearray | memoryview) -> list[Piece]:
        self._buf += data
        self._size += len(data)
        if len(self._buf) < _BLOCK + MAX_CHUNK:
            return []
        return self._cut(final=False)

    def finish(self) -> tuple[list[Piece], Child]:
        """Flush the tail; returns the remaining pieces and the root (digest, size)."""
        pieces = self._cut(final=True) if self._buf else []
        root = self._index.finish()
        pieces.extend(self._index.out)
        self._index.out = []
        assert root.size == self._size
        return pieces, root


def split_bytes(data: bytes, kind: dg.Kind = dg.Kind.VALUE) -> tuple[list[Piece], Child]:
    """Split an in-memory object in one go (small values and tree nodes)."""
    if len(data) <= MIN_CHUNK:  # FastCDC never cuts below its minimum: one chunk
        d = dg.chunk_digest(kind, data)
        return ([] if dg.is_inline(d) else [Piece(d, bytes(data))]), Child(d, len(data))
    s = Splitter(kind)
    pieces = s.feed(data)
    more, root = s.finish()
    pieces.extend(more)
    return pieces, root
