"""Listing and resolving conflicts from the CLI, HTTP and the clients, with real daemons:
two (or three) sharing a bucket on moto's HTTP server (the ``three`` fixture), or one
whose transaction and plain write of a key make siblings."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import aiohttp

from ledgerd.daemon.client import AsyncClient, Client, LedgerError
from ledgerd.store.documents import doclayout
from tests.daemon.conftest import Daemon


def _ls(d: Daemon) -> dict[bytes, bytes]:
    out = d.ledgerctl("ls", "l", "p", "--json", check=True).stdout.decode()
    items = [json.loads(x) for x in out.splitlines()]
    return {base64.b64decode(x["key"]): base64.b64decode(x["value"]) for x in items}


def _conflicts(d: Daemon) -> list[dict[str, Any]]:
    out = d.ledgerctl("conflicts", "l", "p", "--json", check=True).stdout.decode()
    return [json.loads(x) for x in out.splitlines()]


def _sides(doc: dict[str, Any]) -> tuple[bytes, list[bytes]]:
    """A key's conflict as (ours, theirs) values."""
    return base64.b64decode(doc["ours"]["value"]), [
        base64.b64decode(t["value"]) for t in doc["theirs"]
    ]


async def _conflicting_writes(*ds: Daemon) -> None:
    """Each device writes ``k`` (a conflict) and a key of its own, then all sync: the
    last device's write of ``k`` is the latest (the winner)."""
    clients = [AsyncClient(d.socket) for d in ds]
    try:
        for c in clients:
            await c.policy("l", "p", "automatic_with_fallback")
        for c, tag in zip(clients, (b"a", b"b", b"c"), strict=False):
            await c.batch("l", "p", puts=[(b"k", b"from " + tag), (b"only-" + tag, tag)])
        for _ in range(2):
            for c in clients:
                await c.sync(timeout=60)
    finally:
        for c in clients:
            await c.close()


async def test_a_pending_conflict_hides_no_other_key_and_resolve_ends_it(
    three: list[Daemon],
) -> None:
    a, b, _ = three
    await _conflicting_writes(a, b)
    for d in (a, b):
        # Each device's reads show every key's winner (its own non-conflicting write
        # too) while the conflict waits for a resolver.
        assert _ls(d) == {b"k": b"from b", b"only-a": b"a", b"only-b": b"b"}, d.log_text()
        (page,) = _conflicts(d)
        assert page["count"] == 1 and page["conflict"], page
        (key,) = page["conflicts"]
        assert base64.b64decode(key["key"]) == b"k"
        assert _sides(key) == (b"from b", [b"from a"])  # ours: what reads show
    text = a.ledgerctl("conflicts", "l", "p", check=True).stdout.decode()
    assert "ours    from b" in text and "theirs  from a" in text, text
    expect = page["conflicts"][0]["expect"]
    assert f"ledgerctl resolve l p k --take ours --expect {expect}" in text, text
    # b takes a's value; the resolution is a write that reaches a.
    out = b.ledgerctl("resolve", "l", "p", "k", "--take", "theirs", "--expect", expect)
    assert out.returncode == 0, out.stderr
    assert out.stdout.decode() == "resolved 1 key (k); 0 conflicts left on l p\n"
    for d in (b, a):
        d.ledgerctl("sync", check=True)
    for d in (a, b):
        assert _ls(d) == {b"k": b"from a", b"only-a": b"a", b"only-b": b"b"}
        out = d.ledgerctl("conflicts", "l", "p")
        assert (out.returncode, out.stdout) == (0, b"no conflicts in l p\n"), out
        policy = json.loads(d.ledgerctl("policy", "l", "p", "--json", check=True).stdout)
        # No conflict left: none waits for a resolver (the reason went with the last).
        assert policy["conflicts"] == 0 and policy["conflict"] is None, policy
    # The same expect again: the conflict is gone.
    out = a.ledgerctl("resolve", "l", "p", "k", "--take", "theirs", "--expect", expect)
    assert out.returncode == 4 and b"(no_conflict)" in out.stderr, out


async def test_three_siblings_theirs_is_ambiguous_and_a_value_resolves(
    three: list[Daemon],
) -> None:
    a, b, c = three
    await _conflicting_writes(a, b, c)
    (page,) = _conflicts(a)
    (key,) = page["conflicts"]
    assert _sides(key) == (b"from c", [b"from b", b"from a"])
    out = a.ledgerctl("resolve", "l", "p", "k", "--take", "theirs")
    assert out.returncode == 4, out
    err = out.stderr.decode()
    assert "(ambiguous_theirs)" in err and "theirs  from b" in err and "theirs  from a" in err
    async with AsyncClient(a.socket) as ca:
        (listed,) = await ca.conflicts("l", "p")
        assert listed.count == 1 and listed.conflicts[0].expect == key["expect"]
        # A value spelt "ours" is a value, through --value (or the clients' value=).
        done = await ca.resolve("l", "p", b"k", value=b"ours", expect=key["expect"])
        assert done.keys == [b"k"] and done.conflicts == 0
        await ca.sync(timeout=60)
    for d in (b, c):
        d.ledgerctl("sync", check=True)
        assert _ls(d)[b"k"] == b"ours" and _conflicts(d) == []


