"""Test doubles of :class:`~sync.cloud.CloudStore`: counting requests and injecting faults.

They wrap any real store, so the contract holds underneath. ``CountingStore``
proves request budgets (how many PUTs, GETs, LISTs an operation costs);
``FaultyStore`` fails a fraction of calls transiently and can cut uploads short.
"""

from __future__ import annotations

import contextlib
import random
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager

from ledgerd.sync import layout, pack
from ledgerd.sync.cloud import CloudStore, Forwarding
from ledgerd.sync.errors import AlreadyExistsError, TransientCloudError
from ledgerd.sync.layout import PackName
from ledgerd.sync.metered import CloudCounters, Metered


class CountingStore(Metered):
    """:class:`~sync.metered.Metered`, plus every GET (name, offset, bytes), the names
    listed, and :meth:`reset`, for tests that prove request and byte budgets."""

    def __init__(self, inner: CloudStore) -> None:
        super().__init__(inner)
        self.names_listed = 0
        self.gets: list[tuple[str, int, int]] = []  # name, offset, bytes

    @property
    def counts(self) -> Counter[str]:
        """Requests by kind."""
        return self.counters.requests

    @property
    def bytes_put(self) -> int:
        return self.counters.bytes_up

    @property
    def bytes_got(self) -> int:
        return self.counters.bytes_down

    def reset(self) -> None:
        self.counters = CloudCounters()
        self.gets.clear()
        self.names_listed = 0

    async def get(self, name: str, offset: int = 0, length: int | None = None) -> bytes:
        data = await super().get(name, offset, length)
        self.gets.append((name, offset, len(data)))
        return data

    async def list(self, prefix: str = "", after: str = "") -> AsyncIterator[str]:
        async for n in super().list(prefix, after):
            self.names_listed += 1
            yield n


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


AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_CONFIG_FILE": "/dev/null",
    "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
}
"""The environment a daemon talks to :func:`moto_server` with (no real credentials)."""


@contextmanager
def moto_server(timeout: float = 30.0) -> Iterator[str]:
    """moto's S3 HTTP server as a child process on a free loopback port; yields its URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + timeout
        while True:  # wait until it accepts connections
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("moto server did not start") from None
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(30)


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
