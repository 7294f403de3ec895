"""Daemon benchmark: single-key puts/gets over the socket, and batch writes.

    python -m bench.daemon [--ops 2000] [--concurrency 16] [--rounds 3]

Prints JSON. The real daemon runs as a subprocess; next to it, in the same run,
a bare aiohttp server on a Unix socket answers the same requests by echoing the
bytes (PUT reads the body, GET returns 100 bytes): the ratio of the two is the
figure (target >= 0.5). Batch writes report entries per second for 100-byte
values (target >= 100,000): random values, the same value in every entry (so one
value piece is stored per batch), and the floor: bare SQLite storing just the
random values' pieces, batch by batch, with the page schema. The daemon's CPU
during the random batches is split between its event loop's thread and the others.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from yarl import URL

from bench.common import emit, storage_floor
from ledgerd.store import digest as dg

ROOT = Path(__file__).resolve().parents[1]
VALUE = b"v" * 100

ECHO_SERVER = """
import sys
from aiohttp import web
body = b"v" * 100
async def put(request):
    await request.read()
    return web.Response(status=204)
async def get(request):
    return web.Response(body=body, content_type="application/octet-stream")
app = web.Application()
app.router.add_put("/{tail:.*}", put)
app.router.add_get("/{tail:.*}", get)
web.run_app(app, path=sys.argv[1], print=None, access_log=None)
"""


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=10_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ldb-", dir="/tmp") as d:
        base = Path(d)
        env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERD_")}
        daemon = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "daemon",
                "--data-dir",
                str(base / "data"),
                "--socket",
                str(base / "ledgerd.sock"),
                "--log-level",
                "warning",
            ],
            cwd=ROOT,
            env=env,
        )
        echo = subprocess.Popen([sys.executable, "-c", ECHO_SERVER, str(base / "echo.sock")])
        try:
            _wait_for_socket(base / "ledgerd.sock", daemon)
            _wait_for_socket(base / "echo.sock", echo)
            # Rounds alternate between the two servers, so that a drift in the
            # machine's speed (it is shared) hits both alike; each ratio is the
            # median of the per-round ratios.
            bares: list[dict[str, Any]] = []
            ourss: list[dict[str, Any]] = []
            for r in range(args.rounds):
                page = f"/v1/ledgers/b/pages/p{r}"
                bares.append(
                    asyncio.run(_single(base / "echo.sock", args.ops, args.concurrency, page))
                )
                ourss.append(
                    asyncio.run(_single(base / "ledgerd.sock", args.ops, args.concurrency, page))
                )
            distinct = _batch_bodies(args.batches, args.batch_size, distinct=True)
            same = _batch_bodies(args.batches, args.batch_size, distinct=False)
            cpu0 = _thread_cpu(daemon.pid)
            batch_s = asyncio.run(_batch(base / "ledgerd.sock", "distinct", distinct))
            batch_cpu = _cpu_split(daemon.pid, cpu0, _thread_cpu(daemon.pid))
            same_s = asyncio.run(_batch(base / "ledgerd.sock", "same", same))
            floor_s = storage_floor(base / "floor.sqlite", _value_rows(distinct))
        finally:
            for p in (daemon, echo):
                p.send_signal(signal.SIGTERM)
                p.wait(60)
    entries = args.batches * args.batch_size
    rates = [k for k in ourss[0] if k.endswith("ops_per_s")]
    ratios = {
        f"{k}_ratio": round(
            statistics.median(o[k] / b[k] for o, b in zip(ourss, bares, strict=True)), 3
        )
        for k in rates
    }
    ours = {k: statistics.median(o[k] for o in ourss) for k in ourss[0]}
    bare = {k: statistics.median(b[k] for b in bares) for k in bares[0]}
    emit(
        "daemon",
        {
            "ops": args.ops,
            "concurrency": args.concurrency,
            "rounds": args.rounds,
            "ledgerd": ours,
            "bare_aiohttp_echo": bare,
            **ratios,
            "ratios_per_round": {
                k: [round(o[k] / b[k], 3) for o, b in zip(ourss, bares, strict=True)] for k in rates
            },
            "target_single_op_ratio": 0.5,
            "batch_entries_per_s": round(entries / batch_s),
            "batch_s": round(batch_s, 2),
            "batch_daemon_cpu": batch_cpu,
            "batch_same_value_entries_per_s": round(entries / same_s),
            "value_storage_floor_entries_per_s": round(entries / floor_s),
            "batch_size": args.batch_size,
            "target_batch_entries_per_s": 100_000,
        },
    )


if __name__ == "__main__":
    main()
