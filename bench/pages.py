"""Page benchmarks: bulk load, one-entry update cost, range scan and point gets.

    python -m bench.pages [--entries 100000] [--txn 1000] [--rounds 3]

Prints JSON. The bulk load runs ``--rounds`` times, each round into a new page and
next to raw SQLite inserting the same rows with executemany into each of
:func:`bench.common.raw_kv`'s tables (a ``WITHOUT ROWID`` table and a rowid table with
its key index; the page writer's page size, WAL and pragmas), the side that goes first
alternating; the ratio (target >= 0.3) is the median of the rounds' ratios against the
faster raw table. It is also reported next to its two parts measured alone: the
storage floor (bare SQLite storing the very pieces each commit of the first round's
load stored, commit by commit, with the page schema and pragmas) and the tree work
(the same transactions applied to a tree whose nodes live in a dict: hashing,
applying, encoding; no SQLite at all). The update figure counts the objects and
bytes a one-entry change adds to a page of that size (target <= 4 objects,
<= 128 KiB). The scan of 10,000 entries with their values is compared with raw
SQLite reading the first 10,000 rows of its ``WITHOUT ROWID`` table in key order.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.common import (
    KV_TABLES,
    emit,
    last_piece,
    peak_rss_mib,
    pieces_between,
    raw_kv_load,
    storage_floor,
    timed,
)
from ledgerd.store import Page, Repository
from ledgerd.store.pieces import digest as dg
from ledgerd.store.pieces.cache import Cache
from ledgerd.store.tree import btree


def _rows(n: int, seed: int = 1) -> list[tuple[bytes, bytes]]:
    rng = random.Random(seed)
    return [(rng.randbytes(16), rng.randbytes(100)) for _ in range(n)]


async def _counts(page: object) -> tuple[int, int]:
    rows = await page.db.read_all(  # type: ignore[attr-defined]
        "SELECT count(*), coalesce(sum(length(data)), 0) FROM objects"
    )
    return int(rows[0][0]), int(rows[0][1])


async def _load(
    page: Page, rows: list[tuple[bytes, bytes]], txn: int, marks: list[int] | None = None
) -> float:
    """Seconds to write ``rows`` in transactions of ``txn`` entries.

    With ``marks``, the last ``objects`` rowid after each transaction is appended to
    it (outside the timing), so the pieces of each commit can be replayed.
    """
    seconds = 0.0
    for i in range(0, len(rows), txn):
        with timed() as t:
            async with page.transaction() as tx:
                for k, v in rows[i : i + txn]:
                    await tx.put(k, v)
        seconds += t.seconds
        if marks is not None:
            marks.append(await last_piece(page))
    return seconds


class _MemoryNodes:
    """Tree nodes kept in a dict: the tree work of a load without any storage."""

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}

    async def read_node_bytes(self, digest: bytes) -> bytes:
        return self.data[digest]


async def _tree_only(rows: list[tuple[bytes, bytes]], txn: int) -> float:
    """Seconds of the load's tree work alone: hashing the values, applying each
    transaction's entries and encoding and hashing its new nodes, all in memory."""
    memory = _MemoryNodes()
    nodes = btree.NodeStore(memory, Cache(1 << 40).space())
    root = btree.EMPTY
    with timed() as t:
        for i in range(0, len(rows), txn):
            builder = btree.Builder(nodes)
            changes = [(k, btree.Entry(k, dg.value_chunk_digest(v))) for k, v in rows[i : i + txn]]
            root = await builder.apply(root, changes)
            memory.data.update((p.digest, p.data) for p in builder.pieces_reachable(root))
    return t.seconds


def _median_ratio(num: list[float], den: list[float]) -> dict[str, Any]:
    each = [round(n / d, 3) for n, d in zip(num, den, strict=True)]
    return {"median": round(statistics.median(each), 3), "rounds": each}


async def _bulk_rounds(
    directory: Path,
    page: Page,
    rows: list[tuple[bytes, bytes]],
    txn: int,
    rounds: int,
    marks: list[int],
) -> dict[str, Any]:
    """``rounds`` paired bulk loads: ours (the first into ``page``, its commits' last
    pieces into ``marks``; the others into a repository each) and raw SQLite's tables,
    the side that goes first alternating."""
    raw: dict[str, list[float]] = {shape: [] for shape in KV_TABLES}
    ours: list[float] = []
    for r in range(rounds):
        for side in ("raw", "ours") if r % 2 == 0 else ("ours", "raw"):
            if side == "raw":
                for shape in KV_TABLES:
                    path = directory / f"raw-{shape}-{r}.sqlite"
                    raw[shape].append(raw_kv_load(path, rows, txn, shape))
            elif r == 0:
                ours.append(await _load(page, rows, txn, marks))
            else:
                async with await Repository.open(directory / f"repo{r}") as other:
                    ours.append(await _load(await other.ledger("bench").page("bulk"), rows, txn))
                shutil.rmtree(directory / f"repo{r}")
    anchor = min(KV_TABLES, key=lambda shape: statistics.median(raw[shape]))
    return {
        "bulk_load_s": round(statistics.median(ours), 3),
        "bulk_load_s_rounds": [round(x, 3) for x in ours],
        "bulk_load_entries_per_s": round(len(rows) / statistics.median(ours)),
        "raw_sqlite_s_rounds": {k: [round(x, 3) for x in v] for k, v in raw.items()},
        "raw_sqlite_anchor": anchor,
        "raw_sqlite_s": round(statistics.median(raw[anchor]), 3),
        "raw_sqlite_entries_per_s": round(len(rows) / statistics.median(raw[anchor])),
        "bulk_ratio_vs_raw_sqlite": _median_ratio(raw[anchor], ours),
    }


