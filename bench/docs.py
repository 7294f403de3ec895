"""Document benchmark (issue 15): inserts, gets, an index query and the index catch-up
after a sync, next to PouchDB 9.

    python -m bench.docs [--docs 100000] [--batch 1000] [--changed 1000] [--gets 5000]
                         [--queries 200] [--insert-rounds 4] [--no-pouchdb] [--default-gc]

Prints JSON. ``--docs`` documents of 5 fields (``k`` an integer partition holding
about 100 documents each, ``v`` a float, ``name`` a string, ``n`` an integer,
``tags`` a list of two strings) in one collection with one index (partition ``k``,
sort ``v``), and in the same run:

* ours, embedded: two repositories (devices ``a`` and ``b``) syncing through a folder
  bucket with :class:`SyncEngine`. The index is declared on ``a`` first; ``a``
  inserts with ``DocumentStore.create_many`` in batches of ``--batch`` (the insert
  rate, the index kept up to date by every call; next to it the storage floor: bare
  SQLite storing each batch's pieces and index rows, with the page's schema and
  pragmas, a transaction per batch), then ``get`` of random ids (p50),
  then ``query`` of one partition (100 documents). Both devices sync; ``b`` brings
  its index up to date once (the longest event-loop stall of ``b``'s sync and of
  that catch-up are printed: a task sleeping 1 ms in a loop measures them). Then
  ``a`` replaces ``--changed`` documents (new ``k`` and ``v``: their index entries
  move), both sync, and the figure is the time
  of ``b``'s first query: the index brought up to date with the changes the sync
  brought, and the query. That sync of ``--changed`` documents is also set against
  the first sync of all of them, in time and in bytes (uploads and downloads of both
  devices, counted by :class:`~ledgerd.sync.testing.CountingStore`): the target is
  0.2 of the first sync or less;
* PouchDB 9 in node (``npm install pouchdb@9 pouchdb-find@9`` into a temporary
  directory; its leveldb adapter): the index created first (``createIndex`` on
  ``[k, v]``), ``bulkDocs`` of ``--batch``, ``db.get``, ``find`` with the selector
  ``{k, v: {$gte: 0}}`` sorted by ``[k, v]`` (Mango, through that index, 100
  documents), and for the catch-up: the time of the first ``find`` after
  ``--changed`` documents changed through one ``bulkDocs``. PouchDB builds an index
  on the first query after writes, so the timed queries follow one untimed
  ``find``, whose time is reported apart, and its insert rate is also given with
  that build counted (ours keep the index up to date on every insert). Skipped
  with a note when node or npm is missing, or with ``--no-pouchdb``.

Each side's inserts are reported with the MiB they wrote to storage
(``insert_written_MiB``, from ``/proc/self/io``; null where the kernel does not say).
``pieces_alone`` breaks our floor down: bare SQLite storing just the pieces of each
batch, with a unique index on their digests, with the page's index on four bytes of
them, and with none (see :func:`bench.common.pieces_alone`).

Like with like: both sides insert the same documents in batches of the same size;
neither waits for the disk on a commit (ledgerd's SQLite runs WAL with ``synchronous
= NORMAL``, PouchDB's leveldown writes with ``sync: false``); both were given the
index before the inserts, but only ours maintains it during them (hence PouchDB's
rate with its lazy build counted as well). Both sides' ids sort in insertion order
(ULIDs here, ``doc00000001``... there). Ours runs with the daemon's garbage
collector settings (:func:`ledgerd.daemon.main.tune_gc`, applied before the
documents are made, so they are not frozen), as ``ledgerd`` runs; ``--default-gc``
keeps CPython's. The CPU time of the inserts (every thread, both sides) is printed
too: on a shared machine it depends less on what else runs than the rates do.

The insert rate is the figure a shared machine moves most: one pair of runs gave
0.88 and, an hour later, 1.69, as a neighbour took one side's core. So the inserts
run ``--insert-rounds`` more times after the main run, alone (each side into a new
database, set up as in the main run, and in a new process: ours a fresh Python as
PouchDB's a fresh node, both reading the same documents from one JSON file, both cold;
the side that goes first alternates, each database removed after its round), and
``insert_rate_vs_pouchdb`` is the median of every round's ratio, the main run's
included (before 2026-11-28 it was the main run's alone, which
``insert_rate_vs_pouchdb_main_run`` still gives); ``insert_rounds`` lists them all.

Those rounds give ours more work than PouchDB's: ours maintains the index during the
inserts, PouchDB's at its next ``find``. So as many rounds again insert with no index
declared on either side, the same work on both (``plain_insert_rounds``, and their
median ``insert_rate_vs_pouchdb_no_index``).

The default is the issue's 100,000 documents: the whole run, both sides, the npm
install and the rounds, takes about two minutes on the 2-core development VM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import (
    WRITTEN_JS,
    StallMeter,
    emit,
    install_pouchdb,
    last_piece,
    latency,
    peak_rss_mib,
    pieces_alone,
    pieces_between,
    ratio,
    run_node,
    storage_floor,
    timed,
    written_mib,
    written_since,
)
from ledgerd.daemon.main import tune_gc
from ledgerd.store import DocumentStore, Repository
from ledgerd.store.documents import docindex
from ledgerd.store.documents.docmodel import parse_ulid
from ledgerd.store.sqlite import schema, sql
from ledgerd.sync.engine import SyncEngine
from ledgerd.sync.folder import FolderStore
from ledgerd.sync.testing import CountingStore

LEDGER = "bench"
PAGE = "docs"
COLLECTION = "items"
INDEX = "by_k"
PER_PARTITION = 100


def _docs(n: int, seed: int = 1) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    parts = max(1, n // PER_PARTITION)
    return [
        {
            "k": i % parts,
            "v": rng.random(),
            "name": f"item-{i:08d}",
            "n": rng.randrange(1_000_000),
            "tags": [f"t{rng.randrange(50)}", f"t{rng.randrange(50)}"],
        }
        for i in range(n)
    ]


def _changed(docs: list[dict[str, Any]], count: int, seed: int = 5) -> list[tuple[int, int, float]]:
    """``(index of the document, its new k, its new v)`` for ``count`` distinct documents."""
    rng = random.Random(seed)
    parts = max(1, len(docs) // PER_PARTITION)
    which = rng.sample(range(len(docs)), min(count, len(docs)))
    return [(i, rng.randrange(parts), rng.random()) for i in which]


# -- ours -------------------------------------------------------------------------


async def _ours(directory: Path, args: argparse.Namespace, docs: list[dict[str, Any]]) -> Any:
    out: dict[str, Any] = {}
    rng = random.Random(3)
    parts = max(1, len(docs) // PER_PARTITION)
    (directory / "bucket").mkdir()
    # One counter for both devices: a sync's bytes are its uploads and downloads.
    bucket = CountingStore(FolderStore(directory / "bucket"))
    engines = [SyncEngine(bucket) for _ in range(2)]
    repos = [
        await Repository.open(directory / f"dev{i}", hooks=e.hooks()) for i, e in enumerate(engines)
    ]
    try:
        for e, r in zip(engines, repos, strict=True):
            await e.start(r, background=False)
        a = await DocumentStore.open(await repos[0].ledger(LEDGER).page(PAGE))
        await a.declare_index(COLLECTION, INDEX, "k", "v")

        ids: list[str] = []
        marks: list[int] = []  # the last piece each batch stored (for the floor)
        before = written_mib()
        seconds, cpu = await _insert(a, docs, args.batch, ids, marks)
        out["insert_written_MiB"] = written_since(before)
        out["insert_cpu_s"] = round(cpu, 3)
        out["insert_s"] = round(seconds, 3)
        out["insert_per_s"] = round(len(docs) / seconds)
        firsts = [parse_ulid(ids[i]) for i in range(0, len(ids), args.batch)]
        floor = _floor(a.page.db.path, marks, firsts, directory / "floor.sqlite")
        out["storage_floor_s"] = round(floor, 3)
        out["pieces_alone"] = pieces_alone(a.page.db.path, marks, directory)

        lat = []
        for doc_id in [ids[rng.randrange(len(ids))] for _ in range(args.gets)]:
            t0 = time.perf_counter()
            await a.get(COLLECTION, doc_id)
            lat.append(time.perf_counter() - t0)
        out["get"] = latency(lat)

        lat = []
        returned = 0
        for _ in range(args.queries):
            k = rng.randrange(parts)
            t0 = time.perf_counter()
            res = await a.query(COLLECTION, INDEX, k, limit=PER_PARTITION)
            lat.append(time.perf_counter() - t0)
            returned += len(res.items)
        out["query"] = latency(lat)
        out["query_docs_mean"] = round(returned / args.queries, 1)

        bucket.reset()
        with timed() as t:
            await engines[0].sync()
            b = await DocumentStore.open(await repos[1].ledger(LEDGER).page(PAGE))
            with StallMeter() as stall:
                await engines[1].sync()
        out["first_sync_s"] = round(t.seconds, 3)
        out["first_sync"] = _traffic(bucket)
        out["b_sync_longest_loop_stall_ms"] = round(stall.longest * 1000, 1)
        with timed() as t, StallMeter() as stall:
            await b.refresh()
            first = await b.query(COLLECTION, INDEX, 0, limit=PER_PARTITION)
        out["b_index_build_s"] = round(t.seconds, 3)
        out["b_index_build_longest_loop_stall_ms"] = round(stall.longest * 1000, 1)
        assert len(first.items) == min(PER_PARTITION, len(docs)), len(first.items)

        changes = _changed(docs, args.changed)
        with timed() as t:
            for i, k, v in changes:
                await a.replace(COLLECTION, ids[i], {**docs[i], "k": k, "v": v})
        out["change_writes_s"] = round(t.seconds, 3)
        bucket.reset()
        with timed() as t:
            await engines[0].sync()
            await engines[1].sync()
        out["change_sync_s"] = round(t.seconds, 3)
        out["change_sync"] = _traffic(bucket)
        i, k, v = changes[0]
        with timed() as t:
            res = await b.query(COLLECTION, INDEX, k, limit=PER_PARTITION * 10)
        out["catch_up_first_query_s"] = round(t.seconds, 4)
        assert any(d.id == ids[i] and d.data["v"] == v for d in res.items), "change not seen"
        with timed() as t:
            await b.query(COLLECTION, INDEX, k, limit=PER_PARTITION * 10)
        out["catch_up_second_query_s"] = round(t.seconds, 4)
        await a.close()
        await b.close()
    finally:
        for e in engines:
            await e.stop()
        for r in repos:
            await r.close()
    return out


def _traffic(bucket: CountingStore) -> dict[str, int]:
    """What a sync of both devices moved: requests and bytes, up and down."""
    return {
        "bytes_up": bucket.bytes_put,
        "bytes_down": bucket.bytes_got,
        "requests": sum(bucket.counts.values()),
    }


async def _insert(
    a: DocumentStore,
    docs: list[dict[str, Any]],
    batch: int,
    ids: list[str] | None = None,
    marks: list[int] | None = None,
) -> tuple[float, float]:
    """Insert ``docs`` in batches: (seconds, CPU seconds) of the inserts alone; the new
    ids into ``ids`` and the last piece each batch stored into ``marks``, if given."""
    seconds = cpu = 0.0
    for i in range(0, len(docs), batch):
        c0 = time.process_time()
        with timed() as t:
            made = await a.create_many(COLLECTION, docs[i : i + batch])
        cpu += time.process_time() - c0
        seconds += t.seconds
        if ids is not None:
            ids.extend(d.id for d in made)
        if marks is not None:
            marks.append(await last_piece(a.page))
    # Index rows held in memory between the commits that store them count too.
    c0 = time.process_time()
    with timed() as t:
        await a.refresh()
    cpu += time.process_time() - c0
    return seconds + t.seconds, cpu


async def _ours_insert_only(
    directory: Path, args: argparse.Namespace, docs: list[Any], index: bool = True
) -> tuple[float, float]:
    """One more round of the inserts alone, set up as in :func:`_ours` (a device of a
    folder bucket, the index declared first unless not ``index``): their seconds and
    CPU seconds."""
    (directory / "bucket").mkdir()
    engine = SyncEngine(FolderStore(directory / "bucket"))
    repo = await Repository.open(directory / "dev", hooks=engine.hooks())
    try:
        await engine.start(repo, background=False)
        a = await DocumentStore.open(await repo.ledger(LEDGER).page(PAGE))
        if index:
            await a.declare_index(COLLECTION, INDEX, "k", "v")
        seconds, cpu = await _insert(a, docs, args.batch)
        await a.close()
    finally:
        await engine.stop(final_upload_timeout=0)  # nothing of it is measured
        await repo.close()
    return seconds, cpu


def _ours_insert_child(
    docs_json: Path, at: Path, args: argparse.Namespace, index: bool
) -> dict[str, float]:
    """One more round of our inserts alone, in a fresh Python process (as each of
    PouchDB's rounds runs in a fresh node): ``insert_s`` and ``insert_cpu_s``."""
    gc_flag = ["--default-gc"] if args.default_gc else []
    if not index:
        gc_flag.append("--no-index")
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.docs",
            *gc_flag,
            "--batch",
            str(args.batch),
            "--insert-child",
            str(docs_json),
            str(at),
        ],
        check=True,
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    doc: dict[str, float] = json.loads(res.stdout)
    return doc


