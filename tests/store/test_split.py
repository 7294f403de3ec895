"""Chunking and the index tree: determinism, pinned boundaries, edit locality."""

from __future__ import annotations

import hashlib
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from ledgerd.store.pieces import digest as dg
from ledgerd.store.pieces import split


def _random_bytes(seed: int, n: int) -> bytes:
    return random.Random(seed).randbytes(n)


def _cut_points(data: bytes) -> list[int]:
    points, pos = [], 0
    for c in split._cdc.cut_buf(data):
        pos += c.length
        points.append(pos)
    return points


def test_chunk_boundaries_are_pinned() -> None:
    """A change here moves every chunk boundary and breaks dedup with existing data."""
    data = _random_bytes(20261122, 8 * 1024 * 1024)
    points = _cut_points(data)
    sizes = [b - a for a, b in zip([0, *points[:-1]], points, strict=True)]
    assert all(split.MIN_CHUNK <= n <= split.MAX_CHUNK for n in sizes[:-1])
    fingerprint = hashlib.sha256(",".join(map(str, points)).encode()).hexdigest()
    assert (len(points), fingerprint[:16]) == PINNED_CUTS
    _, root = split.split_bytes(data)
    assert root.digest.hex()[:18] == PINNED_ROOT


PINNED_CUTS = (429, "ebe014bd7ca55126")
PINNED_ROOT = "02241cb7a27d8d730d"


def test_streamed_split_equals_one_shot() -> None:
    data = _random_bytes(1, 5 * 1024 * 1024 + 12345)
    pieces, root = split.split_bytes(data)
    s = split.Splitter()
    streamed: list[split.Piece] = []
    rng = random.Random(2)
    pos = 0
    while pos < len(data):
        n = rng.randint(1, 300_000)
        streamed += s.feed(data[pos : pos + n])
        pos += n
    tail, root2 = s.finish()
    streamed += tail
    assert root2 == root
    assert sorted(p.digest for p in streamed) == sorted(p.digest for p in pieces)


@settings(max_examples=30, deadline=None)
@given(st.binary(max_size=200_000), st.integers(0, 2**32))
def test_chunks_reassemble(data: bytes, seed: int) -> None:
    pieces, root = split.split_bytes(data)
    store = {p.digest: p.data for p in pieces}

    def expand(d: bytes) -> bytes:
        if dg.is_inline(d):
            return dg.inline_content(d)
        content = store[d]
        assert dg.verify(d, content)
        if dg.is_index(d):
            return b"".join(expand(c.digest) for c in split.decode_index(content))
        return content

    assert root.size == len(data)
    assert expand(root.digest) == data


def test_index_pieces_follow_their_children() -> None:
    pieces, root = split.split_bytes(_random_bytes(3, 6 * 1024 * 1024))
    seen: set[bytes] = set()
    for p in pieces:
        if dg.is_index(p.digest):
            for c in split.decode_index(p.data):
                assert dg.is_inline(c.digest) or c.digest in seen
        seen.add(p.digest)
    assert pieces[-1].digest == root.digest
