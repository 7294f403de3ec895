"""The daemon's bounds on what clients may hold at once (connections, requests) and on
what its answers repeat of a request; each once was unbounded or hard-coded."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from yarl import URL

from ledgerd.daemon.client import AsyncClient
from ledgerd.daemon.config import ConfigError, load
from tests.daemon.conftest import Daemon, start_daemon

P = "/v1/ledgers/l/pages/p"
D = "/v1/ledgers/app/pages/people/docs"


def u(path: str) -> URL:
    return URL("http://ledgerd" + path, encoded=True)


def _no_traceback(daemon: Daemon) -> None:
    log = daemon.log.read_text(errors="replace")
    assert "Traceback" not in log and "internal error" not in log, log


async def _answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One response read off a raw connection: status, headers, body (by Content-Length)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
    n = int(headers.get("content-length", "0"))
    body = await asyncio.wait_for(reader.readexactly(n), 10) if n else b""
    return int(lines[0].split()[1]), headers, body


async def _hold_a_request(daemon: Daemon) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A PUT whose handler is running (it answered ``100 Continue``) and waits for its body."""
    reader, writer = await asyncio.open_unix_connection(str(daemon.socket))
    writer.write(
        f"PUT {P}/keys/held HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
        "Expect: 100-continue\r\n\r\n".encode()
    )
    await writer.drain()
    await asyncio.wait_for(reader.readuntil(b"HTTP/1.1 100 Continue\r\n\r\n"), 10)
    return reader, writer


async def test_requests_past_max_concurrent_requests_are_503_overloaded(short_tmp: Path) -> None:
    """Every request was served at once, however many: a thousand clients each sending a
    batch of ``max_batch_bytes`` held a thousand times that. Past
    ``max_concurrent_requests`` a request is answered 503 ``overloaded`` with
    ``Retry-After`` at once; health and metrics still answer."""
    daemon = start_daemon(short_tmp, env={"LEDGERD_MAX_CONCURRENT_REQUESTS": "2"})
    try:
        held = [await _hold_a_request(daemon) for _ in range(2)]
        connector = aiohttp.UnixConnector(path=str(daemon.socket))
        async with aiohttp.ClientSession(connector=connector) as http:
            for method, path in [("GET", P + "/keys/k"), ("POST", D + "/c"), ("GET", "/v1/du")]:
                async with asyncio.timeout(10):
                    r = await http.request(method, u(path), data=b"{}")
                assert r.status == 503, (path, await r.text())
                assert (await r.json())["error"]["code"] == "overloaded"
                assert int(r.headers["Retry-After"]) >= 1
            assert (await http.get(u("/v1/health"))).status == 200
            assert (await http.get(u("/v1/metrics"))).status == 200
            for reader, writer in held:  # the held requests finish normally
                writer.write(b"hello")
                status, _, _ = await _answer(reader)
                assert status == 204
                writer.close()
            r = await http.get(u(P + "/keys/held"))  # and there is room again
            assert r.status == 200 and await r.read() == b"hello"
    finally:
        assert daemon.stop() == 0, daemon.log_text()
    _no_traceback(daemon)


async def test_connections_past_max_connections_are_answered_503_and_closed(
    short_tmp: Path,
) -> None:
    """Every connection was accepted and kept, each holding a file descriptor and
    buffers until ``request_timeout``: enough silent clients took every open file
    the daemon has. Past ``max_connections`` a connection is answered 503
    ``overloaded`` at once and closed."""
    daemon = start_daemon(short_tmp, env={"LEDGERD_MAX_CONNECTIONS": "3"})
    try:
        silent = [await asyncio.open_unix_connection(str(daemon.socket)) for _ in range(3)]
        connector = aiohttp.UnixConnector(path=str(daemon.socket), force_close=True)
        async with aiohttp.ClientSession(connector=connector) as http:
            for path in (P + "/keys/k", "/v1/health"):
                async with asyncio.timeout(10):
                    r = await http.get(u(path))
                    assert r.status == 503, await r.text()
                    assert (await r.json())["error"]["code"] == "overloaded"
                    assert int(r.headers["Retry-After"]) >= 1
            # A raw client that sends nothing is told at once, and closed.
            reader, writer = await asyncio.open_unix_connection(str(daemon.socket))
            status, headers, body = await _answer(reader)
            assert status == 503 and json.loads(body)["error"]["code"] == "overloaded"
            assert await asyncio.wait_for(reader.read(), 10) == b""
            writer.close()
            _, w = silent.pop()  # one leaves: there is room for one more
            w.close()
            async with asyncio.timeout(10):
                while (r := await http.get(u("/v1/health"))).status == 503:
                    await asyncio.sleep(0.05)  # until the daemon has seen it leave
            assert r.status == 200
        for _, w in silent:
            w.close()
            with contextlib.suppress(ConnectionError):
                await w.wait_closed()
    finally:
        assert daemon.stop() == 0, daemon.log_text()
    _no_traceback(daemon)


