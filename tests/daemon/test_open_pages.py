"""The daemon's bound on open pages: max_open_pages, and a clear 503 when all are busy."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from tests.daemon.conftest import start_daemon


async def test_when_every_open_page_is_busy_a_new_page_is_503(short_tmp: Path) -> None:
    d = start_daemon(short_tmp, env={"LEDGERD_MAX_OPEN_PAGES": "2"})
    try:
        async with aiohttp.ClientSession(
            connector=aiohttp.UnixConnector(path=str(d.socket)), base_url="http://ledgerd"
        ) as http:
            ws = await http.ws_connect("/v1/session")
            # Two transactions hold two pages open: both busy.
            txns = []
            for i, page in enumerate(("cDE=", "cDI=")):  # p1, p2 in ledger l
                await ws.send_json({"id": i, "op": "begin", "ledger": "bA==", "page": page})
                got = await ws.receive_json()
                assert got["ok"], got
                txns.append(got["txn"])
            for _ in range(5):  # a burst: every one 503, and one warning in the log
                r = await http.put("/v1/ledgers/l/pages/third/keys/k", data=b"v")
                body = await r.json()
                assert r.status == 503 and body["error"]["code"] == "unavailable", body
                assert "max_open_pages" in body["error"]["message"]
            assert d.log_text().count("requests turned away") == 1, d.log_text()
            for i, txn in enumerate(txns):  # answered once done: the pages are free again
                await ws.send_json({"id": 10 + i, "op": "rollback", "txn": txn})
                assert (await ws.receive_json())["ok"]
            await ws.close()
            r = await http.put("/v1/ledgers/l/pages/third/keys/k", data=b"v")
            assert r.status == 204
            r = await http.get("/v1/ledgers/l/pages/third/keys/k")
            assert await r.read() == b"v"
    finally:
        assert d.stop() == 0, d.log_text()
