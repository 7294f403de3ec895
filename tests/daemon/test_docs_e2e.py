"""Documents over HTTP, end to end through the real daemon: every operation, and bad
input answered with a stable code, storing nothing."""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.parse
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest

from tests.daemon.conftest import Daemon, start_daemon
from tests.daemon.test_cli import shared_daemon

MAX_DOCUMENT = 4096
MAX_LISTING = 8192


@pytest.fixture(scope="module")
def shared() -> Iterator[Daemon]:
    """One daemon for the module (small document and listing bounds); each test uses
    its own ledger."""
    yield from shared_daemon(
        {
            "LEDGERD_MAX_DOCUMENT_BYTES": str(MAX_DOCUMENT),
            "LEDGERD_MAX_LISTING_BYTES": str(MAX_LISTING),
        },
        "ld-docs-",
    )


@pytest.fixture
async def http(shared: Daemon) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(
        connector=aiohttp.UnixConnector(path=str(shared.socket)), base_url="http://ledgerd"
    ) as s:
        yield s


@pytest.fixture
def base(request: pytest.FixtureRequest) -> str:
    """A page of a ledger private to the running test: ``/v1/ledgers/L/pages/p``."""
    return f"/v1/ledgers/{re.sub(r'[^A-Za-z0-9_-]', '_', request.node.name)}/pages/p"


async def call(
    http: aiohttp.ClientSession,
    method: str,
    path: str,
    status: int,
    body: Any = None,
    *,
    data: bytes | str | None = None,
    headers: dict[str, str] | None = None,
) -> Any:
    """A request that must answer ``status``; its JSON body (None for 204)."""
    kw: dict[str, Any] = {"headers": headers}
    if body is not None:
        kw["json"] = body
    if data is not None:
        kw["data"] = data
    async with http.request(method, path, **kw) as r:
        text = await r.text()
        assert r.status == status, f"{method} {path}: {r.status} {text}"
        return json.loads(text) if text else None


async def fails(
    http: aiohttp.ClientSession, method: str, path: str, status: int, code: str, **kw: Any
) -> str:
    """A request refused with ``status`` and error ``code``; returns the message."""
    doc = await call(http, method, path, status, **kw)
    assert doc["error"]["code"] == code, doc
    message: str = doc["error"]["message"]
    return message


async def head_id(http: aiohttp.ClientSession, base: str) -> str:
    heads = (await call(http, "GET", base + "/heads", 200))["heads"]
    assert len(heads) == 1
    return str(heads[0]["id"])


# -- documents ---------------------------------------------------------------------


async def test_create_get_replace_delete_purge(http: aiohttp.ClientSession, base: str) -> None:
    docs = base + "/docs/people"
    async with http.post(docs, json={"name": "Ann", "age": 41}) as r:
        assert r.status == 201
        ann = await r.json()
        assert r.headers["ETag"] == f'"{ann["_meta"]["_rev"]}"'
    meta = ann["_meta"]
    assert ann["_data"] == {"name": "Ann", "age": 41} and ann["_attachments"] == []
    assert len(meta["_id"]) == len(meta["_rev"]) == 26 and meta["_createdAt"].endswith("Z")
    one = f"{docs}/{meta['_id']}"
    assert await call(http, "GET", one, 200) == ann
    assert await call(http, "GET", one.lower(), 200) == ann  # ULIDs read in any case

    # Replace with the expected revision (If-Match or ?rev=), then a stale one: 409.
    v2 = await call(
        http, "PUT", one, 200, {"name": "Ann", "age": 42}, headers={"If-Match": f'"{meta["_rev"]}"'}
    )
    assert v2["_meta"]["_rev"] > meta["_rev"] and "_updatedAt" in v2["_meta"]
    v3 = await call(http, "PUT", f"{one}?rev={v2['_meta']['_rev']}", 200, {"age": 43})
    await fails(http, "PUT", f"{one}?rev={meta['_rev']}", 409, "conflict", body={"x": 1})
    assert (await call(http, "GET", one, 200)) == v3

    bob = await call(http, "POST", docs, 201, {"name": "Bob"})
    listing = await call(http, "GET", docs, 200)
    assert [d["_meta"]["_id"] for d in listing["documents"]] == [meta["_id"], bob["_meta"]["_id"]]
    assert listing["next"] is None

    # Soft delete: hidden unless ?deleted=1; then purge leaves a tombstone.
    gone = await call(http, "DELETE", one, 200)
    assert gone["_meta"]["_deleted"] is True and gone["_data"] == {"age": 43}
    await fails(http, "GET", one, 404, "document_not_found")
    assert (await call(http, "GET", one + "?deleted=1", 200))["_meta"]["_deleted"] is True
    assert len((await call(http, "GET", docs, 200))["documents"]) == 1
    assert len((await call(http, "GET", docs + "?deleted=1", 200))["documents"]) == 2
    purged = await call(http, "POST", one + "/purge", 200)
    assert purged["_meta"]["_purged"] is True and purged["_data"] is None
    await fails(http, "POST", one + "/purge", 404, "document_not_found")
    await fails(http, "DELETE", one, 404, "document_not_found")


async def test_listing_pages_by_limit_and_body_size(http: aiohttp.ClientSession, base: str) -> None:
    docs = base + "/docs/c"
    ids = [
        (await call(http, "POST", docs, 201, {"n": i, "pad": "x" * 2000}))["_meta"]["_id"]
        for i in range(12)
    ]
    seen: list[str] = []
    token: str | None = None
    pages = 0
    while True:
        q = "?limit=5" + (f"&token={quote(token, safe='')}" if token else "")
        async with http.get(docs + q) as r:
            assert r.status == 200
            body = await r.read()
        doc = json.loads(body)
        assert len(body) <= MAX_LISTING and 1 <= len(doc["documents"]) <= 5
        seen += [d["_meta"]["_id"] for d in doc["documents"]]
        pages += 1
        token = doc["next"]
        if token is None:
            break
    assert seen == ids and pages > 12 // 5 + 1  # the byte bound cut pages short
    await fails(http, "GET", docs + "?limit=0", 400, "bad_request")
    await fails(http, "GET", docs + "?limit=1001", 400, "bad_request")
    await fails(http, "GET", docs + "?token=AAAA", 400, "bad_request")


async def test_bad_input_gets_a_code_and_stores_nothing(
    http: aiohttp.ClientSession, base: str
) -> None:
    # On a new page, a refused document does not even create the page.
    ledger = base.rsplit("/pages/", 1)[0]
    await fails(http, "POST", base + "/docs/c", 400, "invalid_document", data="{not json")
    await fails(http, "POST", base + "/docs/c", 400, "invalid_document", body={"_x": 1})
    await fails(http, "POST", base + "/docs/_c", 400, "invalid_name", body={"x": 1})
    await fails(http, "GET", ledger + "/pages", 404, "ledger_not_found")

    doc = await call(http, "POST", base + "/docs/c", 201, {"x": 1})
    one = f"{base}/docs/c/{doc['_meta']['_id']}"
    before = await head_id(http, base)
    rev = doc["_meta"]["_rev"]
    future = "7ZZZZZZZZZZZZZZZZZZZZZZZZZ"  # the largest ULID: far in the future
    bad: list[tuple[str, str, int, str, dict[str, Any]]] = [
        ("POST", base + "/docs/c", 400, "invalid_document", {"data": "[1,"}),
        ("POST", base + "/docs/c", 400, "invalid_document", {"data": "NaN"}),
        ("POST", base + "/docs/c", 400, "invalid_document", {"data": b"\xff"}),
        ("POST", base + "/docs/c", 400, "invalid_document", {"body": {"_id": "x"}}),
        ("POST", base + "/docs/c", 400, "invalid_document", {"data": "[" * 100 + "]" * 100}),
        ("POST", base + "/docs/c", 400, "invalid_document", {"data": str(2**64)}),
        ("POST", base + "/docs/c", 413, "too_large", {"body": {"x": "y" * MAX_DOCUMENT}}),
        ("PUT", one, 413, "too_large", {"body": {"x": "y" * MAX_DOCUMENT}}),
        ("PUT", one, 400, "invalid_document", {"body": {"_rev": rev}}),
        ("PUT", f"{one}?rev=01ARZ3NDEKTSV4RRFFQ69G5FAV", 409, "conflict", {"body": {"x": 2}}),
        ("PUT", f"{one}?rev=nope", 400, "invalid_id", {"body": {"x": 2}}),
        ("PUT", f"{one}?new_rev={future}", 400, "rev_in_future", {"body": {"x": 2}}),
        ("PUT", f"{one}?new_rev={rev}", 409, "conflict", {"body": {"x": 2}}),
        (
            "PUT",
            f"{one}?rev={rev}",
            400,
            "bad_request",
            {"body": {"x": 2}, "headers": {"If-Match": '"01ARZ3NDEKTSV4RRFFQ69G5FAV"'}},
        ),
        ("DELETE", f"{one}?rev=01ARZ3NDEKTSV4RRFFQ69G5FAV", 409, "conflict", {}),
        ("POST", f"{one}/purge?rev=01ARZ3NDEKTSV4RRFFQ69G5FAV", 409, "conflict", {}),
        ("GET", base + "/docs/c/_reserved", 400, "invalid_id", {}),
        ("GET", base + "/docs/c/a%00b", 400, "invalid_id", {}),  # no NUL in an id
        ("PUT", base + "/docs/c/" + "x" * 513, 400, "invalid_id", {"body": {"x": 2}}),
        ("PUT", base + "/docs/c/" + "%C3%A9" * 257, 400, "invalid_id", {"body": {"x": 2}}),
        ("DELETE", base + "/docs/c/_x", 400, "invalid_id", {}),
        # Not ULIDs, so ids a client may choose: none is there.
        ("GET", base + "/docs/c/not-a-ulid", 404, "document_not_found", {}),
        ("GET", base + "/docs/c/01ARZ3NDEKTSV4RRFFQ69G5FAU", 404, "document_not_found", {}),
        ("DELETE", base + "/docs/c/" + "I" * 26, 404, "document_not_found", {}),
        ("GET", base + "/docs/c/01ARZ3NDEKTSV4RRFFQ69G5FAV", 404, "document_not_found", {}),
        ("GET", base + "/docs/c/_indexes/nope/find?eq=1", 404, "index_not_found", {}),
        ("DELETE", base + "/docs/c/_indexes/nope", 404, "index_not_found", {}),
        ("GET", base + "/docs/c/_indexes/nope/find", 400, "bad_request", {}),
        ("PUT", base + "/docs/c/_indexes/_x", 400, "invalid_name", {"body": {"partition": "a"}}),
        ("PUT", base + "/docs/c/_indexes/i", 400, "bad_request", {"body": {"sort": "a"}}),
        ("PUT", base + "/docs/c/_indexes/i", 400, "bad_request", {"body": {"partition": "_a"}}),
        ("GET", base + "/docs/_changes?since=zz", 400, "bad_request", {}),
        ("GET", base + "/docs/_changes?since=" + "00" * 32, 404, "commit_not_found", {}),
    ]
    for method, path, status, code, kw in bad:
        await fails(http, method, path, status, code, **kw)
    assert await head_id(http, base) == before
    assert (await call(http, "GET", one, 200)) == doc


