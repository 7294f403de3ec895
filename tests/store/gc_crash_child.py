"""Child process for the GC crash test: write, upload, collect, forever.

``python -m tests.store.gc_crash_child DATA_DIR SEED`` keeps 40 keys ``k{i}`` whose
values carry the number of the write (``n:{n}:`` then filler, so that every value
is a stored piece) and prints ``P i n`` after a write returned, ``G`` when a
collection starts and ``D`` when it is done. History retention is 0 and every
commit counts as uploaded, so each collection prunes and deletes. The parent
kills this process with SIGKILL.
"""

from __future__ import annotations

import asyncio
import random
import sys
from pathlib import Path

from ledgerd.store import Repository
from ledgerd.store.page.gc import collect
from tests.exchanges import mark_all_uploaded


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def main(data_dir: Path, seed: int) -> None:
    rng = random.Random(seed)
    repo = await Repository.open(data_dir, history_retention=0)
    page = await repo.ledger("gc").page("page")
    n = seed * 1_000_000
    while True:
        for _ in range(rng.randint(1, 30)):
            n += 1
            i = rng.randrange(40)
            await page.put(b"k%d" % i, b"n:%d:" % n + rng.randbytes(rng.choice([60, 5000])))
            say(f"P {i} {n}")
        if rng.random() < 0.5:  # a few large writes: many nodes change at once
            await page.write(
                [(b"bulk%d" % j, rng.randbytes(200)) for j in range(rng.randint(300, 3000))]
            )
        await mark_all_uploaded(page)
        say("G")
        await collect(page, 0)
        say("D")


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), int(sys.argv[2])))
