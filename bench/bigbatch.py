"""Big-batch benchmark: the daemon's memory and event-loop stall for one large batch.

    python -m bench.bigbatch [--mib 16] [--rounds 3] [--big-mib 55] [--before DIR]

Prints JSON. Each round starts the real daemon as a subprocess on a temp socket,
warms it with a small batch, reads its idle RSS, then posts one batch whose JSON
body is N bytes (puts of random values of 1–64 KiB, base64 in JSON). Meanwhile the
daemon's VmRSS (``/proc/PID/status``) is sampled every 20 ms (the peak is kept), and
two probes each send a request every 25 ms on a connection of their own and record each
answer's latency. The loop-lag probe asks for a path no route has
(:data:`LOOP_PROBE_PATH`), which the daemon answers on its event loop alone: its
latency is the loop's stall, the target's figure. The health probe sends
``GET /v1/health``, which also reads SQLite on the shared thread pool: what a
liveness check sees, reported beside it. (The health probe also runs for a second
against the idle daemon first: the lag the shared machine alone causes.)

The floor, in the same round (which of the two goes first turns round by round):
``bench.daemon``'s bare SQLite server, in a subprocess too, given the same body: it
decodes the JSON and the base64 and stores every value in SQLite in one transaction.
Its RSS is sampled the same way. Figures: (peak − idle) / N for both (target for the
daemon: at most 3), the probes' max and p99, and the batch's time over the floor's.
``--big-mib`` adds one more round at that size (0: none). ``--before DIR`` runs, in
each round too, the daemon of an older commit (``DIR/ledgerd``: its ``daemon``,
``store`` and ``sync`` trees, e.g. from ``git archive``), for before/after figures.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp
from yarl import URL

from bench.common import emit
from bench.daemon import _wait_for_socket

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_S = 0.02
PROBE_S = 0.025
VALUES = (1024, 64 * 1024)
"""The sizes of a batch's values, at least and at most, by default."""
IDLE_PROBE_S = 1.0
"""How long the probe runs against the idle daemon first: the lag the machine alone
causes (it is shared), for comparison."""


def batch_body(n: int, seed: int, sizes: tuple[int, int] = VALUES) -> tuple[bytes, int]:
    """A batch body of about ``n`` bytes: puts of random values of ``sizes`` bytes (1–64
    KiB; and 16-byte keys), base64 in JSON; and how many ops it holds."""
    rng = random.Random(seed)
    parts: list[str] = []
    size = len('{"ops": []}')
    i = 0
    while size < n:
        value = rng.randbytes(rng.randint(*sizes))
        op = json.dumps(
            {
                "op": "put",
                "key": base64.b64encode(b"big-%012d" % i).decode(),
                "value": base64.b64encode(value).decode(),
            }
        )
        parts.append(op)
        size += len(op) + 2
        i += 1
    return ('{"ops": [' + ", ".join(parts) + "]}").encode(), i


def rss_bytes(pid: int) -> int:
    """VmRSS of process ``pid`` (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")


class RssSampler:
    """The peak VmRSS of a process, sampled every :data:`SAMPLE_S` on a thread (so a
    busy client loop does not skip samples)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = rss_bytes(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self.peak = max(self.peak, rss_bytes(self.pid))

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes(self.pid))


def _start(side: str, base: Path, before: Path | None) -> tuple[subprocess.Popen[bytes], Path]:
    sock = base / f"{side}.sock"
    if side.startswith("ledgerd"):
        env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERD_")}
        if side == "ledgerd_before" and before is not None:
            env["PYTHONPATH"] = str(before)
        cmd = [
            sys.executable,
            "-m",
            "daemon",
            "--data-dir",
            str(base / "data"),
            "--socket",
            str(sock),
            "--log-level",
            "warning",
        ]
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env)
    else:
        cmd = [sys.executable, "-m", "bench.daemon", "--serve", "sqlite", str(sock)]
        proc = subprocess.Popen(cmd, cwd=ROOT)
    _wait_for_socket(sock, proc, 60)
    return proc, sock


async def _post(http: aiohttp.ClientSession, page: str, body: bytes) -> None:
    url = URL(f"http://ledgerd/v1/ledgers/bench/pages/{page}/batch", encoded=True)
    async with http.post(url, data=body, headers={"Content-Type": "application/json"}) as r:
        assert r.status == 200, (await r.text())[:500]
        await r.read()


LOOP_PROBE_PATH = "/v1/loop-probe"
"""A path no route has: the daemon answers 404 on its event loop alone, so the latency
is the loop's lag (and HTTP's), with no work on a thread to wait for."""


async def _probe(
    sock: Path, lat: list[float], stop: asyncio.Event, path: str = "/v1/health"
) -> None:
    """``GET path`` every :data:`PROBE_S`, one at a time; each latency is kept."""
    url = URL(f"http://ledgerd{path}", encoded=True)
    async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(sock))) as http:
        while not stop.is_set():
            t0 = time.perf_counter()
            async with http.get(url) as r:
                await r.read()
            lat.append(time.perf_counter() - t0)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), PROBE_S)


async def _probe_child(sock: Path, path: str) -> None:
    """The probe process: probe ``path`` until a line arrives on stdin, then print the
    latencies (seconds) as JSON. A process of its own, so that the client's event loop,
    which blocks while it hands the big body to the socket (90 ms for 55 MB), is not in
    the figure."""
    stop = asyncio.Event()
    asyncio.get_running_loop().add_reader(sys.stdin.fileno(), stop.set)
    connector = aiohttp.UnixConnector(path=str(sock))
    async with (
        aiohttp.ClientSession(connector=connector) as http,
        http.get(URL(f"http://ledgerd{path}", encoded=True)) as r,
    ):
        await r.read()
    print("ready", flush=True)
    lat: list[float] = []
    await _probe(sock, lat, stop, path)
    print(json.dumps(lat), flush=True)