async def test_a_document_body_is_bounded_by_four_times_the_document_limit(
    shared: Daemon, http: aiohttp.ClientSession, base: str
) -> None:
    """A document's JSON text (and an index declaration's) is read up to four times
    ``max_document_bytes`` and no further; a Content-Length over it is refused before
    the body is read. Before, bodies up to ``max_batch_bytes`` (64 MiB) were read and
    parsed whole on the event loop: four of them took 1.2 GB and the daemon answered
    nothing, health included, for seconds."""
    limit = 4 * MAX_DOCUMENT
    doc = await call(http, "POST", base + "/docs/c", 201, data='{"x": 1}' + " " * (limit - 8))
    one = f"{base}/docs/c/{doc['_meta']['_id']}"
    before = await head_id(http, base)
    padded = '{"x": 2}' + " " * (limit - 7)  # small once encoded, but one byte too long
    message = await fails(http, "POST", base + "/docs/c", 413, "too_large", data=padded)
    assert f"over the {limit}-byte limit" in message
    await fails(http, "PUT", one, 413, "too_large", data=padded)
    index = '{"partition": "x"}' + " " * limit
    await fails(http, "PUT", base + "/docs/c/_indexes/i", 413, "too_large", data=index)
    assert await head_id(http, base) == before
    # A Content-Length over the bound is answered at once, its body never sent.
    reader, writer = await asyncio.open_unix_connection(str(shared.socket))
    try:
        writer.write(
            f"POST {base}/docs/c HTTP/1.1\r\nHost: x\r\nContent-Length: {64 * 2**20}\r\n"
            f"Content-Type: application/json\r\n\r\n{{".encode()
        )
        await writer.drain()
        status = await asyncio.wait_for(reader.readline(), 10)
        assert status.split()[1] == b"413"
    finally:
        writer.close()
    assert await head_id(http, base) == before


async def test_reads_of_a_page_without_documents(http: aiohttp.ClientSession, base: str) -> None:
    await call(http, "PUT", base + "/keys/k", 204, data="v")
    policy = await call(http, "GET", base + "/policy", 200)
    await fails(http, "GET", base + "/docs/c", 409, "not_a_document_page")
    await fails(http, "GET", base + "/docs/_changes", 409, "not_a_document_page")
    await fails(
        http,
        "PUT",
        base + "/docs/c/01ARZ3NDEKTSV4RRFFQ69G5FAV",
        409,
        "not_a_document_page",
        body={"x": 1},
        headers={"If-Match": "*"},  # a replace (a bare PUT creates: a write makes the page one)
    )
    assert await call(http, "GET", base + "/policy", 200) == policy  # still a plain page
    missing = base.replace("/pages/p", "/pages/nope")
    await fails(http, "GET", missing + "/docs/c", 404, "page_not_found")


# -- attachments -------------------------------------------------------------------


async def test_attachments(http: aiohttp.ClientSession, base: str) -> None:
    doc = await call(http, "POST", base + "/docs/c", 201, {"x": 1})
    one = f"{base}/docs/c/{doc['_meta']['_id']}"
    content = bytes(range(256)) * 4096  # 1 MiB, streamed in chunks

    async def chunks() -> AsyncIterator[bytes]:
        for i in range(0, len(content), 100_000):
            yield content[i : i + 100_000]

    async with http.post(
        one + "/attachments?filename=n%C3%A4me.bin",
        data=chunks(),
        headers={"Content-Type": "image/x-test"},
    ) as r:
        assert r.status == 201, await r.text()
        up = await r.json()
    att = up["attachment"]
    assert att["_filename"] == "näme.bin" and att["_contentType"] == "image/x-test"
    assert att["_length"] == len(content) and up["document"]["_attachments"] == [att]
    path = f"{one}/attachments/{att['_id']}"
    async with http.get(path) as r:
        assert r.status == 200 and r.headers["Content-Type"] == "image/x-test"
        assert "filename*=UTF-8''n%C3%A4me.bin" in r.headers["Content-Disposition"]
        assert await r.read() == content
    async with http.get(path, headers={"Range": "bytes=1000-1009"}) as r:
        assert r.status == 206 and r.headers["Content-Range"] == f"bytes 1000-1009/{len(content)}"
        assert await r.read() == content[1000:1010]
    async with http.get(path, headers={"Range": "bytes=-3"}) as r:
        assert r.status == 206 and await r.read() == content[-3:]
    async with http.get(f"{path}?offset=1000&length=10") as r:  # as for a key's value
        assert r.status == 206 and r.headers["Content-Range"] == f"bytes 1000-1009/{len(content)}"
        assert await r.read() == content[1000:1010]
    await fails(http, "GET", f"{path}?offset={len(content)}", 416, "range_not_satisfiable")
    async with http.head(path) as r:
        assert r.status == 200 and r.headers["Content-Length"] == str(len(content))
    await fails(
        http, "GET", path, 416, "range_not_satisfiable", headers={"Range": f"bytes={len(content)}-"}
    )
    await fails(http, "GET", path, 400, "bad_request", headers={"Range": "bytes=9-1"})

    # Replace it (same id), with a stale revision first.
    rev = up["document"]["_meta"]["_rev"]
    await fails(
        http,
        "PUT",
        f"{path}?filename=a.txt&rev={doc['_meta']['_rev']}",
        409,
        "conflict",
        data=b"new",
    )
    again = await call(
        http,
        "PUT",
        f"{path}?filename=a.txt&rev={rev}",
        200,
        data=b"new",
        headers={"Content-Type": "text/plain"},
    )
    assert again["attachment"]["_id"] == att["_id"] and again["attachment"]["_length"] == 3
    async with http.get(path) as r:
        assert r.headers["Content-Type"] == "text/plain" and await r.read() == b"new"

    # Bad uploads store nothing.
    before = await head_id(http, base)
    await fails(http, "POST", one + "/attachments", 400, "bad_request", data=b"x")
    await fails(
        http,
        "POST",
        f"{base}/docs/c/01ARZ3NDEKTSV4RRFFQ69G5FAV/attachments?filename=a",
        404,
        "document_not_found",
        data=b"x",
    )
    await fails(
        http,
        "PUT",
        f"{one}/attachments/01ARZ3NDEKTSV4RRFFQ69G5FAV?filename=a",
        404,
        "attachment_not_found",
        data=b"x",
    )
    await fails(
        http, "GET", f"{one}/attachments/01ARZ3NDEKTSV4RRFFQ69G5FAV", 404, "attachment_not_found"
    )
    assert await head_id(http, base) == before

    after = await call(http, "DELETE", path, 200)
    assert after["_attachments"] == []
    await fails(http, "GET", path, 404, "attachment_not_found")


# -- indexes -----------------------------------------------------------------------


async def test_indexes_and_queries(http: aiohttp.ClientSession, base: str) -> None:
    docs = base + "/docs/people"
    people = [("Ann", "Oslo", 41), ("Bob", "Oslo", 29), ("Cy", "Rome", 50), ("Di", "Oslo", 35)]
    made = {
        n: (await call(http, "POST", docs, 201, {"name": n, "city": c, "age": a}))["_meta"]["_id"]
        for n, c, a in people
    }
    ix = await call(
        http, "PUT", docs + "/_indexes/by_city", 200, {"partition": "city", "sort": "age"}
    )
    assert ix == {
        "collection": "people",
        "name": "by_city",
        "partition": "city",
        "sort": "age",
        "ready": ix["ready"],
    }
    listed = await call(http, "GET", docs + "/_indexes", 200)
    assert [i["name"] for i in listed["indexes"]] == ["by_city"]

    def q(**params: str) -> str:
        return (
            docs
            + "/_indexes/by_city/find?"
            + "&".join(f"{k}={quote(v, safe='')}" for k, v in params.items())
        )

    found = await call(http, "GET", q(eq='"Oslo"'), 200)
    assert [d["_data"]["name"] for d in found["documents"]] == ["Bob", "Di", "Ann"]
    found = await call(http, "GET", q(eq='"Oslo"', start="30", end="41"), 200)
    assert [d["_data"]["name"] for d in found["documents"]] == ["Di"]
    first = await call(http, "GET", q(eq='"Oslo"', limit="2"), 200)
    assert len(first["documents"]) == 2 and first["next"]
    rest = await call(http, "GET", q(eq='"Oslo"', limit="2", token=first["next"]), 200)
    assert [d["_data"]["name"] for d in rest["documents"]] == ["Ann"] and rest["next"] is None
    await fails(http, "GET", q(eq="Oslo"), 400, "bad_request")  # not JSON
    await fails(http, "GET", q(eq="[1]"), 400, "bad_request")  # not a scalar
    await fails(http, "GET", q(eq='"Oslo"', token="AAAA"), 400, "bad_request")

    # A deleted document leaves the results unless asked for.
    await call(http, "DELETE", f"{docs}/{made['Bob']}", 200)
    found = await call(http, "GET", q(eq='"Oslo"'), 200)
    assert [d["_data"]["name"] for d in found["documents"]] == ["Di", "Ann"]
    found = await call(http, "GET", q(eq='"Oslo"', deleted="1"), 200)
    assert len(found["documents"]) == 3

    # An indexed field's value may not hold '/': refused, nothing stored.
    before = await head_id(http, base)
    await fails(http, "POST", docs, 400, "invalid_document", body={"city": "a/b"})
    assert await head_id(http, base) == before

    assert await call(http, "POST", docs + "/_indexes/by_city/rebuild", 204) is None
    assert len((await call(http, "GET", q(eq='"Rome"'), 200))["documents"]) == 1
    assert await call(http, "DELETE", docs + "/_indexes/by_city", 204) is None
    await fails(http, "GET", q(eq='"Rome"'), 404, "index_not_found")


