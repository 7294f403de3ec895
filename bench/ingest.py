"""Ingest benchmark: stream a large random value into a page's object store.

    python -m bench.ingest [--mib 256] [--rounds 3] [--dir DIR]

Prints JSON with the ingest rate next to ``hashlib.sha256`` over the same bytes,
measured in the same run (the ratio is the figure; target >= 0.5), and peak RSS.
For context it also measures, in the same run and on the same bytes (the file's
distinct random blocks, read from the OS's cache as ingest reads them), the
ceilings below any store: the disk's own write rate (copy the file and fsync it),
bare SQLite storing the value as the page's chunker cuts it (chunking and hashing
timed with the inserts, the page's pragmas), and the same in the most favourable
SQLite set-up found for big blobs. Each round measures all five, the one that goes
first turning; every ratio is the median of the rounds' ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import sqlite3
import statistics
import tempfile
from pathlib import Path
from typing import Any

from bench.common import bare_sqlite, emit, peak_rss_mib, timed
from ledgerd.store.pieces.objects import ObjectStore
from ledgerd.store.sqlite.db import Database
from ledgerd.store.sqlite.schema import create_page_schema

MiB = 1024 * 1024


def _write_source(path: Path, size: int) -> None:
    with path.open("wb") as f:
        left = size
        while left:
            n = min(left, 4 * MiB)
            f.write(os.urandom(n))
            left -= n


def _disk_write(source: Path, path: Path) -> float:
    """Seconds to copy ``source`` (distinct random blocks, read as ingest reads them)
    to a file and fsync it: the disk's own rate, which no durable store on it can beat
    (SQLite's WAL writes every byte twice)."""
    with timed() as t, source.open("rb") as f, path.open("wb") as out:
        while block := f.read(4 * MiB):
            out.write(block)
        out.flush()
        os.fsync(out.fileno())
    path.unlink()
    return t.seconds


def _sqlite_floor(path: Path, directory: Path, *, best_case: bool = False) -> float:
    """Seconds for bare SQLite to store the value as a page's chunker cuts it: the file
    read, chunked and hashed by :class:`store.pieces.split.Splitter` (4 MiB at a time) and its
    pieces inserted into a blob table, a transaction per 4 MiB, with the page writer's
    pragmas; all of it timed, as ingest's is. What ingest costs with nothing of ours
    around the chunker: no event loop, threads, staging or journal.

    With ``best_case``, the most favourable set-up found for big blobs instead:
    64 KiB pages, a 64 MiB cache and no checkpoint inside the timing (the WAL is
    copied into the database after the clock stops), an upper bound for any
    SQLite-backed object store here.
    """
    from ledgerd.store.pieces import split

    db_path = directory / f"floor{int(best_case)}.sqlite"
    if best_case:
        db = sqlite3.connect(db_path, isolation_level=None)
        db.execute("PRAGMA page_size = 65536")
        db.execute("PRAGMA journal_mode = WAL")
        db.execute("PRAGMA synchronous = NORMAL")
        db.execute("PRAGMA cache_size = -65536")
        db.execute("PRAGMA wal_autocheckpoint = 0")
    else:
        db = bare_sqlite(db_path)
    db.execute("CREATE TABLE t (k BLOB PRIMARY KEY, v BLOB NOT NULL)")
    splitter = split.Splitter()

    def store(pieces: list[split.Piece]) -> None:
        db.execute("BEGIN")
        db.executemany(
            "INSERT OR IGNORE INTO t VALUES (?, ?)", [(p.digest, p.data) for p in pieces]
        )
        db.execute("COMMIT")

    with timed() as t:
        with path.open("rb") as f:
            while block := f.read(4 * MiB):
                store(splitter.feed(block))
        tail, _ = splitter.finish()
        store(tail)
    db.close()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db_path}{suffix}").unlink(missing_ok=True)
    return t.seconds


def _sha256_file(path: Path) -> float:
    h = hashlib.sha256()
    with timed() as t, path.open("rb") as f:
        while block := f.read(4 * MiB):
            h.update(block)
    return t.seconds


async def _ingest(path: Path, directory: Path, r: int) -> tuple[float, float, int]:
    db_path = directory / f"page{r}.sqlite"
    db = await Database.open(db_path, create_page_schema)
    objects = ObjectStore(db)
    rss_before = peak_rss_mib()
    with timed() as t:
        ref = await objects.put_value(path, "Ibench")
    counts = await objects.counts()
    await db.close()
    assert ref.size == path.stat().st_size
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db_path}{suffix}").unlink(missing_ok=True)
    return t.seconds, peak_rss_mib() - rss_before, counts["objects"]


SIDES = ("sha256", "ingest", "disk", "sqlite", "sqlite_best_case")
"""What a round measures; :func:`_order` turns which goes first."""


def _order(r: int) -> tuple[str, ...]:
    k = r % len(SIDES)
    return SIDES[k:] + SIDES[:k]


def _paired(num: list[float], den: list[float]) -> dict[str, Any]:
    """The rounds' ratios ``num / den`` (of seconds: a rate ratio the other way) and
    their median."""
    each = [round(n / d, 3) for n, d in zip(num, den, strict=True)]
    return {"median": round(statistics.median(each), 3), "rounds": each}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3, help="paired rounds (%(default)s)")
    ap.add_argument(
        "--dir", type=Path, default=None, help="where to put the page (default: a temp dir)"
    )
    args = ap.parse_args()
    size = args.mib * MiB
    secs: dict[str, list[float]] = {side: [] for side in SIDES}
    rss_growth, pieces = 0.0, 0
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        directory = Path(d)
        src = directory / "source.bin"
        _write_source(src, size)
        _sha256_file(src)  # warm the page cache so every side reads from memory
        for r in range(args.rounds):
            for side in _order(r):
                if side == "sha256":
                    secs[side].append(_sha256_file(src))
                elif side == "ingest":
                    s, growth, pieces = asyncio.run(_ingest(src, directory, r))
                    secs[side].append(s)
                    rss_growth = rss_growth if r else growth
                elif side == "disk":
                    secs[side].append(_disk_write(src, directory / "disk.bin"))
                else:
                    best = side == "sqlite_best_case"
                    secs[side].append(_sqlite_floor(src, directory, best_case=best))
    mbs = {side: round(size / 1e6 / statistics.median(v), 1) for side, v in secs.items()}
    emit(
        "ingest",
        {
            "bytes": size,
            "pieces": pieces,
            "rounds": args.rounds,
            "order": [list(_order(r)) for r in range(args.rounds)],
            "seconds_rounds": {side: [round(x, 3) for x in v] for side, v in secs.items()},
            "sha256_MBps": mbs["sha256"],
            "ingest_MBps": mbs["ingest"],
            "ratio": _paired(secs["sha256"], secs["ingest"]),
            "target_ratio": 0.5,
            "disk_write_fsync_MBps": mbs["disk"],
            "disk_ratio_vs_sha256": _paired(secs["sha256"], secs["disk"]),
            "sqlite_chunk_and_insert_MBps": mbs["sqlite"],
            "ingest_vs_sqlite_floor": _paired(secs["sqlite"], secs["ingest"]),
            "sqlite_best_case_MBps": mbs["sqlite_best_case"],
            "sqlite_best_case_ratio_vs_sha256": _paired(secs["sha256"], secs["sqlite_best_case"]),
            "ingest_peak_rss_growth_MiB": round(rss_growth, 1),
            "peak_rss_MiB": round(peak_rss_mib(), 1),
        },
    )


if __name__ == "__main__":
    main()
