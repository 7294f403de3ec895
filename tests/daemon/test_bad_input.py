"""Bad input: each gets a clear error, the daemon stays up, nothing stored is lost."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import random
from pathlib import Path

import aiohttp
import pytest
from yarl import URL

from ledgerd.daemon import codec
from ledgerd.daemon import errors as ae
from ledgerd.daemon.codec import (
    OP_NAMES,
    _checked_batch_changes,
    batch_body_changes,
    batch_changes,
    parse_json,
)
from ledgerd.store import Priority, Repository
from ledgerd.store.sqlite.schema import FORMAT_VERSION, TRANSIENT
from tests.daemon.conftest import Daemon, start_daemon

FORMAT_DIR = str(FORMAT_VERSION)
"""The directory of the data directory's pages (``{data}/{FORMAT_VERSION}/ledgers``)."""

P = "/v1/ledgers/l/pages/p"


def u(path: str) -> URL:
    return URL("http://ledgerd" + path, encoded=True)


async def _raw(daemon: Daemon, data: bytes, read: bool = True) -> bytes:
    """Send raw bytes on a fresh connection; return what came back before it closed."""
    reader, writer = await asyncio.open_unix_connection(str(daemon.socket))
    writer.write(data)
    await writer.drain()
    got = b""
    if read:
        with contextlib.suppress(ConnectionResetError, TimeoutError):
            got = await asyncio.wait_for(reader.read(65536), 10)
    writer.close()
    with contextlib.suppress(ConnectionResetError, BrokenPipeError):
        await writer.wait_closed()
    return got


async def _alive_and_intact(http: aiohttp.ClientSession) -> None:
    r = await http.get(u("/v1/status"))
    assert r.status == 200
    assert await (await http.get(u(P + "/keys/precious"))).read() == b"keep me"


async def _check_store(daemon: Daemon) -> None:
    """After the daemon stopped: sound database, no half-written value, nothing leaked."""
    async with await Repository.open(daemon.data) as repo:
        page = await repo.ledger("l").page("p")
        assert (await page.db.read_all("PRAGMA integrity_check"))[0][0] == "ok"
        assert await page.get(b"precious") == b"keep me"
        assert not await page.contains(b"truncated") and not await page.contains(b"chunked")
        leaked = await page.db.read_all(
            f"SELECT count(*) FROM piece_status WHERE status = {TRANSIENT}"
        )
        assert leaked[0][0] == 0


async def test_truncated_and_abandoned_uploads(daemon: Daemon, http: aiohttp.ClientSession) -> None:
    await http.put(u(P + "/keys/precious"), data=b"keep me")
    # Content-Length promises 4 MiB, 1 MiB arrives, the client goes away.
    head = (
        f"PUT {P}/keys/truncated HTTP/1.1\r\nHost: ledgerd\r\n"
        f"Content-Length: {4 * 1024 * 1024}\r\n\r\n"
    ).encode()
    await _raw(daemon, head + b"x" * (1024 * 1024), read=False)
    # A chunked upload cut off mid-stream.
    chunk = b"y" * 65536
    body = b"".join(b"%x\r\n" % len(chunk) + chunk + b"\r\n" for _ in range(40))
    head = (
        f"PUT {P}/keys/chunked HTTP/1.1\r\nHost: ledgerd\r\nTransfer-Encoding: chunked\r\n\r\n"
    ).encode()
    await _raw(daemon, head + body, read=False)
    # A small body shorter than its Content-Length, then EOF from the client.
    await _raw(
        daemon,
        (f"PUT {P}/keys/truncated HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc").encode(),
        read=False,
    )
    await _alive_and_intact(http)
    r = await http.get(u(P + "/keys/truncated"))
    assert r.status == 404
    await http.close()
    assert daemon.stop() == 0
    await _check_store(daemon)


