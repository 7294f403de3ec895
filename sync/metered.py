"""Counting what sync asks of the cloud: requests by kind, bytes, failures, time.

This module owns :class:`Metered`, a :class:`~sync.cloud.Forwarding` store that adds
every request made through it to a :class:`CloudCounters`, and changes nothing of what
passes through. Where it sits says what a count is: the daemon's metrics count under
:class:`~sync.cloud.Retrying` (every attempt), the engine's round costs over it (a
retried request once).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from ledgerd.sync.cloud import CloudStore, Forwarding
from ledgerd.sync.errors import TransientCloudError

KINDS = ("put", "get", "list", "delete")
"""The requests :meth:`Metered.since` reports (``create_bucket`` is counted too)."""


@dataclass
class CloudCounters:
    """Totals of the requests made through a :class:`Metered` (kinds: put, get, list,
    delete, create_bucket; a listing counts once, however many names it returns)."""

    requests: Counter[str] = field(default_factory=Counter)
    errors: dict[tuple[str, str], int] = field(default_factory=dict)
    """(kind, error type) -> count."""
    retried: int = 0
    """Transient failures (under :class:`~sync.cloud.Retrying`, each one is retried)."""
    seconds: dict[str, float] = field(default_factory=dict)
    """Time in requests by kind (a listing's from its first name asked for to its end)."""
    bytes_up: int = 0
    """The bodies of the puts made (a put that failed may have sent its body)."""
    bytes_down: int = 0


class Metered(Forwarding):
    """Adds every request made through it to ``counters`` (its own when not given)."""

    def __init__(self, inner: CloudStore, counters: CloudCounters | None = None) -> None:
        super().__init__(inner)
        self.counters = CloudCounters() if counters is None else counters

    def snapshot(self) -> Counter[str]:
        """Requests by kind and bytes both ways, now (for :meth:`since`)."""
        c = self.counters
        return Counter({**c.requests, "bytes_up": c.bytes_up, "bytes_down": c.bytes_down})

    def since(self, before: Counter[str]) -> dict[str, int]:
        """What was spent since ``before`` (a :meth:`snapshot`): every kind, zeros too."""
        now = self.snapshot()
        return {k: now[k] - before[k] for k in (*KINDS, "bytes_up", "bytes_down")}

    @contextmanager
    def _request(self, kind: str) -> Iterator[None]:
        c = self.counters
        c.requests[kind] += 1
        start = time.monotonic()
        try:
            yield
        except Exception as e:
            key = (kind, type(e).__name__)
            c.errors[key] = c.errors.get(key, 0) + 1
            if isinstance(e, TransientCloudError):
                c.retried += 1
            raise
        finally:
            c.seconds[kind] = c.seconds.get(kind, 0.0) + time.monotonic() - start

    async def put(self, name: str, data: bytes) -> None:
        self.counters.bytes_up += len(data)
        with self._request("put"):
            await self.inner.put(name, data)

    async def get(self, name: str, offset: int = 0, length: int | None = None) -> bytes:
        with self._request("get"):
            data = await self.inner.get(name, offset, length)
        self.counters.bytes_down += len(data)
        return data

    async def list(self, prefix: str = "", after: str = "") -> AsyncIterator[str]:
        with self._request("list"):
            async for n in self.inner.list(prefix, after):
                yield n

    async def delete(self, name: str) -> None:
        with self._request("delete"):
            await self.inner.delete(name)

    async def create_bucket(self) -> None:
        with self._request("create_bucket"):
            await self.inner.create_bucket()
