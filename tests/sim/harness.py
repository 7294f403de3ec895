"""One seeded history of the whole system: devices, the bucket, clocks, crashes, checks.

:func:`run_history` runs seed ``S``: 2-8 devices (a real Repository and SyncEngine
each, on its own directory) in one event loop, sharing one :class:`SimBucket`. Every
random choice comes from ``random.Random(S)`` (split into the workload's, the bucket's
and the entropy stream that replaces ``os.urandom``); the devices' operations run one
at a time, each awaited to its commit, so a seed replays to the same history. After
the workload the history settles (faults off, everyone syncs until a whole cycle moves
nothing) and :mod:`tests.sim.oracle` judges it.

The devices are reached only through :mod:`tests.sim.adapter`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import random
import shutil
import tempfile
import time
import traceback
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ledgerd.store import (
    DocumentConflictError,
    DocumentNotFoundError,
    InvalidArgumentError,
    NotEvictableError,
    PageUnavailableError,
    Repository,
    StoreError,
)
from ledgerd.sync.engine import SyncEngine
from ledgerd.sync.errors import SyncError
from ledgerd.sync.feed import FEED_WINDOW
from tests.sim import adapter, oracle
from tests.sim.bucket import CrashPoints, DeviceCloud, Faults, SimBucket, SimCrash
from tests.sim.clock import DeviceClock, SimTime, span
from tests.sim.oracle import Finding, Model, Write

HISTORY_TIMEOUT = 240.0
"""Seconds of wall time a history may take before it counts as a hang."""
SYNC_TIMEOUT = 60.0
STORM_FACTOR = 2
"""A device's commits of a page may be at most this many times what its writes and the
merges of every round could make (plus :data:`STORM_SLACK`): see :func:`_storm`."""
STORM_SLACK = 20

REFUSED_BEFORE_WRITING = (
    DocumentNotFoundError,
    DocumentConflictError,
    InvalidArgumentError,
    NotEvictableError,
)
"""Errors a write raises before it writes anything (it did not happen)."""

STEPS = (40, 120)
"""The fewest and most steps of a history (before it settles)."""
SKEWS = [0.0, 0.0, 0.0, 0.004, -2.5, 7.0, 600.0, -3600.0, 3600.0, -600.0]
JUMPS = [30.0, 600.0, 3600.0, -5.0, -90.0, -3600.0, 86400.0]
RETENTIONS = [0.0, 0.0, 1.0, 30.0, 600.0, 3600.0, 86400.0, 30 * 86400.0]
GRACES = [20.0, 60.0, 300.0, 3600.0, 86400.0, 30 * 86400.0]


@dataclass
class Config:
    """What a seed chose for its history, before its first step."""

    seed: int
    devices: int
    initial: int
    steps: int
    pages: list[tuple[bytes, str]]  # page id, policy ('lww', 'auto', 'custom') or 'docs'
    settings: adapter.EngineSettings
    floor: int
    faults: Faults
    crash_rate: float
    away_rate: float
    jump_rate: float
    barrier_rate: float
    lossy: bool
    skews: list[float]

    def describe(self) -> list[str]:
        s = self.settings
        return [
            f"seed {self.seed}: {self.devices} devices ({self.initial} at the start), "
            f"{self.steps} steps, pages "
            + ", ".join(f"{pid.decode()}={kind}" for pid, kind in self.pages),
            f"  history_retention {span(s.history_retention)}, compaction_grace "
            f"{span(s.compaction_grace)}, checkpoint_interval {s.checkpoint_interval:g}s, "
            f"checkpoint floor {self.floor} B, max_checkpoint {s.max_checkpoint} B, "
            f"max_pack {s.max_pack} B, encryption {'on' if s.key else 'off'}",
            f"  faults: errors {self.faults.error_rate:.2f}, timeouts "
            f"{self.faults.timeout_rate:.2f}, list lag {self.faults.list_lag} steps, delete "
            f"lag {self.faults.delete_lag} steps{', LOSSY' if self.lossy else ''}; crash rate "
            f"{self.crash_rate:.2f}, away rate {self.away_rate:.2f}, clock jumps "
            f"{self.jump_rate:.2f}, barriers {self.barrier_rate:.2f}",
            "  clock skews: " + ", ".join(f"d{i} {span(k)}" for i, k in enumerate(self.skews)),
        ]


def make_config(seed: int, devices_max: int = 8, steps: tuple[int, int] = STEPS) -> Config:
    rng = random.Random(f"config-{seed}")
    devices = min(devices_max, rng.choice([2, 2, 2, 3, 3, 3, 4, 4, 5, 6, 8]))
    devices = max(2, devices)
    kinds = ["lww", "lww", "auto", "custom"]
    pages = [(b"p0", rng.choice(kinds))]
    if rng.random() < 0.5:
        pages.append((b"p1", rng.choice(kinds)))
    if rng.random() < 0.4:
        pages.append((b"docs", "docs"))
    heavy = rng.random() < 0.3  # a seed that stresses faults
    error_rate = rng.choice([0.0, 0.0, 0.02, 0.05, 0.1]) * (2 if heavy else 1)
    faults = Faults(
        error_rate=error_rate,
        timeout_rate=rng.choice([0.0, 0.0, 0.02, 0.05]),
        list_lag=rng.choice([0, 0, 0, 1, 3, 6]),
        delete_lag=rng.choice([0, 0, 0, 2]),
    )
    return Config(
        seed=seed,
        devices=devices,
        initial=rng.randint(min(2, devices), devices),
        steps=rng.randint(*steps),
        pages=pages,
        settings=adapter.EngineSettings(
            history_retention=rng.choice(RETENTIONS),
            compaction_grace=rng.choice(GRACES),
            checkpoint_interval=rng.choice([0.0, 0.0, 1e9]),
            max_checkpoint=rng.choice([64 * 1024 * 1024] * 4 + [4096]),
            max_pack=rng.choice([32 * 1024 * 1024] * 4 + [2048]),
            key=rng.randbytes(32) if rng.random() < 0.35 else None,
        ),
        floor=rng.choice([256, 1024, 8192, 65536]),
        faults=faults,
        crash_rate=rng.choice([0.0, 0.03, 0.06, 0.12]),
        away_rate=rng.choice([0.0, 0.02, 0.05]),
        jump_rate=rng.choice([0.0, 0.02, 0.05]),
        barrier_rate=rng.choice([0.0, 0.03, 0.06]),
        lossy=rng.random() < 0.03,
        skews=[rng.choice(SKEWS) for _ in range(devices)],
    )


@dataclass
class Device:
    index: int
    root: Path
    clock: DeviceClock
    points: CrashPoints
    cloud: DeviceCloud = field(init=False)
    repo: Repository | None = None
    engine: SyncEngine | None = None
    away_until: int | None = None
    away_long: bool = False
    resolver: bool = True  # its conflict resolver is connected
    process: int = 0  # how many times it was opened

    @property
    def label(self) -> str:
        return f"d{self.index}"

    @property
    def up(self) -> bool:
        return self.repo is not None and self.away_until is None


@dataclass
class Result:
    seed: int
    findings: list[Finding]
    stats: dict[str, Any]
    seconds: float
    lines: list[str] = field(default_factory=list)
    lossy: bool = False

    @property
    def failed(self) -> bool:
        return any(not f.note for f in self.findings)

    def categories(self) -> list[str]:
        return sorted({f.category for f in self.findings if not f.note})


class _Capture(logging.Handler):
    """The history's log: ledgerd's warnings and errors, in order."""

    def __init__(self, sink: Callable[[str], None]) -> None:
        super().__init__(logging.WARNING)
        self.sink = sink
        self.corrupt: list[str] = []
        self.closed = False

    def emit(self, record: logging.LogRecord) -> None:
        if self.closed:  # the devices' last closes, with every write refused
            return
        try:
            text = record.getMessage().splitlines()[0][:400]
        except Exception:  # a record that cannot be formatted still counts
            text = str(record.msg)[:400]
        self.sink(f"  log {record.levelname} {record.name}: {text}")
        low = text.lower()
        exc = record.exc_info[1] if record.exc_info else None
        if (
            "refused" in low
            or "corrupt" in low
            or (exc is not None and "Corrupt" in type(exc).__name__)
        ):
            self.corrupt.append(text)


class History:
    def __init__(self, cfg: Config, base: Path, *, verbose: bool = False) -> None:
        self.cfg = cfg
        self.base = base
        self.verbose = verbose
        master = random.Random(cfg.seed)
        self.rng = random.Random(master.getrandbits(64))  # the workload's choices
        self.bucket_rng = random.Random(master.getrandbits(64))
        self.entropy = random.Random(master.getrandbits(64))  # os.urandom's stand-in
        self.lines: list[str] = []
        self.time = SimTime()
        self.bucket = SimBucket(self.bucket_rng, cfg.faults, self.log, now=lambda: self.time.now)
        self.devices: list[Device] = []
        self.model = Model()
        self.findings: list[Finding] = []
        self.kinds = dict(cfg.pages)
        self.step = 0
        self.doc_ids: list[str] = []
        self.counter = 0
        self.stats: dict[str, Any] = defaultdict(int)
        self.stats |= {
            k: 0
            for k in (
                "writes",
                "rounds",
                "syncs",
                "crashes",
                "restarts",
                "gcs",
                "evictions",
                "compactions",
                "packs_compacted",
                "joins",
                "aways",
                "barriers",
                "op_errors",
                "lost_objects",
            )
        }
        self.refused_seen: set[str] = set()

    # -- output ------------------------------------------------------------------

    def log(self, line: str) -> None:
        self.lines.append(line)
        if self.verbose:
            print(line, flush=True)

    def clocks(self) -> str:
        return ",".join(span(d.clock.skew) for d in self.devices)

    def say(self, dev: Device | None, text: str) -> None:
        who = f"{dev.label} " if dev is not None else ""
        self.log(f"{self.step:4d} T{span(self.time.elapsed)} [{self.clocks()}] {who}{text}")

    def find(self, category: str, message: str) -> None:
        note = category in oracle.NOTES or (self.cfg.lossy and category in oracle.LOSSY_NOTES)
        self.findings.append(Finding(category, message, note))
        self.log(f"  FINDING {category}{' (note: lossy)' if note else ''}: {message}")

    # -- devices -----------------------------------------------------------------

    def add_device(self) -> Device:
        i = len(self.devices)
        root = self.base / f"d{i}"
        dev = Device(i, root, DeviceClock(self.time, self.cfg.skews[i]), CrashPoints(f"d{i}"))
        dev.cloud = self.bucket.view(dev.label, lambda: dev.points)
        self.devices.append(dev)
        return dev

    def _fresh_points(self, dev: Device) -> None:
        dev.points = CrashPoints(dev.label)

    async def open(self, dev: Device, crash_within: int | None = None) -> bool:
        """Open the device's directory (a new process); ``crash_within``: a crash armed
        at one of its first SQLite writes, which its recovery may reach (the process then
        dies again, and the next one opens without)."""
        self._fresh_points(dev)
        adapter.register_root(dev.root, lambda: dev.points)
        if crash_within is not None:
            dev.points.db_countdown = crash_within
        first = dev.process == 0
        dev.process += 1
        try:
            dev.repo, dev.engine = await adapter.open_device(
                dev.root, dev.cloud, self.cfg.settings, dev.clock, dev.resolver
            )
            if first:
                for pid, kind in self.cfg.pages:
                    if kind in adapter.POLICIES and kind != "lww":
                        await adapter.set_policy(dev.repo, pid, kind)
        except Exception as e:
            if not dev.points.fired:
                self.find(oracle.REOPEN, f"{dev.label} could not open: {_error(e)}")
                dev.repo = dev.engine = None
                return False
        if dev.points.fired:  # its recovery reached the crash (raised, or caught inside)
            self.stats["crashes in recovery"] += 1
            self.say(dev, f"CRASH while opening, at {dev.points.fired}")
            dev.points.dead = True
            if dev.repo is not None and dev.engine is not None:
                await adapter.abandon(dev.repo, dev.engine)
            dev.repo = dev.engine = None
            return await self.open(dev)
        return True  # (a crash armed and not reached yet fires at its first uses)

    async def crash(self, dev: Device) -> None:
        """The device's process dies (its crash point fired): everything it has in
        memory goes; its files stay; it starts again from them."""
        self.stats["crashes"] += 1
        fired = dev.points.fired or ""
        where = "sqlite" if fired.startswith("SQLite") else "cloud"
        self.stats[f"crash {where} {'after' if fired.endswith('after it') else 'before'}"] += 1
        self.say(dev, f"CRASH at {fired}")
        dev.points.dead = True
        if dev.repo is not None and dev.engine is not None:
            await adapter.abandon(dev.repo, dev.engine)
        dev.repo = dev.engine = None
        again = self.rng.randint(1, 12) if self.rng.random() < 0.3 else None
        await self.open(dev, again)
        self.say(dev, f"restarted after the crash (process {dev.process})")

    async def act(
        self, dev: Device, what: str, op: Callable[[], Awaitable[Any]]
    ) -> tuple[bool, Any, bool]:
        """Run one operation of ``dev``: (done, its result, whether it may have been
        done although it failed). A crash point that fired restarts the device."""
        done, result, maybe = False, None, False
        try:
            result = await op()
            done = True
        except SimCrash as e:
            maybe = True
            result = f"crashed: {e}"
        except REFUSED_BEFORE_WRITING as e:
            result = f"refused: {_error(e)}"
        except PageUnavailableError as e:
            result = f"unavailable: {_error(e)}"
            maybe = True
            # While the bucket fails, an evicted page cannot come back: that is no bug.
            # A bucket that has nothing for it, or any failure once faults are off, is.
            if not dev.points.fired and (
                not self.bucket.faults.on or "has nothing for it" in str(e)
            ):
                self.find(oracle.UNAVAILABLE, f"{dev.label} {what}: {_error(e)}")
        except (StoreError, SyncError, TimeoutError) as e:
            maybe = True
            result = f"failed: {_error(e)}"
        except Exception as e:
            maybe = True
            result = f"failed: {_error(e)}"
            if not dev.points.fired:
                tb = traceback.format_exception(e)
                self.find(oracle.UNEXPECTED, f"{dev.label} {what}: {_error(e)}")
                for line in "".join(tb[-6:]).rstrip().splitlines():
                    self.log(f"    {line}")
        self.stats[f"op {_kind(what)}"] += 1
        if not done:
            self.stats["op_errors"] += 1
        self.say(dev, f"{what}: {result if not done else _short(result)}")
        if dev.engine is not None:
            self.check_refused(dev)
        if dev.points.fired:
            await self.crash(dev)
        return done, result, maybe or done

    def check_refused(self, dev: Device) -> None:
        assert dev.engine is not None
        for h in adapter.held_packs(dev.engine):
            if h.get("state") == "refused" and h["pack"] not in self.refused_seen:
                self.refused_seen.add(h["pack"])
                self.find(oracle.REFUSED, f"{dev.label} refused {h['pack']}: {h.get('error')}")

    # -- the workload ------------------------------------------------------------

    def value(self, dev: Device) -> bytes:
        self.counter += 1
        v = f"{dev.label}.{self.counter}".encode()
        r = self.rng.random()
        if r < 0.05:
            v += b"." + self.rng.randbytes(self.rng.randint(8_000, 70_000))
        elif r < 0.2:
            v += b"." + bytes(self.rng.randint(200, 2_000))
        return v

    def key(self) -> bytes:
        if self.rng.random() < 0.15:
            self.counter += 1
            return f"u{self.counter}".encode()
        return f"k{self.rng.randint(0, 7)}".encode()

    def kv_page(self) -> bytes:
        return self.rng.choice([pid for pid, kind in self.cfg.pages if kind != "docs"])

    def record(
        self,
        dev: Device,
        pid: bytes,
        changes: list[tuple[bytes, bytes | None]],
        ok: bool,
        maybe: bool,
    ) -> None:
        if not (ok or maybe):
            return
        self.stats["writes"] += 1
        self.model.writes[pid] += 1
        for k, v in changes:
            self.model.key(pid, k, Write(dev.index, v, ok, self.step, 0))

    async def w_put(self, dev: Device) -> None:
        pid, k = self.kv_page(), self.key()
        changes: list[tuple[bytes, bytes | None]] = [(k, self.value(dev))]
        lazy = self.rng.random() < 0.15
        await self._write(dev, pid, changes, f"put {pid.decode()} {k!r}", lazy)

    async def w_delete(self, dev: Device) -> None:
        pid, k = self.kv_page(), self.key()
        await self._write(dev, pid, [(k, None)], f"delete {pid.decode()} {k!r}")

    async def w_batch(self, dev: Device) -> None:
        pid = self.kv_page()
        changes: dict[bytes, bytes | None] = {}
        for _ in range(self.rng.randint(2, 6)):
            changes[self.key()] = None if self.rng.random() < 0.25 else self.value(dev)
        items = list(changes.items())
        lazy = self.rng.random() < 0.15
        await self._write(dev, pid, items, f"batch {pid.decode()} of {len(items)}", lazy)

    async def _write(
        self,
        dev: Device,
        pid: bytes,
        changes: list[tuple[bytes, bytes | None]],
        what: str,
        lazy: bool = False,
    ) -> None:
        repo = dev.repo
        assert repo is not None
        if lazy:
            what += " (LAZY)"
        ok, _, maybe = await self.act(dev, what, lambda: adapter.write(repo, pid, changes, lazy))
        self.record(dev, pid, changes, ok, maybe)

    async def w_clear(self, dev: Device) -> None:
        pid = self.kv_page()
        repo = dev.repo
        assert repo is not None
        ok, seen, _ = await self.act(
            dev, f"keys of {pid.decode()}", lambda: adapter.keys(repo, pid)
        )
        if not ok or dev.repo is not repo:
            return
        ok, _, maybe = await self.act(
            dev, f"clear {pid.decode()}", lambda: adapter.clear(repo, pid)
        )
        self.record(dev, pid, [(k, None) for k in seen], ok, maybe)

    async def w_txn(self, dev: Device, during_sync: bool) -> None:
        pid = self.kv_page()
        repo, engine = dev.repo, dev.engine
        assert repo is not None and engine is not None
        changes: dict[bytes, bytes | None] = {}
        for _ in range(self.rng.randint(1, 4)):
            changes[self.key()] = None if self.rng.random() < 0.25 else self.value(dev)
        items = list(changes.items())
        full = self.rng.random() < 0.3

        async def during() -> None:
            try:
                await adapter.sync_round(engine, download=True, full=full)
                self.stats["rounds"] += 1
            except (SyncError, StoreError) as e:  # the transaction commits all the same
                self.log(f"  (the round inside the transaction failed: {_error(e)})")

        what = f"transaction on {pid.decode()} of {len(items)}" + (
            " around a round" if during_sync else ""
        )
        ok, _, maybe = await self.act(
            dev,
            what,
            lambda: adapter.transaction(repo, pid, items, during if during_sync else None),
        )
        self.record(dev, pid, items, ok, maybe)

    async def w_stamp(self, dev: Device) -> None:
        pid = self.kv_page()
        repo = dev.repo
        assert repo is not None
        v = self.value(dev)
        ok, key, maybe = await self.act(
            dev,
            f"versionstamped key on {pid.decode()}",
            lambda: adapter.versionstamped(repo, pid, v),
        )
        if ok:
            self.record(dev, pid, [(key, v)], True, False)
        elif maybe:
            self.model.unknown_stamps = True
            self.stats["writes"] += 1
            self.model.writes[pid] += 1

    async def w_doc(self, dev: Device) -> None:
        pid = b"docs"
        repo = dev.repo
        assert repo is not None
        r = self.rng.random()
        data = {"tag": self.rng.choice("abc"), "n": self.counter, "by": dev.label}
        self.counter += 1
        if r < 0.08:
            ok, _, maybe = await self.act(
                dev, "declare index", lambda: adapter.doc_index(repo, pid)
            )
            if ok or maybe:
                self.stats["writes"] += 1
                self.model.writes[pid] += 1
            return
        if r < 0.45 or not self.doc_ids:
            ok, doc_id, maybe = await self.act(
                dev, f"create document {data}", lambda: adapter.doc_create(repo, pid, data)
            )
            if ok:
                self.doc_ids.append(doc_id)
                self.model.doc(
                    pid, doc_id, Write(dev.index, oracle.doc_value(data), True, self.step, 0)
                )
            if ok or maybe:
                self.stats["writes"] += 1
                self.model.writes[pid] += 1
            return
        doc_id = self.rng.choice(self.doc_ids)
        if 0.8 <= r < 0.85:  # (a replace's draw: the rest of the history draws as before)
            ok, resolved, maybe = await self.act(
                dev,
                f"replace document {doc_id} resolving its conflicts with {data}",
                lambda: adapter.doc_resolve(repo, pid, doc_id, data),
            )
            if ok:
                self.stats["resolved conflicts"] += resolved
            value: bytes | None = oracle.doc_value(data)
        elif r < 0.85:
            ok, _, maybe = await self.act(
                dev,
                f"replace document {doc_id} with {data}",
                lambda: adapter.doc_replace(repo, pid, doc_id, data),
            )
            value = oracle.doc_value(data)
        else:
            ok, _, maybe = await self.act(
                dev, f"delete document {doc_id}", lambda: adapter.doc_delete(repo, pid, doc_id)
            )
            value = None
        if ok or maybe:
            self.stats["writes"] += 1
            self.model.writes[pid] += 1
            self.model.doc(pid, doc_id, Write(dev.index, value, ok, self.step, 0))

    async def w_round(self, dev: Device) -> None:
        engine = dev.engine
        assert engine is not None
        download = self.rng.random() < 0.85
        full = self.rng.random() < 0.3
        ok, st, _ = await self.act(
            dev,
            f"round{' (upload only)' if not download else ''}{' full' if full else ''}",
            lambda: adapter.sync_round(engine, download=download, full=full),
        )
        self.stats["rounds"] += 1

    async def w_sync(self, dev: Device) -> None:
        engine = dev.engine
        assert engine is not None
        ok, st, _ = await self.act(dev, "sync", lambda: adapter.sync(engine, timeout=SYNC_TIMEOUT))
        self.stats["syncs"] += 1
        self.stats["rounds"] += st.rounds if ok else 1

    async def w_gc(self, dev: Device) -> None:
        pid = self.rng.choice([pid for pid, _ in self.cfg.pages])
        repo = dev.repo
        assert repo is not None
        if not await self._exists(repo, pid):
            return
        ok, pruned, _ = await self.act(dev, f"gc {pid.decode()}", lambda: adapter.gc(repo, pid))
        self.stats["gcs"] += 1

    async def _exists(self, repo: Repository, pid: bytes) -> bool:
        return pid in await adapter.page_ids(repo)

    async def w_evict(self, dev: Device) -> None:
        pid = self.rng.choice([pid for pid, _ in self.cfg.pages])
        repo = dev.repo
        assert repo is not None
        if not await self._exists(repo, pid) or adapter.is_evicted(repo, pid):
            return
        ok, _, _ = await self.act(dev, f"evict {pid.decode()}", lambda: adapter.evict(repo, pid))
        if ok:
            self.stats["evictions"] += 1

    async def w_compact(self, dev: Device, again: bool | None = None) -> None:
        """A compaction run; ``again`` (half the time by default): another a feed
        window later, as the daemon's runs come, which deletes what the first run's
        checkpoints cover (compaction waits a window after a checkpoint is listed)."""
        engine = dev.engine
        assert engine is not None
        ok, report, _ = await self.act(dev, "compact", lambda: adapter.compact(engine))
        self.stats["compactions"] += 1
        if ok:
            self.stats["packs_compacted"] += report.packs_deleted
        if again is None:
            again = self.rng.random() < 0.5
        if again and dev.engine is engine:  # (not if it crashed meanwhile)
            self.time.advance(FEED_WINDOW + 1)
            self.say(None, f"time moves on {span(FEED_WINDOW + 1)}")
            await self.w_compact(dev, again=False)

    async def w_restart(self, dev: Device) -> None:
        repo, engine = dev.repo, dev.engine
        assert repo is not None and engine is not None
        ok, _, _ = await self.act(dev, "stop (clean)", lambda: adapter.stop(repo, engine))
        if dev.repo is not repo:  # it crashed while stopping, and is open again
            return
        if not ok:
            await adapter.abandon(repo, engine)
        dev.repo = dev.engine = None
        self.stats["restarts"] += 1
        if await self.open(dev):
            self.say(dev, f"started again (process {dev.process})")

    def w_arm(self, dev: Device) -> None:
        p = dev.points
        if p.db_countdown is not None or p.cloud_countdown is not None:
            return
        before = self.rng.random() < 0.6
        if self.rng.random() < 0.6:
            p.db_countdown, p.db_before = self.rng.randint(1, 40), before
            what = f"its SQLite write #{p.db_writes + p.db_countdown}"
        else:
            p.cloud_countdown, p.cloud_before = self.rng.randint(1, 12), before
            what = f"its cloud request #{p.cloud_requests + p.cloud_countdown}"
        self.say(dev, f"crash armed: {'before' if before else 'after'} {what}")

    def w_away(self, dev: Device) -> None:
        steps = self.rng.randint(3, 25)
        dev.away_until = self.step + steps
        dev.away_long = self.rng.random() < 0.5
        self.stats["aways"] += 1
        self.say(
            dev,
            f"goes away for {steps} steps"
            + (" (and longer than the grace)" if dev.away_long else ""),
        )

    async def w_resolver(self, dev: Device, connected: bool) -> None:
        """The device's conflict resolver goes away (its merges wait, its pages keep their
        heads) or comes back (the waiting merges run)."""
        repo = dev.repo
        assert repo is not None
        dev.resolver = connected
        pids = [pid for pid, kind in self.cfg.pages if kind in ("auto", "custom")]
        await self.act(
            dev,
            f"resolver {'connects' if connected else 'disconnects'}",
            lambda: adapter.connect_resolver(repo, pids, connected),
        )

    def w_jump(self, dev: Device) -> None:
        # a fifth of the jumps set the clock right (NTP)
        delta = -dev.clock.skew if self.rng.random() < 0.2 else self.rng.choice(JUMPS)
        dev.clock.jump(delta)
        self.say(dev, f"clock jumps {span(delta)}")

    async def w_leap(self) -> None:
        grace = self.cfg.settings.compaction_grace
        dt = self.rng.uniform(0.5, 2.0) * min(grace, 7 * 86400.0)
        self.time.advance(dt)
        self.say(None, f"time leaps {span(dt)}")

    def w_lose(self) -> None:
        packs = self.bucket.store.listed("packs/")
        if not packs:
            return
        name = self.rng.choice(packs)
        self.bucket.lose(name)
        self.stats["lost_objects"] += 1
        self.say(None, f"LOSSY: {name} deleted behind every device's back")

    async def back(self, dev: Device) -> None:
        """An away device comes back (after a leap past the grace, if it was long)."""
        if dev.away_long:
            dt = self.cfg.settings.compaction_grace * 1.5 + 60
            self.time.advance(dt)
            self.say(None, f"time leaps {span(dt)} while {dev.label} is away")
            for other in self.devices:
                if other is not dev and other.up:
                    await self.w_round(other)
                    await self.w_compact(other, again=True)
        dev.away_until = None
        dev.away_long = False
        self.say(dev, "is back")

    # -- settling and checking -----------------------------------------------------

    async def settle(self, why: str) -> bool:
        """Faults off, every device back, syncs until a whole cycle moves nothing."""
        self.say(None, f"settle ({why})")
        self.bucket.settle()
        for dev in self.devices:
            dev.points.db_countdown = dev.points.cloud_countdown = None
            if dev.away_until is not None:
                dev.away_long = False
                await self.back(dev)
            if dev.repo is None:
                await self.open(dev)
            if not dev.resolver and dev.repo is not None:
                await self.w_resolver(dev, True)
        for dev in self.devices:  # evicted pages import nothing: their first use restores
            repo = dev.repo
            if repo is None:
                continue
            for pid in await adapter.page_ids(repo):
                if adapter.is_evicted(repo, pid):
                    restore = functools.partial(adapter.restore, repo, pid)
                    await self.act(dev, f"restore {pid.decode()}", restore)
        bound = 4 + 2 * len(self.devices)
        for cycle in range(bound):
            moved = 0
            for dev in self.devices:
                engine = dev.engine
                if engine is None:
                    continue
                ok, st, _ = await self.act(
                    dev, "sync", functools.partial(adapter.sync, engine, timeout=SYNC_TIMEOUT)
                )
                self.stats["rounds"] += st.rounds if ok else 1
                moved += (st.uploaded_packs + st.downloaded_packs) if ok else 1
            if not moved:
                self.say(None, f"settled after {cycle + 1} cycles")
                return True
        self.find(oracle.NO_SETTLE, f"still moving packs after {bound} sync cycles ({why})")
        return False

    async def states(self) -> tuple[list[dict[bytes, adapter.PageState]], list[str]] | None:
        out, labels = [], []
        tags = ["a", "b", "c"]
        for dev in self.devices:
            repo = dev.repo
            if repo is None:
                continue
            ok, pids, _ = await self.act(
                dev, "list pages", functools.partial(adapter.page_ids, repo)
            )
            if not ok:
                return None
            st: dict[bytes, adapter.PageState] = {}
            for pid in pids:
                ok, s, _ = await self.act(
                    dev,
                    f"read {pid.decode()}",
                    functools.partial(adapter.page_state, repo, pid, tags),
                )
                if not ok:
                    self.find(oracle.UNAVAILABLE, f"{dev.label} cannot read {pid.decode()}: {s}")
                    continue
                st[pid] = s
            out.append(st)
            labels.append(dev.label)
        return out, labels

    async def barrier(self) -> None:
        if not await self.settle("barrier"):
            self.bucket.faults.on = True
            return
        got = await self.states()
        self.bucket.faults.on = True
        if got is None:
            return
        states, labels = got
        found = oracle.compare(states, labels)
        if found:
            for f in found:
                self.find(f.category, f"at the barrier: {f.message}")
            return
        self.model.barrier(states[0])
        self.stats["barriers"] += 1
        self.say(None, f"barrier {self.model.epoch}: every device holds the same pages")

    async def check(self) -> None:
        await self.settle("end of the history")
        # Listing windows later (twice: the first may make devices rejoin, which sees
        # the gaps anew): a gap that a checkpoint's cover explains goes once a probe
        # does not find it a window after it was seen (sync.feed: Gaps and restarts).
        for _ in range(2):
            self.time.advance(2 * FEED_WINDOW)
            self.say(None, f"time moves on {span(2 * FEED_WINDOW)}")
            await self.settle("two listing windows later")
        got = await self.states()
        if got is None:
            return
        states, labels = got
        for f in oracle.compare(states, labels):
            self.find(f.category, f.message)
        self.stats["kept conflicts"] = sum(
            len(doc[2]) for st in states[0].values() if st.docs for doc in st.docs.values()
        )
        # A value wrong on every device is lost (or wrong) for good; wrong on some only,
        # the devices differ, which the comparison above reported.
        per_device = [
            {(f.category, f.message) for f in oracle.check_values(self.model, st, self.kinds)}
            for st in states
        ]
        everywhere = set.intersection(*per_device) if per_device else set()
        for category, message in sorted(everywhere):
            self.find(category, message)
        ratios = []
        for dev, st in zip([d for d in self.devices if d.repo is not None], states, strict=True):
            engine = dev.engine
            assert engine is not None
            for h in adapter.held_packs(engine):
                state = h.get("state")
                category = {
                    "waiting": oracle.WAITING,
                    "refused": oracle.REFUSED,
                    "retry": oracle.HELD_RETRY,
                }.get(str(state), oracle.HELD)
                self.find(category, f"{dev.label} holds {h['pack']} ({state}): {h.get('error')}")
            for g in adapter.gaps(engine):
                self.find(oracle.GAP, f"{dev.label} has a gap in {g['device']}: {g}")
            for pid, s in st.items():
                if s.heads > 1 or s.pending_conflict:
                    self.find(
                        oracle.HEADS,
                        f"{dev.label} page {pid.decode()}: {s.heads} heads ({s.pending_conflict})",
                    )
                bound, made = _storm(
                    s.commits, self.model.writes[pid], self.stats["rounds"], len(self.devices)
                )
                ratios.append(made)
                if s.commits > bound:
                    self.find(
                        oracle.STORM,
                        f"{dev.label} page {pid.decode()}: {s.commits} commits, bound {bound} "
                        f"({self.model.writes[pid]} writes, {self.stats['rounds']} rounds)",
                    )
        self.stats["commit_ratio"] = round(max(ratios, default=0.0), 2)

    # -- the history -------------------------------------------------------------

    async def run(self) -> None:
        for line in self.cfg.describe():
            self.log(line)
        for _ in range(self.cfg.initial):
            dev = self.add_device()
            await self.open(dev)
            self.say(dev, "joins")
        for step in range(1, self.cfg.steps + 1):
            self.step = step
            self.bucket.step = step
            self.time.advance(self._dt())
            for dev in self.devices:
                if dev.away_until is not None and dev.away_until <= step:
                    await self.back(dev)
            await self.one_step()
        await self.check()

    def _dt(self) -> float:
        r = self.rng.random()
        if r < 0.7:
            return self.rng.uniform(0.01, 2.0)
        if r < 0.9:
            return self.rng.uniform(2.0, 60.0)
        if r < 0.98:
            return self.rng.uniform(60.0, 3600.0)
        return self.rng.uniform(3600.0, 86400.0)

    async def one_step(self) -> None:
        cfg, rng = self.cfg, self.rng
        up = [d for d in self.devices if d.up]
        if len(self.devices) < cfg.devices and rng.random() < 0.04:
            dev = self.add_device()
            self.stats["joins"] += 1
            if await self.open(dev):
                self.say(dev, "joins")
            return
        if not up:
            self.say(None, "nobody is up")
            return
        if rng.random() < cfg.barrier_rate:
            await self.barrier()
            return
        if cfg.lossy and rng.random() < 0.03:
            self.w_lose()
            return
        dev = rng.choice(up)
        r = rng.random()
        if r < cfg.crash_rate:
            self.w_arm(dev)
            return
        r = rng.random()
        if r < cfg.away_rate and len(up) > 1:
            self.w_away(dev)
            return
        if rng.random() < cfg.jump_rate:
            self.w_jump(dev)
            return
        has_docs = any(kind == "docs" for _, kind in cfg.pages)
        resolved = any(kind in ("auto", "custom") for _, kind in cfg.pages)
        choices: list[tuple[float, Callable[[], Awaitable[None]]]] = [
            (20, lambda: self.w_put(dev)),
            (5, lambda: self.w_delete(dev)),
            (6, lambda: self.w_batch(dev)),
            (1, lambda: self.w_clear(dev)),
            (4, lambda: self.w_txn(dev, False)),
            (2, lambda: self.w_txn(dev, True)),
            (3, lambda: self.w_stamp(dev)),
            (10 if has_docs else 0, lambda: self.w_doc(dev)),
            (15, lambda: self.w_round(dev)),
            (6, lambda: self.w_sync(dev)),
            (3, lambda: self.w_gc(dev)),
            (2, lambda: self.w_evict(dev)),
            (3, lambda: self.w_compact(dev)),
            (1, lambda: self.w_restart(dev)),
            (1.5, self.w_leap),
            (1.5 if resolved else 0, lambda: self.w_resolver(dev, not dev.resolver)),
        ]
        total = sum(w for w, _ in choices)
        pick = rng.uniform(0, total)
        for w, fn in choices:
            pick -= w
            if pick <= 0:
                await fn()
                return
        await choices[0][1]()

    async def close(self) -> None:
        for dev in self.devices:
            if dev.repo is not None and dev.engine is not None:
                dev.points.dead = True  # nothing more is written: the directory goes
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(adapter.abandon(dev.repo, dev.engine), 30)
            adapter.unregister_root(dev.root)
            dev.repo = dev.engine = None


def _storm(commits: int, writes: int, rounds: int, devices: int) -> tuple[int, float]:
    """The bound on a device's commits of a page (oracle 5), and how many it made per
    write and round. Every write operation makes at most one commit; a round on any
    device merges at most one head per other device into its own (devices - 1
    commits), and a device's history holds every device's commits and merges. Twice
    that, plus :data:`STORM_SLACK` (carry-overs, rejoins, the document marker), is
    far above what an exchange can need; a storm (merges of merges that ping-pong)
    grows with the rounds squared and passes it."""
    bound = STORM_FACTOR * (writes + rounds * max(1, devices - 1)) + STORM_SLACK
    return bound, commits / max(1, writes + rounds)


def _kind(what: str) -> str:
    """An operation's kind, for the counts: its label's words before any name."""
    words = what.split()
    if " resolving its conflicts " in what:
        return "replace document resolving conflicts"
    if words[0] in ("create", "replace", "declare") or what.startswith("delete document"):
        return " ".join(words[:2])
    if words[0] == "transaction":
        return "transaction around a round" if what.endswith("around a round") else words[0]
    if words[0] == "round":
        return "round" + (" upload only" if "upload only" in what else "")
    return words[0]


def _error(e: BaseException) -> str:
    text = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {text[:300]}"


def _short(result: Any) -> str:
    if result is None:
        return "ok"
    if hasattr(result, "uploaded_packs"):
        return (
            f"ok ({result.uploaded_packs} up, {result.downloaded_packs} imported, "
            f"{result.rounds} rounds)"
        )
    if isinstance(result, adapter.PageState):
        return f"ok ({len(result.entries)} entries, {result.commits} commits)"
    text = repr(result) if isinstance(result, bytes | list) else str(result)
    return f"ok ({text[:120]})"


def base_dir() -> Path:
    """Where devices keep their files: ``LEDGERD_SIM_TMP``, else /dev/shm (SQLite's
    syncs cost nothing in memory), else the temporary directory."""
    env = os.environ.get("LEDGERD_SIM_TMP")
    if env:
        return Path(env)
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        return shm
    return Path(tempfile.gettempdir())


async def _run(h: History, capture: _Capture, timeout: float) -> None:
    try:
        await asyncio.wait_for(h.run(), timeout)
    except TimeoutError:
        h.find(oracle.HANG, f"the history did not end within {timeout:g}s")
    except Exception as e:
        h.find(oracle.UNEXPECTED, f"the harness failed: {_error(e)}")
        for line in traceback.format_exc().rstrip().splitlines()[-8:]:
            h.log(f"    {line}")
    finally:
        capture.closed = True
        await h.close()


def run_history(
    seed: int,
    *,
    devices_max: int = 8,
    steps: tuple[int, int] = STEPS,
    verbose: bool = False,
    timeout: float = HISTORY_TIMEOUT,
) -> Result:
    """Run seed ``seed`` in a new event loop; its devices' files are removed after."""
    adapter.install_crash_seam()
    cfg = make_config(seed, devices_max, steps)
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix=f"ledgerd-sim-{seed}-", dir=base_dir()))
    h = History(cfg, work, verbose=verbose)
    capture = _Capture(h.log)
    logger = logging.getLogger("ledgerd")
    logger.addHandler(capture)
    try:
        with adapter.seeded_entropy(h.entropy), adapter.checkpoint_floor(cfg.floor):
            asyncio.run(_run(h, capture, timeout))
    finally:
        logger.removeHandler(capture)
        shutil.rmtree(work, ignore_errors=True)
    for text in capture.corrupt:
        if not any(text in f.message for f in h.findings):
            h.find(oracle.REFUSED, f"logged: {text}")
    h.stats["devices"] = len(h.devices)
    h.stats["encrypted"] = int(cfg.settings.key is not None)
    h.stats["retention 0"] = int(cfg.settings.history_retention == 0)
    for _, kind in cfg.pages:
        h.stats[f"page {kind}"] += 1
    h.stats["faults"] = h.bucket.injected
    h.stats["steps"] = cfg.steps
    stats = dict(h.stats)
    return Result(seed, h.findings, stats, time.monotonic() - started, h.lines, cfg.lossy)