async def _siblings(c: AsyncClient, key: bytes, mine: bytes, other: bytes) -> None:
    """Make ``key`` hold two siblings on one daemon: a transaction's write, and a plain
    write it did not see (``other`` wins: the later)."""
    s = await c.open_session()
    try:
        txn = await s.begin("l", "p")
        await txn.put(key, mine)
        await c.put("l", "p", key, other)
        await asyncio.wait_for(txn.commit(), 20)
    finally:
        await s.close()


def b64(v: bytes) -> str:
    return base64.b64encode(v).decode()


async def _resolve(http: aiohttp.ClientSession, body: object) -> tuple[int, dict[str, Any]]:
    async with http.post("/v1/ledgers/l/pages/p/conflicts/resolve", json=body) as r:
        return r.status, await r.json()


async def test_http_lists_and_resolves_and_refuses_with_stable_codes(
    daemon: Daemon, http: aiohttp.ClientSession
) -> None:
    async with AsyncClient(daemon.socket) as c:
        await c.put("l", "p", b"other", b"no conflict here")
        await _siblings(c, b"x", b"txn-x", b"plain-x")
        await _siblings(c, b"y", b"txn-y", b"plain-y")
    async with http.get("/v1/conflicts") as r:
        pages = (await r.json())["pages"]
    assert [(p["page_text"], p["count"]) for p in pages] == [("p", 2)]
    async with http.get("/v1/conflicts?ledger=l&limit=1") as r:
        (page,) = (await r.json())["pages"]
    assert len(page["conflicts"]) == 1 and page["next"] == b64(b"y")
    assert page["expect"] is None  # not a whole listing
    async with http.get("/v1/ledgers/l/pages/p/conflicts?start=y") as r:
        assert [base64.b64decode(k["key"]) for k in (await r.json())["conflicts"]] == [b"y"]
    async with http.get("/v1/ledgers/l/pages/p/conflicts") as r:
        page = await r.json()
    x, y = page["conflicts"]
    ours, theirs = _sides(x)
    assert {ours, *theirs} == {b"plain-x", b"txn-x"} and x["ours"]["device"] == page["device"]
    async with http.get("/v1/ledgers/l/pages/p/keys/x") as r:
        assert await r.read() == ours  # what reads show
    # Refusals: each with its code, and nothing written.
    for body, status, code in [
        ({"key": b64(b"x"), "take": "both"}, 400, "bad_request"),
        ({"key": b64(b"x"), "take": "ours", "expect": "nope"}, 400, "bad_request"),
        ({"key": b64(b"x"), "take": "ours", "expect": y["expect"]}, 409, "siblings_changed"),
        ({"key": b64(b"other"), "take": "ours"}, 409, "no_conflict"),
        ({"key": b64(b"absent"), "take": "ours"}, 404, "key_not_found"),
        ({"key": None, "take": "ours"}, 400, "bad_request"),  # (not the whole page)
        ({"kye": b64(b"x"), "take": "ours"}, 400, "bad_request"),
    ]:
        got = await _resolve(http, body)
        assert (got[0], got[1]["error"]["code"]) == (status, code), (body, got)
    async with http.get("/v1/ledgers/l/pages/p/conflicts") as r:
        assert (await r.json())["count"] == 2
    assert await _resolve(http, {"key": b64(b"x"), "take": {"value": b64(b"both")}}) == (
        200,
        {"resolved": [b64(b"x")], "conflicts": 1},
    )
    assert await _resolve(http, {"take": "delete", "expect": y["expect"]}) == (
        200,
        {"resolved": [b64(b"y")], "conflicts": 0},
    )
    async with http.get("/v1/ledgers/l/pages/p/entries") as r:
        entries = {base64.b64decode(e["key"]) for e in (await r.json())["entries"]}
    assert entries == {b"other", b"x"}
    got = await _resolve(http, {"take": "ours"})
    assert (got[0], got[1]["error"]["code"]) == (409, "no_conflict")
    async with http.get("/v1/conflicts") as r:
        assert (await r.json())["pages"] == []
    async with http.get("/v1/conflicts?ledger=nope") as r:
        assert (r.status, (await r.json())["error"]["code"]) == (404, "ledger_not_found")
    # A document page: each document is resolved whole, by its _rev, never by key.
    async with http.post("/v1/ledgers/l/pages/d/docs/people", json={"name": "Ann"}) as r:
        assert r.status == 201
    async with http.post("/v1/ledgers/l/pages/d/conflicts/resolve", json={"take": "ours"}) as r:
        assert (r.status, (await r.json())["error"]["code"]) == (409, "not_resolvable")


