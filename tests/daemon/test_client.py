"""The Python clients (async and blocking) against the real daemon, sessions included."""

from __future__ import annotations

import asyncio
import inspect
import itertools
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from ledgerd.daemon.client import (
    Answer,
    AsyncClient,
    AsyncTransaction,
    BlockingSession,
    BlockingTransaction,
    BlockingWatch,
    Client,
    DaemonUnavailableError,
    LedgerError,
    NotFoundError,
    ResolveRequest,
    Session,
    Watch,
)
from ledgerd.daemon.client_blocking import Bridge
from tests.daemon.conftest import Daemon, start_daemon


async def test_async_client_covers_the_api(daemon: Daemon, tmp_path: Path) -> None:
    async with AsyncClient(daemon.socket) as c:
        await c.put("l", "p", b"\x00key", b"value")
        await c.put("l", "p", b"lazy", b"zzz", lazy=True)
        assert await c.get("l", "p", b"\x00key") == b"value"
        assert await c.get("l", "p", b"\x00key", offset=1, length=3) == b"alu"
        assert await c.ledgers() == [b"l"] and await c.pages("l") == [b"p"]
        items = [i async for i in c.entries("l", "p")]
        assert [(i.key, i.value, i.priority) for i in items] == [
            (b"\x00key", b"value", "eager"),
            (b"lazy", b"zzz", "lazy"),
        ]
        assert (
            await c.batch(
                "l", "p", puts=[(b"b%d" % i, b"x") for i in range(2500)], deletes=[b"lazy"]
            )
            == 2501
        )
        assert len([i async for i in c.entries("l", "p", prefix=b"b", page_size=700)]) == 2500
        assert len([i async for i in c.entries("l", "p", prefix=b"b", limit=10)]) == 10
        f = tmp_path / "f"
        f.write_bytes(b"F" * 3_000_000)
        await c.put("l", "p", b"file", f)
        out = tmp_path / "out"
        assert await c.get_to_file("l", "p", b"file", out) == 3_000_000
        assert out.read_bytes() == f.read_bytes()
        heads = await c.heads("l", "p")
        hist = await c.history("l", "p", limit=3)
        assert len(heads) == 1 and hist[0]["id"] == heads[0]["id"]
        await c.delete("l", "p", b"file")
        with pytest.raises(NotFoundError) as e:
            await c.get("l", "p", b"file")
        assert e.value.code == "key_not_found"
        await c.clear("l", "p")
        assert [i async for i in c.entries("l", "p")] == []
        st = await c.status()
        assert st["pid"] == daemon.proc.pid


@pytest.mark.parametrize("size", [0, 1, 2, 4096, 70_000])
async def test_put_of_a_small_file(daemon: Daemon, tmp_path: Path, size: int) -> None:
    """The daemon answers a small file's PUT while aiohttp's writer is still inside the
    file's chunk generator (reading on, to find its end): put returns all the same,
    with the value stored, instead of raising RuntimeError from the generator's aclose."""
    f = tmp_path / "small"
    f.write_bytes(b"s" * size)
    async with AsyncClient(daemon.socket) as c:
        for n in range(5):
            await c.put("l", "small", b"f%d" % n, f)
            assert await c.get("l", "small", b"f%d" % n) == b"s" * size


async def test_transactions_and_watchers(daemon: Daemon) -> None:
    async with AsyncClient(daemon.socket) as c:
        await c.put("l", "p", b"a", b"base")
        await c.heads("l", "p")  # commits every acknowledged write first
        watch = await c.subscribe("l", "p")
        async with c.transaction("l", "p") as txn:
            await txn.put(b"a", b"txn")
            await txn.put(b"b", b"2")
            assert await txn.get(b"a") == b"txn"
            assert await c.get("l", "p", b"a") == b"base"  # not visible before commit
            assert [i.key for i in await txn.entries()] == [b"a", b"b"]
        assert await c.get("l", "p", b"a") == b"txn"
        with pytest.raises(RuntimeError):
            async with c.transaction("l", "p") as txn:
                await txn.put(b"never", b"x")
                raise RuntimeError("application failure")
        with pytest.raises(NotFoundError):
            await c.get("l", "p", b"never")
        change = await asyncio.wait_for(watch.__anext__(), 20)
        await watch.close()
        assert [(i.key, i.value) for i in change.changed] == [(b"a", b"txn"), (b"b", b"2")]


