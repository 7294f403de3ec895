"""Read benchmark: point gets, cold gets and scans of a page, next to raw SQLite and PouchDB.

    python -m bench.reads [--entries 100000] [--txn 1000] [--gets 20000] [--rounds 3]
                          [--cold-gets 1000] [--cold-rounds 3] [--no-pouchdb] [--default-gc]

Prints JSON. One page of ``--entries`` entries (16-byte random keys, 100-byte
random values), loaded in transactions of ``--txn`` random keys (a ``tx.put`` per
key, the final flush timed, against PouchDB's ``bulkDocs`` of ``--txn`` docs: the
issue's definition; ``put_many`` would be the faster bulk call), and in the same
run:

* raw SQLite (:func:`bench.common.raw_kv`: the page writer's page size, WAL and
  pragmas), the same rows in a ``WITHOUT ROWID`` table and in a rowid table with its
  key index, each loaded with executemany in transactions of the same size, read
  with a primary-key select and a full ``ORDER BY key`` scan; each figure is
  compared with the faster of the two (``anchor`` names it: for scans it is the
  ``WITHOUT ROWID`` table, which a scan reads straight through);
* PouchDB 9 in node (``npm install pouchdb@9`` into a temporary directory; its
  leveldb adapter): ``bulkDocs`` of ``--txn`` docs, ``db.get``, and
  ``allDocs({include_docs: true})``. Skipped with a note when node or npm is
  missing, or with ``--no-pouchdb``.

Warm figures are taken after a full scan has read everything once (the caches
warm), in ``--rounds`` paired rounds of a scan and the gets, raw SQLite's and ours,
the side that goes first alternating; each ratio is the median of the rounds'
ratios. Cold gets run in a fresh process each (the OS's file cache warm, every
cache of the process empty), ``--cold-gets`` random keys, in ``--cold-rounds``
rounds alternating raw SQLite's process and ours: each side reports its median
round (the mean of a thousand gets on a shared machine swings with whatever else
runs, and a round of each side next to each other sees the same). The load is reported
next to the storage floor (bare SQLite storing the very pieces each commit
stored, commit by commit; see :mod:`bench.pages`), and each side's load with the
MiB it wrote to storage (``load_written_MiB``, from ``/proc/self/io``; null where
the kernel does not say). ``pieces_alone`` breaks the floor down: bare SQLite
storing just those pieces, with a unique index on their digests, with the page's
index on four bytes of them, and with none (:func:`bench.common.pieces_alone`).

Python runs with the daemon's garbage collector settings
(:func:`ledgerd.daemon.main.tune_gc`), as ``ledgerd`` runs and as :mod:`bench.docs`
measures: in this process (set before the rows are made, so they are not frozen)
and in every cold child, raw SQLite's included. ``--default-gc`` keeps CPython's.
Under CPython's, a fresh process's first full collection falls among its cold
gets (about a sixth of their time here), and the load spends more of the loop in
young collections.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import (
    KV_TABLES,
    WRITTEN_JS,
    emit,
    install_pouchdb,
    last_piece,
    latency,
    peak_rss_mib,
    pieces_alone,
    pieces_between,
    ratio,
    raw_kv,
    raw_kv_load,
    raw_kv_scan,
    run_node,
    storage_floor,
    timed,
    written_mib,
    written_since,
)
from ledgerd.daemon.main import tune_gc
from ledgerd.store import Page, Repository

LEDGER = "bench"
PAGE = "reads"


def _rows(n: int, seed: int = 1) -> list[tuple[bytes, bytes]]:
    rng = random.Random(seed)
    return [(rng.randbytes(16), rng.randbytes(100)) for _ in range(n)]


def _sample(rows: list[tuple[bytes, bytes]], n: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    return [rows[rng.randrange(len(rows))][0] for _ in range(n)]


# -- raw SQLite -------------------------------------------------------------------

SHAPES = tuple(KV_TABLES)
"""The raw tables measured; each figure takes the faster (see :func:`_anchor`)."""


def _raw_path(directory: Path, shape: str) -> Path:
    return directory / f"raw-{shape}.sqlite"


def _raw_gets(db: sqlite3.Connection, keys: list[bytes]) -> list[float]:
    lat = []
    for k in keys:
        t0 = time.perf_counter()
        row = db.execute("SELECT value FROM kv WHERE key = ?", (k,)).fetchone()
        lat.append(time.perf_counter() - t0)
        assert row is not None
    return lat


def _raw_warm(db: sqlite3.Connection, keys: list[bytes]) -> dict[str, Any]:
    """One warm round of raw SQLite: a scan, then the gets."""
    scan_s, n = raw_kv_scan(db)
    return {"scan_s": scan_s, "scanned": n, "get": latency(_raw_gets(db, keys))}


def _raw_cold_child(path: Path, keys: list[bytes]) -> dict[str, Any]:
    db = sqlite3.connect(path, isolation_level=None)
    return latency(_raw_gets(db, keys))


# -- ours -----------------------------------------------------------------------


async def _load(page: Page, rows: list[tuple[bytes, bytes]], txn: int, marks: list[int]) -> float:
    """Seconds to load ``rows``: a transaction of ``txn`` keys each, a ``put`` per key
    (as an application writes them; ``put_many`` is the faster bulk call), and the
    final flush, all timed."""
    seconds = 0.0
    for i in range(0, len(rows), txn):
        with timed() as t:
            async with page.transaction() as tx:
                for key, value in rows[i : i + txn]:
                    await tx.put(key, value)
        seconds += t.seconds
        marks.append(await last_piece(page))
    with timed() as t:
        await page.flush()
    return seconds + t.seconds


def _floor(source_path: Path, marks: list[int], path: Path) -> float:
    """The storage floor of the load: its commits' pieces stored by bare SQLite."""
    source = sqlite3.connect(f"file:{source_path}?mode=ro", uri=True)
    try:
        return storage_floor(path, pieces_between(source, marks))
    finally:
        source.close()


