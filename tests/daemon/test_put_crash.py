"""A daemon killed during a streamed PUT into a page that PUT makes."""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import socket
import threading
import time
import warnings
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from ledgerd.daemon.client import AsyncClient, Client
from ledgerd.store.repo.repository import encode_name
from ledgerd.store.sqlite.schema import FORMAT_VERSION
from tests.daemon.conftest import Daemon, start_daemon

MiB = 1024 * 1024


def _page_dir(data: Path, ledger: bytes, page: bytes) -> Path:
    return data / str(FORMAT_VERSION) / "ledgers" / encode_name(ledger) / encode_name(page)


def test_a_streamed_put_killed_mid_body_leaves_no_new_page_after_restart(
    short_tmp: Path,
) -> None:
    # The body never ended, so the PUT was never acknowledged: after a restart its page
    # (and the ledger it alone was in) must not be listed, as when the body fails while
    # the daemon runs. It was: an empty page, holding only its first commit.
    d = start_daemon(short_tmp)
    with Client(d.socket) as c:
        c.put("kept", "p", b"k", b"v")
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(str(d.socket))
    conn.sendall(
        b"PUT /v1/ledgers/gone/pages/fresh/keys/k HTTP/1.1\r\nHost: ledgerd\r\n"
        b"Content-Length: %d\r\n\r\n" % (64 * MiB) + b"x" * (2 * MiB)
    )
    made = _page_dir(d.data, b"gone", b"fresh") / "page.sqlite"
    deadline = time.monotonic() + 30
    while not made.exists():  # the page is made once the body starts streaming
        assert time.monotonic() < deadline, d.log_text()
        time.sleep(0.01)
    d.stop(signal.SIGKILL)
    conn.close()
    d = start_daemon(short_tmp)
    try:
        with Client(d.socket) as c:
            assert c.ledgers() == [b"kept"]
            assert c.get("kept", "p", b"k") == b"v"
        assert not _page_dir(d.data, b"gone", b"fresh").parent.exists()
    finally:
        assert d.stop() == 0, d.log_text()


def test_an_acknowledged_streamed_put_into_a_new_page_survives_a_kill(short_tmp: Path) -> None:
    d = start_daemon(short_tmp)
    value = b"y" * (3 * MiB)
    with Client(d.socket) as c:
        c.put("l", "new", b"k", value)
    d.stop(signal.SIGKILL)
    d = start_daemon(short_tmp)
    try:
        with Client(d.socket) as c:
            assert c.pages("l") == [b"new"]
            assert c.get("l", "new", b"k") == value
    finally:
        assert d.stop() == 0, d.log_text()


def test_a_batch_killed_before_it_commits_leaves_no_new_page_after_restart(
    short_tmp: Path,
) -> None:
    # A batch into a new page makes the page, then commits: a kill in between left the
    # page listed, empty, though nothing was acknowledged. A large batch makes the
    # window wide enough to land in; if the commit won the race, the page is whole.
    d = start_daemon(short_tmp)
    rng = random.Random(3)
    ops = [(b"k%03d" % i, rng.randbytes(200 * 1024)) for i in range(150)]
    with Client(d.socket) as c:
        c.put("kept", "p", b"k", b"v")
    made = _page_dir(d.data, b"gone", b"fresh") / "page.sqlite"
    t = threading.Thread(target=_batch_quietly, args=(d.socket, ops), daemon=True)
    t.start()
    deadline = time.monotonic() + 60
    while not made.exists():
        assert time.monotonic() < deadline, d.log_text()
        time.sleep(0.001)
    d.stop(signal.SIGKILL)
    t.join(30)
    d = start_daemon(short_tmp)
    try:
        with Client(d.socket) as c:
            if b"gone" in c.ledgers():  # the commit got there first: all of it
                assert len(list(c.entries("gone", "fresh"))) == len(ops)
            else:
                assert c.ledgers() == [b"kept"]
    finally:
        assert d.stop() == 0, d.log_text()


def _batch_quietly(sock: Path, ops: list[tuple[bytes, bytes]]) -> None:
    # (aiohttp warns that a large raw body may hold its loop: that is the point here)
    with warnings.catch_warnings(), contextlib.suppress(Exception), Client(sock) as c:
        warnings.simplefilter("ignore", ResourceWarning)
        c.batch("gone", "fresh", ops)


def _restarted_after(short_tmp: Path, kill: Callable[[], Coroutine[Any, Any, None]]) -> Daemon:
    """Run ``kill`` (a session's steps, ending in a SIGKILL of the daemon, which breaks
    the session's connection), then start the daemon again."""
    with contextlib.suppress(Exception):
        asyncio.run(kill())
    return start_daemon(short_tmp)


def test_a_session_transaction_open_on_a_new_page_when_killed_leaves_no_page(
    short_tmp: Path,
) -> None:
    # Beginning a transaction makes its page; the transaction never committed, so after
    # a restart nothing of it may be listed (a rollback removes the page at once).
    d = start_daemon(short_tmp)

    async def begin_and_kill() -> None:
        async with AsyncClient(d.socket) as c:
            await c.put("kept", "p", b"k", b"v")
            s = await c.open_session()
            txn = await s.begin("gone", "fresh")
            await txn.put(b"k", b"uncommitted")
            assert (_page_dir(d.data, b"gone", b"fresh") / "page.sqlite").exists()
            d.stop(signal.SIGKILL)

    d = _restarted_after(short_tmp, begin_and_kill)
    try:
        with Client(d.socket) as c:
            assert c.ledgers() == [b"kept"]
        assert not _page_dir(d.data, b"gone", b"fresh").parent.exists()
    finally:
        assert d.stop() == 0, d.log_text()


def test_documents_written_into_a_new_page_survive_a_kill(short_tmp: Path) -> None:
    # The document write's page is marked until the write is acknowledged; the mark
    # must never take an acknowledged write's page with it.
    d = start_daemon(short_tmp)
    with Client(d.socket) as c:
        doc = c.documents("l", "new").create("c", {"a": 1})
    d.stop(signal.SIGKILL)
    d = start_daemon(short_tmp)
    try:
        with Client(d.socket) as c:
            assert c.pages("l") == [b"new"]
            assert c.documents("l", "new").get("c", doc["_meta"]["_id"])["_data"] == {"a": 1}
    finally:
        assert d.stop() == 0, d.log_text()


def test_a_page_made_by_a_watch_is_not_left_listed_after_a_kill(short_tmp: Path) -> None:
    # A watch on a page that does not exist makes it, as a begin does, and the page goes
    # when the watcher ends with nothing written: a kill ends the watcher too, so after
    # the restart the page must not be listed. It was: nothing marked it.
    d = start_daemon(short_tmp)

    async def watch_and_kill() -> None:
        async with AsyncClient(d.socket) as c:
            await c.put("l", "kept", b"k", b"v")
            await c.subscribe("l", "watched")
            assert sorted(await c.pages("l")) == [b"kept", b"watched"]
            d.stop(signal.SIGKILL)

    d = _restarted_after(short_tmp, watch_and_kill)
    try:
        with Client(d.socket) as c:
            assert c.pages("l") == [b"kept"]
        assert not _page_dir(d.data, b"l", b"watched").exists()
    finally:
        assert d.stop() == 0, d.log_text()
