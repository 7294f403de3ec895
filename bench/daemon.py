"""Daemon benchmark: single-key puts/gets over the socket, and batch writes.

    python -m bench.daemon [--ops 2000] [--concurrency 16] [--rounds 3]
                           [--batches 10] [--batch-size 10000]

Prints JSON. The real daemon runs as a subprocess; next to it, in the same run, two
bare aiohttp servers on Unix sockets answer the same requests (each a subprocess too):

* ``sqlite_server``, the floor that does the same work: PUT stores the value under its
  key in SQLite (:func:`bench.common.raw_kv`: a ``WITHOUT ROWID`` table, a file per
  page, the page writer's page size, WAL and pragmas, so the same durability; a commit
  per put), GET reads it back, a batch decodes the JSON and its base64 and stores
  every entry in one transaction. The ratios against it are the figures.
* ``echo``, the transport alone: PUT reads the body, GET returns 100 bytes.

Each round runs the three servers one after another, the one that goes first turning
round by round; a figure is the median of the rounds' ratios (ours over the server's
rate: higher is better; target >= 0.5 against the echo). Batch writes report entries
per second for 100-byte values (target >= 100,000): random values, the same value in
every entry (so one value piece is stored per batch), the SQLite server's batches,
and the value-piece floor: bare SQLite storing just the random values' pieces, batch
by batch, with the page schema (no keys, no tree). The daemon's CPU during its
random batches is split between its event loop's thread and the others.

Batches also run against a third bare server, ``pieces_server``: the floor issue 42
defines, which does a batch's work without ledgerd. It decodes the JSON and the
base64, hashes each value stored as a piece of its own (SHA-256: one of over
``INLINE_LIMIT`` bytes; a smaller one is carried in the tree's leaves) and stores, in
one transaction of bare SQLite with the page's schema, those pieces and the tree nodes
the daemon's commit of the same batch stores (the nodes of each batch are made
beforehand by an embedded page given the same batches, and handed to the server when it
starts: their count and sizes are the daemon's; building them is ours, not the
floor's). Its ratio is the
target's figure (>= 0.5); the SQLite server's, which stores keys and values in a
plain table with no hashing and no tree, stays beside it as the stricter anchor.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import pickle
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from yarl import URL

from bench.common import emit, raw_kv, storage_floor
from ledgerd.store.pieces import digest as dg

ROOT = Path(__file__).resolve().parents[1]
VALUE = b"v" * 100


def _serve_echo(sock: str) -> None:
    body = b"v" * 100

    async def put(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(status=204)

    async def get(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/octet-stream")

    app = web.Application()
    app.router.add_put("/{tail:.*}", put)
    app.router.add_get("/{tail:.*}", get)
    web.run_app(app, path=sock, print=None, access_log=None)


def _serve_pieces(sock: str, directory: Path, nodes_file: Path) -> None:
    """Issue 42's batch floor: decode, hash, and store the values' pieces (of the values
    stored as pieces, over ``INLINE_LIMIT`` bytes) and the tree nodes of the daemon's
    commit of the same batch (``nodes_file``: a list per batch, in order; they carry the
    smaller values) in bare SQLite with the page's schema, a transaction per batch."""
    import hashlib
    import pickle

    from bench.common import bare_sqlite
    from ledgerd.store.sqlite.schema import LOCAL, SYNCED, create_page_schema
    from ledgerd.store.sqlite.sql import put_pieces

    nodes: list[list[tuple[bytes, bytes]]] = pickle.loads(nodes_file.read_bytes())
    pages: dict[str, tuple[sqlite3.Connection, list[int]]] = {}
    sha256, kind, limit = hashlib.sha256, bytes([dg.Kind.VALUE]), dg.INLINE_LIMIT

    async def batch(request: web.Request) -> web.Response:
        name = f"{request.match_info['ledger']}-{request.match_info['page']}"
        if name not in pages:
            db = bare_sqlite(directory / f"{name}.sqlite")
            create_page_schema(db)
            pages[name] = (db, [0])
        db, count = pages[name]
        ops = json.loads(await request.read())["ops"]
        entries = [(base64.b64decode(op["key"]), base64.b64decode(op["value"])) for op in ops]
        values = [(kind + sha256(v).digest(), v) for _, v in entries if len(v) > limit]
        db.execute("BEGIN IMMEDIATE")
        put_pieces(db, nodes[count[0] % len(nodes)], SYNCED)
        put_pieces(db, values, LOCAL)
        db.execute("COMMIT")
        count[0] += 1
        return web.json_response({"applied": len(entries)})

    app = web.Application(client_max_size=64 * 2**20)
    app.router.add_post("/v1/ledgers/{ledger}/pages/{page}/batch", batch)
    web.run_app(app, path=sock, print=None, access_log=None)