async def test_watcher_gets_every_commit_in_order(daemon: Daemon) -> None:
    async with AsyncClient(daemon.socket) as c:
        await c.put("l", "p", b"init", b"0")
        session = await c.open_session()
        watch = await session.subscribe("l", "p", prefix=b"n/")
        got: list[bytes] = []

        async def collect() -> None:
            async for ch in watch:
                got.extend(i.key for i in ch.changed)
                if len(got) >= 30:
                    return

        task = asyncio.ensure_future(collect())
        for i in range(30):
            await c.put("l", "p", b"n/%02d" % i, b"v")
            await c.put("l", "p", b"other/%02d" % i, b"v")
        await asyncio.wait_for(task, 30)
        assert got == [b"n/%02d" % i for i in range(30)]
        await session.close()


def test_blocking_client(daemon: Daemon, tmp_path: Path) -> None:
    with Client(daemon.socket) as c:
        c.put("l", "p", b"k", b"v")
        assert c.get("l", "p", b"k") == b"v"
        assert c.batch("l", "p", puts=[(b"x", b"1"), (b"y", b"2", "lazy")]) == 2
        assert [i.key for i in c.entries("l", "p")] == [b"k", b"x", b"y"]
        with c.transaction("l", "p") as txn:
            txn.put(b"t", b"1")
            assert txn.get(b"t") == b"1"
        assert c.get("l", "p", b"t") == b"1"
        assert len(c.heads("l", "p")) == 1 and c.history("l", "p")
        c.delete("l", "p", b"t")
        with pytest.raises(NotFoundError):
            c.get("l", "p", b"t")
        assert c.ledgers() == [b"l"] and c.pages("l") == [b"p"]


BLOCKING_NAME = {
    "__aenter__": "__enter__",
    "__aexit__": "__exit__",
    "__aiter__": "__iter__",
    "__anext__": "__next__",
}
LOW_LEVEL = {"request", "session"}
"""AsyncClient's aiohttp-level members: blocking code reaches them through ``Client.aio``."""


def _parameters(fn: Any) -> list[tuple[str, Any, Any]]:
    sig = inspect.signature(fn)
    return [(p.name, p.kind, p.default) for p in sig.parameters.values()]


@pytest.mark.parametrize(
    ("aio", "blocking"),
    [
        (AsyncClient, Client),
        (AsyncTransaction, BlockingTransaction),
        (Session, BlockingSession),
        (Watch, BlockingWatch),
    ],
)
def test_every_async_method_has_a_blocking_counterpart(aio: type, blocking: type) -> None:
    """The blocking classes are the async ones through one bridge: same methods, same
    parameters (names, kinds, defaults), so the two cannot drift apart."""
    names = [
        n
        for n, member in vars(aio).items()
        if callable(member) or isinstance(member, staticmethod | property)
        if (not n.startswith("_") or n in BLOCKING_NAME) and n not in LOW_LEVEL
    ]
    assert names
    for name in names:
        counterpart = getattr(blocking, BLOCKING_NAME.get(name, name), None)
        assert counterpart is not None, f"{blocking.__name__} has no {name}"
        if name in ("__aenter__", "__aexit__"):
            continue  # (self) / (self, exc info) either way
        assert _parameters(getattr(aio, name)) == _parameters(counterpart), name


