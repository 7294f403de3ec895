"""What an index on piece digests costs, and what holding its entries would save.

    python -m bench.digests [--every 8 16] [--rounds 2]

Prints JSON. Makes the pieces of two workloads with the real store (``bench.docs``'
100,000 documents in batches of 1,000 with one index, and ``bench.reads``' load of
100,000 random keys in transactions of 1,000), then stores each workload's pieces
again in bare SQLite (the page writer's pragmas, a transaction per batch), timing
only the storing, in these layouts:

* ``unique``: ``objects (id, digest UNIQUE, data)``, as pages had it up to schema
  version 1 (``INSERT OR IGNORE``, 256 rows to a statement, as they stored them);
* ``prefix``: the page's own schema (``objects_digest`` on four bytes of the digest
  since version 3, eight in version 2; no unique constraint) and its own
  :func:`store.sqlite.sql.put_pieces`, which tests for each digest before it inserts;
* ``no_index``: the same table with no index on ``digest`` (a floor: pieces could
  not be found);
* ``held_N``: ``objects`` with no index, and the digest -> id mapping in a
  ``WITHOUT ROWID`` table of its own whose rows are held and entered, sorted, every
  ``N`` batches (how the document layer stores its index rows). Not how the store
  works: a measurement of a design, see docs/performance.md, "The digest index".

Each layout's seconds and MiB written (``/proc/self/io``; null where the kernel does
not say), ``--rounds`` times each, the order of the layouts reversed every other round.
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

from bench import docs, reads
from bench.common import bare_sqlite, emit, last_piece, pieces_between, timed, written_mib
from ledgerd.daemon.main import tune_gc
from ledgerd.store import DocumentStore, Repository
from ledgerd.store.sqlite.schema import SYNCED, create_page_schema
from ledgerd.store.sqlite.sql import insert_rows, put_pieces

BATCH = 1000


async def _docs_pieces(directory: Path) -> tuple[Path, list[int]]:
    items = docs._docs(100_000)
    async with await Repository.open(directory / "docs") as repo:
        store = await DocumentStore.open(await repo.ledger("b").page("p"))
        await store.declare_index(docs.COLLECTION, docs.INDEX, "k", "v")
        marks = []
        for i in range(0, len(items), BATCH):
            await store.create_many(docs.COLLECTION, items[i : i + BATCH])
            marks.append(await last_piece(store.page))
        return store.page.db.path, marks


async def _load_pieces(directory: Path) -> tuple[Path, list[int]]:
    async with await Repository.open(directory / "load") as repo:
        page = await repo.ledger("b").page("p")
        marks: list[int] = []
        await reads._load(page, reads._rows(100_000), BATCH, marks)
        return page.db.path, marks


def _store(
    batches: list[list[tuple[bytes, bytes]]], path: Path, layout: str, every: int = 0
) -> dict[str, Any]:
    """Store ``batches`` in a fresh database in ``layout`` (``unique``, ``prefix``,
    ``no_index`` or ``held``, the mapping's rows then entered every ``every`` batches)."""
    db = bare_sqlite(path)
    if layout == "prefix":
        create_page_schema(db)
    else:
        unique = "UNIQUE" if layout == "unique" else ""
        db.execute(
            f"CREATE TABLE objects (id INTEGER PRIMARY KEY, digest BLOB NOT NULL {unique},"
            " data BLOB NOT NULL)"
        )
    db.execute("CREATE TABLE digests (digest BLOB PRIMARY KEY, id INTEGER NOT NULL) WITHOUT ROWID")
    held: list[tuple[bytes, int]] = []
    seconds, before = 0.0, written_mib()
    for i, rows in enumerate(batches):
        with timed() as t:
            db.execute("BEGIN IMMEDIATE")
            if layout == "prefix":
                put_pieces(db, rows, SYNCED)
            elif layout == "unique":
                insert_rows(db, "INSERT OR IGNORE INTO objects (digest, data)", rows)
            else:
                last = db.execute("SELECT coalesce(max(id), 0) FROM objects").fetchone()[0]
                db.executemany("INSERT INTO objects (digest, data) VALUES (?, ?)", rows)
            if layout == "held":
                held.extend((d, last + j + 1) for j, (d, _) in enumerate(rows))
                if (i + 1) % every == 0 or i + 1 == len(batches):
                    held.sort()
                    db.executemany("INSERT INTO digests VALUES (?, ?)", held)
                    held.clear()
            db.execute("COMMIT")
        seconds += t.seconds
    db.close()
    after = written_mib()
    written = None if before is None or after is None else round(after - before, 1)
    return {"s": round(seconds, 3), "written_MiB": written}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--every", type=int, nargs="+", default=[8, 16])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    tune_gc()
    out: dict[str, Any] = {"batch": BATCH, "every": args.every}
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        for name, make in (("docs", _docs_pieces), ("load", _load_pieces)):
            path, marks = asyncio.run(make(directory))
            source = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
            batches = list(pieces_between(source, marks))
            source.close()
            layouts: dict[str, list[dict[str, Any]]] = {}
            for r in range(args.rounds):
                order = [
                    ("unique", "unique", 0),
                    ("prefix", "prefix", 0),
                    ("no_index", "no_index", 0),
                    *((f"held_{n}", "held", n) for n in args.every),
                ]
                for label, layout, every in order if r % 2 == 0 else order[::-1]:
                    target = directory / f"{name}-{label}-{r}.sqlite"
                    got = _store(batches, target, layout, every)
                    layouts.setdefault(label, []).append(got)
                    target.unlink()
                    Path(f"{target}-wal").unlink(missing_ok=True)
            out[name] = {"pieces": sum(map(len, batches)), **layouts}
    emit("digests", out)


if __name__ == "__main__":
    main()
