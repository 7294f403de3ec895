"""Listing and resolving conflicts from the CLI and HTTP, with two real daemons
sharing a bucket on moto's HTTP server (the ``three`` fixture; the third is idle)."""

from __future__ import annotations

import base64
import json

from ledgerd.daemon.client import AsyncClient
from tests.daemon.conftest import Daemon


def _ls_keys(d: Daemon) -> set[bytes]:
    out = d.ledgerctl("ls", "l", "p", "--json", check=True).stdout.decode()
    return {base64.b64decode(json.loads(x)["key"]) for x in out.splitlines()}


async def _conflicting_writes(a: Daemon, b: Daemon) -> None:
    """Both devices write ``k`` (a conflict) and a key of their own, then sync."""
    async with AsyncClient(a.socket) as ca, AsyncClient(b.socket) as cb:
        for c in (ca, cb):
            await c.policy("l", "p", "automatic_with_fallback")
        await ca.batch("l", "p", puts=[(b"k", b"from a"), (b"only-a", b"a")])
        await cb.batch("l", "p", puts=[(b"k", b"from b"), (b"only-b", b"b")])
        await ca.sync(timeout=60)
        await cb.sync(timeout=60)
        await ca.sync(timeout=60)


async def test_a_pending_conflict_hides_no_other_key(three: list[Daemon]) -> None:
    a, b, _ = three
    await _conflicting_writes(a, b)
    for d in (a, b):
        async with AsyncClient(d.socket) as c:
            doc = await c.policy("l", "p")
            assert doc["conflicts"] == 1 and doc["conflict"], doc
        # Each device's reads show every key's winner: its own non-conflicting write
        # too, while the conflict waits for a resolver.
        assert _ls_keys(d) == {b"k", b"only-a", b"only-b"}, d.log_text()