def _serve_sqlite(sock: str, directory: Path) -> None:
    """The floor that does the daemon's work with nothing of ours: keys and values in
    SQLite (:func:`bench.common.raw_kv`), a database file per page as the daemon keeps."""
    pages: dict[str, sqlite3.Connection] = {}

    def page(request: web.Request) -> sqlite3.Connection:
        name = f"{request.match_info['ledger']}-{request.match_info['page']}"
        if name not in pages:
            pages[name] = raw_kv(directory / f"{name}.sqlite")
        return pages[name]

    async def put(request: web.Request) -> web.Response:
        value = await request.read()
        key = request.match_info["key"].encode()
        page(request).execute("INSERT OR REPLACE INTO kv VALUES (?, ?)", (key, value))
        return web.Response(status=204)

    async def get(request: web.Request) -> web.Response:
        key = request.match_info["key"].encode()
        row = page(request).execute("SELECT value FROM kv WHERE key = ?", (key,)).fetchone()
        if row is None:
            raise web.HTTPNotFound()
        return web.Response(body=row[0], content_type="application/octet-stream")

    async def batch(request: web.Request) -> web.Response:
        ops = json.loads(await request.read())["ops"]
        rows = [(base64.b64decode(op["key"]), base64.b64decode(op["value"])) for op in ops]
        db = page(request)
        db.execute("BEGIN IMMEDIATE")
        db.executemany("INSERT OR REPLACE INTO kv VALUES (?, ?)", rows)
        db.execute("COMMIT")
        return web.json_response({"applied": len(rows)})

    at = "/v1/ledgers/{ledger}/pages/{page}"
    app = web.Application(client_max_size=64 * 2**20)  # the daemon's max_batch_bytes
    app.router.add_put(at + "/keys/{key}", put)
    app.router.add_get(at + "/keys/{key}", get)
    app.router.add_post(at + "/batch", batch)
    web.run_app(app, path=sock, print=None, access_log=None)


