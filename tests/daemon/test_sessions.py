"""Sessions: a transaction whose connection drops is rolled back."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from yarl import URL

from ledgerd.daemon import cli_check
from ledgerd.daemon.api import Api, DaemonState
from ledgerd.daemon.client import AsyncClient, LedgerError, NotFoundError
from ledgerd.daemon.config import Config
from ledgerd.daemon.session import Resolvers, Session
from ledgerd.store import Repository
from ledgerd.store.repo import repository
from tests.daemon.conftest import Daemon, start_daemon


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def _wait_for_log(daemon: Daemon, text: str, timeout: float = 20) -> None:
    """Wait for a line in the daemon's log (polling the file, bounded by ``timeout``)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while text not in daemon.log_text():
        assert loop.time() < deadline, f"{text!r} never logged:\n{daemon.log_text()}"
        await asyncio.sleep(0.05)


async def _begin(http: aiohttp.ClientSession) -> tuple[aiohttp.ClientWebSocketResponse, Any]:
    """A session with a transaction begun on page l/p, and the begin's reply."""
    ws = await http.ws_connect(URL("http://ledgerd/v1/session"))
    await ws.send_str(json.dumps({"id": 1, "op": "begin", "ledger": b64(b"l"), "page": b64(b"p")}))
    return ws, await ws.receive_json()


async def _op(ws: aiohttp.ClientWebSocketResponse, **req: Any) -> Any:
    """One session op; its reply, which must be ok."""
    await ws.send_str(json.dumps({"id": 1, **req}))
    reply = await ws.receive_json()
    assert reply["ok"], reply
    return reply


async def test_dropped_connection_rolls_back(daemon: Daemon) -> None:
    async with aiohttp.ClientSession(
        connector=aiohttp.UnixConnector(path=str(daemon.socket))
    ) as http:
        ws, reply = await _begin(http)
        tid = reply["txn"]
        await ws.send_str(
            json.dumps(
                {"id": 2, "op": "put", "txn": tid, "key": b64(b"k"), "value": b64(b"x" * 500_000)}
            )
        )
        assert (await ws.receive_json())["ok"]
        await ws.send_str(
            json.dumps({"id": 3, "op": "put", "txn": tid, "key": b64(b"small"), "value": b64(b"s")})
        )
        assert (await ws.receive_json())["ok"]
        # The client vanishes without committing or closing politely.
        ws._response.connection.transport.abort()  # type: ignore[union-attr]
    await _wait_for_log(daemon, f"rolled back transaction {tid} on disconnect")
    async with AsyncClient(daemon.socket) as c:
        for key in (b"k", b"small"):  # nothing of the dropped transaction is visible
            with pytest.raises(NotFoundError):
                await c.get("l", "p", key)
        # Another session commits normally afterwards.
        async with c.transaction("l", "p") as txn:
            await txn.put(b"after", b"ok")
        assert await c.get("l", "p", b"after") == b"ok"
    assert daemon.stop() == 0
    async with await Repository.open(daemon.data) as repo:
        page = await repo.ledger("l").page("p")
        assert not await page.contains(b"k")
        staged = await page.db.read_all("SELECT count(*) FROM journal_pieces")
        assert staged[0][0] == 0


async def test_session_closing_mid_commit_leaves_one_consistent_state(daemon: Daemon) -> None:
    async with AsyncClient(daemon.socket) as c:
        for i in range(20):
            s = await c.open_session()
            txn = await s.begin("l", "p")
            await txn.put(b"k%d" % i, b"v")
            await s.ws.send_str(json.dumps({"id": 999, "op": "commit", "txn": txn.id}))
            await s.close()  # may land before, during or after the commit
        heads = await c.heads("l", "p")
        assert len(heads) == 1
        keys = {i.key async for i in c.entries("l", "p")}
        assert keys <= {b"k%d" % i for i in range(20)}


