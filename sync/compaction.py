"""Compaction: each device deletes its own packs that checkpoints made unneeded.

A pack may go when it is this device's own, older than ``compaction_grace`` (so
every device that has been online since has read it), and every page in it has a
best checkpoint whose cover includes the pack's sequence number: a device that still
needed the pack joins that checkpoint instead (``docs/convergence.md``). A pack of
no page (a spent sequence filled) goes once a best checkpoint of this device's
covers it, so that a device starting from the checkpoints takes its number for no
gap. A page in
such a pack that has no covering checkpoint gets one now, when this device holds the
page. A device's own checkpoints that are no longer the best of their page, and
older than the grace period, go too. Nothing of another device is ever deleted, and
nothing younger than the grace period.

A covering checkpoint counts only once this device has listed it for ``settle``
seconds (a feed window, by its monotonic clock; so never one it wrote in the same
run). A device that starts from the checkpoints reads them and then lists the feed
(``sync.feed``, Gaps and restarts): a pack missing from that listing and covered by
a checkpoint its read did not list yet (a store's listings lag) would be taken for
explained, and that page's writes in it lost to the device. Deleting a pack only a
window after its covering checkpoint was listed puts that checkpoint in every
listing a store's lag allows, before the pack can be missing from one.

Cost: one LIST of the checkpoints, one LIST of the feed up to the grace period,
one ranged GET of each old pack's index (remembered for the process's life) and
of each page's newest checkpoint's index, one DELETE per object removed.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from ledgerd.sync import layout, pack
from ledgerd.sync.checkpoints import BEST_OF, Checkpoints
from ledgerd.sync.cloud import CloudStore
from ledgerd.sync.crypto import Codec
from ledgerd.sync.errors import CloudNotFoundError
from ledgerd.sync.layout import CheckpointName, PackName

log = logging.getLogger(__name__)

Key = tuple[bytes, bytes]
WriteCheckpoint = Callable[[Key], Awaitable[bool]]
"""Write a checkpoint of a page now, if this device holds it; True if one went up."""

GRACE = 30 * 24 * 3600.0
"""Seconds a pack stays after it is no longer needed: longer than any device is offline."""
SETTLE = 120.0
"""Seconds a checkpoint must have been listed here before it counts as covering a
pack (the feed window, ``sync.feed.FEED_WINDOW``: see the module docstring)."""


@dataclass
class Report:
    packs_deleted: int = 0
    checkpoints_deleted: int = 0
    checkpoints_written: int = 0
    bytes_deleted: int = 0
    packs_kept: int = 0  # old enough, but some page in it has no covering checkpoint
    packs_settling: int = 0  # of those, covered by checkpoints not listed a window yet


@dataclass
class _Run:
    """One run's state: what it listed, its checkpoints' covers read, what it did."""

    device: str
    names: list[CheckpointName]
    best: dict[str, CheckpointName]
    write: WriteCheckpoint
    covers: dict[str, dict[str, int]] = field(default_factory=dict)
    tried: set[str] = field(default_factory=set)  # pages this run wrote a checkpoint of
    report: Report = field(default_factory=Report)


class Compactor:
    def __init__(
        self,
        store: CloudStore,
        checkpoints: Checkpoints,
        grace: float = GRACE,
        seal: Callable[[str], tuple[Codec, str] | None] = lambda _ident: None,
        *,
        settle: float = SETTLE,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.seal = seal
        self.checkpoints = checkpoints
        self.grace = grace
        self.settle = settle
        self.monotonic = monotonic
        self._listed: dict[str, float] = {}  # checkpoint name -> monotonic time first listed
        self._pages: dict[str, list[Key]] = {}  # own old pack -> its pages
        self.last: Report | None = None

    async def run(self, device: str, now_ms: int, write: WriteCheckpoint) -> Report:
        """Delete what this device may delete (``device``: its id in hex)."""
        cutoff = now_ms - int(self.grace * 1000)
        names = [cn async for cn in self.checkpoints.names()]
        now = self.monotonic()
        self._listed = {cn.name: self._listed.get(cn.name, now) for cn in names}
        best = await self.checkpoints.best(names)
        run = _Run(device, names, best, write)
        await self._delete_superseded(run, cutoff)
        for pn in await self._old_packs(device, cutoff):
            keys = await self._keys(pn)
            if keys is None:
                continue
            covered, settling = await self._pack_covered(run, pn, keys)
            if not covered:
                run.report.packs_kept += 1
                run.report.packs_settling += settling
                continue
            with contextlib.suppress(CloudNotFoundError):
                await self.store.delete(pn.name)
            self._pages.pop(pn.name, None)
            run.report.packs_deleted += 1
            run.report.bytes_deleted += pn.eager_end
        report = self.last = run.report
        if report.packs_deleted or report.checkpoints_deleted:
            log.info(
                "compaction deleted %d packs and %d checkpoints of this device",
                report.packs_deleted,
                report.checkpoints_deleted,
            )
        return report

    async def _delete_superseded(self, run: _Run, cutoff: int) -> None:
        """This device's checkpoints older than ``cutoff`` that are no longer the best
        of their page (once the best has settled: readers list it by then)."""
        for cn in run.names:
            best_cn = run.best[cn.tag]
            superseded = cn.device == run.device and best_cn != cn and cn.time < cutoff
            if superseded and self._settled(best_cn):
                with contextlib.suppress(CloudNotFoundError):
                    await self.store.delete(cn.name)
                run.report.checkpoints_deleted += 1

    async def _old_packs(self, device: str, cutoff: int) -> list[PackName]:
        """This device's packs named before ``cutoff``, in feed order."""
        old: list[PackName] = []
        async for name in self.store.list(layout.PACKS, layout.feed_after(0)):
            pn = PackName.parse(name)
            if pn is None:
                continue
            if pn.time >= cutoff:
                break  # in feed order: the rest are younger
            if pn.device == device:
                old.append(pn)
        return old

    async def _pack_covered(self, run: _Run, pn: PackName, keys: list[Key]) -> tuple[bool, bool]:
        """Whether the pack of pages ``keys`` is covered by settled checkpoints (it may
        go), writing one of a page that has none; and whether it only waits for its
        covering checkpoints to settle."""
        need = {run.device: pn.seq}  # what the covering checkpoint must hold
        if not keys:
            return await self._covered_without_pages(run, need), False
        for key in keys:
            tag = self.checkpoints.tag(key)
            if not await self._covers(run.best.get(tag), run.covers, need):
                if tag not in run.tried and await run.write(key):
                    run.report.checkpoints_written += 1
                    run.tried.add(tag)
                    await self._list_again(run, tag)
                if not await self._covers(run.best.get(tag), run.covers, need):
                    return False, False
            if not self._settled(run.best.get(tag)) and not await self._settled_cover(
                run.names, tag, run.covers, need
            ):  # covered, but not listed long enough: it goes at a later run
                return False, True
        return True, False

    async def _covered_without_pages(self, run: _Run, need: dict[str, int]) -> bool:
        """A pack of no page (a spent sequence filled): one checkpoint's cover must
        reach it, or a device that starts from the checkpoints would take its number
        for a gap."""
        for cn in sorted(run.best.values(), key=lambda n: n.time, reverse=True):
            if (
                cn.device == run.device
                and self._settled(cn)
                and await self._covers(cn, run.covers, need)
            ):
                return True
        return False

    async def _list_again(self, run: _Run, tag: str) -> None:
        """The page's checkpoints listed again after this run wrote one: its best."""
        listed = [cn async for cn in self.checkpoints.names(tag)]
        now = self.monotonic()
        for cn in listed:
            self._listed.setdefault(cn.name, now)
        fresh = await self.checkpoints.best(listed)
        if tag in fresh:
            run.best[tag] = fresh[tag]

    async def _keys(self, pn: PackName) -> list[Key] | None:
        keys = self._pages.get(pn.name)
        if keys is None:
            try:
                pack.check_head_end(pn.head_end)
                data = await self.store.get(pn.name, 0, pn.head_end)
                header = pack.decode_header(data, pn.head_end, pn.eager_end, self.seal(pn.ident))
            except (CloudNotFoundError, pack.CorruptPackError) as e:
                log.warning("compaction skips pack %s: %s", pn.name, e)
                return None
            keys = self._pages[pn.name] = [p.key for p in header.pages]
        return keys

    async def _settled_cover(
        self,
        names: list[CheckpointName],
        tag: str,
        covers: dict[str, dict[str, int]],
        need: dict[str, int],
    ) -> bool:
        """Whether an older checkpoint of the page (of its newest few) has settled and
        covers the pack: a page checkpointed at every run keeps no pack for that."""
        mine = sorted((n for n in names if n.tag == tag), key=lambda n: n.time, reverse=True)
        for cn in mine[:BEST_OF]:
            if self._settled(cn) and await self._covers(cn, covers, need):
                return True
        return False

    def _settled(self, cn: CheckpointName | None) -> bool:
        """Whether this device listed checkpoint ``cn`` a ``settle`` ago (so it is in
        every device's listings by now: the module docstring)."""
        if self.settle <= 0:
            return True
        listed = None if cn is None else self._listed.get(cn.name)
        return listed is not None and self.monotonic() - listed >= self.settle

    async def _covers(
        self,
        cn: CheckpointName | None,
        covers: dict[str, dict[str, int]],
        need: dict[str, int],
    ) -> bool:
        if cn is None:
            return False
        cover = covers.get(cn.name)
        if cover is None:
            try:
                cover = (await self.checkpoints.read(cn, sections=False)).cover
            except (CloudNotFoundError, pack.CorruptPackError) as e:
                log.warning("compaction cannot read checkpoint %s: %s", cn.name, e)
                cover = {}
            covers[cn.name] = cover
        return all(cover.get(d, 0) >= seq for d, seq in need.items())
