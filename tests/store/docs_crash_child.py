"""Child process for the document crash test: change documents forever, report each.

``python -m tests.store.docs_crash_child DATA_DIR SEED`` prints ``A id rev`` after a
document operation returned (rev: the revision it made). The parent kills this
process with SIGKILL at a random moment.
"""

from __future__ import annotations

import asyncio
import random
import sys
from pathlib import Path

from ledgerd.store import DocumentError, DocumentStore, Repository


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def main(data_dir: Path, seed: int) -> None:
    rng = random.Random(seed)
    repo = await Repository.open(data_dir)
    page = await repo.ledger("crash").page("docs")
    # Room for about 35 held index rows: a kill finds rows held, or being stored
    # with a write, as often as not.
    docs = await DocumentStore.open(page, held_index_bytes=8 * 1024)
    await docs.declare_index("c", "by_k", "k", "v")
    ids = [d.id for d in (await docs.list_documents("c", limit=1000)).items]
    say("READY")
    while True:
        what = rng.random()
        try:
            if what < 0.3 or not ids:
                made = await docs.create_many(
                    "c",
                    [{"k": rng.randrange(4), "v": rng.random()} for _ in range(rng.randint(1, 20))],
                )
                ids += [d.id for d in made]
                for d in made:
                    say(f"A {d.id} {d.rev}")
                continue
            doc_id = rng.choice(ids)
            if what < 0.8:
                d = await docs.replace("c", doc_id, {"k": rng.randrange(4), "v": rng.random()})
            elif what < 0.9:
                d = await docs.delete("c", doc_id)
                ids.remove(doc_id)
            else:
                d = await docs.purge("c", doc_id)
                ids.remove(doc_id)
            say(f"A {d.id} {d.rev}")
        except DocumentError:
            pass


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), int(sys.argv[2])))