class _Socket:
    """Stands in for a session's WebSocket: keeps what is sent; change events fail."""

    def __init__(self) -> None:
        self.sent: list[dict[str, object]] = []
        self.got = asyncio.Event()

    async def send_str(self, text: str) -> None:
        doc = json.loads(text)
        if doc.get("event") == "change":
            raise RuntimeError("cannot send")
        self.sent.append(doc)
        self.got.set()


@pytest.mark.parametrize("how", ["fails", "page closes"])
async def test_a_watcher_that_ends_by_itself_releases_its_page_and_says_so(
    tmp_path: Path, how: str
) -> None:
    """In process: a watcher whose forwarding fails, or whose page closes, no longer
    keeps the page open, leaves the session, and the client gets an ``ended`` event."""
    async with await Repository.open(tmp_path) as repo:
        page = await repo.ledger("l").page("p")
        ws = _Socket()
        session = Session(SimpleNamespace(api=None), ws, 1)  # type: ignore[arg-type]
        watcher = page.watch(b"")
        task = asyncio.create_task(session._forward("w1", watcher))
        session.watchers["w1"] = (watcher, task)
        if how == "fails":
            await page.put(b"k", b"v")
        else:
            await page.close()
        await asyncio.wait_for(ws.got.wait(), 10)
        await task
        assert session.watchers == {} and not page.watchers
        [ended] = ws.sent
        assert ended["event"] == "ended" and ended["watch"] == "w1"
        assert ("error" in ended) == (how == "fails")


async def test_a_watcher_that_falls_behind_is_ended_with_a_reason(tmp_path: Path) -> None:
    """In process: a watcher that fell max_watch_queue notifications behind ends; its
    client gets what was queued, then ``ended`` with code ``watcher_behind``."""
    async with await Repository.open(tmp_path, max_watch_queue=3) as repo:
        page = await repo.ledger("l").page("p")
        watcher = page.watch(b"")
        for i in range(5):  # nobody reads: the fourth notification ends the watcher
            await page.write([(b"k", b"%d" % i)])
            await page.flush()
        assert watcher.closed and watcher.ended_reason
        sent: list[dict[str, object]] = []

        class Keep:
            async def send_str(self, text: str) -> None:
                sent.append(json.loads(text))

        session = Session(SimpleNamespace(api=None), Keep(), 1)  # type: ignore[arg-type]
        await asyncio.wait_for(session._forward("w1", watcher), 10)
        assert [m["event"] for m in sent] == ["change"] * 3 + ["ended"]
        assert sent[-1]["error"]["code"] == "watcher_behind"  # type: ignore[index]


async def test_a_request_id_past_the_largest_double_is_refused_in_strict_json(
    daemon: Daemon,
) -> None:
    """``1e400`` parses as infinity, which a reply could only echo as ``Infinity``: not
    JSON, so strict clients could not read the reply. It is refused, with a null id."""
    async with aiohttp.ClientSession(
        connector=aiohttp.UnixConnector(path=str(daemon.socket))
    ) as http:
        ws = await http.ws_connect(URL("http://ledgerd/v1/session"))
        await ws.send_str('{"id": 1e400, "op": "ping"}')
        text = await ws.receive_str()
        reply = json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in {text}"))
        assert reply["id"] is None and reply["error"]["code"] == "bad_request", reply
        assert "id" in reply["error"]["message"]
        await ws.send_str('{"id": 2.5, "op": "ping"}')  # a finite number is fine
        assert (await ws.receive_json())["id"] == 2.5
        await ws.close()


async def test_sessions_end_with_1001_when_the_daemon_stops(daemon: Daemon) -> None:
    """Stopping the daemon closes open sessions first, with code 1001 (going away)."""
    async with aiohttp.ClientSession(
        connector=aiohttp.UnixConnector(path=str(daemon.socket))
    ) as http:
        ws, reply = await _begin(http)
        assert reply["ok"]
        stopped = asyncio.get_running_loop().run_in_executor(None, daemon.stop)
        message = await ws.receive()
        assert message.type == aiohttp.WSMsgType.CLOSE, message
        assert message.data == 1001 and message.extra == "ledgerd is shutting down"
        assert await stopped == 0, daemon.log_text()


