"""A 512 MiB value streamed through put and get; the daemon's memory stays flat."""

from __future__ import annotations

import hashlib
import random
from collections.abc import AsyncIterator

from ledgerd.daemon.client import AsyncClient
from tests.daemon.conftest import Daemon

MiB = 1024 * 1024
SIZE = 512 * MiB


async def _source(digest: hashlib._Hash) -> AsyncIterator[bytes]:
    rng = random.Random(512)  # incompressible, nothing dedups: every byte is stored
    for _ in range(SIZE // (4 * MiB)):
        chunk = rng.randbytes(4 * MiB)
        digest.update(chunk)
        yield chunk


def last_block(size: int) -> bytes:
    rng = random.Random(512)
    block = b""
    for _ in range(size // (4 * MiB)):
        block = rng.randbytes(4 * MiB)
    return block


async def test_512_mib_streamed_both_ways_with_flat_rss(daemon: Daemon) -> None:
    sent = hashlib.sha256()
    async with AsyncClient(daemon.socket) as c:
        await c.put("big", "page", b"value", _source(sent))
        got = hashlib.sha256()
        n = 0
        async for chunk in c.get_stream("big", "page", b"value"):
            got.update(chunk)
            n += len(chunk)
        assert n == SIZE and got.digest() == sent.digest()
        tail = await c.get("big", "page", b"value", offset=SIZE - 10, length=10)
        assert tail == last_block(SIZE)[-10:]
    peak = daemon.peak_rss_mib()
    assert peak < 150, f"daemon peak RSS {peak:.0f} MiB"
