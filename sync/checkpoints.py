"""Checkpoints: a page's whole state, so that a device need not read its history.

A checkpoint (``checkpoints/{tag}/...``, see :mod:`sync.layout`) is a pack of one
page (:mod:`sync.pack`'s format) whose section holds every entry of the page's
state (siblings included) and the EAGER pieces of every value, its LAZY pieces after
them, and the state's context (``docs/convergence.md``); its header adds ``cover``:
per device, the highest sequence number whose packs' sections of this page the state
includes. Joining a checkpoint is always allowed, however far behind or ahead of it
a page is. A device writes one after an upload round when the page's bytes uploaded
and imported since its last checkpoint (what a new device would read past it), with
the last checkpoint, pass 4/3 of the page's size (and ``FLOOR``): a new device then
downloads at most about 1.33× the page's size plus one round; a page whose whole
history is smaller than that gets none. Pieces are copied, not referred to, so that
compaction can delete the packs the checkpoint stands for.

A page joins its best checkpoint when it has nothing of it (a new device, an evicted
page), when its held sections wait for writes no listed pack holds, and when this
device was away longer than the compaction grace; packs whose sequence the cover
includes are then skipped for that page.

This module does the cloud side of that; the store side (states and their joins) is
in :mod:`store.page.exchange`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import msgpack

from ledgerd.store import Page, Repository
from ledgerd.store.errors import ClosedError, StorageError, TransientStoreError, named
from ledgerd.store.page import exchange as ex
from ledgerd.sync import layout, pack
from ledgerd.sync.cloud import CloudStore
from ledgerd.sync.crypto import Codec
from ledgerd.sync.errors import AlreadyExistsError, CloudNotFoundError, TransientCloudError
from ledgerd.sync.layout import CheckpointName

log = logging.getLogger(__name__)

Key = tuple[bytes, bytes]
Using = Callable[[Key], contextlib.AbstractAsyncContextManager[Page]]

FLOOR = 64 * 1024
"""Bytes of history a page gathers before a checkpoint is worth writing."""
MAX_CHECKPOINT = 64 * 1024 * 1024
"""Largest page (its head's pieces, EAGER and LAZY) that gets checkpoints; larger
pages are read from their history."""
BEST_OF = 8
"""Newest checkpoints of a page compared by what they cover when choosing one."""
SINCE = "checkpoint/since"
"""Page sync metadata: bytes uploaded and imported since the last checkpoint."""
THRESHOLD = "checkpoint/threshold"
"""Page sync metadata: ``since`` above which the page is looked at again."""
BASE = "checkpoint/base"
"""Page sync metadata: bytes of the page's last checkpoint (0: none)."""
COVERS = "sync/covers"
"""Repository meta: the pages that joined a checkpoint, and what each one covers."""


@dataclass
class Checkpoint:
    """A checkpoint read from the bucket."""

    name: CheckpointName
    key: Key
    cover: dict[str, int]
    ctx: dict[bytes, int]
    entries: list[Any]  # as received (the store checks them)
    eager: dict[bytes, bytes]
    lazy: dict[bytes, str]  # digest -> location in the checkpoint


def _cover(x: object) -> dict[str, int]:
    if not isinstance(x, dict):
        raise pack.CorruptPackError("a checkpoint's cover is malformed")
    out: dict[str, int] = {}
    for device, seq in x.items():
        if not (isinstance(device, str) and layout.device_ok(device) and type(seq) is int):
            raise pack.CorruptPackError("a checkpoint's cover is malformed")
        out[device] = seq
    return out


def reach(into: dict[str, int], cover: dict[str, int]) -> None:
    """Per device, the higher of ``into``'s sequence and ``cover``'s, into ``into``."""
    for device, seq in cover.items():
        into[device] = max(into.get(device, 0), seq)


def newest(names: list[CheckpointName]) -> dict[str, CheckpointName]:
    """The newest checkpoint of each page tag."""
    out: dict[str, CheckpointName] = {}
    for n in names:
        best = out.get(n.tag)
        if best is None or (n.time, n.device) > (best.time, best.device):
            out[n.tag] = n
    return out


class Checkpoints:
    """Writing, listing and reading checkpoints; the covers of shallow pages."""

    def __init__(
        self,
        store: CloudStore,
        max_size: int = MAX_CHECKPOINT,
        codec: Callable[[], Codec | None] = lambda: None,
    ) -> None:
        self.store = store
        self.max_size = max_size
        self.codec = codec
        """The bucket's codec once known (an encrypted bucket): names and seals."""
        self.covers: dict[Key, dict[str, int]] = {}
        self.joined: dict[Key, str] = {}
        """The name of the checkpoint each page joined last (in this process)."""
        self.written = 0
        self.unuploaded = 0
        """Checkpoints not written because the page held writes not uploaded yet."""
        self._repo: Repository | None = None

    async def load(self, repo: Repository) -> None:
        self._repo = repo
        raw = await repo.get_meta(COVERS)
        if raw:
            try:
                d = msgpack.unpackb(raw, raw=False, strict_map_key=False)
                for a, b, c, *_ in d:
                    self.covers[(bytes(a), bytes(b))] = _cover(c)
            except Exception as e:  # msgpack raises several unrelated types
                log.warning("forgetting which pages started from checkpoints: %s", e)
                self.covers = {}

    async def _save(self) -> None:
        assert self._repo is not None
        rows = [[a, b, c, False] for (a, b), c in sorted(self.covers.items())]
        data = msgpack.packb(rows)
        await self._repo.set_meta(COVERS, bytes(data))

    # -- names -------------------------------------------------------------------------

    def tag(self, key: Key) -> str:
        codec = self.codec()
        return codec.page_tag(*key) if codec else layout.page_tag(*key)

    def _device(self, device: bytes) -> str:
        codec = self.codec()
        return codec.device_tag(device) if codec else device.hex()

    def _seal(self, ident: str) -> tuple[Codec, str] | None:
        codec = self.codec()
        return (codec, ident) if codec else None

    # -- covers ------------------------------------------------------------------------

    def may_cover(self, device: str, seq: int) -> bool:
        """Whether some page's cover includes pack ``seq`` of ``device`` (then a pack
        import reads the index first, to skip what is covered)."""
        return any(seq <= c.get(device, 0) for c in self.covers.values())

    def covered(self, key: Key, device: str, seq: int) -> bool:
        """Whether the checkpoint page ``key`` started from holds pack ``seq`` of ``device``."""
        c = self.covers.get(key)
        return c is not None and seq <= c.get(device, 0)

    # -- writing -----------------------------------------------------------------------

    async def grew(self, page: Page, nbytes: int) -> int:
        """Count ``nbytes`` of history added to the page; returns the total since its
        last checkpoint."""
        since = int(await ex.sync_value(page, SINCE) or b"0") + nbytes
        await ex.set_sync_value(page, SINCE, str(since).encode())
        return since

    async def due(self, page: Page) -> bool:
        """Whether the page's history since its last checkpoint passed its threshold."""
        since = int(await ex.sync_value(page, SINCE) or b"0")
        return since > int(await ex.sync_value(page, THRESHOLD) or str(FLOOR).encode())

    async def write(
        self,
        page: Page,
        device: bytes,
        feed_time: int,
        cover: dict[str, int],
        force: bool = False,
    ) -> str | None:
        """Write a checkpoint of the page's state if it is due (or ``force``) and the
        page can have one (it holds anything, and is not too large). Returns its name,
        or None."""
        if not force and not await self.due(page):
            return None
        st = await ex.state(page)
        if st is None or not await self._may_write(page, st, force):
            return None
        return await self._put(page, st, device, feed_time, cover)

    async def _may_write(self, page: Page, st: ex.State, force: bool) -> bool:
        """Whether a checkpoint of the page's state ``st`` goes now: the history since
        the last one passed the threshold (or ``force``), the state holds no write of
        this device's not uploaded, and it is not too large."""
        sizes = await ex.piece_sizes(page, st.eager)
        live = sum(sizes.values()) + pack.entries_size(st.entries)
        since = int(await ex.sync_value(page, SINCE) or b"0")
        base = int(await ex.sync_value(page, BASE) or b"0")
        threshold = max(FLOOR, live * 4 // 3 - base)
        await ex.set_sync_value(page, THRESHOLD, str(threshold).encode())
        if since <= threshold and not force:
            return False
        if st.ctx.get(page.graph.tag, -1) > await ex.uploaded_upto(page):
            # A write of this device's since its last upload: a device that joined this
            # state would hold the write before any pack does, and packs made after that
            # could each wait for the other's write for good (docs/convergence.md). The
            # next upload's round writes it.
            log.debug("checkpoint of page %s waits for its writes' upload", named(page.id))
            self.unuploaded += 1
            return False
        lazy_size = sum((await ex.piece_sizes(page, st.lazy)).values())
        if live + lazy_size > self.max_size:
            log.info(
                "page %s is too large for a checkpoint (%d bytes)", named(page.id), live + lazy_size
            )
            await ex.set_sync_value(page, THRESHOLD, str(1 << 62).encode())
            return False
        return True

    async def _put(
        self, page: Page, st: ex.State, device: bytes, feed_time: int, cover: dict[str, int]
    ) -> str:
        """Encode the checkpoint of state ``st`` and put it in the bucket; its name."""
        since = int(await ex.sync_value(page, SINCE) or b"0")
        eager = await ex.read_pieces(page, st.eager)
        lazy = await ex.read_pieces(page, st.lazy)  # fetched if this device never read them
        section = pack.Section(
            page.ledger,
            page.id,
            [list(e) for e in st.entries],
            [(d, eager[d]) for d in st.eager],
            [(d, lazy[d]) for d in st.lazy],
            ctx=st.ctx,
            bare=True,
        )
        tag = self.tag((page.ledger, page.id))
        ident = CheckpointName.make(tag, feed_time, self._device(device), 0, 0).ident
        data, head_end, eager_end = await pack.encode_async(
            device, 0, feed_time, [section], extra={"cover": cover}, seal=self._seal(ident)
        )
        name = CheckpointName.make(tag, feed_time, self._device(device), head_end, eager_end).name
        try:
            await self.store.put(name, data)
        except AlreadyExistsError:  # this device wrote one at this very feed time
            log.debug("checkpoint %s is up already", name)
            return name
        await ex.set_sync_value(page, SINCE, b"0")
        await ex.set_sync_value(page, BASE, str(eager_end - head_end).encode())
        self.written += 1
        log.info("wrote checkpoint %s: %d bytes for %d bytes of history", name, len(data), since)
        return name

    # -- reading -----------------------------------------------------------------------

    async def best(self, names: list[CheckpointName]) -> dict[str, CheckpointName]:
        """Per page tag, the checkpoint that knows most: of its newest few (by name),
        the one whose cover counts the most packs (feed times of checkpoints written
        by different devices need not follow the order they were written in); one
        ranged GET of each candidate's index where a page has several."""
        by_tag: dict[str, list[CheckpointName]] = {}
        for n in names:
            by_tag.setdefault(n.tag, []).append(n)
        out: dict[str, CheckpointName] = {}
        for tag, group in by_tag.items():
            group.sort(key=lambda n: (n.time, n.device), reverse=True)
            if len(group) == 1:
                out[tag] = group[0]
                continue
            scored = []
            for n in group[:BEST_OF]:
                try:
                    cover = (await self.read(n, sections=False)).cover
                except (CloudNotFoundError, pack.CorruptPackError):
                    continue
                scored.append((sum(cover.values()), n.time, n.device, n))
            if scored:
                out[tag] = max(scored, key=lambda s: s[:3])[3]
        return out

    async def names(self, tag: str | None = None) -> AsyncIterator[CheckpointName]:
        """Every checkpoint in the bucket (of page ``tag``); stray names are skipped."""
        prefix = layout.CHECKPOINTS + (f"{tag}/" if tag else "")
        async for name in self.store.list(prefix):
            cn = CheckpointName.parse(name)
            if cn is not None:
                yield cn

    async def read(self, cn: CheckpointName, *, sections: bool = True) -> Checkpoint:
        """A checkpoint's header (and section): one ranged GET. Raises CorruptPackError
        if it is malformed or belongs to another page than its name says."""
        pack.check_head_end(cn.head_end)
        data = await self.store.get(cn.name, 0, cn.eager_end if sections else cn.head_end)
        header = pack.decode_header(
            data[: cn.head_end], cn.head_end, cn.eager_end, self._seal(cn.ident)
        )
        if len(header.pages) != 1 or self._device(header.device) != cn.device:
            raise pack.CorruptPackError(f"checkpoint {cn.name} does not match its name")
        p = header.pages[0]
        if self.tag(p.key) != cn.tag or header.time != cn.time:
            raise pack.CorruptPackError(f"checkpoint {cn.name} does not match its name")
        cover = _cover(header.extra.get("cover"))
        lazy = {d: part.location(cn.name) for d, part in p.lazy}
        if not sections:
            return Checkpoint(cn, p.key, cover, p.ctx, [], {}, lazy)
        entries, eager = await pack.decode_section_async(
            data[p.eager.offset : p.eager.end], p.eager, self.codec()
        )
        return Checkpoint(cn, p.key, cover, p.ctx, entries, eager, lazy)

    async def join_best(
        self, names: list[CheckpointName], wanted: Callable[[Key], bool], using: Using
    ) -> tuple[dict[str, int], list[Key], int]:
        """Join every page this device wants with its best checkpoint of ``names`` (for a
        restart listing, which lists them right before the feed: a device that never
        listed this bucket, or one back after longer than the compaction grace; the
        packs below the checkpoints may be compacted away). Returns, per device,
        the highest sequence a checkpoint read covers (of every page, joined here or
        not: packs up to there may be compacted away), the pages joined, and the
        newest feed time among the checkpoints' names (the packs they cover may be
        gone, and with them the names a device's next pack must not fall below). A damaged
        checkpoint is skipped (the page is then read from its packs); one that cannot
        be read now raises, and the caller tries again later."""
        assert self._repo is not None
        held: dict[str, int] = {}
        newest = 0
        joined: list[Key] = []
        for cn in sorted((await self.best(names)).values(), key=lambda n: n.name):
            try:
                cp = await self.read(cn)
                reach(held, cp.cover)
                newest = max(newest, min(cn.time, layout.NAMED_TIME_CEILING))
                if not wanted(cp.key):
                    continue
                async with using(cp.key) as page:
                    await self.take(page, cp, save=False)
                joined.append(cp.key)
            except CloudNotFoundError as e:  # deleted since the listing: a newer one is best
                raise TransientCloudError(
                    f"checkpoint {cn.name} was deleted while it was read: read again"
                ) from e
            except (TransientCloudError, TransientStoreError, ClosedError, StorageError):
                # Read again at the next round: a cover not read here would leave the
                # packs compaction deleted under it looking like gaps for good.
                raise
            except Exception as e:  # a damaged checkpoint: the page is read from its packs
                log.warning(
                    "checkpoint %s not used (the page is read from its packs): %s", cn.name, e
                )
                continue
        if joined:
            await self._save()
            log.info("joined %d pages with their checkpoints", len(joined))
        return held, joined, newest

    async def take(self, page: Page, cp: Checkpoint, *, save: bool = True) -> None:
        """Join checkpoint ``cp`` into ``page`` (:func:`store.page.exchange.apply_state`). The
        page then skips the packs its cover includes, and counts its history from it."""
        markers = [(BASE, str(cp.name.eager_end - cp.name.head_end).encode())]
        for d, seq in cp.cover.items():
            done = await ex.sync_value(page, f"imported/{d}")
            markers.append((f"imported/{d}", str(max(seq, int(done or b"0"))).encode()))
            name = f"{ex.PIECES_WAITING}{d}"
            waiting = ex.waiting_seqs(await ex.sync_value(page, name))
            left = [p for p in waiting if p > seq]  # (the writes of the others are in it)
            if left != waiting:
                markers.append((name, ex.waiting_value(left)))
        entries = await ex.check_entries(cp.entries)
        await ex.apply_state(page, entries, cp.eager, cp.lazy, cp.ctx, markers)
        old = self.covers.get(cp.key, {})
        self.covers[cp.key] = {d: max(s, old.get(d, 0)) for d, s in {**old, **cp.cover}.items()}
        self.joined[cp.key] = cp.name.name
        if save:
            await self._save()

    async def best_for(self, key: Key) -> Checkpoint | None:
        """The page's best checkpoint, read whole (None if it has none)."""
        best = await self.best([cn async for cn in self.names(self.tag(key))])
        for cn in best.values():
            cp = await self.read(cn)
            if cp.key == key:
                return cp
        return None

    async def locate(self, key: Key, digests: list[bytes]) -> dict[bytes, str]:
        """Where the page's newest checkpoint holds these LAZY pieces (for a piece whose
        pack was compacted away)."""
        names = [cn async for cn in self.names(self.tag(key))]
        best = await self.best(names)
        if not best:
            return {}
        cp = await self.read(next(iter(best.values())), sections=False)
        if cp.key != key:
            return {}
        return {d: cp.lazy[d] for d in digests if d in cp.lazy}

    def status(self) -> dict[str, Any]:
        return {"written": self.written, "joined_pages": len(self.covers)}
