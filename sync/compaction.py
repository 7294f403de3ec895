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
from dataclasses import dataclass

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
        report = Report()
        cutoff = now_ms - int(self.grace * 1000)
        names = [cn async for cn in self.checkpoints.names()]
        now = self.monotonic()
        self._listed = {cn.name: self._listed.get(cn.name, now) for cn in names}
        best = await self.checkpoints.best(names)
        for cn in names:  # (once the best has settled: readers list it by then)
            best_cn = best[cn.tag]
            superseded = cn.device == device and best_cn != cn and cn.time < cutoff
            if superseded and self._settled(best_cn):
                with contextlib.suppress(CloudNotFoundError):
                    await self.store.delete(cn.name)
                report.checkpoints_deleted += 1
        covers: dict[str, dict[str, int]] = {}
        old: list[PackName] = []
        async for name in self.store.list(layout.PACKS, layout.feed_after(0)):
            pn = PackName.parse(name)
            if pn is None:
                continue
            if pn.time >= cutoff:
                break  # in feed order: the rest are younger
            if pn.device == device:
                old.append(pn)
        tried: set[str] = set()  # pages this run wrote a checkpoint of
        for pn in old:
            keys = await self._keys(pn)
            if keys is None:
                continue
            need = {device: pn.seq}  # what the covering checkpoint must hold
            covered = True
            settling = False
            if not keys:
                # A pack of no page (a spent sequence filled): one checkpoint's cover
                # must reach it, or a device that starts from the checkpoints would
                # take its number for a gap.
                covered = False
                for cn in sorted(best.values(), key=lambda n: n.time, reverse=True):
                    if (
                        cn.device == device
                        and self._settled(cn)
                        and await self._covers(cn, covers, need)
                    ):
                        covered = True
                        break
            for key in keys:
                tag = self.checkpoints.tag(key)
                if not await self._covers(best.get(tag), covers, need):
                    if tag not in tried and await write(key):
                        report.checkpoints_written += 1
                        tried.add(tag)
                        listed = [cn async for cn in self.checkpoints.names(tag)]
                        now = self.monotonic()
                        for cn in listed:
                            self._listed.setdefault(cn.name, now)
                        fresh = await self.checkpoints.best(listed)
                        if tag in fresh:
                            best[tag] = fresh[tag]
                    if not await self._covers(best.get(tag), covers, need):
                        covered = False
                        break
                if not self._settled(best.get(tag)) and not await self._settled_cover(
                    names, tag, covers, need
                ):  # covered, but not listed long enough: it goes at a later run
                    covered = False
                    settling = True
                    break
            if not covered:
                report.packs_kept += 1
                report.packs_settling += settling
                continue
            with contextlib.suppress(CloudNotFoundError):
                await self.store.delete(pn.name)
            self._pages.pop(pn.name, None)
            report.packs_deleted += 1
            report.bytes_deleted += pn.eager_end
        self.last = report
        if report.packs_deleted or report.checkpoints_deleted:
            log.info(
                "compaction deleted %d packs and %d checkpoints of this device",
                report.packs_deleted,
                report.checkpoints_deleted,
            )
        return report

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