async def test_a_session_get_of_a_value_too_large_for_a_message_is_refused(
    short_tmp: Path,
) -> None:
    """A transaction's ``get`` answers with the whole value in one message: one larger
    than a session message may be (``max_batch_bytes``, as base64) is refused with
    ``too_large`` before it is read, not read whole into the daemon's memory (a 300 MB
    value took the daemon to 2.2 GB), and the session goes on."""
    d = start_daemon(short_tmp, env={"LEDGERD_MAX_BATCH_BYTES": str(1024 * 1024)})
    try:
        async with AsyncClient(d.socket) as c:
            await c.put("l", "p", b"big", b"x" * (3 * 1024 * 1024))
            await c.put("l", "p", b"fits", b"y" * (700 * 1024))  # 933 KiB as base64
            async with c.transaction("l", "p") as txn:
                with pytest.raises(LedgerError) as e:
                    await txn.get(b"big")
                assert e.value.code == "too_large", e.value
                assert "3145728 bytes" in str(e.value)
                assert await txn.get(b"fits") == b"y" * (700 * 1024)
                assert await txn.get(b"absent") is None
    finally:
        assert d.stop() == 0, d.log_text()


async def test_a_watcher_whose_client_does_not_read_holds_a_bounded_amount(
    short_tmp: Path,
) -> None:
    """A watcher's waiting notifications hold their values (up to 64 KiB each): one that
    falls ``max_watch_queue_bytes`` (here 4 MiB) of keys and values behind is ended with
    ``watcher_behind``, however few notifications that is. Before, only their number was
    bounded (1,024): a client that stopped reading while 3.6 MB commits went on held
    1.2 GB of the daemon's memory after 300 commits, and 64 MiB batches could make it
    64 GiB."""
    daemon = start_daemon(short_tmp, env={"LEDGERD_MAX_WATCH_QUEUE_BYTES": str(4 << 20)})
    async with aiohttp.ClientSession(
        connector=aiohttp.UnixConnector(path=str(daemon.socket))
    ) as http:
        ws = await http.ws_connect(URL("http://ledgerd/v1/session"), max_msg_size=0)
        watch = {"id": 1, "op": "watch", "ledger": b64(b"l"), "page": b64(b"p")}
        await ws.send_str(json.dumps(watch))
        assert (await ws.receive_json())["watch"] == "w1"
        transport = ws._response.connection.transport  # type: ignore[union-attr]
        assert transport is not None
        transport.pause_reading()  # the client stops reading
        commits = 20  # of 60 values of 60 KiB: 70 MiB as notifications
        for i in range(commits):
            ops = [
                {"op": "put", "key": b64(b"k%d" % j), "value": b64(bytes([i]) * 60 * 1024)}
                for j in range(60)
            ]
            url = URL("http://ledgerd/v1/ledgers/l/pages/p/batch")
            body = io.BytesIO(json.dumps({"ops": ops}).encode())
            async with http.post(url, data=body) as r:
                assert r.status == 200, await r.text()
        transport.resume_reading()
        changes = 0
        while (msg := await asyncio.wait_for(ws.receive_json(), 60))["event"] == "change":
            changes += 1
        assert msg["event"] == "ended" and msg["error"]["code"] == "watcher_behind", msg
        assert changes <= 2, changes  # 3.6 MB each: the second one waiting is over 4 MiB
        await ws.close()
    assert daemon.stop() == 0, daemon.log_text()