def test_blocking_client_streams_sessions_and_resolvers(daemon: Daemon, tmp_path: Path) -> None:
    with Client(daemon.socket) as c:
        c.put("l", "p", b"big", iter([b"a" * 300_000, b"b" * 300_000]))  # chunks, streamed
        assert b"".join(c.get_stream("l", "p", b"big", offset=299_999, length=2)) == b"ab"
        assert c.policy("l", "p", "automatic_with_fallback")["policy"] == (
            "automatic_with_fallback"
        )
        with c.transaction("l", "p") as txn:
            txn.put(b"a", b"1")
            txn.put(b"b", b"2")
            txn.delete(b"b")
            assert [i.key for i in txn.entries(prefix=b"a")] == [b"a"]
        assert txn.commit_id is not None and c.heads("l", "p")[0]["id"] == txn.commit_id
        with pytest.raises(KeyError), c.transaction("l", "p") as txn:
            txn.clear()
            assert txn.entries() == []
            raise KeyError("rolls back")
        assert c.get("l", "p", b"a") == b"1"  # the clear was rolled back
        with c.open_session() as s:
            t = s.begin("l", "p")
            t.put(b"x", b"y")
            t.rollback()
            with pytest.raises(LedgerError):
                t.put(b"x", b"y")  # the transaction is over
        with pytest.raises(NotFoundError):
            c.get("l", "p", b"x")

        seen: list[ResolveRequest] = []

        def take_right(req: ResolveRequest) -> Answer:
            assert threading.current_thread() is not threading.main_thread()
            seen.append(req)
            return {x.key: "right" for x in req.conflicts}

        with c.register_resolver("l", take_right), c.subscribe("l", "p") as watch:
            s = c.open_session()
            t = s.begin("l", "p")
            t.put(b"a", b"from txn")
            # A write the transaction did not see: its commit keeps both as siblings.
            c.put("l", "p", b"a", b"plain")
            c.heads("l", "p")
            assert t.commit() is not None  # (after the resolver's answer is stored)
            s.close()
            c.put("l", "p", b"end", b"")
            keys = []
            for change in watch:  # every commit in order, up to the sentinel
                keys += [i.key for i in change.changed]
                if b"end" in keys:
                    break
            assert keys[0] == b"a" and keys[-1] == b"end"
        doc = c.policy("l", "p")
        assert doc["heads"] == 1 and doc["conflicts"] == 0 and doc["conflict"] is None, doc
        # Shown the winner (the transaction's, committed last) and the other sibling.
        (item,) = seen[0].conflicts
        assert item.base is None and item.left is not None and item.right is not None
        assert (item.key, item.left.value, item.right.value) == (b"a", b"from txn", b"plain")
        assert c.get("l", "p", b"a") == b"plain"  # what the resolver took


async def test_unreachable_daemon_is_a_clear_error(tmp_path: Path) -> None:
    async with AsyncClient(tmp_path / "none.sock") as c:
        with pytest.raises(DaemonUnavailableError, match="cannot reach ledgerd"):
            await c.status()


async def test_session_errors(daemon: Daemon) -> None:
    async with AsyncClient(daemon.socket) as c:
        s = await c.open_session()
        with pytest.raises(LedgerError) as e:
            await s.call("put", txn="t999", key="", value="")
        assert e.value.code == "conflict"
        with pytest.raises(LedgerError) as e:
            await s.call("fly")
        assert e.value.code == "bad_request"
        txn = await s.begin("l", "p")
        with pytest.raises(LedgerError) as e:
            await txn.put(b"k" * 5000, b"v")
        assert e.value.code == "key_too_large"
        await txn.rollback()
        await s.close()