def _wait_for_socket(path: Path, proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(str(path))
                return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError(f"{path} never accepted connections")


def _thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) of each thread of process ``pid`` (Linux /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[int, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        out[int(task.name)] = (int(fields[11]) + int(fields[12])) / tick
    return out


def _cpu_split(pid: int, before: dict[int, float], after: dict[int, float]) -> dict[str, float]:
    """CPU seconds between two samples: the event loop's thread (the main one, where
    every line of Python of a request runs) and all the others (SQLite's threads)."""
    used = {t: s - before.get(t, 0.0) for t, s in after.items()}
    return {
        "event_loop_thread_s": round(used.pop(pid, 0.0), 2),
        "other_threads_s": round(sum(used.values()), 2),
    }


def _pct(lat: list[float], q: float) -> float:
    lat = sorted(lat)
    return round(lat[min(len(lat) - 1, int(len(lat) * q))] * 1e6)


async def _single(sock: Path, ops: int, concurrency: int, prefix: str) -> dict[str, Any]:
    conn = aiohttp.UnixConnector(path=str(sock), limit=concurrency)
    out: dict[str, Any] = {}
    async with aiohttp.ClientSession(connector=conn) as http:

        async def one(method: str, i: int, lat: list[float]) -> None:
            url = URL(f"http://ledgerd{prefix}/keys/k{i:08d}", encoded=True)
            t0 = time.perf_counter()
            if method == "PUT":
                async with http.put(url, data=VALUE) as r:
                    assert r.status == 204, r.status
            else:
                async with http.get(url) as r:
                    assert r.status == 200, r.status
                    await r.read()
            lat.append(time.perf_counter() - t0)

        for method in ("PUT", "GET"):
            lat: list[float] = []
            t0 = time.perf_counter()
            for i in range(ops):  # one at a time: latency
                await one(method, i, lat)
            seq = time.perf_counter() - t0
            out[f"{method.lower()}_sequential_ops_per_s"] = round(ops / seq)
            out[f"{method.lower()}_p50_us"] = _pct(lat, 0.5)
            out[f"{method.lower()}_p99_us"] = _pct(lat, 0.99)
            lat2: list[float] = []

            async def bounded(
                i: int,
                m: str = method,
                lt: list[float] = lat2,
                sem: asyncio.Semaphore = asyncio.Semaphore(concurrency),  # noqa: B008
            ) -> None:
                async with sem:
                    await one(m, ops + i, lt) if m == "PUT" else await one(m, i, lt)

            t0 = time.perf_counter()
            await asyncio.gather(*[bounded(i) for i in range(ops)])
            out[f"{method.lower()}_concurrent_ops_per_s"] = round(ops / (time.perf_counter() - t0))
    return out


def _batch_bodies(batches: int, size: int, distinct: bool) -> list[bytes]:
    """Request bodies of ``batches`` batch writes of ``size`` puts of 100-byte values:
    random values, or the same value everywhere (then one value piece is stored)."""
    bodies = []
    for b in range(batches):
        ops = [
            {
                "op": "put",
                "key": base64.b64encode(b"b%04d-%06d" % (b, i)).decode(),
                "value": base64.b64encode(os.urandom(100) if distinct else VALUE).decode(),
            }
            for i in range(size)
        ]
        bodies.append(json.dumps({"ops": ops}).encode())
    return bodies


async def _batch(sock: Path, page: str, bodies: list[bytes]) -> float:
    """Seconds to post the bodies one after another (built before timing: this is the
    daemon's rate, not the client's JSON encoder's)."""
    conn = aiohttp.UnixConnector(path=str(sock))
    url = URL(f"http://ledgerd/v1/ledgers/bench/pages/{page}/batch", encoded=True)
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(connector=conn) as http:
        t0 = time.perf_counter()
        for body in bodies:
            async with http.post(url, data=body, headers=headers) as r:
                assert r.status == 200, await r.text()
        return time.perf_counter() - t0


def _value_rows(bodies: list[bytes]) -> list[list[tuple[bytes, bytes]]]:
    """The value pieces each batch stores: one per distinct value."""
    out = []
    for body in bodies:
        values = {base64.b64decode(op["value"]) for op in json.loads(body)["ops"]}
        out.append([(dg.value_chunk_digest(v), v) for v in values])
    return out


async def _batch_nodes(directory: Path, bodies: list[bytes]) -> list[list[tuple[bytes, bytes]]]:
    """The tree nodes each batch's commit stores, made by an embedded page given the same
    batches as the daemon is (``page.write`` of the decoded changes, as ``Api.batch``)."""
    from bench.common import last_piece, pieces_between
    from ledgerd.daemon.codec import batch_body_changes
    from ledgerd.store import Repository

    marks: list[int] = []
    values: list[set[bytes]] = []
    async with await Repository.open(directory) as repo:
        page = await repo.ledger("bench").page("nodes")
        for body in bodies:
            changes, _ = batch_body_changes([body])
            values.append({dg.value_chunk_digest(c[1]) for c in changes})  # type: ignore[arg-type]
            await page.write(changes)
            marks.append(await last_piece(page))
        path = page.db.path
    source = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return [
            [(d, data) for d, data in stored if d not in values[i]]
            for i, stored in enumerate(pieces_between(source, marks))
        ]
    finally:
        source.close()


SIDES = ("ledgerd", "sqlite_server", "echo")
"""The servers of a round; :func:`_order` turns which goes first."""


def _order(r: int, sides: tuple[str, ...] = SIDES) -> tuple[str, ...]:
    """Round ``r``'s order: each side goes first in turn."""
    k = r % len(sides)
    return sides[k:] + sides[:k]


def _ratios(ours: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per rate, the median of the rounds' ratios (ours over theirs) and every round's."""
    out: dict[str, Any] = {}
    for k in (k for k in ours[0] if k.endswith("ops_per_s")):
        each = [round(o[k] / t[k], 3) for o, t in zip(ours, theirs, strict=True)]
        out[k] = {"median": round(statistics.median(each), 3), "rounds": each}
    return out


def _server(kind: str, sock: Path, *more: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "bench.daemon", "--serve", kind, str(sock), *more], cwd=ROOT
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=int, default=2000, help="single-key ops a round (%(default)s)")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3, help="paired rounds (%(default)s)")
    ap.add_argument("--batches", type=int, default=10, help="batches a round (%(default)s)")
    ap.add_argument("--batch-size", type=int, default=10_000)
    ap.add_argument("--serve", nargs="+", metavar="KIND SOCKET", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        kind, sock, *more = args.serve
        if kind == "echo":
            _serve_echo(sock)
        elif kind == "pieces":
            (Path(sock).parent / "pieces").mkdir()
            _serve_pieces(sock, Path(sock).parent / "pieces", Path(more[0]))
        else:
            (Path(sock).parent / "floor").mkdir()
            _serve_sqlite(sock, Path(sock).parent / "floor")
        return
    with tempfile.TemporaryDirectory(prefix="ldb-", dir="/tmp") as d:
        base = Path(d)
        distinct = _batch_bodies(args.batches, args.batch_size, distinct=True)
        same = _batch_bodies(args.batches, args.batch_size, distinct=False)
        nodes = asyncio.run(_batch_nodes(base / "nodes", distinct))
        (base / "nodes.pickle").write_bytes(pickle.dumps(nodes))
        socks = {side: base / f"{side}.sock" for side in (*SIDES, "pieces_server")}
        env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERD_")}
        procs = {
            "ledgerd": subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "daemon",
                    "--data-dir",
                    str(base / "data"),
                    "--socket",
                    str(socks["ledgerd"]),
                    "--log-level",
                    "warning",
                ],
                cwd=ROOT,
                env=env,
            ),
            "sqlite_server": _server("sqlite", socks["sqlite_server"]),
            "echo": _server("echo", socks["echo"]),
            "pieces_server": _server("pieces", socks["pieces_server"], str(base / "nodes.pickle")),
        }
        daemon = procs["ledgerd"]
        try:
            for side in procs:
                _wait_for_socket(socks[side], procs[side])
            # Rounds run the servers one after another, the first turning, so that a
            # drift in the machine's speed (it is shared) hits every side alike.
            single: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
            for r in range(args.rounds):
                page = f"/v1/ledgers/b/pages/p{r}"
                for side in _order(r):
                    single[side].append(
                        asyncio.run(_single(socks[side], args.ops, args.concurrency, page))
                    )
            batch_sides = ("ledgerd", "sqlite_server", "pieces_server")
            batch_s: dict[str, list[float]] = {side: [] for side in batch_sides}
            batch_cpu = []
            for r in range(args.rounds):
                for side in _order(r, batch_sides):
                    cpu0 = _thread_cpu(daemon.pid)
                    batch_s[side].append(asyncio.run(_batch(socks[side], f"d{r}", distinct)))
                    if side == "ledgerd":
                        batch_cpu.append(_cpu_split(daemon.pid, cpu0, _thread_cpu(daemon.pid)))
            same_s = asyncio.run(_batch(socks["ledgerd"], "same", same))
            floor_s = storage_floor(base / "floor.sqlite", _value_rows(distinct))
        finally:
            for p in procs.values():
                p.send_signal(signal.SIGTERM)
                p.wait(60)
    entries = args.batches * args.batch_size
    batch_ratios, floor_ratios = (
        [round(f / o, 3) for o, f in zip(batch_s["ledgerd"], batch_s[side], strict=True)]
        for side in ("sqlite_server", "pieces_server")
    )
    emit(
        "daemon",
        {
            "ops": args.ops,
            "concurrency": args.concurrency,
            "rounds": args.rounds,
            "order": [list(_order(r)) for r in range(args.rounds)],
            **{
                side: {k: statistics.median(x[k] for x in single[side]) for k in single[side][0]}
                for side in SIDES
            },
            "ratios_vs_sqlite_server": _ratios(single["ledgerd"], single["sqlite_server"]),
            "ratios_vs_echo": _ratios(single["ledgerd"], single["echo"]),
            "target_single_op_ratio_vs_echo": 0.5,
            "batch_entries_per_s": round(entries / statistics.median(batch_s["ledgerd"])),
            "batch_s_rounds": [round(x, 2) for x in batch_s["ledgerd"]],
            "batch_daemon_cpu_rounds": batch_cpu,
            "batch_sqlite_server_entries_per_s": round(
                entries / statistics.median(batch_s["sqlite_server"])
            ),
            "batch_ratio_vs_sqlite_server": {
                "median": round(statistics.median(batch_ratios), 3),
                "rounds": batch_ratios,
            },
            "batch_pieces_server_entries_per_s": round(
                entries / statistics.median(batch_s["pieces_server"])
            ),
            "batch_ratio_vs_pieces_server": {
                "median": round(statistics.median(floor_ratios), 3),
                "rounds": floor_ratios,
            },
            "batch_pieces_server_nodes_per_batch": round(statistics.mean(map(len, nodes)), 1),
            "target_batch_ratio_vs_pieces_server": 0.5,
            "batch_same_value_entries_per_s": round(entries / same_s),
            "value_storage_floor_entries_per_s": round(entries / floor_s),
            "batch_size": args.batch_size,
            "target_batch_entries_per_s": 100_000,
        },
    )


if __name__ == "__main__":
    main()
