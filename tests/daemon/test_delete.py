"""Deleting a page or a ledger through the daemon: the HTTP routes, both Python
clients, ``ledgerctl rm`` (its confirmation rule and exit statuses), and two daemons
syncing the delete through moto's HTTP server."""

from __future__ import annotations

import os
import select
import subprocess
import time
from collections.abc import Iterator

import aiohttp
import pytest
from yarl import URL

from ledgerd.daemon.client import AsyncClient, Client, NotFoundError
from tests.daemon.conftest import ROOT, Daemon, _ls, _sync
from tests.daemon.test_cli import cli_cmd, cli_env, ctl, ctl_fails, ledger, seed, shared_daemon

__all__ = ["ledger"]  # a fixture


@pytest.fixture(scope="module")
def shared() -> Iterator[Daemon]:
    yield from shared_daemon()


def _url(path: str) -> URL:
    return URL("http://ledgerd" + path, encoded=True)


async def test_delete_routes(http: aiohttp.ClientSession) -> None:
    odd = "/v1/ledgers/%00%FF%2E/pages/%2E%2E"  # any bytes, '..' as a page id
    for path in (odd + "/keys/k", "/v1/ledgers/l/pages/p/keys/k", "/v1/ledgers/l/pages/q/keys/k"):
        async with http.put(_url(path), data=b"v") as r:
            assert r.status == 204
    async with http.delete(_url(odd)) as r:
        assert r.status == 204
    async with http.get("/v1/ledgers") as r:
        assert [x["text"] for x in (await r.json())["ledgers"]] == ["l"]
    async with http.get(_url(odd + "/keys/k")) as r:  # reads answer as for an empty page
        assert (r.status, (await r.json())["error"]["code"]) == (404, "key_not_found")
    async with http.delete(_url(odd)) as r:  # deleted already: its ledger is not listed
        assert (r.status, (await r.json())["error"]["code"]) == (404, "ledger_not_found")
    async with http.delete("/v1/ledgers/l/pages/nope") as r:
        assert (r.status, (await r.json())["error"]["code"]) == (404, "page_not_found")
    async with http.delete("/v1/ledgers/nope") as r:
        assert (r.status, (await r.json())["error"]["code"]) == (404, "ledger_not_found")
    async with http.delete("/v1/ledgers/l") as r:
        assert r.status == 204
    async with http.get("/v1/ledgers/l/pages") as r:
        assert (r.status, (await r.json())["error"]["code"]) == (404, "ledger_not_found")
    async with http.get("/v1/ledgers") as r:
        assert (await r.json())["ledgers"] == []
    async with http.put("/v1/ledgers/l/pages/q/keys/new", data=b"v") as r:  # back again
        assert r.status == 204
    async with http.get("/v1/ledgers/l/pages") as r:
        assert [x["text"] for x in (await r.json())["pages"]] == ["q"]
    async with http.get("/v1/ledgers/l/pages/q/entries") as r:
        assert len((await r.json())["entries"]) == 1


async def test_clients(shared: Daemon, ledger: str) -> None:
    seed(shared, ledger, "a", [(b"k", b"v", "eager")])
    seed(shared, ledger, "b", [(b"k", b"v", "eager")])
    async with AsyncClient(shared.socket) as c:
        await c.delete_page(ledger, "a")
        assert await c.pages(ledger) == [b"b"]
        with pytest.raises(NotFoundError) as e:
            await c.delete_page(ledger, "a")
        assert e.value.code == "page_not_found"
    with Client(shared.socket) as c:
        c.delete_ledger(ledger)
        assert ledger.encode() not in c.ledgers()
        with pytest.raises(NotFoundError) as e:
            c.delete_ledger(ledger)
        assert e.value.code == "ledger_not_found"


def test_rm_a_page_and_a_ledger(shared: Daemon, ledger: str) -> None:
    for page in ("a", "b", "c"):
        seed(shared, ledger, page, [(b"k", b"v", "eager")])
    assert ctl(shared, "rm", ledger, "a") == b""
    assert ctl(shared, "pages", ledger) == b"b\nc\n"
    assert ctl_fails(shared, 1, "rm", ledger, "a") == f"ledgerctl: no page a in ledger {ledger}\n"
    err = ctl_fails(shared, 2, "rm", ledger)  # stdin is not a terminal: --yes is needed
    assert "needs --yes" in err
    assert ctl(shared, "pages", ledger) == b"b\nc\n"  # nothing deleted
    assert ctl(shared, "rm", ledger, "--yes", "--json") == b""
    assert ledger.encode() not in ctl(shared, "ledgers").split(b"\n")
    assert ctl_fails(shared, 1, "rm", "-y", ledger) == f"ledgerctl: no ledger {ledger}\n"
    hexname = ledger.encode().hex()
    seed(shared, ledger, b"\xff", [(b"k", b"v", "eager")])
    assert ctl(shared, "rm", "--hex", hexname, "ff") == b""


