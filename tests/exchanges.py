"""Sync by hand, for store tests: a bucket of deltas that pages upload to and apply from.

:class:`Bucket` keeps every uploaded delta in order, as packs in a bucket, and applies
to a page those it has not applied yet, holding one that is not ready (the page has
not seen what it needs) until a later one brings that; :func:`ship` and
:func:`exchange_all` are its shortcuts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ledgerd.store import Page
from ledgerd.store.page import exchange as ex


async def mark_all_uploaded(page: Page) -> ex.Delta | None:
    """Everything the page wrote counts as uploaded (as after an upload round)."""
    delta = await ex.pending_delta(page)
    if delta is not None:
        await ex.mark_uploaded(page, delta)
    return delta


@dataclass
class _Uploaded:
    writer: bytes
    delta: ex.Delta
    pieces: dict[bytes, bytes]


@dataclass
class Bucket:
    """Deltas in the order they were uploaded, and which each page has applied."""

    deltas: list[_Uploaded] = field(default_factory=list)
    applied: dict[int, set[int]] = field(default_factory=dict)

    async def upload(self, page: Page) -> bool:
        delta = await ex.pending_delta(page)
        if delta is None:
            return False
        pieces = await ex.read_pieces(page, [*delta.eager, *delta.lazy])
        self.deltas.append(_Uploaded(page.graph.tag, delta, pieces))
        self.applied.setdefault(id(page), set()).add(len(self.deltas) - 1)
        await ex.mark_uploaded(page, delta)
        return True

    async def download(self, page: Page, *, only: bytes | None = None) -> bool:
        """Apply what the page has not applied (of writer ``only``, if given) while any
        is ready. True if the page changed."""
        done = self.applied.setdefault(id(page), set())
        changed = False
        progress = True
        while progress:
            progress = False
            for i, up in enumerate(self.deltas):
                if i in done or up.writer == page.graph.tag or only not in (None, up.writer):
                    continue
                d = up.delta
                try:
                    changed |= await ex.apply_delta(
                        page,
                        d.entries,
                        up.pieces,
                        {},
                        d.ctx,
                        writer=up.writer,
                        since=d.since,
                        upto=d.upto,
                    )
                except ex.NotReadyError:
                    continue
                done.add(i)
                progress = True
        return changed

    def waiting(self, page: Page) -> int:
        """How many deltas of others the page has not applied."""
        done = self.applied.get(id(page), set())
        return sum(
            1 for i, up in enumerate(self.deltas) if i not in done and up.writer != page.graph.tag
        )

    async def sync(self, *pages: Page) -> None:
        """Every page uploads and downloads until none has anything to send or take."""
        while True:
            moved = False
            for p in pages:
                moved |= await self.upload(p)
            for p in pages:
                moved |= await self.download(p)
            if not moved:
                return


async def ship(src: Page, *dsts: Page) -> bool:
    """Carry ``src``'s delta to ``dsts`` and mark it uploaded (two devices, or when every
    other device is among ``dsts``). True if any of them changed."""
    bucket = Bucket()
    if not await bucket.upload(src):
        return False
    changed = False
    for dst in dsts:
        changed |= await bucket.download(dst)
    return changed


async def exchange_all(*pages: Page) -> None:
    """Every page's writes to every other, through one bucket, until all are in."""
    await Bucket().sync(*pages)
