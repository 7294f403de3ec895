"""Connections that send no request, or stop sending one, are closed in time."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import socket as sockets
from collections.abc import Iterator
from pathlib import Path

import pytest

from ledgerd.store import Repository
from tests.daemon.conftest import Daemon, start_daemon

P = "/v1/ledgers/l/pages/p"
TIMEOUTS = {"LEDGERD_REQUEST_TIMEOUT": "0.5", "LEDGERD_KEEPALIVE_TIMEOUT": "1"}


@pytest.fixture
def impatient(short_tmp: Path) -> Iterator[Daemon]:
    d = start_daemon(short_tmp, env=TIMEOUTS)
    try:
        yield d
    finally:
        assert d.stop() == 0, d.log_text()


def _fds(d: Daemon) -> int:
    return len(os.listdir(f"/proc/{d.proc.pid}/fd"))


async def _closed_by_daemon(reader: asyncio.StreamReader, within: float = 20) -> bytes:
    """Everything the daemon sends until it closes the connection (bounded wait); a
    connection it reset counts as closed too."""
    got = b""
    try:
        while chunk := await asyncio.wait_for(reader.read(65536), within):
            got += chunk
    except (ConnectionError, OSError) as e:
        if isinstance(e, TimeoutError):
            raise
    return got


async def test_silent_and_half_sent_connections_are_closed(impatient: Daemon) -> None:
    before = _fds(impatient)
    conns = [await asyncio.open_unix_connection(str(impatient.socket)) for _ in range(200)]
    try:
        for i, (_, w) in enumerate(conns):
            if i % 2:  # half of them start a request and never finish its headers
                w.write(b"GET /v1/status HTTP/1.1\r\nHost: x\r\n")
                # On a loaded machine the daemon may have closed this one already
                # (request_timeout is 0.5 s here): that is what is tested.
                with contextlib.suppress(ConnectionError, OSError):
                    await w.drain()
        for r, _ in conns:
            assert await _closed_by_daemon(r) == b""
    finally:
        for _, w in conns:
            w.close()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20
    while _fds(impatient) > before + 5:  # the daemon let go of them (bounded wait)
        assert loop.time() < deadline, _fds(impatient)
        await asyncio.sleep(0.05)


async def test_an_idle_keep_alive_connection_is_closed(impatient: Daemon) -> None:
    reader, writer = await asyncio.open_unix_connection(str(impatient.socket))
    for _ in range(3):  # requests in a row keep it open
        writer.write(b"GET /v1/status HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert head.startswith(b"HTTP/1.1 200")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
    assert await _closed_by_daemon(reader) == b""  # then idle: closed after keepalive_timeout
    writer.close()


async def test_a_stalled_body_is_408_and_stores_nothing(impatient: Daemon) -> None:
    stalls = [(P + "/keys/small", 100), (P + "/keys/big", 10_000_000), (P + "/batch", 100)]
    for path, length in stalls:
        reader, writer = await asyncio.open_unix_connection(str(impatient.socket))
        method = "POST" if path.endswith("batch") else "PUT"
        writer.write(
            f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n".encode()
            + b"x" * 300_000 * (length > 100)
            + b"{" * (length == 100)
        )
        await writer.drain()
        got = await _closed_by_daemon(reader)
        assert got.startswith(b"HTTP/1.1 408"), got[:300]
        assert b'"request_timeout"' in got
        writer.close()
    assert impatient.stop() == 0
    async with await Repository.open(impatient.data) as repo:
        if repo.page_exists(b"l", b"p"):
            page = await repo.ledger(b"l").page(b"p")
            assert not await page.contains(b"small") and not await page.contains(b"big")


async def _wait_for_log(daemon: Daemon, text: str, count: int, timeout: float = 20) -> None:
    """Wait until the daemon's log holds ``text`` ``count`` times (written as it happens)."""
    async with asyncio.timeout(timeout):
        while daemon.log.read_text(errors="replace").count(text) < count:
            await asyncio.sleep(0.05)


async def test_a_whole_answer_nobody_reads_is_cut_off_after_request_timeout(
    impatient: Daemon,
) -> None:
    """Only streamed responses (values, attachments, feeds) were bounded in time: an
    answer made whole before it is sent (an entries or documents listing, up to
    ``max_listing_bytes``, 16 MiB) sat in the connection's buffer for as long as a
    client that read none of it kept the connection, so ``max_connections`` such
    clients held 32 GiB. Such a connection is now cut after ``request_timeout`` too."""
    value = base64.b64encode(b"v" * 900_000).decode()
    ops = [
        {"op": "put", "key": base64.b64encode(b"k%d" % i).decode(), "value": value}
        for i in range(6)
    ]
    body = json.dumps({"ops": ops}).encode()
    docs = "/v1/ledgers/l/pages/d/docs/c"
    doc = json.dumps({"text": "d" * 900_000}).encode()
    writes = [("POST", P + "/batch", body)] + [("POST", docs, doc)] * 6
    for method, path, data in writes:
        reader, writer = await asyncio.open_unix_connection(str(impatient.socket))
        writer.write(
            f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(data)}\r\n"
            "Connection: close\r\n\r\n".encode()
            + data
        )
        got = await _closed_by_daemon(reader)
        assert got.startswith((b"HTTP/1.1 200", b"HTTP/1.1 201")), got[:300]
        writer.close()
    for cut, path in enumerate((P + "/entries", docs), 1):
        sock = sockets.socket(sockets.AF_UNIX, sockets.SOCK_STREAM)
        sock.setsockopt(sockets.SOL_SOCKET, sockets.SO_RCVBUF, 4096)
        sock.connect(str(impatient.socket))
        reader, writer = await asyncio.open_unix_connection(sock=sock)
        writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        await writer.drain()
        # It reads nothing: the daemon gives up on it (its whole answer is ~5 MB).
        await _wait_for_log(impatient, "read none of its answer", cut)
        got = await _closed_by_daemon(reader)
        head, _, rest = got.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head[:300]
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        assert len(rest) < length  # cut short: the rest was dropped, not kept
        writer.close()
    reader, writer = await asyncio.open_unix_connection(str(impatient.socket))
    writer.write(b"GET /v1/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert (await _closed_by_daemon(reader)).startswith(b"HTTP/1.1 200")  # others are served
    writer.close()
