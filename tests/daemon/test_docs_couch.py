"""CouchDB's shapes over HTTP, in the clients and ``ledgerctl doc``: chosen ids (``PUT``
creates), ``_bulk_docs``, ``_find`` and ``_explain``, against the real daemon."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest

from ledgerd.daemon.client import AsyncClient, Client, LedgerError
from tests.daemon.conftest import Daemon
from tests.daemon.test_cli import shared_daemon
from tests.daemon.test_docs_e2e import MAX_LISTING, call, fails, head_id


@pytest.fixture(scope="module")
def shared() -> Iterator[Daemon]:
    yield from shared_daemon({"LEDGERD_MAX_LISTING_BYTES": str(MAX_LISTING)}, "ld-couch-")


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


async def test_put_without_a_revision_creates_with_the_id_of_the_path(
    http: aiohttp.ClientSession, base: str
) -> None:
    docs = base + "/docs/people"
    ann = await call(http, "PUT", docs + "/ann%40example.com", 201, {"name": "Ann"})
    assert ann["_meta"]["_id"] == "ann@example.com"
    before = await head_id(http, base)
    message = await fails(http, "PUT", docs + "/ann%40example.com", 409, "conflict", body={"x": 1})
    assert "ann@example.com" in message
    assert await head_id(http, base) == before
    got = await call(http, "GET", docs + "/ann%40example.com", 200)
    assert got["_data"] == {"name": "Ann"}
    rev = ann["_meta"]["_rev"]
    new = await call(http, "PUT", f"{docs}/ann%40example.com?rev={rev}", 200, {"name": "A"})
    star = {"If-Match": "*"}
    await call(http, "PUT", docs + "/ann%40example.com", 200, {"name": "B"}, headers=star)
    await fails(http, "PUT", docs + "/nobody", 404, "document_not_found", body={}, headers=star)
    # A slash and any UTF-8, percent-encoded; listings carry the id as chosen.
    await call(http, "PUT", docs + "/a%2Fb%20%C3%A9", 201, {})
    listed = await call(http, "GET", docs, 200)
    assert [d["_meta"]["_id"] for d in listed["documents"]] == ["a/b é", "ann@example.com"]
    # A deleted document's id may be taken again, as in CouchDB.
    await call(http, "DELETE", docs + "/a%2Fb%20%C3%A9", 200)
    again = await call(http, "PUT", docs + "/a%2Fb%20%C3%A9", 201, {"v": 2})
    assert again["_data"] == {"v": 2} and new["_meta"]["_rev"] != again["_meta"]["_rev"]
    for bad in ("_design", "x" * 513, "a%00b"):
        await fails(http, "PUT", f"{docs}/{bad}", 400, "invalid_id", body={})


async def test_bulk_docs_one_commit_and_a_result_per_document(
    http: aiohttp.ClientSession, base: str
) -> None:
    docs = base + "/docs/c"
    old = await call(http, "PUT", docs + "/old", 201, {"v": 0})
    rev = old["_meta"]["_rev"]
    before = len((await call(http, "GET", base + "/history?limit=1000", 200))["commits"])
    body = {
        "docs": [
            {"_id": "a", "v": 1},
            {"v": 2, "nested": {"x": [1]}},
            {"_id": "old", "_rev": rev, "v": 3},
            {"_id": "old", "v": 4},
            {"_id": "_bad"},
            {"_id": "bad", "_attachments": {}},
            "not an object",
            {"_id": 5},
            {"_id": "gone", "_rev": rev, "_deleted": True},
        ]
    }
    res = await call(http, "POST", docs + "/_bulk_docs", 201, body)
    after = len((await call(http, "GET", base + "/history?limit=1000", 200))["commits"])
    assert after == before + 1
    assert res[0]["id"] == "a" and res[0]["ok"] is True and res[0]["rev"]
    assert res[1]["ok"] is True and len(res[1]["id"]) == 26
    assert res[2] == {"id": "old", "rev": res[2]["rev"], "ok": True}
    assert [(r["id"], r["error"]) for r in res[3:]] == [
        ("old", "conflict"),
        ("_bad", "invalid_id"),
        ("bad", "invalid_document"),
        (None, "invalid_document"),
        (5, "invalid_document"),
        ("gone", "document_not_found"),
    ]
    assert all(r["reason"] for r in res[3:])
    assert (await call(http, "GET", docs + "/old", 200))["_data"] == {"v": 3}
    got = await call(http, "GET", f"{docs}/{res[1]['id']}", 200)
    assert got["_data"] == {"v": 2, "nested": {"x": [1]}}
    # Deleting names the revision; a bulk that writes nothing makes no commit.
    res = await call(
        http,
        "POST",
        docs + "/_bulk_docs",
        201,
        {"docs": [{"_id": "a", "_rev": res[0]["rev"], "_deleted": True}]},
    )
    assert res[0]["ok"] is True
    await fails(http, "GET", docs + "/a", 404, "document_not_found")
    head = await head_id(http, base)
    assert (await call(http, "POST", docs + "/_bulk_docs", 201, {"docs": [{"_id": "_x"}]}))[0][
        "error"
    ] == "invalid_id"
    assert (await call(http, "POST", docs + "/_bulk_docs", 201, {"docs": []})) == []
    assert await head_id(http, base) == head
    bodies: list[Any] = [[], {"docs": {}}, {"docs": [], "extra": 1}, {"docs": [], "new_edits": 0}]
    for bad in bodies:
        await fails(http, "POST", docs + "/_bulk_docs", 400, "bad_request", body=bad)
    too_many: dict[str, Any] = {"docs": [{}] * 10_001}
    await fails(http, "POST", docs + "/_bulk_docs", 400, "bad_request", body=too_many)
    assert await head_id(http, base) == head


async def test_find_and_explain_over_http(http: aiohttp.ClientSession, base: str) -> None:
    docs = base + "/docs/people"
    people = [
        {"_id": "ann", "name": "Ann", "age": 41, "city": "Oslo", "pet": {"kind": "cat"}},
        {"_id": "bob", "name": "Bob", "age": 29, "city": "Oslo"},
        {"_id": "cid", "name": "Cid", "age": "old", "city": "Bergen"},
        {"_id": "dan", "name": "Dan", "city": "Bergen"},
    ]
    await call(http, "POST", docs + "/_bulk_docs", 201, {"docs": people})
    find = docs + "/_find"
    res = await call(http, "POST", find, 200, {"selector": {"city": "Oslo"}})
    assert [d["_id"] for d in res["docs"]] == ["ann", "bob"] and res["bookmark"] is None
    assert res["docs"][0]["_rev"] and res["docs"][0]["pet"] == {"kind": "cat"}
    res = await call(
        http,
        "POST",
        find,
        200,
        {
            "selector": {"age": {"$gt": 0}},
            "sort": [{"age": "desc"}],
            "fields": ["name"],
            "limit": 2,
        },
    )
    assert res["docs"] == [{"_id": "cid", "name": "Cid"}, {"_id": "ann", "name": "Ann"}]
    more = {"selector": {"age": {"$gt": 0}}, "sort": [{"age": "desc"}], "fields": ["name"]}
    rest = await call(http, "POST", find, 200, {**more, "limit": 2, "bookmark": res["bookmark"]})
    assert [d["_id"] for d in rest["docs"]] == ["bob"] and rest["bookmark"] is None

    explain = docs + "/_explain"
    scan = await call(http, "POST", explain, 200, {"selector": {"city": "Oslo"}})
    assert scan["scan"] is True and scan["index"]["name"] == "_all_docs"
    await call(http, "PUT", docs + "/_indexes/by_city", 200, {"partition": "city"})
    used = await call(http, "POST", explain, 200, {"selector": {"city": "Oslo"}})
    assert used["scan"] is False and used["index"]["name"] == "by_city"
    assert used["partition_value"] == "Oslo"
    res = await call(http, "POST", find, 200, {"selector": {"city": "Oslo", "age": {"$lt": 30}}})
    assert [d["_id"] for d in res["docs"]] == ["bob"]
    res = await call(http, "POST", find, 200, {"selector": {"city": "Oslo"}, "use_index": "x"})
    assert "x" in res["warning"] and len(res["docs"]) == 2

    requests: list[Any] = [
        [],
        {},
        {"selector": {"a": {"$regex": "x"}}},
        {"selector": {}, "limit": 1001},
        {"selector": {}, "sort": ["a", {"b": "desc"}]},
        {"selector": {}, "bookmark": "garbage"},
    ]
    for bad in requests:
        await fails(http, "POST", find, 400, "bad_request", body=bad)
        if "bookmark" not in bad:  # (explain reads no bookmark)
            await fails(http, "POST", explain, 400, "bad_request", body=bad)
    await fails(
        http,
        "POST",
        base.replace("/pages/p", "/pages/none") + "/docs/c/_find",
        404,
        "page_not_found",
        body={"selector": {}},
    )


async def test_a_find_answer_stays_under_the_listing_bound(
    http: aiohttp.ClientSession, base: str
) -> None:
    docs = base + "/docs/c"
    big = [{"_id": f"d{i:02}", "text": "x" * 3000} for i in range(6)]
    await call(http, "POST", docs + "/_bulk_docs", 201, {"docs": big})
    seen, bookmark = [], None
    while True:
        req: dict[str, Any] = {"selector": {}, "limit": 100}
        if bookmark:
            req["bookmark"] = bookmark
        res = await call(http, "POST", docs + "/_find", 200, req)
        assert res["docs"] and len(str(res)) < MAX_LISTING + 1000
        seen += [d["_id"] for d in res["docs"]]
        if (bookmark := res["bookmark"]) is None:
            break
    assert seen == [d["_id"] for d in big]


async def test_the_async_client(shared: Daemon) -> None:
    async with AsyncClient(shared.socket) as c:
        docs = c.documents("client_async", "p")
        ann = await docs.create("people", {"name": "Ann", "age": 41}, id="ann")
        assert ann["_meta"]["_id"] == "ann"
        with pytest.raises(LedgerError) as e:
            await docs.create("people", {"name": "Ann"}, id="ann")
        assert (e.value.code, e.value.status) == ("conflict", 409)
        replaced = await docs.replace("people", "ann", {"name": "Ann", "age": 42})  # any rev
        assert replaced["_data"]["age"] == 42
        res = await docs.bulk_docs("people", [{"_id": "bob", "age": 29}, {"_id": "ann"}])
        assert res[0]["ok"] and res[1]["error"] == "conflict"
        found = await docs.select("people", {"age": {"$gt": 30}}, fields=["age"])
        assert found == {"docs": [{"_id": "ann", "age": 42}], "bookmark": None}
        first = await docs.select("people", {}, sort=["age"], limit=1)
        assert [d["_id"] for d in first["docs"]] == ["bob"] and first["bookmark"]
        rest = await docs.select("people", {}, sort=["age"], limit=1, bookmark=first["bookmark"])
        assert [d["_id"] for d in rest["docs"]] == ["ann"]
        plan = await docs.explain("people", {"age": 41})
        assert plan["scan"] is True


def test_the_blocking_client_and_ledgerctl(shared: Daemon) -> None:
    with Client(shared.socket) as c:
        docs = c.documents("client_blocking", "p")
        assert docs.create("c", {"v": 1}, id="one")["_meta"]["_id"] == "one"
        assert docs.bulk_docs("c", [{"_id": "two", "v": 2}])[0]["ok"]
        assert [d["_id"] for d in docs.select("c", {"v": {"$gte": 1}})["docs"]] == ["one", "two"]
        assert docs.explain("c", {"v": 1})["index"]["name"] == "_all_docs"
    lp = ("client_blocking", "p")
    made = shared.ledgerctl("doc", "put", *lp, "c", '{"v": 3}', "--id", "three")
    assert made.returncode == 0 and made.stdout.decode().split("\t")[0] == "three", made
    again = shared.ledgerctl("doc", "put", *lp, "c", '{"v": 4}', "--id", "three")  # replaces
    assert again.returncode == 0 and again.stdout.split()[1] != made.stdout.split()[1], again
    got = shared.ledgerctl("doc", "get", *lp, "c", "three", check=True)
    assert b'"v": 4' in got.stdout
    bad = shared.ledgerctl("doc", "put", *lp, "c", "{}", "--id", "_x")
    assert bad.returncode == 2 and b"(invalid_id)" in bad.stderr, bad
