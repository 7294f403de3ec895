"""Regressions found by attacking the running daemon over its socket: each request
here once got a 500, a non-JSON answer, or held the daemon's memory or connections."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gzip
import io
import json
import signal
import socket as sockets
from pathlib import Path
from urllib.parse import quote

import aiohttp
from yarl import URL

from tests.daemon.conftest import Daemon, start_daemon

P = "/v1/ledgers/l/pages/p"
D = "/v1/ledgers/app/pages/people/docs"


def u(path: str) -> URL:
    return URL("http://ledgerd" + path, encoded=True)


async def _raw(daemon: Daemon, data: bytes, wait: float = 5) -> bytes:
    """Send raw bytes on a fresh connection; return what came back before it closed
    (or until nothing more came for ``wait`` seconds)."""
    reader, writer = await asyncio.open_unix_connection(str(daemon.socket))
    writer.write(data)
    await writer.drain()
    got = b""
    with contextlib.suppress(ConnectionResetError, TimeoutError):
        while chunk := await asyncio.wait_for(reader.read(65536), wait):
            got += chunk
    writer.close()
    with contextlib.suppress(ConnectionResetError, BrokenPipeError):
        await writer.wait_closed()
    return got


def _no_traceback(daemon: Daemon) -> None:
    log = daemon.log.read_text(errors="replace")
    assert "Traceback" not in log and "internal error" not in log, log


async def test_lone_surrogates_in_json_are_400_not_500(
    daemon: Daemon, http: aiohttp.ClientSession
) -> None:
    """JSON may escape half a UTF-16 pair (``"\\ud800"``), which no UTF-8 store can
    hold: a document, an index declaration or a query holding one was a 500
    (``UnicodeEncodeError``) instead of the document API's 400."""
    r = await http.post(u(D + "/people"), json={"city": "Oslo"})
    assert r.status == 201, await r.text()
    doc_id = (await r.json())["_meta"]["_id"]
    r = await http.put(u(D + "/people/_indexes/by_city"), json={"partition": "city"})
    assert r.status == 200, await r.text()
    lone = b'"\\ud800"'
    for method, path, body, code in [
        ("POST", D + "/people", b'{"a": ' + lone + b"}", "invalid_document"),
        ("POST", D + "/people", b'{"a": {' + lone + b": 1}}", "invalid_document"),
        ("PUT", f"{D}/people/{doc_id}", b'{"b": [' + lone + b"]}", "invalid_document"),
        ("PUT", D + "/people/_indexes/bad", b'{"partition": ' + lone + b"}", "bad_request"),
        ("GET", D + "/people/_indexes/by_city/find?eq=%22%5Cud800%22", b"", "bad_request"),
        ("GET", D + "/people/_indexes/by_city/find?eq=1&start=%22%5CuDFFF%22", b"", "bad_request"),
        ("POST", P + "/batch", b'{"ops": [], "x": ' + lone + b"}", "bad_request"),
    ]:
        r = await http.request(method, u(path), data=body)
        assert r.status == 400, (path, r.status, await r.text())
        assert (await r.json())["error"]["code"] == code, (path, await r.text())
    # A well-formed pair (an emoji) is one character: taken as it is.
    r = await http.post(u(D + "/people"), data=b'{"a": "\\ud83d\\ude00"}')
    assert r.status == 201 and (await r.json())["_data"] == {"a": "\U0001f600"}
    r = await http.get(u(f"{D}/people/{doc_id}"))
    assert (await r.json())["_data"] == {"city": "Oslo"}  # the refused replace stored nothing
    ws = await http.ws_connect(u("/v1/session"))
    await ws.send_str('{"id": 1, "op": "ping", "x": "\\udc00"}')
    reply = await ws.receive_json()
    assert reply["ok"] is False and reply["error"]["code"] == "bad_request", reply
    await ws.close()
    _no_traceback(daemon)


