"""What every sync job reaches: the bucket, the repository, and the pages this device holds.

This module owns :class:`SyncContext`: the bucket's store and its identity check
(its marker and encryption descriptor, written once and only into a bucket that
holds nothing, and remembered per cloud URL as :class:`Identity`), the codec that
check yields, the repository once the engine started, a page leased for one sync
step (or the page being restored), and which pages this device holds. The engine
builds it and gives it to each of its jobs (:mod:`sync.feed`, :mod:`sync.upload`,
:mod:`sync.download`, :mod:`sync.fetch`, :mod:`sync.checkpoint_policy`) when it
builds them. It uploads and downloads no pack itself, and keeps no per-device or
per-page progress.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from ledgerd.store import LOCAL_LEDGER, Page, Repository, TooManyOpenPagesError
from ledgerd.sync import crypto, layout, pack
from ledgerd.sync.errors import (
    AlreadyExistsError,
    BucketIdentityChangedError,
    BucketIdentityError,
    BucketIdentityMissingError,
    BucketMarkerMissingError,
    CloudError,
    NoBucketError,
)
from ledgerd.sync.metered import Metered

log = logging.getLogger(__name__)

Key = tuple[bytes, bytes]

LOCAL = LOCAL_LEDGER.encode()
"""The ledger that is never uploaded, nor written from the bucket (its pages
stay on this device: see docs/documents.md)."""
SEEN = "sync/bucket-seen"
"""Repository meta, per cloud URL: this device checked the bucket (older ledgerd
remembered only that)."""
IDENTITY = "sync/bucket-identity"
"""Repository meta, per cloud URL: the bucket's :class:`Identity` as this device
last checked it."""
RELIST_KEYS = 60.0
"""Seconds for which a listing of the bucket's key objects that did not register a
key id answers for it: packs sealed under a foreign key cost at most one LIST a
minute each, however many they are."""
DATA = {"packs/": "packs", "checkpoints/": "checkpoints"}
"""Where a bucket's data lies (listing prefix: what it holds there)."""
PAGE_WAIT = 10.0
"""Seconds a sync step waits for room to open its page when every one of the
repository's ``max_open_pages`` is busy (requests, sessions, watchers hold them),
rather than fail at once; once a wait runs out, the steps of the next PAGE_WAIT
seconds do not wait (each fails at once and is retried by a later round), so that a
round with every page held elsewhere ends instead of waiting page after page."""


@dataclass(frozen=True)
class Identity:
    """What a device remembers of a bucket it synced with: the layout versions of
    the markers it saw, whether the bucket is encrypted, and the fingerprint of its
    encryption descriptor (:attr:`sync.crypto.Descriptor.fingerprint`; never a key
    or the bucket secret). None: not known (a device of an older ledgerd remembered
    only that it had seen the bucket)."""

    markers: frozenset[int]
    encrypted: bool | None
    descriptor: str | None

    def encode(self) -> bytes:
        doc = {
            "markers": sorted(self.markers),
            "encrypted": self.encrypted,
            "descriptor": self.descriptor,
        }
        return json.dumps(doc, sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes) -> Identity:
        doc = json.loads(raw)
        markers = doc["markers"]
        encrypted, descriptor = doc["encrypted"], doc["descriptor"]
        if not (
            isinstance(markers, list)
            and all(isinstance(v, int) for v in markers)
            and isinstance(encrypted, bool | None)
            and isinstance(descriptor, str | None)
        ):
            raise ValueError("malformed")
        return cls(frozenset(markers), encrypted, descriptor)


@dataclass(frozen=True)
class Holdings:
    """What a bucket without (some of) its identity objects holds: ``what`` it holds
    (in words, empty for nothing), and whether any of it is ``sealed`` (encrypted)."""

    what: list[str]
    sealed: bool
    sniffed: bool = False
    """Whether ``sealed`` was looked at (the first bytes of a pack)."""

    def __str__(self) -> str:
        return " and ".join(self.what)


