"""Every endpoint through raw HTTP over the Unix socket, as curl would use it."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import socket

import aiohttp
from yarl import URL

from ledgerd.daemon.client import quote
from tests.daemon.conftest import Daemon

P = "/v1/ledgers/notes/pages/inbox"


def u(path: str) -> URL:
    return URL("http://ledgerd" + path, encoded=True)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def _err(resp: aiohttp.ClientResponse) -> tuple[int, str]:
    doc = await resp.json()
    return resp.status, doc["error"]["code"]


async def test_status_and_listing(http: aiohttp.ClientSession) -> None:
    st = await (await http.get(u("/v1/status"))).json()
    assert st["version"] and len(st["device_id"]) == 32 and st["cloud"] is None
    assert (await (await http.get(u("/v1/ledgers"))).json()) == {"ledgers": []}
    assert (await http.put(u(P + "/keys/k"), data=b"v")).status == 204
    assert (await (await http.get(u("/v1/ledgers"))).json())["ledgers"] == [
        {"name": b64(b"notes"), "text": "notes"}
    ]
    pages = (await (await http.get(u("/v1/ledgers/notes/pages"))).json())["pages"]
    assert pages == [{"id": b64(b"inbox"), "text": "inbox"}]


async def test_put_get_head_range_delete(http: aiohttp.ClientSession) -> None:
    value = bytes(range(256)) * 1000
    assert (await http.put(u(P + "/keys/a/b/c"), data=value)).status == 204
    r = await http.get(u(P + "/keys/a/b/c"))
    assert r.status == 200 and await r.read() == value
    assert r.headers["Ledger-Priority"] == "eager" and r.headers["Accept-Ranges"] == "bytes"
    h = await http.head(u(P + "/keys/a/b/c"))
    assert h.status == 200 and int(h.headers["Content-Length"]) == len(value)
    r = await http.get(u(P + "/keys/a/b/c"), headers={"Range": "bytes=1000-1999"})
    assert r.status == 206 and await r.read() == value[1000:2000]
    assert r.headers["Content-Range"] == f"bytes 1000-1999/{len(value)}"
    r = await http.get(u(P + "/keys/a/b/c"), headers={"Range": "bytes=-10"})
    assert await r.read() == value[-10:]
    r = await http.get(u(P + "/keys/a/b/c?offset=5&length=7"))
    assert await r.read() == value[5:12]
    assert await _err(
        await http.get(u(P + "/keys/a/b/c"), headers={"Range": f"bytes={len(value)}-"})
    ) == (416, "range_not_satisfiable")
    assert (await http.put(u(P + "/keys/lazy?priority=lazy"), data=b"x")).status == 204
    assert (await http.get(u(P + "/keys/lazy"))).headers["Ledger-Priority"] == "lazy"
    assert (await http.delete(u(P + "/keys/a/b/c"))).status == 204
    assert await _err(await http.get(u(P + "/keys/a/b/c"))) == (404, "key_not_found")


async def test_binary_keys_with_nul_and_invalid_utf8(http: aiohttp.ClientSession) -> None:
    keys = [b"\x00", b"\x00\x01\xff", b"\xc3\x28", b"..", b".", b"a/./b", b"%41", b"\xff" * 100]
    for i, k in enumerate(keys):
        assert (await http.put(u(P + "/keys/" + quote(k)), data=b"v%d" % i)).status == 204
    for i, k in enumerate(keys):
        assert await (await http.get(u(P + "/keys/" + quote(k)))).read() == b"v%d" % i
    doc = await (await http.get(u(P + "/entries"))).json()
    assert [base64.b64decode(e["key"]) for e in doc["entries"]] == sorted(keys)
    # Binary ledger and page names too.
    assert (await http.put(u("/v1/ledgers/%00%FF/pages/%C3%28/keys/k"), data=b"v")).status == 204
    assert await (await http.get(u("/v1/ledgers/%00%FF/pages/%C3%28/keys/k"))).read() == b"v"


async def test_entries_ranges_and_continuation(http: aiohttp.ClientSession) -> None:
    ops = [{"op": "put", "key": b64(b"k%03d" % i), "value": b64(b"v%d" % i)} for i in range(250)]
    ops.append({"op": "put", "key": b64(b"other"), "value": b64(b"o")})
    r = await http.post(u(P + "/batch"), json={"ops": ops})
    assert r.status == 200 and (await r.json())["applied"] == 251
    seen: list[bytes] = []
    token = None
    while True:
        q = "?prefix=k&limit=100" + (f"&token={quote(token.encode())}" if token else "")
        doc = await (await http.get(u(P + "/entries" + q))).json()
        seen += [base64.b64decode(e["key"]) for e in doc["entries"]]
        assert len(doc["entries"]) <= 100
        token = doc["next"]
        if token is None:
            break
    assert seen == [b"k%03d" % i for i in range(250)]
    doc = await (await http.get(u(P + "/entries?start=k010&end=k013"))).json()
    assert [(base64.b64decode(e["key"]), base64.b64decode(e["value"])) for e in doc["entries"]] == [
        (b"k010", b"v10"),
        (b"k011", b"v11"),
        (b"k012", b"v12"),
    ]
    doc = await (await http.get(u(P + "/entries?start=k249&values=0"))).json()
    assert doc["entries"] == [
        {"key": b64(b"k249"), "priority": "eager", "size": 4},
        {"key": b64(b"other"), "priority": "eager", "size": 1},
    ]


async def test_batch_is_one_commit_and_history(http: aiohttp.ClientSession) -> None:
    await http.put(u(P + "/keys/gone"), data=b"x")
    before = (await (await http.get(u(P + "/heads"))).json())["heads"]
    ops = [
        {"op": "put", "key": b64(b"a"), "value": b64(b"1")},
        {"op": "put", "key": b64(b"b"), "value": b64(b"2"), "priority": "lazy"},
        {"op": "delete", "key": b64(b"gone")},
    ]
    assert (await http.post(u(P + "/batch"), json={"ops": ops})).status == 200
    heads = (await (await http.get(u(P + "/heads"))).json())["heads"]
    assert len(heads) == 1 and heads[0]["parents"] == [before[0]["id"]]
    hist = (await (await http.get(u(P + "/history?limit=10"))).json())["commits"]
    assert hist[0]["id"] == heads[0]["id"] and hist[-1]["generation"] == 0
    one = await (await http.get(u(P + "/commits/" + heads[0]["id"]))).json()
    assert one == heads[0]
    # Read at an older commit.
    old = before[0]["id"]
    assert await (await http.get(u(P + f"/keys/gone?at={old}"))).read() == b"x"
    doc = await (await http.get(u(P + f"/entries?at={old}"))).json()
    assert [base64.b64decode(e["key"]) for e in doc["entries"]] == [b"gone"]
    assert await _err(await http.get(u(P + "/commits/" + "00" * 32))) == (404, "commit_not_found")


async def test_clear(http: aiohttp.ClientSession) -> None:
    await http.put(u(P + "/keys/a"), data=b"1")
    assert (await http.post(u(P + "/clear"))).status == 204
    assert (await (await http.get(u(P + "/entries"))).json())["entries"] == []


async def test_errors_are_json_with_stable_codes(http: aiohttp.ClientSession) -> None:
    await http.put(u(P + "/keys/k"), data=b"v")
    assert await _err(await http.get(u("/v1/ledgers/nope/pages/x/keys/k"))) == (
        404,
        "ledger_not_found",
    )
    assert await _err(await http.get(u("/v1/ledgers/notes/pages/nope/entries"))) == (
        404,
        "page_not_found",
    )
    assert await _err(await http.get(u("/v1/ledgers/nope/pages"))) == (404, "ledger_not_found")
    assert await _err(await http.get(u("/v1/nothing"))) == (404, "not_found")
    assert await _err(await http.get(u("/v2/status"))) == (404, "not_found")
    assert await _err(await http.put(u(P + "/keys/" + "k" * 4097), data=b"v")) == (
        414,
        "key_too_large",
    )
    assert await _err(
        await http.put(u("/v1/ledgers/" + "l" * 129 + "/pages/p/keys/k"), data=b"v")
    ) == (413, "too_large")
    assert await _err(await http.post(u(P + "/batch"), data=b"{not json")) == (400, "bad_request")
    assert await _err(
        await http.post(u(P + "/batch"), json={"ops": [{"op": "put", "key": "!!", "value": ""}]})
    ) == (400, "bad_request")
    assert await _err(
        await http.post(u(P + "/batch"), json={"ops": [{"op": "jump", "key": ""}]})
    ) == (400, "bad_request")
    assert await _err(await http.post(u(P + "/batch"), json=[1, 2])) == (400, "bad_request")
    assert await _err(await http.get(u(P + "/entries?limit=abc"))) == (400, "bad_request")
    assert await _err(await http.get(u(P + "/entries?limit=0"))) == (400, "bad_request")
    assert await _err(await http.get(u(P + "/entries?token=***"))) == (400, "bad_request")
    assert await _err(await http.get(u(P + "/entries?at=zz"))) == (400, "bad_request")
    assert await _err(await http.put(u(P + "/keys/k?priority=urgent"), data=b"v")) == (
        400,
        "bad_request",
    )
    assert await _err(await http.get(u(P + "/keys/k"), headers={"Range": "bytes=2-1"})) == (
        400,
        "bad_request",
    )
    r = await http.request("PATCH", u(P + "/keys/k"))  # the endpoint, another method
    assert r.status == 405 and (await r.json())["error"]["code"] == "method_not_allowed"
    assert r.headers["Allow"] == "DELETE, GET, HEAD, PUT"
    r = await http.request("OPTIONS", u("/v1/status"))
    assert r.status == 405 and r.headers["Allow"] == "GET"
    # Nothing stored was touched by any of that.
    assert await (await http.get(u(P + "/keys/k"))).read() == b"v"


async def test_oversize_batch_body_is_413(http: aiohttp.ClientSession) -> None:
    big = json.dumps({"ops": [{"op": "put", "key": "", "value": "A" * (65 * 1024 * 1024)}]})
    r = await http.post(
        u(P + "/batch"), data=io.BytesIO(big.encode()), headers={"Content-Type": "application/json"}
    )
    assert r.status == 413 and (await r.json())["error"]["code"] == "too_large"


async def test_every_range_edge(http: aiohttp.ClientSession) -> None:
    """RFC 9110 14.1.2: a range that selects no byte is 416 (with ``bytes */size``),
    a malformed one 400; never a 206 with an impossible Content-Range."""
    await http.put(u(P + "/keys/ten"), data=b"0123456789")
    await http.put(u(P + "/keys/empty"), data=b"")
    cases = {
        "bytes=-0": (416, None, "bytes */10"),
        "bytes=0-0": (206, b"0", "bytes 0-0/10"),
        "bytes=9-": (206, b"9", "bytes 9-9/10"),
        "bytes=5-100": (206, b"56789", "bytes 5-9/10"),
        "bytes=-1": (206, b"9", "bytes 9-9/10"),
        "bytes=-10": (206, b"0123456789", "bytes 0-9/10"),
        "bytes=-11": (206, b"0123456789", "bytes 0-9/10"),
        "bytes=0-99999999999999999999": (206, b"0123456789", "bytes 0-9/10"),
        "bytes=-" + "9" * 5000: (206, b"0123456789", "bytes 0-9/10"),
        "bytes=10-": (416, None, "bytes */10"),
        "bytes=10-10": (416, None, "bytes */10"),
        "bytes=11-20": (416, None, "bytes */10"),
        "": (400, None, None),
        "bytes=": (400, None, None),
        "bytes=-": (400, None, None),
        "bytes=--1": (400, None, None),
        "bytes=+1-2": (400, None, None),
        "bytes= 1-2": (206, b"12", "bytes 1-2/10"),
        "bytes=1-2,4-5": (200, b"0123456789", None),  # several ranges: the whole value
        "lines=1-2": (200, b"0123456789", None),  # a unit it does not know: ignored
        "bytes=3-2": (400, None, None),
        "bytes=" + "9" * 5000 + "-": (416, None, "bytes */10"),
        "bytes=١-٢": (400, None, None),
    }
    for header, (status, body, content_range) in cases.items():
        r = await http.get(u(P + "/keys/ten"), headers={"Range": header})
        assert r.status == status, (header, r.status, await r.text())
        if content_range is not None:
            assert r.headers["Content-Range"] == content_range, header
        if body is not None:
            assert await r.read() == body
        else:
            code = {400: "bad_request", 416: "range_not_satisfiable"}[status]
            assert (await r.json())["error"]["code"] == code, header
    for header in ("bytes=0-", "bytes=-0", "bytes=0-0"):
        r = await http.get(u(P + "/keys/empty"), headers={"Range": header})
        assert r.status == 416 and r.headers["Content-Range"] == "bytes */0", header
    r = await http.get(u(P + "/keys/empty"), headers={"Range": "bytes=-1"})
    assert r.status == 200 and await r.read() == b""  # satisfiable: the whole (empty) value


async def test_offset_and_length_answer_like_a_range(http: aiohttp.ClientSession) -> None:
    """``?offset=&length=`` is 206 with Content-Range, like ``Range`` (it was a 200
    without one), and 416 when it selects no byte (found by the review)."""
    await http.put(u(P + "/keys/ten"), data=b"0123456789")
    r = await http.get(u(P + "/keys/ten?offset=1&length=2"))
    assert r.status == 206 and await r.read() == b"12"
    assert r.headers["Content-Range"] == "bytes 1-2/10"
    r = await http.get(u(P + "/keys/ten?offset=8"))
    assert r.status == 206 and await r.read() == b"89"
    for query, message in (
        ("offset=10", "offset 10 is at or past the end of the 10-byte value"),
        ("offset=5&length=0", "length 0 selects no byte of the 10-byte value"),
        ("offset=11", "offset 11 is at or past the end of the 10-byte value"),
        ("offset=" + "9" * 30, f"offset {'9' * 30} is at or past the end of the 10-byte value"),
    ):
        r = await http.get(u(P + f"/keys/ten?{query}"))
        assert r.status == 416, query
        assert r.headers["Content-Range"] == "bytes */10"
        # (before: 'offset 11 and length -1 select no byte', a length never sent)
        assert (await r.json())["error"]["message"] == message


def test_expect_100_continue_and_requests_the_router_never_saw(daemon: Daemon) -> None:
    """``Expect: 100-continue`` (curl sends it before large bodies) is answered before
    the body is sent; another expectation is 417; ``OPTIONS *`` is 404 ``not_found``."""

    def connect() -> socket.socket:
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(30)
        s.connect(str(daemon.socket))
        return s

    def rest(s: socket.socket) -> bytes:
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
        return answer

    with connect() as s:
        s.sendall(
            f"PUT {P}/keys/e HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
            "Expect: 100-continue\r\nConnection: close\r\n\r\n".encode()
        )
        assert s.recv(25) == b"HTTP/1.1 100 Continue\r\n\r\n"  # before any body is sent
        s.sendall(b"hello")
        assert rest(s).startswith(b"HTTP/1.1 204")
    with connect() as s:
        s.sendall(f"GET {P}/keys/e HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        assert rest(s).endswith(b"\r\n\r\nhello")
    with connect() as s:
        s.sendall(
            f"PUT {P}/keys/e HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n"
            "Expect: magic\r\nConnection: close\r\n\r\nx".encode()
        )
        assert rest(s).startswith(b"HTTP/1.1 417")
    with connect() as s:
        s.sendall(b"OPTIONS * HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        head, _, body = rest(s).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 404")
        assert json.loads(body) == {"error": {"code": "not_found", "message": "Not Found"}}


async def test_big_batches_go_one_at_a_time_and_small_ones_pass(
    daemon: Daemon, http: aiohttp.ClientSession
) -> None:
    """A batch of unknown length (chunked) or over ``BIG_BATCH_BYTES`` waits for the big
    batch under way (it cannot be done before), and is written once that one ends; a
    small batch does not wait, and is answered meanwhile."""
    reader, writer = await asyncio.open_unix_connection(str(daemon.socket))
    writer.write(
        f"POST {P}/batch HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
        "Expect: 100-continue\r\n\r\n".encode()
    )
    assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 100")
    first = b'{"ops": [{"op": "put", "key": "YQ==", "value": "MQ=="}'
    writer.write(b"%x\r\n%s\r\n" % (len(first), first))  # the first big batch, unfinished
    await writer.drain()
    ops = [{"op": "put", "key": b64(b"b%d" % i), "value": b64(b"v" * 60_000)} for i in range(90)]
    body = io.BytesIO(json.dumps({"ops": ops}).encode())  # over BIG_BATCH_BYTES
    second = asyncio.create_task(http.post(u(P + "/batch"), data=body))
    small = {"ops": [{"op": "put", "key": b64(b"s"), "value": b64(b"2")}]}
    assert (await http.post(u(P + "/batch"), json=small)).status == 200
    assert not second.done()  # it waits for the first
    writer.write(b"1\r\n]\r\n1\r\n}\r\n0\r\n\r\n")
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    writer.close()
    assert (await second).status == 200
    doc = await (await http.get(u(P + "/entries?values=false&limit=1000"))).json()
    assert len(doc["entries"]) == 92