async def test_resolver_on_the_committing_session_does_not_deadlock(daemon: Daemon) -> None:
    async with AsyncClient(daemon.socket) as c:
        await c.policy("l", "p", "automatic_with_fallback")
        await c.put("l", "p", b"k", b"base")
        s = await c.open_session()

        async def take_right(req: ResolveRequest) -> Answer:
            return {x.key: "right" for x in req.conflicts}

        await s.register_resolver("l", take_right)
        txn = await s.begin("l", "p")
        await txn.put(b"k", b"from txn")
        # A write the transaction did not see: its commit keeps both as siblings.
        await c.put("l", "p", b"k", b"plain")
        await c.heads("l", "p")
        await asyncio.wait_for(txn.commit(), 10)  # answered on the same session, at once
        doc = await c.policy("l", "p")
        assert doc["heads"] == 1 and doc["conflicts"] == 0 and doc["conflict"] is None, doc
        assert await c.get("l", "p", b"k") == b"plain"  # right: the sibling reads hid
        await s.close()


async def test_a_watch_ends_when_the_daemon_ends_it() -> None:
    """The ``ended`` event stops the iterator; with an error it raises, every time."""
    q: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
    q.put_nowait({"event": "ended", "watch": "w1"})
    assert [c async for c in Watch(None, "w1", q)] == []  # type: ignore[arg-type]
    q = asyncio.Queue()
    q.put_nowait({"event": "ended", "watch": "w1", "error": {"code": "internal", "message": "m"}})
    failed = Watch(None, "w1", q)  # type: ignore[arg-type]
    for _ in range(2):
        with pytest.raises(LedgerError, match="m"):
            await anext(failed)
    await failed.close()  # no unwatch for a watch the daemon ended (no session here)
    q = asyncio.Queue()
    q.put_nowait(None)  # the session closed
    dropped = Watch(None, "w1", q)  # type: ignore[arg-type]
    for _ in range(2):
        with pytest.raises(StopAsyncIteration):
            await anext(dropped)


async def test_streams_and_watches_are_generators_that_close(daemon: Daemon) -> None:
    """What the clients stream is typed as what it is, a generator, so that a program
    checked by ``mypy --strict`` may close one it leaves early (``aclose`` / ``close``:
    the connection, or the watch's session, is released then, not when collected)."""
    async with AsyncClient(daemon.socket) as c:
        await c.put("l", "p", b"k", b"v" * 1000)
        stream = c.get_stream("l", "p", b"k")
        assert len(await anext(stream)) > 0
        await stream.aclose()
        items = c.entries("l", "p")
        assert (await anext(items)).key == b"k"
        await items.aclose()
        watch = c.watch("l", "p")
        first = asyncio.ensure_future(anext(watch))
        # Until the watch is subscribed, a new value each time: rewriting a value the
        # page has commits no change, so once the first put's commit had been told to
        # the watchers before this watch subscribed (a busy machine), puts of the same
        # value never woke it and the test hung until pytest's 300 s timeout.
        for n in itertools.count():
            if first.done():
                break
            await c.put("l", "p", b"w", b"%d" % n)
            await asyncio.sleep(0.05)
        assert (await first).changed
        await watch.aclose()
        docs = c.documents("l", "d")
        await docs.create("c", {"a": 1})
        listing = docs.list_documents("c")
        assert (await anext(listing))["_data"] == {"a": 1}
        await listing.aclose()

    def blocking() -> None:
        with Client(daemon.socket) as bc:
            chunks = bc.get_stream("l", "p", b"k")
            assert next(chunks)
            chunks.close()
            entries = bc.entries("l", "p")
            assert next(entries).key == b"k"
            entries.close()
            listing = bc.documents("l", "d").list_documents("c")
            assert next(listing)["_data"] == {"a": 1}
            listing.close()

    await asyncio.to_thread(blocking)


