"""Convergence benchmark: 5 devices x 1,000 random operations through moto's HTTP server.

    python -m bench.convergence [--devices 5] [--ops 1000]

Each device applies random puts, deletes and transactions to one page, syncing
now and then in random order. Prints JSON: seconds from the last write until
every device has the same root digest, the merge commits created, and the
requests (PUT/GET/LIST) it took, next to the counts for the whole run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import tempfile
from pathlib import Path
from typing import Any

import boto3

from bench.common import emit, timed
from bench.sync import AWS, _device
from ledgerd.store import Page
from ledgerd.sync.testing import moto_server


async def _run(base: Path, endpoint: str, bucket: str, devices: int, ops: int) -> dict[str, Any]:
    rng = random.Random(7)
    made = [await _device(base / f"dev{i}", endpoint, bucket, "conv") for i in range(devices)]
    repos = [r for r, _, _ in made]
    engines = [e for _, e, _ in made]
    clouds = [c for _, _, c in made]
    pages: list[Page] = [await r.ledger("bench").page("conv") for r in repos]
    keys = [b"k%03d" % i for i in range(200)]
    for _ in range(ops):
        for dev in range(devices):
            page = pages[dev]
            r = rng.random()
            if r < 0.6:
                await page.put(rng.choice(keys), rng.randbytes(rng.randint(1, 200)))
            elif r < 0.8:
                await page.delete(rng.choice(keys))
            else:
                async with page.transaction() as txn:
                    for _ in range(3):
                        await txn.put(rng.choice(keys), rng.randbytes(50))
            if rng.random() < 0.01:
                await engines[dev].sync()
    before = {k: sum(c.counts[k] for c in clouds) for k in ("put", "get", "list")}
    rounds = 0
    with timed() as t:
        while True:
            for e in rng.sample(engines, len(engines)):
                await e.sync()
            rounds += 1
            if len({p.head.root for p in pages}) == 1:
                break
    after = {k: sum(c.counts[k] for c in clouds) for k in ("put", "get", "list")}
    commits = len({c.id for p in pages for c in await p.history(1_000_000)})
    for e in engines:
        await e.stop()
    for repo in repos:
        await repo.close()
    return {
        "devices": devices,
        "operations_per_device": ops,
        "seconds_from_last_write_to_converged": round(t.seconds, 3),
        "exchange_rounds_to_converge": rounds,
        "commits": commits,
        "requests_to_converge": {k: after[k] - before[k] for k in after},
        "requests_whole_run": after,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, default=5)
    ap.add_argument("--ops", type=int, default=1000)
    args = ap.parse_args()
    os.environ.update(AWS)
    with moto_server() as endpoint:
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(
            Bucket="conv"
        )
        with tempfile.TemporaryDirectory() as d:
            figures = asyncio.run(_run(Path(d), endpoint, "conv", args.devices, args.ops))
    emit("convergence", figures)


if __name__ == "__main__":
    main()
