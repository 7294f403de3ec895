"""Child process for the memory test: stream a large value in and out, report peak RSS.

Run as ``python -m tests.store.memory_child DIR SIZE``; prints one JSON line.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import resource
import sys
from collections.abc import AsyncIterator
from pathlib import Path

from ledgerd.store.pieces.objects import ObjectStore
from ledgerd.store.sqlite.db import Database
from ledgerd.store.sqlite.schema import create_page_schema


def _rss_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


async def _source(total: int, digest: hashlib._Hash) -> AsyncIterator[bytes]:
    rng = random.Random(256)
    sent = 0
    while sent < total:
        block = rng.randbytes(min(1 << 20, total - sent))
        digest.update(block)
        sent += len(block)
        yield block


async def main(directory: Path, size: int) -> None:
    db = await Database.open(directory / "page.sqlite", create_page_schema)
    objects = ObjectStore(db)
    # Warm up every code path (threads, caches) before the baseline is taken.
    warm = await objects.put_value(random.Random(1).randbytes(8 << 20), "Iwarm")
    async for _ in await objects.read(warm.digest):
        pass
    baseline = _rss_kib()
    sent = hashlib.sha256()
    ref = await objects.put_value(_source(size, sent), "Ibig")
    after_in = _rss_kib()
    got = hashlib.sha256()
    n = 0
    async for block in await objects.read(ref.digest):
        got.update(block)
        n += len(block)
    await db.close()
    print(
        json.dumps(
            {
                "size": size,
                "read": n,
                "same": got.digest() == sent.digest() and ref.size == size,
                "baseline_kib": baseline,
                "after_write_kib": after_in,
                "peak_kib": _rss_kib(),
            }
        )
    )


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), int(sys.argv[2])))