async def test_the_session_heartbeat_is_a_setting(short_tmp: Path) -> None:
    """A WebSocket session pinged its client every 30 s (hard-coded), so a client that
    vanished without closing (a suspended laptop, a dropped network namespace) held its
    transactions and watchers for up to 45 s whatever the deployment wanted.
    ``session_heartbeat`` sets it: a client that answers no ping is closed after
    about one and a half of it."""
    for bad in ("0", "0.001", "nan", "-1"):
        with pytest.raises(ConfigError, match="session_heartbeat"):
            load(env={"LEDGERD_SESSION_HEARTBEAT": bad})
    assert load(env={}).session_heartbeat == 30.0
    daemon = start_daemon(short_tmp, env={"LEDGERD_SESSION_HEARTBEAT": "0.3"})
    try:
        connector = aiohttp.UnixConnector(path=str(daemon.socket))
        async with aiohttp.ClientSession(connector=connector) as http:
            ws = await http.ws_connect(u("/v1/session"), autoping=False)
            await ws.send_json({"id": 1, "op": "begin", "ledger": "bA==", "page": "cA=="})
            assert (await ws.receive_json(timeout=10))["ok"]
            kinds: list[aiohttp.WSMsgType] = []  # the daemon's pings, well before 30 s
            while not kinds or kinds[-1] == aiohttp.WSMsgType.PING:  # never answered
                kinds.append((await ws.receive(timeout=10)).type)
            assert kinds[0] == aiohttp.WSMsgType.PING, kinds
            assert kinds[-1] in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED), kinds
            await ws.close()
        await _wait_for_log(daemon, "GET /v1/session 101")
    finally:
        assert daemon.stop() == 0, daemon.log_text()
    _no_traceback(daemon)


async def _wait_for_log(daemon: Daemon, text: str, timeout: float = 10) -> None:
    """Wait until the daemon's log holds ``text`` (it is written as things happen)."""
    async with asyncio.timeout(timeout):
        while text not in daemon.log.read_text(errors="replace"):
            await asyncio.sleep(0.05)


MAX_MESSAGE = 1200  # what an error message may take, with its note of the length cut


async def test_error_messages_quote_a_bounded_part_of_the_input(
    daemon: Daemon, http: aiohttp.ClientSession
) -> None:
    """Error messages quoted names, ops, paths and values as given: a 1 MB bad op came
    back as a 1 MB error (and a 1 MB log line). Every message is cut, with an ellipsis
    and the length of what was cut, over HTTP and in sessions alike."""
    huge = "x" * 1_000_000
    r = await http.post(u(D + "/c"), json={"n": 1})
    assert r.status == 201
    doc = (await r.json())["_meta"]["_id"]
    cases: list[tuple[str, str, Any]] = [
        ("POST", P + "/batch", {"ops": [{"op": huge}]}),
        ("POST", P + "/batch", {"ops": [{"op": "put", "key": huge, "value": ""}]}),
        ("POST", P + "/batch", {"ops": [], "x": [huge, float("inf")]}),
        ("PUT", P + "/policy", {"policy": huge}),
        ("PUT", D + "/c/_indexes/i", {"partition": "_" + huge}),
        ("PUT", D + "/c/_indexes/i", {"partition": "a", "sort": [huge, 1]}),
        ("POST", "/v1/check", {"ledger": huge}),
        ("POST", "/v1/gc", {"page": "%%" + huge}),
        ("PUT", f"{D}/c/{doc}", {huge: 1, "_" + huge: 2}),
        ("GET", D + "/c/_indexes/nope/find?eq=" + "1" * 30000, None),
        ("GET", P + "/entries?limit=" + "9" * 30000, None),
        ("GET", f"{P}/entries?token=" + "!" * 30000, None),
        ("GET", D + "/_changes?since=" + "z" * 30000, None),
        ("PUT", f"{D}/c/{doc}?rev=" + "y" * 30000, {"n": 2}),
        ("PUT", f"{D}/c/{doc}?new_rev=" + "y" * 30000, {"n": 2}),
        ("GET", "/v1/" + "n" * 30000, None),
    ]
    long: list[tuple[str, int, str]] = []
    for method, path, body in cases:
        data = None if body is None else io.BytesIO(json.dumps(body).encode())
        r = await http.request(method, u(path), data=data)
        text = await r.text()
        assert 400 <= r.status < 500, (path[:80], r.status, text[:300])
        message = (await r.json())["error"]["message"]
        if len(message) > MAX_MESSAGE:
            long.append((path[:80], len(message), message[:200]))
    ws = await http.ws_connect(u("/v1/session"), max_msg_size=0)
    for req in (
        {"id": 1, "op": huge},
        {"id": 2, "op": "begin", "ledger": huge, "page": "cA=="},
        {"id": 3, "op": "unwatch", "watch": huge},
        {"id": 4, "op": "commit", "txn": [huge]},
    ):
        await ws.send_json(req)
        reply = await ws.receive_json(timeout=30)
        assert reply["ok"] is False, str(reply)[:300]
        message = reply["error"]["message"]
        if len(message) > MAX_MESSAGE:
            long.append((f"session {req['id']}", len(message), message[:200]))
    await ws.close()
    assert not long, "\n".join(map(str, long))
    _no_traceback(daemon)