async def test_resolver_registrations_are_kept_once_and_forgotten_with_the_session(
    tmp_path: Path,
) -> None:
    """In process: a session that registers for a ledger again is kept once, and a
    session that ends leaves no trace in the registry. Before, every registration
    appended the session again (and put the whole ledger's conflicts to it again), and
    every ledger ever named kept an empty list after its sessions ended: a client
    registering for new names grew the daemon's memory for good."""
    async with await Repository.open(tmp_path) as repo:
        resolvers = Resolvers()
        api = SimpleNamespace(repo=repo)
        a, b = (SimpleNamespace(api=api, ask=object()) for _ in range(2))
        for _ in range(3):
            resolvers.add(b"l", a)  # type: ignore[arg-type]
        resolvers.add(b"l", b)  # type: ignore[arg-type]
        resolvers.add(b"m", a)  # type: ignore[arg-type]
        assert resolvers.by_ledger == {b"l": [a, b], b"m": [a]}
        assert resolvers.resolver_for(b"l") is a.ask
        resolvers.remove(a)  # type: ignore[arg-type]
        assert resolvers.by_ledger == {b"l": [b]}
        resolvers.remove(b)  # type: ignore[arg-type]
        assert resolvers.by_ledger == {}
        await asyncio.gather(*resolvers._tasks)


@pytest.mark.parametrize("flood", ["requests", "pings"])
async def test_a_session_whose_client_stops_reading_is_ended(short_tmp: Path, flood: str) -> None:
    """A client that sends and never reads fills the socket: the daemon's replies (or
    the pongs aiohttp answers its pings with) wait to be written. It answers no
    heartbeat either, so it is taken as gone and its session ends: its transaction is
    rolled back and its connection closed. Before, the session's reader waited on the
    full socket for good and aiohttp's close of a connection with unsent data waited
    for the client to read it: the connection, its transaction and its page were held
    for as long as the client lived."""
    daemon = start_daemon(
        short_tmp, env={"LEDGERD_SESSION_HEARTBEAT": "0.5", "LEDGERD_REQUEST_TIMEOUT": "1"}
    )
    fds = Path(f"/proc/{daemon.proc.pid}/fd")
    async with aiohttp.ClientSession(  # a connection per request: none held between them
        connector=aiohttp.UnixConnector(path=str(daemon.socket), force_close=True)
    ) as http:
        url = URL("http://ledgerd/v1/ledgers/l/pages/p/keys/big")
        async with http.put(url, data=b"x" * 500_000) as r:
            assert r.status == 204
        before = len(list(fds.iterdir()))
        ws, reply = await _begin(http)
        ws_transport = ws._response.connection.transport  # type: ignore[union-attr]
        assert ws_transport is not None
        ws_transport.pause_reading()  # the client stops reading, goes on sending
        get = {"id": 2, "op": "get", "txn": reply["txn"], "key": b64(b"big")}

        async def send_until_blocked() -> None:
            while True:  # until the daemon stops reading too (its socket full)
                if flood == "requests":
                    await ws.send_str(json.dumps(get))
                else:
                    await ws.ping(b"p" * 100)

        with contextlib.suppress(TimeoutError, ConnectionError):
            await asyncio.wait_for(send_until_blocked(), 3)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 20
        while len(list(fds.iterdir())) > before:
            assert loop.time() < deadline, "the session of a client that reads nothing stayed"
            await asyncio.sleep(0.1)
        async with http.get(URL("http://ledgerd/v1/health")) as r:
            assert r.status == 200
        ws_transport.abort()
        await ws.close()
    assert daemon.stop() == 0, daemon.log_text()


async def test_a_transaction_that_made_its_page_and_changed_nothing_leaves_no_page(
    daemon: Daemon,
) -> None:
    """A session's begin on a page that does not exist makes it (the transaction needs
    a base); rolled back, committed with no change, or dropped with the connection, the
    page goes again, as a failed first write's does. A commit that writes keeps it."""

    async with (
        aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(daemon.socket))) as http,
        AsyncClient(daemon.socket) as c,
    ):
        await c.put("l", "kept", b"k", b"v")  # the ledger stays: another page is in it
        ws = await http.ws_connect(URL("http://ledgerd/v1/session"))
        for name, end in (("rolled", "rollback"), ("empty", "commit"), ("written", "commit")):
            tid = (await _op(ws, op="begin", ledger=b64(b"l"), page=b64(name.encode())))["txn"]
            if name == "written":
                await _op(ws, op="put", txn=tid, key=b64(b"k"), value=b64(b"v"))
            await _op(ws, op=end, txn=tid)
        await _op(ws, op="begin", ledger=b64(b"l"), page=b64(b"dropped"))
        ws._response.connection.transport.abort()  # type: ignore[union-attr]
        await _wait_for_log(daemon, "on disconnect")
        assert sorted(await c.pages("l")) == [b"kept", b"written"]


