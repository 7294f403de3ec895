"""Keys up to the 4 KiB limit work through every interface, whatever their bytes;
past it, ``key_too_large``."""

from __future__ import annotations

import base64

import aiohttp
import pytest
from yarl import URL

from ledgerd.daemon.client import AsyncClient, LedgerError
from tests.daemon.conftest import Daemon

KEY = bytes(0x80 + i % 128 for i in range(4096))  # every byte percent-encoded: 12 KiB in a URL
END = b"\xff" * 4096  # a bound past KEY, itself at the limit
LEDGER = bytes(0x80 + i for i in range(128))
PAGE = bytes(0xFF - i for i in range(128))


def pct(data: bytes) -> str:
    return "".join(f"%{b:02X}" for b in data)


def u(path: str) -> URL:
    return URL("http://ledgerd" + path, encoded=True)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def test_the_largest_key_over_http(daemon: Daemon, http: aiohttp.ClientSession) -> None:
    page = f"/v1/ledgers/{pct(LEDGER)}/pages/{pct(PAGE)}"
    r = await http.put(u(f"{page}/keys/{pct(KEY)}?priority=lazy"), data=b"v")
    assert r.status == 204, await r.text()
    assert await (await http.get(u(f"{page}/keys/{pct(KEY)}"))).read() == b"v"
    token_key = KEY[:-1] + b"\x00"  # listed before KEY: a continuation token names KEY
    await http.put(u(f"{page}/keys/{pct(token_key)}"), data=b"w")
    q = f"start={pct(token_key)}&end={pct(END)}&prefix={pct(KEY[:-1])}&limit=1"
    doc = await (await http.get(u(f"{page}/entries?{q}"))).json()
    assert [base64.b64decode(e["key"]) for e in doc["entries"]] == [token_key]
    q += "&token=" + pct(doc["next"].encode())
    doc = await (await http.get(u(f"{page}/entries?{q}"))).json()
    assert [base64.b64decode(e["key"]) for e in doc["entries"]] == [KEY]
    assert (await http.delete(u(f"{page}/keys/{pct(KEY)}"))).status == 204
    # One byte more: key_too_large, in the path (414) and in a batch (400).
    r = await http.put(u(f"{page}/keys/{pct(KEY + b'x')}"), data=b"v")
    assert r.status == 414 and (await r.json())["error"]["code"] == "key_too_large"
    r = await http.post(
        u(f"{page}/batch"), json={"ops": [{"op": "put", "key": b64(KEY + b"x"), "value": ""}]}
    )
    assert r.status == 400 and (await r.json())["error"]["code"] == "key_too_large"
    # Far past it, text or binary: the request line is refused, the same way.
    for big in (b"k" * 100_000, KEY * 5):
        r = await http.put(u(f"{page}/keys/{pct(big)}"), data=b"v")
        assert r.status == 414 and (await r.json())["error"]["code"] == "key_too_large"
    assert (await http.get(u("/v1/status"))).status == 200
    log = daemon.log_text()
    assert "ERROR" not in log and "Traceback" not in log, log


async def test_the_largest_key_through_the_client_and_a_session(daemon: Daemon) -> None:
    async with AsyncClient(daemon.socket) as c:
        await c.put(LEDGER, PAGE, KEY, b"v")
        assert await c.get(LEDGER, PAGE, KEY) == b"v"
        got = [it.key async for it in c.entries(LEDGER, PAGE, start=KEY, prefix=KEY, end=END)]
        assert got == [KEY]
        await c.delete(LEDGER, PAGE, KEY)
        with pytest.raises(LedgerError) as e:
            await c.put(LEDGER, PAGE, KEY + b"x", b"v")
        assert e.value.code == "key_too_large"
        with pytest.raises(LedgerError) as e:
            await c.get(LEDGER, PAGE, KEY * 5)
        assert e.value.code == "key_too_large"
        async with c.transaction(LEDGER, PAGE) as txn:
            await txn.put(KEY, b"t")
            assert await txn.get(KEY) == b"t"
            with pytest.raises(LedgerError) as e:
                await txn.put(KEY + b"x", b"v")
            assert e.value.code == "key_too_large"
        assert await c.get(LEDGER, PAGE, KEY) == b"t"


def test_the_largest_key_through_the_cli(daemon: Daemon) -> None:
    names = [LEDGER.hex(), PAGE.hex(), KEY.hex()]
    assert daemon.ledgerctl("--hex", "put", *names, "value").returncode == 0
    out = daemon.ledgerctl("--hex", "get", *names)
    assert out.returncode == 0 and out.stdout == b"value", out.stderr
    out = daemon.ledgerctl("--hex", "put", names[0], names[1], (KEY + b"x").hex(), "v")
    assert out.returncode != 0 and b"4096" in out.stderr, out.stderr


async def test_a_batch_refused_for_its_key_makes_no_page(http: aiohttp.ClientSession) -> None:
    # Its keys were checked by the page's write, after the page was made: a refused
    # batch left an empty page (and ledger) listed, where a bad template leaves none.
    for ops in (
        [{"op": "put", "key": b64(b"k" * 4097), "value": b64(b"v")}],
        [
            {"op": "put", "key": b64(b"ok"), "value": b64(b"v")},
            {"op": "delete", "key": b64(b"k" * 4097)},
        ],
    ):
        async with http.post(u("/v1/ledgers/refused/pages/p/batch"), json={"ops": ops}) as r:
            assert r.status == 400
            assert (await r.json())["error"]["code"] == "key_too_large"
        async with http.get(u("/v1/ledgers")) as r:
            assert b64(b"refused") not in [x["name"] for x in (await r.json())["ledgers"]]
        async with http.get(u("/v1/ledgers/refused/pages/p/entries")) as r:
            assert r.status == 404
