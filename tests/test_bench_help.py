"""Every benchmark module answers ``--help`` at once: it parses its arguments before
it measures anything (``bench.sync_scale --help`` once ran the whole benchmark)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HELPERS = {"__init__", "common"}
"""Modules of bench/ that are no command."""
MODULES = sorted(p.stem for p in (ROOT / "bench").glob("*.py") if p.stem not in HELPERS)
BOUND_S = 20.0
"""Generous: not a speed figure, only "it did not run the benchmark"."""


def test_the_modules_are_found() -> None:
    assert {"daemon", "reads", "sync_scale"} <= set(MODULES)


@pytest.mark.parametrize("module", MODULES)
def test_help_exits_at_once(module: str) -> None:
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", f"bench.{module}", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    took = time.monotonic() - start
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout, done.stdout[-2000:]
    assert took < BOUND_S, f"bench.{module} --help took {took:.1f} s"
