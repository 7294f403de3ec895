"""Child process for the memory test: open and close many pages in cycles.

Run as ``python -m tests.store.usage_child DIR PAGES CYCLES``; prints one JSON
line with the resident memory (MiB) after each cycle.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from ledgerd.store import Repository


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    return 0.0


async def main(root: Path, pages: int, cycles: int) -> None:
    after: list[float] = []
    async with await Repository.open(root, max_open_pages=pages * 2) as repo:
        for _ in range(cycles):
            for i in range(pages):
                page = await repo.ledger("l").page(f"p{i}")
                await page.put(b"k", b"v" * 100)
            for page in repo.open_pages():
                await page.flush()
            await repo.close_idle(0)
            after.append(_rss_mib())
    print(json.dumps({"rss_mib": after}))


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])))
