"""What the tests and the benchmarks share: a counting store and moto's S3 server.

This module owns :class:`CountingStore` (a :class:`~sync.metered.Metered` that also
records every GET and the names listed, to prove request and byte budgets) and
:func:`moto_server` with the environment a daemon needs to talk to it. Test doubles
that inject faults, and helpers that plant objects in a bucket, live in the tests
(``tests/sync/doubles.py``).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager

from ledgerd.sync.cloud import CloudStore
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