async def test_a_compressed_request_body_is_refused_with_415(
    daemon: Daemon, http: aiohttp.ClientSession
) -> None:
    """aiohttp inflated request bodies by their ``Content-Encoding``: a body that did not
    inflate was a 500 (``RequestPayloadError``), a good gzip value was refused as
    "shorter than its Content-Length", and a small body could inflate to
    ``max_batch_bytes`` in memory. Bodies are taken as sent; an encoded one is 415."""
    await http.put(u(P + "/keys/precious"), data=b"keep me")
    good = gzip.compress(b"hello")
    bomb = gzip.compress(b"\0" * (8 * 1024 * 1024))
    for method, path, body, encoding in [
        ("PUT", P + "/keys/k", b"not gzip at all", "gzip"),
        ("PUT", P + "/keys/k", good, "gzip"),
        ("PUT", P + "/keys/k", bomb, "gzip"),
        ("PUT", P + "/keys/k", b"x" * 100, "deflate"),
        ("POST", P + "/batch", b"x" * 100, "deflate"),
        ("POST", P + "/batch", gzip.compress(b'{"ops": []}'), "GZIP"),
        ("POST", D + "/people", gzip.compress(b"{}"), "gzip"),
    ]:
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            f"Content-Encoding: {encoding}\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        got = await _raw(daemon, head + body)
        status, _, rest = got.partition(b"\r\n\r\n")
        assert status.startswith(b"HTTP/1.1 415 "), (path, got[:300])
        assert json.loads(rest)["error"]["code"] == "unsupported_encoding", got[:300]
    # `identity` is no encoding at all.
    r = await http.put(u(P + "/keys/k"), data=b"plain", headers={"Content-Encoding": "identity"})
    assert r.status == 204, await r.text()
    assert await (await http.get(u(P + "/keys/k"))).read() == b"plain"
    assert await (await http.get(u(P + "/keys/precious"))).read() == b"keep me"
    _no_traceback(daemon)


async def test_an_unknown_expectation_is_417_in_json(daemon: Daemon) -> None:
    """``Expect: 200-ok`` got aiohttp's text/plain 417, not the API's JSON error shape;
    ``Expect: 100-continue`` still gets its interim answer, then the response."""
    body = b"abc"
    head = f"PUT {P}/keys/k HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 3\r\n"
    got = await _raw(daemon, (head + "Expect: 200-ok\r\n\r\n").encode() + body)
    status, _, rest = got.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 417 ") and b"application/json" in status, got
    assert json.loads(rest)["error"]["code"] == "expectation_failed"
    got = await _raw(daemon, (head + "Expect: 100-continue\r\n\r\n").encode() + body)
    assert got.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 "), got
    # Refused before the client is told to send its body: a compressed one, say.
    got = await _raw(
        daemon,
        (head + "Content-Encoding: gzip\r\nExpect: 100-continue\r\n\r\n").encode(),
        wait=1,  # (the daemon waits a while for the body it refused, then closes)
    )
    assert got.startswith(b"HTTP/1.1 415 "), got
    _no_traceback(daemon)


async def test_a_session_that_does_not_read_holds_bounded_memory(short_tmp: Path) -> None:
    """A session whose client sends requests but reads no reply: its requests wait in
    the session's queue, which was bounded by count only (1,000 messages of up to
    ``max_batch_bytes`` each: 64 GiB). ``max_session_queue_bytes`` bounds their size."""
    budget = 16 * 1024
    daemon = start_daemon(short_tmp, env={"LEDGERD_MAX_SESSION_QUEUE_BYTES": str(budget)})
    try:
        connector = aiohttp.UnixConnector(path=str(daemon.socket))
        async with aiohttp.ClientSession(connector=connector) as http:
            big = base64.b64encode(b"v" * 4 * 1024 * 1024).decode()
            batch = {"ops": [{"op": "put", "key": "Yg==", "value": big}]}
            r = await http.post(u(P + "/batch"), data=io.BytesIO(json.dumps(batch).encode()))
            assert r.status == 200, await r.text()
            ws = await http.ws_connect(u("/v1/session"), max_msg_size=0)
            await ws.send_json({"id": 0, "op": "begin", "ledger": "bA==", "page": "cA=="})
            txn = (await ws.receive_json())["txn"]
            # Two replies of 5.6 MB that nobody reads: the session's worker is stuck
            # sending the first, and what follows waits in its queue.
            for i in (1, 2):
                await ws.send_json({"id": i, "op": "get", "txn": txn, "key": "Yg=="})
            pad = "x" * 4096  # 40 of them fit in the sockets' buffers: sending never blocks
            for i in range(3, 43):
                await ws.send_json({"id": i, "op": "ping", "pad": pad})
            replies = [await ws.receive_json(timeout=30) for _ in range(42)]
            await ws.close()
        by_id = {r["id"]: r for r in replies}
        assert by_id[1]["ok"] and by_id[2]["ok"]
        pings = [by_id[i] for i in range(3, 43)]
        refused = [p for p in pings if not p["ok"]]
        assert all(p["error"]["code"] == "too_many_requests" for p in refused)
        assert refused and "max_session_queue_bytes" in refused[0]["error"]["message"]
    finally:
        assert daemon.stop() == 0, daemon.log_text()
    _no_traceback(daemon)


