"""Helpers shared by the benchmarks: timing, peak RSS, JSON output, the raw SQLite anchor
(:func:`raw_kv`) and the storage floors."""

from __future__ import annotations

import asyncio
import json
import platform
import resource
import shutil
import sqlite3
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ledgerd.store import Page


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


WRITTEN_JS = r"""
function writtenMiB() {  // what written_mib() reads, from node
  try {
    const m = /^write_bytes: (\d+)$/m.exec(require('fs').readFileSync('/proc/self/io', 'utf8'));
    return m ? Number(m[1]) / 1048576 : null;
  } catch (e) { return null; }
}
"""
"""The same reading for the PouchDB scripts."""


def written_mib() -> float | None:
    """MiB this process has sent to storage so far (Linux's ``write_bytes`` in
    ``/proc/self/io``: the pages its threads dirtied, as they dirty them), or None
    where the kernel does not say. The difference over a load is what the load wrote
    (a WAL checkpoint or a compaction that runs later is not in it, on either side)."""
    try:
        text = Path("/proc/self/io").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("write_bytes:"):
            return int(line.split()[1]) / 2**20
    return None


def written_since(start: float | None) -> float | None:
    """MiB written since ``start`` (a :func:`written_mib`), rounded."""
    now = written_mib()
    return None if start is None or now is None else round(now - start, 1)


class Timer:
    seconds: float = 0.0


@contextmanager
def timed() -> Iterator[Timer]:
    t = Timer()
    start = time.perf_counter()
    try:
        yield t
    finally:
        t.seconds = time.perf_counter() - start


def emit(name: str, figures: dict[str, Any]) -> None:
    """Print one JSON document: the benchmark's name, the machine, and its figures."""
    doc = {
        "benchmark": name,
        "python": platform.python_version(),
        "machine": platform.machine(),
        **figures,
    }
    json.dump(doc, sys.stdout, indent=2)
    sys.stdout.write("\n")


class StallMeter:
    """The longest gap between wake-ups of a task that sleeps ``tick`` seconds."""

    def __init__(self, tick: float = 0.001) -> None:
        self.tick = tick
        self.longest = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(self.tick)
            now = time.perf_counter()
            self.longest = max(self.longest, now - last - self.tick)
            last = now

    def __enter__(self) -> StallMeter:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()


async def last_piece(page: Page) -> int:
    """The id of the last piece ``page`` has stored: taken after each commit of a load,
    these marks give each commit's pieces (:func:`pieces_between`)."""
    rows = await page.db.read_all("SELECT coalesce(max(id), 0) FROM objects")
    return int(rows[0][0])


def pieces_between(
    source: sqlite3.Connection, marks: list[int]
) -> Iterator[list[tuple[bytes, bytes]]]:
    """The ``(digest, data)`` pieces ``source`` stored up to each mark after the one
    before, a list per mark, one at a time (memory stays flat)."""
    for lo, hi in zip([0, *marks], marks, strict=False):
        yield source.execute(
            "SELECT digest, data FROM objects WHERE id > ? AND id <= ?", (lo, hi)
        ).fetchall()


def bare_sqlite(path: Path) -> sqlite3.Connection:
    """A plain ``sqlite3`` connection set up like a page's writer: same page size,
    WAL, and the writer's pragmas."""
    from ledgerd.store.sqlite.db import PAGE_SIZE, writer_pragmas

    db = sqlite3.connect(path, isolation_level=None)
    db.execute(f"PRAGMA page_size = {PAGE_SIZE}")
    db.execute("PRAGMA journal_mode = WAL")
    for pragma in writer_pragmas():
        db.execute(pragma)
    return db


KV_TABLES = {
    "without_rowid": "CREATE TABLE kv (key BLOB PRIMARY KEY, value BLOB NOT NULL) WITHOUT ROWID",
    "rowid": "CREATE TABLE kv (key BLOB PRIMARY KEY, value BLOB NOT NULL)",
}
"""The raw key-value anchor's table shapes: ``without_rowid`` keeps rows in key order in
one B-tree (a scan in key order reads it straight through, a get descends it once);
``rowid`` is a table in insertion order with a separate index on the key."""


def raw_kv(path: Path, shape: str = "without_rowid") -> sqlite3.Connection:
    """The raw SQLite anchor the benchmarks measure a page against: a ``kv`` table of
    ``shape`` (:data:`KV_TABLES`) in :func:`bare_sqlite`'s set-up (the page writer's
    page size, WAL and pragmas), created if ``path`` is new."""
    db = bare_sqlite(path)
    db.execute(KV_TABLES[shape].replace("CREATE TABLE", "CREATE TABLE IF NOT EXISTS", 1))
    return db


def raw_kv_load(path: Path, rows: Sequence[tuple[bytes, bytes]], txn: int, shape: str) -> float:
    """Seconds for :func:`raw_kv` to store ``rows`` with executemany, a transaction of
    ``txn`` rows each (only the inserts are timed)."""
    db = raw_kv(path, shape)
    with timed() as t:
        for i in range(0, len(rows), txn):
            db.execute("BEGIN")
            db.executemany("INSERT OR REPLACE INTO kv VALUES (?, ?)", rows[i : i + txn])
            db.execute("COMMIT")
    db.close()
    return t.seconds


def raw_kv_scan(db: sqlite3.Connection) -> tuple[float, int]:
    """Seconds to read every row of :func:`raw_kv`'s table in key order, and the rows."""
    with timed() as t:
        rows = db.execute("SELECT key, value FROM kv ORDER BY key").fetchall()
    return t.seconds, len(rows)