async def _range_with_values(
    page: Page, raw: sqlite3.Connection, limit: int, rounds: int
) -> dict[str, Any]:
    """The first ``limit`` entries with their values: ours (the first call alone, then
    ``rounds`` paired with raw SQLite's first ``limit`` rows in key order, the side that
    goes first alternating)."""
    with timed() as t:
        res = await page.entries(limit=limit)
    assert len(res.items) == limit
    first = t.seconds
    ours: list[float] = []
    theirs: list[float] = []
    for r in range(rounds):
        for side in ("raw", "ours") if r % 2 == 0 else ("ours", "raw"):
            if side == "raw":
                with timed() as t:
                    got = raw.execute(
                        "SELECT key, value FROM kv ORDER BY key LIMIT ?", (limit,)
                    ).fetchall()
                assert len(got) == limit
                theirs.append(t.seconds)
            else:
                with timed() as t:
                    res = await page.entries(limit=limit)
                ours.append(t.seconds)
    return {
        "range_with_values_first_s": round(first, 4),
        "range_with_values_s": round(statistics.median(ours), 4),
        "raw_sqlite_range_with_values_s": round(statistics.median(theirs), 4),
        "range_with_values_time_vs_raw_sqlite": _median_ratio(ours, theirs),
        "range_with_values_entries": limit,
    }


async def _bench(
    directory: Path, rows: list[tuple[bytes, bytes]], txn: int, rounds: int
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    sorted_rows = sorted(rows)
    async with await Repository.open(directory / "repo") as repo:
        page = await repo.ledger("bench").page("bulk")
        marks: list[int] = []
        out.update(await _bulk_rounds(directory, page, rows, txn, rounds, marks))
        # The pieces each commit of that load stored (values and tree nodes), replayed
        # into bare SQLite commit by commit: the storage alone, nothing of ours around it.
        source = sqlite3.connect(f"file:{page.db.path}?mode=ro", uri=True)
        sizes: list[int] = []

        def commits() -> Iterator[list[tuple[bytes, bytes]]]:
            for rows in pieces_between(source, marks):
                sizes.extend(len(v) for _, v in rows)
                yield rows

        out["storage_floor_s"] = round(storage_floor(directory / "floor.sqlite", commits()), 3)
        source.close()
        out["tree_only_s"] = round(await _tree_only(rows, txn), 3)
        out["bulk_load_pieces"] = len(sizes)
        out["bulk_load_piece_MB"] = round(sum(sizes) / 1e6, 1)

        # The same rows in key order (an import of an export): only the right edge moves.
        ordered = await repo.ledger("bench").page("sorted")
        out["sorted_bulk_load_s"] = round(await _load(ordered, sorted_rows, txn), 3)

        # One-entry update: objects and bytes added.
        n0, b0 = await _counts(page)
        key = rows[len(rows) // 2][0]
        await page.put(key, random.Random(2).randbytes(100))
        await page.flush()
        n1, b1 = await _counts(page)
        out["update_new_objects"] = n1 - n0
        out["update_new_bytes"] = b1 - b0

        # Range scan of the whole page, streamed.
        with timed() as t:
            n = 0
            async for _ in page.iter_entries():
                n += 1
        assert n == len(rows), (n, len(rows))
        out["range_scan_entries_per_s"] = round(n / t.seconds)
        raw = sqlite3.connect(directory / "raw-without_rowid-0.sqlite", isolation_level=None)
        out.update(await _range_with_values(page, raw, min(10_000, len(rows)), rounds))
        raw.close()

        # Point gets (values read and verified), after a cold cache.
        page.nodes.clear_cache()
        page.objects.clear_cache()
        rng = random.Random(3)
        for label in ("get", "warm_get"):  # cold node cache first, then warm
            lat = []
            for _ in range(2000):
                k = rows[rng.randrange(len(rows))][0]
                t0 = time.perf_counter()
                await page.get(k)
                lat.append(time.perf_counter() - t0)
            lat.sort()
            out[f"{label}_p50_us"] = round(lat[len(lat) // 2] * 1e6)
            out[f"{label}_p99_us"] = round(lat[int(len(lat) * 0.99)] * 1e6)
            out[f"{label}_mean_us"] = round(statistics.mean(lat) * 1e6)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=100_000)
    ap.add_argument("--txn", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3, help="paired rounds (%(default)s)")
    args = ap.parse_args()
    rows = _rows(args.entries)
    with tempfile.TemporaryDirectory() as d:
        figures = asyncio.run(_bench(Path(d), rows, args.txn, args.rounds))
    raw_s = figures["raw_sqlite_s"]
    emit(
        "pages",
        {
            "entries": args.entries,
            "txn_size": args.txn,
            "rounds": args.rounds,
            **figures,
            "storage_floor_ratio_vs_raw_sqlite": round(raw_s / figures["storage_floor_s"], 3),
            "tree_only_ratio_vs_raw_sqlite": round(raw_s / figures["tree_only_s"], 3),
            "sorted_bulk_ratio_vs_raw_sqlite": round(raw_s / figures["sorted_bulk_load_s"], 3),
            "target_bulk_ratio": 0.3,
            "target_update": {"objects": 4, "bytes": 131072},
            "peak_rss_MiB": round(peak_rss_mib(), 1),
        },
    )


if __name__ == "__main__":
    main()
