"""Downloads: importing the packs the feed listed, holding what cannot be imported yet.

This module owns :class:`Downloader`: per pack, its index and the EAGER sections
of the pages this device holds, in one ranged GET (or the index, then coalesced
ranges of sections), handed to the store, which verifies everything before
storing it; LAZY pieces are recorded with their location (fetched on first read
by :mod:`sync.fetch`). A page's section is a *delta* (``docs/convergence.md``),
applied once the page has seen what it needs (its writer's earlier writes, and what
the writer had seen); until then it waits. A pack (or one page of it) that cannot be
imported is held in its device's log, in the state its failure calls for (refused,
sealed with a key this device lacks, waiting, deferred, failed), and retried with
backoff; it never blocks other pages. A page whose every held section waits for
writes no listed pack holds (compacted into a checkpoint, or deleted before this
device read them) joins its best checkpoint (``rescue``) and tries them again. It
also brings an evicted page back (:meth:`Downloader.restore`). What is listed, and
the device logs themselves, are :mod:`sync.feed`'s.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from ledgerd.store import Page
from ledgerd.store.errors import (
    ClosedError,
    CorruptObjectError,
    InvalidArgumentError,
    TransientStoreError,
    named,
)
from ledgerd.store.page import exchange as ex
from ledgerd.store.tree import dots
from ledgerd.sync import layout, pack, progress
from ledgerd.sync.checkpoints import Checkpoints
from ledgerd.sync.context import Key, SyncContext
from ledgerd.sync.errors import (
    CloudError,
    CloudNotFoundError,
    RangeNotInObjectError,
    TransientCloudError,
)
from ledgerd.sync.feed import Feed
from ledgerd.sync.fetch import coalesce
from ledgerd.sync.layout import PackName
from ledgerd.sync.progress import DeviceLog, Held
from ledgerd.sync.status import StatusBoard, describe

SAVE_LOGS_EVERY = 1.0
"""Seconds between saves of the device logs while a download imports packs (and once
at its end). A log is saved whole, and it lists every held pack: saving it after
each pack made a download of many refused packs quadratic (20,000: 20,000 saves of
about a megabyte). A crash loses at most this much of the logs' progress: the packs
imported meanwhile are imported again, which changes nothing."""

log = logging.getLogger(__name__)


class Downloader:
    """Imports other devices' packs into this device's pages.

    ``clock_skew``: a write whose time is this many seconds ahead of this device's
    clock is reported (see :meth:`sync.status.StatusBoard.clock_ahead`). ``missed`` is
    told of a listed pack deleted before its import; ``rescue(key)`` joins the page's
    best checkpoint, if there is one it has not joined (True then).
    """

    def __init__(
        self,
        ctx: SyncContext,
        feed: Feed,
        board: StatusBoard,
        checkpoints: Checkpoints,
        *,
        retry_first: float,
        retry_most: float,
        clock_skew: float,
        missed: Callable[[str], Awaitable[None]],
        rescue: Callable[[Key], Awaitable[bool]],
    ) -> None:
        self.ctx = ctx
        self.missed = missed
        self.rescue = rescue
        self.feed = feed
        self.board = board
        self.checkpoints = checkpoints
        self.retry_first = retry_first
        self.retry_most = retry_most
        self.clock_skew = clock_skew

    async def download(self, force: bool = False) -> int:
        """Import the packs listed and not imported yet, and the held ones that are due;
        in feed order. Returns how many packs brought something."""
        await self.feed.probe_gaps(force)
        now = time.monotonic()
        due = [
            h for dl in self.feed.logs.values() for h in dl.held.values() if force or now >= h.due
        ]
        n = 0
        unsaved: dict[str, DeviceLog] = {}
        saved = time.monotonic()
        rescued: set[Key] = set()
        try:
            for _ in range(RESCUE_PASSES + 1):
                while due:
                    got_now = 0
                    for h in sorted(due, key=_feed_order):
                        dl = self.feed.logs[h.ln.device]
                        if h.id not in dl.held:  # done with its whole pack
                            continue
                        try:
                            got = await self._import_pack(dl, h.ln, h.key)
                        except CloudError as e:  # the cloud is unreachable now; next poll
                            self.board.device_failed(dl.device, e)
                            log.warning("download from device %s failed: %s", dl.device, e)
                            got_now = 0  # (nothing is tried again in this download)
                            break
                        self.board.device_ok(dl.device)
                        n += got
                        got_now += got
                        unsaved[dl.device] = dl
                        if self.feed.listing_due():  # (what it holds new waits for a round)
                            await self.feed.list_new()
                        if time.monotonic() - saved >= SAVE_LOGS_EVERY:
                            await self._save(unsaved)
                            saved = time.monotonic()
                    # Sections an import of this download made ready (see _imported) are
                    # tried again now: packs of one feed time are listed by device, and a
                    # delta may come before one it needs.
                    due = [
                        h
                        for dl in self.feed.logs.values()
                        for h in dl.held.values()
                        if got_now and h.state == progress.WAITING and h.due == 0.0
                    ]
                due = await self._rescue_stuck(rescued)
                if not due:
                    break
        finally:
            await self._save(unsaved)
        return n

    async def _rescue_stuck(self, rescued: set[Key]) -> list[Held]:
        """Pages whose every held section waits for writes that no listed pack will
        bring (no section of theirs is still to be read, and no whole pack is): each
        joins its best checkpoint once; returns their sections, to try again."""
        held = [h for dl in self.feed.logs.values() for h in dl.held.values()]
        if any(h.key is None and h.state != progress.REFUSED for h in held):
            return []  # a pack not read yet may hold what they need
        waiting: dict[Key, list[Held]] = {}
        busy: set[Key] = set()
        for h in held:
            if h.key is None:  # a whole pack refused: it holds nothing any page can use
                continue
            if h.state == progress.WAITING:
                waiting.setdefault(h.key, []).append(h)
            elif h.state in (progress.RETRY, progress.DEFERRED):
                busy.add(h.key)
        again: list[Held] = []
        for key in sorted(set(waiting) - busy - rescued):
            rescued.add(key)
            try:
                joined = await self.rescue(key)
            except CloudError as e:
                log.warning("page %s: its checkpoint could not be read: %s", named(key[1]), e)
                continue
            if joined:
                again.extend(waiting[key])
        return again

    async def _save(self, logs: dict[str, DeviceLog]) -> None:
        """Save the device logs ``logs`` and forget them."""
        while logs:
            await self.feed.save_log(logs.popitem()[1])

    async def _import_pack(self, dl: DeviceLog, pn: PackName, only: Key | None) -> int:
        """Import a pack's pages that this device holds (or just page ``only``): its
        index, then the EAGER sections of those pages, coalesced into few ranged GETs
        (one GET for index and sections when every page is wanted). A page that cannot
        be imported is held on its own; the others go on. Returns 1 if a page got in."""
        try:
            header, pages, sections = await self._read_pack(pn, only)
        except asyncio.CancelledError:
            raise
        except CloudNotFoundError:
            return await self._vanished(dl, pn.name)
        except (pack.CorruptPackError, RangeNotInObjectError) as e:
            if await self.ctx.keys_registered_since():  # its key is new here, not foreign
                return await self._import_pack(dl, pn, only)
            self._hold(dl, pn, only, *_refused(e))
            return 0
        except TransientCloudError as e:
            self._hold(dl, pn, only, progress.DEFERRED, f"not imported now: {describe(e)}")
            return 0
        self._hold_pages(dl, pn, only, header, pages)
        writer = dots.tag_of_device(header.device)
        got = 0
        for p in pages:
            if await self._import_page(dl, pn, p, sections[p.key], writer):
                got = 1
        return got

    async def _read_pack(
        self, pn: PackName, only: Key | None
    ) -> tuple[pack.Header, list[pack.PageIndex], dict[Key, bytes]]:
        """The pack's header, the pages of it to import (those this device holds, or
        just ``only``, that no checkpoint it joined covers) and their stored sections."""
        wanted_all = (
            only is None
            and self.ctx.wants is None
            and not self.checkpoints.may_cover(pn.device, pn.seq)
        )
        pack.check_head_end(pn.head_end)
        first = await self.ctx.store.get(pn.name, 0, pn.eager_end if wanted_all else pn.head_end)
        header = pack.decode_header(
            first[: pn.head_end], pn.head_end, pn.eager_end, self.ctx.seal(pn.ident)
        )
        named_as = (self.ctx.device_name(header.device), header.seq, header.time)
        if named_as != (pn.device, pn.seq, pn.time):
            raise pack.CorruptPackError("pack does not match its name")
        pages = [
            p
            for p in header.pages
            if (p.key == only if only is not None else self.ctx.wanted_here(p.key))
            and not self.checkpoints.covered(p.key, pn.device, pn.seq)
        ]
        return header, pages, await self._sections(pn.name, pages, first)

    def _hold_pages(
        self,
        dl: DeviceLog,
        pn: PackName,
        only: Key | None,
        header: pack.Header,
        pages: list[pack.PageIndex],
    ) -> None:
        """The pack read, each of its ``pages`` is held on its own until it is in: a
        download stopped midway (a daemon's stop cancels it, and the log is saved
        after) leaves the pages it did not reach held, where dropping the whole pack
        first lost them for good."""
        listed = dl.held.pop(Held(pn, None, progress.RETRY, "").id, None)
        if listed is not None and only is not None:
            # Read for one page (a restore): the pack's other pages stay held, each
            # on its own.
            for p in header.pages:
                if (
                    p.key != only
                    and self.ctx.wanted_here(p.key)
                    and not self.checkpoints.covered(p.key, pn.device, pn.seq)
                ):
                    h = Held(pn, p.key, progress.RETRY, "listed, not imported yet")
                    h.since = listed.since
                    dl.held.setdefault(h.id, h)
        if only is not None and all(p.key != only for p in pages):
            # Held for one page that it no longer brings anything to (a checkpoint the
            # page joined since covers it): done with.
            dl.held.pop(Held(pn, only, progress.RETRY, "").id, None)
        for p in pages:
            h = Held(pn, p.key, progress.RETRY, "listed, not imported yet")
            if listed is not None:
                h.since = listed.since
            dl.held.setdefault(h.id, h)

    async def _import_page(
        self, dl: DeviceLog, pn: PackName, p: pack.PageIndex, stored: bytes, writer: bytes
    ) -> bool:
        """Import one page's section (``stored``) of pack ``pn``; True if it got in, else
        it stays held, in the state its failure calls for."""
        try:
            lazy = {d: part.location(pn.name) for d, part in p.lazy}
            raw, eager = await pack.decode_section_async(stored, p.eager, self.ctx.codec)
            entries = await ex.check_entries(raw)
            async with self.ctx.using(p.key) as page:
                marks = await _import_marks(page, pn.device, pn.seq, bool(entries) or p.upto >= 0)
                await ex.apply_delta(
                    page,
                    entries,
                    eager,
                    lazy,
                    p.ctx,
                    writer=writer,
                    since=p.since,
                    upto=p.upto,
                    markers=marks,
                )
                if p.eager.raw:
                    await self.checkpoints.grew(page, p.eager.raw)
                self.board.imported(page)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self._hold_for(dl, pn, p.key, e)
            return False
        dl.held.pop(Held(pn, p.key, progress.RETRY, "").id, None)
        self._imported(p.key, pn.device, p.upto)
        return True

    async def _sections(
        self, name: str, pages: list[pack.PageIndex], first: bytes
    ) -> dict[Key, bytes]:
        """The stored EAGER sections of ``pages``: from ``first`` (the pack's start)
        where it holds them, else by coalesced ranged GETs."""
        out: dict[Key, bytes] = {}
        missing: list[tuple[int, int, pack.PageIndex]] = []
        for p in pages:
            if p.eager.end <= len(first):
                out[p.key] = first[p.eager.offset : p.eager.end]
            else:
                missing.append((p.eager.offset, p.eager.stored, p))
        for start, end, group in coalesce(sorted(missing, key=lambda x: x[0])):
            data = await self.ctx.store.get(name, start, end - start)
            for off, length, p in group:
                out[p.key] = data[off - start : off - start + length]
        return out

    def _hold_for(self, dl: DeviceLog, pn: PackName, key: Key, e: Exception) -> None:
        """Hold one page of a pack, in the state its failure calls for."""
        if isinstance(e, ex.NotReadyError):
            self._hold(dl, pn, key, progress.WAITING, f"waits: {e}")
        elif isinstance(
            e,
            pack.CorruptPackError
            | CorruptObjectError
            | InvalidArgumentError
            | RangeNotInObjectError,
        ):
            self._hold(dl, pn, key, *_refused(e))
        elif isinstance(e, TransientCloudError | TransientStoreError | ClosedError):
            self._hold(dl, pn, key, progress.DEFERRED, f"not imported now: {describe(e)}")
        else:  # the page cannot take it here (newer schema, disk full)
            self._hold(dl, pn, key, progress.FAILED, f"cannot import it here: {describe(e)}")

    def _waits(self, dl: DeviceLog, pn: PackName, key: Key) -> bool:
        """Whether page ``key`` of pack ``pn`` is held waiting."""
        h = dl.held.get(Held(pn, key, progress.RETRY, "").id)
        return h is not None and h.state == progress.WAITING

    async def _vanished(self, dl: DeviceLog, name: str) -> int:
        """A listed pack is no longer in the bucket (compacted) before its import: its
        pages are behind what the checkpoints that covered it hold (``missed``)."""
        self._drop_held(dl, name)
        log.warning("pack %s is no longer in the bucket; skipped", name)
        await self.missed(name)
        return 0

    def _drop_held(self, dl: DeviceLog, name: str) -> None:
        for hid in [hid for hid, h in dl.held.items() if h.ln.name == name]:
            del dl.held[hid]

    def _hold(self, dl: DeviceLog, ln: PackName, key: Key | None, state: str, reason: str) -> None:
        hid = Held(ln, key, state, reason).id
        held = dl.held.get(hid)
        first = held is None or held.reason != reason
        if held is None:
            held = dl.held[hid] = Held(ln, key, state, reason)
        held.state, held.reason = state, reason
        held.attempts += 1
        if state == progress.DEFERRED:
            held.due = time.monotonic()  # next poll
        else:
            held.due = time.monotonic() + progress.backoff(
                held.attempts, self.retry_first, self.retry_most
            )
        level = logging.WARNING if state in (progress.WAITING, progress.DEFERRED) else logging.ERROR
        if state == progress.WAITING:
            level = logging.INFO  # a normal step: what it waits for is on its way
        log.log(
            level if first else logging.DEBUG,
            "pack %s%s: %s; retried with backoff",
            ln.name,
            f" (page {key[1]!r} of ledger {key[0]!r})" if key else "",
            reason,
        )

    def _imported(self, key: Key, device: str, upto: int) -> None:
        # Sections of this page waiting for writes may have them now.
        for dl in self.feed.logs.values():
            for h in dl.held.values():
                if h.key == key and h.state == progress.WAITING:
                    h.due = 0.0
        ahead = (upto - int(self.ctx.clock() * 1_000_000)) / 1e6
        self.board.clock_seen(device, ahead)
        if ahead > self.clock_skew:
            self.board.clock_ahead(device, ahead)

    def wake(self, key: Key) -> None:
        """Sections of page ``key`` that wait are tried at the next download (it joined
        a checkpoint)."""
        for dl in self.feed.logs.values():
            for h in dl.held.values():
                if h.key == key and h.state == progress.WAITING:
                    h.due = 0.0

    async def restore(self, page: Page) -> bool:
        """Bring an evicted page back (:class:`store.PageRestorer`): its best checkpoint,
        then every pack above that checkpoint's cover that holds it (or, without a
        checkpoint, every pack that holds it), imported into ``page`` now. False if
        the bucket has nothing of it; raises if the bucket cannot be reached, or when
        nothing came in because its packs could not be read now."""
        key = (page.ledger, page.id)
        if not self.ctx.bucket_ok:
            await self.ctx.check_bucket()
        self.ctx.restoring[key] = page
        try:
            cover, found = await self._restore_checkpoint(page, key)
            if await self._restore_packs(key, cover):
                found = True
            for dl in self.feed.logs.values():
                await self.feed.save_log(dl)
            deferred = [
                h
                for dl in self.feed.logs.values()
                for h in dl.held.values()
                if h.key == key and h.state == progress.DEFERRED
            ]
            if deferred and not found:  # not "nothing there": it could not be read now
                raise TransientCloudError(
                    f"{len(deferred)} of its packs could not be read now: {deferred[0].reason}"
                )
            return found
        finally:
            del self.ctx.restoring[key]

    async def _restore_checkpoint(self, page: Page, key: Key) -> tuple[dict[str, int], bool]:
        """The page joins its best checkpoint, if it has one: its cover, and whether
        there was one."""
        cover: dict[str, int] = {}
        found = False
        best = await self.checkpoints.best(
            [cn async for cn in self.checkpoints.names(self.checkpoints.tag(key))]
        )
        for cn in best.values():
            cp = await self.checkpoints.read(cn)
            if cp.key != key:
                continue
            await self.checkpoints.take(page, cp)
            await self.feed.absorb(cp.cover, key, cp.name.time)
            cover, found = cp.cover, True
        return cover, found

    async def _restore_packs(self, key: Key, cover: dict[str, int]) -> bool:
        """Import the page's sections of every pack above ``cover``; True if one got in."""
        found = False
        waiting: list[tuple[DeviceLog, PackName]] = []
        async for name in self.ctx.store.list(layout.PACKS):
            pn = PackName.parse(name)
            if pn is None or pn.seq <= cover.get(pn.device, 0):
                continue
            dl = await self.feed.device_log(pn.device)
            if await self._import_pack(dl, pn, key):
                found = True
            elif self._waits(dl, pn, key):
                waiting.append((dl, pn))
        # Packs of one feed time are listed by device: a delta can come before one
        # it needs. Those are tried again while any of them gets in.
        while waiting:
            left = []
            for dl, pn in waiting:
                if await self._import_pack(dl, pn, key):
                    found = True
                elif self._waits(dl, pn, key):
                    left.append((dl, pn))
            if len(left) == len(waiting):
                break
            waiting = left
        return found