def _rm_on_a_terminal(d: Daemon, ledger: str, answer: bytes) -> tuple[int, bytes]:
    """``ledgerctl rm LEDGER`` with stdin and stderr on a pseudo-terminal: answers the
    question once it is shown; returns the status and what the terminal showed."""
    master, slave = os.openpty()
    proc = subprocess.Popen(
        cli_cmd("rm", ledger),
        stdin=slave,
        stdout=subprocess.PIPE,
        stderr=slave,
        env=cli_env(d.socket),
        cwd=ROOT,
    )
    os.close(slave)
    shown = b""
    try:
        deadline = time.monotonic() + 60
        while b"[y/N]" not in shown:
            ready, _, _ = select.select([master], [], [], max(0.0, deadline - time.monotonic()))
            assert ready, f"no question; the terminal showed {shown!r}"
            shown += os.read(master, 4096)
        os.write(master, answer + b"\n")
        code = proc.wait(60)
        while select.select([master], [], [], 0)[0]:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the other side is closed
                break
            if not chunk:
                break
            shown += chunk
        assert proc.stdout is not None and proc.stdout.read() == b""
        return code, shown
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        os.close(master)


def test_rm_a_ledger_asks_on_a_terminal(shared: Daemon, ledger: str) -> None:
    seed(shared, ledger, "a", [(b"k", b"v", "eager")])
    seed(shared, ledger, "b", [(b"k", b"v", "eager")])
    code, shown = _rm_on_a_terminal(shared, ledger, b"n")
    assert code == 0 and f"delete ledger {ledger} (2 pages)".encode() in shown, shown
    assert b"not deleted" in shown
    assert ctl(shared, "pages", ledger) == b"a\nb\n"
    code, shown = _rm_on_a_terminal(shared, ledger, b"y")
    assert code == 0, shown
    assert ledger.encode() not in ctl(shared, "ledgers").split(b"\n")


def test_a_delete_reaches_another_daemon(three: list[Daemon]) -> None:
    a, b, _ = three
    ctl(a, "put", "notes", "inbox", "k", "v")
    ctl(a, "put", "notes", "kept", "k", "v")
    _sync(a)
    _sync(b)
    assert ctl(b, "pages", "notes") == b"inbox\nkept\n"
    assert ctl(a, "rm", "notes", "inbox") == b""
    _sync(a)
    _sync(b)
    assert ctl(b, "pages", "notes") == b"kept\n"
    assert _ls(b) == []
    ctl(b, "put", "notes", "inbox", "again", "from b")  # back, with only the new key
    _sync(b)
    _sync(a)
    assert ctl(a, "pages", "notes") == b"inbox\nkept\n"
    assert [d["key"] for d in _ls(a)] == ["YWdhaW4="]


async def test_deleting_an_absent_key_leaves_a_deleted_page_deleted(
    http: aiohttp.ClientSession,
) -> None:
    """A deleted page reads as empty, so a delete of any of its keys (a DELETE, a batch
    of deletes) removes nothing: the page stays out of the listings, as it does when
    the keys written since the delete are deleted again."""
    page = "/v1/ledgers/l/pages/p"
    async with http.put(page + "/keys/k", data=b"v") as r:
        assert r.status == 204
    async with http.delete(page) as r:
        assert r.status == 204
    async with http.delete(page + "/keys/never-there") as r:
        assert r.status == 204
    async with http.post(page + "/batch", json={"ops": [{"op": "delete", "key": "aw=="}]}) as r:
        assert r.status == 200
    async with http.get("/v1/ledgers/l/pages") as r:
        assert (r.status, (await r.json())["error"]["code"]) == (404, "ledger_not_found")
    async with http.get("/v1/ledgers") as r:
        assert (await r.json())["ledgers"] == []
    async with http.put(page + "/keys/new", data=b"v") as r:  # a put still brings it back
        assert r.status == 204
    async with http.post(page + "/batch", json={"ops": [{"op": "delete", "key": "eA=="}]}) as r:
        assert r.status == 200
    async with http.delete(page + "/keys/new") as r:  # and its delete deletes it again
        assert r.status == 204
    async with http.get(page + "/heads") as r:  # once committed (heads flush the page)
        assert r.status == 200
    async with http.get("/v1/ledgers") as r:
        assert (await r.json())["ledgers"] == []
