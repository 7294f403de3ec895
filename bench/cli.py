"""CLI benchmark: ``ledgerctl get`` of a small value, next to curl reading the same key.

    python -m bench.cli [--rounds 40] [--value-bytes 100] [--full-rounds 5]

Prints JSON. The real daemon runs as a subprocess on a temporary socket; each round runs,
as separate processes, ``ledgerctl get`` (the installed command, next to this Python),
``curl --unix-socket`` GET of the same key, and a bare Python request on a raw socket
(``python -c``: the interpreter's start-up and one HTTP request, the floor of any
command written in Python), once each, in an order that rotates from one round to the
next (so a drift in the shared machine's speed hits them alike). The figure is the
median of the per-round ratios of ledgerctl over curl (target <= 3); without curl, the
baseline is the bare Python request, and the JSON says so. CPU times (user + system, of
the child) are reported beside the wall times: they move less with the machine's load.
Python keeps the bytecode it compiles, as on an installed system, even where
``PYTHONDONTWRITEBYTECODE`` is set (in a temporary ``PYTHONPYCACHEPREFIX``, as the tests
do: nothing is written beside the sources).
``full_command`` times the same read through ``python -m ledgerd.daemon.cli``, the full
command (argparse, asyncio, aiohttp) that ``ledgerctl`` hands every other command line
to, over fewer rounds.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import emit

ROOT = Path(__file__).resolve().parents[1]
KEY_PATH = "/v1/ledgers/bench/pages/cli/keys/small"

ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
"""The commands' environment: Python keeps the bytecode it compiles (the warm-up run
does), as on an installed system, under a PYTHONPYCACHEPREFIX of the run's own."""

RAW_GET = r"""
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall(b"GET %s HTTP/1.1\r\nHost: ledgerd\r\nConnection: close\r\n\r\n" % sys.argv[2].encode())
data = b""
while chunk := s.recv(65536):
    data += chunk
sys.stdout.buffer.write(data.partition(b"\r\n\r\n")[2])
"""
"""The floor without curl: one request on a raw socket, printing the body."""


def _ledgerctl() -> list[str]:
    """The installed ``ledgerctl`` (the console script beside this interpreter)."""
    script = Path(sys.executable).parent / "ledgerctl"
    if not script.exists():
        raise SystemExit(f"no ledgerctl next to {sys.executable}: pip install -e . first")
    return [str(script)]


def _start(base: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERD_")}
    args = ["--data-dir", str(base / "data"), "--socket", str(base / "ledgerd.sock")]
    return subprocess.Popen(
        [sys.executable, "-m", "ledgerd.daemon", *args, "--log-level", "warning"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
    )


def _wait_ready(ctl: list[str], sock: Path, proc: subprocess.Popen[bytes]) -> None:
    """Until ``ledgerctl status`` answers (the daemon listens and serves)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"ledgerd exited with {proc.returncode}")
        done = subprocess.run([*ctl, "--socket", str(sock), "status"], capture_output=True)
        if done.returncode == 0:
            return
        time.sleep(0.05)
    raise SystemExit("ledgerd did not answer within 60 s")


def _timed(cmd: list[str], expected: bytes) -> tuple[float, float]:
    """Wall and CPU seconds for ``cmd`` to run to its end, checking that it printed
    ``expected``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, env=ENV)
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0 or done.stdout != expected:
        raise SystemExit(f"{cmd[0]} failed: {done}")
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return seconds, cpu


def _ms(times: list[tuple[float, float]]) -> dict[str, float]:
    wall = [w for w, _ in times]
    return {
        "median_ms": round(statistics.median(wall) * 1000, 1),
        "min_ms": round(min(wall) * 1000, 1),
        "cpu_median_ms": round(statistics.median(c for _, c in times) * 1000, 1),
    }


def _ratio(ours: list[tuple[float, float]], theirs: list[tuple[float, float]]) -> float:
    """The median of the rounds' ratios of wall times."""
    return round(statistics.median(o[0] / t[0] for o, t in zip(ours, theirs, strict=True)), 2)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=40, help="paired rounds (default 40)")
    ap.add_argument("--value-bytes", type=int, default=100, help="the value's size (100)")
    ap.add_argument(
        "--full-rounds", type=int, default=5, help="rounds of the full command (default 5)"
    )
    args = ap.parse_args(argv)
    value = b"v" * args.value_bytes
    ctl = _ledgerctl()
    curl = shutil.which("curl")
    with tempfile.TemporaryDirectory(prefix="ldc-", dir="/tmp") as d:
        base = Path(d)
        ENV["PYTHONPYCACHEPREFIX"] = str(base / "pycache")
        sock = base / "ledgerd.sock"
        daemon = _start(base)
        try:
            _wait_ready(ctl, sock, daemon)
            put = [*ctl, "--socket", str(sock), "put", "bench", "cli", "small"]
            subprocess.run(put, input=value, check=True)
            get = [*ctl, "--socket", str(sock), "get", "bench", "cli", "small"]
            raw = [sys.executable, "-c", RAW_GET, str(sock), KEY_PATH]
            sides: dict[str, list[str]] = {"ledgerctl_get": get, "python_raw_socket": raw}
            if curl is not None:
                url = "http://ledgerd" + KEY_PATH
                sides["curl"] = [curl, "-sf", "--unix-socket", str(sock), url]
            times: dict[str, list[tuple[float, float]]] = {name: [] for name in sides}
            for cmd in sides.values():  # once each first: files in the page cache
                _timed(cmd, value)
            order = list(sides)
            for r in range(args.rounds):
                for name in order[r % len(order) :] + order[: r % len(order)]:
                    times[name].append(_timed(sides[name], value))
            full_cmd = [sys.executable, "-m", "ledgerd.daemon.cli", *get[1:]]
            full = [_timed(full_cmd, value) for _ in range(args.full_rounds)]
        finally:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(60)
    baseline = "curl" if curl is not None else "python_raw_socket"
    doc: dict[str, Any] = {
        "rounds": args.rounds,
        "value_bytes": args.value_bytes,
        "baseline": baseline,
        **{name: _ms(t) for name, t in times.items()},
        "ratio": _ratio(times["ledgerctl_get"], times[baseline]),
        "target_ratio": 3.0,
        "ratio_to_python_floor": _ratio(times["ledgerctl_get"], times["python_raw_socket"]),
        "full_command": _ms(full),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    if curl is None:
        doc["note"] = "curl is not installed: the baseline is a bare Python raw-socket request"
    emit("cli", doc)


if __name__ == "__main__":
    main()
