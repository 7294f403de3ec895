"""Every byte value round-trips in keys, ledger names and page ids (HTTP, client, CLI)."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest
from yarl import URL

from ledgerd.daemon.client import AsyncClient
from tests.daemon.conftest import Daemon, start_daemon

BYTES = [bytes([b]) for b in range(256)]
KEYS = BYTES + [b"k" + x + b"/" + x for x in BYTES]  # alone, and inside a longer key
LEDGERS = BYTES
PAGES = [b"p" + x + x for x in BYTES]
NUL = b"\0"


def pct(data: bytes) -> str:
    return "".join(f"%{b:02X}" for b in data)


def u(path: str) -> URL:
    return URL("http://ledgerd" + path, encoded=True)


@pytest.fixture
def quick_close(short_tmp: Path) -> Iterator[Daemon]:
    """A daemon that closes idle pages at once: these tests make hundreds of pages."""
    d = start_daemon(short_tmp, env={"LEDGERD_PAGE_IDLE_SECONDS": "0"})
    try:
        yield d
    finally:
        assert d.stop() == 0, d.log_text()


@pytest.fixture
async def http(quick_close: Daemon) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(
        connector=aiohttp.UnixConnector(path=str(quick_close.socket))
    ) as s:
        yield s


async def test_every_byte_over_http(http: aiohttp.ClientSession) -> None:
    page = "/v1/ledgers/l/pages/p"
    for i, k in enumerate(KEYS):
        r = await http.put(u(f"{page}/keys/{pct(k)}"), data=b"v%d" % i)
        assert r.status == 204, (k, await r.text())
    for i, k in enumerate(KEYS):
        r = await http.get(u(f"{page}/keys/{pct(k)}"))
        assert r.status == 200 and await r.read() == b"v%d" % i, k
    doc = await (await http.get(u(f"{page}/entries?values=0&limit=10000"))).json()
    assert [base64.b64decode(e["key"]) for e in doc["entries"]] == sorted(KEYS)
    for k in KEYS:  # as a listing's bounds and prefix, too
        q = f"start={pct(k)}&end={pct(k + NUL)}&prefix={pct(k)}&values=0"
        doc = await (await http.get(u(f"{page}/entries?{q}"))).json()
        assert [base64.b64decode(e["key"]) for e in doc["entries"]] == [k], k
    for k in KEYS:
        assert (await http.delete(u(f"{page}/keys/{pct(k)}"))).status == 204, k
        assert (await http.get(u(f"{page}/keys/{pct(k)}"))).status == 404, k
    for name in LEDGERS:
        r = await http.put(u(f"/v1/ledgers/{pct(name)}/pages/p/keys/k"), data=name)
        assert r.status == 204, (name, await r.text())
        assert await (await http.get(u(f"/v1/ledgers/{pct(name)}/pages/p/keys/k"))).read() == name
    doc = await (await http.get(u("/v1/ledgers"))).json()
    assert {base64.b64decode(x["name"]) for x in doc["ledgers"]} == set(LEDGERS)
    for name in PAGES:
        r = await http.put(u(f"/v1/ledgers/l/pages/{pct(name)}/keys/k"), data=name)
        assert r.status == 204, (name, await r.text())
        assert await (await http.get(u(f"/v1/ledgers/l/pages/{pct(name)}/keys/k"))).read() == name
        r = await http.get(u(f"/v1/ledgers/l/pages/{pct(name)}/entries"))
        assert [base64.b64decode(e["key"]) for e in (await r.json())["entries"]] == [b"k"]
    doc = await (await http.get(u("/v1/ledgers/l/pages"))).json()
    assert {base64.b64decode(x["id"]) for x in doc["pages"]} == {b"p", *PAGES}


async def test_every_byte_through_the_client(quick_close: Daemon) -> None:
    async with AsyncClient(quick_close.socket) as c:
        for i, k in enumerate(KEYS):
            await c.put("l", "p", k, b"v%d" % i)
        for i, k in enumerate(KEYS):
            assert await c.get("l", "p", k) == b"v%d" % i, k
        assert [it.key for it in [x async for x in c.entries("l", "p")]] == sorted(KEYS)
        for k in KEYS:
            got = [x.key async for x in c.entries("l", "p", start=k, prefix=k, end=k + b"\0")]
            assert got == [k], k
        for k in KEYS:
            await c.delete("l", "p", k)
        assert [x async for x in c.entries("l", "p")] == []
        for name in LEDGERS:
            await c.put(name, "p", b"k", name)
            assert await c.get(name, "p", b"k") == name
        assert set(await c.ledgers()) == {b"l", *LEDGERS}
        for name in PAGES:
            await c.put("l", name, b"k", name)
            assert await c.get("l", name, b"k") == name
        assert set(await c.pages("l")) == {b"p", *PAGES}


async def test_unknown_routes_are_not_found(http: aiohttp.ClientSession) -> None:
    for path in ("/", "/v1", "/v1/nothing", "/x%0Ay", "/v1/ledgers/l/pages/p/nothing", "/%FF"):
        for method in ("GET", "PUT", "PATCH"):
            r = await http.request(method, u(path))
            assert r.status == 404, (method, path)
            assert (await r.json())["error"]["code"] == "not_found", (method, path)


def test_special_bytes_through_the_cli(quick_close: Daemon) -> None:
    """The CLI with ``--hex``: a process per call, so a sample of the awkward bytes."""
    for b in (0x00, 0x0A, 0x0D, 0x20, 0x23, 0x25, 0x2E, 0x2F, 0x3F, 0x7F, 0xFF):
        x = bytes([b]).hex()
        names = [x + "6c", x + "70", "6b" + x + x]
        out = quick_close.ledgerctl("--hex", "put", *names, input=bytes([b]))
        assert out.returncode == 0, out.stderr.decode()
        out = quick_close.ledgerctl("--hex", "get", *names)
        assert out.returncode == 0 and out.stdout == bytes([b]), out.stderr.decode()
        out = quick_close.ledgerctl("--hex", "delete", *names)
        assert out.returncode == 0, out.stderr.decode()
        assert quick_close.ledgerctl("--hex", "get", *names).returncode != 0