def _insert_child_main(docs_json: Path, at: Path, args: argparse.Namespace) -> None:
    docs = json.loads(docs_json.read_text())  # after tune_gc, as in the main run
    seconds, cpu = asyncio.run(_ours_insert_only(at, args, docs, not args.no_index))
    json.dump({"insert_s": seconds, "insert_cpu_s": cpu}, sys.stdout)


def _floor(source_path: Path, marks: list[int], firsts: list[bytes], path: Path) -> float:
    """The storage floor of the inserts: bare SQLite storing each batch's pieces
    (bodies and tree nodes) and index rows, a transaction per batch."""
    source = sqlite3.connect(f"file:{source_path}?mode=ro", uri=True)
    try:
        rows = []
        for lo, hi in zip(firsts, [*firsts[1:], None], strict=True):
            where = "ix IN (SELECT id FROM doc_indexes) AND doc >= ?"
            params: tuple[bytes, ...] = (lo,) if hi is None else (lo, hi)
            if hi is not None:
                where += " AND doc < ?"
            rows.append(
                source.execute(
                    f"SELECT ix, doc, key, deleted FROM doc_index_rows WHERE {where}", params
                ).fetchall()
            )
        pieces = list(pieces_between(source, marks))
    finally:
        source.close()

    def also(db: sqlite3.Connection, i: int) -> None:
        sql.insert_rows(db, docindex.INSERT_ROWS, rows[i])

    return storage_floor(path, pieces, schema=schema.create_doc_index_schema, also=also)