async def test_abandoned_download(daemon: Daemon, http: aiohttp.ClientSession) -> None:
    await http.put(u(P + "/keys/precious"), data=b"keep me")
    await http.put(u(P + "/keys/big"), data=io.BytesIO(b"z" * (20 * 1024 * 1024)))
    reader, writer = await asyncio.open_unix_connection(str(daemon.socket))
    writer.write(f"GET {P}/keys/big HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    await reader.readexactly(100_000)
    writer.transport.abort()
    await _alive_and_intact(http)
    assert len(await (await http.get(u(P + "/keys/big"))).read()) == 20 * 1024 * 1024


async def test_malformed_http(daemon: Daemon, http: aiohttp.ClientSession) -> None:
    await http.put(u(P + "/keys/precious"), data=b"keep me")
    for junk in (
        b"GARBAGE\r\n\r\n",
        b"GET /v1/status HTTP/9.9\r\n\r\n",
        b"\x00\xff\xfe\r\n\r\n",
        b"GET " + b"/x" * 40000 + b" HTTP/1.1\r\n\r\n",
        b"POST /v1/ledgers/l/pages/p/batch HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
    ):
        got = await _raw(daemon, junk)
        assert got == b"" or got.startswith(b"HTTP/1.")
    bad_json = [
        b"{",
        b"null",
        b'{"ops": 5}',
        b'{"ops": [null]}',
        b'{"ops": [{"op": "put"}]}',
        b'{"ops": [{"op": "put", "key": "a", "value": 7}]}',
        "\udcff".encode("utf-8", "surrogatepass"),
    ]
    for body in bad_json:
        r = await http.post(
            u(P + "/batch"), data=body, headers={"Content-Type": "application/json"}
        )
        assert r.status == 400, body
        assert (await r.json())["error"]["code"] == "bad_request"
    await _alive_and_intact(http)


async def test_bad_session_messages(daemon: Daemon, http: aiohttp.ClientSession) -> None:
    await http.put(u(P + "/keys/precious"), data=b"keep me")
    ws = await http.ws_connect(u("/v1/session"))
    await ws.send_str("not json")
    assert (await ws.receive_json())["error"]["code"] == "bad_request"
    await ws.send_bytes(b"\x00\x01")
    assert (await ws.receive_json())["ok"] is False
    await ws.send_str("[1, 2]")
    assert (await ws.receive_json())["error"]["code"] == "bad_request"
    for msg in (
        {"id": 1, "op": "begin"},
        {"id": 2, "op": "begin", "ledger": "!!", "page": "cA=="},
        {"id": 3, "op": "begin", "ledger": base64.b64encode(b"x" * 200).decode(), "page": "cA=="},
        {"id": 4, "op": "get", "txn": "nope", "key": ""},
        {"id": 5, "op": "watch", "ledger": "bA==", "page": "cA==", "prefix": 12},
    ):
        await ws.send_str(json.dumps(msg))
        reply = await ws.receive_json()
        assert reply["id"] == msg["id"] and reply["ok"] is False and reply["error"]["code"]
    await ws.close()
    await _alive_and_intact(http)


async def test_store_is_sound_after_a_barrage(
    daemon: Daemon, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    await http.put(u(P + "/keys/precious"), data=b"keep me")
    tasks = [
        _raw(
            daemon,
            b"PUT "
            + P.encode()
            + b"/keys/x%d HTTP/1.1\r\nContent-Length: 999999\r\n\r\npartial" % i,
            read=False,
        )
        for i in range(30)
    ]
    await asyncio.gather(*tasks)
    await _alive_and_intact(http)
    await http.close()
    assert daemon.stop() == 0
    await _check_store(daemon)


def _op(i: int, **fields: object) -> dict[str, object]:
    key = base64.b64encode(b"k%d" % i).decode()
    return {"op": "put", "key": key, "value": base64.b64encode(b"v%d" % i).decode(), **fields}


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("not an op", "ops[7] must be an object"),
        ({"op": "put", "key": "a2V5"}, "ops[7].value must be a base64 string"),
        ({"op": "put", "key": "a2V5", "value": "!!"}, "ops[7].value is not valid base64"),
        ({"op": "delete", "key": 5}, "ops[7].key must be a base64 string"),
        (
            {"op": "move", "key": "a2V5"},
            "ops[7].op must be 'put', 'delete', 'set_versionstamped_key' or"
            " 'set_versionstamped_value'",
        ),
        (_op(7, priority=1), "priority must be 'eager' or 'lazy', not 1"),
        (_op(7, priority="soon"), "priority must be 'eager' or 'lazy', not 'soon'"),
        ({"op": "put", "priority": "soon"}, "ops[7].key must be a base64 string"),
        ({"op": "nope"}, f"ops[7].op must be {OP_NAMES}"),  # not: key must be base64
        ({"key": "a2V5"}, f"ops[7].op must be {OP_NAMES}"),
    ],
)
def test_a_bad_batch_op_is_named(bad: object, message: str) -> None:
    """The lean loop for good batches hands a bad one to the checking loop."""
    ops = [_op(i) for i in range(10)]
    ops[7] = bad  # type: ignore[call-overload]
    with pytest.raises(ae.BadRequest) as e:
        batch_changes(ops)
    assert str(e.value) == message


