"""Real daemons on one bucket, driven from outside through ``ledgerctl``.

Two runs, each printing one JSON line:

``same-keys``
    Three daemons (default settings) each put the same 100 keys of one page with
    ``ledgerctl put``, all three at once; then each syncs until the three listings
    match. Prints the seconds the puts took, the seconds from the last put until
    the listings matched, each daemon's CPU seconds and its head count, and how
    fast each daemon answered meanwhile: a probe thread sends ``GET /v1/health``
    to every daemon every 50 ms through the whole run (an event loop a merge held
    answers late), beside the same probe on the idle daemons before the puts.

``life``
    Four daemons with ``history_retention = 0``, a short ``compaction_grace``,
    checkpoints due at once and short sync intervals; two of them run with their
    clocks skewed by libfaketime (preloaded into the daemon: -1 h and +10 min) when
    it is installed (Debian's ``faketime``). A seeded workload of puts, deletes,
    batches and syncs runs on two pages while now and then a daemon collects
    garbage, evicts a page, stops and starts again, is killed with SIGKILL and
    started again, or stays away for longer than the grace; the fourth joins half
    way. Then every daemon syncs until the listings match. Prints whether they
    matched, how long that took, and whether every acknowledged write is there:
    each device also writes keys of its own, whose last acknowledged value (or
    absence, after an acknowledged delete) every device must show.

Both runs also count each daemon's log lines that report an error, a refused
(corrupt) object or a pack that waits, and show the first few.

``python -m bench.daemons [--run same-keys|life|both] [--seed N] [--steps N]``

The bucket is moto's S3 server on a loopback port (``ledgerd.sync.testing``); the
daemons run from this checkout, their data under a temporary directory.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import http.client
import json
import os
import random
import shutil
import signal
import socket as sockets
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3

from ledgerd.sync.testing import AWS_ENV, moto_server

ROOT = Path(__file__).resolve().parents[1]
FAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
CONVERGE_TIMEOUT = 300.0
"""Seconds the listings have to match after the workload, before the run reports
that they did not."""


@dataclass
class Daemon:
    """One ``ledgerd`` under ``base`` (data, socket, log), started again as asked."""

    base: Path
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    cpu: float = 0.0  # CPU seconds of the processes that ended

    @property
    def socket(self) -> Path:
        return self.base / "s"

    def start(self) -> None:
        notify = sockets.socket(sockets.AF_UNIX, sockets.SOCK_DGRAM)
        path = self.base / "n"
        path.unlink(missing_ok=True)
        notify.bind(str(path))
        notify.settimeout(60)
        with (self.base / "log").open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "ledgerd.daemon", "--data-dir", str(self.base / "data")]
                + ["--socket", str(self.socket)],
                cwd=ROOT,
                env={**os.environ, **self.env, "NOTIFY_SOCKET": str(path)},
                stdout=log,
                stderr=log,
            )
        try:
            while b"READY=1" not in notify.recv(4096):
                pass
        finally:
            notify.close()

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is None:
            return
        self.cpu += _cpu(self.proc.pid)
        self.proc.send_signal(sig)
        self.proc.wait(120)
        self.proc = None

    def cpu_now(self) -> float:
        return self.cpu + (_cpu(self.proc.pid) if self.proc else 0.0)

    def ctl(self, *args: str, data: bytes | None = None, timeout: float = 120) -> bytes:
        out = subprocess.run(
            [sys.executable, "-m", "ledgerd.daemon.cli_quick", "--socket", str(self.socket), *args],
            input=data,
            capture_output=True,
            cwd=ROOT,
            timeout=timeout,
        )
        if out.returncode != 0:
            raise RuntimeError(f"ledgerctl {' '.join(args)}: {out.stderr.decode().strip()}")
        return out.stdout

    def listing(self, page: str) -> list[Any]:
        try:
            out = self.ctl("ls", "app", page, "--json")
        except RuntimeError as e:
            if "not found" in str(e) or "no page" in str(e):
                return []
            raise
        return [json.loads(x) for x in out.decode().splitlines()]


class _UnixHTTP(http.client.HTTPConnection):
    """An HTTP connection over a Unix socket (the daemon's)."""

    def __init__(self, path: Path) -> None:
        super().__init__("localhost", timeout=120)
        self.path = path

    def connect(self) -> None:
        s = sockets.socket(sockets.AF_UNIX, sockets.SOCK_STREAM)
        s.settimeout(120)
        s.connect(str(self.path))
        self.sock = s


class Probe:
    """Sends ``GET /v1/health`` to each daemon every ``every`` seconds in a thread and
    keeps the seconds each answer took: how long an event loop kept a request
    waiting (a merge that held it, a stall)."""

    def __init__(self, daemons: list[Daemon], every: float = 0.05) -> None:
        self.daemons = daemons
        self.every = every
        self.times: dict[str, list[float]] = {d.base.name: [] for d in daemons}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        conns = {d.base.name: _UnixHTTP(d.socket) for d in self.daemons}
        while not self._stop.wait(self.every):
            for name, conn in conns.items():
                started = time.monotonic()
                try:
                    conn.request("GET", "/v1/health")
                    conn.getresponse().read()
                except (OSError, http.client.HTTPException):
                    conn.close()
                    continue
                self.times[name].append(time.monotonic() - started)

    def __enter__(self) -> Probe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict[str, Any]:
        """Per daemon: answers, median, 99th percentile and slowest, in milliseconds."""
        out: dict[str, Any] = {}
        for name, ts in self.times.items():
            ts = sorted(ts)
            if not ts:
                out[name] = {"answers": 0}
                continue
            out[name] = {
                "answers": len(ts),
                "median_ms": round(ts[len(ts) // 2] * 1000, 1),
                "p99_ms": round(ts[min(len(ts) - 1, int(len(ts) * 0.99))] * 1000, 1),
                "max_ms": round(ts[-1] * 1000, 1),
            }
        return out


PROBLEMS = (" ERROR ", " CRITICAL ", "Traceback", "corrupt", "malformed", "waits for")
"""Log line fragments that mean something went wrong: the runs count them."""


def _log_problems(daemons: list[Daemon]) -> dict[str, Any]:
    """Per daemon, how many log lines hold one of ``PROBLEMS`` and the first few."""
    found: dict[str, Any] = {}
    for d in daemons:
        log = d.base / "log"
        lines = log.read_text(errors="replace").splitlines() if log.exists() else []
        bad = [line for line in lines if any(p in line for p in PROBLEMS)]
        found[d.base.name] = {"lines": len(bad), "first": [line[:200] for line in bad[:3]]}
    return found


def _cpu(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def _bucket() -> Iterator[tuple[str, str]]:
    with moto_server() as url:
        name = f"ledgerd-{os.urandom(4).hex()}"
        boto3.client(
            "s3",
            endpoint_url=url,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        ).create_bucket(Bucket=name)
        yield url, name


def _env(url: str, bucket: str, **settings: Any) -> dict[str, str]:
    env = {**AWS_ENV, "LEDGERD_ENDPOINT_URL": url, "LEDGERD_CLOUD": f"s3://{bucket}/daemons"}
    env |= {f"LEDGERD_{k.upper()}": str(v) for k, v in settings.items()}
    return env


def _converge(daemons: list[Daemon], pages: list[str], timeout: float) -> float | None:
    """Sync every daemon until all listings of ``pages`` match; the seconds it took, or
    None after ``timeout``."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        for d in daemons:
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                d.ctl("sync", "--timeout", "60")
        listings = [[d.listing(p) for p in pages] for d in daemons]
        if all(x == listings[0] for x in listings):
            return time.monotonic() - started
    return None


def same_keys() -> dict[str, Any]:
    with _bucket() as (url, bucket), tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        daemons = [Daemon(Path(tmp) / n, _env(url, bucket)) for n in "abc"]
        for d in daemons:
            d.base.mkdir()
            d.start()
        try:

            def puts(d: Daemon) -> None:
                for i in range(100):
                    d.ctl("put", "app", "shared", f"k{i:03d}", f"{d.base.name}-{i}")

            idle = Probe(daemons)
            with idle:
                time.sleep(3)  # (a measurement period, not a wait for an event)
            started = time.monotonic()
            with Probe(daemons) as busy:
                with ThreadPoolExecutor(3) as pool:
                    list(pool.map(puts, daemons))
                put_seconds = time.monotonic() - started
                seconds = _converge(daemons, ["shared"], CONVERGE_TIMEOUT)
            heads = [len(d.ctl("heads", "app", "shared").splitlines()) for d in daemons]
            keys = len(daemons[0].listing("shared"))
            return {
                "run": "same-keys",
                "daemons": 3,
                "keys_per_daemon": 100,
                "put_seconds": round(put_seconds, 1),
                "converged": seconds is not None,
                "seconds_to_converge_after_the_puts": None
                if seconds is None
                else round(seconds, 1),
                "keys": keys,
                "heads": heads,
                "daemon_cpu_seconds": [round(d.cpu_now(), 1) for d in daemons],
                "health_answers_idle": idle.summary(),
                "health_answers_during_the_run": busy.summary(),
                "log_problems": _log_problems(daemons),
            }
        finally:
            for d in daemons:
                d.stop()


@dataclass
class Model:
    """Each device's own keys: the last value it had acknowledged (None: deleted)."""

    own: dict[str, dict[str, str | None]] = field(default_factory=dict)


def life(seed: int, steps: int) -> dict[str, Any]:
    rng = random.Random(seed)
    grace = 20.0
    settings = {
        "history_retention": 0,
        "compaction_grace": grace,
        "compaction_interval": 5,
        "checkpoint_interval": 0,
        "sync_interval": 0.5,
        "sync_interval_max": 2,
        "gc_interval": 5,
    }
    skews = ["", "-1h", "+10m", ""]
    faked = FAKETIME.exists()
    with _bucket() as (url, bucket), tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        daemons = []
        for name, skew in zip("abcd", skews, strict=True):
            env = _env(url, bucket, **settings)
            if skew and faked:
                env |= {"LD_PRELOAD": str(FAKETIME), "FAKETIME": skew, "FAKETIME_NO_CACHE": "1"}
            d = Daemon(Path(tmp) / name, env)
            d.base.mkdir()
            daemons.append(d)
        for d in daemons[:3]:
            d.start()
        model = Model({d.base.name: {} for d in daemons})
        counts: dict[str, int] = {}
        away: tuple[Daemon, float] | None = None
        started = time.monotonic()

        def count(what: str) -> None:
            counts[what] = counts.get(what, 0) + 1

        for step in range(steps):
            if step == steps // 2:
                daemons[3].start()  # the fourth device joins half way
                count("joined")
            if away is not None and time.monotonic() >= away[1]:
                away[0].start()
                away = None
                count("back after the grace")
            live = [d for d in daemons if d.proc is not None]
            d = rng.choice(live)
            page = rng.choice(["p0", "p1"])
            r = rng.random()
            try:
                if r < 0.35:
                    key = f"shared-{rng.randrange(8)}"
                    d.ctl("put", "app", page, key, f"{d.base.name}-{step}")
                    count("put shared")
                elif r < 0.6:
                    key = f"own-{d.base.name}-{rng.randrange(6)}"
                    d.ctl("put", "app", "own", key, f"{step}")
                    model.own[d.base.name][key] = f"{step}"
                    count("put own")
                elif r < 0.68:
                    key = f"own-{d.base.name}-{rng.randrange(6)}"
                    if model.own[d.base.name].get(key) is not None:
                        d.ctl("delete", "app", "own", key)
                        model.own[d.base.name][key] = None
                        count("delete own")
                elif r < 0.75:
                    d.ctl("delete", "app", page, f"shared-{rng.randrange(8)}")
                    count("delete shared")
                elif r < 0.85:
                    d.ctl("sync", "--timeout", "30")
                    count("sync")
                elif r < 0.88:
                    d.ctl("gc")
                    count("gc")
                elif r < 0.91:
                    with contextlib.suppress(RuntimeError):  # not evictable now: fine
                        d.ctl("evict", "app", page)
                        count("evict")
                elif r < 0.94:
                    d.stop()
                    d.start()
                    count("restart")
                elif r < 0.97:
                    d.stop(signal.SIGKILL)
                    d.start()
                    count("kill -9")
                elif away is None and len(live) > 2:
                    d.stop()
                    away = (d, time.monotonic() + grace * 2)
                    count("away past the grace")
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                count(f"failed: {str(e)[:60]}")
        if away is not None:
            away[0].start()
        if daemons[3].proc is None:
            daemons[3].start()
        workload = time.monotonic() - started
        try:
            seconds = _converge(daemons, ["p0", "p1", "own"], CONVERGE_TIMEOUT)
            own = {
                base64.b64decode(x["key"]).decode(): base64.b64decode(x["value"]).decode()
                for x in daemons[0].listing("own")
            }
            lost = [
                f"{k}: want {v!r}, got {own.get(k)!r}"
                for device in model.own.values()
                for k, v in device.items()
                if own.get(k) != v
            ]
            return {
                "run": "life",
                "seed": seed,
                "steps": steps,
                "clock_skews": skews if faked else "libfaketime not installed: none",
                "settings": settings,
                "operations": dict(sorted(counts.items())),
                "workload_seconds": round(workload, 1),
                "converged": seconds is not None,
                "seconds_to_converge": None if seconds is None else round(seconds, 1),
                "acknowledged_writes_missing": lost,
                "daemon_cpu_seconds": [round(d.cpu_now(), 1) for d in daemons],
                "log_problems": _log_problems(daemons),
            }
        finally:
            for d in daemons:
                d.stop()
            if os.environ.get("LEDGERD_KEEP"):
                shutil.copytree(tmp, os.environ["LEDGERD_KEEP"], dirs_exist_ok=True)


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.daemons", description=__doc__.split("\n")[0])
    ap.add_argument("--run", choices=["same-keys", "life", "both"], default="both")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    if args.run in ("same-keys", "both"):
        print(json.dumps(same_keys()), flush=True)
    if args.run in ("life", "both"):
        print(json.dumps(life(args.seed, args.steps)), flush=True)


if __name__ == "__main__":
    main()
