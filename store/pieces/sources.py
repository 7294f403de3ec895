"""What a value is written from, and checking pieces against their digests.

This module owns :data:`Source` (what a value may be written from: bytes, a file, a
stream of chunks), re-blocking a source for the splitter (:func:`blocks`),
:class:`ValueRef` (a stored value's root and size), and :func:`mismatched`, the check of
received pieces against their digests (on a thread when they are many or large).
:mod:`store.pieces.objects` stores and reads the pieces."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiofiles

from ledgerd.store.pieces import digest as dg
from ledgerd.store.sqlite.threads import OFF_LOOP_BYTES, off_loop

BLOCK_SIZE = 4 * 1024 * 1024
"""Bytes read from a source and split per worker-thread hop."""


Source = bytes | bytearray | memoryview | AsyncIterable[bytes] | Path


@dataclass(frozen=True, slots=True)
class ValueRef:
    """A stored value: its root digest and size in bytes."""

    digest: bytes
    size: int


async def blocks(source: Source, block_size: int = BLOCK_SIZE) -> AsyncIterator[bytes]:
    """Re-block any source into blocks of about ``block_size`` bytes."""
    if isinstance(source, bytes | bytearray | memoryview):
        mv = memoryview(source)
        for i in range(0, len(mv), block_size):
            yield bytes(mv[i : i + block_size])
        return
    if isinstance(source, Path):
        async with aiofiles.open(source, "rb") as f:
            while block := await f.read(block_size):
                yield block
        return
    pending: list[bytes] = []
    size = 0
    async for part in source:
        if not isinstance(part, bytes | bytearray | memoryview):
            raise TypeError(f"value stream yielded {type(part).__name__}, expected bytes")
        pending.append(bytes(part))
        size += len(part)
        if size >= block_size:
            yield b"".join(pending)
            pending, size = [], 0
    if pending:
        yield b"".join(pending)


async def mismatched(pieces: dict[bytes, bytes], *, most_inline: int | None = None) -> list[bytes]:
    """The digests of ``pieces`` that their content does not match. Hashed on a thread
    when they hold ``OFF_LOOP_BYTES`` bytes or more, or number more than ``most_inline``."""

    def check() -> list[bytes]:
        return [d for d, v in pieces.items() if not dg.verify(d, v)]

    many = most_inline is not None and len(pieces) > most_inline
    return await off_loop(many or sum(map(len, pieces.values())) >= OFF_LOOP_BYTES, check)