async def test_a_page_made_by_sessions_that_wrote_nothing_is_not_left_listed(
    daemon: Daemon,
) -> None:
    """Two sessions begin on a page that does not exist (the first makes it) and both
    end without a change: the page goes once the last of them ends, whichever made
    it. A watch on a page that does not exist makes it too (a watcher needs its page
    open); unwatched, or dropped with its session, with nothing written, it goes."""

    async with (
        aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(daemon.socket))) as http,
        AsyncClient(daemon.socket) as c,
    ):
        await c.put("l", "kept", b"k", b"v")  # the ledger stays: another page is in it
        one = await http.ws_connect(URL("http://ledgerd/v1/session"))
        two = await http.ws_connect(URL("http://ledgerd/v1/session"))
        named = {"ledger": b64(b"l"), "page": b64(b"shared")}
        first = (await _op(one, op="begin", **named))["txn"]  # makes the page
        second = (await _op(two, op="begin", **named))["txn"]
        await _op(one, op="rollback", txn=first)  # the other transaction still uses it
        await _op(two, op="commit", txn=second)  # no change
        wid = (await _op(one, op="watch", ledger=b64(b"l"), page=b64(b"watched")))["watch"]
        await _op(one, op="unwatch", watch=wid)
        assert sorted(await c.pages("l")) == [b"kept"]

        await _op(two, op="watch", ledger=b64(b"l"), page=b64(b"dropped"))
        two._response.connection.transport.abort()  # type: ignore[union-attr]
        await _wait_for_log(daemon, "page dropped removed")
        assert sorted(await c.pages("l")) == [b"kept"]
        await one.close()


@pytest.mark.parametrize("paused", ["before its directory goes", "before its mark goes"])
async def test_a_begin_on_a_page_being_removed_as_unwritten_marks_the_page_it_makes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, paused: str
) -> None:
    """In process: a transaction that made its page ends with no change, so the page
    goes; a begin on it in another session meanwhile makes it again, and that page must
    be marked unwritten (its transaction is open, nothing committed), or a daemon
    killed then leaves it listed, empty, after the restart. It was left unmarked: a
    begin that looked while the removal was under way found the page there (made none,
    marked none); one that looked just after had its new mark dropped by the removal."""
    key = (b"l", b"p")
    named = {"ledger": b64(key[0]), "page": b64(key[1])}
    gate, reached = threading.Event(), threading.Event()

    def pause() -> None:
        reached.set()
        assert gate.wait(20)

    async with await Repository.open(tmp_path) as repo:
        api = Api(repo, Config(data_dir=tmp_path), DaemonState())
        one, two = (Session(SimpleNamespace(api=api), _Socket(), n) for n in (1, 2))  # type: ignore[arg-type]
        if paused == "before its directory goes":
            remove = repository._remove_page_dir

            def remove_later(page_dir: Path) -> None:
                pause()
                remove(page_dir)

            monkeypatch.setattr(repository, "_remove_page_dir", remove_later)
        else:
            written = repo.written

            async def written_later(ledger: bytes, page_id: bytes) -> None:
                await asyncio.to_thread(pause)
                await written(ledger, page_id)

            monkeypatch.setattr(repo, "written", written_later)
        no_open_of, waiting = repo._no_open_of, asyncio.Event()

        @contextlib.asynccontextmanager
        async def seen_waiting(k: tuple[bytes, bytes]) -> AsyncIterator[None]:
            if k in repo._opening and repo._opening[k].lock.locked():
                waiting.set()
            async with no_open_of(k):
                yield

        monkeypatch.setattr(repo, "_no_open_of", seen_waiting)
        first = (await one.op_begin(named))["txn"]
        ending = asyncio.create_task(one.op_commit({"txn": first}))  # no change: removes p
        await asyncio.to_thread(reached.wait, 20)
        beginning = asyncio.create_task(two.op_begin(named))
        await asyncio.wait_for(waiting.wait(), 20)  # the begin waits for the removal
        gate.set()
        await ending
        await beginning  # its transaction stays open: the daemon dies now
    async with await Repository.open(tmp_path) as repo:
        assert await repo.ledger("l").pages() == []
        assert not repo.page_exists(*key)