async def test_a_burst_of_connections_is_queued_not_refused(daemon: Daemon) -> None:
    """The socket listened with aiohttp's backlog of 128: a burst of clients (a busy
    loop stalled for a moment, a script starting hundreds of `ledgerctl`) got EAGAIN
    ("Resource temporarily unavailable") from the 130th connect on.
    ``listen_backlog`` (1,024) is the queue the kernel keeps for the daemon."""
    somaxconn = int(Path("/proc/sys/net/core/somaxconn").read_text())
    n = min(600, somaxconn)
    socks: list[sockets.socket] = []
    try:
        daemon.proc.send_signal(signal.SIGSTOP)  # the daemon accepts nothing meanwhile
        try:
            for _ in range(n):
                socks.append(sockets.socket(sockets.AF_UNIX, sockets.SOCK_STREAM))
                socks[-1].setblocking(False)
                socks[-1].connect(str(daemon.socket))  # BlockingIOError: the backlog is full
        finally:
            daemon.proc.send_signal(signal.SIGCONT)
        for s in socks:
            s.settimeout(30)
            s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        for s in socks:
            assert s.recv(100).startswith(b"HTTP/1.1 200 "), "no answer"
    finally:
        for s in socks:
            s.close()


async def _wait_for_log(daemon: Daemon, text: str, timeout: float = 10) -> None:
    """Wait until the daemon's log holds ``text`` (it is written as things happen)."""
    async with asyncio.timeout(timeout):
        while text not in daemon.log.read_text(errors="replace"):
            await asyncio.sleep(0.05)


async def test_a_followed_feed_ends_when_its_client_leaves_or_the_daemon_stops(
    daemon: Daemon, http: aiohttp.ClientSession
) -> None:
    """A followed changes feed noticed a client that left, or a stopping daemon, only at
    its next heartbeat: with ``?heartbeat=3600`` the handler (and its page lease) stayed
    for an hour after the client left, and shutdown waited ``shutdown_timeout`` for it.
    And ``?heartbeat=1e-9`` spun the event loop writing empty lines."""
    base = "/v1/ledgers/l/pages/feed/docs"
    r = await http.post(u(base + "/c"), json={"n": 1})
    assert r.status == 201
    r = await http.get(u(base + "/_changes?follow=1&heartbeat=1e-9"))
    assert r.status == 400 and (await r.json())["error"]["code"] == "bad_request"
    reader, writer = await asyncio.open_unix_connection(str(daemon.socket))
    request = f"GET {base}/_changes?follow=1&heartbeat=3600 HTTP/1.1\r\nHost: x\r\n\r\n"
    writer.write(request.encode())
    await writer.drain()
    assert b'"documents"' in await reader.readuntil(b"}]}\n")
    writer.close()  # the client leaves: the feed ends now, not in an hour
    await _wait_for_log(daemon, "_changes?follow=1&heartbeat=3600 200")
    async with http.get(u(base + "/_changes?follow=1&heartbeat=3600")) as feed:
        assert json.loads(await feed.content.readline())["documents"]
        loop = asyncio.get_running_loop()
        started = loop.time()
        code = await loop.run_in_executor(None, daemon.stop)  # shutdown_timeout is 30 s
        assert code == 0 and loop.time() - started < 10
        assert (await feed.content.read()).strip() == b""
    _no_traceback(daemon)


async def test_a_download_nobody_reads_is_cut_off_after_request_timeout(short_tmp: Path) -> None:
    """A client that asks for a large value (or attachment) and then reads nothing kept
    its handler, a buffered chunk and the page's lease (so the page never closed as
    idle) for as long as it kept the connection: sending now has ``request_timeout``."""
    daemon = start_daemon(short_tmp, env={"LEDGERD_REQUEST_TIMEOUT": "1"})
    try:
        connector = aiohttp.UnixConnector(path=str(daemon.socket))
        async with aiohttp.ClientSession(connector=connector) as http:
            content = b"z" * (16 * 1024 * 1024)
            r = await http.put(u(P + "/keys/big"), data=io.BytesIO(content))
            assert r.status == 204
            r = await http.post(u(D + "/people"), json={"n": 1})
            doc = (await r.json())["_meta"]["_id"]
            r = await http.post(
                u(f"{D}/people/{doc}/attachments?filename=a"), data=io.BytesIO(content)
            )
            att = (await r.json())["attachment"]["_id"]
        for path in (P + "/keys/big", f"{D}/people/{doc}/attachments/{att}"):
            reader, writer = await asyncio.open_unix_connection(str(daemon.socket))
            writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            await reader.readuntil(b"\r\n\r\n")  # the headers; then it stops reading
            await _wait_for_log(daemon, f"GET {path} 200")  # the daemon gave up on it
            writer.close()
    finally:
        assert daemon.stop() == 0, daemon.log_text()
    _no_traceback(daemon)


