"""The one boundary between ledgerd and the cloud: the abstract :class:`CloudStore`.

This module owns the interface every backend implements (S3 in
:mod:`sync.s3`, a local folder in :mod:`sync.folder`, test doubles), object-name
validation (applied going in and coming back from ``list``), :class:`Forwarding`,
the base of every wrapper of a store, and the retry wrapper (the metering one is
:mod:`sync.metered`'s). It knows nothing about pages or packs.

Objects are immutable and written once: ``put`` of a name that exists raises
:class:`AlreadyExistsError` where the backend can tell (the local folder always
can; S3 when it honours ``If-None-Match: *``). Readers never see a partial
object.
"""

from __future__ import annotations

import abc
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    before_sleep_log,
    retry_if_exception_type,
    stop_after_delay,
    wait_random_exponential,
)

from ledgerd.sync.errors import InvalidNameError, TransientCloudError

log = logging.getLogger(__name__)

T = TypeVar("T")
_log_retry = before_sleep_log(log, logging.DEBUG)

NAME_LIMIT = 1024
_SEGMENT = re.compile(r"[A-Za-z0-9._=-]+")


def check_name(name: str) -> str:
    """A valid object name: ``/``-separated segments of ``[A-Za-z0-9._=-]``, no ``.``/``..``."""
    if not isinstance(name, str) or not name or len(name.encode()) > NAME_LIMIT:
        raise InvalidNameError(f"object name must be 1-{NAME_LIMIT} bytes: {name!r}")
    for seg in name.split("/"):
        if seg in ("", ".", "..") or not _SEGMENT.fullmatch(seg):
            raise InvalidNameError(f"invalid object name {name!r}")
    return name


def check_prefix(prefix: str) -> str:
    """A listing prefix: empty, or a valid name optionally ending in ``/``."""
    if prefix:
        check_name(prefix[:-1] if prefix.endswith("/") else prefix)
    return prefix


class CloudStore(abc.ABC):
    """Write-once objects under names; ranged reads; ordered listing; delete."""

    @abc.abstractmethod
    async def put(self, name: str, data: bytes) -> None:
        """Store ``data`` under ``name``, atomically; never overwrites."""

    @abc.abstractmethod
    async def get(self, name: str, offset: int = 0, length: int | None = None) -> bytes:
        """Bytes ``[offset, offset + length)`` of an object (to its end if length is None)."""

    @abc.abstractmethod
    def list(self, prefix: str = "", after: str = "") -> AsyncIterator[str]:
        """Names starting with ``prefix`` and greater than ``after``, in order."""

    @abc.abstractmethod
    async def delete(self, name: str) -> None:
        """Remove an object (no error if it is absent)."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections and threads."""

    async def create_bucket(self) -> None:  # noqa: B027 - optional hook
        """Create the bucket's root where the backend can (a folder); S3 buckets are
        made by their owner. Sync calls this only for a bucket this device never saw."""

    def last_failure(self) -> str | None:
        """The last failure that is still being retried, if any (for error messages)."""
        return None

    def next_try(self) -> float | None:
        """When (monotonic time) the request that failed with :meth:`last_failure` is
        tried again (past while that try runs); None when none is to be."""
        return None

    def is_transient(self, error: BaseException) -> bool:
        return isinstance(error, TransientCloudError)

    async def __aenter__(self) -> CloudStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def filtered_names(names: AsyncIterator[str], where: str) -> AsyncIterator[str]:
    """Names coming back from a listing, validated; invalid ones are skipped and logged."""
    async for n in names:
        try:
            yield check_name(n)
        except InvalidNameError:
            log.warning("ignoring an object with an invalid name in %s: %r", where, n)


class Forwarding(CloudStore):
    """A store in front of another, ``inner``: every call passes through as it is.
    Wrappers (:class:`Retrying`, :class:`~ledgerd.sync.metered.Metered`, test doubles)
    override what they change."""

    def __init__(self, inner: CloudStore) -> None:
        self.inner = inner

    async def put(self, name: str, data: bytes) -> None:
        await self.inner.put(name, data)

    async def get(self, name: str, offset: int = 0, length: int | None = None) -> bytes:
        return await self.inner.get(name, offset, length)

    def list(self, prefix: str = "", after: str = "") -> AsyncIterator[str]:
        return self.inner.list(prefix, after)

    async def delete(self, name: str) -> None:
        await self.inner.delete(name)

    async def close(self) -> None:
        await self.inner.close()

    async def create_bucket(self) -> None:
        await self.inner.create_bucket()

    def last_failure(self) -> str | None:
        return self.inner.last_failure()

    def next_try(self) -> float | None:
        return self.inner.next_try()

    def is_transient(self, error: BaseException) -> bool:
        return self.inner.is_transient(error)


class Retrying(Forwarding):
    """Retries transient failures with exponential backoff and jitter, up to a deadline.

    Permanent failures pass through at once.
    """

    def __init__(
        self, inner: CloudStore, deadline: float = 60.0, first: float = 0.05, most: float = 5.0
    ) -> None:
        super().__init__(inner)
        self.deadline = deadline
        self.first = first
        self.most = most
        self._failure: str | None = None
        self._next_try: float | None = None

    def _retrying(self) -> AsyncRetrying:
        return AsyncRetrying(
            retry=retry_if_exception_type(TransientCloudError),
            wait=wait_random_exponential(multiplier=self.first, max=self.most),
            stop=stop_after_delay(self.deadline),
            before_sleep=self._before_sleep,
            reraise=True,
        )

    def _before_sleep(self, state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        self._failure = f"{type(error).__name__}: {error}" if error is not None else None
        sleep = state.next_action.sleep if state.next_action is not None else 0.0
        self._next_try = time.monotonic() + sleep
        _log_retry(state)

    async def _call(self, fn: Callable[[], Awaitable[T]]) -> T:
        try:
            async for attempt in self._retrying():
                with attempt:
                    result = await fn()
                    self._failure = self._next_try = None
                    return result
        except BaseException:
            self._next_try = None  # given up: nothing is tried again (the failure stays)
            raise
        raise AssertionError("unreachable")  # pragma: no cover

    def last_failure(self) -> str | None:
        return self._failure or self.inner.last_failure()

    def next_try(self) -> float | None:
        return self._next_try if self._failure else self.inner.next_try()

    async def create_bucket(self) -> None:
        await self._call(self.inner.create_bucket)

    async def put(self, name: str, data: bytes) -> None:
        await self._call(lambda: self.inner.put(name, data))

    async def get(self, name: str, offset: int = 0, length: int | None = None) -> bytes:
        return await self._call(lambda: self.inner.get(name, offset, length))

    async def list(self, prefix: str = "", after: str = "") -> AsyncIterator[str]:
        # Collected whole per attempt, so a listing that fails part-way is simply redone.
        for n in await self._call(lambda: collect(self.inner.list(prefix, after))):
            yield n

    async def delete(self, name: str) -> None:
        await self._call(lambda: self.inner.delete(name))


async def collect(names: AsyncIterator[str]) -> list[str]:
    """Every name of a listing (so that a retried or timed listing is one call)."""
    return [n async for n in names]