# -- the changes feed ----------------------------------------------------------------


async def test_changes_feed(http: aiohttp.ClientSession, base: str) -> None:
    docs = base + "/docs/c"
    a = await call(http, "POST", docs, 201, {"n": 1})
    b = await call(http, "POST", base + "/docs/other", 201, {"n": 2})
    everything = await call(http, "GET", base + "/docs/_changes", 200)
    assert {d["_meta"]["_id"] for d in everything["documents"]} == {
        a["_meta"]["_id"],
        b["_meta"]["_id"],
    }
    mark = everything["commit"]
    assert mark == await head_id(http, base)
    quiet = await call(http, "GET", f"{base}/docs/_changes?since={mark}", 200)
    assert quiet == {"commit": mark, "documents": [], "next": None}
    await call(http, "DELETE", f"{docs}/{a['_meta']['_id']}", 200)
    later = await call(http, "GET", f"{base}/docs/_changes?since={mark}", 200)
    assert [d["_meta"].get("_deleted") for d in later["documents"]] == [True]
    only = await call(http, "GET", f"{base}/docs/_changes?collection=other", 200)
    assert [d["_meta"]["_id"] for d in only["documents"]] == [b["_meta"]["_id"]]

    # Following: the backlog since `mark`, then one line per change, heartbeats between.
    async with http.get(f"{base}/docs/_changes?since={mark}&follow=1&heartbeat=0.05") as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("application/x-ndjson")

        async def line() -> dict[str, Any]:
            while True:
                raw = await r.content.readline()
                assert raw, "the feed ended"
                if raw.strip():
                    parsed: dict[str, Any] = json.loads(raw)
                    return parsed

        first = await line()
        assert first["commit"] == later["commit"]
        c = await call(http, "POST", docs, 201, {"n": 3})
        nxt = await line()
        assert [d["_meta"]["_id"] for d in nxt["documents"]] == [c["_meta"]["_id"]]
        assert nxt["commit"] == await head_id(http, base)
        head_at_c = nxt["commit"]
        heartbeat = await r.content.readline()  # nothing changes: an empty line
        assert heartbeat == b"\n"

    # A long change, a page at a time: `next` continues it up to the same head.
    made = [await call(http, "POST", docs, 201, {"n": i}) for i in range(7)]
    new_ids = sorted(d["_meta"]["_id"] for d in made)
    head = await head_id(http, base)
    pages, token = [], None
    while True:
        q = f"{base}/docs/_changes?since={head_at_c}&limit=3"
        q += f"&token={urllib.parse.quote(token)}" if token else ""
        pages.append(await call(http, "GET", q, 200))
        token = pages[-1]["next"]
        if token is None:
            break
    assert [len(p["documents"]) for p in pages] == [3, 3, 1]
    assert [d["_meta"]["_id"] for p in pages for d in p["documents"]] == new_ids
    assert [p["commit"] for p in pages] == [head_at_c, head_at_c, head]
    await fails(http, "GET", base + "/docs/_changes?token=!!", 400, "bad_request")
    await fails(http, "GET", base + "/docs/_changes?limit=0", 400, "bad_request")


async def test_follow_ends_when_the_daemon_stops(short_tmp: Path) -> None:
    d = start_daemon(short_tmp)
    try:
        async with aiohttp.ClientSession(
            connector=aiohttp.UnixConnector(path=str(d.socket)), base_url="http://ledgerd"
        ) as http:
            base = "/v1/ledgers/l/pages/p"
            await call(http, "POST", base + "/docs/c", 201, {"n": 1})
            async with http.get(base + "/docs/_changes?follow=1&heartbeat=0.1") as r:
                assert json.loads(await r.content.readline())["documents"]
                t0 = time.monotonic()
                d.proc.terminate()
                rest = await r.content.read()
                assert rest.strip() == b""
                assert time.monotonic() - t0 < 10
    finally:
        code = d.stop()
    assert code == 0, d.log_text()


# -- ledgerctl doc -------------------------------------------------------------------


def ctl(d: Daemon, *args: str, input: bytes | None = None) -> str:
    p = d.ledgerctl("doc", *args, input=input)
    assert (p.returncode, p.stderr) == (0, b""), f"ledgerctl doc {args}: {p}"
    return p.stdout.decode()


def ctl_fails(d: Daemon, code: int, *args: str) -> str:
    p = d.ledgerctl("doc", *args)
    assert p.returncode == code and p.stdout == b"", f"ledgerctl doc {args}: {p}"
    err = p.stderr.decode()
    assert err.startswith("ledgerctl: ") and "Traceback" not in err, err
    return err


def test_ledgerctl_doc(shared: Daemon, tmp_path: Path) -> None:
    lp = ("cli", "people")
    ann_id, rev = ctl(shared, "put", *lp, "people", '{"name": "Ann", "city": "Oslo"}').split()
    bob_id, _ = ctl(
        shared, "put", *lp, "people", "-", input=b'{"name": "Bob", "city": "Rome"}'
    ).split()
    doc = json.loads(ctl(shared, "get", *lp, "people", ann_id))
    assert doc["_meta"]["_rev"] == rev and doc["_data"]["name"] == "Ann"

    _, rev2 = ctl(
        shared,
        "put",
        *lp,
        "people",
        '{"name": "Ann", "city": "Oslo", "age": 42}',
        "--id",
        ann_id,
        "--rev",
        rev,
    ).split()
    err = ctl_fails(shared, 4, "put", *lp, "people", "{}", "--id", ann_id, "--rev", rev)
    assert "(conflict)" in err
    assert "(invalid_document)" in ctl_fails(shared, 2, "put", *lp, "people", '{"_x": 1}')
    assert "not valid JSON" in ctl_fails(shared, 2, "put", *lp, "people", "{nope")
    assert "(invalid_id)" in ctl_fails(shared, 2, "get", *lp, "people", "_nope")
    assert "(document_not_found)" in ctl_fails(shared, 1, "get", *lp, "people", "nope")
    ctl_fails(shared, 1, "get", *lp, "people", "01ARZ3NDEKTSV4RRFFQ69G5FAV")

    rows = ctl(shared, "ls", *lp, "people").splitlines()
    assert [r.split("\t")[:2] for r in rows] == [[ann_id, rev2], [bob_id, rows[1].split()[1]]]
    assert json.loads(rows[0].split("\t")[2]) == {"name": "Ann", "city": "Oslo", "age": 42}

    assert ctl(shared, "index", *lp, "people", "by_city", "--partition", "city").startswith(
        "by_city\t"
    )
    found = ctl(shared, "find", *lp, "people", "by_city", "--eq", "Oslo", "--json")
    assert [json.loads(x)["_meta"]["_id"] for x in found.splitlines()] == [ann_id]
    assert "no index 'nope'" in ctl_fails(shared, 1, "find", *lp, "people", "nope", "--eq", "1")
    listed = ctl(shared, "indexes", *lp, "people").splitlines()
    assert [line.split("\t")[:3] for line in listed] == [["by_city", '"city"', "-"]]
    assert json.loads(ctl(shared, "indexes", *lp, "people", "--json"))["name"] == "by_city"
    assert ctl(shared, "rebuild-index", *lp, "people", "by_city") == ""
    found = ctl(shared, "find", *lp, "people", "by_city", "--eq", "Oslo", "--json")
    assert [json.loads(x)["_meta"]["_id"] for x in found.splitlines()] == [ann_id]

    src = tmp_path / "photo.png"
    src.write_bytes(b"\x89PNG" + bytes(1000))
    att_id, _ = ctl(shared, "attach", *lp, "people", bob_id, str(src)).split()
    assert "is a directory" in ctl_fails(shared, 2, "attach", *lp, "people", bob_id, str(tmp_path))
    missing = str(tmp_path / "missing.png")
    assert "no such file" in ctl_fails(shared, 2, "attach", *lp, "people", bob_id, missing)
    got = shared.ledgerctl("doc", "attachment", *lp, "people", bob_id, att_id)
    assert got.returncode == 0 and got.stdout == src.read_bytes()
    out = tmp_path / "copy.png"
    ctl(shared, "attachment", *lp, "people", bob_id, att_id, "-o", str(out))
    assert out.read_bytes() == src.read_bytes()
    assert json.loads(ctl(shared, "get", *lp, "people", bob_id))["_attachments"][0] == {
        "_id": att_id,
        "_filename": "photo.png",
        "_contentType": "image/png",
        "_length": 1004,
    }
    second, _ = ctl(shared, "attach", *lp, "people", bob_id, str(src)).split()
    detached_id, _ = ctl(shared, "detach", *lp, "people", bob_id, second).split("\t")
    assert detached_id == bob_id
    assert len(json.loads(ctl(shared, "get", *lp, "people", bob_id))["_attachments"]) == 1

    first = json.loads(ctl(shared, "changes", *lp))
    assert {d["_meta"]["_id"] for d in first["documents"]} == {ann_id, bob_id}
    ctl(shared, "rm", *lp, "people", bob_id)
    later = json.loads(ctl(shared, "changes", *lp, "--since", first["commit"]))
    assert [d["_meta"]["_deleted"] for d in later["documents"]] == [True]
    assert ctl(shared, "ls", *lp, "people").splitlines() == [rows[0]]
    assert ctl(shared, "ls", *lp, "people", "--deleted").splitlines()[1].endswith("\tdeleted")
    ctl(shared, "purge", *lp, "people", bob_id)
    assert ctl(shared, "ls", *lp, "people", "--deleted").splitlines()[1].endswith("\tpurged")
    assert ctl(shared, "drop-index", *lp, "people", "by_city") == ""
    assert ctl(shared, "indexes", *lp, "people") == ""