# -- PouchDB ----------------------------------------------------------------------

POUCH_SCRIPT = (
    WRITTEN_JS
    + r"""
const PouchDB = require('pouchdb');
PouchDB.plugin(require('pouchdb-find'));
const fs = require('fs');
const [docsPath, changesPath, dbPath, batchArg, getsArg, queriesArg, perArg] =
  process.argv.slice(2);
const batch = parseInt(batchArg, 10), gets = parseInt(getsArg, 10);
const queries = parseInt(queriesArg, 10), per = parseInt(perArg, 10);
const docs = JSON.parse(fs.readFileSync(docsPath, 'utf8'));
const changes = JSON.parse(fs.readFileSync(changesPath, 'utf8'));
const parts = Math.max(1, Math.floor(docs.length / per));
const now = () => Number(process.hrtime.bigint()) / 1e9;
function latency(lat) {
  lat.sort((a, b) => a - b);
  const mean = lat.reduce((a, b) => a + b, 0) / lat.length;
  const r = (x) => Math.round(x * 1e8) / 100;
  return {mean_us: r(mean), p50_us: r(lat[Math.floor(lat.length / 2)]),
          p99_us: r(lat[Math.floor(lat.length * 0.99)])};
}
const hwm = () => parseInt(
  /VmHWM:\s+(\d+) kB/.exec(fs.readFileSync('/proc/self/status', 'utf8'))[1], 10);
const pick = (n) => Math.floor(Math.random() * n);
(async () => {
  const db = new PouchDB(dbPath);
  await db.createIndex({index: {fields: ['k', 'v'], name: 'by_k', ddoc: 'by_k'}});
  const ids = docs.map((d, i) => 'doc' + String(i).padStart(8, '0'));
  const revs = new Array(docs.length);
  const cpu0 = process.cpuUsage();
  const written0 = writtenMiB();
  let t0 = now();
  for (let i = 0; i < docs.length; i += batch) {
    const part = docs.slice(i, i + batch).map((d, j) => ({_id: ids[i + j], ...d}));
    const res = await db.bulkDocs(part);
    res.forEach((r, j) => { revs[i + j] = r.rev; });
  }
  const insert = now() - t0;
  const cpu = process.cpuUsage(cpu0);
  const written = written0 === null ? null : Math.round((writtenMiB() - written0) * 10) / 10;
  let lat = [];
  for (let j = 0; j < gets; j++) {
    const id = ids[pick(ids.length)];
    t0 = now();
    await db.get(id);
    lat.push(now() - t0);
  }
  const get = latency(lat);
  lat = [];
  let returned = 0;
  const sel = (k) => ({selector: {k: k, v: {$gte: 0}}, sort: [{k: 'asc'}, {v: 'asc'}],
                       use_index: 'by_k', limit: per});
  t0 = now();
  await db.find(sel(0));  // PouchDB builds an index on its first query after writes
  const buildFirstQuery = now() - t0;
  for (let j = 0; j < queries; j++) {
    const k = pick(parts);
    t0 = now();
    const res = await db.find(sel(k));
    lat.push(now() - t0);
    returned += res.docs.length;
  }
  const query = latency(lat);
  const changed = changes.map(([i, k, v]) => ({_id: ids[i], _rev: revs[i], ...docs[i], k, v}));
  t0 = now();
  await db.bulkDocs(changed);
  const changeWrites = now() - t0;
  const [i0, k0, v0] = changes[0];
  const big = {...sel(k0), limit: per * 10};
  t0 = now();
  const res = await db.find(big);
  const catchUp = now() - t0;
  if (!res.docs.some((d) => d._id === ids[i0] && d.v === v0)) throw new Error('change not seen');
  t0 = now();
  await db.find(big);
  const second = now() - t0;
  const explain = await db.explain(sel(0));
  await db.close();
  process.stdout.write(JSON.stringify({
    version: PouchDB.version, adapter: db.adapter, index_used: explain.index.name,
    insert_s: insert, insert_per_s: Math.round(docs.length / insert), insert_written_MiB: written,
    insert_cpu_s: Math.round((cpu.user + cpu.system) / 1e3) / 1e3, get,
    index_build_first_query_s: buildFirstQuery, query,
    query_docs_mean: returned / queries, change_writes_s: changeWrites,
    catch_up_first_query_s: catchUp, catch_up_second_query_s: second,
    // Not resourceUsage().maxRSS: a child's starts from its parent's at fork.
    peak_rss_MiB: Math.round(hwm() / 102.4) / 10}));
})().catch((e) => { console.error(e); process.exit(1); });
"""
)


