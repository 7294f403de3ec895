"""The simulation in the suite: N seeded histories, exact replays, reads while merging.

``LEDGERD_SIM_HISTORIES`` (300) histories from ``LEDGERD_SIM_SEED_START`` (0), in two
worker processes. A failure names each seed with its symptoms and the command that
replays it; add it to tests/sim/regressions.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.sim.latency import BOUND_MS, read_latency
from tests.sim.runner import Summary, run_many

ROOT = Path(__file__).resolve().parents[2]
HISTORIES = int(os.environ.get("LEDGERD_SIM_HISTORIES", "300"))
SEED_START = int(os.environ.get("LEDGERD_SIM_SEED_START", "0"))
REPLAYED = 3
"""A seed with crashes, faults, clock jumps and a barrier (checked below)."""


def report(summary: Summary) -> str:
    lines = [f"{len(summary.failures)} of {summary.histories} histories failed:"]
    for o in summary.failures:
        lines.append(
            f"  seed {o.seed} ({', '.join(o.categories)}): python -m bench.sim --replay {o.seed}"
        )
        for category, message, note in o.findings[:3]:
            if not note:
                lines.append(f"      {category}: {message[:200]}")
    return "\n".join(lines)


@pytest.mark.timeout(1200)
def test_seeded_histories_converge() -> None:
    seeds = list(range(SEED_START, SEED_START + HISTORIES))
    summary = run_many(seeds, jobs=2)
    print(summary.json())
    assert not summary.failures, report(summary)


def _replay(seed: int) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-m", "bench.sim", "--replay", str(seed)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    ).stdout.splitlines()
    # The last line is the JSON summary, with the wall time it took.
    return [line for line in out if '"seconds":' not in line]


@pytest.mark.timeout(600)
def test_a_seed_replays_to_the_same_history() -> None:
    first, second = _replay(REPLAYED), _replay(REPLAYED)
    text = "\n".join(first)
    for what in ("CRASH", "fault:", "clock jumps", "barrier", "restarted"):
        assert what in text, f"seed {REPLAYED} no longer exercises {what!r}: pick another"
    assert first == second


@pytest.mark.timeout(600)
def test_reads_answer_while_a_large_import_merges() -> None:
    got = read_latency()
    print(got.json())
    assert got.reads >= 5, f"the import was too quick to measure reads during it: {got}"
    assert got.p90_ms < BOUND_MS, f"reads waited for the merge: {got.json()}"


def test_bench_sim_help_runs_nothing() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench.sim", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and "--replay" in out.stdout