def test_the_blocking_client_and_the_cli_without_conflicts(daemon: Daemon) -> None:
    with Client(daemon.socket) as c:
        assert c.conflicts() == []
        c.put("l", "p", b"k", b"v")
        (page,) = c.conflicts("l", "p")
        assert page.count == 0 and page.conflicts == [] and page.next is None
        for key in (b"k", "k"):  # (a str key as UTF-8, as every method takes it)
            try:
                c.resolve("l", "p", key, take="ours")
                raise AssertionError("resolved a key without a conflict")
            except LedgerError as e:
                assert e.code == "no_conflict" and e.status == 409
    out = daemon.ledgerctl("conflicts")
    assert out.returncode == 0 and out.stdout.startswith(b"no conflicts on open pages"), out
    out = daemon.ledgerctl("conflicts", "l", "p", "--json")
    assert (out.returncode, out.stdout) == (0, b""), out
    out = daemon.ledgerctl("resolve", "l", "p", "k")
    assert out.returncode == 2 and b"--take" in out.stderr, out
    out = daemon.ledgerctl("resolve", "nope", "p", "k", "--take", "ours")
    assert out.returncode == 1 and b"no ledger nope" in out.stderr, out


async def test_taking_a_lazy_sibling_over_1_mib_fetches_it_and_converges(
    three: list[Daemon],
) -> None:
    a, b, _ = three
    big = bytes(range(256)) * 8192  # 2 MiB: listed by its size, not inline
    async with AsyncClient(a.socket) as ca, AsyncClient(b.socket) as cb:
        await ca.put("l", "p", b"k", big, lazy=True)
        await cb.put("l", "p", b"k", b"small")
        for client in (ca, cb, ca):
            await client.sync(timeout=60)
        (page,) = await cb.conflicts("l", "p")
        (c,) = page.conflicts
        assert c.ours.value == b"small" and c.ours.device == page.device
        (theirs,) = c.theirs
        assert theirs.value is None and theirs.size == len(big) and theirs.priority == "lazy"
        text = b.ledgerctl("conflicts", "l", "p", check=True).stdout.decode()
        assert "theirs  <2.0 MiB>" in text and ", lazy)" in text, text
        done = await cb.resolve("l", "p", b"k", take="theirs", expect=c.expect)
        assert done.conflicts == 0 and await cb.get("l", "p", b"k") == big
        for cl in (cb, ca):
            await cl.sync(timeout=60)
        for cl in (ca, cb):
            assert await cl.get("l", "p", b"k") == big
            assert (await cl.conflicts("l", "p"))[0].count == 0


async def test_a_key_conflict_on_a_page_that_came_to_hold_documents_is_resolved(
    three: list[Daemon],
) -> None:
    """A page whose keys were in conflict and that then took a document (any document
    write makes a page a document page) listed those conflicts, in ``ledgerctl
    conflicts`` and ``status``, with the ``ledgerctl resolve`` commands that end them,
    and each of those commands was refused (409 ``not_resolvable``, exit status 4):
    the page's keys could only be ended by writing them again. The keys outside the
    document layer are resolved as on any page; a document's keys still are not."""
    a, b, _ = three
    await _conflicting_writes(a, b)
    c = AsyncClient(b.socket)
    try:
        await c.documents("l", "p").create("people", {"name": "Ann"}, id="ann")
    finally:
        await c.close()
    (page,) = _conflicts(b)
    (key,) = page["conflicts"]
    text = b.ledgerctl("conflicts", "l", "p", check=True).stdout.decode()
    assert f"ledgerctl resolve l p k --take ours --expect {key['expect']}" in text, text
    out = b.ledgerctl("resolve", "l", "p", "k", "--take", "theirs", "--expect", key["expect"])
    assert out.returncode == 0, out.stderr
    assert out.stdout.decode() == "resolved 1 key (k); 0 conflicts left on l p\n"
    assert _ls(b)[b"k"] == b"from a"
    for held in (doclayout.MARKER, doclayout.head_key("people", "ann")):
        out = b.ledgerctl("--hex", "resolve", b"l".hex(), b"p".hex(), held.hex(), "--take", "ours")
        assert out.returncode == 4 and b"(not_resolvable)" in out.stderr, out.stderr
    out = b.ledgerctl("resolve", "l", "p", "--take", "ours")  # nothing left to resolve
    assert out.returncode == 4 and b"(not_resolvable)" in out.stderr, out.stderr