async def test_a_session_opens_at_most_max_session_transactions(short_tmp: Path) -> None:
    """A session could begin transactions without end, each holding up to ``txn_memory``
    of values: 3,000 transactions of 40 KB grew the daemon by 90 MB, and one session
    could take any amount of memory. ``max_session_transactions`` bounds them."""
    daemon = start_daemon(short_tmp, env={"LEDGERD_MAX_SESSION_TRANSACTIONS": "3"})
    try:
        connector = aiohttp.UnixConnector(path=str(daemon.socket))
        async with aiohttp.ClientSession(connector=connector) as http:
            ws = await http.ws_connect(u("/v1/session"))
            begin = {"op": "begin", "ledger": "bA==", "page": "cA=="}
            txns = []
            for i in range(3):
                await ws.send_json({"id": i, **begin})
                txns.append((await ws.receive_json())["txn"])
            await ws.send_json({"id": 3, **begin})
            reply = await ws.receive_json()
            assert reply["ok"] is False, reply
            assert reply["error"]["code"] == "too_many_requests", reply
            assert "max_session_transactions" in reply["error"]["message"]
            await ws.send_json({"id": 4, "op": "rollback", "txn": txns[0]})
            assert (await ws.receive_json())["ok"]
            await ws.send_json({"id": 5, **begin})  # one ended: room for one more
            assert (await ws.receive_json())["ok"]
            await ws.close()
    finally:
        assert daemon.stop() == 0, daemon.log_text()
    _no_traceback(daemon)


async def test_a_session_opens_at_most_max_session_watchers(short_tmp: Path) -> None:
    """Each watcher keeps its page open: one session that watched 1,023 pages held every
    one of ``max_open_pages``, and every other client's request on another page got 503
    (with 9,000 open files and 700 MB). ``max_session_watchers`` bounds them."""
    env = {"LEDGERD_MAX_SESSION_WATCHERS": "3", "LEDGERD_MAX_OPEN_PAGES": "5"}
    daemon = start_daemon(short_tmp, env=env)
    try:
        connector = aiohttp.UnixConnector(path=str(daemon.socket))
        async with aiohttp.ClientSession(connector=connector) as http:
            ws = await http.ws_connect(u("/v1/session"))
            watches = []
            for i in range(4):
                page = base64.b64encode(b"p%d" % i).decode()
                await ws.send_json({"id": i, "op": "watch", "ledger": "bA==", "page": page})
                watches.append(await ws.receive_json())
            assert all(w["ok"] for w in watches[:3]), watches
            assert watches[3]["ok"] is False, watches
            assert watches[3]["error"]["code"] == "too_many_requests", watches
            assert "max_session_watchers" in watches[3]["error"]["message"]
            r = await http.put(u("/v1/ledgers/other/pages/new/keys/k"), data=b"v")
            assert r.status == 204, await r.text()  # pages remain for others
            await ws.send_json({"id": 9, "op": "unwatch", "watch": watches[0]["watch"]})
            assert (await ws.receive_json())["ok"]
            await ws.send_json({"id": 10, "op": "watch", "ledger": "bA==", "page": "cA=="})
            assert (await ws.receive_json())["ok"]  # one ended: room for one more
            await ws.close()
    finally:
        assert daemon.stop() == 0, daemon.log_text()
    _no_traceback(daemon)


