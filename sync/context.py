"""What every sync job reaches: the bucket, the repository, and the pages this device holds.

This module owns :class:`SyncContext`: the bucket's store and its identity check
(the marker, see :mod:`sync.engine`), the codec that check yields, the repository
once the engine started, a page leased for one sync step (or the page being
restored), and which pages this device holds. The engine builds it and gives it to
each of its jobs (:mod:`sync.feed`, :mod:`sync.upload`, :mod:`sync.download`,
:mod:`sync.fetch`, :mod:`sync.checkpoint_policy`) when it builds them. It lists,
uploads and downloads nothing itself, and keeps no per-device or per-page progress.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable

from ledgerd.store import LOCAL_LEDGER, Page, Repository, TooManyOpenPagesError
from ledgerd.sync import crypto, layout
from ledgerd.sync.cloud import Metered
from ledgerd.sync.errors import (
    AlreadyExistsError,
    BucketIdentityError,
    BucketMarkerMissingError,
    NoBucketError,
)

log = logging.getLogger(__name__)

Key = tuple[bytes, bytes]

LOCAL = LOCAL_LEDGER.encode()
"""The ledger that is never uploaded, nor written from the bucket (its pages
stay on this device: see the README's Documents section)."""
PAGE_WAIT = 10.0
"""Seconds a sync step waits for room to open its page when every one of the
repository's ``max_open_pages`` is busy (requests, sessions, watchers hold them),
rather than fail at once; once a wait runs out, the steps of the next PAGE_WAIT
seconds do not wait (each fails at once and is retried by a later round), so that a
round with every page held elsewhere ends instead of waiting page after page."""


class SyncContext:
    """The bucket and the repository as every sync job sees them.

    ``wants(ledger, page)``, if given, says which pages this device holds; ``clock``
    is the wall clock (tests skew it); ``location`` names the bucket in repository
    meta (the cloud URL).
    """

    def __init__(
        self,
        store: Metered,
        *,
        location: str,
        keys: crypto.KeyRing | None,
        clock: Callable[[], float],
        wants: Callable[[bytes, bytes], bool] | None,
    ) -> None:
        self.store = store
        self.location = location
        self.keys = keys
        self.clock = clock
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
        """The bucket carries its marker; the first daemon to use it writes it. One
        check runs at a time; a caller that comes while one runs takes its outcome
        (reads at a start each need the codec: a descriptor read and a key derivation
        each, a passphrase's scrypt of 128 MiB, otherwise)."""
        if self.bucket_ok:
            return
        async with self._checking:
            if not self.bucket_ok:  # (checked by the one this waited for)
                await self._check_bucket()

    async def _check_bucket(self) -> None:
        asked = self.checks_asked
        seen_key = f"sync/bucket-seen/{self.location}"
        try:
            names, versions = await self._markers()
            seen = await self.repo.get_meta(seen_key) is not None
            encrypted: bool | None = None  # what the marker says, when it is read
            if not versions:
                if seen:
                    raise BucketMarkerMissingError(
                        f"the bucket has no {layout.MARKER} marker although this device "
                        "synced with it before: it was moved, unmounted or emptied. ledgerd "
                        "does not start a new bucket in its place; bring it back, or use "
                        "another cloud URL for a new bucket"
                    )
                await self.store.create_bucket()
                # The marker first, written only if absent: the device whose marker
                # lands decides whether the bucket is encrypted (see open_bucket).
                if await self._mark(self.keys is not None):
                    names.append(layout.marker_name())
                    versions, encrypted = [layout.BUCKET_FORMAT], self.keys is not None
                else:  # another device made the bucket meanwhile: read what it wrote
                    names, versions = await self._markers()
            top = max(versions, default=layout.BUCKET_FORMAT)
            layout.check_version(top)
            # Without a descriptor, the marker says whether the bucket is encrypted (its
            # descriptor may be on its way). Read once: a bucket this device has synced
            # with was plain or encrypted already, and a marker never changes.
            current = top == layout.BUCKET_FORMAT  # (older markers do not say)
            if encrypted is None and current and not seen and crypto.DESCRIPTOR not in names:
                encrypted = layout.marker_encrypted(await self.store.get(layout.marker_name()))
                if encrypted is None:
                    log.warning(
                        "the bucket's marker does not say whether the bucket is encrypted "
                        "(an older ledgerd wrote it, or it is damaged): taken as written "
                        "by a device without a key, since no encryption descriptor is there"
                    )
            self.codec = await crypto.open_bucket(self.store, names, self.keys, encrypted)
        except (BucketIdentityError, NoBucketError) as e:
            if self.bucket_error != str(e):
                log.error("cloud sync stopped: %s", e)
            self.bucket_error = str(e)
            self.bucket_error_code = getattr(e, "code", None)
            raise
        if await self.repo.get_meta(seen_key) is None:
            await self.repo.set_meta(seen_key, b"1")
        self.bucket_error = self.bucket_error_code = None
        # Not if a check was asked for meanwhile (a key rotation: the key file read
        # again): the next caller checks again, with what it knows now.
        self._bucket_ok = asked == self.checks_asked

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
