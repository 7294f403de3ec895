"""Simulated time: one time that the history advances step by step, and a clock per
device reading it with that device's skew (which jumps forward and back).

The store and sync take clocks as parameters (``Repository.open(clock=...)``,
``SyncEngine(clock=..., monotonic=...)``): each device's wall clock is simulated time
plus its skew, its monotonic clock simulated time alone (no skew, no jumps). The
monotonic clock of what else runs (held packs' backoff) is also simulated time; the
harness forces the retries it would schedule (full rounds).
"""

from __future__ import annotations

from dataclasses import dataclass

EPOCH = 1_800_000_000.0
"""Where simulated time starts (2027-01-15): UNIX seconds."""


@dataclass
class SimTime:
    now: float = EPOCH

    def advance(self, seconds: float) -> None:
        self.now += seconds

    @property
    def elapsed(self) -> float:
        return self.now - EPOCH


@dataclass
class DeviceClock:
    """A device's wall clock: simulated time plus its skew (seconds)."""

    time: SimTime
    skew: float = 0.0

    def __call__(self) -> float:
        return self.time.now + self.skew

    def jump(self, seconds: float) -> None:
        self.skew += seconds


def span(seconds: float) -> str:
    """``seconds`` shortly, signed: ``+10m``, ``-1h``, ``+2.5s``, ``+3d``."""
    sign = "-" if seconds < 0 else "+"
    s = abs(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size and (s % size == 0 or s >= 10 * size):
            return f"{sign}{s / size:.4g}{unit}"
    return f"{sign}{s:.3g}s"