async def test_a_session_watch_left_early_releases_its_watcher(short_tmp: Path) -> None:
    """``Session.watch`` (and BlockingSession.watch) unwatches when the generator is
    closed, as AsyncClient.watch does: a loop that leaves a watch early does not pile up
    watchers on its session until ``max_session_watchers`` refuses the next one."""
    d = start_daemon(short_tmp, env={"LEDGERD_MAX_SESSION_WATCHERS": "2"})
    try:
        async with AsyncClient(d.socket) as c:
            session = await c.open_session()
            for n in range(4):
                watch = session.watch("l", "p")
                first = asyncio.ensure_future(anext(watch))
                while not first.done():  # until the watch is subscribed
                    await c.put("l", "p", b"k", b"%d" % n)
                    await asyncio.sleep(0.02)
                assert (await first).changed  # (a refused watch raises here)
                await watch.aclose()
            await session.close()

        def blocking() -> None:
            with Client(d.socket) as bc:
                bs = bc.open_session()
                for _ in range(4):
                    watch = bs.watch("l", "p")
                    seen = threading.Event()

                    def write(seen: threading.Event) -> None:  # until the watch sees one
                        for n in itertools.count():
                            if seen.wait(0.02):
                                return
                            bc.put("l", "p", b"k", b"b%d" % n)  # (a value it has is no change)

                    writer = threading.Thread(target=write, args=(seen,))
                    writer.start()
                    try:
                        assert next(watch).changed
                    finally:
                        seen.set()
                        writer.join()
                    watch.close()
                bs.close()

        await asyncio.to_thread(blocking)
    finally:
        assert d.stop() == 0, d.log_text()


def test_closing_a_blocking_client_ends_a_call_in_flight() -> None:
    """The blocking classes' Bridge, shared by threads: stopping it (Client.close)
    while another thread waits on a call ends that call with a LedgerError (code
    ``client_closed``); the loop used to stop under the call's task and the thread
    waited forever. (Found by a soak: its driver closed a killed daemon's Client while a
    worker thread, its listing cut by the kill, was closing the listing through it.)"""
    bridge = Bridge()
    outcome: list[BaseException | None] = []

    def wait() -> None:
        try:
            bridge.call(asyncio.sleep(3600))
            outcome.append(None)
        except BaseException as e:  # what the waiting thread got
            outcome.append(e)

    async def tasks() -> int:
        return len(asyncio.all_tasks())

    before = asyncio.run_coroutine_threadsafe(tasks(), bridge.loop).result()
    t = threading.Thread(target=wait, daemon=True)
    t.start()
    while asyncio.run_coroutine_threadsafe(tasks(), bridge.loop).result() == before:
        t.join(0.01)  # until the call is a task on the bridge's loop
    bridge.stop()
    t.join(30)
    assert not t.is_alive(), "the call in flight never ended"
    assert isinstance(outcome[0], LedgerError) and outcome[0].code == "client_closed"
    with pytest.raises(LedgerError) as e:
        bridge.call(asyncio.sleep(0))  # and a call after close says so too
    assert e.value.code == "client_closed"


async def _achunks(*chunks: bytes) -> AsyncIterator[bytes]:
    for c in chunks:
        yield c


def _values(tmp_path: Path) -> list[tuple[str, Any, bytes]]:
    """(what, value, what the daemon stores) for every kind of value both clients take."""
    f = tmp_path / "value"
    f.write_bytes(b"from a file")
    return [
        ("bytes", b"plain", b"plain"),
        ("big bytes", b"B" * 300_000, b"B" * 300_000),
        ("bytearray", bytearray(b"array"), b"array"),
        ("memoryview", memoryview(b"view"), b"view"),
        ("str", "strval", b"strval"),
        ("str, not ASCII", "h\u00e9llo \u2603", "h\u00e9llo \u2603".encode()),
        ("file", f, b"from a file"),
        ("list of chunks", [b"a", b"b"], b"ab"),
        ("generator of chunks", (c for c in [b"c", b"d"]), b"cd"),
    ]