async def test_unknown_methods_do_not_grow_the_metrics(short_tmp: Path) -> None:
    """The metrics counted requests by method as sent: with aiohttp's pure-Python parser
    (``AIOHTTP_NO_EXTENSIONS``, or no wheel for the platform), which takes any token as a
    method, every made-up method became a series of its own, without bound."""
    daemon = start_daemon(short_tmp, env={"AIOHTTP_NO_EXTENSIONS": "1"})
    try:
        for i in range(20):
            request = b"M%dX /v1/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % i
            got = await _raw(daemon, request)
            assert got.startswith(b"HTTP/1.1 405 "), got  # the path is there, not the method
        connector = aiohttp.UnixConnector(path=str(daemon.socket))
        async with aiohttp.ClientSession(connector=connector) as http:
            text = await (await http.get(u("/v1/metrics"))).text()
        series = [line for line in text.splitlines() if 'route="unmatched"' in line]
        assert not any('method="M' in line for line in series), series
        assert any('method="other"' in line and "20.0" in line for line in series), series
    finally:
        assert daemon.stop() == 0, daemon.log_text()


async def test_bad_bytes_seen_by_the_pure_python_parser_are_400(short_tmp: Path) -> None:
    """aiohttp's pure-Python parser (``AIOHTTP_NO_EXTENSIONS``, or no wheel) hands on what
    its C parser refuses: a raw non-ASCII byte in the path was a 500
    (``UnicodeEncodeError``), and a chunked body that turned malformed mid-way a 500
    (``TransferEncodingError``). Both are the client's: 400 ``bad_request``."""
    daemon = start_daemon(short_tmp, env={"AIOHTTP_NO_EXTENSIONS": "1"})
    try:
        close = b"Host: x\r\nConnection: close\r\n"
        for raw_path in (
            b"/v1/ledgers/\xff/pages",
            P.encode() + b"/keys/\xff",
            P.encode() + b"/docs/\xff",
        ):
            got = await _raw(daemon, b"GET " + raw_path + b" HTTP/1.1\r\n" + close + b"\r\n")
            status, _, rest = got.partition(b"\r\n\r\n")
            assert status.split(b" ")[1] == b"400", got[:300]
            assert json.loads(rest)["error"]["code"] == "bad_request"
        for path in (P + "/keys/k", P + "/batch"):
            method = "POST" if path.endswith("batch") else "PUT"
            head = (
                f"{method} {path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                "Expect: 100-continue\r\n\r\n"
            )
            reader, writer = await asyncio.open_unix_connection(str(daemon.socket))
            writer.write(head.encode())
            # Once told to go on, the handler is reading the body when it turns bad.
            await reader.readuntil(b"HTTP/1.1 100 Continue\r\n\r\n")
            writer.write(b'3\r\n{"o\r\nZZ\r\n')  # "ZZ" is not a chunk size
            got = await asyncio.wait_for(reader.read(), 10)
            writer.close()
            status, _, rest = got.partition(b"\r\n\r\n")
            assert status.split(b" ")[1] == b"400", got[:300]
            assert json.loads(rest)["error"]["code"] == "bad_request"
        connector = aiohttp.UnixConnector(path=str(daemon.socket))
        async with aiohttp.ClientSession(connector=connector) as http:
            assert (await http.get(u(P + "/keys/k"))).status == 404  # nothing was stored
    finally:
        assert daemon.stop() == 0, daemon.log_text()
    _no_traceback(daemon)


async def test_ranges_the_api_does_not_serve_are_ignored_not_refused(
    daemon: Daemon, http: aiohttp.ClientSession
) -> None:
    """RFC 9110 (14.2) says a server MUST ignore a Range in a unit it does not know, and
    may ignore any: ``items=0-1``, ``Bytes=0-1`` (units are case-insensitive) and a valid
    multi-range request were 400, a suffix range of an empty value (satisfiable: it
    asks for the whole of it) was 416, and a Range with an ``If-Range`` for another
    version got 206 of the current one (a resumed download stitched two versions
    together). Each is now the whole value, 200; malformed ranges stay 400."""
    r = await http.post(u(D + "/c"), json={"n": 1})
    doc = (await r.json())["_meta"]["_id"]
    paths = {}
    for name, content in (("empty", b""), ("small", b"0123456789")):
        r = await http.post(u(f"{D}/c/{doc}/attachments?filename={name}"), data=content)
        att = (await r.json())["attachment"]["_id"]
        await http.put(u(f"{P}/keys/{name}"), data=content)
        paths[name] = (content, [f"{D}/c/{doc}/attachments/{att}", f"{P}/keys/{name}"])
    for name, (content, where) in paths.items():
        for path in where:
            whole = ["items=0-1", "bytes=0-1,3-4", "bytes=-1, -2", "bytes=0-0,-1"]
            if not content:
                whole.append("bytes=-5")
            for rg in whole:
                r = await http.get(u(path), headers={"Range": rg})
                assert r.status == 200, (path, rg, r.status, await r.text())
                assert await r.read() == content and "Content-Range" not in r.headers
            if content:
                r = await http.get(u(path), headers={"Range": "Bytes=1-2"})
                assert r.status == 206 and await r.read() == b"12", (path, r.status)
                r = await http.get(u(path), headers={"Range": "bytes=1-2", "If-Range": '"old"'})
                assert r.status == 200 and await r.read() == content, (path, r.status)
                etag = r.headers.get("ETag")
                if etag is not None:  # the current version: the range is served
                    r = await http.get(u(path), headers={"Range": "bytes=1-2", "If-Range": etag})
                    assert r.status == 206 and await r.read() == b"12", (path, r.status)
            for rg in ("bytes=5-2", "bytes=", "bytes=x-1", "bytes=,", "bytes 0-1"):
                r = await http.get(u(path), headers={"Range": rg})
                assert r.status == 400, (path, rg, r.status)
                assert (await r.json())["error"]["code"] == "bad_request"
        async with http.get(u(where[0]), headers={"Range": "bytes=0-"}) as r:
            assert r.status == (416 if not content else 206), (name, r.status)
    _no_traceback(daemon)


