"""Test doubles of the cloud, and objects planted in a bucket as a device writes them.

:class:`FaultyStore` fails a fraction of calls transiently and can cut uploads short;
:func:`put_pack` and :func:`mark_plain` plant packs and a marker. What the benchmarks
share with the tests (the counting store, moto's server) is ``ledgerd.sync.testing``'s.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import AsyncIterator

from ledgerd.sync import layout, pack
from ledgerd.sync.cloud import CloudStore, Forwarding
from ledgerd.sync.errors import AlreadyExistsError, TransientCloudError
from ledgerd.sync.layout import PackName


class FaultyStore(Forwarding):
    """Fails ``rate`` of calls with a transient error, before or after doing them.

    A put that "fails after" was stored: the caller sees an error for an upload
    that happened, as after a connection reset on the response.
    """

    def __init__(self, inner: CloudStore, rate: float = 0.3, seed: int = 0) -> None:
        super().__init__(inner)
        self.rate = rate
        self.rng = random.Random(seed)
        self.failures = 0
        self.cut_short = 0

    def _fail(self) -> bool:
        if self.rng.random() < self.rate:
            self.failures += 1
            return True
        return False

    async def put(self, name: str, data: bytes) -> None:
        if self._fail():
            # The upload is cut short: the connection drops while the body is sent.
            # Stores publish objects atomically, so nothing is stored.
            self.cut_short += 1
            raise TransientCloudError(f"injected: upload of {name} cut short")
        await self.inner.put(name, data)
        if self._fail():
            raise TransientCloudError(f"injected failure after put {name} (it was stored)")

    async def get(self, name: str, offset: int = 0, length: int | None = None) -> bytes:
        if self._fail():
            raise TransientCloudError(f"injected failure on get {name}")
        return await self.inner.get(name, offset, length)

    async def list(self, prefix: str = "", after: str = "") -> AsyncIterator[str]:
        if self._fail():
            raise TransientCloudError(f"injected failure on list {prefix}")
        async for n in self.inner.list(prefix, after):
            yield n

    async def delete(self, name: str) -> None:
        if self._fail():
            raise TransientCloudError(f"injected failure on delete {name}")
        await self.inner.delete(name)


async def put_pack(
    store: CloudStore, device: bytes, seq: int, sections: list[pack.Section], time_ms: int = 1
) -> str:
    """Write a pack as ``device`` would (for tests that plant packs); returns its name.
    A device writes only into a marked bucket: a plain bucket's marker goes first, if
    the bucket has none (see :func:`mark_plain`)."""
    await mark_plain(store)
    data, head_end, eager_end = pack.encode(device, seq, time_ms, sections)
    name = PackName.make(time_ms, device.hex(), seq, head_end, eager_end).name
    await store.put(name, data)
    return name


async def mark_plain(store: CloudStore) -> None:
    """Give a bucket without a marker a plain bucket's (for tests that plant objects:
    a device refuses a bucket that holds data and no marker)."""
    async for _ in store.list(layout.MARKER + "."):
        return
    with contextlib.suppress(AlreadyExistsError):
        await store.put(layout.marker_name(), layout.marker(None, time.time(), False))
