"""Memory bounds: listing bodies, session request queues, resolve events."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import random
import struct
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from yarl import URL

from ledgerd.daemon.client import Answer, AsyncClient, ResolveRequest
from tests.daemon.conftest import Daemon, start_daemon

P = "/v1/ledgers/l/pages/p"
MIB = 1024 * 1024


def u(path: str) -> URL:
    return URL("http://ledgerd" + path, encoded=True)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.fixture
def bounded(short_tmp: Path) -> Iterator[Daemon]:
    env = {
        "LEDGERD_MAX_LISTING_BYTES": str(MIB),
        "LEDGERD_MAX_SESSION_QUEUE": "5",
        "LEDGERD_MAX_EVENT_BYTES": str(MIB),
    }
    d = start_daemon(short_tmp, env=env)
    try:
        yield d
    finally:
        assert d.stop() == 0, d.log_text()


async def test_a_listing_body_is_bounded_and_continues(bounded: Daemon) -> None:
    rnd = random.Random(5)
    want = {b"big%02d" % i: rnd.randbytes(300 * 1024) for i in range(8)}  # several pieces each
    want |= {b"small%03d" % i: rnd.randbytes(40 * 1024) for i in range(60)}  # one piece each
    async with aiohttp.ClientSession(
        connector=aiohttp.UnixConnector(path=str(bounded.socket))
    ) as http:
        for k, v in want.items():
            assert (await http.put(u(f"{P}/keys/{k.decode()}"), data=v)).status == 204
        got: dict[bytes, bytes] = {}
        token, bodies = None, 0
        while True:
            q = "limit=10000" + (f"&token={token}" if token else "")
            r = await http.get(u(f"{P}/entries?{q}"))
            body = await r.read()
            assert len(body) <= MIB + 2 * 1024, len(body)  # the budget (plus the overhead)
            doc = json.loads(body)
            for e in doc["entries"]:
                got[base64.b64decode(e["key"])] = base64.b64decode(e["value"])
            bodies += 1
            if doc["next"] is None:
                break
            token = "".join(f"%{b:02X}" for b in doc["next"].encode())
        assert got == want and bodies > 5
        # In a session too.
        ws = await http.ws_connect(u("/v1/session"))
        await ws.send_json({"id": 1, "op": "begin", "ledger": b64(b"l"), "page": b64(b"p")})
        txn = (await ws.receive_json())["txn"]
        await ws.send_json({"id": 2, "op": "entries", "txn": txn, "limit": 10000})
        msg = await ws.receive()
        assert len(msg.data) <= MIB + 2 * 1024
        doc = json.loads(msg.data)
        assert doc["ok"] and doc["next"] is not None and 0 < len(doc["entries"]) < len(want)
        await ws.send_json({"id": 3, "op": "entries", "txn": txn, "limit": 10**9})
        assert (await ws.receive_json())["error"]["code"] == "bad_request"
        await ws.close()


def _frame(text: str) -> bytes:
    """A masked WebSocket text frame (client to server)."""
    data, mask = text.encode(), os.urandom(4)
    n = len(data)
    head = bytes([0x81]) + (bytes([0x80 | n]) if n < 126 else bytes([0xFE]) + struct.pack("!H", n))
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data))


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    b0, b1 = await reader.readexactly(2)
    n = b1 & 0x7F
    if n == 126:
        (n,) = struct.unpack("!H", await reader.readexactly(2))
    elif n == 127:
        (n,) = struct.unpack("!Q", await reader.readexactly(8))
    return await reader.readexactly(n)


async def test_a_session_queue_is_bounded(bounded: Daemon) -> None:
    """Many requests at once, in one write: those past the queue's bound are refused
    with a clear error at once; every request gets exactly one reply."""
    reader, writer = await asyncio.open_unix_connection(str(bounded.socket))
    writer.write(
        b"GET /v1/session HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    assert head.startswith(b"HTTP/1.1 101")
    n = 300
    writer.write(b"".join(_frame(json.dumps({"id": i, "op": "ping"})) for i in range(n)))
    await writer.drain()
    replies = [json.loads(await asyncio.wait_for(_read_frame(reader), 10)) for _ in range(n)]
    assert sorted(r["id"] for r in replies) == list(range(n))
    refused = [r for r in replies if not r["ok"]]
    assert refused and all(r["error"]["code"] == "too_many_requests" for r in refused)
    assert all(r.get("pong") for r in replies if r["ok"])
    writer.close()


async def test_many_conflicts_are_sent_to_the_resolver_in_bounded_parts(bounded: Daemon) -> None:
    keys = [b"k%02d" % i for i in range(40)]
    rnd = random.Random(6)
    async with AsyncClient(bounded.socket) as c, AsyncClient(bounded.socket) as r:
        await c.policy("l", "p", "custom")
        parts: list[int] = []

        async def take_left(req: ResolveRequest) -> Answer:
            size = sum(len(s.value or b"") for x in req.conflicts for s in (x.left, x.right) if s)
            assert size * 4 / 3 <= MIB or len(req.conflicts) == 1, size
            parts.append(len(req.conflicts))
            return {x.key: "left" for x in req.conflicts}

        resolver = await r.register_resolver("l", take_left)
        s = await c.open_session()
        txn = await s.begin("l", "p")
        for k in keys:
            await txn.put(k, rnd.randbytes(60 * 1024))
        # Writes the transaction did not see: its commit makes 40 conflicts.
        for k in keys:
            await c.put("l", "p", k, rnd.randbytes(60 * 1024))
        await c.heads("l", "p")
        await asyncio.wait_for(txn.commit(), 60)
        assert len(parts) > 1 and sum(parts) == len(keys), parts
        doc = await c.policy("l", "p")
        assert doc["heads"] == 1 and doc["conflicts"] == 0 and doc["conflict"] is None, doc
        await s.close()
        await resolver.close()


def test_a_body_over_max_batch_bytes_is_413_however_it_arrives(short_tmp: Path) -> None:
    """A body that has arrived whole when the request is served (read at once) and one
    still arriving (read as it comes) meet the same bound, and nothing is written."""
    import socket

    d = start_daemon(short_tmp, env={"LEDGERD_MAX_BATCH_BYTES": "4096"})
    try:

        def send(parts: list[bytes]) -> bytes:
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(30)
                s.connect(str(d.socket))
                for part in parts:
                    s.sendall(part)
                answer = b""
                while chunk := s.recv(65536):
                    answer += chunk
                return answer

        def request(path: str, body: bytes, split: bool) -> list[bytes]:
            head = (
                f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n"
            ).encode()
            return [head, body[:100], body[100:]] if split else [head + body]

        ops = [{"op": "put", "key": b64(b"k%d" % i), "value": b64(b"v" * 40)} for i in range(80)]
        big = json.dumps({"ops": ops}).encode()
        fits = json.dumps({"ops": ops[:2]}).encode()
        assert len(big) > 4096 > len(fits)
        for split in (False, True):
            answer = send(request(f"{P}/batch", big, split))
            assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
            assert b'"too_large"' in answer
        assert send(request(f"{P}/batch", fits, False)).startswith(b"HTTP/1.1 200")
        answer = send(
            [f"GET {P}/entries HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()]
        )
        keys = [
            base64.b64decode(e["key"]) for e in json.loads(answer.split(b"\r\n\r\n")[1])["entries"]
        ]
        assert keys == [b"k0", b"k1"]
        # A plain value over max_batch_bytes is streamed, not refused (it was 413 up to
        # 256 KiB, the size below which a value is read whole).
        value = bytes(range(256)) * 40
        put = (
            f"PUT {P}/keys/big HTTP/1.1\r\nHost: x\r\nContent-Length: {len(value)}\r\n"
            "Connection: close\r\n\r\n"
        ).encode()
        assert send([put + value]).startswith(b"HTTP/1.1 204")
        got = send([f"GET {P}/keys/big HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()])
        assert got.startswith(b"HTTP/1.1 200") and got.split(b"\r\n\r\n", 1)[1] == value
    finally:
        assert d.stop() == 0, d.log_text()


def test_a_control_body_is_bounded_below_max_batch_bytes(short_tmp: Path) -> None:
    """The bodies of a page's merge policy, check, GC and evict are a few names and
    flags: one over CONTROL_BODY_BYTES is 413 too_large, refused from its
    Content-Length before it is read (it was read up to max_batch_bytes, 64 MiB, and
    parsed on the event loop), and the daemon goes on answering."""
    import socket

    from ledgerd.daemon.api import CONTROL_BODY_BYTES

    d = start_daemon(short_tmp)
    try:

        def send(method: str, path: str, body: bytes) -> bytes:
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(30)
                s.connect(str(d.socket))
                s.sendall(
                    f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
                    "Connection: close\r\n\r\n".encode()
                    + body
                )
                answer = b""
                while chunk := s.recv(65536):
                    answer += chunk
                return answer

        big = json.dumps({"policy": "last_one_wins", "x": "y" * CONTROL_BODY_BYTES}).encode()
        for method, path in [("PUT", f"{P}/policy"), ("POST", "/v1/check"), ("POST", "/v1/gc")]:
            answer = send(method, path, big)
            assert answer.startswith(b"HTTP/1.1 413"), (path, answer[:300])
            assert b'"too_large"' in answer, answer[:300]
        answer = send("POST", "/v1/evict", big)
        assert answer.startswith(b"HTTP/1.1 413") and b'"too_large"' in answer, answer[:300]
        # Bodies of their usual size are served as before.
        assert send("PUT", f"{P}/policy", b'{"policy": "last_one_wins"}').startswith(
            b"HTTP/1.1 200"
        )
        assert send("POST", "/v1/gc", b"{}").startswith(b"HTTP/1.1 200")
    finally:
        assert d.stop() == 0, d.log_text()