async def test_a_page_whose_only_state_is_its_merge_policy_is_not_removed_by_sessions(
    daemon: Daemon,
) -> None:
    """Setting a page's merge policy makes the page and remembers the policy, with no
    commit: a transaction or watcher on it that ends with no change must not take it
    for a page nobody wrote to (the policy, acknowledged, would go with it)."""

    async with (
        aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(daemon.socket))) as http,
        AsyncClient(daemon.socket) as c,
    ):
        await c.policy("l", "p", "custom")
        ws = await http.ws_connect(URL("http://ledgerd/v1/session"))
        named = {"ledger": b64(b"l"), "page": b64(b"p")}
        await _op(ws, op="rollback", txn=(await _op(ws, op="begin", **named))["txn"])
        await _op(ws, op="unwatch", watch=(await _op(ws, op="watch", **named))["watch"])
        await ws.close()
        assert await c.pages("l") == [b"p"]
        assert (await c.policy("l", "p"))["policy"] == "custom"


async def test_a_transaction_left_idle_is_rolled_back_and_frees_its_page(
    short_tmp: Path,
) -> None:
    # A client that begins a transaction and never ends it held its page open (busy:
    # never closed as idle, counted in max_open_pages), its values and its base's
    # history for the connection's life. Past session_txn_idle_timeout it is rolled
    # back: the client hears why, the page is free, a later use of it is refused.
    d = start_daemon(
        short_tmp,
        env={"LEDGERD_MAX_OPEN_PAGES": "1", "LEDGERD_SESSION_TXN_IDLE_TIMEOUT": "2"},
    )
    try:
        async with aiohttp.ClientSession(
            connector=aiohttp.UnixConnector(path=str(d.socket))
        ) as http:
            ws, reply = await _begin(http)
            tid = reply["txn"]
            await _op(ws, op="put", txn=tid, key=b64(b"k"), value=b64(b"held"))
            # Another client's page: refused while the transaction holds the one page.
            r = await http.put(URL("http://ledgerd/v1/ledgers/l/pages/q/keys/k"), data=b"v")
            assert r.status == 503, await r.text()
            event = await asyncio.wait_for(ws.receive_json(), 30)
            assert event["event"] == "rolled_back" and event["txn"] == tid, event
            assert event["error"]["code"] == "conflict"
            assert "session_txn_idle_timeout" in event["error"]["message"]
            r = await http.put(URL("http://ledgerd/v1/ledgers/l/pages/q/keys/k"), data=b"v")
            assert r.status == 204, await r.text()
            await ws.send_str(json.dumps({"id": 7, "op": "commit", "txn": tid}))
            late = await ws.receive_json()
            assert not late["ok"] and late["error"]["code"] == "conflict"
            assert "session_txn_idle_timeout" in late["error"]["message"]
            r = await http.get(URL("http://ledgerd/v1/ledgers/l/pages/p/keys/k"))
            assert r.status == 404  # nothing of it was committed
            await ws.close()
    finally:
        assert d.stop() == 0, d.log_text()


