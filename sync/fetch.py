"""Lazy fetches: the LAZY pieces a page reads, brought from their packs on first read.

This module owns reading pieces out of packs by their recorded location
(``name:offset:length``, see :class:`Location`): near ranges of one pack coalesced
into one ranged GET (:func:`coalesce`, which the download uses for a pack's
sections too), a value's other pieces prefetched with its root index (up to
``PREFETCH`` bytes), a piece whose pack was compacted away taken from the page's
newest checkpoint, every piece verified against its digest (one sealed with a key
this device lacks is ObjectKeyMissingError, not a mismatch), all within
``fetch_timeout``. It does not decide which pieces are LAZY (the upload does) nor
record where they are (the download does, through :mod:`store.page.exchange`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TypeVar

from ledgerd.store import Page
from ledgerd.store.errors import CorruptObjectError, ObjectKeyMissingError, ObjectNotFoundError
from ledgerd.store.page import exchange as ex
from ledgerd.store.pieces import digest as dg
from ledgerd.sync import pack
from ledgerd.sync.checkpoints import Checkpoints
from ledgerd.sync.context import SyncContext
from ledgerd.sync.errors import CloudError, CloudNotFoundError

T = TypeVar("T")

COALESCE_GAP = 256 * 1024
"""Bytes between two wanted ranges of one pack that a lazy fetch reads through."""
COALESCE_SPAN = 16 * 1024 * 1024
"""Most bytes one ranged GET of a lazy fetch asks for."""
PREFETCH = 16 * 1024 * 1024
"""Most bytes a lazy fetch brings beyond what was asked for (the rest of a value)."""


class LazyFetcher:
    """Fetches a page's LAZY pieces from the bucket (the engine's
    :class:`~ledgerd.store.PieceFetcher`)."""

    def __init__(self, ctx: SyncContext, checkpoints: Checkpoints, fetch_timeout: float) -> None:
        self.ctx = ctx
        self.checkpoints = checkpoints
        self.fetch_timeout = fetch_timeout

    async def fetch(self, page: Page, digests: list[bytes]) -> dict[bytes, bytes]:
        try:
            async with asyncio.timeout(self.fetch_timeout):
                return await self._fetch_value(page, digests)
        except TimeoutError:
            reason = self.ctx.store.last_failure()
            raise ObjectNotFoundError(
                f"the value is in the cloud and could not be fetched within "
                f"{self.fetch_timeout:g}s (needs fetch)" + (f": {reason}" if reason else "")
            ) from None
        except CloudError as e:
            raise ObjectNotFoundError(
                f"the value is in the cloud and could not be fetched (needs fetch): {e}"
            ) from e

    async def _fetch_value(self, page: Page, digests: list[bytes]) -> dict[bytes, bytes]:
        """The pieces asked for and, up to PREFETCH bytes, the pieces that the index
        pieces among them list: a value's first read asks for its root index, and
        the rest of the value lies next to it in its pack (see the upload order)."""
        if not self.ctx.bucket_ok:  # a read before this start's first round: the codec
            await self.ctx.check_bucket()  # (without it, a sealed piece reads as garbage)
        out: dict[bytes, bytes] = {}
        want, budget = digests, PREFETCH
        while want:
            where = await ex.remote_locations(page, want)
            try:
                got = await self._fetch_ranges(where)
            except CloudNotFoundError:  # a pack compacted away: the newest checkpoint has it
                moved = await self.checkpoints.locate((page.ledger, page.id), list(where))
                if not moved:
                    raise
                got = await self._fetch_ranges(moved)
            out.update(got)
            children = [
                c
                for d, v in got.items()
                if dg.is_index(d)
                for c in ex.index_children(v)
                if not dg.is_inline(c) and c not in out
            ]
            where = await ex.remote_locations(page, list(dict.fromkeys(children)))
            want = []
            for d in children:
                if d in where and d not in want:
                    budget -= Location.parse(where[d]).stored
                    if budget < 0:
                        break
                    want.append(d)
        return out

    async def _fetch_ranges(self, where: dict[bytes, str]) -> dict[bytes, bytes]:
        """Pieces from their packs: near ranges of one pack in one ranged GET."""
        by_pack: dict[str, list[tuple[int, int, tuple[bytes, Location]]]] = {}
        for d, text in where.items():
            loc = Location.parse(text)
            by_pack.setdefault(loc.name, []).append((loc.offset, loc.stored, (d, loc)))
        out: dict[bytes, bytes] = {}
        for name, items in by_pack.items():
            for start, end, group in coalesce(sorted(items, key=lambda x: x[0])):
                data = await self.ctx.store.get(name, start, end - start)
                for off, length, (d, loc) in group:
                    piece = data[off - start : off - start + length]
                    try:
                        if self.ctx.codec is not None:
                            ident = name.rsplit(".", 2)[0]
                            piece = pack.open_piece(
                                piece, self.ctx.codec, ident, d, loc.codec, loc.raw
                            )
                        else:
                            piece = pack.unsqueeze(piece, loc.codec, loc.raw)
                    except pack.PackKeyMissingError as e:  # not damage: the key is elsewhere
                        raise ObjectKeyMissingError(
                            f"object {dg.short(d)} is in the cloud (in {name}) and cannot be "
                            f"read here: {e}; nothing is damaged"
                        ) from e
                    except pack.CorruptPackError:
                        piece = b""  # fails the digest check below, with its message
                    if not dg.verify(d, piece):
                        raise CorruptObjectError(
                            f"the cloud's copy of object {dg.short(d)} (in {name}) does not "
                            "match its digest; nothing on this device is damaged"
                        )
                    out[d] = piece
        return out


@dataclass(frozen=True)
class Location:
    """Where a LAZY piece lies: ``name:offset:length``, plus ``:z{raw length}`` when
    it is stored compressed (see :meth:`sync.pack.Part.location`)."""

    name: str
    offset: int
    stored: int
    raw: int
    codec: int

    @classmethod
    def parse(cls, text: str) -> Location:
        name, _, rest = text.partition(":")
        fields = rest.split(":")
        offset, stored = int(fields[0]), int(fields[1])
        if len(fields) == 3 and fields[2].startswith("z"):
            return cls(name, offset, stored, int(fields[2][1:]), pack.ZSTD)
        return cls(name, offset, stored, stored, pack.RAW)


def coalesce(
    items: list[tuple[int, int, T]],
) -> list[tuple[int, int, list[tuple[int, int, T]]]]:
    """Sorted (offset, length, item) ranges of one pack as (start, end, members) runs:
    ranges at most COALESCE_GAP apart share a run of at most COALESCE_SPAN bytes."""
    runs: list[tuple[int, int, list[tuple[int, int, T]]]] = []
    for off, length, d in items:
        if runs:
            start, end, members = runs[-1]
            if off - end <= COALESCE_GAP and max(end, off + length) - start <= COALESCE_SPAN:
                members.append((off, length, d))
                runs[-1] = (start, max(end, off + length), members)
                continue
        runs.append((off, off + length, [(off, length, d)]))
    return runs
