"""The simulation's bucket: an in-memory :class:`CloudStore`, and the faults laid over it.

:class:`MemoryStore` is a plain, correct bucket (it passes the cloud contract suite:
``tests/sim/test_memory_store.py``). :class:`SimBucket` holds one and the per-seed
faults; each device reaches it through its own :class:`DeviceCloud`, which counts
that device's requests (a crash point can be the k-th of them) and injects, by the
bucket's random stream: transient errors before or after a call is done, timeouts,
and listings that lag behind PUTs (and behind DELETEs, when a seed says so). Nothing
here awaits anything: every call is done at once, on the event loop, in call order.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from ledgerd.sync.cloud import CloudStore, check_name, check_prefix
from ledgerd.sync.errors import (
    AlreadyExistsError,
    CloudNotFoundError,
    RangeNotInObjectError,
    TransientCloudError,
)


class MemoryStore(CloudStore):
    """Write-once objects in a dict, names kept sorted for listings."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.names: list[str] = []  # sorted

    async def put(self, name: str, data: bytes) -> None:
        check_name(name)
        if name in self.objects:
            raise AlreadyExistsError(f"{name} exists")
        self.objects[name] = bytes(data)
        bisect.insort(self.names, name)

    async def get(self, name: str, offset: int = 0, length: int | None = None) -> bytes:
        check_name(name)
        data = self.objects.get(name)
        if data is None:
            raise CloudNotFoundError(f"no object {name}")
        if length == 0:
            return b""
        if (offset or length is not None) and offset >= len(data):
            raise RangeNotInObjectError(
                f"{name}: range from {offset} is past the end ({len(data)} bytes)"
            )
        return data[offset:] if length is None else data[offset : offset + length]

    def listed(self, prefix: str = "", after: str = "") -> list[str]:
        """The names :meth:`list` yields, at once."""
        check_prefix(prefix)
        start = max(bisect.bisect_left(self.names, prefix), bisect.bisect_right(self.names, after))
        out = []
        for n in self.names[start:]:
            if not n.startswith(prefix):
                break
            out.append(n)
        return out

    async def list(self, prefix: str = "", after: str = "") -> AsyncIterator[str]:
        for n in self.listed(prefix, after):
            yield n

    async def delete(self, name: str) -> None:
        check_name(name)
        if self.objects.pop(name, None) is not None:
            del self.names[bisect.bisect_left(self.names, name)]


class SimCrash(Exception):
    """The simulated process died here: nothing it does after reaches disk or bucket.

    An Exception (not a BaseException) so that the store's own handlers treat it as
    any failure; what makes the death real is that every later write and request of
    the device raises it again (:attr:`CrashPoints.dead`)."""


@dataclass
class CrashPoints:
    """One device's armed crash: at its k-th SQLite write or k-th cloud request,
    ``before`` (not done) or after (done, then the process dies)."""

    label: str
    db_countdown: int | None = None
    db_before: bool = True
    cloud_countdown: int | None = None
    cloud_before: bool = True
    dead: bool = False
    fired: str | None = None
    db_writes: int = 0
    cloud_requests: int = 0

    def _fire(self, what: str) -> None:
        self.dead = True
        self.fired = what

    def db_write(self, what: str) -> bool:
        """Before a write; raises if the process dies before it, True if it dies after."""
        if self.dead:
            raise SimCrash(f"{self.label} is dead ({what})")
        self.db_writes += 1
        if self.db_countdown is None:
            return False
        self.db_countdown -= 1
        if self.db_countdown > 0:
            return False
        self.db_countdown = None
        when = "before" if self.db_before else "after"
        self._fire(f"SQLite write #{self.db_writes} ({what}), {when} it")
        if self.db_before:
            raise SimCrash(f"{self.label} crashed {when} SQLite write {what}")
        return True

    def cloud(self, what: str) -> bool:
        """Before a cloud request; as :meth:`db_write`."""
        if self.dead:
            raise SimCrash(f"{self.label} is dead ({what})")
        self.cloud_requests += 1
        if self.cloud_countdown is None:
            return False
        self.cloud_countdown -= 1
        if self.cloud_countdown > 0:
            return False
        self.cloud_countdown = None
        when = "before" if self.cloud_before else "after"
        self._fire(f"cloud request #{self.cloud_requests} ({what}), {when} it")
        if self.cloud_before:
            raise SimCrash(f"{self.label} crashed {when} {what}")
        return True

    def after(self, what: str) -> None:
        raise SimCrash(f"{self.label} crashed after {what}")


@dataclass
class Faults:
    """What a seed's bucket does wrong (all off while the history settles)."""

    error_rate: float = 0.0  # each call: this chance of an error before, and after
    timeout_rate: float = 0.0  # each call: this chance of a timeout (done or not)
    list_lag: int = 0  # a PUT is listed up to this many steps later (LIST_LAG_MOST at most)
    delete_lag: int = 0  # a deleted object is still listed up to this many steps
    on: bool = True


LIST_LAG_MOST = 30.0
"""Simulated seconds after which a PUT is listed whatever its lag in steps: a store's
listing lags its writes by seconds, and the feed's listing window (two minutes) is
what covers that; a lag of hours (steps across a leap of time) is no store's."""


