"""What a page gives to and takes from sync: deltas, whole states, their checks."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from ledgerd.store import Page, Priority, Repository
from ledgerd.store.errors import CorruptObjectError
from ledgerd.store.page import exchange
from ledgerd.store.pieces import digest as dg
from ledgerd.store.tree import builder, join
from ledgerd.store.tree.join import TURN_KEYS
from tests.exchanges import Bucket, exchange_all, mark_all_uploaded, ship


async def _values(page: Page) -> dict[bytes, bytes]:
    return {kv.key: kv.value for kv in (await page.entries()).items}


async def test_a_delta_carries_what_this_device_wrote_and_lazy_values_wait(
    tmp_path: Path,
) -> None:
    """A delta holds each key this device wrote since its last upload once (its last
    value), the EAGER pieces of its values in the section and the LAZY ones apart; a
    value replaced before the upload is not carried."""
    async with await Repository.open(tmp_path) as repo:
        page = await repo.ledger("l").page("p")
        photo = random.Random(1).randbytes(200_000)
        replaced = random.Random(2).randbytes(200_000)
        await page.put(b"photo", photo, Priority.LAZY)
        await page.put(b"draft", replaced, Priority.LAZY)
        await page.flush()
        await page.put(b"draft", b"final", Priority.LAZY)  # a later commit replaces it
        await page.put(b"e", b"e" * 100)
        d = await exchange.pending_delta(page)
        assert d is not None and [e[0] for e in d.entries] == [b"draft", b"e", b"photo"]
        assert not set(d.eager) & set(d.lazy)
        lazy = await page.objects.get_pieces(d.lazy)
        assert sum(map(len, lazy.values())) >= len(photo)
        assert not any(v in replaced for v in lazy.values() if len(v) > 1000)
        eager = await page.objects.get_pieces(d.eager)
        assert not [v for v in eager.values() if len(v) > 1000 and v in photo]
        await exchange.mark_uploaded(page, d)
        assert await exchange.pending_delta(page) is None
        assert not await exchange.has_unuploaded(page)


async def test_the_cost_of_an_upload_follows_the_change_not_the_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fifty commits of 100 new random keys each, after an upload of 5,000: one diff
    from the commit the last upload was read at to the head, not one walk per commit."""
    rng = random.Random(3)
    async with await Repository.open(tmp_path) as repo:
        page = await repo.ledger("l").page("p")
        await page.write([(rng.randbytes(16), rng.randbytes(100)) for _ in range(5000)])
        await mark_all_uploaded(page)
        for _ in range(50):
            async with page.transaction() as txn:
                for _ in range(100):
                    await txn.put(rng.randbytes(16), rng.randbytes(100))
        loads = 0
        load = page.nodes.load

        async def counting(d: bytes) -> Any:
            nonlocal loads
            loads += 1
            return await load(d)

        monkeypatch.setattr(page.nodes, "load", counting)
        d = await exchange.pending_delta(page)
        assert d is not None and len(d.entries) == 5000
        pages_of_tree = loads
        assert pages_of_tree < 5000 // 10  # the diff's nodes, a fraction of the keys


@pytest.mark.parametrize("entries", [20, 2000])
async def test_an_import_with_a_corrupt_piece_stores_nothing(tmp_path: Path, entries: int) -> None:
    async with (
        await Repository.open(tmp_path / "a") as ra,
        await Repository.open(tmp_path / "b") as rb,
    ):
        a = await ra.ledger("l").page("p")
        b = await rb.ledger("l").page("p")
        await a.write([(b"k%d" % i, b"v%d" % i * 50) for i in range(entries)])
        d = await exchange.pending_delta(a)
        assert d is not None
        pieces = await exchange.read_pieces(a, d.eager)
        victim = sorted(pieces)[0]
        pieces[victim] = pieces[victim][:-1] + b"!"
        with pytest.raises(CorruptObjectError, match="does not match its digest"):
            await exchange.apply_delta(
                b, d.entries, pieces, {}, d.ctx, writer=a.graph.tag, since=d.since, upto=d.upto
            )
        assert await _values(b) == {} and b.graph.ctx == {}
        assert await b.objects.known(sorted(pieces)) == set()


@pytest.mark.parametrize(
    "raw",
    [
        "not a list",
        [[b"k", b"\x05v", 0]],  # no dot
        [[b"k", b"\x05v", 2, b"d" * 16]],  # priority
        [[b"k", b"\x05v", 0, b"d" * 15]],  # a short dot
        [[b"b", b"\x05v", 0, b"d" * 16], [b"a", b"\x05v", 0, b"d" * 16]],  # order
        [[b"k" * 4097, b"\x05v", 0, b"d" * 16]],  # key too long
        [[b"k", b"\x05v", 0, b"d" * 16, [[b"\x05w", 0, b"d" * 16]]]],  # a dot twice
        [[b"k", b"not a digest", 0, b"d" * 16]],
        [[b"k", b"\x05v", 0, b"\xff" * 16]],  # a time past the limit
    ],
)
async def test_entries_that_no_ledgerd_makes_are_refused(raw: object) -> None:
    with pytest.raises(CorruptObjectError):
        await exchange.check_entries(raw)


