"""Ingest benchmark: stream a large random value into a page's object store.

Prints JSON with the ingest rate next to ``hashlib.sha256`` over the same bytes,
measured in the same run (the ratio is the figure; target >= 0.5), and peak RSS.

    python -m bench.ingest [--mib 256] [--dir DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import sqlite3
import tempfile
from pathlib import Path

from bench.common import emit, peak_rss_mib, timed
from store.db import Database
from store.objects import ObjectStore
from store.schema import create_page_schema

MiB = 1024 * 1024


def _write_source(path: Path, size: int) -> None:
    with path.open("wb") as f:
        left = size
        while left:
            n = min(left, 4 * MiB)
            f.write(os.urandom(n))
            left -= n


def _sqlite_floor(path: Path, directory: Path) -> float:
    """Seconds to insert the same chunks into a bare SQLite blob table (no hashing
    of our own, one transaction per 4 MiB, same pragmas): what storing in SQLite
    costs at all on this machine."""
    from store import split
    from store.db import PAGE_SIZE

    db = sqlite3.connect(directory / "floor.sqlite", isolation_level=None)
    db.execute(f"PRAGMA page_size = {PAGE_SIZE}")
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("PRAGMA synchronous = NORMAL")
    db.execute("CREATE TABLE t (k BLOB PRIMARY KEY, v BLOB NOT NULL)")
    # Chunks computed first (streaming, 4 MiB at a time), so only the inserts are timed.
    splitter = split.Splitter()
    total = 0.0
    with path.open("rb") as f:
        while block := f.read(4 * MiB):
            pieces = splitter.feed(block)
            with timed() as t:
                db.execute("BEGIN")
                db.executemany(
                    "INSERT OR IGNORE INTO t VALUES (?, ?)", [(p.digest, p.data) for p in pieces]
                )
                db.execute("COMMIT")
            total += t.seconds
    tail, _ = splitter.finish()
    with timed() as t:
        db.execute("BEGIN")
        db.executemany("INSERT OR IGNORE INTO t VALUES (?, ?)", [(p.digest, p.data) for p in tail])
        db.execute("COMMIT")
    total += t.seconds
    db.close()
    return total


def _sha256_file(path: Path) -> float:
    h = hashlib.sha256()
    with timed() as t, path.open("rb") as f:
        while block := f.read(4 * MiB):
            h.update(block)
    return t.seconds


async def _ingest(path: Path, directory: Path) -> tuple[float, float, int]:
    db = await Database.open(directory / "page.sqlite", create_page_schema)
    objects = ObjectStore(db)
    rss_before = peak_rss_mib()
    with timed() as t:
        ref = await objects.put_value(path, "Ibench")
    counts = await objects.counts()
    await db.close()
    assert ref.size == path.stat().st_size
    return t.seconds, peak_rss_mib() - rss_before, counts["objects"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument(
        "--dir", type=Path, default=None, help="where to put the page (default: a temp dir)"
    )
    args = ap.parse_args()
    size = args.mib * MiB
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        directory = Path(d)
        src = directory / "source.bin"
        _write_source(src, size)
        _sha256_file(src)  # warm the page cache so both runs read from memory
        sha_s = _sha256_file(src)
        ingest_s, rss_growth, pieces = asyncio.run(_ingest(src, directory))
        floor_s = _sqlite_floor(src, directory)
        sha_mbs = size / 1e6 / sha_s
        ingest_mbs = size / 1e6 / ingest_s
        emit(
            "ingest",
            {
                "bytes": size,
                "pieces": pieces,
                "sha256_MBps": round(sha_mbs, 1),
                "ingest_MBps": round(ingest_mbs, 1),
                "ratio": round(ingest_mbs / sha_mbs, 3),
                "target_ratio": 0.5,
                "sqlite_blob_insert_MBps": round(size / 1e6 / floor_s, 1),
                "ingest_vs_sqlite_floor": round(floor_s / ingest_s, 3),
                "ingest_peak_rss_growth_MiB": round(rss_growth, 1),
                "peak_rss_MiB": round(peak_rss_mib(), 1),
            },
        )


if __name__ == "__main__":
    main()