async def test_index_paths_list_back_as_declared(http: aiohttp.ClientSession, base: str) -> None:
    """A path whose names hold a dot lists as the array of its names, so a listing
    declares the same index again; other paths list as dotted text. Before, ``["a.b"]``
    listed as ``"a.b"``, which declares ``["a", "b"]``."""
    docs = base + "/docs/c"
    await call(
        http, "POST", docs, 201, {"a.b": "flat", "a": {"b": "nested"}, "n": {"x.y": 1, "x": 2}}
    )
    declared = {
        "flat": {"partition": ["a.b"], "sort": ["n", "x.y"]},
        "nested": {"partition": ["a", "b"], "sort": "n.x"},
    }
    for name, body in declared.items():
        ix = await call(http, "PUT", f"{docs}/_indexes/{name}", 200, body)
        assert (ix["partition"], ix["sort"]) == {
            "flat": (["a.b"], ["n", "x.y"]),
            "nested": ("a.b", "n.x"),
        }[name]
    listed = (await call(http, "GET", docs + "/_indexes", 200))["indexes"]
    assert [(i["name"], i["partition"], i["sort"]) for i in listed] == [
        ("flat", ["a.b"], ["n", "x.y"]),
        ("nested", "a.b", "n.x"),
    ]
    # Declared again from the listing, each index finds what the original finds.
    for i in listed:
        body = {"partition": i["partition"], "sort": i["sort"]}
        await call(http, "PUT", f"{docs}/_indexes/{i['name']}2", 200, body)
    for ix in ("flat", "flat2", "nested", "nested2"):
        for value in ("flat", "nested"):
            q = f"{docs}/_indexes/{ix}/find?eq={quote(json.dumps(value), safe='')}"
            found = (await call(http, "GET", q, 200))["documents"]
            assert len(found) == (ix.startswith(value)), (ix, value)


def test_ledgerctl_doc_index_takes_a_json_array_of_names(shared: Daemon) -> None:
    """``--partition '["a.b"]'`` declares an index on the field named ``a.b``; dotted
    text declares a nested path. Before, the array was taken as a field's name."""
    lp = ("cli-paths", "p")
    doc_id, _ = ctl(shared, "put", *lp, "c", '{"a.b": "flat", "a": {"b": "nested"}}').split()
    ctl(shared, "index", *lp, "c", "flat", "--partition", '["a.b"]', "--sort", '["a", "b"]')
    ctl(shared, "index", *lp, "c", "nested", "--partition", "a.b")
    for ix, value in (("flat", "flat"), ("nested", "nested")):
        found = ctl(shared, "find", *lp, "c", ix, "--eq", value).splitlines()
        assert [row.split("\t")[0] for row in found] == [doc_id], ix
    assert ctl(shared, "find", *lp, "c", "flat", "--eq", "nested") == ""


async def test_integers_from_minus_2_63_to_2_64_less_one_are_kept(
    http: aiohttp.ClientSession, base: str
) -> None:
    """A document's integers are what its encoding (msgpack) stores: from -2**63 to
    2**64-1, read back exactly (listings, queries and the changes feed too); one
    past either end is 400 ``invalid_document``, nothing stored."""
    docs = base + "/docs/c"
    await call(http, "PUT", docs + "/_indexes/by_k", 200, {"partition": "k", "sort": "v"})
    kept = [-(2**63), 2**63 - 1, 2**63, 2**64 - 1]
    for v in kept:
        doc = await call(http, "POST", docs, 201, data=f'{{"k": 1, "v": {v}, "l": [{v}]}}')
        assert doc["_data"] == {"k": 1, "v": v, "l": [v]}
        got = await call(http, "GET", f"{docs}/{doc['_meta']['_id']}", 200)
        assert got["_data"]["v"] == v and got["_data"]["l"] == [v]
    listed = await call(http, "GET", docs, 200)
    assert [d["_data"]["v"] for d in listed["documents"]] == kept
    found = await call(http, "GET", docs + "/_indexes/by_k/find?eq=1", 200)
    assert sorted(d["_data"]["v"] for d in found["documents"]) == kept
    changes = await call(http, "GET", base + "/docs/_changes", 200)
    assert [d["_data"]["v"] for d in changes["documents"]] == kept
    before = await head_id(http, base)
    for v in (-(2**63) - 1, 2**64, 2**64 + 1, -(2**64)):
        message = await fails(http, "POST", docs, 400, "invalid_document", data=f'{{"v": {v}}}')
        assert str(v) in message and "2**64-1" in message
        await fails(http, "POST", docs, 400, "invalid_document", data=f'{{"l": [[{v}]]}}')
    assert await head_id(http, base) == before


async def test_an_empty_expected_revision_is_refused_not_ignored(
    http: aiohttp.ClientSession, base: str
) -> None:
    """``?rev=``, ``If-Match: ""`` (and ``ledgerctl doc put --rev "$REV"`` with REV
    unset) name no revision: 400 ``invalid_id``, as ``?new_rev=`` is, and nothing is
    written. Before, an empty expected revision was taken as none, and the write
    replaced (deleted, purged) whatever revision was current."""
    docs = base + "/docs/c"
    doc = await call(http, "POST", docs, 201, {"v": 1})
    one = f"{docs}/{doc['_meta']['_id']}"
    for method, path in (("PUT", one), ("DELETE", one), ("POST", one + "/purge")):
        body = {"v": 2} if method == "PUT" else None
        await fails(http, method, path + "?rev=", 400, "invalid_id", body=body)
        for empty in ('""', "", 'W/""'):
            await fails(
                http, method, path, 400, "invalid_id", body=body, headers={"If-Match": empty}
            )
    assert await call(http, "GET", one, 200) == doc


def test_ledgerctl_doc_put_with_an_empty_rev_is_refused(shared: Daemon) -> None:
    lp = ("cli_empty_rev", "p")
    doc_id, rev = ctl(shared, "put", *lp, "c", '{"v": 1}').split()
    assert "(invalid_id)" in ctl_fails(
        shared, 2, "put", *lp, "c", "{}", "--id", doc_id, "--rev", ""
    )
    assert "(invalid_id)" in ctl_fails(shared, 2, "rm", *lp, "c", doc_id, "--rev", "")
    assert json.loads(ctl(shared, "get", *lp, "c", doc_id))["_meta"]["_rev"] == rev


def test_ledgerctl_doc_help_is_for_users(shared: Daemon) -> None:
    """``ledgerctl doc --help`` says what the subcommands print, not the module's notes
    for developers (before: its docstring, with ``:class:`` and ``:func:`` roles and
    which module registers what)."""
    text = ctl(shared, "--help")
    assert "SUBCOMMAND" in text and "_id<TAB>_rev" in text
    for internal in (":class:", ":func:", ":mod:", "``", "This module"):
        assert internal not in text, text


async def test_an_integer_too_long_to_convert_is_named_in_the_message(
    http: aiohttp.ClientSession, base: str
) -> None:
    """An integer past Python's int-string conversion limit (4,300 digits) is refused with
    a message about the request, not Python's advice to the server's programmer (before:
    '... use sys.set_int_max_str_digits() to increase the limit'); a batch body too."""
    for path, body, code in (
        (base + "/docs/c", b'{"a": ' + b"9" * 5000 + b"}", "invalid_document"),
        (base + "/batch", b'{"ops": [], "x": -' + b"1" * 4301 + b"}", "bad_request"),
    ):
        message = await fails(http, "POST", path, 400, code, data=body)
        assert "sys." not in message and "integer of over 4300 digits" in message, message


async def test_commit_ids_in_queries_are_hex_digits_only(
    http: aiohttp.ClientSession, base: str
) -> None:
    """``since``, ``at`` and ``start`` are 400 ``bad_request`` when they hold anything but
    hex digits. Before, ``bytes.fromhex`` skipped blanks: ``since=%20`` was the empty
    commit id (404 ``commit 'is not in page``) and ``since=%20ID`` was ID."""
    await call(http, "POST", base + "/docs/c", 201, {"v": 1})
    head = await head_id(http, base)
    assert (await call(http, "GET", f"{base}/docs/_changes?since={head}", 200))["documents"] == []
    for query in (
        "/docs/_changes?since=%20",
        f"/docs/_changes?since=%20{head}",
        f"/docs/_changes?since={head[:2]}%20{head[2:]}",
        "/keys/k?at=%20",
        f"/entries?at={head}%0A",
        "/history?start=%20",
    ):
        message = await fails(http, "GET", base + query, 400, "bad_request")
        assert "hex" in message, (query, message)


