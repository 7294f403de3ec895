"""``ledgerctl import``: lines in the ``ls --json`` / ``export`` format, written in batches.

A line is parsed whole up to :data:`LINE_LIMIT`; a longer one must have ``export``'s
layout (key, priority, then the value) and its value is decoded as it is read, never
held whole, and sent as a streamed PUT. Small values go in batches, halved while the
daemon finds one over its ``max_batch_bytes``.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import os
import re
import stat
from collections.abc import AsyncIterator
from typing import BinaryIO

from ledgerd.daemon.cli_format import UsageError
from ledgerd.daemon.cli_progress import Progress
from ledgerd.daemon.cli_stdio import blocking
from ledgerd.daemon.client import AsyncClient, LedgerError

LINE_LIMIT = 2 * 1024 * 1024
"""``import`` parses lines up to this size whole; longer ones are streamed (export's layout)."""
B64_IN = 3 * 64 * 1024
BATCH_ENTRIES = 10_000
BATCH_BYTES = 16 * 1024 * 1024
INLINE_VALUE = 1024 * 1024
"""Larger values are sent on their own, as a streamed PUT, not in a batch."""

Entry = tuple[bytes, bytes, str]
STREAMED_HEAD = re.compile(
    rb'\s*\{\s*"key"\s*:\s*"([A-Za-z0-9+/]*={0,2})"\s*,\s*"priority"\s*:\s*"(eager|lazy)"'
    rb'\s*,\s*"value"\s*:\s*"'
)


def parse_line(raw: bytes, n: int) -> tuple[bytes, bytes, str]:
    """Line ``n``: (key, value, priority), or UsageError naming the line."""
    try:
        doc = json.loads(raw.decode("utf-8"))
        key = base64.b64decode(doc["key"], validate=True)
        if doc["value"] is None:
            raise ValueError("the value is null ('ls --json' leaves out large values: use export)")
        value = base64.b64decode(doc["value"], validate=True)
        prio = doc.get("priority", "eager")
        if prio not in ("eager", "lazy"):
            raise ValueError(f"priority {prio!r}")
    except (ValueError, KeyError, TypeError, binascii.Error) as e:  # incl. bad UTF-8
        raise UsageError(f"line {n}: not an entry in the 'ls --json' format: {e}") from None
    return key, value, prio


class StreamedValue:
    """The base64 value of one long ``import`` line, decoded as it is read (bounded memory).

    ``error`` keeps what was wrong with the line: the upload it fed fails with
    whatever aiohttp makes of the exception, the caller reports this instead.
    """

    def __init__(self, first: bytes, src: BinaryIO, n: int) -> None:
        self.first, self.src, self.n = first, src, n
        self.error: UsageError | None = None
        self.read = len(first)
        """Bytes of input consumed so far (for progress)."""

    def _bad(self, why: str) -> UsageError:
        self.error = UsageError(f"line {self.n}: {why}")
        return self.error

    async def _readline(self, limit: int) -> bytes:
        data: bytes = await blocking.run(self.src.readline, limit)
        self.read += len(data)
        return data

    async def __aiter__(self) -> AsyncIterator[bytes]:
        pending = b""
        data = self.first
        while True:
            end = data.find(b'"')
            pending += data if end < 0 else data[:end]
            cut = len(pending) - len(pending) % 4
            if cut:
                try:
                    yield base64.b64decode(pending[:cut], validate=True)
                except binascii.Error as e:
                    raise self._bad(f"the value is not valid base64: {e}") from None
                pending = pending[cut:]
            if end >= 0:
                tail = data[end + 1 :]
                while not tail.endswith(b"\n") and len(tail) < 1024:
                    more = await self._readline(1024)
                    if not more:
                        break
                    tail += more
                if pending or tail.strip() != b"}":
                    raise self._bad("a long line must end with the value and '}'")
                return
            if data.endswith(b"\n"):
                raise self._bad("the line ends inside the value")
            data = await self._readline(B64_IN)
            if not data:
                raise self._bad("the input ends inside the value")


class Importer:
    """Writes the entries of one input into one page, in order."""

    def __init__(self, client: AsyncClient, ledger: bytes, page: bytes, src: BinaryIO) -> None:
        self.c, self.ledger, self.page, self.src = client, ledger, page, src
        self.batch_bytes = BATCH_BYTES
        """The batch size: smaller once the daemon found a batch too large."""
        self.written = 0
        self.read = 0
        """Bytes of input consumed (for progress)."""

    async def run(self, progress: Progress) -> int:
        """Import every line; the number of entries written."""
        src = self.src
        batch: list[Entry] = []
        size = n = 0
        total = file_size(src)
        while raw := src.readline(LINE_LIMIT):
            n += 1
            self.read += len(raw)
            if len(raw) == LINE_LIMIT and not raw.endswith(b"\n"):
                await self.send(batch)
                batch, size = [], 0
                await self.put_streamed(raw, n)
            elif raw.strip():
                key, value, prio = parse_line(raw, n)
                if len(value) > INLINE_VALUE:
                    await self.send(batch)
                    batch, size = [], 0
                    await self.send([(key, value, prio)])
                else:
                    batch.append((key, value, prio))
                    size += len(key) + len(value)
                    if len(batch) >= BATCH_ENTRIES or size >= self.batch_bytes:
                        await self.send(batch)
                        batch, size = [], 0
            progress.postfix = f"{self.written + len(batch)} entries"
            progress(self.read, total)
        await self.send(batch)
        return self.written

    async def send(self, batch: list[Entry]) -> None:
        """Write ``batch`` (in order): one batch request, split in halves while the daemon
        finds it over its ``max_batch_bytes``; a single entry that is goes as a PUT."""
        if not batch:
            return
        if len(batch) > 1 or len(batch[0][1]) <= INLINE_VALUE:
            try:
                self.written += await self.c.batch(self.ledger, self.page, batch)
                return
            except LedgerError as e:
                if e.code != "too_large":
                    raise
        if len(batch) == 1:
            key, value, prio = batch[0]
            await self.c.put(self.ledger, self.page, key, value, lazy=prio == "lazy")
            self.written += 1
            return
        half = len(batch) // 2
        self.batch_bytes = max(
            1, min(self.batch_bytes, sum(len(k) + len(v) for k, v, _ in batch) // 2)
        )
        await self.send(batch[:half])
        await self.send(batch[half:])

    async def put_streamed(self, first: bytes, n: int) -> None:
        """A line too long to parse whole: key and priority first, then the value streamed
        into a PUT (the layout export writes)."""
        m = STREAMED_HEAD.match(first)
        if m is None:
            raise UsageError(
                f"line {n}: a line over {LINE_LIMIT} bytes must be export's layout: "
                '{"key":...,"priority":...,"value":...}'
            )
        key = base64.b64decode(m.group(1))
        value = StreamedValue(first[m.end() :], self.src, n)
        try:
            await self.c.put(self.ledger, self.page, key, value, lazy=m.group(2) == b"lazy")
        except Exception:
            if value.error is not None:
                raise value.error from None
            raise
        finally:
            self.read += value.read - len(first)
        self.written += 1


def file_size(src: BinaryIO) -> int | None:
    """The input's size when it is a regular file (progress shows time left), else None."""
    try:
        st = os.fstat(src.fileno())
    except (OSError, ValueError, io.UnsupportedOperation):
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None
