"""Counting what sync asks of the cloud: requests by kind, bytes, failures.

This module owns :class:`Metered`, a :class:`~sync.cloud.CloudStore` that wraps the
real store (under :class:`~sync.cloud.Retrying`, so that every attempt counts) and
adds to a :class:`CloudCounters`; the daemon's metrics read those counters when
scraped. It changes nothing of what passes through.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from ledgerd.sync.cloud import CloudStore, Forwarding, collect
from ledgerd.sync.errors import TransientCloudError

T = TypeVar("T")


@dataclass
class CloudCounters:
    """Totals since the daemon started (kinds: put, get, list, delete, create_bucket)."""

    requests: dict[str, int] = field(default_factory=dict)
    errors: dict[tuple[str, str], int] = field(default_factory=dict)
    """(kind, error type) -> count."""
    retried: int = 0
    """Transient failures (each is retried until the store's deadline)."""
    seconds: dict[str, float] = field(default_factory=dict)
    bytes_up: int = 0
    bytes_down: int = 0


class Metered(Forwarding):
    def __init__(self, inner: CloudStore, counters: CloudCounters) -> None:
        super().__init__(inner)
        self.counters = counters

    async def _count(self, kind: str, fn: Callable[[], Awaitable[T]]) -> T:
        c = self.counters
        c.requests[kind] = c.requests.get(kind, 0) + 1
        start = time.monotonic()
        try:
            return await fn()
        except Exception as e:
            key = (kind, type(e).__name__)
            c.errors[key] = c.errors.get(key, 0) + 1
            if isinstance(e, TransientCloudError):
                c.retried += 1
            raise
        finally:
            c.seconds[kind] = c.seconds.get(kind, 0.0) + time.monotonic() - start

    async def put(self, name: str, data: bytes) -> None:
        await self._count("put", lambda: self.inner.put(name, data))
        self.counters.bytes_up += len(data)

    async def get(self, name: str, offset: int = 0, length: int | None = None) -> bytes:
        data = await self._count("get", lambda: self.inner.get(name, offset, length))
        self.counters.bytes_down += len(data)
        return data

    async def list(self, prefix: str = "", after: str = "") -> AsyncIterator[str]:
        names = await self._count("list", lambda: collect(self.inner.list(prefix, after)))
        for n in names:
            yield n

    async def delete(self, name: str) -> None:
        await self._count("delete", lambda: self.inner.delete(name))

    async def create_bucket(self) -> None:
        await self._count("create_bucket", self.inner.create_bucket)
