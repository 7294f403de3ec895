"""ULIDs as text and the revision clock.

This module owns writing a ULID's 16 bytes as its 26 characters, reading its time,
and :class:`RevClock`, which makes ``_rev`` values. Reading ids and checking what
callers give is :mod:`store.documents.docmodel`'s.
"""

from __future__ import annotations

import itertools
import os
import struct
import time
from collections.abc import Callable

from ledgerd.store.documents.docerrors import RevisionInFutureError, RevisionInPastError
from ledgerd.store.documents.doclayout import rev_in_time

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_PAIRS = [a + b for a in _CROCKFORD for b in _CROCKFORD]
"""The two characters of every 10-bit value."""


def ulid_text(raw: bytes) -> str:
    """The 26 characters of a ULID's 16 bytes, as python-ulid writes them: its 128 bits
    after two zero bits, 10 bits (two characters) at a time (a property test checks it
    against python-ulid; this is about three times as fast)."""
    v = int.from_bytes(raw, "big")
    p = _PAIRS
    return (
        p[v >> 120]
        + p[v >> 110 & 1023]
        + p[v >> 100 & 1023]
        + p[v >> 90 & 1023]
        + p[v >> 80 & 1023]
        + p[v >> 70 & 1023]
        + p[v >> 60 & 1023]
        + p[v >> 50 & 1023]
        + p[v >> 40 & 1023]
        + p[v >> 30 & 1023]
        + p[v >> 20 & 1023]
        + p[v >> 10 & 1023]
        + p[v & 1023]
    )


def ulid_ms(raw: bytes) -> int:
    return int.from_bytes(raw[:6], "big")


_RANDOM_BITS = 80
_POOL_BYTES = 4096


class RevClock:
    """Makes ``_rev`` values: ULIDs from a hybrid logical clock.

    A revision is the latest of the wall clock (a new ULID in a new millisecond)
    and the highest revision seen so far, plus a random step of 1 to 2**32 in the
    ULID's random part (so two devices stepping past the same revision do not
    collide). Revisions therefore strictly increase on one device, and a device
    whose clock is slow still makes revisions newer than any it has read.
    """

    def __init__(self, now_ms: Callable[[], int] | None = None) -> None:
        self._now = now_ms or (lambda: time.time_ns() // 1_000_000)
        self.last = 0
        self._pool = b""  # random bytes from the OS, taken 10 or 4 at a time
        self._taken = 0

    def now_ms(self) -> int:
        return self._now()

    def observe(self, rev: bytes) -> None:
        """Take ``rev`` as seen: later revisions follow it. Not one whose time is past
        what a record carries (a damaged head's, a peer's): every revision after it,
        and every document written with them, would be past it too."""
        if rev_in_time(rev):
            self.last = max(self.last, int.from_bytes(rev, "big"))

    def _bytes(self, size: int) -> bytes:
        """``size`` random bytes: one ``os.urandom`` call per 4 KiB."""
        if size > _POOL_BYTES:
            return os.urandom(size)
        at = self._taken
        if at + size > len(self._pool):
            self._pool, at = os.urandom(_POOL_BYTES), 0
        self._taken = at + size
        return self._pool[at : at + size]

    def _random(self, size: int) -> int:
        """``size`` random bytes as an integer."""
        return int.from_bytes(self._bytes(size), "big")

    def next(self) -> bytes:
        now = self._now()
        if now > self.last >> _RANDOM_BITS:
            value = now << _RANDOM_BITS | self._random(_RANDOM_BITS // 8)
        else:
            value = self.last + 1 + self._random(4)
        self.last = value
        return value.to_bytes(16, "big")

    def next_many(self, n: int) -> list[bytes]:
        """``n`` revisions, as ``n`` calls of :meth:`next` in one millisecond make them:
        the first as :meth:`next` makes it, each of the others a random step of 1 to
        2**32 after the one before (a batch's revisions share the millisecond of its
        first; a bulk write makes two per document)."""
        if n <= 0:
            return []
        first = int.from_bytes(self.next(), "big")
        steps = struct.unpack(f">{n - 1}I", self._bytes(4 * (n - 1)))
        values = list(itertools.accumulate([s + 1 for s in steps], initial=first))
        self.last = values[-1]
        return [v.to_bytes(16, "big") for v in values]

    def check_supplied(self, rev: bytes, current: bytes | None, tolerance: float) -> None:
        """Refuse a client's revision that is not after ``current`` or is more than
        ``tolerance`` seconds ahead of this clock; then take it as seen."""
        if current is not None and rev <= current:
            raise RevisionInPastError(
                f"revision {ulid_text(rev)} is not after the current {ulid_text(current)}"
            )
        ahead = ulid_ms(rev) - self._now()
        if ahead > tolerance * 1000:
            raise RevisionInFutureError(
                f"revision {ulid_text(rev)} is {ahead / 1000:.1f} s ahead of this device's"
                f" clock (tolerance {tolerance:g} s): check the clocks"
            )
        self.observe(rev)
