"""Helpers shared by the benchmarks: timing, peak RSS, JSON output."""

from __future__ import annotations

import json
import platform
import resource
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Timer:
    seconds: float = 0.0


@contextmanager
def timed() -> Iterator[Timer]:
    t = Timer()
    start = time.perf_counter()
    try:
        yield t
    finally:
        t.seconds = time.perf_counter() - start


def emit(name: str, figures: dict[str, Any]) -> None:
    """Print one JSON document: the benchmark's name, the machine, and its figures."""
    doc = {
        "benchmark": name,
        "python": platform.python_version(),
        "machine": platform.machine(),
        **figures,
    }
    json.dump(doc, sys.stdout, indent=2)
    sys.stdout.write("\n")