@dataclass
class _Ghost:
    name: str
    until: int


@dataclass
class SimBucket:
    """The bucket every device shares; ``step`` is the simulation's step counter."""

    rng: random.Random
    faults: Faults
    log: Callable[[str], None]
    store: MemoryStore = field(default_factory=MemoryStore)
    step: int = 0
    now: Callable[[], float] = lambda: 0.0  # simulated time (seconds)
    visible_at: dict[str, tuple[int, float]] = field(default_factory=dict)
    ghosts: dict[str, int] = field(default_factory=dict)  # deleted, listed until
    injected: int = 0

    def view(self, label: str, crash: Callable[[], CrashPoints]) -> DeviceCloud:
        return DeviceCloud(self, label, crash)

    def _roll(self, rate: float) -> bool:
        return self.faults.on and rate > 0 and self.rng.random() < rate

    def fault(self, label: str, what: str, stage: str) -> None:
        """Maybe raise a transient error ``before`` or ``after`` the call is done."""
        if self._roll(self.faults.error_rate):
            self.injected += 1
            self.log(f"  fault: {label} {what}: transient error {stage} it")
            raise TransientCloudError(f"injected: {what} failed {stage} it")
        if stage == "after" and self._roll(self.faults.timeout_rate):
            self.injected += 1
            self.log(f"  fault: {label} {what}: timed out (it was done)")
            raise TransientCloudError(f"injected: {what} timed out")

    def timeout_before(self, label: str, what: str) -> None:
        if self._roll(self.faults.timeout_rate):
            self.injected += 1
            self.log(f"  fault: {label} {what}: timed out (not done)")
            raise TransientCloudError(f"injected: {what} timed out")

    def stored(self, name: str) -> None:
        lag = self.rng.randint(0, self.faults.list_lag) if self.faults.list_lag else 0
        if lag and self.faults.on:
            self.visible_at[name] = (self.step + lag, self.now() + LIST_LAG_MOST)

    def removed(self, name: str) -> None:
        self.visible_at.pop(name, None)
        lag = self.rng.randint(0, self.faults.delete_lag) if self.faults.delete_lag else 0
        if lag and self.faults.on:
            self.ghosts[name] = self.step + lag

    def listing(self, prefix: str, after: str) -> list[str]:
        names = self.store.listed(prefix, after)
        if self.visible_at:
            now = self.now()
            names = [n for n in names if self._visible(n, now)]
        ghosts = [
            n
            for n, until in self.ghosts.items()
            if until > self.step and n.startswith(prefix) and n > after
        ]
        return sorted(names + ghosts) if ghosts else names

    def _visible(self, name: str, now: float) -> bool:
        at = self.visible_at.get(name)
        return at is None or at[0] <= self.step or at[1] <= now

    def settle(self) -> None:
        """Faults off, everything listed as it is."""
        self.faults.on = False
        self.visible_at.clear()
        self.ghosts.clear()

    def lose(self, name: str) -> None:
        """Delete an object behind every device's back (a lossy seed)."""
        self.removed(name)
        self.store.objects.pop(name, None)
        i = bisect.bisect_left(self.store.names, name)
        if i < len(self.store.names) and self.store.names[i] == name:
            del self.store.names[i]


class DeviceCloud(CloudStore):
    """One device's way to the bucket: its crash point and the bucket's faults."""

    def __init__(self, bucket: SimBucket, label: str, crash: Callable[[], CrashPoints]) -> None:
        self.bucket = bucket
        self.label = label
        self.crash = crash  # the device's current process's crash points

    async def put(self, name: str, data: bytes) -> None:
        b = self.bucket
        what = f"PUT {name}"
        dies_after = self.crash().cloud(what)
        b.timeout_before(self.label, what)
        b.fault(self.label, what, "before")
        await b.store.put(name, data)
        b.stored(name)
        if dies_after:
            self.crash().after(what)
        b.fault(self.label, what, "after")

    async def get(self, name: str, offset: int = 0, length: int | None = None) -> bytes:
        b = self.bucket
        what = f"GET {name}"
        dies_after = self.crash().cloud(what)
        b.timeout_before(self.label, what)
        b.fault(self.label, what, "before")
        data = await b.store.get(name, offset, length)
        if dies_after:
            self.crash().after(what)
        b.fault(self.label, what, "after")
        return data

    async def list(self, prefix: str = "", after: str = "") -> AsyncIterator[str]:
        b = self.bucket
        what = f"LIST {prefix or '/'}"
        dies_after = self.crash().cloud(what)
        b.timeout_before(self.label, what)
        b.fault(self.label, what, "before")
        names = b.listing(prefix, after)
        if dies_after:
            self.crash().after(what)
        b.fault(self.label, what, "after")
        for n in names:
            yield n

    async def delete(self, name: str) -> None:
        b = self.bucket
        what = f"DELETE {name}"
        dies_after = self.crash().cloud(what)
        b.timeout_before(self.label, what)
        b.fault(self.label, what, "before")
        existed = name in b.store.objects
        await b.store.delete(name)
        if existed:
            b.removed(name)
            b.log(f"  bucket: {self.label} deleted {name}")
        if dies_after:
            self.crash().after(what)
        b.fault(self.label, what, "after")