def test_good_batch_ops_are_read_alike_on_both_loops() -> None:
    ops: list[object] = [_op(i) for i in range(5)]
    ops += [_op(5, priority="lazy"), _op(6, priority="EAGER"), {"op": "delete", "key": "a2V5"}]
    want: list[tuple[bytes, bytes | None, Priority]]
    want = [(b"k%d" % i, b"v%d" % i, Priority.EAGER) for i in range(5)]
    want += [(b"k5", b"v5", Priority.LAZY), (b"k6", b"v6", Priority.EAGER)]
    want += [(b"key", None, Priority.EAGER)]
    assert batch_changes(ops) == want
    assert _checked_batch_changes(ops) == want


def test_both_batch_loops_agree_on_random_ops() -> None:
    """The same changes, or the same error, for ops drawn from good and bad parts."""
    rnd = random.Random(3)
    parts: dict[str, list[object]] = {
        "op": ["put", "delete", "move", None, 1, "set_versionstamped_key"],
        "key": ["a2V5", "", "!!", 5, None, ["a"], "é"],
        "value": ["dmFsdWU=", "", "abc", None, 2.5],
        "priority": ["lazy", "EAGER", "", "soon", 1, True, None, "é"],
    }
    for _ in range(3000):
        ops: list[object] = []
        for _ in range(rnd.randrange(1, 4)):
            if rnd.random() < 0.05:
                ops.append(rnd.choice([[], "op", 7]))
                continue
            ops.append({f: rnd.choice(vs) for f, vs in parts.items() if rnd.random() < 0.8})
        outcomes: list[object] = []
        for parse in (batch_changes, _checked_batch_changes):
            try:
                outcomes.append(parse(ops))
            except ae.BadRequest as e:
                outcomes.append(str(e))
        assert outcomes[0] == outcomes[1], ops


# -- hostile input that used to be answered 500 (issue 13) ---------------------------

DEEP = b'{"ops": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
DEEP_SMALL = b'{"ops": ' + b"[" * 30_000 + b"]" * 30_000 + b"}"
BIG_INT = b'{"ops": [{"op": "put", "key": "", "value": "", "priority": ' + b"9" * 5000 + b"}]}"


@pytest.mark.parametrize(
    "timeout", ["abc", "9" * 5000, "nan", "inf", "-1", "0", "1e999", "5e-324", "0.0009"]
)
async def test_a_bad_sync_timeout_is_400_invalid_timeout(
    http: aiohttp.ClientSession, timeout: str
) -> None:
    """Below the documented minimum (a millisecond) a timeout is refused, not run:
    ``5e-324`` was answered 503 "did not finish within 4.94066e-324s"."""
    r = await http.post(u(f"/v1/sync?timeout={timeout}"))
    assert r.status == 400, await r.text()
    err = (await r.json())["error"]
    assert err["code"] == "invalid_timeout" and "at least 0.001" in err["message"], err
    r = await http.post(u("/v1/sync?timeout=0.001"))  # the minimum itself is taken
    assert r.status == 409 and (await r.json())["error"]["code"] == "conflict"  # (sync is off)


