"""Sync benchmark: propagation between two devices through moto's HTTP server.

    python -m bench.sync [--entries 10000] [--page-entries 100000] [--history-entries 100000]
                         [--ingest-mib 32] [--only-encryption | --only-scale]
                         [--no-encryption] [--no-scale]

Prints JSON:
* propagation: 10,000 entries written on device A, readable on device B:
  seconds and the PUT/GET/LIST requests it took;
* incremental: after one entry changes in a 100,000-entry page both devices hold,
  the requests and bytes (up and down) of A's next upload round (target <= 2 PUTs and
  <= 128 KiB up) and of B's round that brings the change, and the two together;
* history: the first upload and download of a page of 100,000 random keys written
  in 100 transactions of 1,000 (every version of every rewritten leaf travels);
* encryption: propagation of the same 10,000 entries and the ingest of 32 MiB of
  64 KiB values (upload on A, import on B), on a plain and on an encrypted bucket,
  alternating, best of 3 each; ``speed_ratio`` is plain seconds over encrypted
  seconds (target >= 0.8);
* scale: :mod:`bench.sync_scale`'s figures (a round touching 1,000 pages, an idle
  poll among 50 devices, a new device's bootstrap of the history page next to its
  live size, the bucket before and after compaction, the median propagation delay
  between two daemons with the default settings); ``--only-scale`` for just those;
* side by side in the same run: ``rclone copy`` of the same 10,000 values as
  files to the same endpoint (seconds and requests), if rclone is installed
  (``apt-get install rclone``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import boto3

from bench.common import emit, ratio, timed
from bench.sync_scale import scale
from ledgerd.store import Repository
from ledgerd.sync.crypto import KeyRing, key_line, new_key, parse_key_file
from ledgerd.sync.engine import SyncEngine
from ledgerd.sync.s3 import S3Store
from ledgerd.sync.testing import CountingStore, moto_server

AWS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


async def _device(
    path: Path, endpoint: str, bucket: str, prefix: str = "bench", keys: KeyRing | None = None
) -> tuple[Repository, SyncEngine, CountingStore]:
    """A repository with a sync engine whose S3 requests are counted (no background loop)."""
    store = CountingStore(S3Store(bucket, prefix, endpoint_url=endpoint, region="us-east-1"))
    engine = SyncEngine(store, keys=keys)
    repo = await Repository.open(path, hooks=engine.hooks())
    await engine.start(repo, background=False)
    return repo, engine, store


async def _bench(
    base: Path, endpoint: str, bucket: str, n: int, big: int, history: int
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    a_repo, a, a_cloud = await _device(base / "a", endpoint, bucket)
    b_repo, b, b_cloud = await _device(base / "b", endpoint, bucket)
    rng = random.Random(1)
    rows = [(b"k%08d" % i, rng.randbytes(100)) for i in range(n)]
    page = await a_repo.ledger("bench").page("propagation")
    await page.write(rows)
    a_cloud.reset()
    b_cloud.reset()
    with timed() as t:
        await a.sync()
        await b.sync()
        pb = await b_repo.ledger("bench").page("propagation")
        assert len((await pb.keys()).items) == n
    out["propagation"] = {
        "entries": n,
        "seconds": round(t.seconds, 3),
        "upload_requests": dict(a_cloud.counts),
        "download_requests": dict(b_cloud.counts),
        "bytes_up": a_cloud.bytes_put,
        "bytes_down": b_cloud.bytes_got,
    }
    # Incremental: one entry changes in a large page that both devices hold; what the
    # change costs both ways, A's upload round and B's round that brings it.
    big_page = await a_repo.ledger("bench").page("incremental")
    for i in range(0, big, 10_000):
        await big_page.write([(b"e%08d" % j, rng.randbytes(100)) for j in range(i, i + 10_000)])
    await a.sync()
    await b.sync()
    a_cloud.reset()
    b_cloud.reset()
    changed = b"e%08d" % (big // 2)
    await big_page.put(changed, b"changed" * 10)
    await a.round(download=False, full=True)
    await b.round(full=False)
    b_page = await b_repo.ledger("bench").page("incremental")
    assert await b_page.get(changed) == b"changed" * 10, "B did not get the change in one round"
    ways = {"upload_A": a_cloud, "download_B": b_cloud}
    out["incremental"] = {
        "page_entries": big,
        **{
            way: {
                "requests": dict(c.counts),
                "bytes_up": c.bytes_put,
                "bytes_down": c.bytes_got,
            }
            for way, c in ways.items()
        },
        "both_ways": {
            "requests": sum(sum(c.counts.values()) for c in ways.values()),
            "bytes": sum(c.bytes_put + c.bytes_got for c in ways.values()),
        },
        "target_upload": {"put": 2, "bytes": 131072},
    }
    b_cloud.reset()
    await b.round(full=False)
    await b.round(full=False)  # idle now
    b_cloud.reset()
    await b.round(full=False)
    out["idle_poll_requests"] = dict(b_cloud.counts)
    if history:
        out["history"] = await _history(a_repo, a, a_cloud, b_repo, b, b_cloud, history)
    await a.stop()
    await b.stop()
    await a_repo.close()
    await b_repo.close()
    return out


async def _history(
    a_repo: Repository,
    a: SyncEngine,
    a_cloud: CountingStore,
    b_repo: Repository,
    b: SyncEngine,
    b_cloud: CountingStore,
    n: int,
) -> dict[str, Any]:
    """The first sync of a page with history: ``n`` random keys written in
    transactions of 1,000 (as ``bench.pages`` loads them), so the upload carries
    every version of every rewritten leaf."""
    rng = random.Random(2)
    page = await a_repo.ledger("bench").page("history")
    for _ in range(0, n, 1000):
        async with page.transaction() as txn:
            for _ in range(1000):
                await txn.put(rng.randbytes(16), rng.randbytes(100))
    a_cloud.reset()
    b_cloud.reset()
    with timed() as up:
        await a.sync()
    with timed() as down:
        await b.sync()
    pb = await b_repo.ledger("bench").page("history")
    assert (await pb.heads())[0].root == (await page.heads())[0].root
    return {
        "entries": n,
        "commits": n // 1000,
        "upload_seconds": round(up.seconds, 3),
        "download_seconds": round(down.seconds, 3),
        "bytes_up": a_cloud.bytes_put,
        "upload_requests": dict(a_cloud.counts),
        "download_requests": dict(b_cloud.counts),
    }


async def _one_encryption_run(
    base: Path, endpoint: str, bucket: str, n: int, ingest_mib: int, keys: KeyRing | None
) -> dict[str, float]:
    prefix = f"enc-{base.name}"
    a_repo, a, _ = await _device(base / "a", endpoint, bucket, prefix, keys)
    b_repo, b, _ = await _device(base / "b", endpoint, bucket, prefix, keys)
    await a.sync()
    await b.sync()  # both have checked the bucket (the descriptor, the key)
    rng = random.Random(1)
    page = await a_repo.ledger("bench").page("propagation")
    await page.write([(b"k%08d" % i, rng.randbytes(100)) for i in range(n)])
    with timed() as prop:
        await a.sync()
        await b.sync()
    out = {"propagation_seconds": prop.seconds}
    if ingest_mib:
        big = await a_repo.ledger("bench").page("ingest")
        await big.write([(b"v%06d" % i, rng.randbytes(65536)) for i in range(ingest_mib * 16)])
        with timed() as up:
            await a.sync()
        with timed() as down:
            await b.sync()
        out |= {"ingest_upload_seconds": up.seconds, "ingest_download_seconds": down.seconds}
    for e, r in ((a, a_repo), (b, b_repo)):
        await e.stop()
        await r.close()
    return out


async def _encryption(
    base: Path, endpoint: str, bucket: str, n: int, ingest_mib: int, runs: int = 3
) -> dict[str, Any]:
    """Plain and encrypted side by side, alternating; the best of ``runs`` of each."""
    keys = parse_key_file(key_line(new_key()), "bench")
    best: dict[str, dict[str, float]] = {"plain": {}, "encrypted": {}}
    for i in range(runs):
        for mode, ring in (("plain", None), ("encrypted", keys)):
            got = await _one_encryption_run(
                base / f"{mode}{i}", endpoint, bucket, n, ingest_mib, ring
            )
            for k, v in got.items():
                best[mode][k] = min(best[mode].get(k, v), v)
    out: dict[str, Any] = {"entries": n, "ingest_mib": ingest_mib, "runs": runs}
    for mode in best:
        out[mode] = {k: round(v, 3) for k, v in best[mode].items()}
    out["speed_ratio"] = {k: ratio(best["plain"][k], best["encrypted"][k]) for k in best["plain"]}
    out["target"] = 0.8
    return out


def _rclone(base: Path, endpoint: str, bucket: str, n: int) -> dict[str, Any] | None:
    if shutil.which("rclone") is None:
        return None
    src = base / "files"
    src.mkdir()
    rng = random.Random(1)
    for i in range(n):
        (src / f"k{i:08d}").write_bytes(rng.randbytes(100))
    env = {k: v for k, v in os.environ.items() if k != "AWS_CA_BUNDLE"}  # plain http here
    env |= {
        "RCLONE_CONFIG_MOTO_TYPE": "s3",
        "RCLONE_CONFIG_MOTO_PROVIDER": "Other",
        "RCLONE_CONFIG_MOTO_ENDPOINT": endpoint,
        "RCLONE_CONFIG_MOTO_ACCESS_KEY_ID": "testing",
        "RCLONE_CONFIG_MOTO_SECRET_ACCESS_KEY": "testing",
        "RCLONE_CONFIG_MOTO_REGION": "us-east-1",
        "RCLONE_CONFIG": "/dev/null",
    }
    with timed() as t:
        res = subprocess.run(
            [
                "rclone",
                "copy",
                str(src),
                f"moto:{bucket}/rclone",
                "--dump",
                "headers",
                "--transfers",
                "16",
                "--checkers",
                "16",
            ],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
    if res.returncode != 0:
        return {"error": res.stderr[-500:]}
    methods = re.findall(r"\b(GET|PUT|HEAD|POST|DELETE) /\S* HTTP/1\.1", res.stderr)
    counts: dict[str, int] = {}
    for m in methods:
        counts[m] = counts.get(m, 0) + 1
    return {"files": n, "seconds": round(t.seconds, 3), "requests": counts}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=10_000)
    ap.add_argument("--page-entries", type=int, default=100_000)
    ap.add_argument("--history-entries", type=int, default=100_000, help="0: skip")
    ap.add_argument("--ingest-mib", type=int, default=32, help="encryption's ingest (0: none)")
    ap.add_argument("--only-encryption", action="store_true", help="just the encryption figures")
    ap.add_argument("--only-scale", action="store_true", help="just bench.sync_scale's figures")
    ap.add_argument("--no-encryption", action="store_true", help="without the encryption figures")
    ap.add_argument("--no-scale", action="store_true", help="without bench.sync_scale's figures")
    args = ap.parse_args()
    os.environ.update(AWS)
    with moto_server() as endpoint:
        bucket = "bench"
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(
            Bucket=bucket
        )
        if args.only_scale:
            emit("sync", {"scale": scale(endpoint, bucket, args.history_entries)})
            return
        with tempfile.TemporaryDirectory() as d:
            encryption = (
                None
                if args.no_encryption
                else asyncio.run(
                    _encryption(Path(d), endpoint, bucket, args.entries, args.ingest_mib)
                )
            )
            if args.only_encryption:
                emit("sync", {"encryption": encryption})
                return
            figures = asyncio.run(
                _bench(
                    Path(d),
                    endpoint,
                    bucket,
                    args.entries,
                    args.page_entries,
                    args.history_entries,
                )
            )
            figures["encryption"] = encryption
            if not args.no_scale:
                figures["scale"] = scale(endpoint, bucket, args.history_entries)
            figures["rclone_copy"] = _rclone(Path(d), endpoint, bucket, args.entries)
    ours = figures["propagation"]
    rc = figures["rclone_copy"]
    if rc and "seconds" in rc:
        ours_requests = sum(ours["upload_requests"].values())
        figures["ratio_seconds_rclone_over_ledgerd_upload_and_download"] = round(
            rc["seconds"] / ours["seconds"], 2
        )
        figures["ratio_requests_rclone_over_ledgerd_upload"] = round(
            sum(rc["requests"].values()) / max(1, ours_requests), 1
        )
    emit("sync", figures)


if __name__ == "__main__":
    main()
