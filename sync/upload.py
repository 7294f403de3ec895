"""Upload rounds: a round's pages' new commits and pieces into packs, and the packs up.

This module owns :class:`Uploader`: every page with writes of this device not
uploaded yet (and every open page) goes into one pack, one section per page (its
delta: the entries it wrote and the EAGER pieces of their values, then all pages'
LAZY pieces in the order of their values' bytes); past ``max_pack`` bytes the round
writes more packs, a page's entries always in the last pack that holds its pieces,
so pieces are in the bucket before any entry that references them is visible. A
pack is named (sequence number and feed time, from
:meth:`sync.naming.Naming.next_seq`) before its PUT; once it is up, its pages' pieces
become ``synced`` and the page records how far its writes are uploaded, and a
page's checkpoint may follow (:mod:`sync.checkpoint_policy`). It also seals this
device's packs again under a new key (:meth:`Uploader.reseal`). Which pages are
pending is :mod:`sync.pending`'s; the pack format is :mod:`sync.pack`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Collection
from dataclasses import dataclass, field

from ledgerd.store import Page
from ledgerd.store.page import exchange as ex
from ledgerd.sync import crypto, layout, pack
from ledgerd.sync.checkpoint_policy import CheckpointPolicy
from ledgerd.sync.checkpoints import Checkpoints
from ledgerd.sync.context import LOCAL, Key, SyncContext
from ledgerd.sync.errors import AlreadyExistsError
from ledgerd.sync.feed import Feed
from ledgerd.sync.layout import PackName
from ledgerd.sync.pending import Pending
from ledgerd.sync.status import StatusBoard

log = logging.getLogger(__name__)

MAX_PACK = 32 * 1024 * 1024
LEASE_MOST = 64
"""Pages an upload round keeps open until their pack is up (at most half of the
repository's max_open_pages)."""
READ_BATCH = 4 * 1024 * 1024
"""Bytes of pieces read from a page in one go while a pack is built."""


@dataclass
class _Uploaded:
    """A page whose commits went (or go) up in a round: what to mark afterwards."""

    key: Key
    seen: int | None
    delta: ex.Delta
    history: int = 0  # bytes of entries and EAGER pieces: what a new device would read


@dataclass
class _Round:
    """The pack being built in an upload round, and the pages it carries."""

    sections: dict[Key, pack.Section] = field(default_factory=dict)
    size: int = 0
    packs: int = 0
    waiting: list[_Uploaded] = field(default_factory=list)  # whole, in the unsent pack
    uploaded: list[_Uploaded] = field(default_factory=list)

    def section(self, key: Key) -> pack.Section:
        s = self.sections.get(key)
        if s is None:
            s = self.sections[key] = pack.Section(*key)
        return s

    def added(self, u: _Uploaded) -> None:
        self.waiting.append(u)

    def drop(self, key: Key) -> None:
        s = self.sections.pop(key, None)
        if s is not None:
            self.size -= s.size()
        self.waiting = [u for u in self.waiting if u.key != key]

    def sent(self) -> None:
        self.uploaded.extend(self.waiting)
        self.waiting.clear()
        self.sections.clear()
        self.size = 0
        self.packs += 1


@dataclass
class _Unsent:
    """A pack whose PUT failed: what it holds, and its name and bytes as tried."""

    seq: int
    time: int
    sections: list[pack.Section]
    name: str
    data: bytes
    head_end: int


class Uploader:
    """Puts this device's pending commits into packs in the bucket."""

    def __init__(
        self,
        ctx: SyncContext,
        feed: Feed,
        pending: Pending,
        board: StatusBoard,
        checkpoints: Checkpoints,
        policy: CheckpointPolicy,
        *,
        max_pack: int,
    ) -> None:
        self.ctx = ctx
        self.feed = feed
        self.pending = pending
        self.board = board
        self.checkpoints = checkpoints
        self.policy = policy
        self.max_pack = max_pack
        self._unsent: _Unsent | None = None
        """The pack whose PUT failed: its sequence number is spent, so it goes up before
        the next pack, or every other device would see a gap in this device's sequence
        for good."""
        self._spent_checked = False
        """Whether a number spent by an earlier process was looked for (see _put_pack)."""

    async def upload_all(
        self,
        only: tuple[bytes, bytes | None] | None = None,
        *,
        pages: Collection[Key] | None = None,
    ) -> int:
        """Upload the pages with writes not uploaded and the open ones (of ``only``, if
        given; just ``pages``, if given), all in one pack (more only past ``max_pack``
        bytes). Returns packs put."""
        if not self.pending.loaded:
            await self.pending.load()
        keys = self._round_keys(only, pages)
        await self.pending.save()
        rnd = _Round()
        async with contextlib.AsyncExitStack() as stack:
            # Pages stay leased until their pack is up (a bounded number of them;
            # the others are opened again to record the upload).
            leased: dict[Key, Page] = {}
            await self._take_pages(rnd, keys, stack, leased)
            with contextlib.suppress(Exception):  # its pages' failures are in status
                await self._flush(rnd)
            await self._mark_all(rnd, leased)
        await self.pending.save()
        return rnd.packs

    def _round_keys(
        self, only: tuple[bytes, bytes | None] | None, pages: Collection[Key] | None
    ) -> list[Key]:
        """The pages a round looks at: pending or open (of ``only``; of ``pages``)."""
        # Open pages too: their latest writes may not be committed yet (group commit).
        candidates = set(self.pending.counts) | {
            (p.ledger, p.id) for p in self.ctx.repo.open_pages()
        }
        if pages is not None:
            candidates &= set(pages)
        return [
            k
            for k in sorted(candidates)
            if k[0] != LOCAL and (only is None or (k[0] == only[0] and only[1] in (None, k[1])))
        ]

    async def _take_pages(
        self,
        rnd: _Round,
        keys: list[Key],
        stack: contextlib.AsyncExitStack,
        leased: dict[Key, Page],
    ) -> None:
        """Add each page's delta to the round; the first pages stay leased (in
        ``leased``, until ``stack`` closes)."""
        repo = self.ctx.repo
        # At most half of max_open_pages: the round's pages past it, and everyone
        # else's meanwhile, need room to open.
        lease_most = min(LEASE_MOST, repo.max_open_pages // 2)
        for key in keys:
            seen = self.pending.seen(key)
            if not repo.page_exists(*key) or repo.is_evicted(*key):
                self.pending.forget(key)
                if not repo.page_exists(*key):  # (an evicted page keeps its last sync)
                    self.board.forget(key)
                continue
            try:
                if len(leased) < lease_most:
                    page = await stack.enter_async_context(self.ctx.using(key))
                    leased[key] = page
                    await self._take_page(rnd, page, seen)
                else:
                    async with self.ctx.using(key) as page:
                        await self._take_page(rnd, page, seen)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # this page's failure stays this page's
                rnd.drop(key)
                self.board.page_failed(key, e)
                self.pending.again(key)  # retried next round, pending or not

    async def _mark_all(self, rnd: _Round, leased: dict[Key, Page]) -> None:
        """Record the round's uploads in their pages: their commits are in the bucket."""
        for u in rnd.uploaded:
            try:
                if u.key in leased:
                    await self._mark(leased[u.key], u)
                else:
                    async with self.ctx.using(u.key) as page:
                        await self._mark(page, u)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # uploaded, not recorded: it goes up again next round
                self.board.page_failed(u.key, e)
                self.pending.again(u.key)

    async def _take_page(self, rnd: _Round, page: Page, seen: int | None) -> None:
        key = (page.ledger, page.id)
        delta = await ex.pending_delta(page)
        if delta is None or delta.empty:
            self._page_done(key, seen, False)
            return
        history = await self._add_page(rnd, page, delta)
        rnd.added(_Uploaded(key, seen, delta, history))

    async def _mark(self, page: Page, u: _Uploaded) -> None:
        await ex.mark_uploaded(page, u.delta)
        self.board.synced(page)
        self._page_done(u.key, u.seen, await ex.has_unuploaded(page))
        await self.checkpoints.grew(page, u.history)
        await self.policy.after_upload(page)

    def _page_done(self, key: Key, seen: int | None, left: bool) -> None:
        self.board.no_error(key)
        self.pending.done(key, seen, int(left))

    async def _add_page(self, rnd: _Round, page: Page, delta: ex.Delta) -> int:
        """Put a page's delta into the round's pack; a pack that would pass ``max_pack``
        goes up first. A page larger than that spreads its value pieces over several
        packs, its entries in the last, so that pieces are in the bucket before any
        entry that references them (a reader applies a delta whole)."""
        key = (page.ledger, page.id)
        sizes = await ex.piece_sizes(page, [*delta.eager, *delta.lazy])
        entries = pack.entries_size(delta.entries)
        total = sum(sizes.values()) + entries
        if rnd.size + total > self.max_pack and rnd.sections:
            await self._flush(rnd)
        batch: list[tuple[bool, bytes]] = []
        batch_size = 0

        async def read(batch: list[tuple[bool, bytes]]) -> None:
            got = await ex.read_pieces(page, [d for _, d in batch])
            for is_lazy, d in batch:
                (rnd.section(key).lazy if is_lazy else rnd.section(key).eager).append((d, got[d]))
                rnd.size += len(got[d])

        for item in [*((False, d) for d in delta.eager), *((True, d) for d in delta.lazy)]:
            n = sizes.get(item[1], 0)
            if rnd.size + batch_size + n > self.max_pack and (rnd.size or batch):
                await read(batch)
                batch, batch_size = [], 0
                await self._flush(rnd)  # this page goes on in the next pack
            batch.append(item)
            batch_size += n
            if batch_size >= READ_BATCH:
                await read(batch)
                batch, batch_size = [], 0
        await read(batch)
        sec = rnd.section(key)
        sec.entries = [list(e) for e in delta.entries]
        sec.since, sec.upto, sec.ctx = delta.since, delta.upto, delta.ctx
        rnd.size += entries
        return sum(sizes.get(d, 0) for d in delta.eager) + entries

    async def _flush(self, rnd: _Round) -> None:
        """PUT the round's pack, if it holds anything; its pages' commits are then up."""
        sections = [
            s for s in rnd.sections.values() if s.entries or s.eager or s.lazy or s.upto >= 0
        ]
        if not sections:
            rnd.sections.clear()
            return
        try:
            await self._put_pack(sections)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # every page in it failed this round; the caller's too
            for key in {*rnd.sections, *(u.key for u in rnd.waiting)}:
                rnd.drop(key)
                self.board.page_failed(key, e)
                self.pending.again(key)
            raise
        rnd.sent()

    async def _put_pack(self, sections: list[pack.Section]) -> None:
        store = self.ctx.store
        if self._unsent is not None:
            # The same number (its entries are in the new pack as well: still not
            # marked uploaded, which a reader applies twice, harmlessly), named anew
            # if its time is old: a pack named long before it lands is below the
            # others' cursors, and older than the grace at once.
            u = self._unsent
            seq, t = u.seq, await self.feed.names.retime(u.time)
            name, data, head_end = u.name, u.data, u.head_end
            if t != u.time:
                name, data, head_end = await self._encode(seq, t, u.sections)
            try:
                await store.put(name, data)
            except AlreadyExistsError:  # an attempt that failed had landed after all
                if await store.get(name, 0, head_end) != data[:head_end]:
                    log.warning("sequence %d was already used; its pack is dropped", seq)
            self._unsent = None
            await self.feed.names.wrote(seq, t)
            log.info("uploaded pack %s, whose upload had failed", name)
        if not self._spent_checked:
            await self._fill_spent()
        while True:
            seq, t = await self.feed.names.next_seq()  # taken (and saved) before the PUT
            name, data, head_end = await self._encode(seq, t, sections)
            try:
                await store.put(name, data)
            except AlreadyExistsError:
                # Ours if a retried PUT's first attempt landed; otherwise a reused number.
                if await store.get(name, 0, head_end) != data[:head_end]:
                    log.warning("sequence %d was already used; taking the next", seq)
                    self.feed.names.own_seq = max(self.feed.names.own_seq, seq)
                    continue
            except Exception:
                self._unsent = _Unsent(seq, t, sections, name, data, head_end)
                raise
            await self.feed.names.wrote(seq, t)
            log.debug("uploaded pack %s: %d pages, %d bytes", name, len(sections), len(data))
            return

    async def _encode(
        self, seq: int, t: int, sections: list[pack.Section]
    ) -> tuple[str, bytes, int]:
        """A pack of this device with ``sections``: its name, bytes and head's end."""
        seal = self.ctx.seal(PackName.make(t, self.ctx.device, seq, 0, 0).ident)
        data, head_end, eager_end = await pack.encode_async(
            self.ctx.repo.device_id, seq, t, sections, seal=seal
        )
        return PackName.make(t, self.ctx.device, seq, head_end, eager_end).name, data, head_end

    async def _fill_spent(self) -> None:
        """Once per process, before its first pack: a sequence number an earlier process
        took and never saw go up (it stopped during the PUT, whose pack it held only in
        memory) goes up in an empty pack. Its commits are still unsynced, so the next
        pack carries them. Should the lost pack land after all, a reader takes whichever
        of the two it lists first (it skips a number it has): neither leaves anything
        out."""
        spent = await self.feed.names.spent()
        if spent is not None:
            seq, t = spent
            name, data, _ = await self._encode(seq, t, [])
            with contextlib.suppress(AlreadyExistsError):  # a retried PUT had landed
                await self.ctx.store.put(name, data)
            await self.feed.names.wrote(seq, t)
            log.info("sequence %d was spent by a pack that never went up: filled", seq)
        self._spent_checked = True

    async def reseal(self) -> int:
        """This device's packs sealed with another key than the write key, up again
        sealed with it, as new packs (see :meth:`sync.engine.SyncEngine.reencrypt`;
        the bucket's marker was just checked). Returns the packs uploaded."""
        codec, store, repo = self.ctx.codec, self.ctx.store, self.ctx.repo
        if codec is None:
            raise crypto.EncryptionError("the bucket is not encrypted: nothing to re-encrypt")
        n = 0
        done = f"sync/rekeyed/{self.ctx.location}/{codec.write_kid.hex()}"
        after = (await repo.get_meta(done) or b"").decode()
        async for name in store.list(layout.PACKS, after):
            pn = PackName.parse(name)
            if pn is None or pn.device != self.ctx.device:
                continue
            head = await store.get(name, 0, pn.head_end)
            if codec.key_id(head[len(pack.MAGICE) :]) == codec.write_kid:
                continue
            data = await store.get(name)
            seal = self.ctx.seal(pn.ident)
            sections = await asyncio.to_thread(
                pack.decode_all, data, pn.head_end, pn.eager_end, seal
            )
            await self._put_pack(sections)
            await repo.set_meta(done, name.encode())  # its copy is up
            log.info("re-encrypted pack %s with key %s", name, codec.write_kid.hex())
            n += 1
        return n