class SyncContext:
    """The bucket and the repository as every sync job sees them.

    ``wants(ledger, page)``, if given, says which pages this device holds; ``clock``
    is the wall clock (tests skew it) and ``monotonic`` the monotonic one (the
    simulation runs it with its own time); ``location`` names the bucket in
    repository meta (the cloud URL).
    """

    def __init__(
        self,
        store: Metered,
        *,
        location: str,
        keys: crypto.KeyRing | None,
        clock: Callable[[], float],
        wants: Callable[[bytes, bytes], bool] | None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.location = location
        self.keys = keys
        self.clock = clock
        self.monotonic = monotonic
        self.wants = wants
        self.codec: crypto.Codec | None = None
        """The bucket's codec once its marker was checked, if the bucket is encrypted."""
        self._bucket_ok = False
        self.checks_asked = 0
        """How many times :attr:`bucket_ok` was set False (a check under way then does
        not answer for a check asked for after it began)."""
        self._checking = asyncio.Lock()
        """Held by the check of the bucket under way: callers that find the bucket
        unchecked meanwhile (reads before a start's first round) wait for it."""
        self.bucket_error: str | None = None
        self.bucket_error_code: str | None = None
        """A stable code for the bucket error (``encryption_key_mismatch``...), if it has one."""
        self.restoring: dict[Key, Page] = {}  # evicted pages being brought back
        self._repo: Repository | None = None
        self._no_wait_until = 0.0
        """Monotonic time before which a page's open does not wait for room (see
        :data:`PAGE_WAIT`)."""
        self._data_seen: Holdings | None = None
        """What the bucket was found to hold, once it held something (see
        :meth:`_holdings`)."""
        self._foreign: dict[bytes, float] = {}
        """Key ids the bucket had not registered at the last listing of its key objects,
        and the monotonic time until which that listing answers for them."""

    def attach(self, repo: Repository) -> None:
        self._repo = repo

    @property
    def repo(self) -> Repository:
        if self._repo is None:
            raise RuntimeError("the sync engine has not started")
        return self._repo

    @property
    def device(self) -> str:
        """This device as it is named in the bucket: its id in hex, or in an encrypted
        bucket a keyed hash of it."""
        return self.device_name(self.repo.device_id)

    def device_name(self, device_id: bytes) -> str:
        return device_id.hex() if self.codec is None else self.codec.device_tag(device_id)

    def seal(self, ident: str) -> tuple[crypto.Codec, str] | None:
        return None if self.codec is None else (self.codec, ident)

    @property
    def bucket_ok(self) -> bool:
        """The marker was checked (set False to check it again on the next round)."""
        return self._bucket_ok

    @bucket_ok.setter
    def bucket_ok(self, ok: bool) -> None:
        if not ok:
            self.checks_asked += 1
        self._bucket_ok = ok

    async def check_bucket(self) -> None:
        """The bucket carries its identity objects (its marker, and its encryption
        descriptor if encrypted), those this device remembers; the first daemon to use
        an empty bucket writes them. One check runs at a time; a caller that comes while one
        runs takes its outcome (reads at a start each need the codec: a descriptor read
        and a key derivation each, a passphrase's scrypt of 128 MiB, otherwise)."""
        if self.bucket_ok:
            return
        async with self._checking:
            if not self.bucket_ok:  # (checked by the one this waited for)
                await self._check_bucket()

    async def _check_bucket(self) -> None:
        asked = self.checks_asked
        try:
            known = await self._remembered()
            names, versions = await self._markers()
            encrypted: bool | None = None  # what the marker says, when it is read
            held: Holdings | None = None  # what the bucket holds, when that was looked at
            if not versions:
                names, versions, encrypted, held = await self._new_bucket(known, names)
            _markers_kept(known, versions)
            top = max(versions, default=layout.BUCKET_FORMAT)
            layout.check_version(top)
            desc = await self._open(known, names, top, encrypted, held)
        except (BucketIdentityError, NoBucketError) as e:
            if self.bucket_error != str(e):
                log.error("cloud sync stopped: %s", e)
            self.bucket_error = str(e)
            self.bucket_error_code = getattr(e, "code", None)
            raise
        await self._remember(
            known,
            Identity(frozenset(versions), desc is not None, desc.fingerprint if desc else None),
        )
        self.bucket_error = self.bucket_error_code = None
        # Not if a check was asked for meanwhile (a key rotation: the key file read
        # again): the next caller checks again, with what it knows now.
        self._bucket_ok = asked == self.checks_asked

    async def _new_bucket(
        self, known: Identity | None, names: list[str]
    ) -> tuple[list[str], list[int], bool | None, Holdings]:
        """A bucket without a marker: made, if this device never synced with it and it
        holds no ledgerd data. Its names and markers' versions then, whether its marker
        (if this device wrote it) says it is encrypted, and what it holds."""
        if known is not None:
            raise BucketMarkerMissingError(
                f"the bucket has no {layout.MARKER} marker although this device "
                "synced with it before: it was moved, unmounted or emptied, or its "
                "marker was deleted. ledgerd does not start a new bucket in its "
                "place; bring it back (or restore its marker from a backup or "
                "another copy of the bucket), or use another cloud URL for a new bucket"
            )
        await self.store.create_bucket()
        held = await self._holdings(names)
        if held.what:
            raise BucketIdentityMissingError(
                f"the bucket holds ledgerd data ({held}) but no {layout.MARKER} "
                "marker: it was deleted, or the bucket copied without it. ledgerd "
                "does not start a new bucket over existing data; restore the "
                f"{layout.MARKER}.* marker from a backup or another copy of the "
                "bucket, or use a new cloud URL for a new bucket"
            )
        # The marker first, written only if absent: the device whose marker
        # lands decides whether the bucket is encrypted.
        if await self._mark(self.keys is not None):
            names.append(layout.marker_name())
            return names, [layout.BUCKET_FORMAT], self.keys is not None, held
        names, versions = await self._markers()  # another device made it: read what it wrote
        return names, versions, None, held

    async def _open(
        self,
        known: Identity | None,
        names: list[str],
        top: int,
        encrypted: bool | None,
        held: Holdings | None,
    ) -> crypto.Descriptor | None:
        """Set the bucket's codec (its descriptor read, or written for a new encrypted
        bucket); the descriptor, None if the bucket is plain."""
        remembered = known.encrypted if known is not None else None
        has_desc = crypto.DESCRIPTOR in names
        # Without a descriptor, the marker says whether the bucket is encrypted (its
        # descriptor may be on its way). Read once: a bucket this device remembers
        # was plain or encrypted already, and a marker never changes. (Older markers
        # do not say.)
        current = top == layout.BUCKET_FORMAT
        if encrypted is None and remembered is None and not has_desc and current:
            encrypted = layout.marker_encrypted(await self.store.get(layout.marker_name()))
            if encrypted is None:
                log.warning(
                    "the bucket's marker does not say whether the bucket is encrypted "
                    "(an older ledgerd wrote it, or it is damaged): taken as written "
                    "by a device without a key, since no encryption descriptor is there"
                )
        desc = None
        if has_desc:
            desc = crypto.parse_descriptor(await self.store.get(crypto.DESCRIPTOR))
        _same_identity(known, desc)
        if desc is None:
            await self._without_descriptor(names, encrypted, remembered, held)
            if encrypted and self.keys is not None:  # a new bucket: its first device
                desc = await crypto.create_descriptor(self.store, self.keys)
        self.codec = await crypto.open_bucket(self.store, names, self.keys, desc, bool(encrypted))
        return desc

    async def _without_descriptor(
        self,
        names: list[str],
        encrypted: bool | None,
        remembered: bool | None,
        held: Holdings | None,
    ) -> Holdings | None:
        """A bucket without an encryption descriptor is plain, or a new encrypted one
        (its marker says so) that holds nothing yet: its first keyed device writes the
        descriptor. BucketIdentityMissingError if it was encrypted, and its descriptor
        is gone: key objects, sealed packs, or data besides a marker saying encrypted.
        Returns what it looked at of the bucket's holdings, if it did."""
        registered = [n for n in names if crypto.key_object_id(n) is not None]
        why = ""
        if registered:
            why = f"it registered encryption keys ({registered[0]})"
        elif encrypted:
            if held is None:
                held = await self._holdings(names)
            if held.what:
                why = f"its marker says it is encrypted, and it holds {held}"
        elif encrypted is None and remembered is None:  # a marker that does not say
            held = await self._holdings(names, sniff=True)
            if held.sealed:
                why = f"it holds encrypted {held}"
        if why:
            raise BucketIdentityMissingError(
                f"the bucket's encryption descriptor {crypto.DESCRIPTOR} is missing, yet "
                f"{why}. ledgerd does not start a new encryption identity over existing "
                "data (the devices would no longer read each other's packs): restore "
                f"{crypto.DESCRIPTOR} from a backup or another copy of the bucket, or use a "
                "new cloud URL for a new bucket"
            )
        return held

    async def _holdings(self, names: list[str], sniff: bool = False) -> Holdings:
        """What the bucket holds besides its marker: one LIST per kind of data, and
        with ``sniff``, the first bytes of its first pack or checkpoint (sealed?). Data
        once found is taken as still there (a bucket refused for it is checked again
        every round, and a listing may take many requests), until the next start."""
        held = self._data_seen
        if held is None or (sniff and not held.sniffed):
            what: list[str] = []
            sealed = False
            for prefix, kind in DATA.items():
                first = await self._first(prefix)
                if first is None:
                    continue
                what.append(kind)
                if sniff and not sealed and prefix != "log/":
                    with contextlib.suppress(CloudError):
                        head = await self.store.get(first, 0, len(pack.MAGICE))
                        sealed = head == pack.MAGICE
            held = Holdings(what, sealed, sniff)
            if what:
                self._data_seen = held
        if any(crypto.key_object_id(n) is not None for n in names):
            return Holdings([*held.what, "encryption key objects"], True, held.sniffed)
        return held

    async def _first(self, prefix: str) -> str | None:
        names = self.store.list(prefix)
        try:
            async for name in names:
                return name
            return None
        finally:
            close = getattr(names, "aclose", None)
            if close is not None:
                await close()

    async def _remembered(self) -> Identity | None:
        """The bucket's identity as this device last checked it; None if it never did."""
        raw = await self.repo.get_meta(f"{IDENTITY}/{self.location}")
        if raw is not None:
            try:
                return Identity.decode(raw)
            except (ValueError, KeyError, TypeError):
                log.warning("the remembered identity of the bucket is unreadable; read again")
        if await self.repo.get_meta(f"{SEEN}/{self.location}") is not None:
            return Identity(frozenset(), None, None)  # seen, by an older ledgerd
        return None

    async def _remember(self, known: Identity | None, now: Identity) -> None:
        if now != known:
            await self.repo.set_meta(f"{IDENTITY}/{self.location}", now.encode())
        if known is None:  # (what an older ledgerd of this repository reads)
            await self.repo.set_meta(f"{SEEN}/{self.location}", b"1")

    async def keys_registered_since(self) -> bool:
        """Whether a key id that the codec met, and that the bucket had not registered
        when it was checked, is registered now (another device's new write key): then
        a part sealed under it is this device's missing key, not a foreign one. Reads
        the bucket's key objects (one LIST) only after such a meeting, at most once per
        :data:`RELIST_KEYS` for the same key id."""
        codec = self.codec
        met = codec.take_unregistered() if codec is not None else set()
        now = time.monotonic()
        if codec is None or all(now < self._foreign.get(k, now - 1) for k in met):
            return False
        kids = {
            kid
            async for n in self.store.list(crypto.KEY_OBJECT)
            if (kid := crypto.key_object_id(n)) is not None
        }
        codec.register(kids)
        for k in met - kids:
            self._foreign[k] = now + RELIST_KEYS
        return bool(met & kids)

    async def _markers(self) -> tuple[list[str], list[int]]:
        """The names under the marker's prefix, and the layout versions the markers
        among them carry."""
        names = [n async for n in self.store.list(layout.MARKER + ".")]
        return names, [v for n in names if (v := layout.marker_version(n)) is not None]

    async def _mark(self, encrypted: bool) -> bool:
        """Write this layout's marker unless it is there; whether this call wrote it.
        An encrypted bucket's marker names no device: a device's name there is keyed
        by the bucket secret, which a new bucket does not have yet."""
        device = self.device if self.codec is not None or not encrypted else None
        data = layout.marker(device, time.time(), encrypted)
        try:
            await self.store.put(layout.marker_name(), data)
        except AlreadyExistsError:
            return False
        return True

    @contextlib.asynccontextmanager
    async def using(self, key: Key) -> AsyncIterator[Page]:
        """The page, leased (not closed as idle) for one sync step. A page that was
        not open before is closed again after it, unless someone else opened it
        meanwhile or something is under way in it. With every open page busy, it waits
        for one to be released (:data:`PAGE_WAIT`) rather than fail the step."""
        restoring = self.restoring.get(key)
        if restoring is not None:  # being restored: the page handed to restore_page
            yield restoring
            return
        wait = PAGE_WAIT if time.monotonic() >= self._no_wait_until else 0.0
        async with contextlib.AsyncExitStack() as stack:
            try:
                page = await stack.enter_async_context(
                    self.repo.page(*key, transient=True, wait=wait)
                )
            except TooManyOpenPagesError:
                if wait:
                    self._no_wait_until = time.monotonic() + PAGE_WAIT
                raise
            yield page

    def wanted_here(self, key: Key) -> bool:
        """Wanted, and stored here now: an evicted page gets what it missed when it is
        restored (see :meth:`sync.engine.SyncEngine.restore_page`)."""
        return self.wanted(key) and (key in self.restoring or not self.repo.is_evicted(*key))

    def wanted(self, key: Key) -> bool:
        # Another device's pack never writes into this device's _local ledger.
        return key[0] != LOCAL and (self.wants is None or self.wants(*key))


def _markers_kept(known: Identity | None, versions: list[int]) -> None:
    """BucketMarkerMissingError if the bucket lost a marker it had when this device
    last synced with it."""
    lost = sorted(known.markers - set(versions)) if known is not None else []
    if lost:
        raise BucketMarkerMissingError(
            f"the bucket has lost its {layout.marker_name(lost[0])} marker, which "
            "it had when this device last synced with it: ledgerd does not take "
            "it for another bucket. Restore the marker from a backup or another "
            "copy of the bucket, or use another cloud URL for a new bucket"
        )


def _same_identity(known: Identity | None, desc: crypto.Descriptor | None) -> None:
    """BucketIdentityMissingError or BucketIdentityChangedError unless the bucket's
    descriptor (None: it has none) is what this device remembers of it."""
    if known is None:
        return
    if known.encrypted and desc is None:
        raise BucketIdentityMissingError(
            f"the bucket's encryption descriptor {crypto.DESCRIPTOR} is missing, though "
            "the bucket was encrypted when this device last synced with it. ledgerd does "
            "not start a new encryption identity in its place (the devices would no longer "
            "read each other's packs), and nothing was read from or written to the bucket: "
            f"restore {crypto.DESCRIPTOR} from a backup or another copy of the bucket, or "
            "use a new cloud URL for a new bucket"
        )
    if known.encrypted is False and desc is not None:
        raise BucketIdentityChangedError(
            f"the bucket holds an encryption descriptor ({crypto.DESCRIPTOR}), though it was "
            "not encrypted when this device last synced with it: it was replaced or "
            "tampered with. Nothing was read from or written to it; restore the bucket as "
            "it was, or use a new cloud URL for a new bucket"
        )
    if known.descriptor is not None and desc is not None and desc.fingerprint != known.descriptor:
        raise BucketIdentityChangedError(
            f"the bucket's encryption descriptor {crypto.DESCRIPTOR} is not the one this "
            f"device synced with (fingerprint {desc.fingerprint[:16]}, was "
            f"{known.descriptor[:16]}): it was replaced, and the devices would no longer read "
            "each other's packs. Nothing was read from or written to the bucket; put the "
            f"original {crypto.DESCRIPTOR} back (from a backup or another copy of the "
            "bucket), or use a new cloud URL for a new bucket"
        )