RESCUE_PASSES = 2
"""Times one download joins checkpoints for stuck pages and tries their sections again."""


def _feed_order(h: Held) -> tuple[int, str, int, str]:
    return (h.ln.time, h.ln.device, h.ln.seq, h.id)


async def _import_marks(page: Page, device: str, seq: int, writes: bool) -> list[tuple[str, bytes]]:
    """The sync values an import of ``device``'s pack ``seq`` sets with its commits.
    ``imported/{device}``: the highest of that device's packs imported into ``page``
    (it never goes back). ``pieces/{device}`` (:data:`store.sqlite.schema.PIECES_WAITING`,
    which garbage collection heeds): the packs of that device whose section held only
    value pieces (an upload larger than a pack spreads its pieces over several, its
    writes in the last) while the pack with their writes is not in yet; the page's
    cover stops below the lowest (:meth:`sync.feed.Feed.cover`), for a checkpoint
    holds no piece that nothing it holds refers to. A pack with writes ends the wait
    of every pieces-only pack below it, and only those: one device's writes join a
    page in order (:func:`store.page.exchange.readiness`), so the writes each of those
    waited for are in once it is; pieces-only packs above it, imported before it
    (a pack's GET failed and was retried), still wait."""
    done = await ex.sync_value(page, f"imported/{device}")
    marks = [(f"imported/{device}", str(max(seq, int(done) if done else 0)).encode())]
    name = f"{ex.PIECES_WAITING}{device}"
    waiting = ex.waiting_seqs(await ex.sync_value(page, name))
    left = [p for p in waiting if p > seq] if writes else sorted({*waiting, seq})
    if left != waiting:
        marks.append((name, ex.waiting_value(left)))
    return marks


def _refused(e: Exception) -> tuple[str, str]:
    """The state and reason of a pack (or page of one) that cannot be read: sealed with
    a key this device lacks (``key_missing``: copy the key file), or ``refused``
    (malformed, fails verification). Both are retried with backoff, and at once after
    a restart (with the key file read again)."""
    if isinstance(e, pack.PackKeyMissingError):
        return progress.KEY_MISSING, f"cannot open it: {describe(e)}"
    return progress.REFUSED, f"refused: {describe(e)}"