POUCH_INSERT_SCRIPT = r"""
const PouchDB = require('pouchdb');
PouchDB.plugin(require('pouchdb-find'));
const fs = require('fs');
const [docsPath, dbPath, batchArg, indexArg] = process.argv.slice(2);
const batch = parseInt(batchArg, 10);
const docs = JSON.parse(fs.readFileSync(docsPath, 'utf8'));
const now = () => Number(process.hrtime.bigint()) / 1e9;
(async () => {
  const db = new PouchDB(dbPath);
  if (indexArg !== 'noindex') {
    await db.createIndex({index: {fields: ['k', 'v'], name: 'by_k', ddoc: 'by_k'}});
  }
  await db.info();  // the database opened (PouchDB opens it at its first call) untimed
  const ids = docs.map((d, i) => 'doc' + String(i).padStart(8, '0'));
  const cpu0 = process.cpuUsage();
  const t0 = now();
  for (let i = 0; i < docs.length; i += batch) {
    await db.bulkDocs(docs.slice(i, i + batch).map((d, j) => ({_id: ids[i + j], ...d})));
  }
  const insert = now() - t0;
  const cpu = process.cpuUsage(cpu0);
  await db.close();
  process.stdout.write(JSON.stringify({
    insert_s: insert, insert_cpu_s: (cpu.user + cpu.system) / 1e6}));
})().catch((e) => { console.error(e); process.exit(1); });
"""
"""PouchDB's part of one more round of the inserts alone (as in POUCH_SCRIPT)."""


