"""Oracle 6: reads answer while a large import merges (wall clock, apart from the seeds).

One device writes a large page in bulk and uploads it; another, holding writes of its
own to the same page (so the import merges), syncs it in while a reader asks the page
for a key every few milliseconds. The time from when each read was due to its answer
(what the event loop was held meanwhile, and the read) is the measure. It runs on
the real clock and the real thread pool, so it is not part of the deterministic
histories; the bound is loose and on a high percentile, so that a noisy machine does
not fail it while a merge that holds the event loop for seconds does.
"""

from __future__ import annotations

import asyncio
import functools
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.sim import adapter
from tests.sim.bucket import CrashPoints, Faults, SimBucket

PAUSE = 0.005
"""Seconds between the reads."""
BOUND_MS = 200.0
"""The 90th percentile of read times during the import must stay under this."""


@dataclass
class Latency:
    reads: int
    p50_ms: float
    p90_ms: float
    max_ms: float
    import_s: float
    idle_p50_ms: float

    def json(self) -> dict[str, Any]:
        return {k: round(v, 2) if isinstance(v, float) else v for k, v in self.__dict__.items()}


async def _measure(base: Path, keys: int, batch: int) -> Latency:
    import random

    bucket = SimBucket(random.Random(0), Faults(on=False), lambda line: None)
    settings = adapter.EngineSettings(
        history_retention=3600.0,
        compaction_grace=30 * 86400.0,
        checkpoint_interval=1e9,
        max_checkpoint=64 * 1024 * 1024,
        max_pack=32 * 1024 * 1024,
        key=None,
    )
    points = [CrashPoints("writer"), CrashPoints("reader")]
    opened = []
    for i, name in enumerate(("writer", "reader")):
        cloud = bucket.view(name, functools.partial(points.__getitem__, i))
        opened.append(await adapter.open_device(base / name, cloud, settings, time.time))
    (wrepo, wengine), (rrepo, rengine) = opened
    try:
        await adapter.write(rrepo, b"p0", [(b"mine", b"reader's own")])
        await adapter.sync(rengine)
        await adapter.sync(wengine)
        async with adapter.page(wrepo, b"p0") as page:
            for start in range(0, keys, batch):
                rows: list[tuple[bytes, bytes | None]] = [
                    (f"w{i:08d}".encode(), f"value {i}".encode() * 3)
                    for i in range(start, min(keys, start + batch))
                ]
                await page.write(rows)
            await page.flush()
        # The reader changes every third key meanwhile: the import merges them all.
        async with adapter.page(rrepo, b"p0") as page:
            for start in range(0, keys, batch):
                rows = [
                    (f"w{i:08d}".encode(), f"reader's {i}".encode())
                    for i in range(start, min(keys, start + batch), 3)
                ]
                await page.write(rows + [(b"mine", b"changed meanwhile")])
            await page.flush()
        await adapter.sync(wengine, timeout=600)
        times: list[float] = []
        idle: list[float] = []
        async with adapter.page(rrepo, b"p0") as page:
            for _ in range(20):
                t = time.perf_counter()
                await page.get(b"mine")
                idle.append(time.perf_counter() - t)
            started = time.perf_counter()
            task = asyncio.ensure_future(adapter.sync(rengine, timeout=600))
            while not task.done():
                # A read wanted 5 ms from now: the time until it is answered counts what
                # the event loop was held meanwhile, not only the read itself.
                wanted = time.perf_counter() + PAUSE
                await asyncio.sleep(PAUSE)
                await page.get(b"mine")
                times.append(max(0.0, time.perf_counter() - wanted))
            await task
            took = time.perf_counter() - started
        ms = sorted(x * 1000 for x in times) or [0.0]
        return Latency(
            reads=len(times),
            p50_ms=statistics.median(ms),
            p90_ms=ms[min(len(ms) - 1, int(len(ms) * 0.9))],
            max_ms=ms[-1],
            import_s=took,
            idle_p50_ms=statistics.median(idle) * 1000,
        )
    finally:
        for repo, engine in opened:
            await adapter.abandon(repo, engine)


def read_latency(keys: int = 60_000, batch: int = 5_000) -> Latency:
    """Measure reads during the import of a ``keys``-key page (see the module doc)."""
    adapter.install_crash_seam()
    with tempfile.TemporaryDirectory(prefix="ledgerd-sim-latency-") as d:
        return asyncio.run(_measure(Path(d), keys, batch))