async def test_if_match_star_is_any_current_revision(
    http: aiohttp.ClientSession, base: str
) -> None:
    """``If-Match: *`` (RFC 9110: any current representation) writes over whatever
    revision is current, and a missing document is still 404; before, it was 400
    ``invalid_id`` ("revision '*' is not a ULID")."""
    docs = base + "/docs/c"
    doc = await call(http, "POST", docs, 201, {"v": 1})
    one = f"{docs}/{doc['_meta']['_id']}"
    star = {"If-Match": "*"}
    new = await call(http, "PUT", one, 200, {"v": 2}, headers=star)
    assert new["_data"] == {"v": 2}
    await fails(http, "PUT", one + "?rev=*", 400, "invalid_id", body={})  # a header's syntax
    await call(http, "DELETE", one, 200, headers=star)
    missing = f"{docs}/01ARZ3NDEKTSV4RRFFQ69G5FAV"
    await fails(http, "PUT", missing, 404, "document_not_found", body={}, headers=star)


async def test_a_continuation_token_pasted_into_a_url_as_is_works(
    http: aiohttp.ClientSession, base: str
) -> None:
    """Tokens of entries are standard base64, so they hold ``+``, which a query string
    reads as a blank unless percent-encoded; base64 holds no blank, so a blank in a
    token is taken as ``+``, and ``?token=NEXT`` pasted as is continues the listing.
    Before, such a token was 400 "token is not valid base64" (for entries and for
    documents). Documents' tokens are URL-safe base64 without padding: nothing in them
    to escape; one sent in standard base64 is read too."""
    async with http.put(base + "/keys/a", data=b"1") as r:
        assert r.status == 204
    async with http.put(base + "/keys/%FB%EF%BE", data=b"2") as r:  # base64: '++++'
        assert r.status == 204
    first = await call(http, "GET", base + "/entries?limit=1", 200)
    assert "+" in first["next"]
    rest = await call(http, "GET", f"{base}/entries?limit=1&token={first['next']}", 200)
    assert [e["key"] for e in rest["entries"]] == ["++++"]

    docs = base + "/docs/c"
    for _ in range(40):
        await call(http, "POST", docs, 201, {})
    seen, tokens, token = 0, [], ""
    while True:
        page = await call(http, "GET", f"{docs}?limit=1&token={token}", 200)
        seen += len(page["documents"])
        if page["next"] is None:
            break
        token = page["next"]
        tokens.append(token)
    assert seen == 40 and all(re.fullmatch(r"[A-Za-z0-9_-]+", t) for t in tokens)
    assert any(c in t for t in tokens for c in "-_")  # (the alphabets differ there)
    for t in tokens:  # the same token in standard base64 continues too
        std = t.replace("-", "+").replace("_", "/") + "=" * (-len(t) % 4)
        page = await call(http, "GET", f"{docs}?limit=1&token={quote(std)}", 200)
        assert len(page["documents"]) == 1


def test_ledgerctl_doc_put_refuses_a_number_past_every_double_locally(shared: Daemon) -> None:
    """``1e400`` parses as infinity; ``doc put`` refuses it as the JSON it was given
    (exit 2, nothing sent). Before, the client sent it on as ``Infinity`` and printed
    the daemon's "not valid JSON: Infinity is not a JSON value", a word nobody typed."""
    for text in ('{"a": 1e400}', "[-1e999]"):
        err = ctl_fails(shared, 2, "put", "cli_inf", "p", "c", text)
        assert "Infinity" not in err and "past the largest double" in err, err
    err = ctl_fails(shared, 2, "put", "cli_inf", "p", "c", '{"a": NaN}')
    assert "NaN is not a JSON value" in err, err
    assert shared.ledgerctl("ledgers").stdout.decode().count("cli_inf") == 0


async def test_a_collection_named_with_a_nul_is_not_part_of_another(
    http: aiohttp.ClientSession, base: str
) -> None:
    """``a%00b`` once showed in the listing and changes of ``a``, and an index on ``a``
    failed to build: every query of it answered 500 ``internal``."""
    docs = base + "/docs"
    inner = (await call(http, "POST", docs + "/a%00b", 201, {"city": "X"}))["_meta"]["_id"]
    outer = (await call(http, "POST", docs + "/a", 201, {"city": "X"}))["_meta"]["_id"]
    listed = await call(http, "GET", docs + "/a", 200)
    assert [d["_meta"]["_id"] for d in listed["documents"]] == [outer]
    changed = await call(http, "GET", docs + "/_changes?collection=a", 200)
    assert [d["_meta"]["_id"] for d in changed["documents"]] == [outer]
    await call(http, "PUT", docs + "/a/_indexes/by_city", 200, {"partition": "city"})
    found = await call(http, "GET", docs + "/a/_indexes/by_city/find?eq=%22X%22", 200)
    assert [d["_meta"]["_id"] for d in found["documents"]] == [outer]
    listed = await call(http, "GET", docs + "/a%00b", 200)
    assert [d["_meta"]["_id"] for d in listed["documents"]] == [inner]
    # and an equality on "a" is not one on "a\0b"
    await call(http, "POST", docs + "/a", 201, {"city": "X\u0000Y"})
    found = await call(http, "GET", docs + "/a/_indexes/by_city/find?eq=%22X%22", 200)
    assert [d["_meta"]["_id"] for d in found["documents"]] == [outer]


async def test_a_malformed_document_body_is_corrupt_not_internal(
    http: aiohttp.ClientSession, base: str
) -> None:
    """A body that is not a document record (written through the key API) answered
    500 ``internal`` (a bug, with a traceback) to every read of it."""
    from ledgerd.store.documents import doclayout
    from ledgerd.store.documents.docmodel import parse_ulid

    docs = base + "/docs/c"
    doc_id = (await call(http, "POST", docs, 201, {"k": 1}))["_meta"]["_id"]
    key = quote(doclayout.body_key("c", parse_ulid(doc_id)), safe="")
    await call(http, "PUT", f"{base}/keys/{key}", 204, data=b"not a record")
    await head_id(http, base)  # (`heads` commits the journal: listings read commits)
    for method, path in [
        ("GET", f"{docs}/{doc_id}"),
        ("PUT", f"{docs}/{doc_id}"),
    ]:
        message = await fails(http, method, path, 500, "corrupt", body={"k": 2})
        assert doc_id in message


async def test_a_damaged_body_is_reported_and_listings_go_on(
    http: aiohttp.ClientSession, base: str
) -> None:
    """A body that is not a document record failed the whole listing of its collection
    (500 ``corrupt``, every page after it too: no token past it) and every page of the
    changes feed that held it, for good. Listings and the feed now go on, and name it
    under ``damaged`` with code ``corrupt``; reading it alone stays 500 ``corrupt``."""
    from ledgerd.store.documents import doclayout
    from ledgerd.store.documents.docmodel import parse_ulid

    docs = base + "/docs/c"
    ids = [(await call(http, "POST", docs, 201, {"k": i}))["_meta"]["_id"] for i in range(3)]
    since = await head_id(http, base)
    key = quote(doclayout.body_key("c", parse_ulid(ids[1])), safe="")
    await call(http, "PUT", f"{base}/keys/{key}", 204, data=b"not a record")
    await head_id(http, base)
    listed, damaged, token = [], [], ""
    while True:
        page = await call(http, "GET", f"{docs}?limit=1&token={token}", 200)
        listed += [d["_meta"]["_id"] for d in page["documents"]]
        damaged += page.get("damaged", [])
        if page["next"] is None:
            break
        token = page["next"]
    assert listed == [ids[0], ids[2]]
    assert [(d["_id"], d["collection"], d["code"]) for d in damaged] == [(ids[1], "c", "corrupt")]
    assert ids[1] in damaged[0]["message"]
    changed = await call(http, "GET", f"{base}/docs/_changes?since={since}", 200)
    assert changed["documents"] == [] and [d["_id"] for d in changed["damaged"]] == [ids[1]]
    async with http.get(f"{base}/docs/_changes?since={since}&follow=1") as r:
        line = json.loads(await r.content.readline())
    assert line["documents"] == [] and [d["_id"] for d in line["damaged"]] == [ids[1]]
    await fails(http, "GET", f"{docs}/{ids[1]}", 500, "corrupt")
    purged = await call(http, "POST", f"{docs}/{ids[1]}/purge", 200)
    assert purged["_meta"]["_purged"] is True
    page = await call(http, "GET", docs, 200)
    assert "damaged" not in page and len(page["documents"]) == 2


async def _newer_layout(http: aiohttp.ClientSession, base: str, doc_id: str) -> bytes:
    """Write a document's head and a body of layout 2 through the key API, as a newer
    ledgerd's would come through sync; the body."""
    import msgpack

    from ledgerd.store.documents import doclayout
    from ledgerd.store.documents.docmodel import RevClock, parse_ulid

    raw, rev = parse_ulid(doc_id), RevClock().next()
    body: bytes = msgpack.packb([2, rev, 0, 1, None, None, None, {"k": "new"}, []])
    head = doclayout.encode_head(rev, doclayout.State.LIVE)
    for key, value in [(doclayout.head_key("c", raw), head), (doclayout.body_key("c", raw), body)]:
        await call(http, "PUT", f"{base}/keys/{quote(key, safe='')}", 204, data=value)
    await head_id(http, base)  # (commits the journal: listings read commits)
    return body


