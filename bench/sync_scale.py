"""Sync at scale (issue 16), a section of ``bench.sync`` (also ``python -m bench.sync_scale``).

Through moto's HTTP server, requests counted below the engines:
* ``round_1000_pages``: the requests of one upload round after a write to each of
  1,000 pages (target: 1 PUT);
* ``idle_poll_50_devices``: 50 devices each write one key of one shared page and
  sync until a whole cycle moves nothing; then the requests of one idle poll of a
  device that hears from 49 others (target: 1 LIST), the cycles and seconds the
  settling took, the packs held on any device (target: none) and how many devices
  hold all 50 keys;
* ``bootstrap``: a new device's first sync of the 100-transaction history page
  (100,000 random keys in transactions of 1,000), bytes and seconds, next to the
  page's live size as stored (its head's tree and values) and its keys and values;
* ``compaction``: the bucket's bytes before and after the writer compacts (grace 0);
* ``propagation_daemons``: two real daemons with the default settings: the median
  and p90 seconds from a put on one to the value being readable on the other.

``python -m bench.sync_scale [--only round|idle|bootstrap|propagation ...]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import boto3

from bench.common import emit, timed
from ledgerd.daemon.client import Client, NotFoundError
from ledgerd.store import Repository
from ledgerd.store.page import exchange as ex
from ledgerd.sync.engine import SyncEngine
from ledgerd.sync.s3 import S3Store
from ledgerd.sync.testing import CountingStore, moto_server

AWS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


async def _device(
    path: Path, endpoint: str, bucket: str, prefix: str, **kw: Any
) -> tuple[Repository, SyncEngine, CountingStore]:
    store = CountingStore(S3Store(bucket, prefix, endpoint_url=endpoint, region="us-east-1"))
    engine = SyncEngine(store, **kw)
    repo = await Repository.open(path, hooks=engine.hooks())
    await engine.start(repo, background=False)
    return repo, engine, store


def _bucket_bytes(endpoint: str, bucket: str, prefix: str) -> int:
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    total = 0
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        total += sum(o["Size"] for o in page.get("Contents", []))
    return total


async def _round_1000(base: Path, endpoint: str, bucket: str) -> dict[str, Any]:
    repo, engine, cloud = await _device(base / "r1000", endpoint, bucket, "r1000")
    try:
        await engine.sync()  # the bucket's marker goes up once, before
        for i in range(1000):
            pg = await repo.ledger("bench").page(f"p{i:04d}")
            await pg.put(b"k", b"v%d" % i)
            await pg.flush()
        cloud.reset()
        with timed() as t:
            stats = await engine.round(download=False, full=True)
        return {
            "pages": 1000,
            "requests": dict(cloud.counts),
            "packs": stats.uploaded_packs,
            "seconds": round(t.seconds, 3),
            "target": {"put": 1},
        }
    finally:
        await engine.stop()
        await repo.close()


async def _idle_50(base: Path, endpoint: str, bucket: str) -> dict[str, Any]:
    devices = []
    try:
        for i in range(50):
            d = await _device(base / f"idle{i}", endpoint, bucket, "idle50")
            devices.append(d)
            pg = await d[0].ledger("bench").page("shared")
            await pg.put(b"from %d" % i, b"v")
            await d[1].sync()
        cycles = 0
        with timed() as settle:
            while cycles < 5:  # until everyone has read everyone
                cycles += 1
                moved = 0
                for _, engine, _ in devices:
                    s = await engine.sync()
                    moved += s.uploaded_packs + s.downloaded_packs
                if not moved:
                    break
        held = sum(sum(e.gauges()["held"].values()) for _, e, _ in devices)
        problems = sum(len(e.problems()) for _, e, _ in devices)
        keys = []
        for r, _, _ in devices:
            shared = await r.ledger("bench").page("shared")
            keys.append(len((await shared.keys()).items))
        repo, engine, cloud = devices[0]
        cloud.reset()
        await engine.round()
        return {
            "devices": 50,
            "requests": dict(cloud.counts),
            "target": {"list": 1},
            "settle_cycles": cycles,
            "settle_seconds": round(settle.seconds, 1),
            "held_packs": held,
            "problems": problems,
            "devices_with_every_key": sum(k == 50 for k in keys),
        }
    finally:
        for repo, engine, _ in devices:
            await engine.stop()
            await repo.close()


async def _bootstrap(base: Path, endpoint: str, bucket: str, n: int) -> dict[str, Any]:
    prefix = "boot"
    a_repo, a, a_cloud = await _device(base / "boot-a", endpoint, bucket, prefix)
    rng = random.Random(2)
    kv = 0
    page = await a_repo.ledger("bench").page("history")
    for _ in range(0, n, 1000):
        async with page.transaction() as txn:
            for _ in range(1000):
                k, v = rng.randbytes(16), rng.randbytes(100)
                kv += len(k) + len(v)
                await txn.put(k, v)
    await a.sync()
    st = await ex.state(page)
    assert st is not None
    stored = sum((await ex.piece_sizes(page, st.eager)).values())
    history = a_cloud.bytes_put
    c_repo, c, c_cloud = await _device(base / "boot-c", endpoint, bucket, prefix)
    with timed() as t:
        await c.sync()
    pc = await c_repo.ledger("bench").page("history")
    assert (await pc.heads())[0].root == (await page.heads())[0].root
    out: dict[str, Any] = {
        "entries": n,
        "commits": n // 1000,
        "live_stored_bytes": stored,
        "live_key_value_bytes": kv,
        "history_bytes_uploaded": history,
        "checkpoints_written": a.checkpoints.written,
        "bytes_down": c_cloud.bytes_got,
        "seconds": round(t.seconds, 3),
        "requests": dict(c_cloud.counts),
        "ratio_bytes_down_over_live_stored": round(c_cloud.bytes_got / stored, 2),
        "ratio_bytes_down_over_live_key_value": round(c_cloud.bytes_got / kv, 2),
        "target": "bytes_down <= 1.5 x live + 64 KiB",
    }
    before = _bucket_bytes(endpoint, bucket, prefix + "/")
    a.compactor.grace = 0.0
    report = await a.compact()
    after = _bucket_bytes(endpoint, bucket, prefix + "/")
    out_compaction = {
        "bucket_bytes_before": before,
        "bucket_bytes_after": after,
        "live_stored_bytes": stored,
        "packs_deleted": report.packs_deleted,
        "checkpoints_deleted": report.checkpoints_deleted,
        "ratio_after_over_live_stored": round(after / stored, 2),
        "target": "after <= 2 x live (grace 0)",
    }
    for engine, repo in ((a, a_repo), (c, c_repo)):
        await engine.stop()
        await repo.close()
    return {"bootstrap": out, "compaction": out_compaction}


def _start(base: Path, endpoint: str, bucket: str) -> tuple[subprocess.Popen[bytes], Path]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERD_")}
    env.update(AWS, LEDGERD_ENDPOINT_URL=endpoint)
    sock = base / "ledgerd.sock"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ledgerd.daemon",
            "--data-dir",
            str(base / "data"),
            "--socket",
            str(sock),
            "--cloud",
            f"s3://{bucket}/propagation",
            "--log-level",
            "warning",
        ],
        env=env,
    )
    deadline = time.monotonic() + 60
    while not sock.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the daemon did not start")
        time.sleep(0.02)
    return proc, sock


def _propagation(base: Path, endpoint: str, bucket: str, rounds: int) -> dict[str, Any]:
    a, sa = _start(base / "pa", endpoint, bucket)
    b, sb = _start(base / "pb", endpoint, bucket)
    try:
        lat: list[float] = []
        with Client(sa) as ca, Client(sb) as cb:
            for i in range(rounds):
                value = b"value %d" % i
                t0 = time.monotonic()
                ca.put("bench", "prop", b"k", value)
                while time.monotonic() - t0 < 60:
                    with contextlib.suppress(NotFoundError):
                        if cb.get("bench", "prop", b"k") == value:
                            break
                    time.sleep(0.005)
                lat.append(time.monotonic() - t0)
        lat.sort()
        return {
            "rounds": rounds,
            "median_seconds": round(statistics.median(lat), 3),
            "p90_seconds": round(lat[int(len(lat) * 0.9) - 1], 3),
            "target": "median <= 1 s",
        }
    finally:
        for p in (a, b):
            p.terminate()
            p.wait(30)


SECTIONS = ("round", "idle", "bootstrap", "propagation")
"""The sections ``--only`` chooses from (bootstrap includes compaction)."""


async def _all(
    base: Path, endpoint: str, bucket: str, history: int, only: set[str]
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if "round" in only:
        out["round_1000_pages"] = await _round_1000(base, endpoint, bucket)
    if "idle" in only:
        out["idle_poll_50_devices"] = await _idle_50(base, endpoint, bucket)
    if history and "bootstrap" in only:
        out.update(await _bootstrap(base, endpoint, bucket, history))
    return out


def scale(
    endpoint: str,
    bucket: str,
    history: int = 100_000,
    rounds: int = 15,
    only: set[str] | None = None,
) -> dict[str, Any]:
    """The figures of this section (moto's server at ``endpoint``, ``bucket`` made):
    every one, or those of the sections in ``only``."""
    chosen = set(SECTIONS) if only is None else only
    with tempfile.TemporaryDirectory(prefix="lds-", dir="/tmp") as d:
        out = asyncio.run(_all(Path(d), endpoint, bucket, history, chosen))
        if "propagation" in chosen:
            out["propagation_daemons"] = _propagation(Path(d), endpoint, bucket, rounds)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.sync_scale", description=__doc__)
    ap.add_argument(
        "--only", action="append", choices=SECTIONS, help="run just this section (repeatable)"
    )
    ap.add_argument("--history", type=int, default=100_000, help="entries of the history page")
    ap.add_argument("--rounds", type=int, default=15, help="puts timed between two daemons")
    args = ap.parse_args()
    os.environ.update(AWS)
    with moto_server() as endpoint:
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(
            Bucket="bench"
        )
        only = set(args.only) if args.only else None
        emit("sync_scale", scale(endpoint, "bench", args.history, args.rounds, only))


if __name__ == "__main__":
    main()