def test_ledgerctl_refuses_a_count_below_one_and_an_overlong_request_as_bad_input(
    daemon: Daemon,
) -> None:
    """``ledgerctl ls --limit 0`` (or -5) printed nothing and exited 0, as if the page
    were empty; and an argument so long that the request line is over its limit (414)
    exited 4, "the daemon failed", instead of 2, bad input, as every other oversize
    argument does."""
    assert daemon.ledgerctl("put", "l", "p", "k", "v").returncode == 0
    lists: list[tuple[str, ...]] = [
        ("ls", "l", "p"),
        ("log", "l", "p"),
        ("doc", "ls", "l", "p", "c"),
    ]
    for args in lists:
        for n in ("0", "-5", "x"):
            out = daemon.ledgerctl(*args, "--limit", n)
            assert out.returncode == 2, (args, n, out)
            assert b"--limit" in out.stderr and out.stdout == b""
    long = "a" * 100_000
    overlong: list[tuple[str, ...]] = [
        ("ls", "l", "p", "--prefix", long),
        ("doc", "get", "l", "p", "c", long),
    ]
    for args in overlong:
        out = daemon.ledgerctl(*args)
        assert out.returncode == 2, (args[:2], out.returncode, out.stderr[:300])
        assert len(out.stderr) < 2000
    assert daemon.ledgerctl("ls", "l", "p", "--limit", "1").stdout == b"k\tv\n"


async def test_document_query_parameters_that_are_not_utf8_are_400(
    daemon: Daemon, http: aiohttp.ClientSession
) -> None:
    """The document routes read their query through aiohttp's ``request.query``, which
    decodes bytes that are not UTF-8 as U+FFFD: ``_changes?collection=%FF`` listed the
    collection named "\\ufffd" and ``find?eq=%22%FF%22`` looked for that character, both
    answering 200 for something the client never asked. Path names that are not UTF-8
    were already 400; so are query parameters now. A token from another page is a bad
    token (400), not a missing commit (404)."""
    r = await http.post(u(D + "/c"), json={"city": "\ufffd"})
    assert r.status == 201
    r = await http.put(u(D + "/c/_indexes/by_city"), json={"partition": "city"})
    assert r.status == 200
    for path in (
        D + "/_changes?collection=%FF",
        D + "/c/_indexes/by_city/find?eq=%22%FF%22",
        D + "/c?limit=1&deleted=%FF",
    ):
        r = await http.get(u(path))
        assert r.status == 400, (path, r.status, await r.text())
        assert (await r.json())["error"]["code"] == "bad_request"
    r = await http.get(u(D + "/c/_indexes/by_city/find?eq=%22%EF%BF%BD%22"))  # real U+FFFD
    assert r.status == 200 and len((await r.json())["documents"]) == 1
    other = "/v1/ledgers/app/pages/other/docs"
    for n in range(3):
        await http.post(u(other + "/c"), json={"n": n})
    token = (await (await http.get(u(other + "/_changes?limit=1"))).json())["next"]
    r = await http.get(u(D + "/_changes?limit=1&token=" + quote(token, safe="")))
    assert r.status == 400, await r.text()
    assert (await r.json())["error"]["code"] == "bad_request"
    _no_traceback(daemon)
