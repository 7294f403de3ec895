"""Page sync: upload rounds, downloads, lazy fetches, and the background loop.

This module owns the protocol. The bucket's names are in :mod:`sync.layout`, the
per-device download state in :mod:`sync.progress`. It sees the store only
through its public API (:mod:`store.exchange`, :class:`store.Repository`) and the
cloud only through :class:`~sync.cloud.CloudStore`.

Bucket identity: the first daemon to use a bucket writes the marker
(``ledgerd-bucket.{version}``); a device remembers (repository meta, per cloud
URL) that it has seen it, and from then on refuses a bucket without it instead of
starting an empty one in its place (an unmounted share, a moved folder).

Upload round (per page with pending commits): the page's unsynced commits and the
pieces they brought go into one pack, EAGER pieces first, LAZY ones in the order
of their values' bytes; a page with more than ``max_pack`` bytes of new pieces
spreads them over several packs with the commits in the last, so objects are in
the bucket before any commit that references them is visible. Pieces are read
one pack at a time. The sequence number is taken (and saved) before the PUT, so a
crash leaves at most a gap. Then pieces become ``synced`` and commits leave
``unsynced``. Which pages have pending commits is kept in repository meta
(``sync/pending``), so a round opens only those.

Download: list ``devices/`` (on start and every ``device_list_every`` polls), then
for each other device list its log after the last name read (one LIST per
device), and for each new pack one ranged GET of ``[0, eager_end)``. The store
verifies everything before storing it. A pack that cannot be imported (refused,
waiting for parents, failed here) is held and retried with backoff; it never
blocks the device's later packs. Sequences missing from a device's log are gaps,
probed with backoff, so a pack that appears late is still imported. LAZY pieces
are recorded with their location and fetched on first read, adjacent ranges of
one pack in one GET, within ``fetch_timeout``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import msgpack

from ledgerd.store import Commit, CommitListener, Page, PageHooks, Repository, ResolverSource
from ledgerd.store import digest as dg
from ledgerd.store import exchange as ex
from ledgerd.store.errors import (
    ClosedError,
    CorruptObjectError,
    InvalidArgumentError,
    ObjectNotFoundError,
    TransientStoreError,
)
from ledgerd.sync import layout, pack, progress
from ledgerd.sync.cloud import CloudStore
from ledgerd.sync.errors import (
    AlreadyExistsError,
    BucketIdentityError,
    CloudError,
    CloudNotFoundError,
    NoBucketError,
    RangeNotInObjectError,
    SyncTimeoutError,
    TransientCloudError,
)
from ledgerd.sync.layout import LogName
from ledgerd.sync.progress import DeviceLog, Held

log = logging.getLogger(__name__)

Key = tuple[bytes, bytes]

MAX_PACK = 32 * 1024 * 1024
COALESCE_GAP = 256 * 1024
"""Bytes between two wanted ranges of one pack that a lazy fetch reads through."""
COALESCE_SPAN = 16 * 1024 * 1024
"""Most bytes one ranged GET of a lazy fetch asks for."""
PREFETCH = 16 * 1024 * 1024
"""Most bytes a lazy fetch brings beyond what was asked for (the rest of a value)."""
PENDING_SLACK_MS = 60_000
"""Pages closed this long before the pending list was saved count as changed (clock steps)."""


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _text(raw: bytes) -> str | None:
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return None


def _error(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


@dataclass
class PageState:
    last_sync: float | None = None
    last_error: str | None = None  # why the page could not be uploaded


class RoundObserver(Protocol):
    """Told of every sync round (the daemon's metrics)."""

    def round_done(self, seconds: float, stats: Stats, error: BaseException | None) -> None: ...


@dataclass
class Stats:
    uploaded_packs: int = 0
    downloaded_packs: int = 0
    rounds: int = 0


class SyncEngine:
    """Syncs one repository's pages through a bucket.

    Made before the repository opens, because the repository's pages need it:
    it fetches their LAZY pieces and hears of their commits (the
    :class:`~ledgerd.store.PieceFetcher` and :class:`~ledgerd.store.CommitListener`
    of :meth:`hooks`). :meth:`start` then gives it the repository::

        engine = SyncEngine(store)
        repo = await Repository.open(path, hooks=engine.hooks())
        await engine.start(repo)
    """

    def __init__(
        self,
        store: CloudStore,
        *,
        location: str = "",
        poll_interval: float = 5.0,
        debounce: float = 0.5,
        max_pack: int = MAX_PACK,
        device_list_every: int = 10,
        fetch_timeout: float = 60.0,
        retry_first: float = 5.0,
        retry_most: float = 3600.0,
        clock_skew: float = 300.0,
        observer: RoundObserver | None = None,
    ) -> None:
        self._repo: Repository | None = None
        self.store = store
        self.location = location
        self.poll_interval = poll_interval
        self.debounce = debounce
        self.max_pack = max_pack
        self.device_list_every = device_list_every
        self.fetch_timeout = fetch_timeout
        self.retry_first = retry_first
        self.retry_most = retry_most
        self.clock_skew = clock_skew
        self.observer = observer
        self._also: CommitListener | None = None
        self.last_round_ok: float | None = None
        """When a round last finished without failing as a whole (UNIX time)."""
        self.devices: set[str] = set()
        self.states: dict[Key, PageState] = {}
        self.bucket_error: str | None = None
        self.round_error: str | None = None
        self.device_errors: dict[str, str] = {}
        self.skew: dict[str, dict[str, Any]] = {}
        self._logs: dict[str, DeviceLog] = {}
        self._ignored: set[str] = set()
        self._polls = 0
        self._lock = asyncio.Lock()  # one round at a time
        self._task: asyncio.Task[None] | None = None
        self._pending: dict[Key, int] = {}  # page -> commits seen (changes on every commit)
        self._pending_loaded = False
        self._pending_saved: list[Key] | None = None
        self._dirty = False
        self._bucket_ok = False
        self._seq_checked = False
        self._wake = asyncio.Event()

    # -- lifecycle -----------------------------------------------------------------

    def hooks(
        self, resolvers: ResolverSource | None = None, also: CommitListener | None = None
    ) -> PageHooks:
        """The page hooks to open the repository with: this engine fetches and listens
        (and tells ``also`` of every commit: the daemon's metrics)."""
        self._also = also
        return PageHooks(fetcher=self, listener=self, resolvers=resolvers)

    @property
    def repo(self) -> Repository:
        if self._repo is None:
            raise RuntimeError("the sync engine has not started")
        return self._repo

    @property
    def device(self) -> str:
        """This device's id in hex, as it names the device in the bucket."""
        return self.repo.device_id.hex()

    async def start(self, repo: Repository, background: bool = True) -> None:
        """Sync ``repo`` (opened with :meth:`hooks`), in the background unless told not to."""
        if repo.hooks.fetcher is not self or repo.hooks.listener is not self:
            raise ValueError("open the repository with this engine's hooks()")
        self._repo = repo
        if background:
            self._task = asyncio.create_task(self._loop(), name="sync")

    async def stop(self, final_upload_timeout: float = 5.0) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        try:
            await asyncio.wait_for(self.round(download=False), final_upload_timeout)
        except TimeoutError:
            log.warning(
                "the last upload at stop did not finish within %gs; the rest goes up "
                "on the next start",
                final_upload_timeout,
            )
        except Exception as e:
            log.warning("the last upload at stop failed (it goes up on the next start): %s", e)
        await self.store.close()

    async def fetch_pieces(self, page: Page, digests: list[bytes]) -> dict[bytes, bytes]:
        return await self._fetch(page, digests)

    def page_committed(self, page: Page, commit: Commit) -> None:
        self._changed((page.ledger, page.id))
        if self._also is not None:
            self._also.page_committed(page, commit)

    def requeued(self, key: Key) -> None:
        """``key`` has pending uploads again (a repair made pieces or commits pending)."""
        self._changed(key)

    def page_error(self, key: Key) -> str | None:
        """Why the page's last upload failed, or None."""
        st = self.states.get(key)
        return st.last_error if st is not None else None

    def _changed(self, key: Key) -> None:
        self._pending[key] = self._pending.get(key, 0) + 1
        self._dirty = True
        self._wake.set()

    async def _loop(self) -> None:
        next_poll = 0.0
        while True:
            try:
                now = time.monotonic()
                if now >= next_poll:
                    self._dirty = False
                    self._wake.clear()
                    await self.round()
                    next_poll = time.monotonic() + self.poll_interval
                elif self._dirty:
                    await asyncio.sleep(self.debounce)  # let a burst of commits settle
                    self._dirty = False
                    self._wake.clear()
                    await self.round(download=False)
                if not self._dirty:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(
                            self._wake.wait(), max(0.0, next_poll - time.monotonic())
                        )
            except asyncio.CancelledError:
                raise
            except Exception as e:  # keep syncing; the error is in status
                log.warning("sync round failed: %s", _error(e))
                await asyncio.sleep(self.poll_interval)
                next_poll = time.monotonic()

    # -- rounds --------------------------------------------------------------------

    async def round(
        self,
        download: bool = True,
        only: tuple[bytes, bytes | None] | None = None,
        full: bool = False,
    ) -> Stats:
        """One upload round, then one download pass.

        ``full`` (the first round of :meth:`sync`) checks the bucket's marker again,
        lists the devices, and retries held packs and probes gaps without waiting
        for their backoff. Raises if the round as a whole failed (the bucket, the
        listing of devices); a page's or a pack's failure stays theirs, in status.
        """
        stats = Stats()
        async with self._lock:
            started = time.monotonic()
            try:
                if full:
                    self._bucket_ok = False
                await self._check_bucket()
                await self._register()
                stats.uploaded_packs = await self._upload_all(only)
                if download:
                    stats.downloaded_packs = await self._download(force=full)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                self.round_error = _error(e)
                if isinstance(e, NoBucketError | BucketIdentityError):
                    self._bucket_ok = False
                self._observe(started, stats, e)
                raise
            self.round_error = None
            self.last_round_ok = time.time()
            stats.rounds = 1
            self._observe(started, stats, None)
        return stats

    def _observe(self, started: float, stats: Stats, error: BaseException | None) -> None:
        if self.observer is not None:
            try:
                self.observer.round_done(time.monotonic() - started, stats, error)
            except Exception:
                log.exception("the sync round observer failed")

    async def sync(
        self, ledger: bytes | None = None, page: bytes | None = None, timeout: float = 60.0
    ) -> Stats:
        """Upload everything pending, fetch everything visible, merge; repeat until quiet.

        Returns when a round moves nothing; what could not be synced is then in
        :meth:`problems`. Raises SyncTimeoutError, with the last error seen, after
        ``timeout`` seconds.
        """
        only = (ledger, page) if ledger is not None else None
        total = Stats()

        async def go() -> None:
            full, retries = True, 0
            while True:
                s = await self.round(only=only, full=full)
                full = False
                total.rounds += 1
                total.uploaded_packs += s.uploaded_packs
                total.downloaded_packs += s.downloaded_packs
                if s.uploaded_packs or s.downloaded_packs:
                    continue
                if retries < 3 and self._deferred():  # a page closing, a dropped connection
                    retries += 1
                    continue
                return

        try:
            await asyncio.wait_for(go(), timeout)
        except TimeoutError:
            reason = self.store.last_failure() or self.round_error
            raise SyncTimeoutError(
                f"did not finish within {timeout:g}s"
                + (f"; last error: {reason}" if reason else "")
            ) from None
        return total

    async def _check_bucket(self) -> None:
        """The bucket carries its marker; the first daemon to use it writes it."""
        if self._bucket_ok:
            return
        seen_key = f"sync/bucket-seen/{self.location}"
        try:
            names = [n async for n in self.store.list(layout.MARKER + ".")]
            versions = [v for n in names if (v := layout.marker_version(n)) is not None]
            if not versions:
                if await self.repo.get_meta(seen_key) is not None:
                    raise BucketIdentityError(
                        f"the bucket has no {layout.MARKER} marker although this device "
                        "synced with it before: it was moved, unmounted or emptied. ledgerd "
                        "does not start a new bucket in its place; bring it back, or use "
                        "another cloud URL for a new bucket"
                    )
                await self.store.create_bucket()
                with contextlib.suppress(AlreadyExistsError):
                    await self.store.put(
                        layout.marker_name(), layout.marker(self.device, time.time())
                    )
                log.info("marked the bucket as a ledgerd bucket (layout %d)", layout.BUCKET_FORMAT)
                versions = [layout.BUCKET_FORMAT]
            layout.check_version(max(versions))
        except (BucketIdentityError, NoBucketError) as e:
            if self.bucket_error != str(e):
                log.error("cloud sync stopped: %s", e)
            self.bucket_error = str(e)
            raise
        if await self.repo.get_meta(seen_key) is None:
            await self.repo.set_meta(seen_key, b"1")
        self.bucket_error = None
        self._bucket_ok = True

    async def _register(self) -> None:
        if await self.repo.get_meta("sync/registered") == b"1":
            return
        with contextlib.suppress(AlreadyExistsError):
            await self.store.put(f"devices/{self.device}", b"")
        await self.repo.set_meta("sync/registered", b"1")

    # -- pending uploads -----------------------------------------------------------

    async def _all_pages(self, ledger: bytes | None = None) -> list[Key]:
        """Every page stored here (of ``ledger``): directory listings, no page opened."""
        keys: list[Key] = []
        for led in [ledger] if ledger is not None else await self.repo.ledgers():
            keys.extend((led, pid) for pid in await self.repo.ledger(led).pages())
        return keys

    async def _load_pending(self) -> None:
        """Pages that may hold commits not uploaded yet: the saved list, and the pages
        open or closed since it was saved (a commit after the save was made in a page
        open then). Without a saved list (an older ledgerd ran here), every page."""
        raw = await self.repo.get_meta("sync/pending")
        keys: list[Key]
        try:
            if raw is None:
                raise ValueError("no saved list")
            d = msgpack.unpackb(raw, raw=False)
            keys = [(bytes(a), bytes(b)) for a, b in d["pages"]]
            keys += await self.repo.pages_used_since(int(d["saved_at"]) - PENDING_SLACK_MS)
        except Exception as e:  # msgpack raises several unrelated types
            log.info("looking for unsynced commits in every page (%s)", e)
            keys = await self._all_pages()
        for key in keys:
            self._pending.setdefault(key, 0)
        self._pending_loaded = True

    async def _save_pending(self) -> None:
        keys = sorted(self._pending)
        if keys == self._pending_saved:
            return
        saved_at = int(time.time() * 1000)  # before the write: commits after it are newer
        data = msgpack.packb({"saved_at": saved_at, "pages": [list(k) for k in keys]})
        await self.repo.set_meta("sync/pending", bytes(data))
        self._pending_saved = keys

    # -- upload ----------------------------------------------------------------------

    async def _upload_all(self, only: tuple[bytes, bytes | None] | None = None) -> int:
        """Upload the pages with pending commits and the open ones (of ``only``, if given)."""
        if not self._pending_loaded:
            await self._load_pending()
        # Open pages too: their latest writes may not be committed yet (group commit).
        candidates = set(self._pending) | {(p.ledger, p.id) for p in self.repo.open_pages()}
        keys = [
            k
            for k in sorted(candidates)
            if only is None or (k[0] == only[0] and only[1] in (None, k[1]))
        ]
        await self._save_pending()
        n = 0
        for key in keys:
            seen = self._pending.get(key)
            if not self.repo.page_exists(*key):
                self._pending.pop(key, None)
                self.states.pop(key, None)
                continue
            try:
                async with self._using(key) as page:
                    n += await self.upload_page(page)
                    left = await ex.unsynced_count(page)  # a conflict keeps its commits
            except asyncio.CancelledError:
                raise
            except Exception as e:  # this page's failure stays this page's
                self._page_failed(key, e)
                continue
            st = self.states.setdefault(key, PageState())
            st.last_error = None
            if not left and key in self._pending and self._pending[key] == seen:
                del self._pending[key]
        await self._save_pending()
        return n

    @contextlib.asynccontextmanager
    async def _using(self, key: Key) -> AsyncIterator[Page]:
        """The page, leased (not closed as idle) for one sync step. A page that was
        not open before is closed again after it, unless someone else opened it
        meanwhile or something is under way in it."""
        async with self.repo.page(*key, transient=True) as page:
            yield page

    async def upload_page(self, page: Page) -> int:
        up = await ex.pending_upload(page)
        if up.empty:
            return 0
        sizes = await ex.piece_sizes(page, [*up.eager, *up.lazy])
        # Tree nodes go with the commits (the last pack): the reader checks a commit's
        # whole new tree in the same pack. Only value pieces are spread ahead of it.
        nodes = [d for d in up.eager if dg.kind_of(d) is dg.Kind.TREE]
        values = [d for d in up.eager if dg.kind_of(d) is not dg.Kind.TREE]
        # Packs of at most max_pack bytes, planned from sizes; commits go in the last.
        groups: list[tuple[list[bytes], list[bytes]]] = []
        cur_e: list[bytes] = []
        cur_l: list[bytes] = []
        size = 0
        for is_lazy, digests in ((False, values), (True, up.lazy)):
            for d in digests:
                n = sizes.get(d, 0)
                if size + n > self.max_pack and (cur_e or cur_l):
                    groups.append((cur_e, cur_l))
                    cur_e, cur_l, size = [], [], 0
                (cur_l if is_lazy else cur_e).append(d)
                size += n
        if size + sum(sizes.get(d, 0) for d in nodes) > self.max_pack and (cur_e or cur_l):
            groups.append((cur_e, cur_l))
            cur_e, cur_l = [], []
        groups.append((nodes + cur_e, cur_l))
        for i, (ge, gl) in enumerate(groups):  # one pack's pieces in memory at a time
            commits = [c.data for c in up.commits] if i == len(groups) - 1 else []
            pieces = await ex.read_pieces(page, ge + gl)
            await self._put_pack(
                page, commits, [(d, pieces[d]) for d in ge], [(d, pieces[d]) for d in gl]
            )
            del pieces
        await ex.mark_uploaded(page, [c.id for c in up.commits], [*up.eager, *up.lazy])
        self._ok(page)
        log.debug(
            "uploaded %d commits of page %r in %d packs", len(up.commits), page.id, len(groups)
        )
        return len(groups)

    async def _next_seq(self) -> int:
        """The next sequence number, saved before use; never below what the bucket shows.

        On the first use after start the device's log is listed after the saved
        number (normally an empty listing), so a rolled-back counter (a power loss,
        a restored backup) cannot reuse a number.
        """
        seq = int(await self.repo.get_meta("sync/seq") or b"0")
        if not self._seq_checked:
            after = layout.log_after(self.device, seq)
            async for name in self.store.list(layout.log_prefix(self.device), after):
                ln = LogName.parse(name, self.device)
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
            name = LogName.make(self.device, seq, eager_end, page.ledger, page.id).name
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

    async def _download(self, force: bool = False) -> int:
        if force or not self.devices or self._polls % self.device_list_every == 0:
            devices = set()
            async for name in self.store.list("devices/"):
                device = name.split("/", 1)[1]
                if layout.device_ok(device):
                    devices.add(device)
                else:
                    self._ignore(name)
            self.devices = devices - {self.device}
        self._polls += 1
        n = 0
        for device in sorted(self.devices):
            try:
                n += await self._download_device(device, force)
            except CloudError as e:  # this device's log is unreachable now; the others go on
                self.device_errors[device] = _error(e)
                log.warning("download from device %s failed: %s", device, e)
            else:
                self.device_errors.pop(device, None)
        return n

    def _ignore(self, name: str) -> None:
        if name not in self._ignored:
            if len(self._ignored) > 10_000:
                self._ignored.clear()
            self._ignored.add(name)
            log.warning("ignoring an object that no ledgerd writes: %s", name)

    async def _device_log(self, device: str) -> DeviceLog:
        dl = self._logs.get(device)
        if dl is not None:
            return dl
        raw = await self.repo.get_meta(f"sync/log/{device}")
        if raw is not None:
            try:
                dl = DeviceLog.decode(device, raw)
            except ValueError as e:
                log.warning("%s; reading that device's log from its start", e)
        if dl is None:  # first contact, or the cursor of an older ledgerd
            cursor = (await self.repo.get_meta(f"sync/cursor/{device}") or b"").decode()
            ln = LogName.parse(cursor, device)
            dl = DeviceLog(device, cursor, ln.seq if ln else 0)
        self._logs[device] = dl
        return dl

    async def _save_log(self, dl: DeviceLog) -> None:
        await self.repo.set_meta(f"sync/log/{dl.device}", dl.encode())

    async def _download_device(self, device: str, force: bool) -> int:
        dl = await self._device_log(device)
        now = time.monotonic()
        listed: list[LogName] = []
        last = dl.cursor
        async for name in self.store.list(layout.log_prefix(device), dl.cursor):
            last = max(last, name)
            ln = LogName.parse(name, device)
            if ln is None:
                self._ignore(name)
                continue
            listed.append(ln)
            dl.saw(ln.seq)
        found: list[LogName] = []
        if dl.gaps and (force or now >= dl.probe_due):  # did a missing pack appear?
            first = min(g.first for g in dl.gaps)
            async for name in self.store.list(
                layout.log_prefix(device), layout.log_after(device, first - 1)
            ):
                ln = LogName.parse(name, device)
                if ln is not None and dl.in_gap(ln.seq):
                    found.append(ln)
                    dl.fill(ln.seq)
                    log.info("pack %s appeared in a gap of device %s", name, device)
            dl.probes = 0 if found else dl.probes + 1
            dl.probe_due = now + progress.backoff(dl.probes, self.retry_first, self.retry_most)
        retry = [h.ln for h in dl.held.values() if force or now >= h.due]
        todo = {ln.name: ln for ln in [*retry, *found, *listed]}
        new = {ln.name for ln in listed}
        n = 0
        for ln in sorted(todo.values(), key=lambda x: (x.seq, x.name)):
            if await self._import_pack(dl, ln):
                n += 1
            if ln.name in new:
                dl.cursor = max(dl.cursor, ln.name)
            await self._save_log(dl)
        if last != dl.cursor:
            dl.cursor = last
            await self._save_log(dl)
        return n

    async def _import_pack(self, dl: DeviceLog, ln: LogName) -> bool:
        """Import one pack; on failure hold it (status says why) and go on."""
        try:
            data = await self.store.get(ln.name, 0, ln.eager_end)
            p = pack.decode_prefix(data, ln.eager_end)
            if (p.ledger, p.page, p.seq, p.device.hex()) != (ln.ledger, ln.page, ln.seq, ln.device):
                raise pack.CorruptPackError("pack does not match its name")
            lazy = {d: f"{ln.name}:{off}:{length}" for d, off, length in p.lazy}
            async with self._using(ln.key) as page:
                marker = f"imported/{ln.device}"
                done = await ex.sync_value(page, marker)
                mark = str(max(ln.seq, int(done) if done else 0)).encode()
                new = await ex.import_remote(page, p.commits, p.eager, lazy, (marker, mark))
        except asyncio.CancelledError:
            raise
        except CloudNotFoundError:
            dl.held.pop(ln.name, None)
            log.warning("pack %s is no longer in the bucket; skipped", ln.name)
            return False
        except ex.MissingParentError as e:
            self._hold(dl, ln, progress.WAITING, f"waits for what no pack seen holds: {e}")
        except (
            pack.CorruptPackError,
            CorruptObjectError,
            InvalidArgumentError,
            RangeNotInObjectError,
        ) as e:
            self._hold(dl, ln, progress.REFUSED, f"refused: {_error(e)}")
        except (TransientCloudError, TransientStoreError, ClosedError) as e:
            self._hold(dl, ln, progress.DEFERRED, f"not imported now: {_error(e)}")
        except Exception as e:  # the page cannot take it here (newer schema, disk full)
            self._hold(dl, ln, progress.FAILED, f"cannot import it here: {_error(e)}")
        else:
            dl.held.pop(ln.name, None)
            self._imported(ln, new)
            return True
        return False

    def _hold(self, dl: DeviceLog, ln: LogName, state: str, reason: str) -> None:
        held = dl.held.get(ln.name)
        first = held is None or held.reason != reason
        if held is None:
            held = dl.held[ln.name] = Held(ln, state, reason)
        held.state, held.reason = state, reason
        held.attempts += 1
        if state == progress.DEFERRED:
            held.due = time.monotonic()  # next poll
        else:
            held.due = time.monotonic() + progress.backoff(
                held.attempts, self.retry_first, self.retry_most
            )
        level = logging.WARNING if state in (progress.WAITING, progress.DEFERRED) else logging.ERROR
        log.log(
            level if first else logging.DEBUG,
            "pack %s (page %r of ledger %r): %s; retried with backoff",
            ln.name,
            ln.page,
            ln.ledger,
            reason,
        )

    def _imported(self, ln: LogName, new: list[Commit]) -> None:
        st = self.states.setdefault(ln.key, PageState())
        st.last_sync = time.time()
        # Packs of this page waiting for parents may have them now.
        for dl in self._logs.values():
            for h in dl.held.values():
                if h.ln.key == ln.key and h.state == progress.WAITING:
                    h.due = 0.0
        now_us = time.time_ns() // 1000
        for c in new:
            ahead = (c.timestamp - now_us) / 1e6
            if c.salt and ahead > self.clock_skew:  # merges carry their parents' times
                if ln.device not in self.skew:
                    log.warning(
                        "device %s's clock is %.0fs ahead of this one (commit %s)",
                        ln.device,
                        ahead,
                        c.id.hex()[:12],
                    )
                self.skew[ln.device] = {
                    "device": ln.device,
                    "ahead_s": round(ahead, 1),
                    "commit": c.id.hex(),
                    "seen_at": time.time(),
                }

    def _deferred(self) -> bool:
        return any(
            h.state == progress.DEFERRED for dl in self._logs.values() for h in dl.held.values()
        )

    # -- lazy fetch ------------------------------------------------------------------

    async def _fetch(self, page: Page, digests: list[bytes]) -> dict[bytes, bytes]:
        try:
            async with asyncio.timeout(self.fetch_timeout):
                return await self._fetch_value(page, digests)
        except TimeoutError:
            reason = self.store.last_failure()
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
        out: dict[bytes, bytes] = {}
        want, budget = digests, PREFETCH
        while want:
            where = await ex.remote_locations(page, want)
            got = await self._fetch_ranges(where)
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
                    budget -= int(where[d].rsplit(":", 1)[1])
                    if budget < 0:
                        break
                    want.append(d)
        return out

    async def _fetch_ranges(self, where: dict[bytes, str]) -> dict[bytes, bytes]:
        """Pieces from their packs: near ranges of one pack in one ranged GET."""
        by_pack: dict[str, list[tuple[int, int, bytes]]] = {}
        for d, loc in where.items():
            name, at, size = loc.rsplit(":", 2)
            by_pack.setdefault(name, []).append((int(at), int(size), d))
        out: dict[bytes, bytes] = {}
        for name, items in by_pack.items():
            for start, end, group in _coalesce(sorted(items)):
                data = await self.store.get(name, start, end - start)
                for off, length, d in group:
                    piece = data[off - start : off - start + length]
                    if not dg.verify(d, piece):
                        raise CorruptObjectError(
                            f"the cloud's copy of object {dg.short(d)} (in {name}) does not "
                            "match its digest; nothing on this device is damaged"
                        )
                    out[d] = piece
        return out

    # -- status ----------------------------------------------------------------------

    def _ok(self, page: Page) -> None:
        st = self.states.setdefault((page.ledger, page.id), PageState())
        st.last_sync, st.last_error = time.time(), None

    def _page_failed(self, key: Key, e: BaseException) -> None:
        st = self.states.setdefault(key, PageState())
        message = _error(e)
        level = logging.DEBUG if st.last_error == message else logging.WARNING
        st.last_error = message
        log.log(level, "upload of page %r of ledger %r failed: %s", key[1], key[0], message)

    def _held(self) -> Iterable[Held]:
        for device in sorted(self._logs):
            yield from sorted(self._logs[device].held.values(), key=lambda h: h.ln.seq)

    def _pack_error(self, key: Key) -> str | None:
        for h in self._held():
            if h.ln.key == key and h.state != progress.RETRY:
                return f"pack {h.ln.name}: {h.reason}"
        return None

    @property
    def last_error(self) -> str | None:
        """The first thing in the way of sync, if any (``sync_error`` in status)."""
        problems = self.problems()
        return str(problems[0]["error"]) if problems else None

    def problems(
        self, ledger: bytes | None = None, page: bytes | None = None
    ) -> list[dict[str, Any]]:
        """What sync could not do, of the page or ledger given (plus whole-bucket ones)."""

        def mine(key: Key) -> bool:
            return (ledger is None or key[0] == ledger) and (page is None or key[1] == page)

        out: list[dict[str, Any]] = []
        if self.bucket_error:
            out.append({"error": self.bucket_error})
        elif self.round_error:
            out.append({"error": self.round_error})
        for device, err in sorted(self.device_errors.items()):
            out.append({"device": device, "error": f"device {device}: {err}"})
        for key, st in sorted(self.states.items()):
            if st.last_error and mine(key):
                out.append({"ledger": _b64(key[0]), "page": _b64(key[1]), "error": st.last_error})
        for h in self._held():
            if h.state != progress.RETRY and mine(h.ln.key):
                out.append(
                    {
                        "ledger": _b64(h.ln.ledger),
                        "page": _b64(h.ln.page),
                        "pack": h.ln.name,
                        "error": f"pack {h.ln.name}: {h.reason}",
                    }
                )
        return out

    def status(self) -> dict[str, Any]:
        """Sync's part of ``/v1/status``: every problem, for open and closed pages."""
        pages = []
        for key, st in sorted(self.states.items()):
            if st.last_error:
                pages.append(
                    {
                        "ledger": _b64(key[0]),
                        "page": _b64(key[1]),
                        "ledger_text": _text(key[0]),
                        "page_text": _text(key[1]),
                        "error": st.last_error,
                        "last_sync": st.last_sync,
                    }
                )
        packs = []
        for h in self._held():
            packs.append(
                {
                    **h.json(),
                    "ledger": _b64(h.ln.ledger),
                    "page": _b64(h.ln.page),
                    "ledger_text": _text(h.ln.ledger),
                    "page_text": _text(h.ln.page),
                }
            )
        gaps = [
            {"device": dl.device, "first_seq": g.first, "last_seq": g.last, "since": g.since}
            for _, dl in sorted(self._logs.items())
            for g in dl.gaps
        ]
        health = self.health()
        return {
            "healthy": health["healthy"],
            "synced": health["synced"],
            "reasons": health["reasons"],
            "last_round_ok": self.last_round_ok,
            "bucket_error": self.bucket_error,
            "round_error": self.round_error,
            "pending_uploads": len(self._pending),
            "pages": pages,
            "packs": packs,
            "gaps": gaps,
            "devices": [{"device": d, "error": e} for d, e in sorted(self.device_errors.items())],
            "clock_skew": [self.skew[d] for d in sorted(self.skew)],
        }

    def health(self) -> dict[str, Any]:
        """Whether sync works, and whether this device is synced, with every reason why
        not: a problem (see :meth:`problems`: the bucket, a device's log, a page's
        upload, a held pack: waiting for parents, refused, failed), a gap in a device's
        log, no round finished lately; and for ``synced``, uploads still pending."""
        reasons = [str(p["error"]) for p in self.problems()]
        for _, dl in sorted(self._logs.items()):
            for g in dl.gaps:
                reasons.append(
                    f"device {dl.device}: packs {g.first}-{g.last} are missing from its log"
                )
        stale = max(60.0, 3 * self.poll_interval)
        if self.last_round_ok is None:
            reasons.append("no sync round has finished yet")
        elif time.time() - self.last_round_ok > stale:
            reasons.append(
                f"no sync round has finished for {time.time() - self.last_round_ok:.0f}s"
            )
        pending = len(self._pending)
        return {
            "healthy": not reasons,
            "synced": not reasons and pending == 0,
            "reasons": reasons,
            "pending_uploads": pending,
            "last_round_ok": self.last_round_ok,
        }

    async def page_status(self, page: Page) -> dict[str, Any]:
        key = (page.ledger, page.id)
        st = self.states.get(key, PageState())
        return {
            "unsynced_commits": await ex.unsynced_count(page),
            "last_sync": st.last_sync,
            "last_error": st.last_error or self._pack_error(key),
        }


def _coalesce(
    items: list[tuple[int, int, bytes]],
) -> list[tuple[int, int, list[tuple[int, int, bytes]]]]:
    """Sorted (offset, length, digest) ranges of one pack as (start, end, members) runs:
    ranges at most COALESCE_GAP apart share a run of at most COALESCE_SPAN bytes."""
    runs: list[tuple[int, int, list[tuple[int, int, bytes]]]] = []
    for off, length, d in items:
        if runs:
            start, end, members = runs[-1]
            if off - end <= COALESCE_GAP and max(end, off + length) - start <= COALESCE_SPAN:
                members.append((off, length, d))
                runs[-1] = (start, max(end, off + length), members)
                continue
        runs.append((off, off + length, [(off, length, d)]))
    return runs
