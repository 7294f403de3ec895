"""How far this device has read each other device's log, and what it could not import.

This module owns the per-device download state that :mod:`sync.feed` keeps in
repository meta (``sync/log/{device}``): the highest sequence seen and its feed
time, the gaps (sequences missing below it, with the feed times between which
they must lie), the held packs (listed, not imported: refused, waiting for
writes it has not seen, or failed here; a whole pack or one page of it), with their
retry backoff. It does no I/O.
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, field
from typing import Any

import msgpack

from ledgerd.sync.layout import PackName

Key = tuple[bytes, bytes]

REFUSED = "refused"
"""The pack is malformed or fails verification."""
KEY_MISSING = "key_missing"
"""The pack is sealed with an encryption key this device does not have (not damaged)."""
WAITING = "waiting"
"""The pack's page needs writes (its writer's earlier ones, or ones it had seen) that
no pack imported so far holds: it is applied once they arrive, or once the page
joins a checkpoint that holds them."""
FAILED = "failed"
"""This device could not import it (its page cannot be opened or written)."""
DEFERRED = "deferred"
"""A transient failure (the cloud, a page closing); retried on the next poll."""
RETRY = "retry"
"""Held before a restart; tried again on the first poll."""


def backoff(attempts: int, first: float, most: float) -> float:
    """Seconds to wait after ``attempts`` failures: doubling from ``first`` up to ``most``."""
    return float(min(most, first * 2 ** max(0, min(attempts - 1, 40))))


def held_id(name: str, key: Key | None) -> str:
    return name if key is None else f"{name}#{key[0].hex()}.{key[1].hex()}"


@dataclass
class Held:
    """A listed pack (or one page of it: ``key``) that is not imported yet, and why."""

    ln: PackName
    key: Key | None
    state: str
    reason: str
    since: float = field(default_factory=time.time)
    attempts: int = 0
    due: float = 0.0  # monotonic time of the next try

    @property
    def id(self) -> str:
        return held_id(self.ln.name, self.key)

    def page_is(self, key: Key) -> bool:
        """Whether this is held for page ``key`` (a whole pack held counts for none)."""
        return self.key == key

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
    """Sequences ``first..last`` of a device that its log does not show (yet).

    A device's feed times grow with its sequence numbers, so the missing packs
    have feed times in ``[after, until]``: a probe lists just that stretch."""

    first: int
    last: int
    since: float = field(default_factory=time.time)
    after: int = 0  # feed time of the pack before the gap (0: unknown)
    until: int = 0  # feed time of the pack after it (0: unknown)


def _first(g: Gap) -> int:
    return g.first


@dataclass
class DeviceLog:
    device: str
    max_seq: int = 0  # the highest sequence listed
    gaps: list[Gap] = field(default_factory=list)
    held: dict[str, Held] = field(default_factory=dict)
    probes: int = 0  # gap probes that found nothing since the last find
    probe_due: float = 0.0
    max_time: int = 0  # feed time of the pack with max_seq
    # Packs up to here may be compacted away (a checkpoint holds them): a gap up to
    # here goes once probed (:meth:`drop_covered`). A pack listed is still new.
    floor: int = 0
    floor_time: int = 0  # feed time of the newest checkpoint that set ``floor``

    # -- gaps ------------------------------------------------------------------------

    def is_new(self, seq: int) -> bool:
        return seq > self.max_seq or self.in_gap(seq)

    def saw(self, seq: int, feed_time: int = 0, now: float | None = None) -> None:
        """A pack with this sequence is listed (at wall time ``now``): gaps below it,
        and one gap less. (A gap below ``floor`` goes once a probe shows it gone a
        window after it was seen: :meth:`drop_covered`.)"""
        first = self.max_seq + 1
        if seq > first:
            since = time.time() if now is None else now
            self.gaps.append(Gap(first, seq - 1, since, self.max_time, feed_time))
        if seq > self.max_seq:
            self.max_seq, self.max_time = seq, feed_time
        self.fill(seq, feed_time)

    def restart(self) -> None:
        """For a device back after longer than the compaction grace: its floor comes
        again from the checkpoints it reads (one since replaced, or found wrong, hides
        nothing), and its gaps stay, each to go once a probe shows it compacted (see
        :mod:`sync.feed`, Gaps and restarts), or filled."""
        self.floor = self.floor_time = 0

    def missing(self) -> list[Gap]:
        """The gaps a checkpoint's cover does not explain: packs missing for all this
        device knows. (One up to ``floor`` is compacted, or late, and goes either way
        once probed: no problem to report meanwhile.)"""
        return [g for g in self.gaps if g.last > self.floor]

    def drop_covered(self, seen_before: float, named_before: int) -> None:
        """Drop the gaps up to ``floor`` that a probe (or a whole listing) did not find,
        and that were seen before wall time ``seen_before``, or are covered by
        checkpoints named before feed time ``named_before`` (each a window ago):
        their packs went up before the pack after them, which was listed a window
        ago, or before such a checkpoint's writer read them, and would be listed by
        now (a listing lags a PUT by less), so they were compacted (a checkpoint
        covers them). Others may still be on their way, and stay gaps until then."""
        if not self.gaps or not self.floor:
            return
        old_cover = 0 < self.floor_time < named_before
        self.gaps = [
            g
            for g in self.gaps
            if not (g.last <= self.floor and (old_cover or g.since < seen_before))
        ]

    def _gap_at(self, seq: int) -> int:
        """The index of the gap holding ``seq``, or -1. Gaps are disjoint and kept in
        order (a new one lies above them all, a filled one is split in place), so this
        is a binary search: a device naming every other sequence makes as many gaps as
        it names packs, and a scan per name made listing them quadratic."""
        i = bisect.bisect_right(self.gaps, seq, key=_first) - 1
        return i if i >= 0 and seq <= self.gaps[i].last else -1

    def in_gap(self, seq: int) -> bool:
        return self._gap_at(seq) >= 0

    def fill(self, seq: int, feed_time: int = 0) -> None:
        i = self._gap_at(seq)
        if i < 0:
            return
        g = self.gaps[i]
        parts: list[Gap] = []
        if g.first < seq:
            parts.append(Gap(g.first, seq - 1, g.since, g.after, feed_time or g.until))
        if seq < g.last:
            parts.append(Gap(seq + 1, g.last, g.since, max(g.after, feed_time), g.until))
        self.gaps[i : i + 1] = parts

    # -- persistence -----------------------------------------------------------------

    def encode(self) -> bytes:
        return bytes(
            msgpack.packb(
                {
                    "max_seq": self.max_seq,
                    "max_time": self.max_time,
                    "floor": self.floor,
                    "floor_time": self.floor_time,
                    "gaps": [[g.first, g.last, g.since, g.after, g.until] for g in self.gaps],
                    # In the order of their ids: a pack can be held whole (no key)
                    # and for a page, and None does not compare with bytes.
                    "held": [
                        [h.ln.name, *(h.key or (None, None))] for _, h in sorted(self.held.items())
                    ],
                }
            )
        )

    @classmethod
    def decode(cls, device: str, data: bytes) -> DeviceLog:
        """Raises ValueError if ``data`` is not what :meth:`encode` wrote."""
        try:
            d = msgpack.unpackb(data, raw=False)
            log = cls(device, int(d["max_seq"]))
            log.max_time = int(d.get("max_time", 0))
            log.floor = int(d.get("floor", 0))
            log.floor_time = int(d.get("floor_time", 0))
            gaps = [Gap(int(g[0]), int(g[1]), float(g[2]), *map(int, g[3:])) for g in d["gaps"]]
            log.gaps = sorted(gaps, key=_first)  # (as encode wrote them)
            held: list[tuple[str, Key | None]] = []
            for h in d["held"]:
                held.append((str(h[0]), (bytes(h[1]), bytes(h[2])) if h[1] else None))
        except Exception as e:  # msgpack raises several unrelated types
            raise ValueError(f"unreadable sync state of device {device}: {e}") from e
        for name, key in held:
            ln = PackName.parse(name)
            if ln is not None and ln.device == device:
                h = Held(ln, key, RETRY, "not imported before the restart")
                log.held[h.id] = h
        return log
