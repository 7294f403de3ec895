"""Child process for the eviction crash test: write pages, count them uploaded, evict.

``python -m tests.store.evict_child DATA_DIR`` writes page ``p{n}`` (key ``k`` =
its name 100 times), counts it as uploaded and closes it, printing ``W p{n}``;
then evicts it and prints ``E p{n}``; forever. The parent kills it with SIGKILL.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from ledgerd.store import Page, PageHooks, Repository
from tests.exchanges import mark_all_uploaded


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class Restorer:
    """(Pages with contents are evicted only where something could restore them.)"""

    async def restore_page(self, page: Page) -> bool:
        return False


async def main(data_dir: Path) -> None:
    repo = await Repository.open(data_dir, hooks=PageHooks(restorer=Restorer()))
    n = 0
    while True:
        n += 1
        name = f"p{n}"
        page = await repo.ledger("l").page(name)
        await page.put(b"k", name.encode() * 100)
        await mark_all_uploaded(page)
        await page.close()
        say("W " + name)
        await repo.evict(b"l", name.encode())
        say("E " + name)


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1])))