async def test_a_record_of_a_newer_layout_is_unsupported_layout(
    http: aiohttp.ClientSession, base: str
) -> None:
    """A body of layout 2 (a newer ledgerd's) shaped as layout 1 was served, replaced
    and deleted as a layout 1 document; of another shape it was 500 ``corrupt`` and
    ``purge`` wrote a tombstone over it, for every peer. Now each call on it is 409
    ``unsupported_layout`` and stores nothing; listings and the changes feed name it
    under ``damaged`` with that code."""
    from ledgerd.store.documents import doclayout
    from ledgerd.store.documents.docmodel import parse_ulid

    docs = base + "/docs/c"
    ids = [(await call(http, "POST", docs, 201, {"k": i}))["_meta"]["_id"] for i in range(3)]
    since = await head_id(http, base)
    body = await _newer_layout(http, base, ids[1])
    head = await head_id(http, base)
    one = f"{docs}/{ids[1]}"
    for method, path in [
        ("GET", one),
        ("PUT", one),
        ("DELETE", one),
        ("POST", one + "/purge"),
        ("POST", one + "/attachments?filename=a"),
    ]:
        message = await fails(http, method, path, 409, "unsupported_layout", body={"k": 2})
        assert ids[1] in message and "layout 2" in message, message
    assert await head_id(http, base) == head
    key = quote(doclayout.body_key("c", parse_ulid(ids[1])), safe="")
    async with http.get(f"{base}/keys/{key}") as r:
        assert r.status == 200 and await r.read() == body
    listed = await call(http, "GET", docs, 200)
    assert [d["_meta"]["_id"] for d in listed["documents"]] == [ids[0], ids[2]]
    assert [(d["_id"], d["code"]) for d in listed["damaged"]] == [(ids[1], "unsupported_layout")]
    changed = await call(http, "GET", f"{base}/docs/_changes?since={since}", 200)
    assert changed["documents"] == []
    assert [(d["_id"], d["code"]) for d in changed["damaged"]] == [(ids[1], "unsupported_layout")]


def test_ledgerctl_doc_names_a_record_of_a_newer_layout(shared: Daemon) -> None:
    """``ledgerctl doc ls`` lists the rest and names it on stderr (exit 4, as for a
    damaged one); ``doc purge`` of it is refused with ``unsupported_layout``."""
    import msgpack

    from ledgerd.daemon.client import Client
    from ledgerd.store.documents import doclayout
    from ledgerd.store.documents.docmodel import RevClock, parse_ulid

    with Client(shared.socket) as c:
        docs = c.documents("cli_newer", "p")
        ids = [docs.create("c", {"n": i})["_meta"]["_id"] for i in range(3)]
        raw, rev = parse_ulid(ids[1]), RevClock().next()
        head = doclayout.encode_head(rev, doclayout.State.LIVE)
        c.put("cli_newer", "p", doclayout.head_key("c", raw), head)
        c.put("cli_newer", "p", doclayout.body_key("c", raw), msgpack.packb([3, "x"]))
        c.heads("cli_newer", "p")
    p = shared.ledgerctl("doc", "ls", "cli_newer", "p", "c")
    assert p.returncode == 4, p
    assert [line.split("\t")[0] for line in p.stdout.decode().splitlines()] == [ids[0], ids[2]]
    err = p.stderr.decode()
    assert ids[1] in err and "layout 3" in err and "Traceback" not in err, err
    p = shared.ledgerctl("doc", "purge", "cli_newer", "p", "c", ids[1])
    assert p.returncode == 4 and "unsupported_layout" in p.stderr.decode(), p


async def test_an_attachment_sent_with_an_empty_content_type_is_octet_stream(
    http: aiohttp.ClientSession, base: str
) -> None:
    """An empty (or blank) ``Content-Type`` names no type: it was stored as it came and
    served back as ``Content-Type:`` with no media type, which no client can read."""
    one = (
        f"{base}/docs/c/"
        + (await call(http, "POST", base + "/docs/c", 201, {"x": 1}))["_meta"]["_id"]
    )
    for sent in ("", " "):
        async with http.post(
            one + "/attachments?filename=f", data=b"abc", headers={"Content-Type": sent}
        ) as r:
            assert r.status == 201, await r.text()
            att = (await r.json())["attachment"]
        assert att["_contentType"] == "application/octet-stream"
        async with http.get(f"{one}/attachments/{att['_id']}") as r:
            assert r.headers["Content-Type"] == "application/octet-stream"
            assert await r.read() == b"abc"


async def test_continuation_tokens_are_bound_to_their_listing(
    http: aiohttp.ClientSession, base: str
) -> None:
    """A listing's token sent for another collection, or a ``find`` token with another
    ``eq``, answered from its position in that other listing (documents before it
    silently skipped); now both are 400 ``bad_request``, as is a garbled token and one
    of an older ledgerd."""
    docs = base + "/docs"
    for coll in ["a", "b"]:
        for i in range(3):
            await call(http, "POST", f"{docs}/{coll}", 201, {"city": "X", "n": i})
    page = await call(http, "GET", f"{docs}/a?limit=1", 200)
    token = page["next"]
    await call(http, "GET", f"{docs}/a?limit=1&token={token}", 200)
    message = await fails(http, "GET", f"{docs}/b?token={token}", 400, "bad_request")
    assert "another listing" in message
    await fails(http, "GET", f"{docs}/a?deleted=1&token={token}", 400, "bad_request")
    garbled = token[:-2] + ("A" if token[-2] != "A" else "B") + token[-1]
    await fails(http, "GET", f"{docs}/a?token={garbled}", 400, "bad_request")
    older = "AY" + "A" * 20  # 16 bytes: a listing token of an older ledgerd
    message = await fails(http, "GET", f"{docs}/a?token={older}", 400, "bad_request")
    assert "older ledgerd" in message

    await call(http, "PUT", f"{docs}/a/_indexes/by_city", 200, {"partition": "city"})
    await call(http, "POST", f"{docs}/a", 201, {"city": "Y"})
    find = f"{docs}/a/_indexes/by_city/find"
    got = await call(http, "GET", f"{find}?eq=%22X%22&limit=1", 200)
    token = got["next"]
    await call(http, "GET", f"{find}?eq=%22X%22&limit=1&token={token}", 200)
    message = await fails(http, "GET", f"{find}?eq=%22Y%22&token={token}", 400, "bad_request")
    assert "another listing" in message
    changes = f"{docs}/_changes?collection=a&limit=1"
    token = (await call(http, "GET", changes, 200))["next"]
    await fails(http, "GET", f"{docs}/_changes?collection=b&token={token}", 400, "bad_request")


async def test_null_and_empty_query_values_are_refused_or_mean_absent(
    http: aiohttp.ClientSession, base: str
) -> None:
    """``end=null`` read as no bound (null is the lowest sort value: as a bound it
    would select nothing), ``collection=`` on the changes feed read as every
    collection; both are now 400, with a message saying what to send."""
    docs = base + "/docs/c"
    await call(http, "PUT", docs + "/_indexes/by_city", 200, {"partition": "city", "sort": "n"})
    for n in [None, 1, 2]:
        await call(http, "POST", docs, 201, {"city": "X", "n": n})
    find = docs + "/_indexes/by_city/find?eq=%22X%22"
    assert len((await call(http, "GET", find, 200))["documents"]) == 3
    for bad in ["end=null", "start=null", "end=", "start=%20", "end=nul"]:
        message = await fails(http, "GET", f"{find}&{bad}", 400, "bad_request")
        assert bad.split("=")[0] in message
    assert "leave it out" in await fails(http, "GET", f"{find}&end=null", 400, "bad_request")
    await fails(http, "GET", docs + "/_indexes/by_city/find?eq=", 400, "bad_request")
    # null is a value like any other for eq (documents with a null partition value)
    assert (await call(http, "GET", find.replace("%22X%22", "null"), 200))["documents"] == []
    # empty optional values are left out: limit, token, since, deleted
    assert len((await call(http, "GET", f"{find}&limit=&token=&deleted=", 200))["documents"]) == 3
    assert len((await call(http, "GET", f"{docs}?limit=&token=", 200))["documents"]) == 3
    await call(http, "GET", base + "/docs/_changes?since=", 200)
    await fails(http, "GET", base + "/docs/_changes?collection=", 400, "invalid_name")


def test_clients_and_ledgerctl_doc_ls_name_a_damaged_document(shared: Daemon) -> None:
    """The Python clients yielded a listing's documents and dropped its ``damaged``
    ones unseen; ``on_damaged`` is called with each (a warning is logged without it),
    and ``ledgerctl doc ls`` lists the rest, names it on stderr and exits 4."""
    from ledgerd.daemon.client import Client
    from ledgerd.store.documents import doclayout
    from ledgerd.store.documents.docmodel import parse_ulid

    with Client(shared.socket) as c:
        docs = c.documents("cli_damaged", "p")
        ids = [docs.create("c", {"n": i})["_meta"]["_id"] for i in range(3)]
        c.put("cli_damaged", "p", doclayout.body_key("c", parse_ulid(ids[1])), b"not a record")
        c.heads("cli_damaged", "p")  # (commits the journal: listings read commits)
        damaged: list[dict[str, Any]] = []
        listed = [d["_meta"]["_id"] for d in docs.list_documents("c", on_damaged=damaged.append)]
        assert listed == [ids[0], ids[2]] and [d["_id"] for d in damaged] == [ids[1]]
    p = shared.ledgerctl("doc", "ls", "cli_damaged", "p", "c")
    assert p.returncode == 4, p
    assert [line.split("\t")[0] for line in p.stdout.decode().splitlines()] == [ids[0], ids[2]]
    err = p.stderr.decode()
    assert err.startswith("ledgerctl: ") and ids[1] in err and "Traceback" not in err, err


