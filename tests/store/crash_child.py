"""Child process for the crash test: write forever, report each acknowledgement.

``python -m tests.store.crash_child DATA_DIR SEED`` prints one line per event:
``P key`` after a plain write returned, ``B id`` just before a transaction's
commit is called and ``C id`` after it returned. Transaction keys are
``t/{id}/{n}``. The parent kills this process with SIGKILL at a random moment.
"""

from __future__ import annotations

import asyncio
import random
import sys
from pathlib import Path

from ledgerd.store import Page, Repository


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def plain(page: Page, key: bytes, value: bytes) -> None:
    await page.put(key, value)
    say("P " + key.decode())


async def main(data_dir: Path, seed: int) -> None:
    rng = random.Random(seed)
    repo = await Repository.open(data_dir)
    page = await repo.ledger("crash").page("page")
    say("READY")
    n = 0
    while True:
        n += 1
        if rng.random() < 0.6:
            writes = []
            for i in range(rng.randint(1, 10)):
                size = 400_000 if rng.random() < 0.05 else rng.randint(0, 200)
                writes.append(plain(page, b"p/%d/%d/%d" % (seed, n, i), rng.randbytes(size)))
            await asyncio.gather(*writes)
        else:
            count = rng.randint(1, 8)
            tid = f"{seed}.{n}.{count}"  # the id says how many keys the transaction writes
            txn = page.transaction()
            for i in range(count):
                size = 300_000 if rng.random() < 0.05 else rng.randint(0, 200)
                await txn.put(f"t/{tid}/{i}".encode(), rng.randbytes(size))
            if rng.random() < 0.2:
                await txn.rollback()
                continue
            say("B " + tid)
            await txn.commit()
            say("C " + tid)


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), int(sys.argv[2])))