async def test_both_clients_take_the_same_values(daemon: Daemon, tmp_path: Path) -> None:
    """Issue 41: a str put through the blocking Client was iterated as chunks and
    reported as "cannot reach ledgerd", while AsyncClient stored its UTF-8. Both take
    the same values now (the blocking one is the async one through the bridge) and
    store the same bytes; an async iterable too, where the caller has a loop."""
    async with AsyncClient(daemon.socket) as c:
        for what, value, stored in _values(tmp_path):
            await c.put("l", "async", what.encode(), value)
            assert await c.get("l", "async", what.encode()) == stored, what
        await c.put("l", "async", b"async chunks", _achunks(b"e", b"f"))
        assert await c.get("l", "async", b"async chunks") == b"ef"

    def blocking() -> None:
        with Client(daemon.socket) as bc:
            for what, value, stored in _values(tmp_path):
                bc.put("l", "blocking", what.encode(), value)
                assert bc.get("l", "blocking", what.encode()) == stored, what

    await asyncio.to_thread(blocking)


class _Broken(Exception):
    """What a caller's iterator of chunks raised."""


def _failing() -> Iterator[bytes]:
    yield b"a" * 1000
    raise _Broken("the source failed")


def _bad_values() -> list[tuple[Any, type[Exception], str]]:
    """(value, what both clients raise, a part of its message): the caller's mistakes."""
    return [
        (12, TypeError, "not int"),
        (None, TypeError, "not NoneType"),
        ({"a": 1}.items(), TypeError, "a chunk must be bytes, not tuple"),
        (["one", "two"], TypeError, "a chunk must be bytes, not str"),
        (_failing(), _Broken, "the source failed"),
    ]


async def test_a_client_side_error_is_not_an_unreachable_daemon(daemon: Daemon) -> None:
    """A value of a type no client takes, or chunks that fail, raise the caller's error
    (TypeError, or what the chunks raised), not DaemonUnavailableError: aiohttp reports
    an error of a request body as a failed connection. Nothing is stored, and the
    client goes on working."""
    async with AsyncClient(daemon.socket) as c:
        bad: list[tuple[Any, type[Exception], str]] = [
            *_bad_values(),
            (_failing_async(), _Broken, "the source failed"),
        ]
        for value, error, message in bad:
            with pytest.raises(error, match=message):
                await c.put("l", "p", b"k", value)
        with pytest.raises(NotFoundError):
            await c.get("l", "p", b"k")
        docs = c.documents("l", "d")
        doc = await docs.create("c", {"a": 1})
        with pytest.raises(TypeError, match="not str"):
            await docs.put_attachment("c", doc["_meta"]["_id"], ["x"], filename="x")  # type: ignore[list-item]
        await c.put("l", "p", b"k", b"still works")

    def blocking() -> None:
        with Client(daemon.socket) as bc:
            for value, error, message in _bad_values():
                with pytest.raises(error, match=message):
                    bc.put("l", "p", b"b", value)
            with pytest.raises(NotFoundError):
                bc.get("l", "p", b"b")
            docs = bc.documents("l", "d")
            (doc,) = docs.list_documents("c")
            with pytest.raises(TypeError, match="not str"):
                docs.put_attachment("c", doc["_meta"]["_id"], ["x"], filename="x")  # type: ignore[list-item]
            assert bc.get("l", "p", b"k") == b"still works"

    await asyncio.to_thread(blocking)


async def _failing_async() -> AsyncIterator[bytes]:
    yield b"a" * 1000
    raise _Broken("the source failed")


def test_blocking_batch_reads_its_operations_in_the_calling_thread(daemon: Daemon) -> None:
    """The blocking batch reads ``puts`` and ``deletes`` in the caller's thread, as it
    did when it was written out by hand: a generator tied to its thread (a SQLite
    cursor, say) can feed it."""
    main = threading.current_thread()

    def puts() -> Iterator[tuple[bytes, bytes]]:
        for i in range(3):
            assert threading.current_thread() is main
            yield b"k%d" % i, b"v"

    with Client(daemon.socket) as c:
        assert c.batch("l", "p", puts()) == 3
        assert [i.key for i in c.entries("l", "p")] == [b"k0", b"k1", b"k2"]
