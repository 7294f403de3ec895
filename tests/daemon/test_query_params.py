"""Query parameters take one value each, and flags one of a documented set: a repeated
parameter or a loose flag is 400 ``bad_request`` naming the parameter, in the key API
and the document API alike (the first or the last of a repeated one won, and any flag
value but 0, false, no or empty was true: ``deleted=banana`` listed deleted documents)."""

from __future__ import annotations

import aiohttp
import pytest
from yarl import URL

from ledgerd.daemon.client import Client
from ledgerd.daemon.openapi import document
from tests.daemon.conftest import Daemon

P = "/v1/ledgers/notes/pages/inbox"


def u(path: str) -> URL:
    return URL("http://ledgerd" + path, encoded=True)


async def _refused(http: aiohttp.ClientSession, path: str, name: str) -> None:
    async with http.get(u(path)) as resp:
        doc = await resp.json()
    assert resp.status == 400 and doc["error"]["code"] == "bad_request", (path, doc)
    assert f"query parameter {name} " in doc["error"]["message"], (path, doc)


async def _ok(http: aiohttp.ClientSession, path: str) -> object:
    async with http.get(u(path)) as resp:
        assert resp.status == 200, (path, await resp.text())
        return await resp.json()


@pytest.mark.parametrize(
    ("query", "name"),
    [
        ("values=banana", "values"),
        ("values=2", "values"),
        ("values=0&values=1", "values"),
        ("values=0&values=0", "values"),
        ("limit=1&limit=2", "limit"),
        ("prefix=a&prefix=b", "prefix"),
    ],
)
async def test_the_key_api_refuses_a_repeated_parameter_or_a_loose_flag(
    http: aiohttp.ClientSession, query: str, name: str
) -> None:
    async with http.put(u(P + "/keys/a"), data=b"v") as resp:
        assert resp.status == 204
    await _refused(http, f"{P}/entries?{query}", name)


async def test_flags_take_their_documented_values_in_any_case(
    http: aiohttp.ClientSession,
) -> None:
    async with http.put(u(P + "/keys/a"), data=b"v") as resp:
        assert resp.status == 204
    for v in ("1", "true", "YES", "True"):
        doc = await _ok(http, f"{P}/entries?values={v}")
        assert [e["value"] for e in doc["entries"]] == ["dg=="], v  # type: ignore[index]
    for v in ("0", "false", "No", ""):
        doc = await _ok(http, f"{P}/entries?values={v}")
        assert [e.get("value") for e in doc["entries"]] == [None], v  # type: ignore[index]
    await _ok(http, "/v1/health?sync=1")
    await _refused(http, "/v1/health?sync=banana", "sync")
    await _refused(http, "/v1/health?sync=1&sync=1", "sync")


async def test_the_document_api_refuses_a_repeated_parameter_or_a_loose_flag(
    http: aiohttp.ClientSession,
) -> None:
    docs = P + "/docs/people"
    async with http.post(u(docs), json={"name": "Ann"}) as resp:
        assert resp.status == 201
        one = f"{docs}/{(await resp.json())['_meta']['_id']}"
    async with http.delete(u(one)) as resp:
        assert resp.status == 200
    listed = await _ok(http, docs + "?deleted=1")
    assert len(listed["documents"]) == 1  # type: ignore[index]
    assert len((await _ok(http, docs + "?deleted=true"))["documents"]) == 1  # type: ignore[index]
    assert (await _ok(http, docs + "?deleted=0"))["documents"] == []  # type: ignore[index]
    await _refused(http, docs + "?deleted=banana", "deleted")
    await _refused(http, docs + "?deleted=1&deleted=0", "deleted")
    await _refused(http, one + "?deleted=banana", "deleted")
    await _refused(http, docs + "?limit=1&limit=5", "limit")
    await _refused(http, P + "/docs/_changes?follow=maybe", "follow")
    await _refused(http, P + "/docs/_changes?since=00&since=01", "since")


@pytest.mark.parametrize(
    ("query", "name"),
    [
        ("limit=%EF%BC%91", "limit"),  # a full-width 1
        ("limit=1_0", "limit"),
        ("limit=%201", "limit"),
        ("limit=+1", "limit"),
        ("limit=%D9%A1", "limit"),  # an Arabic-Indic 1
        ("follow=1&heartbeat=1_0", "heartbeat"),
        ("follow=1&heartbeat=%EF%BC%91", "heartbeat"),
        ("follow=1&heartbeat=inf", "heartbeat"),
    ],
)
async def test_the_document_api_takes_numbers_in_ascii_digits_only(
    http: aiohttp.ClientSession, query: str, name: str
) -> None:
    """As the key API does: ``int()`` and ``float()`` also took ``1_0``, blanks, a plus
    sign and other scripts' digits (``limit=１`` listed one document)."""
    docs = P + "/docs/people"
    async with http.post(u(docs), json={"name": "Ann"}) as resp:
        assert resp.status == 201
    await _refused(http, f"{P}/docs/_changes?{query}", name)
    if name == "limit":
        await _refused(http, f"{docs}?{query}", name)
    assert len((await _ok(http, docs + "?limit=1"))["documents"]) == 1  # type: ignore[index]
    await _refused(http, "/v1/ledgers/notes/pages/inbox/entries?limit=%EF%BC%91", "limit")


def test_what_the_client_and_ledgerctl_send_is_still_taken(daemon: Daemon) -> None:
    with Client(daemon.socket) as c:
        c.put("notes", "inbox", b"k", b"v")
        assert [e.key for e in c.entries("notes", "inbox", values=False)] == [b"k"]
        assert c.health(sync=True)["up"]
    out = daemon.ledgerctl("ls", "notes", "inbox")
    assert out.returncode == 0 and b"k" in out.stdout, out.stderr


def test_the_openapi_document_gives_the_flags_values() -> None:
    doc = document()
    entries = doc["paths"]["/v1/ledgers/{ledger}/pages/{page}/entries"]["get"]["parameters"]
    [values] = [p for p in entries if p["name"] == "values"]
    assert values["schema"]["enum"] == ["1", "true", "yes", "0", "false", "no", ""]
    assert "more than once" in doc["info"]["description"]
