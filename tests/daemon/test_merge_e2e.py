"""Three daemons writing the same keys through moto's HTTP server: every device keeps
the same siblings, and the page's policy decides what is done with them.

Local history is a line (one head, commits never leave their device); convergence is
of the state: the same winners on every device, the same conflicts.
"""

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


async def _one_head_each(clients: list[AsyncClient]) -> None:
    """Every device's history is a line: one head, whose single parent is the commit
    before it on this device (heads differ between devices: commits are local)."""
    for c in clients:
        (head,) = await c.heads("l", "p")
        newest, before = await c.history("l", "p", limit=2)
        assert newest == head and head["parents"] == [before["id"]]


async def _until_no_conflicts(c: AsyncClient, timeout: float = 15) -> dict[str, object]:
    """The page's policy document once no conflict is left: a resolver's answers are
    stored just after it answers, in the background."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while (doc := await c.policy("l", "p"))["conflicts"]:
        assert loop.time() < deadline, doc
        await asyncio.sleep(0.05)
    return doc


async def test_last_one_wins_converges_everywhere(three: list[Daemon]) -> None:
    clients = [AsyncClient(d.socket) for d in three]
    try:
        await _write_everywhere(clients)
        await _sync_all(clients)
        await _one_head_each(clients)
        # Every key was written on the three devices before any saw another's write:
        # every device keeps the three as siblings (listed as conflicts), and nobody
        # is asked under last_one_wins.
        docs = [await c.policy("l", "p") for c in clients]
        for doc in docs:
            assert doc["heads"] == 1 and doc["conflicts"] == len(KEYS), doc
            assert doc["policy"] == "last_one_wins" and doc["conflict"] is None, doc
    finally:
        for c in clients:
            await c.close()
    listings = [_ls(d) for d in three]
    assert listings[0] == listings[1] == listings[2]
    values = [base64.b64decode(json.loads(x)["value"]) for x in listings[0].splitlines()]
    assert len(values) == 100
    # A device's batch is one write (one dot): the largest dot wins every key at once.
    assert len({v[:2] for v in values}) == 1, values


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
        await _one_head_each(clients)
        # The resolvers' answers are ordinary writes that supersede what they were
        # shown: they reach every device, and no sibling is left anywhere.
        for c in clients:
            doc = await _until_no_conflicts(c)
            assert doc["heads"] == 1 and doc["conflict"] is None, doc
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
        # One head; the two writes are siblings of k, waiting for a resolver.
        assert doc["heads"] == 1 and doc["conflicts"] == 1 and doc["conflict"], doc
        assert b"conflicts=1" in b.ledgerctl("status").stdout
        # Reads show the winner meanwhile: the later write (the larger dot).
        assert await cb.get("l", "p", b"k") == b"from b"
        asked: list[ResolveRequest] = []

        async def take_left(req: ResolveRequest) -> Answer:
            asked.append(req)
            return {c.key: "left" for c in req.conflicts}

        session = await cb.register_resolver("l", take_left)
        try:
            # The page is open already: connecting puts its conflicts to the resolver.
            doc = await _until_no_conflicts(cb)
            assert doc["heads"] == 1 and doc["conflict"] is None, doc
        finally:
            await session.close()
        (item,) = asked[0].conflicts
        assert item.key == b"k" and item.base is None
        assert item.left is not None and item.left.value == b"from b"  # what reads show
        assert item.right is not None and item.right.value == b"from a"
        assert await cb.get("l", "p", b"k") == b"from b"
        # The answer is a write like any other: it reaches a, superseding both.
        await cb.sync()
        await ca.sync()
        assert await ca.get("l", "p", b"k") == b"from b"
        assert (await ca.policy("l", "p"))["conflicts"] == 0
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
        # A write the transaction did not see: its commit keeps both as siblings.
        await c.put("l", "p", b"k", b"plain")
        await c.heads("l", "p")
        await asyncio.wait_for(txn.commit(), 20)  # not held up by the resolver's read
        assert seen == [1] and len(await c.heads("l", "p")) == 1
        doc = await _until_no_conflicts(c)
        assert doc["conflict"] is None, doc
        await s.close()
        await resolver.close()


async def test_a_resolver_connecting_after_a_restart_merges_what_was_left(
    short_tmp: Path,
) -> None:
    # A conflict left waiting for a resolver, then a restart: the page is closed. A
    # resolver connects; putting the ledger's conflicts to it opens the page, and
    # opening it asked the resolver under the page's open lock, so the session's
    # resolver, which opens the page to read the conflict's values, waited for that
    # open: nothing was asked for RESOLVER_TIMEOUT (30 s), then the round was abandoned.
    d = start_daemon(short_tmp)
    try:
        async with AsyncClient(d.socket) as c:
            await c.policy("l", "p", "automatic_with_fallback")
            await c.put("l", "p", b"k", b"base")
            s = await c.open_session()
            txn = await s.begin("l", "p")
            await txn.put(b"k", b"from the transaction")
            # A write the transaction did not see: both stay, as siblings of k.
            await c.put("l", "p", b"k", b"plain")
            await c.heads("l", "p")
            await txn.commit()
            await s.close()
            doc = await c.policy("l", "p")
            assert doc["heads"] == 1 and doc["conflicts"] == 1 and doc["conflict"], doc
            # Reads show the later write: the transaction committed after the put.
            assert await c.get("l", "p", b"k") == b"from the transaction"
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
            doc = await _until_no_conflicts(c)
            assert doc["heads"] == 1 and doc["conflict"] is None, doc
            assert await c.get("l", "p", b"k") == b"from the transaction"
            await resolver.close()
    finally:
        assert d.stop() == 0, d.log_text()
