"""How far this device has read each other device's log, and what it could not import.

This module owns the per-device download state that :mod:`sync.engine` keeps in
repository meta (``sync/log/{device}``): the listing cursor, the highest sequence
seen, the gaps (sequences missing below it) and the held packs (listed, not
imported: refused, waiting for parents, or failed here), with their retry
backoff. It does no I/O.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import msgpack

from ledgerd.sync.layout import LogName

REFUSED = "refused"
"""The pack is malformed or fails verification."""
WAITING = "waiting"
"""The pack's commits need parents that no pack imported so far holds."""
FAILED = "failed"
"""This device could not import it (its page cannot be opened or written)."""
DEFERRED = "deferred"
"""A transient failure (the cloud, a page closing); retried on the next poll."""
RETRY = "retry"
"""Held before a restart; tried again on the first poll."""


def backoff(attempts: int, first: float, most: float) -> float:
    """Seconds to wait after ``attempts`` failures: doubling from ``first`` up to ``most``."""
    return float(min(most, first * 2 ** max(0, min(attempts - 1, 40))))


@dataclass
class Held:
    """A listed pack that is not imported yet, and why."""

    ln: LogName
    state: str
    reason: str
    since: float = field(default_factory=time.time)
    attempts: int = 0
    due: float = 0.0  # monotonic time of the next try

    def json(self) -> dict[str, Any]:
        return {
            "pack": self.ln.name,
            "device": self.ln.device,
            "seq": self.ln.seq,
            "state": self.state,
            "error": self.reason,
            "since": self.since,
            "attempts": self.attempts,
            "retry_in_s": round(max(0.0, self.due - time.monotonic()), 1),
        }


@dataclass
class Gap:
    """Sequences ``first..last`` of a device that its log does not show (yet)."""

    first: int
    last: int
    since: float = field(default_factory=time.time)


@dataclass
class DeviceLog:
    device: str
    cursor: str = ""  # the last name listed after
    max_seq: int = 0  # the highest sequence listed
    gaps: list[Gap] = field(default_factory=list)
    held: dict[str, Held] = field(default_factory=dict)
    probes: int = 0  # gap probes that found nothing since the last find
    probe_due: float = 0.0

    # -- gaps ------------------------------------------------------------------------

    def saw(self, seq: int) -> None:
        """A pack with this sequence is listed: gaps below it, and one gap less."""
        if seq > self.max_seq + 1:
            self.gaps.append(Gap(self.max_seq + 1, seq - 1))
        self.max_seq = max(self.max_seq, seq)
        self.fill(seq)

    def in_gap(self, seq: int) -> bool:
        return any(g.first <= seq <= g.last for g in self.gaps)

    def fill(self, seq: int) -> None:
        out: list[Gap] = []
        for g in self.gaps:
            if g.first <= seq <= g.last:
                if g.first < seq:
                    out.append(Gap(g.first, seq - 1, g.since))
                if seq < g.last:
                    out.append(Gap(seq + 1, g.last, g.since))
            else:
                out.append(g)
        self.gaps = out

    # -- persistence -----------------------------------------------------------------

    def encode(self) -> bytes:
        return bytes(
            msgpack.packb(
                {
                    "cursor": self.cursor,
                    "max_seq": self.max_seq,
                    "gaps": [[g.first, g.last, g.since] for g in self.gaps],
                    "held": sorted(self.held),
                }
            )
        )

    @classmethod
    def decode(cls, device: str, data: bytes) -> DeviceLog:
        """Raises ValueError if ``data`` is not what :meth:`encode` wrote."""
        try:
            d = msgpack.unpackb(data, raw=False)
            log = cls(device, str(d["cursor"]), int(d["max_seq"]))
            log.gaps = [Gap(int(a), int(b), float(t)) for a, b, t in d["gaps"]]
            names = [str(n) for n in d["held"]]
        except Exception as e:  # msgpack raises several unrelated types
            raise ValueError(f"unreadable sync state of device {device}: {e}") from e
        for name in names:
            ln = LogName.parse(name, device)
            if ln is not None:
                log.held[name] = Held(ln, RETRY, "not imported before the restart")
        return log