async def test_hostile_json_is_400_over_http_and_sessions(
    daemon: Daemon, http: aiohttp.ClientSession
) -> None:
    await http.put(u(P + "/keys/precious"), data=b"keep me")
    for body in (DEEP, BIG_INT, b"[" * 100_000):
        r = await http.post(u(P + "/batch"), data=body)
        assert r.status == 400, await r.text()
        assert (await r.json())["error"]["code"] == "bad_request"
    # A policy body is bounded far below a batch's (64 KiB): the same shapes within
    # the bound are 400, the ones above it 413 before they are read.
    for body in (DEEP_SMALL, BIG_INT, b"[" * 60_000):
        r = await http.put(u(P + "/policy"), data=body)
        assert r.status == 400, await r.text()
        assert (await r.json())["error"]["code"] == "bad_request"
    for body in (DEEP, b"[" * 100_000):
        r = await http.put(u(P + "/policy"), data=body)
        assert r.status == 413, await r.text()
        assert (await r.json())["error"]["code"] == "too_large"
    ws = await http.ws_connect(u("/v1/session"))
    nan = b'{"id": NaN, "op": "ping"}'  # not JSON (found by the review: it was echoed)
    for body in (DEEP, BIG_INT, b"[" * 100_000, nan, b'{"id": 1, "op": "ping", "x": Infinity}'):
        await ws.send_str(body.decode())
        reply = await ws.receive_json()
        assert reply["ok"] is False and reply["error"]["code"] == "bad_request", reply
    await ws.close()
    await _alive_and_intact(http)
    assert "Traceback" not in daemon.log_text()


@pytest.mark.parametrize(
    ("request_bytes", "status", "code"),
    [
        (b"G\x01T /v1/status HTTP/1.1\r\nHost: x\r\n\r\n", 400, "bad_request"),
        (b"GET /" + b"x" * 100_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414, "key_too_large"),
        (b"GET /v1/status HTTP/1.1\r\nHost: x\r\nX: " + b"y" * 9000 + b"\r\n\r\n", 400, None),
        (
            b"POST /v1/ledgers/l/pages/p/batch HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            400,
            "bad_request",
        ),
        (
            b"POST /v1/ledgers/l/pages/p/batch HTTP/1.1\r\nHost: x\r\n"
            b"Transfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
            400,
            "bad_request",
        ),
    ],
)
async def test_http_parser_errors_are_json(
    daemon: Daemon, request_bytes: bytes, status: int, code: str | None
) -> None:
    got = await _raw(daemon, request_bytes)
    head, _, body = got.partition(b"\r\n\r\n")
    assert head.split(b" ")[1] == b"%d" % status, got[:300]
    assert b"application/json" in head.lower(), got[:300]
    err = json.loads(body)["error"]
    assert err["message"] and err["code"] == (code or "bad_request")
    assert "Traceback" not in daemon.log_text()