async def test_followed_feeds_hold_followers_not_request_slots(short_tmp: Path) -> None:
    """A followed changes feed held one of ``max_concurrent_requests`` for as long as
    its client stayed: as many followers as that left every other request 503. It
    now gives its slot back and holds one of ``max_followers``; past those a new
    follower is 503 ``overloaded``, and one that leaves makes room."""
    env = {"LEDGERD_MAX_CONCURRENT_REQUESTS": "2", "LEDGERD_MAX_FOLLOWERS": "3"}
    daemon = start_daemon(short_tmp, env=env)
    feed = u(D + "/_changes?follow=1&heartbeat=1")
    try:
        connector = aiohttp.UnixConnector(path=str(daemon.socket), limit=0)
        async with aiohttp.ClientSession(connector=connector) as http:
            r = await http.post(u(D + "/c"), json={"a": 1})
            assert r.status == 201, await r.text()
            followers = []
            for _ in range(3):
                f = await http.get(feed)
                assert f.status == 200, await f.text()
                assert json.loads(await asyncio.wait_for(f.content.readline(), 10))["documents"]
                followers.append(f)
            for _ in range(3):  # short requests still have both slots
                r = await http.get(u(D + "/c"))
                assert r.status == 200, await r.text()
            r = await http.get(feed)
            assert r.status == 503, await r.text()
            error = (await r.json())["error"]
            assert error["code"] == "overloaded" and "max_followers" in error["message"]
            followers.pop().close()  # a follower leaves: its place is free once seen
            async with asyncio.timeout(10):  # each try is a round trip: no sleep
                while True:
                    r = await http.get(feed)
                    if r.status == 200:
                        break
                    assert r.status == 503
                    r.close()
            r.close()
            for f in followers:
                f.close()
    finally:
        assert daemon.stop() == 0, daemon.log_text()
    _no_traceback(daemon)


def test_a_compaction_grace_shorter_than_ten_idle_polls_is_refused() -> None:
    """A grace of 20 s with polls backing off to 60 s made an idle device take itself
    for one that was away (and packs it had not read could be compacted): refused."""
    with pytest.raises(ConfigError, match="compaction_grace: must be at least 10 times"):
        load(env={"LEDGERD_COMPACTION_GRACE": "20"})
    grace = load(env={"LEDGERD_COMPACTION_GRACE": "5", "LEDGERD_SYNC_INTERVAL_MAX": "0.5"})
    assert grace.compaction_grace == 5.0


@pytest.mark.parametrize(
    ("key", "largest"), [("listen_backlog", 2**31 - 1), ("max_batch_bytes", 2**32 - 2)]
)
def test_a_setting_past_what_the_daemon_can_pass_on_is_refused(key: str, largest: int) -> None:
    """``listen_backlog = 2147483648`` passed ``--check-config`` and then stopped start-up
    with an OverflowError traceback from listen(2) (leaving the socket file behind);
    ``max_batch_bytes`` over 4 GiB started, and then every session (every client
    transaction) failed with an internal error: aiohttp's WebSocket reader holds its
    largest message in a C unsigned int."""
    var = f"LEDGERD_{key.upper()}"
    assert getattr(load(env={var: str(largest)}), key) == largest
    with pytest.raises(ConfigError, match=f"^{key}: must be at most {largest}"):
        load(env={var: str(largest + 1)})
    out = subprocess.run(
        [sys.executable, "-m", "ledgerd.daemon", "--check-config"],
        env={**os.environ, var: str(10**20)},
        capture_output=True,
        timeout=60,
    )
    err = out.stderr.decode()
    assert out.returncode == 2 and err.count("\n") == 1 and key in err, err


async def test_sessions_work_at_the_largest_max_batch_bytes(short_tmp: Path) -> None:
    """At 4 GiB and more every session failed; at the largest accepted value one works."""
    daemon = start_daemon(short_tmp, env={"LEDGERD_MAX_BATCH_BYTES": str(2**32 - 2)})
    try:
        async with AsyncClient(daemon.socket) as c:
            async with c.transaction("l", "p") as txn:
                await txn.put(b"k", b"v")
            assert await c.get("l", "p", b"k") == b"v"
    finally:
        assert daemon.stop() == 0, daemon.log_text()
    _no_traceback(daemon)


def test_a_key_given_twice_in_the_file_is_refused(tmp_path: Path) -> None:
    """``sync_interval = 1.0`` and ``[sync] interval = 2.0`` name one setting: the later
    won without a word (TOML itself refuses only the same key twice in one table)."""
    path = tmp_path / "ledgerd.toml"
    path.write_text("sync_interval = 1.0\n[sync]\ninterval = 2.0\n")
    with pytest.raises(ConfigError, match=r"^sync_interval: given twice in .*\[sync\] interval"):
        load(path, env={})
