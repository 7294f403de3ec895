"""Page sync: upload rounds, downloads, lazy fetches, and the background loop.

This module owns the bucket layout and the protocol. It sees the store only
through its public API (:mod:`store.exchange`, :class:`store.Repository`) and
the cloud only through :class:`~sync.cloud.CloudStore`.

Layout (under the bucket prefix)::

    devices/{device}                                   one per device, written once
    log/{device}/{seq:016d}.{eager_end}.{ledger}.{page} one pack per page per round

``device`` is the repository's 128-bit id in hex; ledger and page names are
base64url. Every name is written once, by one device: nothing is overwritten,
nothing is locked.

Upload round (per page): the page's unsynced commits and the pieces they brought
go into one pack, EAGER pieces first; a page with more than ``max_pack`` bytes
of new pieces spreads them over several packs with the commits in the last, so
objects are in the bucket before any commit that references them is visible.
The sequence number is taken (and saved) before the PUT, so a crash leaves at
most a gap. Then pieces become ``synced`` and commits leave ``unsynced``.

Download: list ``devices/`` (on start and every ``device_list_every`` polls), then
for each other device list its log after the last name read (one LIST per
device), and for each new pack one ranged GET of ``[0, eager_end)``. The store
verifies everything before storing it. LAZY pieces are recorded with their
location and fetched on first read with a ranged GET of just their bytes. The
cursor per device is saved after each pack, and each page records the last
sequence it imported per device, so a restart neither re-downloads nor skips.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from ledgerd.store import Commit, Page, Repository
from ledgerd.store import digest as dg
from ledgerd.store import exchange as ex
from ledgerd.store.errors import InvalidArgumentError, ObjectNotFoundError, StoreError
from ledgerd.store.hooks import PageHooks
from ledgerd.sync import pack
from ledgerd.sync.cloud import CloudStore
from ledgerd.sync.errors import AlreadyExistsError, CloudError, PermanentCloudError

log = logging.getLogger(__name__)

MAX_PACK = 32 * 1024 * 1024


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass
class LogName:
    device: str
    seq: int
    eager_end: int
    ledger: bytes
    page: bytes
    name: str

    @classmethod
    def parse(cls, name: str) -> LogName | None:
        try:
            _, device, rest = name.split("/")
            seq, eager_end, ledger, page = rest.split(".")
            return cls(device, int(seq), int(eager_end), _unb64(ledger), _unb64(page), name)
        except (ValueError, TypeError):
            return None


@dataclass
class PageState:
    last_sync: float | None = None
    last_error: str | None = None


@dataclass
class Stats:
    uploaded_packs: int = 0
    downloaded_packs: int = 0
    rounds: int = 0


class SyncEngine:
    def __init__(
        self,
        repo: Repository,
        store: CloudStore,
        *,
        poll_interval: float = 5.0,
        debounce: float = 0.5,
        max_pack: int = MAX_PACK,
        device_list_every: int = 10,
    ) -> None:
        self.repo = repo
        self.store = store
        self.device = repo.device_id.hex()
        self.poll_interval = poll_interval
        self.debounce = debounce
        self.max_pack = max_pack
        self.device_list_every = device_list_every
        self.devices: set[str] = set()
        self.states: dict[tuple[bytes, bytes], PageState] = {}
        self.last_error: str | None = None
        self._polls = 0
        self._lock = asyncio.Lock()  # one round at a time
        self._task: asyncio.Task[None] | None = None
        self._dirty: set[tuple[bytes, bytes]] = set()
        self._scanned = False
        self._seq_checked = False
        self._wake = asyncio.Event()

    # -- lifecycle -----------------------------------------------------------------

    async def start(self, background: bool = True) -> None:
        # TODO(namespace issue): give the engine to Repository.open instead.
        self.repo.hooks = PageHooks(
            fetcher=self, listener=self, resolvers=self.repo.hooks.resolvers
        )
        if background:
            self._task = asyncio.create_task(self._loop(), name="sync")

    async def stop(self, final_upload_timeout: float = 5.0) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._upload_all(), final_upload_timeout)
        await self.store.close()

    async def fetch_pieces(self, page: Page, digests: list[bytes]) -> dict[bytes, bytes]:
        return await self._fetch(page, digests)

    def page_committed(self, page: Page, commit: Commit) -> None:
        self._changed((page.ledger, page.id))

    def _changed(self, key: tuple[bytes, bytes]) -> None:
        self._dirty.add(key)
        self._wake.set()

    async def _loop(self) -> None:
        next_poll = 0.0
        while True:
            try:
                now = time.monotonic()
                if now >= next_poll:
                    await self.round()
                    next_poll = time.monotonic() + self.poll_interval
                elif self._dirty:
                    await asyncio.sleep(self.debounce)  # let a burst of commits settle
                    await self.round(download=False)
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        self._wake.wait(), max(0.0, next_poll - time.monotonic())
                    )
            except asyncio.CancelledError:
                raise
            except Exception as e:  # keep syncing; the error is in status
                self.last_error = f"{type(e).__name__}: {e}"
                log.warning("sync round failed: %s", self.last_error)
                await asyncio.sleep(self.poll_interval)

    # -- rounds --------------------------------------------------------------------

    async def round(
        self,
        download: bool = True,
        only: tuple[bytes, bytes | None] | None = None,
        full: bool = False,
    ) -> Stats:
        """One upload round, then one download pass.

        The upload looks at pages committed to since the last round, or with ``full``
        (and on the first round) at every page.
        """
        stats = Stats()
        async with self._lock:
            await self._register()
            if full:
                self._scanned = False
            stats.uploaded_packs = await self._upload_all(only)
            if download:
                stats.downloaded_packs = await self._download(only, list_devices=full)
            stats.rounds = 1
        return stats

    async def sync(
        self, ledger: bytes | None = None, page: bytes | None = None, timeout: float = 60.0
    ) -> Stats:
        """Upload everything pending, fetch everything visible, merge; repeat until quiet."""
        only = (ledger, page) if ledger is not None else None
        total = Stats()

        async def go() -> None:
            while True:
                s = await self.round(only=only, full=True)
                total.rounds += 1
                total.uploaded_packs += s.uploaded_packs
                total.downloaded_packs += s.downloaded_packs
                if not s.uploaded_packs and not s.downloaded_packs:
                    return

        await asyncio.wait_for(go(), timeout)
        return total

    async def _register(self) -> None:
        if await self.repo.get_meta("sync/registered") == b"1":
            return
        with contextlib.suppress(AlreadyExistsError):
            await self.store.put(f"devices/{self.device}", b"")
        await self.repo.set_meta("sync/registered", b"1")

    # -- upload ----------------------------------------------------------------------

    async def _pages(self, only: tuple[bytes, bytes | None] | None) -> list[tuple[bytes, bytes]]:
        """(ledger, page id) of the existing pages, or of those ``only`` names."""
        keys: list[tuple[bytes, bytes]] = []
        ledgers = [only[0]] if only else await self.repo.ledgers()
        for ledger in ledgers:
            ids = (
                [only[1]]
                if only and only[1] is not None
                else await self.repo.ledger(ledger).pages()
            )
            keys.extend((ledger, pid) for pid in ids if self.repo.page_exists(ledger, pid))
        return keys

    async def _upload_all(self, only: tuple[bytes, bytes | None] | None = None) -> int:
        """Upload pages with unsynced commits: those committed to since the last round,
        and on the first round every page (commits from before a restart)."""
        if only is not None:
            keys = await self._pages(only)
        elif not self._scanned:
            keys = await self._pages(None)
            self._scanned = True
        else:
            keys = sorted(self._dirty)
        self._dirty.difference_update(keys)
        n = 0
        for key in keys:
            page = None
            try:
                async with self._using(key) as page:
                    n += await self.upload_page(page)
            except (CloudError, StoreError) as e:
                if page is not None:
                    self._fail(page, e)
                else:
                    log.error(
                        "cannot open page %r of ledger %r to upload it: %s", key[1], key[0], e
                    )
                self._dirty.add(key)  # retried next round
        return n

    @contextlib.asynccontextmanager
    async def _using(self, key: tuple[bytes, bytes]) -> AsyncIterator[Page]:
        """The page, leased (not closed as idle) for one sync step. A page that was
        not open before is closed again after it, unless someone else opened it
        meanwhile or something is under way in it: a first round that visits
        every page keeps one open at a time."""
        async with self.repo.page(*key, transient=True) as page:
            yield page

    async def upload_page(self, page: Page) -> int:
        up = await ex.pending_upload(page)
        if up.empty:
            return 0
        eager = await ex.read_pieces(page, up.eager) if up.eager else {}
        lazy = await ex.read_pieces(page, up.lazy) if up.lazy else {}
        # Tree nodes go with the commits (the last pack): the reader checks a commit's
        # whole new tree in the same pack. Only value pieces are spread ahead of it.
        nodes = [(d, eager[d]) for d in up.eager if dg.kind_of(d) is dg.Kind.TREE]
        items_e = [(d, eager[d]) for d in up.eager if dg.kind_of(d) is not dg.Kind.TREE]
        items_l = [(d, lazy[d]) for d in up.lazy]
        # Spread pieces over packs of at most max_pack bytes; commits go in the last.
        groups: list[tuple[list[tuple[bytes, bytes]], list[tuple[bytes, bytes]]]] = []
        cur_e: list[tuple[bytes, bytes]] = []
        cur_l: list[tuple[bytes, bytes]] = []
        size = 0
        for is_lazy, items in ((False, items_e), (True, items_l)):
            for d, v in items:
                if size + len(v) > self.max_pack and (cur_e or cur_l):
                    groups.append((cur_e, cur_l))
                    cur_e, cur_l, size = [], [], 0
                (cur_l if is_lazy else cur_e).append((d, v))
                size += len(v)
        if size + sum(len(v) for _, v in nodes) > self.max_pack and (cur_e or cur_l):
            groups.append((cur_e, cur_l))
            cur_e, cur_l = [], []
        groups.append((nodes + cur_e, cur_l))
        for i, (ge, gl) in enumerate(groups):
            commits = [c.data for c in up.commits] if i == len(groups) - 1 else []
            await self._put_pack(page, commits, ge, gl)
        await ex.mark_uploaded(page, [c.id for c in up.commits], [*up.eager, *up.lazy])
        self._ok(page)
        log.debug(
            "uploaded %d commits of page %r in %d packs", len(up.commits), page.id, len(groups)
        )
        return len(groups)

    async def _next_seq(self) -> int:
        """The next sequence number, saved before use; never below what the bucket shows.

        On the first use after start the device's own log is listed once, so a
        rolled-back counter (a power loss, a restored backup) cannot reuse a number.
        """
        seq = int(await self.repo.get_meta("sync/seq") or b"0")
        if not self._seq_checked:
            async for name in self.store.list(f"log/{self.device}/"):
                ln = LogName.parse(name)
                if ln is not None:
                    seq = max(seq, ln.seq)
            self._seq_checked = True
        seq += 1
        await self.repo.set_meta("sync/seq", str(seq).encode())
        return seq

    async def _put_pack(
        self,
        page: Page,
        commits: list[bytes],
        eager: list[tuple[bytes, bytes]],
        lazy: list[tuple[bytes, bytes]],
    ) -> None:
        while True:
            seq = await self._next_seq()  # taken (and saved) before the PUT
            data, eager_end = pack.encode(
                pack.Pack(page.ledger, page.id, self.repo.device_id, seq, commits, eager, lazy)
            )
            name = f"log/{self.device}/{seq:016d}.{eager_end}.{_b64(page.ledger)}.{_b64(page.id)}"
            try:
                await self.store.put(name, data)
                return
            except AlreadyExistsError:
                # Ours if a retried PUT's first attempt landed; otherwise a reused number.
                if await self.store.get(name, 0, eager_end) == data[:eager_end]:
                    return
                log.warning("sequence %d was already used; taking the next", seq)
                self._seq_checked = False

    # -- download --------------------------------------------------------------------

    async def _download(
        self, only: tuple[bytes, bytes | None] | None = None, list_devices: bool = False
    ) -> int:
        if list_devices or not self.devices or self._polls % self.device_list_every == 0:
            self.devices = {n.split("/", 1)[1] async for n in self.store.list("devices/")} - {
                self.device
            }
        self._polls += 1
        n = 0
        for device in sorted(self.devices):
            try:
                n += await self._download_device(device, only)
            except CloudError as e:  # this device's log is unreachable now; the others go on
                self.last_error = f"device {device}: {type(e).__name__}: {e}"
                log.warning("download from device %s failed: %s", device, e)
        return n

    async def _download_device(self, device: str, only: tuple[bytes, bytes | None] | None) -> int:
        cursor_key = f"sync/cursor/{device}"
        after = (await self.repo.get_meta(cursor_key) or b"").decode()
        n = 0
        async for name in self.store.list(f"log/{device}/", after):
            ln = LogName.parse(name)
            if ln is None:
                log.warning("ignoring a foreign object in the bucket: %s", name)
                await self.repo.set_meta(cursor_key, name.encode())
                continue
            async with contextlib.AsyncExitStack() as stack:
                try:
                    page = await stack.enter_async_context(self._using((ln.ledger, ln.page)))
                except InvalidArgumentError as e:  # a name this device cannot hold
                    log.error("ignoring pack %s: %s", name, e)
                    await self.repo.set_meta(cursor_key, name.encode())
                    continue
                except StoreError as e:  # the page cannot be opened now: next round
                    log.error("cannot open the page of pack %s: %s", name, e)
                    return n
                marker = f"imported/{device}"
                done = await ex.sync_value(page, marker)
                if done is None or int(done) < ln.seq:
                    try:
                        await self._import(page, ln, marker)
                        n += 1
                    except ex.MissingParentError as e:
                        log.info("pack %s waits for its parents: %s", name, e)
                        return n  # later packs of this device may depend on it
                    except (
                        pack.CorruptPackError,
                        StoreError,
                        PermanentCloudError,
                        ValueError,
                    ) as e:
                        # Refused and reported; this device's later packs wait behind it.
                        self._fail(page, e)
                        log.error("refused pack %s: %s", name, e)
                        return n
            await self.repo.set_meta(cursor_key, name.encode())
        return n

    async def _import(self, page: Page, ln: LogName, marker: str) -> None:
        data = await self.store.get(ln.name, 0, ln.eager_end)
        p = pack.decode_prefix(data, ln.eager_end)
        if (p.ledger, p.page, p.seq, p.device.hex()) != (ln.ledger, ln.page, ln.seq, ln.device):
            raise pack.CorruptPackError(f"pack {ln.name} does not match its name")
        lazy = {d: f"{ln.name}:{off}:{length}" for d, off, length in p.lazy}
        await ex.import_remote(page, p.commits, p.eager, lazy, (marker, str(ln.seq).encode()))
        self._ok(page)

    # -- lazy fetch ------------------------------------------------------------------

    async def _fetch(self, page: Page, digests: list[bytes]) -> dict[bytes, bytes]:
        where = await ex.remote_locations(page, digests)
        out: dict[bytes, bytes] = {}
        try:
            for d, loc in where.items():
                name, off, length = loc.rsplit(":", 2)
                out[d] = await self.store.get(name, int(off), int(length))
        except CloudError as e:
            raise ObjectNotFoundError(
                f"the value is in the cloud and could not be fetched (needs fetch): {e}"
            ) from e
        return out

    # -- status ----------------------------------------------------------------------

    def _ok(self, page: Page) -> None:
        st = self.states.setdefault((page.ledger, page.id), PageState())
        st.last_sync, st.last_error = time.time(), None

    def _fail(self, page: Page, e: BaseException) -> None:
        st = self.states.setdefault((page.ledger, page.id), PageState())
        st.last_error = f"{type(e).__name__}: {e}"
        log.warning("sync of page %r failed: %s", page.id, st.last_error)

    async def page_status(self, page: Page) -> dict[str, Any]:
        st = self.states.get((page.ledger, page.id), PageState())
        return {
            "unsynced_commits": await ex.unsynced_count(page),
            "last_sync": st.last_sync,
            "last_error": st.last_error,
        }