async def test_the_check_in_turns_is_the_check_across_its_turns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """check_entries checks in turns of TURN_KEYS entries: it gives what one turn
    gives, and the key order is checked across a turn's edge too."""
    dot = b"\x00" * 7 + b"\x01" + b"d" * 8
    value = dg.value_chunk_digest(b"v")
    raw = [[b"k%08d" % i, value, 0, dot] for i in range(2 * TURN_KEYS + 5)]
    in_turns = await exchange.check_entries(raw)
    with monkeypatch.context() as m:
        m.setattr(join, "TURN_KEYS", len(raw))
        assert in_turns == await exchange.check_entries(raw)
    for edge in (TURN_KEYS, 2 * TURN_KEYS):
        swapped = list(raw)
        swapped[edge - 1], swapped[edge] = swapped[edge], swapped[edge - 1]
        with pytest.raises(CorruptObjectError, match="increasing key order"):
            await exchange.check_entries(swapped)
    with pytest.raises(CorruptObjectError):
        await exchange.check_entries("not a list")


async def test_a_delta_waits_for_what_its_writer_had_seen(tmp_path: Path) -> None:
    """C's delta, made after C applied A's, is not applied on B before A's: B would take
    C's context for seen and drop A's writes when they came."""
    repos = [await Repository.open(tmp_path / n) for n in "abc"]
    try:
        a, b, c = [await r.ledger("l").page("p") for r in repos]
        await a.put(b"from-a", b"1")
        da = await exchange.pending_delta(a)
        assert da is not None
        await ship(a, c)
        await c.put(b"from-c", b"2")
        dc = await exchange.pending_delta(c)
        assert dc is not None
        pieces: dict[bytes, bytes] = {}
        with pytest.raises(exchange.NotReadyError) as raised:
            await exchange.apply_delta(
                b, dc.entries, pieces, {}, dc.ctx, writer=c.graph.tag, since=dc.since, upto=dc.upto
            )
        assert raised.value.needs == {a.graph.tag: a.graph.ctx[a.graph.tag]}
        await exchange.apply_delta(
            b, da.entries, {}, {}, da.ctx, writer=a.graph.tag, since=da.since, upto=da.upto
        )
        await exchange.apply_delta(
            b, dc.entries, {}, {}, dc.ctx, writer=c.graph.tag, since=dc.since, upto=dc.upto
        )
        assert await _values(b) == {b"from-a": b"1", b"from-c": b"2"}
    finally:
        for r in repos:
            await r.close()


async def test_a_state_joins_into_a_page_with_writes_of_its_own(tmp_path: Path) -> None:
    """A checkpoint's state joins with a page that wrote on its own meanwhile: both
    writes stay, what the state deleted stays deleted, and the page then sends its own
    writes, which the others apply on top of what they had."""
    repos = [await Repository.open(tmp_path / n) for n in "abc"]
    try:
        a, b, c = [await r.ledger("l").page("p") for r in repos]
        await a.write([(b"k%d" % i, b"v%d" % i) for i in range(10)])
        await ship(a, b, c)
        await c.put(b"c-only", b"offline write")
        await a.delete(b"k3")
        await a.put(b"k4", b"newer")
        await ship(a, b)
        st = await exchange.state(b)
        assert st is not None
        eager = await exchange.read_pieces(b, st.eager)
        assert await exchange.apply_state(c, st.entries, eager, {}, st.ctx)
        got = await _values(c)
        assert got[b"c-only"] == b"offline write" and b"k3" not in got and got[b"k4"] == b"newer"
        await exchange_all(a, b, c)
        assert await _values(a) == await _values(b) == got
        assert a.head.root == b.head.root == c.head.root
    finally:
        for r in repos:
            await r.close()


async def test_an_import_applied_in_turns_makes_the_tree_one_apply_makes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An import builds its tree a slice of SLICE_ENTRIES at a time, the event loop given
    a turn between; the tree is the one a single slice makes, and the nodes the slices
    made in between are not stored."""
    repos = [await Repository.open(tmp_path / n) for n in "abc"]
    try:
        a, b, c = [await r.ledger("l").page("p") for r in repos]
        await a.put(b"before", b"1")
        await ship(a, b, c)
        async with a.transaction() as tx:
            await tx.put_many([(b"k%05d" % i, b"v%d" % i) for i in range(0, 3000, 3)])
        await a.delete(b"before")
        bucket = Bucket()
        assert await bucket.upload(a)
        assert await bucket.download(b)  # in one apply
        monkeypatch.setattr(builder, "SLICE_ENTRIES", 7)
        assert await bucket.download(c)  # in slices of 7
        assert b.head.root == c.head.root
        assert await _values(c) == await _values(a)
        count = "SELECT count(*) FROM objects"
        assert await b.db.read_all(count) == await c.db.read_all(count)
    finally:
        for r in repos:
            await r.close()