async def test_a_client_leaving_mid_download_is_not_an_error(
    daemon: Daemon, http: aiohttp.ClientSession
) -> None:
    """``ledgerctl get ... | head -c 10``: the reader goes away; that is normal (DEBUG)."""
    await http.put(u(P + "/keys/precious"), data=b"keep me")
    await http.put(u(P + "/keys/big"), data=io.BytesIO(random.randbytes(8 * 1024 * 1024)))
    for close in ("abort", "close"):
        reader, writer = await asyncio.open_unix_connection(str(daemon.socket))
        writer.write(f"GET {P}/keys/big HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        await writer.drain()
        await reader.readexactly(10)
        if close == "abort":
            writer.transport.abort()
        else:
            writer.close()
    await _alive_and_intact(http)
    await http.close()
    assert daemon.stop() == 0
    log = daemon.log_text()
    assert "ERROR" not in log and "Traceback" not in log, log


async def test_a_client_leaving_mid_upload_is_not_an_error(
    daemon: Daemon, http: aiohttp.ClientSession
) -> None:
    """An upload the client abandons (Ctrl-C during ``ledgerctl put``) stores nothing
    and is normal: no ERROR, no traceback."""
    await http.put(u(P + "/keys/precious"), data=b"keep me")
    for how in ("abort", "close"):
        reader, writer = await asyncio.open_unix_connection(str(daemon.socket))
        writer.write(
            f"PUT {P}/keys/abandoned HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n".encode()
            + b"a" * 500
        )
        await writer.drain()
        if how == "abort":
            writer.transport.abort()
        else:
            writer.close()
    await _alive_and_intact(http)
    r = await http.get(u(P + "/keys/abandoned"))
    assert r.status == 404
    await http.close()
    assert daemon.stop() == 0
    log = daemon.log_text()
    assert "ERROR" not in log and "Traceback" not in log, log


async def test_a_bad_priority_is_refused_in_a_session_too(
    daemon: Daemon, http: aiohttp.ClientSession
) -> None:
    """A session put with priority 7 was stored as EAGER (found by the review)."""
    ws = await http.ws_connect(u("/v1/session"))
    await ws.send_json({"id": 1, "op": "begin", "ledger": "bA==", "page": "cA=="})
    txn = (await ws.receive_json())["txn"]
    for prio in (7, "later", [1]):
        put = {"id": 2, "op": "put", "txn": txn, "key": "aw==", "value": "dg==", "priority": prio}
        await ws.send_json(put)
        reply = await ws.receive_json()
        assert reply["ok"] is False and reply["error"]["code"] == "bad_request", reply
        assert "priority" in reply["error"]["message"]
    await ws.close()
    r = await http.post(
        u(P + "/batch"), json={"ops": [{"op": "put", "key": "aw==", "value": "", "priority": 7}]}
    )
    assert r.status == 400 and "7" in (await r.json())["error"]["message"]


async def test_a_refused_body_makes_no_page(daemon: Daemon, http: aiohttp.ClientSession) -> None:
    """A write that would create its page checks its arguments first: a refused one
    leaves no page, no ledger and no file behind (they were made before the body's
    paths, policy name or revision were checked), nor does a batch of no ops."""
    fresh = "/v1/ledgers/new/pages/q"
    refused = [
        ("PUT", fresh + "/policy", {"policy": "no-such-policy"}, "bad_request"),
        ("PUT", fresh + "/docs/c/_indexes/ix", {"partition": ""}, "bad_request"),
        ("PUT", fresh + "/docs/c/_indexes/ix", {"partition": "a..b"}, "bad_request"),
        ("PUT", fresh + "/docs/c/_indexes/ix", {"partition": "a", "sort": []}, "bad_request"),
        ("PUT", fresh + "/docs/c/_indexes/" + "n" * 300, {"partition": "a"}, "invalid_name"),
        ("POST", fresh + "/docs/c?new_rev=not-a-ulid", {"a": 1}, "invalid_id"),
    ]
    for method, path, body, code in refused:
        async with http.request(method, u(path), json=body) as r:
            assert (r.status, (await r.json())["error"]["code"]) == (400, code), path
    async with http.post(u(fresh + "/batch"), json={"ops": []}) as r:  # nothing to write
        assert (r.status, await r.json()) == (
            200,
            {"applied": 0, "versionstamp": None, "versionstamped": []},
        )
    async with http.get(u("/v1/ledgers")) as r:
        assert (await r.json())["ledgers"] == []
    assert not list((daemon.data / FORMAT_DIR / "ledgers").glob("*"))


async def test_a_document_too_large_makes_no_page(
    daemon: Daemon, http: aiohttp.ClientSession
) -> None:
    """A new document over max_document_bytes (its JSON text under the body limit of
    four times that) was refused 413 ``too_large`` only in the write, after its page
    and ledger were made: both stayed behind, empty."""
    data = io.BytesIO(json.dumps({"x": "a" * (1024 * 1024 + 1000)}).encode())
    async with http.post(u("/v1/ledgers/new/pages/q/docs/c"), data=data) as r:
        assert r.status == 413, await r.text()
        assert (await r.json())["error"]["code"] == "too_large"
    async with http.get(u("/v1/ledgers")) as r:
        assert (await r.json())["ledgers"] == []
    assert not list((daemon.data / FORMAT_DIR / "ledgers").glob("*"))
    async with http.post(u("/v1/ledgers/new/pages/q/docs/c"), json={"x": "a"}) as r:
        assert r.status == 201, await r.text()  # one under the limit is stored


async def test_a_session_watch_with_a_bad_prefix_makes_no_page(
    daemon: Daemon, http: aiohttp.ClientSession
) -> None:
    """A session's watch of a page not there yet made the page (and ledger) before it
    read its prefix: a prefix that is not base64 was refused 400 and left them behind."""
    ws = await http.ws_connect(u("/v1/session"))
    page = {"ledger": base64.b64encode(b"new").decode(), "page": "cQ=="}
    await ws.send_json({"id": 1, "op": "watch", **page, "prefix": "!not base64!"})
    reply = await ws.receive_json(timeout=10)
    assert reply["ok"] is False and reply["error"]["code"] == "bad_request", reply
    async with http.get(u("/v1/ledgers")) as r:
        assert (await r.json())["ledgers"] == []
    assert not list((daemon.data / FORMAT_DIR / "ledgers").glob("*"))
    await ws.send_json({"id": 2, "op": "watch", **page, "prefix": "YQ=="})
    assert (await ws.receive_json(timeout=10))["ok"] is True
    await ws.close()


async def test_a_revision_in_the_future_makes_no_page(
    daemon: Daemon, http: aiohttp.ClientSession
) -> None:
    """A new document whose ?new_rev= is further ahead of the clock than the tolerance
    was refused ``rev_in_future`` only in the write, after its page and ledger were
    made: both stayed behind, empty."""
    fresh = "/v1/ledgers/new/pages/q/docs/c"
    async with http.post(u(fresh + "?new_rev=7ZZZZZZZZZZZZZZZZZZZZZZZZZ"), json={"a": 1}) as r:
        assert (await r.json())["error"]["code"] == "rev_in_future", await r.text()
    async with http.get(u("/v1/ledgers")) as r:
        assert (await r.json())["ledgers"] == []
    assert not list((daemon.data / FORMAT_DIR / "ledgers").glob("*"))


async def test_a_small_value_whose_body_stalls_makes_no_page(short_tmp: Path) -> None:
    """A PUT of a small value to a page not there yet made the page (and ledger) before
    it read the body: a body that stopped short of its Content-Length was refused 408
    ``request_timeout`` and left them behind. A small body is read first now."""
    daemon = start_daemon(short_tmp, env={"LEDGERD_REQUEST_TIMEOUT": "1"})
    try:
        head = b"PUT /v1/ledgers/new/pages/q/keys/k HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n"
        got = await _raw(daemon, head + b"\r\nabcde")  # then silence: the timer ends it
        assert b" 408 " in got.split(b"\r\n")[0] and b"request_timeout" in got, got[:300]
        connector = aiohttp.UnixConnector(path=str(daemon.socket))
        async with (
            aiohttp.ClientSession(connector=connector) as http,
            http.get(u("/v1/ledgers")) as r,
        ):
            assert (await r.json())["ledgers"] == []
        assert not list((daemon.data / FORMAT_DIR / "ledgers").glob("*"))
    finally:
        assert daemon.stop() == 0, daemon.log_text()


@pytest.mark.parametrize("number", ["1_0", "%D9%A1", "%202", "%2B2", "2%20", "%EF%BC%92"])
@pytest.mark.parametrize("query", ["/entries?limit=", "/history?limit=", "/keys/precious?offset="])
async def test_a_query_integer_is_ascii_digits(
    http: aiohttp.ClientSession, query: str, number: str
) -> None:
    """int() would read '1_0' as 10, Arabic-Indic or full-width digits and blanks around
    them; a query integer is plain digits, as a Range header's positions are."""
    assert (await http.put(u(P + "/keys/precious"), data=b"keep me")).status == 204
    r = await http.get(u(P + query + number))
    assert r.status == 400, await r.text()
    assert (await r.json())["error"] == {
        "code": "bad_request",
        "message": f"query parameter {query.rsplit('?')[1][:-1]} must be an integer",
    }


def test_a_batch_body_is_taken_and_its_ops_dropped_as_decoded() -> None:
    """What the daemon runs on a thread for a big body: the body is taken out of its
    list, and the changes and stamp are those of the ops (a stamped op among them
    hands the rest to the checking loop, which goes on from there)."""
    ops: list[object] = [_op(i) for i in range(5)]
    template = b"t" + b"\xff" * 10 + (1).to_bytes(4, "little")
    ops.append(
        {
            "op": "set_versionstamped_key",
            "key": base64.b64encode(template).decode(),
            "value": "dg==",
        }
    )
    ops.append(_op(6))
    body = [json.dumps({"ops": ops}).encode()]
    changes, offset = batch_body_changes(body)
    assert body == [] and offset == 1
    assert changes == _checked_batch_changes(ops)
    consumed = list(ops)
    assert batch_changes(consumed, consume=True) == changes and consumed == [None] * 7
    with pytest.raises(ae.BadRequest, match="ops\\[1\\].key must be a base64"):
        batch_body_changes([json.dumps({"ops": [_op(0), {"op": "put"}]}).encode()])
    for bad in (b"\xff", b"[]", b'{"ops": {}}'):
        with pytest.raises(ae.BadRequest, match="batch body"):
            batch_body_changes([bad])


def _whole_body_changes(body: bytes) -> object:
    """The reference for :func:`batch_body_changes`: the body parsed whole."""
    try:
        doc = parse_json(body, "batch body")
        ops = doc.get("ops") if isinstance(doc, dict) else None
        if not isinstance(ops, list):
            raise ae.BadRequest('batch body must be {"ops": [...]}')
        return batch_changes(ops)
    except ae.BadRequest as e:
        return str(e)


@pytest.mark.parametrize("part", [1, 7, 64, codec.TEXT_PART])
def test_a_batch_body_parsed_op_by_op_reads_as_parsed_whole(
    part: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The op-at-a-time parse of a plain ``{"ops": [...]}`` body, its text decoded a part
    at a time, gives the same changes, or the same error, as parsing it whole, for
    bodies of many shapes and damages, whatever the parts' size."""
    monkeypatch.setattr(codec, "TEXT_PART", part)
    rnd = random.Random(11)
    blanks = ["", " ", "\n", " \t\r\n "]
    damages = [
        lambda t: t,
        lambda t: t[: rnd.randrange(len(t) + 1)],
        lambda t: t.replace("]", ",]", 1),
        lambda t: t.replace("{", '{"x": 1, ', 1),
        lambda t: t.rstrip() + ' , "ops": []}',
        lambda t: t.replace('"put"', '"p\\u0075t"', 1),
        lambda t: t.replace('"put"', "NaN", 1),
        lambda t: t.replace('"ops"', '"\\u006fps"', 1),
        lambda t: t + "x",
        lambda t: "[" + t + "]",
        lambda t: t.replace('"put"', '"\\ud800"', 1),
        lambda t: t.replace('"put"', '"p\u00e9t"', 1),
        lambda t: t.replace('"put"', '"p\xe9t"', 1),
        lambda t: t.replace("]", "12345]", 1),
        lambda t: t.replace("[", "[12345, ", 1),
    ]
    for _ in range(600):
        ops = [_op(i) if rnd.random() < 0.8 else {"op": "delete"} for i in range(rnd.randrange(4))]
        b = rnd.choice
        inner = (b(blanks) + "," + b(blanks)).join(json.dumps(op) for op in ops)
        text = f'{b(blanks)}{{{b(blanks)}"ops"{b(blanks)}:{b(blanks)}[{b(blanks)}{inner}'
        text += f"{b(blanks)}]{b(blanks)}}}{b(blanks)}"
        body = rnd.choice(damages)(text).encode()
        try:
            got: object = batch_body_changes([body])[0]
        except ae.BadRequest as e:
            got = str(e)
        assert got == _whole_body_changes(body), body