async def test_a_transaction_with_a_request_waiting_in_the_queue_is_not_rolled_back_as_idle(
    short_tmp: Path,
) -> None:
    # Requests are served in order: one on a transaction may wait behind another
    # (here a commit waiting for the resolver's answers). Its transaction was rolled back
    # as idle meanwhile, though the client had sent a request on it, which was then
    # refused ("no request on it for 2s"). A transaction with a request waiting is
    # not idle.
    d = start_daemon(short_tmp, env={"LEDGERD_SESSION_TXN_IDLE_TIMEOUT": "2"})
    try:
        async with (
            aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(d.socket))) as http,
            AsyncClient(d.socket) as c,
        ):
            await c.policy("l", "p", "custom")
            await c.put("l", "p", b"k", b"base")
            ws = await http.ws_connect(URL("http://ledgerd/v1/session"))
            await _op(ws, op="register_resolver", ledger=b64(b"l"))
            on = {"ledger": b64(b"l")}
            t1 = (await _op(ws, op="begin", page=b64(b"p"), **on))["txn"]
            await _op(ws, op="put", txn=t1, key=b64(b"k"), value=b64(b"a"))
            t2 = (await _op(ws, op="begin", page=b64(b"q"), **on))["txn"]
            # Begun after t2's last request: once it is rolled back, t2 was due too.
            t3 = (await _op(ws, op="begin", page=b64(b"r"), **on))["txn"]
            other = await http.ws_connect(URL("http://ledgerd/v1/session"))
            u = (await _op(other, op="begin", page=b64(b"p"), **on))["txn"]
            await _op(other, op="put", txn=u, key=b64(b"k"), value=b64(b"moved"))
            await _op(other, op="commit", txn=u)
            await ws.send_str(json.dumps({"id": 10, "op": "commit", "txn": t1}))
            resolve = await asyncio.wait_for(ws.receive_json(), 30)
            assert resolve.get("event") == "resolve", resolve
            put = {"op": "put", "txn": t2, "key": b64(b"k"), "value": b64(b"v")}
            await ws.send_str(json.dumps({"id": 11, **put}))  # waits behind the commit
            event = await asyncio.wait_for(ws.receive_json(), 30)
            assert event.get("event") == "rolled_back" and event["txn"] == t3, event
            choices = [{"key": b64(b"k"), "take": "left"}]
            resolved = {"op": "resolved", "request": resolve["request"], "choices": choices}
            await ws.send_str(json.dumps({"id": 12, **resolved}))
            replies: dict[int, Any] = {}
            while len(replies) < 3:
                reply = await asyncio.wait_for(ws.receive_json(), 30)
                assert "event" not in reply, reply
                replies[reply["id"]] = reply
            assert all(r["ok"] for r in replies.values()), replies
            await _op(ws, op="commit", txn=t2)
            assert await c.get("l", "q", b"k") == b"v"
            await ws.close()
            await other.close()
    finally:
        assert d.stop() == 0, d.log_text()


async def test_a_page_check_cannot_open_is_not_checked_not_damaged(short_tmp: Path) -> None:
    # With every open-page slot held (a session's transaction here), the check could
    # not open another page and reported it as a 'sqlite' problem: DAMAGED, though
    # nothing was wrong with it. It is 'not_checked' now; the held page is checked.
    d = start_daemon(short_tmp, env={"LEDGERD_MAX_OPEN_PAGES": "1"})
    try:
        async with aiohttp.ClientSession(
            connector=aiohttp.UnixConnector(path=str(d.socket))
        ) as http:
            r = await http.put(URL("http://ledgerd/v1/ledgers/l/pages/q/keys/k"), data=b"v")
            assert r.status == 204, await r.text()
            ws, reply = await _begin(http)
            assert reply["ok"], reply
            await _op(ws, op="put", txn=reply["txn"], key=b64(b"k"), value=b64(b"held"))
            r = await http.post(URL("http://ledgerd/v1/check"), json={})
            report = await r.json()
            pages = {(p["ledger_text"], p["page_text"]): p for p in report["pages"]}
            codes = [x["code"] for x in pages[("l", "q")]["problems"]]
            assert codes == ["not_checked"], pages
            assert "max_open_pages" in pages[("l", "q")]["problems"][0]["message"]
            assert not report["healthy"]  # unverified: never reported healthy
            out = io.StringIO()
            cli_check.summary(report, out)
            assert "l q: NOT CHECKED (busy)" in out.getvalue(), out.getvalue()
            assert "DAMAGED" not in out.getvalue()
            await ws.close()
    finally:
        assert d.stop() == 0, d.log_text()