def _start_probe(sock: Path, path: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "bench.bigbatch", "--probe", str(sock), path]
    return subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def _wait_probing(probes: list[subprocess.Popen[str]]) -> None:
    """Until each probe process has had its first answer."""
    for proc in probes:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"


def _probe_result(proc: subprocess.Popen[str]) -> list[float]:
    out, _ = proc.communicate("stop\n", timeout=60)
    return sorted(json.loads(out))


async def _run_one(
    side: str, proc: subprocess.Popen[bytes], sock: Path, body: bytes
) -> dict[str, Any]:
    async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(sock))) as http:
        warm, _ = batch_body(64 * 1024, seed=1)
        await _post(http, "warm", warm)
        if side.startswith("ledgerd"):  # (its first answer imports what it uses)
            async with http.get(URL("http://ledgerd/v1/health", encoded=True)) as r:
                await r.read()
        await asyncio.sleep(0.5)
        idle = rss_bytes(proc.pid)
        idle_lat: list[float] = []
        if side.startswith("ledgerd"):  # the machine's own noise, for comparison
            idle_stop = asyncio.Event()
            asyncio.get_running_loop().call_later(IDLE_PROBE_S, idle_stop.set)
            await _probe(sock, idle_lat, idle_stop)
        probes = (
            [_start_probe(sock, "/v1/health"), _start_probe(sock, LOOP_PROBE_PATH)]
            if side.startswith("ledgerd")
            else []
        )
        if probes:  # each has answered once: both are running
            await asyncio.to_thread(_wait_probing, probes)
        with RssSampler(proc.pid) as rss:
            t0 = time.perf_counter()
            await _post(http, "big", body)
            took = time.perf_counter() - t0
        lat, loop_lat = ([], []) if not probes else map(_probe_result, probes)
    out: dict[str, Any] = {
        "idle_rss_mib": round(idle / 2**20, 1),
        "peak_rss_mib": round(rss.peak / 2**20, 1),
        "rise_per_byte": round((rss.peak - idle) / len(body), 2),
        "seconds": round(took, 2),
    }
    if lat:
        out["probe_max_ms"] = round(lat[-1] * 1000, 1)
        out["probe_p99_ms"] = round(lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000, 1)
        out["probes"] = len(lat)
        out["idle_probe_max_ms"] = round(max(idle_lat) * 1000, 1)
        out["loop_probe_max_ms"] = round(loop_lat[-1] * 1000, 1)
        out["loop_probe_p99_ms"] = round(
            loop_lat[min(len(loop_lat) - 1, int(len(loop_lat) * 0.99))] * 1000, 1
        )
    return out


def _round(r: int, mib: float, before: Path | None, sizes: tuple[int, int]) -> dict[str, Any]:
    body, ops = batch_body(int(mib * 2**20), 100 + r, sizes)
    sides = ("ledgerd", "floor", "ledgerd_before") if before else ("ledgerd", "floor")
    order = sides[r % len(sides) :] + sides[: r % len(sides)]
    out: dict[str, Any] = {"n_bytes": len(body), "ops": ops, "order": list(order)}
    for side in order:
        with tempfile.TemporaryDirectory(prefix="ldb-big-", dir="/tmp") as d:
            base = Path(d)
            proc, sock = _start(side, base, before)
            try:
                out[side] = asyncio.run(_run_one(side, proc, sock, body))
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.wait(120)
    for side in sides[::2]:
        out[side]["time_ratio_vs_floor"] = round(out[side]["seconds"] / out["floor"]["seconds"], 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=float, default=16, help="body MiB of a round (%(default)s)")
    ap.add_argument("--rounds", type=int, default=3, help="paired rounds (%(default)s)")
    ap.add_argument("--big-mib", type=float, default=55, help="one more round (0: none)")
    ap.add_argument(
        "--values",
        nargs=2,
        type=int,
        default=VALUES,
        metavar=("MIN", "MAX"),
        help="the values' sizes in bytes (%(default)s)",
    )
    ap.add_argument(
        "--before",
        type=Path,
        help="also run the daemon of an older commit: a directory holding its ledgerd package",
    )
    ap.add_argument("--probe", nargs=2, metavar=("SOCKET", "PATH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.probe:  # a probe process (see _probe_child)
        asyncio.run(_probe_child(Path(args.probe[0]), args.probe[1]))
        return
    sizes = tuple(args.values)
    rounds = [_round(r, args.mib, args.before, sizes) for r in range(args.rounds)]
    big = _round(args.rounds, args.big_mib, args.before, sizes) if args.big_mib else None

    def median(side: str, k: str) -> float | None:
        return float(statistics.median(x[side][k] for x in rounds)) if rounds else None

    emit(
        "bigbatch",
        {
            "mib": args.mib,
            "rounds": rounds,
            "median": {
                side: {
                    k: median(side, k)
                    for k in (
                        "rise_per_byte",
                        "probe_max_ms",
                        "probe_p99_ms",
                        "loop_probe_max_ms",
                        "time_ratio_vs_floor",
                    )
                    if side != "floor" or k == "rise_per_byte"
                }
                for side in (
                    ("ledgerd", "floor", "ledgerd_before") if args.before else ("ledgerd", "floor")
                )
            },
            "big": big,
            "target_rise_per_byte": 3,
            "target_probe_max_ms": 100,
        },
    )


if __name__ == "__main__":
    main()