def _rounds(
    directory: Path,
    args: argparse.Namespace,
    first: dict[str, float] | None,
    index: bool = True,
) -> list[dict[str, Any]]:
    """The insert seconds and CPU seconds of ``first`` (the main run's, if given:
    ``ours_s``, ``ours_cpu_s``, ``pouchdb_s``, ``pouchdb_cpu_s``) and of
    ``--insert-rounds`` more rounds of the inserts alone (the index declared first on
    both sides, or with no ``index`` on either), each side into a new database (removed
    after it), the side that goes first alternating; with each round's rate ratio and
    CPU ratio (ours over PouchDB's). A round PouchDB failed says why, with no ratio."""
    work = directory / "pouchdb"
    rounds: list[dict[str, Any]] = [] if first is None else [dict(first)]
    for r in range(args.insert_rounds):
        this: dict[str, Any] = {"first": "ours" if r % 2 else "pouchdb"}
        for side in (0, 1) if r % 2 else (1, 0):
            at = directory / f"round{r}-{side}-{int(index)}"
            at.mkdir()
            if side == 0:
                got = _ours_insert_child(work / "docs.json", at, args, index)
                this["ours_s"], this["ours_cpu_s"] = got["insert_s"], got["insert_cpu_s"]
            else:
                more = [] if index else ["noindex"]
                doc = run_node(
                    work,
                    POUCH_INSERT_SCRIPT,
                    ["docs.json", str(at / "db"), str(args.batch), *more],
                )
                if "skipped" in doc:
                    this["failed"] = doc["skipped"]
                else:
                    this["pouchdb_s"], this["pouchdb_cpu_s"] = doc["insert_s"], doc["insert_cpu_s"]
            shutil.rmtree(at)
        rounds.append(this)
    for pair in rounds:
        if "pouchdb_s" in pair and pair["ours_s"] > 0:
            pair["rate_ratio"] = ratio(pair["pouchdb_s"], pair["ours_s"])
            pair["cpu_ratio"] = ratio(pair["ours_cpu_s"], pair["pouchdb_cpu_s"])
        for key in ("ours_s", "pouchdb_s", "ours_cpu_s", "pouchdb_cpu_s"):
            if key in pair:
                pair[key] = round(pair[key], 3)
    return rounds


