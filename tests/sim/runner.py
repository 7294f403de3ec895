"""Many seeded histories in worker processes, with a watchdog: ``bench.sim`` and the suite.

Each worker is a fresh interpreter (spawned, with ``PYTHONHASHSEED=0`` so that a seed
replays the same way in any process) that takes seeds from a queue and runs each with
:func:`tests.sim.harness.run_history`. A history that outlives its own timeout inside
the worker is a hang; one whose worker stops answering altogether (stuck in a thread,
or dead) is killed after ``hard_timeout`` and counts as a hang too, and a new worker
takes the next seeds.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from typing import Any

from tests.sim import oracle
from tests.sim.harness import HISTORY_TIMEOUT, STEPS

HASH_SEED = "0"


@dataclass
class Outcome:
    """One history's result as it crosses processes."""

    seed: int
    failed: bool
    categories: list[str]
    findings: list[tuple[str, str, bool]]
    stats: dict[str, Any]
    seconds: float
    lossy: bool = False


@dataclass
class Summary:
    histories: int = 0
    outcomes: list[Outcome] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def failures(self) -> list[Outcome]:
        return sorted((o for o in self.outcomes if o.failed), key=lambda o: o.seed)

    def by_category(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = defaultdict(list)
        for o in self.failures:
            for c in o.categories:
                out[c].append(o.seed)
        return dict(sorted(out.items()))

    def json(self) -> dict[str, Any]:
        totals: Counter[str] = Counter()
        for o in self.outcomes:
            totals.update({k: v for k, v in o.stats.items() if isinstance(v, int)})
        return {
            "histories": self.histories,
            "failed": len(self.failures),
            "failures": [{"seed": o.seed, "symptoms": o.categories} for o in self.failures],
            "by_symptom": {c: {"count": len(s), "seeds": s} for c, s in self.by_category().items()},
            "lossy": sum(o.lossy for o in self.outcomes),
            "seconds": round(self.seconds, 1),
            "histories_per_s": round(self.histories / self.seconds, 2) if self.seconds else None,
            "max_commit_ratio": max(
                (o.stats.get("commit_ratio", 0.0) for o in self.outcomes), default=0.0
            ),
            "totals": dict(sorted(totals.items())),
        }


def _worker(tasks: Any, results: Any, devices_max: int, steps: tuple[int, int]) -> None:
    from tests.sim.harness import run_history

    parent = os.getppid()
    while True:
        seed = tasks.get()
        if seed is None or os.getppid() != parent:  # done, or the runner is gone
            return
        results.put(("start", os.getpid(), seed))
        r = run_history(seed, devices_max=devices_max, steps=steps)
        results.put(
            (
                "done",
                os.getpid(),
                Outcome(
                    seed,
                    r.failed,
                    r.categories(),
                    [(f.category, f.message, f.note) for f in r.findings],
                    r.stats,
                    r.seconds,
                    r.lossy,
                ),
            )
        )


def run_many(
    seeds: list[int],
    *,
    jobs: int = 2,
    devices_max: int = 8,
    steps: tuple[int, int] = STEPS,
    hard_timeout: float = HISTORY_TIMEOUT + 60.0,
    progress: Callable[[Summary, Outcome], None] | None = None,
) -> Summary:
    """Run ``seeds`` in ``jobs`` worker processes; ``progress`` hears of each history."""
    ctx = multiprocessing.get_context("spawn")
    tasks: Any = ctx.Queue()
    results: Any = ctx.Queue()
    for s in seeds:
        tasks.put(s)
    summary = Summary()
    started = time.monotonic()
    workers: dict[int, BaseProcess] = {}
    running: dict[int, tuple[int, float]] = {}  # pid -> (seed, started)

    def spawn() -> None:
        old = os.environ.get("PYTHONHASHSEED")
        os.environ["PYTHONHASHSEED"] = HASH_SEED
        try:
            p = ctx.Process(target=_worker, args=(tasks, results, devices_max, steps))
            p.start()
        finally:
            if old is None:
                del os.environ["PYTHONHASHSEED"]
            else:
                os.environ["PYTHONHASHSEED"] = old
        assert p.pid is not None
        workers[p.pid] = p

    def lost(pid: int, why: str) -> None:
        seed, at = running.pop(pid)
        o = Outcome(
            seed,
            True,
            [oracle.HANG],
            [(oracle.HANG, why, False)],
            {},
            time.monotonic() - at,
        )
        summary.outcomes.append(o)
        summary.histories += 1
        if progress is not None:
            progress(summary, o)

    idle_deaths = 0
    for _ in range(max(1, min(jobs, len(seeds)))):
        spawn()
    try:
        while summary.histories < len(seeds):
            try:
                kind, pid, payload = results.get(timeout=1.0)
            except queue.Empty:
                now = time.monotonic()
                for pid, (_seed, at) in list(running.items()):
                    p = workers[pid]
                    if now - at > hard_timeout or not p.is_alive():
                        why = (
                            f"worker killed after {hard_timeout:g}s"
                            if p.is_alive()
                            else f"worker died (exit code {p.exitcode})"
                        )
                        p.kill()
                        p.join()
                        del workers[pid]
                        lost(pid, why)
                        spawn()
                for pid, p in list(workers.items()):  # died between histories
                    if not p.is_alive() and pid not in running:
                        del workers[pid]
                        idle_deaths += 1
                        if idle_deaths > 3 + 2 * jobs:  # they die before any history
                            raise RuntimeError(
                                f"simulation workers keep dying (exit code {p.exitcode}) "
                                "before running a history"
                            ) from None
                        spawn()
                continue
            if kind == "start":
                running[pid] = (payload, time.monotonic())
                idle_deaths = 0
                continue
            running.pop(pid, None)
            summary.outcomes.append(payload)
            summary.histories += 1
            if progress is not None:
                progress(summary, payload)
    finally:
        for _ in workers:
            tasks.put(None)
        for p in workers.values():
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
        summary.seconds = time.monotonic() - started
    return summary
