"""Regressions found by attacking a running daemon's newer surfaces (documents,
attachments, ranges, transfer codings) over its socket: each request here once was
answered wrongly, stored something else than what was sent, or was refused although
it was well formed."""

from __future__ import annotations

import base64
import gzip
import io
import json

import aiohttp
from yarl import URL

from tests.daemon.conftest import Daemon
from tests.daemon.test_attack import _no_traceback, _raw

P = "/v1/ledgers/l/pages/p"
D = "/v1/ledgers/app/pages/people/docs"


def u(path: str) -> URL:
    return URL("http://ledgerd" + path, encoded=True)


def _chunked(body: bytes) -> bytes:
    return b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n"


async def test_a_transfer_coding_other_than_chunked_is_refused_with_415(
    daemon: Daemon, http: aiohttp.ClientSession
) -> None:
    """``Content-Encoding: gzip`` is refused (bodies are taken as sent), but
    ``Transfer-Encoding: gzip, chunked`` went through: aiohttp removes the chunking and
    nothing else, so the gzip bytes were stored as the value (or parsed as a
    document), something else than what the client meant to write. A transfer coding
    other than ``chunked`` is now 415 ``unsupported_encoding`` and stores nothing."""
    r = await http.post(u(D + "/people"), json={"n": 1})
    assert r.status == 201, await r.text()
    doc = (await r.json())["_meta"]["_id"]
    value = gzip.compress(b"hello")
    for method, path in [
        ("PUT", P + "/keys/k"),
        ("POST", P + "/batch"),
        ("POST", D + "/people"),
        ("POST", f"{D}/people/{doc}/attachments?filename=a"),
    ]:
        for coding in ("gzip, chunked", "deflate,chunked", "x-custom , chunked"):
            head = (
                f"{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                f"Transfer-Encoding: {coding}\r\n\r\n"
            ).encode()
            got = await _raw(daemon, head + _chunked(value), wait=10)
            status, _, rest = got.partition(b"\r\n\r\n")
            assert status.startswith(b"HTTP/1.1 415 "), (path, coding, got[:300])
            assert json.loads(rest)["error"]["code"] == "unsupported_encoding", got[:300]
    r = await http.get(u(P + "/keys/k"))
    assert r.status == 404, await r.text()
    r = await http.get(u(f"{D}/people/{doc}"))
    assert (await r.json())["_attachments"] == []
    r = await http.get(u(D + "/people"))
    assert len((await r.json())["documents"]) == 1
    # Plain chunking (any case) is no coding of the value at all.
    for coding in ("chunked", "Chunked"):
        head = (
            f"PUT {P}/keys/k HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            f"Transfer-Encoding: {coding}\r\n\r\n"
        ).encode()
        got = await _raw(daemon, head + _chunked(b"plain"), wait=10)
        assert got.startswith(b"HTTP/1.1 204 "), got[:300]
        assert await (await http.get(u(P + "/keys/k"))).read() == b"plain"
    _no_traceback(daemon)


async def test_a_range_with_leading_zeros_is_served(
    daemon: Daemon, http: aiohttp.ClientSession
) -> None:
    """A range position of over 18 digits was taken as past any size before its
    leading zeros were dropped: ``bytes=`` + 19 zeros + ``1-2`` (bytes 1-2, as RFC 9110
    reads it) was 400 "the end is before the start" for values and attachments, and
    ``bytes=`` + 20 zeros + ``0-`` 416."""
    content = bytes(range(256)) * 4096  # 1 MiB: several pieces, a streamed answer
    r = await http.put(u(P + "/keys/v"), data=content)
    assert r.status == 204, await r.text()
    r = await http.post(u(D + "/people"), json={"n": 1})
    doc = (await r.json())["_meta"]["_id"]
    r = await http.post(u(f"{D}/people/{doc}/attachments?filename=a"), data=content)
    att = (await r.json())["attachment"]["_id"]
    zeros = "0" * 20
    for path in (P + "/keys/v", f"{D}/people/{doc}/attachments/{att}"):
        for header, start, end in [
            (f"bytes={zeros}1-{zeros}2", 1, 2),
            (f"bytes={zeros}0-", 0, len(content) - 1),
            (f"bytes=-{zeros}3", len(content) - 3, len(content) - 1),
        ]:
            r = await http.get(u(path), headers={"Range": header})
            assert r.status == 206, (path, header, await r.text())
            assert r.headers["Content-Range"] == f"bytes {start}-{end}/{len(content)}"
            assert await r.read() == content[start : end + 1]
        r = await http.get(u(path), headers={"Range": f"bytes=5-{zeros}"})  # 5-0
        assert r.status == 400, await r.text()
        assert (await r.json())["error"]["code"] == "bad_request"
    _no_traceback(daemon)