async def _gets(page: Page, keys: list[bytes]) -> list[float]:
    lat = []
    get = page.get
    for k in keys:
        t0 = time.perf_counter()
        await get(k)
        lat.append(time.perf_counter() - t0)
    return lat


def _warm_figures(scan_s: float, lat: list[float] | dict[str, float]) -> dict[str, float]:
    get = latency(lat) if isinstance(lat, list) else lat
    return {"scan_s": round(scan_s, 4), **{f"get_{k}": v for k, v in get.items()}}


async def _ours(
    directory: Path, rows: list[tuple[bytes, bytes]], txn: int, keys: list[bytes], rounds: int
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Our load, its floors, and ``rounds`` paired warm rounds (ours and each raw
    table: a scan, then the gets; the side that goes first alternating)."""
    out: dict[str, Any] = {}
    warm: list[dict[str, Any]] = []
    # Set up as they were loaded (raw_kv: the page writer's pragmas, its 16 MiB page
    # cache among them, as our reader's), not with sqlite3's defaults.
    raws = {s: raw_kv(_raw_path(directory, s), s) for s in SHAPES}
    async with await Repository.open(directory / "repo") as repo:
        page = await repo.ledger(LEDGER).page(PAGE)
        marks: list[int] = []
        before = written_mib()
        load_s = await _load(page, rows, txn, marks)
        out["load_written_MiB"] = written_since(before)
        await page.flush()
        out["load_s"] = round(load_s, 3)
        out["storage_floor_s"] = round(_floor(page.db.path, marks, directory / "floor.sqlite"), 3)
        out["pieces_alone"] = pieces_alone(page.db.path, marks, directory)
        with timed() as t:  # the first scan warms the caches
            res = await page.entries()
        assert len(res.items) == len(rows), len(res.items)
        out["scan_first_s"] = round(t.seconds, 4)
        for db in raws.values():
            raw_kv_scan(db)  # warm too
        for r in range(rounds):
            this: dict[str, Any] = {"first": "raw" if r % 2 == 0 else "ours"}
            for side in ("raw", "ours") if r % 2 == 0 else ("ours", "raw"):
                if side == "raw":
                    for shape, db in raws.items():
                        got = _raw_warm(db, keys)
                        assert got["scanned"] == len(rows)
                        this[shape] = _warm_figures(got["scan_s"], got["get"])
                else:
                    del res  # freed outside the timing, as raw SQLite's rows are
                    with timed() as t:
                        res = await page.entries()
                    assert len(res.items) == len(rows), len(res.items)
                    this["ours"] = _warm_figures(t.seconds, await _gets(page, keys))
            warm.append(this)
    for db in raws.values():
        db.close()
    return out, warm


def _anchor(warm: list[dict[str, Any]], figure: str) -> str:
    """The raw table that is faster at ``figure`` (lower is faster) over the rounds."""
    return min(SHAPES, key=lambda shape: statistics.median(r[shape][figure] for r in warm))


def _warm_ratio(warm: list[dict[str, Any]], figure: str) -> dict[str, Any]:
    """Ours over the faster raw table at ``figure``: the median of the rounds' ratios."""
    shape = _anchor(warm, figure)
    each = [ratio(r["ours"][figure], r[shape][figure]) for r in warm]
    return {"median": round(statistics.median(each), 2), "rounds": each, "anchor": shape}


async def _ours_cold_child(directory: Path, keys: list[bytes]) -> dict[str, Any]:
    async with await Repository.open(directory / "repo") as repo:
        page = await repo.ledger(LEDGER).page(PAGE)
        return latency(await _gets(page, keys))


def _child(kind: str, directory: Path, keys: list[bytes], default_gc: bool) -> dict[str, Any]:
    """Run a cold-get measurement in a fresh Python process (``kind``: ``ours`` or a
    raw table's shape)."""
    keyfile = directory / "cold-keys"
    keyfile.write_bytes(b"".join(keys))
    gc_flag = ["--default-gc"] if default_gc else []
    res = subprocess.run(
        [sys.executable, "-m", "bench.reads", *gc_flag, "--child", kind, str(directory)],
        check=True,
        capture_output=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    doc: dict[str, Any] = json.loads(res.stdout)
    return doc


def _cold(
    directory: Path, keys: list[bytes], rounds: int, default_gc: bool, shape: str
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Cold gets of the raw table ``shape`` and of ours, ``rounds`` times, the side
    that goes first alternating: each side's median round (by mean), with every
    round's mean, and the median of the rounds' ratios (ours over raw)."""
    got: dict[str, list[dict[str, Any]]] = {shape: [], "ours": []}
    for r in range(rounds):
        for kind in (shape, "ours") if r % 2 == 0 else ("ours", shape):
            got[kind].append(_child(kind, directory, keys, default_gc))
    out = []
    for kind in (shape, "ours"):
        ordered = sorted(got[kind], key=lambda r: float(r["mean_us"]))
        median = dict(ordered[len(ordered) // 2])
        median["rounds_mean_us"] = [r["mean_us"] for r in got[kind]]
        out.append(median)
    each = [ratio(o["mean_us"], w["mean_us"]) for o, w in zip(got["ours"], got[shape], strict=True)]
    paired = {"median": round(statistics.median(each), 2), "rounds": each, "anchor": shape}
    return out[0], out[1], paired


def _child_main(kind: str, directory: Path) -> None:
    raw = (directory / "cold-keys").read_bytes()
    keys = [raw[i : i + 16] for i in range(0, len(raw), 16)]
    if kind in SHAPES:
        figures = _raw_cold_child(_raw_path(directory, kind), keys)
    else:
        figures = asyncio.run(_ours_cold_child(directory, keys))
    # Not getrusage: a child's ru_maxrss starts from its parent's at fork.
    status = Path("/proc/self/status").read_text()
    hwm = re.search(r"^VmHWM:\s+(\d+) kB", status, re.M)
    if hwm is not None:
        figures["peak_rss_MiB"] = round(int(hwm.group(1)) / 1024, 1)
    json.dump(figures, sys.stdout)


# -- PouchDB ----------------------------------------------------------------------

POUCH_SCRIPT = (
    WRITTEN_JS
    + r"""
const PouchDB = require('pouchdb');
const fs = require('fs');
const [rowsPath, keysPath, dbPath, txnArg] = process.argv.slice(2);
const txn = parseInt(txnArg, 10);
const raw = fs.readFileSync(rowsPath);
const docs = [];
for (let i = 0; i < raw.length; i += 116) {
  docs.push({_id: raw.subarray(i, i + 16).toString('hex'),
             v: raw.subarray(i + 16, i + 116).toString('base64')});
}
const kraw = fs.readFileSync(keysPath);
const keys = [];
for (let i = 0; i < kraw.length; i += 16) keys.push(kraw.subarray(i, i + 16).toString('hex'));
const now = () => Number(process.hrtime.bigint()) / 1e9;
function latency(lat) {
  lat.sort((a, b) => a - b);
  const mean = lat.reduce((a, b) => a + b, 0) / lat.length;
  const r = (x) => Math.round(x * 1e8) / 100;
  return {mean_us: r(mean), p50_us: r(lat[Math.floor(lat.length / 2)]),
          p99_us: r(lat[Math.floor(lat.length * 0.99)])};
}
(async () => {
  const db = new PouchDB(dbPath);
  const before = writtenMiB();
  let t0 = now();
  for (let i = 0; i < docs.length; i += txn) await db.bulkDocs(docs.slice(i, i + txn));
  const load = now() - t0;
  const written = before === null ? null : Math.round((writtenMiB() - before) * 10) / 10;
  const scans = [];
  let n = 0;
  for (let j = 0; j < 2; j++) {
    t0 = now();
    const res = await db.allDocs({include_docs: true});
    scans.push(now() - t0);
    n = res.rows.length;
  }
  const lat = [];
  for (const k of keys) {
    t0 = now();
    await db.get(k);
    lat.push(now() - t0);
  }
  await db.close();
  process.stdout.write(JSON.stringify({
    version: PouchDB.version, adapter: db.adapter, load_s: load, load_written_MiB: written,
    scan_first_s: scans[0],
    scan_s: scans[1], scanned: n, get: latency(lat),
    peak_rss_MiB: Math.round(process.resourceUsage().maxRSS / 102.4) / 10}));
})().catch((e) => { console.error(e); process.exit(1); });
"""
)


def _pouchdb(
    directory: Path, rows: list[tuple[bytes, bytes]], keys: list[bytes], txn: int
) -> dict[str, Any]:
    """PouchDB's figures, or ``{"skipped": why}``."""
    work = directory / "pouchdb"
    why = install_pouchdb(work)
    if why is not None:
        return {"skipped": why}
    (work / "rows").write_bytes(b"".join(k + v for k, v in rows))
    (work / "keys").write_bytes(b"".join(keys))
    return run_node(work, POUCH_SCRIPT, ["rows", "keys", str(work / "db"), str(txn)])


# -- main -------------------------------------------------------------------------


def _report(
    args: argparse.Namespace,
    raw: dict[str, Any],
    ours: dict[str, Any],
    warm: list[dict[str, Any]],
    pouch: dict[str, Any],
) -> dict[str, Any]:
    load_anchor = min(SHAPES, key=lambda shape: float(raw[shape]["load_s"]))
    raw_load_s = raw[load_anchor]["load_s"]
    ratios: dict[str, Any] = {
        "get_mean_vs_raw_sqlite": _warm_ratio(warm, "get_mean_us"),
        "get_p50_vs_raw_sqlite": _warm_ratio(warm, "get_p50_us"),
        "cold_get_mean_vs_raw_sqlite": ours["cold_get_vs_raw"],
        "scan_vs_raw_sqlite": _warm_ratio(warm, "scan_s"),
        "load_rate_vs_raw_sqlite": {
            "ratio": ratio(raw_load_s, ours["load_s"]),
            "anchor": load_anchor,
        },
        "storage_floor_rate_vs_raw_sqlite": ratio(raw_load_s, ours["storage_floor_s"]),
    }
    mine = ours["warm"]
    if "skipped" not in pouch:
        ratios.update(
            {
                "get_mean_vs_pouchdb": ratio(mine["get_mean_us"], pouch["get"]["mean_us"]),
                "get_p50_vs_pouchdb": ratio(mine["get_p50_us"], pouch["get"]["p50_us"]),
                "scan_vs_pouchdb": ratio(mine["scan_s"], pouch["scan_s"]),
                "load_rate_vs_pouchdb": ratio(pouch["load_s"], ours["load_s"]),
            }
        )
        if ours["load_written_MiB"] is not None and pouch["load_written_MiB"]:
            ratios["load_written_vs_pouchdb"] = ratio(
                ours["load_written_MiB"], pouch["load_written_MiB"]
            )
    return {
        "entries": args.entries,
        "value_bytes": 100,
        "gc": "CPython's defaults" if args.default_gc else "the daemon's (tune_gc)",
        "txn_size": args.txn,
        "gets": args.gets,
        "rounds": args.rounds,
        "cold_gets": args.cold_gets,
        "cold_rounds": args.cold_rounds,
        "ours": ours,
        "raw_sqlite": raw,
        "warm_rounds": warm,
        "pouchdb": pouch,
        "ratios": ratios,
        "targets": {
            "get_mean_vs_raw_sqlite": "<= 4",
            "get_mean_vs_pouchdb": "<= 0.5",
            "scan_vs_raw_sqlite": "<= 3 (issue 42)",
            "cold_get_mean_vs_raw_sqlite": "<= 10",
            "load_rate_vs_pouchdb": ">= 1",
            "load_written_vs_pouchdb": "<= 1 (issue 42)",
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=100_000)
    ap.add_argument("--txn", type=int, default=1000)
    ap.add_argument("--gets", type=int, default=20_000, help="warm gets a round (%(default)s)")
    ap.add_argument("--rounds", type=int, default=3, help="paired warm rounds (%(default)s)")
    ap.add_argument("--cold-gets", type=int, default=1000)
    ap.add_argument("--cold-rounds", type=int, default=3)
    ap.add_argument("--no-pouchdb", action="store_true")
    ap.add_argument("--default-gc", action="store_true", help="not the daemon's GC settings")
    ap.add_argument("--child", nargs=2, metavar=("KIND", "DIR"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if not args.default_gc:
        tune_gc()
    if args.child:
        _child_main(args.child[0], Path(args.child[1]))
        return
    rows = _rows(args.entries)
    keys = _sample(rows, args.gets, seed=3)
    cold_keys = _sample(rows, args.cold_gets, seed=4)
    with tempfile.TemporaryDirectory() as d:
        directory = Path(d)
        raw: dict[str, Any] = {}
        for shape in SHAPES:
            before = written_mib()
            load_s = raw_kv_load(_raw_path(directory, shape), rows, args.txn, shape)
            raw[shape] = {"load_s": round(load_s, 3), "load_written_MiB": written_since(before)}
        ours, warm = asyncio.run(_ours(directory, rows, args.txn, keys, args.rounds))
        ours["warm"] = {k: statistics.median(r["ours"][k] for r in warm) for k in warm[0]["ours"]}
        ours["peak_rss_MiB"] = round(peak_rss_mib(), 1)
        shape = _anchor(warm, "get_mean_us")
        raw[shape]["cold_get"], ours["cold_get"], ours["cold_get_vs_raw"] = _cold(
            directory, cold_keys, args.cold_rounds, args.default_gc, shape
        )
        if args.no_pouchdb:
            pouch: dict[str, Any] = {"skipped": "--no-pouchdb"}
        else:
            pouch = _pouchdb(directory, rows, keys, args.txn)
    emit("reads", _report(args, raw, ours, warm, pouch))


if __name__ == "__main__":
    main()
