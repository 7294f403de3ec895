"""Ingest benchmark: stream a large random value into a page's object store.

Prints JSON with the ingest rate next to ``hashlib.sha256`` over the same bytes,
measured in the same run (the ratio is the figure; target >= 0.5), and peak RSS.
For context it also measures, in the same run, the ceilings below any store: the
disk's own write rate (write and fsync the same number of bytes), bare SQLite
inserting the same chunks with the page's pragmas, and bare SQLite in the most
favourable set-up found for big blobs.

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

from bench.common import bare_sqlite, emit, peak_rss_mib, timed
from ledgerd.store.db import Database
from ledgerd.store.objects import ObjectStore
from ledgerd.store.schema import create_page_schema

MiB = 1024 * 1024


def _write_source(path: Path, size: int) -> None:
    with path.open("wb") as f:
        left = size
        while left:
            n = min(left, 4 * MiB)
            f.write(os.urandom(n))
            left -= n


def _disk_write(path: Path, size: int) -> float:
    """Seconds to write ``size`` bytes to a file and fsync it: the disk's own rate,
    which no durable store on it can beat (SQLite's WAL writes every byte twice)."""
    block = os.urandom(4 * MiB)
    with timed() as t, path.open("wb") as f:
        for _ in range(size // len(block)):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
    path.unlink()
    return t.seconds


def _sqlite_floor(path: Path, directory: Path, *, best_case: bool = False) -> float:
    """Seconds to insert the same chunks into a bare SQLite blob table (no hashing
    of our own, one transaction per 4 MiB, same pragmas): what storing in SQLite
    costs at all on this machine.

    With ``best_case``, the most favourable set-up found for big blobs instead:
    64 KiB pages, a 64 MiB cache and no checkpoint inside the timing (the WAL is
    copied into the database after the clock stops), an upper bound for any
    SQLite-backed object store here.
    """
    from ledgerd.store import split

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
        disk_s = _disk_write(directory / "disk.bin", size)
        floor_s = _sqlite_floor(src, directory)
        best_s = _sqlite_floor(src, directory, best_case=True)
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
                "disk_write_fsync_MBps": round(size / 1e6 / disk_s, 1),
                "disk_ratio_vs_sha256": round(sha_s / disk_s, 3),
                "sqlite_blob_insert_MBps": round(size / 1e6 / floor_s, 1),
                "ingest_vs_sqlite_floor": round(floor_s / ingest_s, 3),
                "sqlite_best_case_MBps": round(size / 1e6 / best_s, 1),
                "sqlite_best_case_ratio_vs_sha256": round(sha_s / best_s, 3),
                "ingest_peak_rss_growth_MiB": round(rss_growth, 1),
                "peak_rss_MiB": round(peak_rss_mib(), 1),
            },
        )


if __name__ == "__main__":
    main()