async def test_a_made_up_find_bookmark_is_400_not_500(
    daemon: Daemon, http: aiohttp.ClientSession
) -> None:
    """A bookmark's check is a digest anyone can compute (it catches garbling, it is no
    signature), so a client can send one whose position is any JSON text. One nested
    thousands of levels deep was a 500 (``RecursionError``), and one whose sort value
    held a lone surrogate a 500 (``UnicodeEncodeError``) while it was compared; NaN was
    taken as a position. They are 400 ``bad_request``, as a garbled bookmark is."""
    from ledgerd.store.documents import doctoken
    from ledgerd.store.documents.docfind import BOOKMARK, parse_request

    r = await http.post(
        u(D + "/people/_bulk_docs"), json={"docs": [{"_id": "ann", "age": 41}, {"age": 29}]}
    )
    assert r.status == 201, await r.text()

    def made_up(request: dict[str, object], position: bytes) -> str:
        canonical = parse_request(request).canonical
        bound = doctoken.binding("find", b"app", b"people", "people", canonical)
        token = doctoken.encode(BOOKMARK, bound, [position])
        return base64.urlsafe_b64encode(token).decode().rstrip("=")

    plain = {"selector": {"age": {"$gt": 0}}, "limit": 1}
    by_age = {**plain, "sort": ["age"]}
    good = made_up(plain, b'["ann"]')  # made up too, and well formed: it is taken
    r = await http.post(u(D + "/people/_find"), json={**plain, "bookmark": good})
    assert r.status == 200, await r.text()
    for request, position in [
        (plain, b"[" * 50_000 + b"]" * 50_000),
        (by_age, b'[{"a": ' + b"[" * 3000 + b"]" * 3000 + b'}, "ann"]'),
        (by_age, b'["\\ud800", "ann"]'),
        (by_age, b'[NaN, "ann"]'),
        (by_age, b'[Infinity, "ann"]'),
    ]:
        bookmark = made_up(request, position)
        r = await http.post(u(D + "/people/_find"), json={**request, "bookmark": bookmark})
        assert r.status == 400, (position[:40], await r.text())
        assert (await r.json())["error"]["code"] == "bad_request"
    _no_traceback(daemon)


async def test_a_made_up_changes_token_of_text_is_400_not_500(
    daemon: Daemon, http: aiohttp.ClientSession
) -> None:
    """A changes token holds the head's commit id and a key, both bytes; its check is a
    digest a client can compute, and the token's format lets either be text. A token
    made with text there was a 500 (``TypeError``) instead of 400 ``bad_request``."""
    from ledgerd.store.documents import doclayout, doctoken
    from ledgerd.store.tree import commit

    r = await http.post(u(D + "/people/_bulk_docs"), json={"docs": [{"n": 1}, {"n": 2}]})
    assert r.status == 201, await r.text()
    r = await http.get(u(D + "/_changes?limit=1"))
    head = bytes.fromhex((await r.json())["commit"])
    bound = doctoken.binding("changes", b"app", b"people", commit.FIRST.id, doclayout.DOCS)
    positions: list[list[bytes | str]] = [["x", "y"], [head, "y"], ["x", doclayout.DOCS]]
    for position in positions:
        token = doctoken.encode(doctoken.CHANGES, bound, position)
        text = base64.urlsafe_b64encode(token).decode().rstrip("=")
        r = await http.get(u(f"{D}/_changes?limit=1&token={text}"))
        assert r.status == 400, (position, await r.text())
        assert (await r.json())["error"]["code"] == "bad_request"
    _no_traceback(daemon)


async def test_a_bulk_whose_every_document_is_refused_makes_no_page(
    daemon: Daemon, http: aiohttp.ClientSession
) -> None:
    """A document refused for what it is alone (not an object, a reserved id or name,
    too large) makes no page when sent by itself, but ``_bulk_docs`` opened the page's
    document store, which made the page, before the writes were looked at: a bulk whose
    every document was refused left an empty document page listed. It answers the same
    results and makes no page; a bulk with one good document still makes it."""
    big = {"x": "y" * (2 << 20)}
    docs = [5, {"_id": "_x"}, {"_id": "a", "_r": 1}, {"_id": "b", **big}, {"_id": "a\x00"}]
    body = io.BytesIO(json.dumps({"docs": docs}).encode())  # (aiohttp warns of large bytes)
    r = await http.post(u("/v1/ledgers/z/pages/p/docs/c/_bulk_docs"), data=body)
    assert r.status == 201, await r.text()
    got = await r.json()
    assert [x.get("error") for x in got] == [
        "invalid_document",
        "invalid_id",
        "invalid_document",
        "too_large",
        "invalid_id",
    ], got
    assert [x["id"] for x in got] == [None, "_x", "a", "b", "a\x00"], got
    r = await http.get(u("/v1/ledgers/z/pages"))
    assert r.status == 404, await r.text()  # no page, so no ledger either
    r = await http.post(
        u("/v1/ledgers/z/pages/p/docs/c/_bulk_docs"), json={"docs": [{"_id": "_x"}, {"n": 1}]}
    )
    assert [x.get("ok") for x in await r.json()] == [None, True]
    r = await http.get(u("/v1/ledgers/z/pages"))
    assert [p["text"] for p in (await r.json())["pages"]] == ["p"]
    _no_traceback(daemon)


async def test_a_bulk_option_not_taken_is_named_in_the_refusal(
    daemon: Daemon, http: aiohttp.ClientSession
) -> None:
    """``_bulk_docs`` takes ``docs`` and ``new_edits: true`` only, but every other key
    (CouchDB's ``all_or_nothing``, a typo) was refused with "new_edits=false is not
    supported", which sends the client looking at an option it did not send."""
    extras: list[tuple[dict[str, object], str]] = [
        ({"all_or_nothing": True}, "all_or_nothing"),
        ({"doc": []}, "doc"),
        ({"new_edits": False}, "new_edits=false"),
    ]
    for extra, named in extras:
        r = await http.post(u(D + "/people/_bulk_docs"), json={"docs": [{"n": 1}], **extra})
        assert r.status == 400, await r.text()
        error = (await r.json())["error"]
        assert error["code"] == "bad_request" and named in error["message"], error
    r = await http.get(u(D + "/people"))
    assert r.status == 404, await r.text()  # nothing written, no page made