def test_find_names_a_document_with_no_json_form_as_ls_does(shared: Daemon) -> None:
    """``find`` answers ``damaged`` too (a record whose data has no JSON form, still
    indexed), but the clients' ``find`` took no ``on_damaged`` and ``ledgerctl doc
    find`` listed the rest and exited 0 (a warning in the log at most), where ``ls``
    names it on stderr and exits 4."""
    import msgpack

    from ledgerd.daemon.client import Client
    from ledgerd.store.documents import doclayout
    from ledgerd.store.documents.docmodel import parse_ulid

    with Client(shared.socket) as c:
        docs = c.documents("find_damaged", "p")
        docs.declare_index("c", "by_k", "k")
        made = [docs.create("c", {"k": 1, "n": i})["_meta"] for i in range(3)]
        raw_rev = parse_ulid(made[1]["_rev"])
        ms = int.from_bytes(raw_rev[:6], "big")
        record = [1, raw_rev, 0, ms, None, None, None, {"k": 1, "b": b"x"}, []]
        key = doclayout.body_key("c", parse_ulid(made[1]["_id"]))
        c.put("find_damaged", "p", key, msgpack.packb(record, use_bin_type=True))
        c.heads("find_damaged", "p")
        damaged: list[dict[str, Any]] = []
        found = [d["_meta"]["_id"] for d in docs.find("c", "by_k", 1, on_damaged=damaged.append)]
        assert found == [made[0]["_id"], made[2]["_id"]]
        assert [d["_id"] for d in damaged] == [made[1]["_id"]]
    p = shared.ledgerctl("doc", "find", "find_damaged", "p", "c", "by_k", "--eq", "1")
    assert p.returncode == 4, p
    assert [line.split("\t")[0] for line in p.stdout.decode().splitlines()] == [
        made[0]["_id"],
        made[2]["_id"],
    ]
    err = p.stderr.decode()
    assert err.startswith("ledgerctl: ") and made[1]["_id"] in err and "Traceback" not in err


async def test_attachments_of_a_deleted_document_are_read_with_deleted(
    http: aiohttp.ClientSession, base: str
) -> None:
    """A soft-deleted document keeps its attachments (the store reads them with
    ``include_deleted``), but ``GET``/``HEAD …/attachments/A`` had no way to ask:
    ``?deleted=1`` was ignored and the answer was 404 ``document_not_found``."""
    docs = base + "/docs/c"
    doc_id = (await call(http, "POST", docs, 201, {"k": 1}))["_meta"]["_id"]
    added = await call(http, "POST", f"{docs}/{doc_id}/attachments?filename=a", 201, data=b"abc")
    att = f"{docs}/{doc_id}/attachments/{added['attachment']['_id']}"
    await call(http, "DELETE", f"{docs}/{doc_id}", 200)
    await fails(http, "GET", att, 404, "document_not_found")
    async with http.get(att + "?deleted=1", headers={"Range": "bytes=1-"}) as r:
        assert (r.status, await r.read()) == (206, b"bc")
    async with http.head(att + "?deleted=1") as r:
        assert (r.status, r.content_length) == (200, 3)


async def test_a_followed_changes_feed_refuses_a_page_token(
    http: aiohttp.ClientSession, base: str
) -> None:
    """``?follow=1&token=…`` followed from ``since`` with the token silently ignored, so
    a client resuming a paged read in follow mode got the change again from its start
    without being told; it is 400 now (a followed feed resumes from ``since``)."""
    docs = base + "/docs"
    for _ in range(3):
        await call(http, "POST", docs + "/c", 201, {})
    token = (await call(http, "GET", docs + "/_changes?limit=1", 200))["next"]
    message = await fails(
        http, "GET", f"{docs}/_changes?follow=1&token={token}", 400, "bad_request"
    )
    assert "since" in message


@pytest.mark.parametrize("data", [{"b": b"\x00"}, {"x": float("nan")}, {b"k": 1}])
async def test_data_with_no_json_form_is_damaged_not_internal(
    http: aiohttp.ClientSession, base: str, data: Any
) -> None:
    """A record that decodes but whose data has no JSON form (bytes, NaN, a key that is
    not text: what no document write stores, written through the key API) made every
    listing, get and changes page holding it 500 ``internal`` (TypeError in the
    encoder, a traceback), or for NaN sent ``NaN``, which is not JSON."""
    import msgpack

    from ledgerd.store.documents import doclayout
    from ledgerd.store.documents.docmodel import parse_ulid

    docs = base + "/docs/c"
    made = await call(http, "POST", docs, 201, {"k": 1})
    doc_id, rev = made["_meta"]["_id"], made["_meta"]["_rev"]
    since = await head_id(http, base)
    raw_rev = parse_ulid(rev)
    record = [1, raw_rev, 0, int.from_bytes(raw_rev[:6], "big"), None, None, None, data, []]
    key = quote(doclayout.body_key("c", parse_ulid(doc_id)), safe="")
    body = msgpack.packb(record, use_bin_type=True)
    await call(http, "PUT", f"{base}/keys/{key}", 204, data=body)
    await head_id(http, base)
    listed = await call(http, "GET", docs, 200)
    assert listed["documents"] == [] and [d["_id"] for d in listed["damaged"]] == [doc_id]
    assert listed["damaged"][0]["code"] == "corrupt"
    changed = await call(http, "GET", f"{base}/docs/_changes?since={since}", 200)
    assert [d["_id"] for d in changed["damaged"]] == [doc_id]
    async with http.get(f"{base}/docs/_changes?since={since}&follow=1") as r:
        line = json.loads(await r.content.readline())
    assert line["documents"] == [] and [d["_id"] for d in line["damaged"]] == [doc_id]
    assert doc_id in await fails(http, "GET", f"{docs}/{doc_id}", 500, "corrupt")


@pytest.mark.parametrize(
    ("definition", "status", "code"),
    [([2, {"partition": ["k"]}, 7], 409, "unsupported_layout"), ([1, "k"], 500, "corrupt")],
)
async def test_an_index_definition_this_ledgerd_cannot_read_is_named(
    http: aiohttp.ClientSession, base: str, definition: Any, status: int, code: str
) -> None:
    """An index definition of a newer ledgerd's layout (come through sync) was dropped
    as malformed: its queries answered 404 ``index_not_found``, the listing left it out
    and a PUT of the index wrote over it. Now its queries answer 409
    ``unsupported_layout`` naming the index, declaring, dropping and rebuilding it are
    refused so and store nothing, the listing shows it with its code, and other
    indexes and document writes go on; a damaged definition is 500 ``corrupt`` and is
    repaired by declaring the index again. ``ledgerctl doc indexes`` and ``ledgerctl
    check`` name it too."""
    import msgpack

    from ledgerd.store.documents import doclayout

    docs = base + "/docs/c"
    await call(http, "PUT", docs + "/_indexes/by_m", 200, {"partition": "m"})
    made = await call(http, "POST", docs, 201, {"k": 1, "m": 1})
    key = quote(doclayout.index_key("c", "by_k"), safe="")
    raw = msgpack.packb(definition)
    await call(http, "PUT", f"{base}/keys/{key}", 204, data=raw)
    head = await head_id(http, base)
    message = await fails(http, "GET", docs + "/_indexes/by_k/find?eq=1", status, code)
    assert "'by_k'" in message, message
    listed = (await call(http, "GET", docs + "/_indexes", 200))["indexes"]
    assert [(i["name"], i.get("code")) for i in listed] == [("by_k", code), ("by_m", None)]
    assert listed[0]["partition"] is None and not listed[0]["ready"] and listed[0]["message"]
    new = await call(http, "POST", docs, 201, {"k": 1, "m": 2})
    found = await call(http, "GET", docs + "/_indexes/by_m/find?eq=2", 200)
    assert [d["_meta"]["_id"] for d in found["documents"]] == [new["_meta"]["_id"]]
    if code == "unsupported_layout":
        head = await head_id(http, base)
        for method, path in [
            ("PUT", "/_indexes/by_k"),
            ("DELETE", "/_indexes/by_k"),
            ("POST", "/_indexes/by_k/rebuild"),
        ]:
            body = {"partition": "k"} if method == "PUT" else None
            message = await fails(http, method, docs + path, 409, code, body=body)
            assert "'by_k'" in message and "layout 2" in message, message
        assert await head_id(http, base) == head
        async with http.get(f"{base}/keys/{key}") as r:
            assert r.status == 200 and await r.read() == raw
    else:
        await call(http, "PUT", docs + "/_indexes/by_k", 200, {"partition": "k"})
        found = await call(http, "GET", docs + "/_indexes/by_k/find?eq=1", 200)
        assert len(found["documents"]) == 2 and made["_meta"]["_id"] in str(found)


def test_ledgerctl_names_an_index_definition_it_cannot_read(shared: Daemon) -> None:
    """``ledgerctl doc indexes`` printed only the indexes it could read (a newer
    ledgerd's definition was left out without a word), and ``ledgerctl check`` called
    the page healthy. Now the listing shows it with its code, and the check names it
    (``unsupported_layout``, ``damaged_index_definition``: exit 1)."""
    import msgpack

    from ledgerd.daemon.client import Client
    from ledgerd.store.documents import doclayout

    with Client(shared.socket) as c:
        docs = c.documents("cli_newer_ix", "p")
        docs.declare_index("c", "by_m", "m")
        docs.create("c", {"m": 1})
        newer, bad = doclayout.index_key("c", "by_k"), doclayout.index_key("c", "by_x")
        c.put("cli_newer_ix", "p", newer, msgpack.packb([2, {"partition": ["k"]}]))
        c.put("cli_newer_ix", "p", bad, b"\x93not a definition")
        c.heads("cli_newer_ix", "p")
    p = shared.ledgerctl("doc", "indexes", "cli_newer_ix", "p", "c")
    assert p.returncode == 0, p
    assert p.stdout.decode().splitlines() == [
        "by_k\t-\t-\tunsupported_layout",
        'by_m\t"m"\t-\tready',
        "by_x\t-\t-\tcorrupt",
    ], p
    p = shared.ledgerctl("check", "cli_newer_ix", "p")
    text = p.stdout.decode()
    assert p.returncode == 1, (p, text)
    assert "unsupported_layout: index 'by_k' on 'c'" in text, text
    assert "damaged_index_definition: index 'by_x' on 'c' is damaged" in text, text


