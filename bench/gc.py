"""GC benchmark: disk before and after garbage collection of a bulk load, next to PouchDB.

``python -m bench.gc [--entries 100000] [--txn 1000] [--no-pouchdb]`` loads
``entries`` random keys (16 bytes) with random values (100 bytes) in
transactions of ``txn``, counts every commit as uploaded (what a sync round does),
then collects with ``history_retention = 0``. It prints:

* the page's files (database and WAL) after the load and after GC, the live
  stored bytes (pieces the head reaches) and the user's bytes (keys + values),
  and their ratios;
* GC's time and throughput (pieces and MB freed per second);
* the longest event-loop stall while GC runs: a task that sleeps 1 ms in a loop
  records the longest gap between its wake-ups, less the 1 ms (target ≤ 50 ms);
* PouchDB 9's disk for the same load in batches of ``txn`` (``bulkDocs``), before
  and after ``compact()`` (its LevelDB directory), when node and npm are there.

It runs with the daemon's collector settings (``tune_gc``); ``--default-gc`` for
CPython's.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
from pathlib import Path
from typing import Any

from bench.common import StallMeter, emit, install_pouchdb, ratio, run_node, timed
from ledgerd.daemon.main import tune_gc
from ledgerd.store import Repository
from ledgerd.store.page import exchange
from ledgerd.store.page.gc import collect, file_bytes, live_bytes

MB = 1e6


def _rows(n: int, seed: int = 1) -> list[tuple[bytes, bytes]]:
    rng = random.Random(seed)
    return [(rng.randbytes(16), rng.randbytes(100)) for _ in range(n)]


async def _ours(directory: Path, rows: list[tuple[bytes, bytes]], txn: int) -> dict[str, Any]:
    async with await Repository.open(directory / "data", history_retention=0) as repo:
        page = await repo.ledger("bench").page("gc")
        with timed() as load:
            for i in range(0, len(rows), txn):
                async with page.transaction() as tx:
                    for k, v in rows[i : i + txn]:
                        await tx.put(k, v)
            await page.flush()
        delta = await exchange.pending_delta(page)
        if delta is not None:
            await exchange.mark_uploaded(page, delta)
        before = file_bytes(page)
        with StallMeter() as stall, timed() as t:
            result = await collect(page, 0)
        after = file_bytes(page)
        live = await live_bytes(page)
        with StallMeter() as stall_again, timed() as again:
            second = await collect(page, 0)  # nothing to free: the cost of marking alone
    user = sum(len(k) + len(v) for k, v in rows)
    return {
        "load_s": round(load.seconds, 2),
        "user_bytes": user,
        "live_stored_bytes": live,
        "files_before_gc": before,
        "files_after_gc": after,
        "before_vs_user": ratio(before, user),
        "after_vs_user": ratio(after, user),
        "after_vs_live_stored": ratio(after, live),
        "commits_pruned": result.commits_pruned,
        "pieces_freed": result.pieces_freed,
        "bytes_freed": result.bytes_freed,
        "gc_s": round(t.seconds, 3),
        "gc_MB_freed_per_s": round(result.bytes_freed / MB / t.seconds, 1),
        "gc_pieces_freed_per_s": round(result.pieces_freed / t.seconds),
        "gc_longest_loop_stall_ms": round(stall.longest * 1000, 1),
        "second_gc_s": round(again.seconds, 3),
        "second_gc_freed": second.pieces_freed,
        "second_gc_longest_loop_stall_ms": round(stall_again.longest * 1000, 1),
    }


POUCH_SCRIPT = r"""
const PouchDB = require('pouchdb');
const fs = require('fs');
const path = require('path');
const [rowsPath, dbPath, txnArg] = process.argv.slice(2);
const txn = parseInt(txnArg, 10);
const raw = fs.readFileSync(rowsPath);
const docs = [];
for (let i = 0; i < raw.length; i += 116) {
  docs.push({_id: raw.subarray(i, i + 16).toString('hex'),
             v: raw.subarray(i + 16, i + 116).toString('base64')});
}
function du(dir) {
  let total = 0;
  for (const f of fs.readdirSync(dir)) total += fs.statSync(path.join(dir, f)).size;
  return total;
}
(async () => {
  const db = new PouchDB(dbPath);
  for (let i = 0; i < docs.length; i += txn) await db.bulkDocs(docs.slice(i, i + txn));
  const loaded = du(dbPath);
  await db.compact();
  const compacted = du(dbPath);
  await db.close();
  process.stdout.write(JSON.stringify({version: PouchDB.version, adapter: db.adapter,
    disk_after_load: loaded, disk_after_compact: compacted}));
})().catch((e) => { console.error(e); process.exit(1); });
"""


def _pouchdb(directory: Path, rows: list[tuple[bytes, bytes]], txn: int) -> dict[str, Any]:
    work = directory / "pouchdb"
    why = install_pouchdb(work)
    if why is not None:
        return {"skipped": why}
    (work / "rows").write_bytes(b"".join(k + v for k, v in rows))
    return run_node(work, POUCH_SCRIPT, ["rows", str(work / "db"), str(txn)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=100_000)
    ap.add_argument("--txn", type=int, default=1000)
    ap.add_argument("--no-pouchdb", action="store_true")
    ap.add_argument(
        "--default-gc",
        action="store_true",
        help="CPython's collector settings, not the daemon's (tune_gc)",
    )
    args = ap.parse_args()
    if not args.default_gc:
        tune_gc()  # as the daemon runs
    rows = _rows(args.entries)
    with tempfile.TemporaryDirectory() as d:
        ours = asyncio.run(_ours(Path(d), rows, args.txn))
        pouch: dict[str, Any] = (
            {"skipped": "--no-pouchdb"} if args.no_pouchdb else _pouchdb(Path(d), rows, args.txn)
        )
    ratios: dict[str, Any] = {}
    if "skipped" not in pouch:
        ratios = {
            "after_gc_vs_pouchdb_loaded": ratio(ours["files_after_gc"], pouch["disk_after_load"]),
            "after_gc_vs_pouchdb_compacted": ratio(
                ours["files_after_gc"], pouch["disk_after_compact"]
            ),
        }
    emit(
        "gc",
        {
            "entries": args.entries,
            "txn": args.txn,
            "ours": ours,
            "pouchdb": pouch,
            "ratios": ratios,
            "targets": {
                "gc_longest_loop_stall_ms": "<= 50",
                "after_gc_vs_pouchdb": "<= 1.5",
                "after_vs_live (issue: files <= 2x live + 1 MiB)": "<= 2",
            },
        },
    )


if __name__ == "__main__":
    main()