def _pouchdb(directory: Path, args: argparse.Namespace, docs: list[dict[str, Any]]) -> Any:
    """PouchDB's figures, or ``{"skipped": why}``."""
    work = directory / "pouchdb"
    why = install_pouchdb(work, "pouchdb-find@9")
    if why is not None:
        return {"skipped": why}
    (work / "docs.json").write_text(json.dumps(docs))
    (work / "changes.json").write_text(json.dumps(_changed(docs, args.changed)))
    params = [str(args.batch), str(args.gets), str(args.queries), str(PER_PARTITION)]
    doc = run_node(
        work, POUCH_SCRIPT, ["docs.json", "changes.json", str(work / "db"), *params], 3600
    )
    if "skipped" in doc:
        return doc
    doc["insert_with_index_per_s"] = round(
        len(docs) / (doc["insert_s"] + doc["index_build_first_query_s"])
    )
    for key in ("insert_s", "change_writes_s", "index_build_first_query_s"):
        doc[key] = round(doc[key], 3)
    for key in ("catch_up_first_query_s", "catch_up_second_query_s"):
        doc[key] = round(doc[key], 4)
    return doc


# -- main -------------------------------------------------------------------------


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 2) if values else None


def _sync_ratios(ours: dict[str, Any]) -> dict[str, Any]:
    """The sync of ``--changed`` documents against the first sync of all of them, in
    time and bytes (both directions), and with each side's index catch-up counted."""
    first, change = ours["first_sync"], ours["change_sync"]
    return {
        "change_sync_time_vs_first": ratio(ours["change_sync_s"], ours["first_sync_s"]),
        "change_sync_bytes_vs_first": ratio(
            change["bytes_up"] + change["bytes_down"], first["bytes_up"] + first["bytes_down"]
        ),
        "change_sync_and_catch_up_vs_first_sync_and_build": ratio(
            ours["change_sync_s"] + ours["catch_up_first_query_s"],
            ours["first_sync_s"] + ours["b_index_build_s"],
        ),
    }