def test_ledgerctl_check_names_a_record_whose_data_has_no_json_form(shared: Daemon) -> None:
    """A record whose data has no JSON form (bytes, written through the key API) was
    damaged over HTTP only: ``ledgerctl check`` called the page healthy. Now it is
    ``damaged_document`` there too, as ``ledgerctl doc ls`` names it damaged."""
    import msgpack

    from ledgerd.daemon.client import Client
    from ledgerd.store.documents import doclayout
    from ledgerd.store.documents.docmodel import parse_ulid

    with Client(shared.socket) as c:
        docs = c.documents("check_no_json", "p")
        made = [docs.create("c", {"k": i})["_meta"] for i in range(2)]
        raw_rev = parse_ulid(made[1]["_rev"])
        ms = int.from_bytes(raw_rev[:6], "big")
        record = [1, raw_rev, 0, ms, None, None, None, {"k": float("nan"), "b": b"x"}, []]
        key = doclayout.body_key("c", parse_ulid(made[1]["_id"]))
        c.put("check_no_json", "p", key, msgpack.packb(record, use_bin_type=True))
        c.heads("check_no_json", "p")
    p = shared.ledgerctl("doc", "ls", "check_no_json", "p", "c")
    assert p.returncode == 4 and made[1]["_id"] in p.stderr.decode(), p
    p = shared.ledgerctl("check", "check_no_json", "p")
    text = p.stdout.decode()
    assert p.returncode == 1, (p, text)
    assert f"damaged_document: document {made[1]['_id']} in 'c' is damaged" in text, text
    assert "no JSON form" in text, text


async def test_document_keys_whose_id_is_not_a_ulid_are_named_not_a_500(
    http: aiohttp.ClientSession, base: str, shared: Daemon
) -> None:
    """Body keys whose id is not 16 bytes, PUT through the key API (one with its head,
    one without; and a head without a body) made a listing, the changes feed and an
    index query answer 500 ``internal`` (IndexError in ulid_text), and ``ledgerctl doc
    ls`` fail. Now they are named in ``damaged`` (code ``corrupt``, the id as
    ``hex:...``) past the documents; writes and a purge beside them work."""
    from ledgerd.store.documents import doclayout
    from ledgerd.store.documents.docmodel import RevClock

    docs = base + "/docs/c"
    await call(http, "PUT", docs + "/_indexes/by_k", 200, {"partition": "k"})
    a = await call(http, "POST", docs, 201, {"k": 1})
    b = await call(http, "POST", docs, 201, {"k": 1})
    mark = await head_id(http, base)
    rev = RevClock().next()
    ms = int.from_bytes(rev[:6], "big")
    live = doclayout.State.LIVE
    record = doclayout.encode_record(doclayout.Record(rev, live, ms, None, None, None, {"k": 1}))
    head = doclayout.encode_head(rev, live)
    long_id, short_id, head_only = b"\xff" * 20, b"\x01\x02", b"\xee" * 3
    ops = [
        (doclayout.body_key("c", long_id), record),
        (doclayout.head_key("c", long_id), head),
        (doclayout.body_key("c", short_id), record),
        (doclayout.head_key("c", head_only), head),
    ]
    for key, value in ops:
        quoted = quote(key, safe="")
        await call(http, "PUT", f"{base}/keys/{quoted}", 204, data=value)
    await call(http, "GET", base + "/heads", 200)  # (commits the journal)
    odd = sorted(["hex:" + short_id.hex(), "hex:" + long_id.hex()])
    ids = sorted([a["_meta"]["_id"], b["_meta"]["_id"]])

    listed = await call(http, "GET", docs, 200)
    assert [d["_meta"]["_id"] for d in listed["documents"]] == ids
    assert sorted(d["_id"] for d in listed["damaged"]) == odd
    assert {d["code"] for d in listed["damaged"]} == {"corrupt"}
    seen, token = [], None  # a page at a time: a token cut at an odd id continues
    while True:
        q = f"{docs}?limit=1" + (f"&token={urllib.parse.quote(token)}" if token else "")
        got = await call(http, "GET", q, 200)
        seen += [d["_meta"]["_id"] for d in got["documents"]]
        seen += [d["_id"] for d in got.get("damaged", ())]
        if (token := got["next"]) is None:
            break
    assert sorted(seen) == sorted(ids + odd)
    changed = await call(http, "GET", f"{base}/docs/_changes?since={mark}", 200)
    assert changed["documents"] == [] and sorted(d["_id"] for d in changed["damaged"]) == odd
    everything = await call(http, "GET", f"{base}/docs/_changes", 200)
    assert sorted(d["_id"] for d in everything["damaged"]) == odd
    found = await call(http, "GET", docs + "/_indexes/by_k/find?eq=1", 200)
    assert sorted(d["_meta"]["_id"] for d in found["documents"]) == ids
    assert sorted(d["_id"] for d in found["damaged"]) == odd
    await fails(http, "GET", f"{docs}/{odd[0]}", 404, "document_not_found")  # a chosen id

    lp = (base.split("/")[3], "p")
    p = shared.ledgerctl("doc", "ls", *lp, "c")
    assert p.returncode == 4 and "Traceback" not in p.stderr.decode(), p
    assert [r.split("\t")[0] for r in p.stdout.decode().splitlines()] == ids
    assert all(f"document {o} in 'c' is damaged" in p.stderr.decode() for o in odd), p

    c = await call(http, "POST", docs, 201, {"k": 2})
    any_rev = {"If-Match": "*"}
    await call(http, "PUT", f"{docs}/{a['_meta']['_id']}", 200, {"k": 3}, headers=any_rev)
    await call(http, "POST", f"{docs}/{b['_meta']['_id']}/purge", 200)
    listed = await call(http, "GET", docs, 200)
    assert [d["_meta"]["_id"] for d in listed["documents"]] == sorted(
        [a["_meta"]["_id"], c["_meta"]["_id"]]
    )
    assert sorted(d["_id"] for d in listed["damaged"]) == odd


async def test_the_changes_feed_names_a_deleted_body_key_with_an_odd_id(
    http: aiohttp.ClientSession, base: str
) -> None:
    """A body key whose id is not 16 bytes, named in a listing's and the feed's
    ``damaged``, was passed over by the feed once DELETEd through the key API (while a
    ULID's document so deleted is reported purged): a follower never learnt it was
    gone. Now the feed from a commit that held it names it (``hex:...``, corrupt)."""
    from ledgerd.store.documents import doclayout
    from ledgerd.store.documents.docmodel import RevClock

    docs = base + "/docs/c"
    await call(http, "POST", docs, 201, {"k": 1})
    rev = RevClock().next()
    ms = int.from_bytes(rev[:6], "big")
    live = doclayout.State.LIVE
    record = doclayout.encode_record(doclayout.Record(rev, live, ms, None, None, None, {"k": 1}))
    odd_id = b"\xff" * 20
    key = quote(doclayout.body_key("c", odd_id), safe="")
    await call(http, "PUT", f"{base}/keys/{key}", 204, data=record)
    await call(http, "GET", base + "/heads", 200)  # (commits the journal)
    odd = "hex:" + odd_id.hex()
    assert [d["_id"] for d in (await call(http, "GET", docs, 200))["damaged"]] == [odd]
    mark = await head_id(http, base)

    await call(http, "DELETE", f"{base}/keys/{key}", 204)
    await call(http, "GET", base + "/heads", 200)
    assert (await call(http, "GET", docs, 200)).get("damaged", []) == []
    changed = await call(http, "GET", f"{base}/docs/_changes?since={mark}", 200)
    assert changed["documents"] == [], changed
    assert [(d["_id"], d["code"], d["collection"]) for d in changed["damaged"]] == [
        (odd, "corrupt", "c")
    ], changed
    assert "is gone" in changed["damaged"][0]["message"], changed
    everything = await call(http, "GET", f"{base}/docs/_changes", 200)
    assert everything.get("damaged", []) == [], everything  # not there at the start


def test_ledgerctl_doc_find_refuses_a_null_bound(shared: Daemon) -> None:
    """``--start null`` / ``--end null`` are refused (exit status 2), as the HTTP API refuses
    ``start=null``: null is the lowest sort value, not "no bound". ledgerctl read ``null`` as
    JSON None and sent no bound at all, so ``--end null`` listed every document (the range
    below null holds none) with exit status 0."""
    lp = ("cli_null_bound", "p")
    ctl(shared, "index", *lp, "c", "by_city", "--partition", "city", "--sort", "age")
    ctl(shared, "put", *lp, "c", '{"city": "Oslo", "age": 41}')
    for bound in ("--start", "--end"):
        for value in ("null", " null "):
            err = ctl_fails(shared, 2, "find", *lp, "c", "by_city", "--eq", "Oslo", bound, value)
            assert f"{bound} " in err and "leave it out for an open range" in err, err
    assert ctl(shared, "find", *lp, "c", "by_city", "--eq", "Oslo", "--end", "41") == ""
    # --eq null stays a value (documents whose partition value is null), so do empty strings
    assert ctl(shared, "find", *lp, "c", "by_city", "--eq", "null") == ""
    assert len(ctl(shared, "find", *lp, "c", "by_city", "--eq", "Oslo", "--start", "").split()) == 3
    assert len(ctl(shared, "find", *lp, "c", "by_city", "--eq", "Oslo").splitlines()) == 1