def storage_floor(
    path: Path,
    txns: Iterable[Sequence[tuple[bytes, bytes]]],
    *,
    schema: Callable[[sqlite3.Connection], None] | None = None,
    also: Callable[[sqlite3.Connection, int], None] | None = None,
) -> float:
    """Seconds for bare ``sqlite3`` to store the same pieces the way a page must.

    Each transaction stores ``(digest, data)`` rows as ``local`` pieces through the
    page's own :func:`store.sqlite.sql.put_pieces`, with the page schema and pragmas: what
    the storage alone costs on this machine, with no tree, hashing, encoding or
    event loop of ours around it. ``schema`` adds tables, and ``also(db, i)`` writes
    transaction ``i``'s rows of them (rows made beforehand: only storing is timed).
    """
    from ledgerd.store.sqlite.schema import LOCAL, create_page_schema
    from ledgerd.store.sqlite.sql import put_pieces

    db = bare_sqlite(path)
    create_page_schema(db)
    if schema is not None:
        schema(db)
    seconds = 0.0
    for i, rows in enumerate(txns):  # only the inserts are timed, not producing the rows
        with timed() as t:
            db.execute("BEGIN IMMEDIATE")
            put_pieces(db, rows, LOCAL)
            if also is not None:
                also(db, i)
            db.execute("COMMIT")
        seconds += t.seconds
    db.close()
    return seconds


def piece_layouts() -> dict[str, tuple[str, ...]]:
    """The ``objects`` layouts :func:`pieces_alone` measures: a unique index on the whole
    digest (schema version 1), the page's on a prefix of it (four bytes since version 3), none."""
    from ledgerd.store.sqlite.schema import DIGEST_KEY

    table = (
        "CREATE TABLE objects (id INTEGER PRIMARY KEY, digest BLOB NOT NULL{}, data BLOB NOT NULL)"
    )
    return {
        "with_digest_index": (table.format(" UNIQUE"),),
        "with_prefix_index": (
            table.format(""),
            f"CREATE INDEX objects_digest ON objects ({DIGEST_KEY})",
        ),
        "without_digest_index": (table.format(""),),
    }


def pieces_alone(source_path: Path, marks: list[int], directory: Path) -> dict[str, Any]:
    """What storing just the pieces a load stored costs bare SQLite (the pieces stored
    up to each of ``marks`` in ``source_path``, as :func:`pieces_between` gives them; a
    plain INSERT per piece, a transaction per mark), in each of :func:`piece_layouts`:
    seconds and MiB written (null where the kernel does not say) each. Digests are
    random, so a batch's new index entries land all over the index and dirty most of
    its pages: the smaller the entries, the fewer the pages."""
    out: dict[str, Any] = {}
    for name, statements in piece_layouts().items():
        db = bare_sqlite(directory / f"pieces-{name}.sqlite")
        for statement in statements:
            db.execute(statement)
        source = sqlite3.connect(f"file:{source_path}?mode=ro", uri=True)
        seconds, written = 0.0, 0.0
        for rows in pieces_between(source, marks):  # only storing is timed and counted
            before = written_mib()
            with timed() as t:
                db.execute("BEGIN IMMEDIATE")
                db.executemany("INSERT INTO objects (digest, data) VALUES (?, ?)", rows)
                db.execute("COMMIT")
            seconds += t.seconds
            written += written_since(before) or 0.0
        source.close()
        db.close()
        known = written_mib() is not None
        out[name] = {"s": round(seconds, 3), "written_MiB": round(written, 1) if known else None}
    return out


def latency(lat: list[float]) -> dict[str, float]:
    """Mean, p50 and p99 of latencies in seconds, in microseconds."""
    lat = sorted(lat)
    return {
        "mean_us": round(statistics.mean(lat) * 1e6, 2),
        "p50_us": round(lat[len(lat) // 2] * 1e6, 2),
        "p99_us": round(lat[int(len(lat) * 0.99)] * 1e6, 2),
    }


def ratio(a: float, b: float) -> float:
    """``a / b`` to two places, as the benchmarks print ratios."""
    return round(a / b, 2)


def install_pouchdb(work: Path, *more: str) -> str | None:
    """``npm install pouchdb@9`` (and the packages ``more``) into ``work`` (created);
    None when done, else why not."""
    npm = shutil.which("npm")
    if shutil.which("node") is None or npm is None:
        return "node or npm is not installed"
    work.mkdir()
    install = subprocess.run(
        [npm, "install", "--silent", "--no-audit", "--no-fund", "pouchdb@9", *more],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if install.returncode != 0:
        return f"npm install pouchdb@9 failed: {install.stderr.strip()[-300:]}"
    return None


def run_node(work: Path, script: str, args: list[str], timeout: float = 1800) -> dict[str, Any]:
    """Run ``script`` with node in ``work`` (where :func:`install_pouchdb` put PouchDB)
    and return the JSON it prints, or ``{"skipped": why}`` if it failed."""
    (work / "bench.js").write_text(script)
    res = subprocess.run(
        [shutil.which("node") or "node", "bench.js", *args],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if res.returncode != 0:
        return {"skipped": f"the PouchDB script failed: {res.stderr.strip()[-300:]}"}
    doc: dict[str, Any] = json.loads(res.stdout)
    return doc