def _report(
    args: argparse.Namespace,
    ours: dict[str, Any],
    pouch: dict[str, Any],
    rounds: list[dict[str, Any]],
    plain: list[dict[str, Any]],
) -> Any:
    ratios: dict[str, Any] = _sync_ratios(ours)
    if "skipped" not in pouch:
        ratios |= {
            # The same work on both sides: no index declared on either.
            "insert_rate_vs_pouchdb_no_index": _median(
                [r["rate_ratio"] for r in plain if "rate_ratio" in r]
            ),
            # The median over the rounds (the main run's and --insert-rounds more): one
            # pair of runs on a shared machine swung from 0.88 to 1.69.
            "insert_rate_vs_pouchdb": _median(
                [r["rate_ratio"] for r in rounds if "rate_ratio" in r]
            ),
            "insert_rate_vs_pouchdb_main_run": ratio(ours["insert_per_s"], pouch["insert_per_s"]),
            # The CPU time of the inserts (every thread of the process, both sides): on a
            # shared machine, less at the mercy of what else runs than the rates are.
            "insert_cpu_vs_pouchdb": ratio(ours["insert_cpu_s"], pouch["insert_cpu_s"]),
            "insert_cpu_vs_pouchdb_rounds": _median(
                [r["cpu_ratio"] for r in rounds if "cpu_ratio" in r]
            ),
            # Storing the inserts' pieces and index rows alone, in bare SQLite, against
            # PouchDB's whole insert time: what is left for everything else.
            "storage_floor_time_vs_pouchdb_insert_time": ratio(
                ours["storage_floor_s"], pouch["insert_s"]
            ),
            # PouchDB's bulkDocs leave the index alone (its first find builds it); ours
            # keep it up to date: the rate with the index built, on both sides.
            "insert_with_index_rate_vs_pouchdb": ratio(
                ours["insert_per_s"], pouch["insert_with_index_per_s"]
            ),
            "get_p50_vs_pouchdb": ratio(ours["get"]["p50_us"], pouch["get"]["p50_us"]),
            "query_p50_vs_pouchdb": ratio(ours["query"]["p50_us"], pouch["query"]["p50_us"]),
            "catch_up_vs_pouchdb": ratio(
                ours["catch_up_first_query_s"], pouch["catch_up_first_query_s"]
            ),
        }
    return {
        "docs": args.docs,
        "fields": 5,
        "gc": "CPython's defaults" if args.default_gc else "the daemon's (tune_gc)",
        "batch": args.batch,
        "changed": args.changed,
        "gets": args.gets,
        "queries": args.queries,
        "docs_per_query": PER_PARTITION,
        "ours": ours,
        "pouchdb": pouch,
        "insert_rounds": rounds,
        "plain_insert_rounds": plain,
        "ratios": ratios,
        "targets": {
            "change_sync_time_vs_first": "<= 0.2",
            "change_sync_bytes_vs_first": "<= 0.2",
            "change_sync_and_catch_up_vs_first_sync_and_build": "(the same, indexes counted)",
            "insert_rate_vs_pouchdb": ">= 1.2 (issue 42; ours also maintains the index)",
            "insert_rate_vs_pouchdb_no_index": ">= 1.2 (issue 42; the same work on both sides)",
            "insert_rate_vs_pouchdb_main_run": "(one round of those above)",
            "insert_cpu_vs_pouchdb": "<= 1 (not the issue's figure: a cross-check)",
            "insert_cpu_vs_pouchdb_rounds": "(the same, the median over the rounds)",
            "storage_floor_time_vs_pouchdb_insert_time": "(the floor: not a target)",
            "insert_with_index_rate_vs_pouchdb": ">= 1",
            "get_p50_vs_pouchdb": "<= 1",
            "query_p50_vs_pouchdb": "<= 1",
            "catch_up_vs_pouchdb": "<= 1",
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--changed", type=int, default=1000)
    ap.add_argument("--gets", type=int, default=5000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--no-pouchdb", action="store_true")
    ap.add_argument(
        "--insert-rounds", type=int, default=4, help="more rounds of the inserts alone, both sides"
    )
    ap.add_argument("--default-gc", action="store_true", help="not the daemon's GC settings")
    ap.add_argument("--insert-child", nargs=2, metavar=("DOCS_JSON", "DIR"), help=argparse.SUPPRESS)
    ap.add_argument("--no-index", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if not args.default_gc:
        tune_gc()
    if args.insert_child:
        _insert_child_main(Path(args.insert_child[0]), Path(args.insert_child[1]), args)
        return
    docs = _docs(args.docs)
    with tempfile.TemporaryDirectory() as d:
        directory = Path(d)
        ours = asyncio.run(_ours(directory, args, docs))
        ours["peak_rss_MiB"] = round(peak_rss_mib(), 1)
        if args.no_pouchdb:
            pouch: dict[str, Any] = {"skipped": "--no-pouchdb"}
        else:
            pouch = _pouchdb(directory, args, docs)
        rounds: list[dict[str, Any]] = []
        plain: list[dict[str, Any]] = []
        if "skipped" not in pouch:
            first = {
                "ours_s": ours["insert_s"],
                "ours_cpu_s": ours["insert_cpu_s"],
                "pouchdb_s": pouch["insert_s"],
                "pouchdb_cpu_s": pouch["insert_cpu_s"],
            }
            rounds = _rounds(directory, args, first)
            plain = _rounds(directory, args, None, index=False)
    emit("docs", _report(args, ours, pouch, rounds, plain))


if __name__ == "__main__":
    main()
