"""Three daemons writing the same keys, merged by policy, through moto's HTTP server."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path

from ledgerd.daemon.client import Answer, AsyncClient, ResolveRequest
from tests.daemon.conftest import Daemon, start_daemon

KEYS = [b"key-%03d" % i for i in range(100)]


async def _write_everywhere(clients: list[AsyncClient]) -> None:
    async def one(c: AsyncClient, tag: bytes) -> None:
        await c.batch("l", "p", puts=[(k, tag + b"-" + k) for k in KEYS])

    await asyncio.gather(*(one(c, t) for c, t in zip(clients, (b"A", b"B", b"C"), strict=True)))


async def _sync_all(clients: list[AsyncClient], rounds: int = 3) -> None:
    for _ in range(rounds):
        for c in clients:
            await c.sync(timeout=60)


def _ls(d: Daemon) -> str:
    return d.ledgerctl("ls", "l", "p", "--json", check=True).stdout.decode()


async def test_last_one_wins_converges_everywhere(three: list[Daemon]) -> None:
    clients = [AsyncClient(d.socket) for d in three]
    try:
        await _write_everywhere(clients)
        await _sync_all(clients)
        heads = [await c.heads("l", "p") for c in clients]
        assert all(len(h) == 1 for h in heads) and len({h[0]["id"] for h in heads}) == 1
    finally:
        for c in clients:
            await c.close()
    listings = [_ls(d) for d in three]
    assert listings[0] == listings[1] == listings[2]
    values = [json.loads(x)["value"] for x in listings[0].splitlines()]
    assert len(values) == 100


async def test_automatic_with_fallback_and_a_concatenating_resolver(three: list[Daemon]) -> None:
    clients = [AsyncClient(d.socket) for d in three]

    async def concat(req: ResolveRequest) -> Answer:
        out: Answer = {}
        for c in req.conflicts:
            left = c.left.value if c.left and c.left.value is not None else b""
            right = c.right.value if c.right and c.right.value is not None else b""
            out[c.key] = left + b"+" + right
        return out

    sessions = []
    try:
        for c in clients:
            await c.policy("l", "p", "automatic_with_fallback")
            sessions.append(await c.register_resolver("l", concat))
        await _write_everywhere(clients)
        await _sync_all(clients)
        heads = [await c.heads("l", "p") for c in clients]
        assert all(len(h) == 1 for h in heads) and len({h[0]["id"] for h in heads}) == 1
    finally:
        for s in sessions:
            await s.close()
        for c in clients:
            await c.close()
    listings = [_ls(d) for d in three]
    assert listings[0] == listings[1] == listings[2]
    for line in listings[0].splitlines():
        item = json.loads(line)
        value = base64.b64decode(item["value"])
        key = base64.b64decode(item["key"])
        # The concatenation of every device's write, in the same order everywhere.
        for tag in (b"A-", b"B-", b"C-"):
            assert tag + key in value, value


async def test_without_a_resolver_the_conflict_waits_and_shows(three: list[Daemon]) -> None:
    a, b, _ = three
    ca, cb = AsyncClient(a.socket), AsyncClient(b.socket)
    try:
        for c in (ca, cb):
            await c.policy("l", "p", "automatic_with_fallback")
        await ca.put("l", "p", b"k", b"from a")
        await cb.put("l", "p", b"k", b"from b")
        await ca.sync()
        await cb.sync()
        doc = await cb.policy("l", "p")
        assert doc["heads"] == 2 and doc["conflict"]
        assert b"conflict" in b.ledgerctl("status").stdout
        assert await cb.get("l", "p", b"k") in (b"from a", b"from b")  # one defined head

        async def take_left(req: ResolveRequest) -> Answer:
            return {c.key: "left" for c in req.conflicts}

        session = await cb.register_resolver("l", take_left)
        try:
            for _ in range(50):  # the merge resumes in the background once it connects
                if (await cb.policy("l", "p"))["heads"] == 1:
                    break
                await asyncio.sleep(0.1)
            assert (await cb.policy("l", "p"))["heads"] == 1
        finally:
            await session.close()
    finally:
        await ca.close()
        await cb.close()


async def test_a_resolver_may_read_the_page_before_answering(daemon: Daemon) -> None:
    async with AsyncClient(daemon.socket) as c, AsyncClient(daemon.socket) as r:
        await c.policy("l", "p", "automatic_with_fallback")
        await c.put("l", "p", b"k", b"base")
        seen: list[int] = []

        async def look_then_take_left(req: ResolveRequest) -> Answer:
            seen.append(len(await r.heads("l", "p")))  # reads the page it resolves
            return {x.key: "left" for x in req.conflicts}

        resolver = await r.register_resolver("l", look_then_take_left)
        s = await c.open_session()
        txn = await s.begin("l", "p")
        await txn.put(b"k", b"from the transaction")
        await c.put("l", "p", b"k", b"plain")  # the head moves: the commit needs a merge
        await c.heads("l", "p")
        await asyncio.wait_for(txn.commit(), 20)  # not held up by the resolver's read
        assert seen and len(await c.heads("l", "p")) == 1
        assert (await c.policy("l", "p"))["conflict"] is None
        await s.close()
        await resolver.close()


async def test_a_resolver_connecting_after_a_restart_merges_what_was_left(
    short_tmp: Path,
) -> None:
    # A conflict left waiting for a resolver, then a restart: the page is closed. A
    # resolver connects; resuming the ledger's merges opens the page, and opening it
    # merged its heads under the page's open lock, so the session's resolver, which
    # opens the page to read the conflict's values, waited for that open: nothing was
    # asked for RESOLVER_TIMEOUT (30 s), then the merge was abandoned.
    d = start_daemon(short_tmp)
    try:
        async with AsyncClient(d.socket) as c:
            await c.policy("l", "p", "automatic_with_fallback")
            await c.put("l", "p", b"k", b"base")
            s = await c.open_session()
            txn = await s.begin("l", "p")
            await txn.put(b"k", b"from the transaction")
            await c.put("l", "p", b"k", b"plain")  # the head moves: the commit forks
            await c.heads("l", "p")
            await txn.commit()
            await s.close()
            assert (await c.policy("l", "p"))["heads"] == 2
    finally:
        assert d.stop() == 0, d.log_text()
    d = start_daemon(short_tmp)
    try:
        async with AsyncClient(d.socket) as c:
            asked = asyncio.Event()

            async def take_left(req: ResolveRequest) -> Answer:
                asked.set()
                return {x.key: "left" for x in req.conflicts}

            resolver = await c.register_resolver("l", take_left)
            await asyncio.wait_for(asked.wait(), 15)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 15
            while (await c.policy("l", "p"))["heads"] != 1:  # stored just after the answer
                assert loop.time() < deadline
                await asyncio.sleep(0.05)
            await resolver.close()
    finally:
        assert d.stop() == 0, d.log_text()
