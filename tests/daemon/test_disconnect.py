"""A daemon that goes away mid-request, and errors the daemon explains: what the clients
and ``ledgerctl`` make of them. A small fake server on a Unix socket plays the daemon."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from ledgerd.daemon.client import AsyncClient, Client, DaemonUnavailableError
from tests.daemon.conftest import ROOT, start_daemon

Reply = Callable[[asyncio.StreamWriter], Awaitable[None]]


async def hang_up(writer: asyncio.StreamWriter) -> None:
    """Close the connection once the request arrived, before any answer."""


async def short_body(writer: asyncio.StreamWriter) -> None:
    """Promise 100,000 bytes, send 10, close."""
    writer.write(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100000\r\n\r\n" + b'{"version"'
    )
    await writer.drain()


def error_reply(status: int, code: str, message: str) -> Reply:
    async def reply(writer: asyncio.StreamWriter) -> None:
        body = json.dumps({"error": {"code": code, "message": message}}).encode()
        writer.write(
            f"HTTP/1.1 {status} Error\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        await writer.drain()

    return reply


@contextlib.asynccontextmanager
async def fake_daemon(path: Path, reply: Reply) -> AsyncIterator[Path]:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")  # the request's head
            await reply(writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_unix_server(serve, path=str(path))
    try:
        yield path
    finally:
        server.close()
        await server.wait_closed()


async def ledgerctl(socket: Path, *args: str) -> tuple[int, bytes, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "ledgerd.daemon.cli",
        "--socket",
        str(socket),
        *args,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={k: v for k, v in os.environ.items() if not k.startswith("LEDGERD_")},
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out, err.decode()


@pytest.mark.parametrize("reply", [hang_up, short_body])
async def test_a_daemon_gone_mid_request_is_unavailable(short_tmp: Path, reply: Reply) -> None:
    async with fake_daemon(short_tmp / "s.sock", reply) as sock:
        async with AsyncClient(sock) as c:
            with pytest.raises(DaemonUnavailableError, match="cannot reach ledgerd"):
                await c.status()
            with pytest.raises(DaemonUnavailableError):
                await c.get("l", "p", b"k")
            with pytest.raises(DaemonUnavailableError):
                [i async for i in c.entries("l", "p")]

        def blocking() -> None:
            with Client(sock) as bc, pytest.raises(DaemonUnavailableError):
                bc.status()

        await asyncio.to_thread(blocking)
        for args in (["status"], ["get", "l", "p", "k"], ["ls", "l", "p"]):
            code, out, err = await ledgerctl(sock, *args)
            assert code == 3, (args, err)
            assert err.startswith("ledgerctl: cannot reach ledgerd at ") and err.count("\n") == 1
            assert "Traceback" not in err


async def never_answer(writer: asyncio.StreamWriter) -> None:
    """Keep the connection open and say nothing (a daemon that is stopped or stuck)."""
    await asyncio.sleep(60)


async def test_a_daemon_that_does_not_answer_within_the_timeout_is_unavailable(
    short_tmp: Path,
) -> None:
    """The clients' ``timeout`` ends a request with DaemonUnavailableError (code
    ``unavailable``, the socket named), not a bare TimeoutError with no message."""
    async with fake_daemon(short_tmp / "s.sock", never_answer) as sock:
        async with AsyncClient(sock, timeout=0.3) as c:
            with pytest.raises(DaemonUnavailableError, match="cannot reach ledgerd at .*timeout"):
                await c.status()
            with pytest.raises(DaemonUnavailableError):
                await c.get("l", "p", b"k")
            with pytest.raises(DaemonUnavailableError):
                await c.documents("l", "p").get("c", "01ARZ3NDEKTSV4RRFFQ69G5FAV")

        def blocking() -> None:
            with Client(sock, timeout=0.3) as bc, pytest.raises(DaemonUnavailableError):
                bc.status()

        await asyncio.to_thread(blocking)


async def test_ledgerctl_sync_prints_the_daemons_reason(short_tmp: Path) -> None:
    reason = "sync did not finish within 10s: the bucket is unreachable: Connection refused"
    async with fake_daemon(short_tmp / "s.sock", error_reply(503, "unavailable", reason)) as sock:
        code, out, err = await ledgerctl(sock, "sync", "--timeout", "10")
    assert (code, out) == (4, b"")
    assert err == f"ledgerctl: {reason} (unavailable)\n"


async def test_a_session_request_in_flight_when_the_daemon_dies_is_unavailable(
    short_tmp: Path,
) -> None:
    """A transaction's request that is waiting for its reply when the daemon is killed
    raises DaemonUnavailableError (code ``unavailable``) as HTTP requests do, not a bare
    LedgerError with an undocumented code."""
    d = start_daemon(short_tmp)
    try:
        async with AsyncClient(d.socket) as c:
            session = await c.open_session()
            txn = await session.begin("l", "p")
            await txn.put(b"a", b"1")
            d.proc.send_signal(signal.SIGSTOP)  # the next request waits for its reply
            pending = asyncio.create_task(txn.put(b"b", b"2"))
            await asyncio.sleep(0.2)
            assert not pending.done()
            d.proc.kill()
            with pytest.raises(DaemonUnavailableError) as e:
                await asyncio.wait_for(pending, 30)
            assert e.value.code == "unavailable"
            await session.close()
    finally:
        d.proc.kill()
        d.proc.wait()
        d.notify.close()
