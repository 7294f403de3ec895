"""A corrupt stored value: a clean error, never a second response inside a body."""

from __future__ import annotations

import asyncio
import io
import random
import sqlite3
from pathlib import Path

import aiohttp
import pytest
from yarl import URL

from ledgerd.daemon.client import Client, DaemonUnavailableError, LedgerError
from ledgerd.store import Repository
from ledgerd.store.pieces import digest as dg
from ledgerd.store.pieces import split
from tests.daemon.conftest import start_daemon

P = "/v1/ledgers/l/pages/p"


def u(path: str) -> URL:
    return URL("http://ledgerd" + path, encoded=True)


async def _chunks(data_dir: Path, key: bytes) -> tuple[Path, list[bytes]]:
    """The page's SQLite file and the digests of the value's chunks, in order."""
    async with await Repository.open(data_dir) as repo:
        page = await repo.ledger(b"l").page(b"p")
        entry = await page.get_entry(key)
        assert entry is not None and dg.is_index(entry.value)
        out: list[bytes] = []

        async def walk(d: bytes) -> None:
            if not dg.is_index(d):
                out.append(d)
                return
            for c in split.decode_index(await page.objects.get_piece(d)):
                await walk(c.digest)

        await walk(entry.value)
        return repo.page_path(b"l", b"p"), out


def _corrupt(db: Path, digest: bytes) -> None:
    with sqlite3.connect(db) as con:
        n = con.execute(
            "UPDATE objects SET data = zeroblob(length(data)) WHERE digest = ?", (digest,)
        ).rowcount
    con.close()
    assert n == 1


@pytest.mark.parametrize("which", ["last", "first"])
async def test_a_corrupt_chunk_never_hangs_the_client(short_tmp: Path, which: str) -> None:
    value = random.Random(4).randbytes(6 * 1024 * 1024)  # hundreds of chunks
    d = start_daemon(short_tmp)
    try:
        async with aiohttp.ClientSession(
            connector=aiohttp.UnixConnector(path=str(d.socket))
        ) as http:
            assert (await http.put(u(P + "/keys/big"), data=io.BytesIO(value))).status == 204
            assert (await http.put(u(P + "/keys/small"), data=b"fine")).status == 204
    finally:
        assert d.stop() == 0
    db, chunks = await _chunks(d.data, b"big")
    assert len(chunks) > 100
    _corrupt(db, chunks[-1] if which == "last" else chunks[0])
    d = start_daemon(short_tmp)
    try:
        async with aiohttp.ClientSession(
            connector=aiohttp.UnixConnector(path=str(d.socket))
        ) as http:
            r = await asyncio.wait_for(http.get(u(P + "/keys/big")), 30)
            if which == "first":  # found before the headers: a clean JSON error
                assert r.status == 500
                assert (await r.json())["error"]["code"] == "corrupt"
            else:  # found mid-body: the connection is cut, the body is short
                assert r.status == 200
                with pytest.raises(aiohttp.ClientPayloadError):
                    await asyncio.wait_for(r.read(), 30)
            # The daemon is fine, and other values are served.
            assert await (await http.get(u(P + "/keys/small"))).read() == b"fine"
    finally:
        code = d.stop()
    assert code == 0
    log = d.log_text()
    assert "does not match its digest" in log and "Traceback" not in log, log


async def test_ledgerctl_reports_a_value_damaged_mid_body_as_damage(short_tmp: Path) -> None:
    """A damaged chunk in the middle of a large value: the daemon cuts the body short,
    and ledgerctl said "cannot reach ledgerd" (exit 3) while the daemon ran. The client
    asks for the rest, the daemon reports the damage before any byte of it, and
    ledgerctl says the data is damaged (exit 5); the Python clients raise ``corrupt``."""
    value = random.Random(5).randbytes(6 * 1024 * 1024)
    d = start_daemon(short_tmp)
    try:
        with Client(d.socket) as c:
            c.put("l", "p", b"big", value)
    finally:
        assert d.stop() == 0
    db, chunks = await _chunks(d.data, b"big")
    _corrupt(db, chunks[len(chunks) // 2])
    d = start_daemon(short_tmp)
    try:
        target = short_tmp / "out.bin"
        for args in (("get", "l", "p", "big"), ("get", "-o", str(target), "l", "p", "big")):
            out = d.ledgerctl(*args)
            err = out.stderr.decode()
            assert out.returncode == 5, (args, err)
            assert err.startswith("ledgerctl: damaged data: ") and "(corrupt)" in err, err
            assert "does not match its digest" in err and "cannot reach" not in err, err
        assert not target.exists()
        with Client(d.socket) as c, pytest.raises(LedgerError) as e:
            c.get("l", "p", b"big")
        assert e.value.code == "corrupt" and not isinstance(e.value, DaemonUnavailableError)
    finally:
        assert d.stop() == 0
