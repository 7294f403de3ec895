"""What the Python clients send as a value or an attachment: :data:`Content` and :func:`sending`.

This module owns turning what a caller gives into a request body, the same way for both
clients (the blocking one is the async one through a bridge): bytes as they are, a
``str`` as its UTF-8, a file streamed from disk, chunks from an iterable (each ``next``
on a worker thread) or an async iterable, anything else refused with a TypeError
before a request is made. It also keeps an error raised while reading the content
apart from the connection's: aiohttp reports both as a failed connection. It does not
make the request: :mod:`ledgerd.daemon.client_async` and
:mod:`ledgerd.daemon.client_docs` do.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Iterable
from pathlib import Path
from typing import BinaryIO

from ledgerd.daemon.client_types import CHUNK, DaemonUnavailableError, Progress

Content = bytes | bytearray | memoryview | str | Path | Iterable[bytes] | AsyncIterable[bytes]
"""A value to send: bytes (a ``str`` as UTF-8), a file's contents, or chunks of bytes
from an iterable (read on a worker thread) or an async iterable."""

_BYTES = (bytes, bytearray, memoryview)


class Body:
    """One request's body: ``data`` for aiohttp, ``length`` when known beforehand (a
    file's), and ``failed``, what reading the content raised (a chunk that is not
    bytes, a failing iterator or file)."""

    def __init__(self, content: Content, progress: Progress | None = None) -> None:
        self.length: int | None = None
        self.failed: Exception | None = None
        self.stream: AsyncGenerator[bytes, None] | None = None
        self.data: bytes | io.BytesIO | AsyncGenerator[bytes, None]
        if isinstance(content, str):
            content = content.encode()
        if isinstance(content, _BYTES):
            value = bytes(content)
            self.data = io.BytesIO(value) if len(value) > CHUNK else value
            return
        if isinstance(content, Path):
            self.length = content.stat().st_size
        elif not _iterable(content):  # (a caller that is not type checked)
            raise TypeError(
                "a value must be bytes, str, a Path or an iterable of bytes, "
                f"not {type(content).__name__}"
            )
        self.data = self.stream = self._read(content, progress)

    async def _read(
        self, content: Path | Iterable[bytes] | AsyncIterable[bytes], progress: Progress | None
    ) -> AsyncGenerator[bytes, None]:
        try:
            if isinstance(content, Path):
                done = 0
                with content.open("rb") as f:  # closed however it ends (see file_reads)
                    async for chunk in file_reads(f):
                        done += len(chunk)
                        if progress:
                            progress(done, self.length)
                        yield chunk
                return
            chunks = content if isinstance(content, AsyncIterable) else pull(content)
            async for chunk in chunks:
                if not _is_bytes(chunk):
                    raise TypeError(f"a chunk must be bytes, not {type(chunk).__name__}")
                yield chunk
        except Exception as e:
            self.failed = e
            raise


def _iterable(x: object) -> bool:
    return isinstance(x, Iterable | AsyncIterable)


def _is_bytes(x: object) -> bool:
    return isinstance(x, _BYTES)


@contextlib.asynccontextmanager
async def sending(content: Content, progress: Progress | None = None) -> AsyncIterator[Body]:
    """The :class:`Body` of one request, for its duration: when reading the content
    failed, that error is raised instead of the :class:`DaemonUnavailableError` that
    aiohttp's report of it became; the stream is closed at the end."""
    body = Body(content, progress)
    try:
        yield body
    except DaemonUnavailableError:
        if body.failed is None:
            raise
        raise body.failed from None
    finally:
        if body.stream is not None:
            await close_body(body.stream)


async def close_body(body: AsyncGenerator[bytes, None]) -> None:
    """Close a request body's generator (its file closed now, not when collected).

    The daemon can answer a small upload while aiohttp's writer is still inside the
    generator, reading on after the last chunk to find the file's end; the answer
    cancels that writer, which leaves the generator within a step or two, and only
    then can it be closed (``aclose`` of a running generator is a RuntimeError)."""
    while getattr(body, "ag_running", False):  # (not in the AsyncGenerator protocol)
        await asyncio.sleep(0.001)
    await body.aclose()


async def file_reads(f: BinaryIO) -> AsyncIterator[bytes]:
    """An open file's chunks, each read on a worker thread. The caller opens and closes
    the file: aiofiles closes on a worker thread too, a step that a cancellation (the
    daemon's answer cancels aiohttp's writer) can skip, leaving the file open."""
    while chunk := await asyncio.to_thread(f.read, CHUNK):
        yield chunk


async def pull(chunks: Iterable[bytes]) -> AsyncIterator[bytes]:
    """A blocking iterable of chunks as an async one (each ``next`` on a worker thread)."""
    it = iter(chunks)
    while (chunk := await asyncio.to_thread(next, it, None)) is not None:
        yield chunk
