"""Tree nodes stored as deltas against the nodes they replace (store.pieces.delta)."""

from __future__ import annotations

import os
import random
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledgerd.store import Page, Repository, Snapshot
from ledgerd.store.errors import CorruptObjectError
from ledgerd.store.page import check as ck
from ledgerd.store.page import gc
from ledgerd.store.page.gc import collect
from ledgerd.store.pieces import delta
from ledgerd.store.sqlite import schema
from ledgerd.store.sqlite.schema import create_page_schema
from ledgerd.store.tree import btree, builder

PIECE_PAD = b"." * 100
"""Makes a value longer than INLINE_LIMIT: a piece of its own, not inline in its leaf."""

KEYS = 2000


# -- the format -----------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=1, max_size=3000), st.data())
def test_a_delta_rebuilds_the_runs_it_was_made_of(base: bytes, data: st.DataObject) -> None:
    ops: list[delta.Op] = []
    want = b""
    for _ in range(data.draw(st.integers(0, 12))):
        if data.draw(st.booleans()):
            lit = data.draw(st.binary(max_size=80))
            ops.append(lit)
            want += lit
        else:
            start = data.draw(st.integers(0, len(base)))
            length = data.draw(st.integers(0, len(base) - start))
            ops.append((start, length))
            want += base[start : start + length]
    assert delta.apply(base, delta.encode(ops)) == want


def test_adjacent_runs_are_joined() -> None:
    encoded = delta.encode([b"a", b"b", (10, 5), (15, 5), (0, 0), b"", (40, 2)])
    assert msgpack.unpackb(encoded) == [b"ab", 10 << 17 | 10, 40 << 17 | 2]


@pytest.mark.parametrize("damaged", [b"\xc1", msgpack.packb({"a": 1}), msgpack.packb([1.5])])
def test_a_delta_that_does_not_decode_is_corrupt(damaged: bytes) -> None:
    with pytest.raises(CorruptObjectError, match="undecodable delta"):
        delta.apply(b"base", damaged)


def _row(
    asked: bytes, data: bytes, is_delta: int, depth: int
) -> tuple[bytes, bytes, int, int, bytes]:
    return (asked, data, is_delta, depth, b"")


def test_a_chain_is_applied_from_the_whole_piece_up() -> None:
    first = delta.encode([(0, 5), b"!"])  # "hello" -> "hello!"
    second = delta.encode([b">", (0, 6)])  # -> ">hello!"
    rows = [_row(b"d", second, 1, 0), _row(b"d", b"hello world", 0, 2), _row(b"d", first, 1, 1)]
    assert delta.assemble(rows) == {b"d": b">hello!"}
    assert delta.assemble([_row(b"w", b"whole", 0, 0)]) == {b"w": b"whole"}


@pytest.mark.parametrize(
    "rows",
    [
        [_row(b"d", delta.encode([(0, 1)]), 1, 0)],  # its base is gone
        [_row(b"d", delta.encode([(0, 1)]), 1, 0), _row(b"d", delta.encode([b"x"]), 1, 1)],
        [_row(b"d", delta.encode([(0, 1)]), 1, 0), _row(b"d", b"whole", 0, 2)],  # a gap
    ],
)
def test_a_chain_that_does_not_end_at_a_whole_piece_is_corrupt(
    rows: list[tuple[bytes, bytes, int, int, bytes]],
) -> None:
    with pytest.raises(CorruptObjectError, match="chain does not end"):
        delta.assemble(rows)
    broken: set[bytes] = set()
    assert delta.assemble([*rows, _row(b"w", b"whole", 0, 0)], broken) == {b"w": b"whole"}
    assert broken == {b"d"}


@settings(max_examples=100, deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=20), min_size=1, max_size=80, unique=True))
def test_a_node_s_parts_are_its_encoding(keys: list[bytes]) -> None:
    entries = tuple((k, bytes([0]) + bytes(32), 0, bytes(16)) for k in sorted(keys))
    leaf = btree.Node(0, entries, ())
    assert b"".join(builder._parts(leaf)) == btree.encode_node(leaf)
    children = tuple(
        bytes([4]) + bytes([i % 256]) * 32 if i % 3 else b"" for i in range(len(keys) + 1)
    )
    inner = btree.Node(2, entries, children)
    assert b"".join(builder._parts(inner)) == btree.encode_node(inner)


# -- pages ------------------------------------------------------------------------------


@contextmanager
def _db(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    (path,) = tmp_path.glob("*/ledgers/*/*/page.sqlite")
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        yield conn
    finally:
        conn.close()


def _key(i: int) -> bytes:
    return b"key-%06d" % i


async def _churn(page: Page, model: dict[bytes, bytes], commits: int, seed: int) -> list[bytes]:
    """``commits`` transactions of 20 random changes (puts of new values, a few deletes);
    the head after each."""
    rng = random.Random(seed)
    heads = []
    for c in range(commits):
        async with page.transaction() as tx:
            for _ in range(20):
                k = _key(rng.randrange(KEYS))
                if rng.random() < 0.1:
                    await tx.delete(k)
                    model.pop(k, None)
                else:
                    v = b"value %d of commit %d, a piece" % (rng.random() * 1e9, c) + PIECE_PAD
                    await tx.put(k, v)
                    model[k] = v
        heads.append(page.head.id)
    return heads


async def _loaded(repo: Repository, model: dict[bytes, bytes]) -> Page:
    page = await repo.ledger("l").page("p")
    first = {_key(i): b"first value of %d, a piece" % i + PIECE_PAD for i in range(KEYS)}
    async with page.transaction() as tx:
        await tx.put_many(first.items())
    model.update(first)
    return page


async def _read_all(view: Page | Snapshot) -> dict[bytes, bytes]:
    return {kv[0]: kv[1] for kv in (await view.entries()).items}


async def test_rewritten_nodes_are_deltas_in_bounded_chains_that_read_back(tmp_path: Path) -> None:
    model: dict[bytes, bytes] = {}
    async with await Repository.open(tmp_path) as repo:
        page = await _loaded(repo, model)
        await page.put(b"solo", b"x")
        await page.flush()
        model[b"solo"] = b"x"
        after_load = dict(model)
        load_head = page.head.id
        await _churn(page, model, 80, seed=1)
        await page.flush()
    with _db(tmp_path) as conn:
        depths = dict(conn.execute("SELECT depth, count(*) FROM objects GROUP BY depth").fetchall())
        levels = {
            msgpack.unpackb(bytes(row[0]))[0]
            for row in conn.execute(
                "SELECT data FROM objects WHERE base IS NULL AND substr(digest, 1, 1) = x'04'"
            )
        }
        deltas_of_inner = conn.execute(
            "SELECT count(*) FROM objects d JOIN objects b ON b.id = d.base "
            "WHERE b.base IS NULL AND substr(b.data, 2, 1) != x'00'"
        ).fetchone()[0]
    assert max(d for d in depths if d is not None) == delta.MAX_DEPTH  # chains end there
    assert sum(n for d, n in depths.items() if d is not None) > 500
    assert levels >= {0, 1}
    assert deltas_of_inner > 0  # inner nodes, not only leaves
    # A fresh process: every node is read from its chain.
    async with await Repository.open(tmp_path) as repo:
        page = await repo.ledger("l").page("p")
        assert await _read_all(page) == dict(sorted(model.items()))
        assert await _read_all(await page.snapshot(load_head)) == dict(sorted(after_load.items()))
        report = await ck.check_page(page)
        assert report.healthy, report.problems


def _deltas(conn: sqlite3.Connection) -> int:
    return int(conn.execute("SELECT count(*) FROM objects WHERE base IS NOT NULL").fetchone()[0])


async def test_collection_stores_whole_the_kept_nodes_whose_bases_it_deletes(
    tmp_path: Path,
) -> None:
    """With no history kept, every kept node's chain passes through versions of pruned
    commits: each is stored whole, and those versions go. The next commits make deltas
    again; reads are exact throughout and after a reopen."""
    model: dict[bytes, bytes] = {}
    async with await Repository.open(tmp_path, history_retention=0) as repo:
        page = await _loaded(repo, model)
        for round_ in range(3):
            await _churn(page, model, 25, seed=10 + round_)
            with _db(tmp_path) as conn:
                assert _deltas(conn) > 0
            result = await collect(page, repo.history_retention)
            assert result.pieces_freed > 0
            with _db(tmp_path) as conn:
                assert _deltas(conn) == 0 and _baseless(conn) == 0
            page.nodes.clear_cache()
            assert await _read_all(page) == dict(sorted(model.items()))
        report = await ck.check_page(page)
        assert report.healthy, report.problems
    async with await Repository.open(tmp_path) as repo:
        page = await repo.ledger("l").page("p")
        assert await _read_all(page) == dict(sorted(model.items()))


async def test_a_kept_history_keeps_its_chains(tmp_path: Path) -> None:
    """Nodes whose chains pass only through versions that retained commits reach stay
    deltas: a collection with the whole history kept rewrites nothing."""
    model: dict[bytes, bytes] = {}
    async with await Repository.open(tmp_path, history_retention=3600) as repo:
        page = await _loaded(repo, model)
        await _churn(page, model, 10, seed=3)
        with _db(tmp_path) as conn:
            before = conn.execute("SELECT id, base, data FROM objects ORDER BY id").fetchall()
        result = await collect(page, repo.history_retention)
        assert result.commits_pruned == 0
        with _db(tmp_path) as conn:
            after = conn.execute("SELECT id, base, data FROM objects ORDER BY id").fetchall()
            assert after == before and _deltas(conn) > 0


def _stored_bytes(conn: sqlite3.Connection) -> int:
    return int(conn.execute("SELECT coalesce(sum(length(data)), 0) FROM objects").fetchone()[0])


async def test_a_partial_history_flattens_only_the_oldest_kept_versions(tmp_path: Path) -> None:
    """With part of the history kept, a kept node is stored whole only where its own base
    is a pruned version: the later kept versions stay deltas on it, so the collection
    leaves the page smaller, not larger, and every kept commit reads back."""
    now = [time.time_ns() // 1000 + 10**6]
    model: dict[bytes, bytes] = {}
    async with await Repository.open(tmp_path, history_retention=3600) as repo:
        page = await _loaded(repo, model)
        page.graph.clock_us = lambda: now[0]
        await _churn(page, model, 20, seed=1)  # two hours old at the collection: pruned
        now[0] += 2 * 3600 * 10**6
        kept = await _churn(page, model, 10, seed=2)
        expected = {c: await _read_all(await page.snapshot(c)) for c in kept}
        with _db(tmp_path) as conn:
            before = _stored_bytes(conn)
        result = await collect(page, repo.history_retention)
        assert result.commits_pruned >= 20
        with _db(tmp_path) as conn:
            assert _stored_bytes(conn) < before
            assert _deltas(conn) > 0 and _baseless(conn) == 0
        page.nodes.clear_cache()
        for c, state in expected.items():
            assert await _read_all(await page.snapshot(c)) == state
        assert (await ck.check_page(page)).healthy


async def test_a_commit_made_during_the_collection_stays_readable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two commits stored after the collection read which commits there are and before it
    read which it retains, the second over the first's leaves: the first is neither
    retained (no history kept, and the second is the head) nor pruned (it is new), and
    its nodes are deltas against the old head's, which the collection deletes. Its tree
    is marked before any deletion, so it still reads back whole."""
    model: dict[bytes, bytes] = {}
    async with await Repository.open(tmp_path, history_retention=0) as repo:
        page = await _loaded(repo, model)
        await _churn(page, model, 3, seed=1)
        retained = gc.retained_commits
        made: list[tuple[bytes, dict[bytes, bytes]]] = []

        async def retained_commits(page_: Page, retention: float) -> set[bytes]:
            if not made:
                for seed in (2, 3):  # 20 keys of 2,000 twice: some leaves both times
                    await _churn(page, model, 1, seed=seed)
                    made.append((page.head.id, dict(model)))
            return await retained(page_, retention)

        monkeypatch.setattr(gc, "retained_commits", retained_commits)
        await collect(page, repo.history_retention)
        assert len(made) == 2 and page.head.id == made[1][0]
        assert not await gc.is_pruned(page, made[0][0])
        page.nodes.clear_cache()
        assert await _read_all(await page.snapshot(made[0][0])) == dict(sorted(made[0][1].items()))
        assert await _read_all(page) == dict(sorted(model.items()))
        assert (await ck.check_page(page)).healthy


@pytest.mark.parametrize("value", [b"SECRET-", b"SECRET, a piece " * 20], ids=["inline", "piece"])
async def test_a_purged_value_leaves_no_byte_in_the_files(tmp_path: Path, value: bytes) -> None:
    """A deleted key's value, inline in its leaf or a piece of its own, is in no file once
    its commits are pruned and collected, though the leaves that held it were the bases
    of the live leaves' chains. (The key stays, in its tombstone: sync needs it.)"""
    value += os.urandom(8).hex().encode()  # inline: 23 bytes; a piece: 336
    key = _key(1234) + b"-deleted"
    async with await Repository.open(tmp_path, history_retention=0) as repo:
        model: dict[bytes, bytes] = {}
        page = await _loaded(repo, model)
        await page.put(key, value)
        await page.flush()
        await _churn(page, model, 3, seed=5)
        await page.delete(key)
        await page.flush()
        await _churn(page, model, 3, seed=6)
        with _db(tmp_path) as conn:
            held = [bytes(r[0]) for r in conn.execute("SELECT data FROM objects")]
        assert any(value in d for d in held)  # (the test would prove nothing otherwise)
        await collect(page, repo.history_retention)
        assert await _read_all(page) == dict(sorted(model.items()))
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert value not in path.read_bytes(), path


def _baseless(conn: sqlite3.Connection) -> int:
    """Deltas whose base is not stored."""
    return int(
        conn.execute(
            "SELECT count(*) FROM objects d WHERE base IS NOT NULL "
            "AND NOT EXISTS (SELECT 1 FROM objects b WHERE b.id = d.base)"
        ).fetchone()[0]
    )


async def _churned(tmp_path: Path, commits: int, seed: int) -> None:
    """A page of :data:`KEYS` keys, then ``commits`` transactions of churn, closed."""
    async with await Repository.open(tmp_path) as repo:
        await _churn(await _loaded(repo, {}), {}, commits, seed)


def _a_base(conn: sqlite3.Connection) -> tuple[int, bytes, list[bytes]]:
    """A whole leaf that deltas are made against: its id, digest, and those deltas' digests."""
    base_id, digest = conn.execute(
        "SELECT b.id, b.digest FROM objects b WHERE b.base IS NULL AND EXISTS "
        "(SELECT 1 FROM objects d WHERE d.base = b.id) ORDER BY b.id DESC LIMIT 1"
    ).fetchone()
    on_it = [
        bytes(r[0]) for r in conn.execute("SELECT digest FROM objects WHERE base = ?", (base_id,))
    ]
    return base_id, bytes(digest), on_it


async def test_a_damaged_base_is_reported_with_the_nodes_built_on_it(tmp_path: Path) -> None:
    await _churned(tmp_path, 30, seed=3)
    with _db(tmp_path) as conn:
        base_id, base, on_it = _a_base(conn)
        data = conn.execute("SELECT data FROM objects WHERE id = ?", (base_id,)).fetchone()[0]
        conn.execute("UPDATE objects SET data = ? WHERE id = ?", (data[:-3] + b"xyz", base_id))
    async with await Repository.open(tmp_path) as repo:
        page = await repo.ledger("l").page("p")
        report = await ck.check_page(page)
        corrupt = {p.digest for p in report.problems if p.code == ck.CORRUPT_PIECE}
        assert base in corrupt and set(on_it) <= corrupt
        with pytest.raises(CorruptObjectError):
            await _read_all(page)


async def test_a_delta_whose_base_is_gone_is_corrupt_not_a_crash(tmp_path: Path) -> None:
    await _churned(tmp_path, 30, seed=4)
    with _db(tmp_path) as conn:
        base_id, base, on_it = _a_base(conn)
        conn.execute("DELETE FROM objects WHERE id = ?", (base_id,))
    async with await Repository.open(tmp_path) as repo:
        page = await repo.ledger("l").page("p")
        report = await ck.check_page(page)
        corrupt = {p.digest for p in report.problems if p.code == ck.CORRUPT_PIECE}
        assert set(on_it) <= corrupt
        for d in on_it:
            with pytest.raises(CorruptObjectError, match="chain does not end"):
                await page.objects.read_all(d)


async def test_a_base_looping_to_itself_ends_the_read(tmp_path: Path) -> None:
    await _churned(tmp_path, 5, seed=5)
    with _db(tmp_path) as conn:
        d_id, digest = conn.execute(
            "SELECT id, digest FROM objects WHERE base IS NOT NULL LIMIT 1"
        ).fetchone()
        conn.execute("UPDATE objects SET base = id WHERE id = ?", (d_id,))
    async with await Repository.open(tmp_path) as repo:
        page = await repo.ledger("l").page("p")
        with pytest.raises(CorruptObjectError):
            await page.objects.read_all(bytes(digest))


def test_version_2_migrates_to_deltas_and_the_four_byte_index() -> None:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    v2 = schema.PAGE_SCHEMA.replace(",\n    base   INTEGER,\n    depth  INTEGER\n", "\n", 1)
    v2 = v2.replace("substr(digest, 2, 4)", "substr(digest, 2, 8)")
    assert v2.count("substr(digest, 2, 8)") == 1 and "base   INTEGER" not in v2
    for statement in schema._statements(v2):
        conn.execute(statement)
    conn.execute("PRAGMA user_version = 2")
    pieces = [(bytes([4]) + bytes([i]) * 32, b"data %d" % i) for i in range(5)]
    conn.executemany("INSERT INTO objects (digest, data) VALUES (?, ?)", pieces)
    create_page_schema(conn)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == schema.SCHEMA_VERSION == 3
    (index,) = conn.execute(
        "SELECT sql FROM sqlite_schema WHERE name = 'objects_digest'"
    ).fetchone()
    assert schema.DIGEST_KEY in index and "2, 4" in index
    got = conn.execute(
        f"SELECT data, base, depth FROM objects WHERE {schema.digest_is('digest', '?1')}",
        (pieces[3][0],),
    ).fetchall()
    assert got == [(b"data 3", None, None)]


async def test_a_node_kept_as_a_base_is_still_walked_when_a_tree_reaches_it(
    tmp_path: Path,
) -> None:
    """The mark keeps the bases of a kept node's chain; a tree that reaches such a base
    later must still walk it, or the values only it holds would be swept."""
    async with await Repository.open(tmp_path) as repo:
        page = await repo.ledger("l").page("p")
        await _loaded(repo, {})
        await page.put(_key(7), b"the old value of key 7, a piece" + PIECE_PAD)
        await page.flush()
        old = page.head
        await page.put(_key(7), b"the new value of key 7, a piece" + PIECE_PAD)
        await page.flush()
        marker = gc._Marker(page)
        await marker.trees([page.head.root])  # the new leaf's chain keeps the old leaf
        entry = await (await page.snapshot(old.id)).get_entry(_key(7))
        assert entry is not None and entry.value not in marker.marked
        await marker.trees([old.root])
        assert entry.value in marker.marked


async def test_a_sweep_cut_short_leaves_no_delta_without_its_base(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gc, "SWEEP_BATCH", 16)
    model: dict[bytes, bytes] = {}
    async with await Repository.open(tmp_path, history_retention=0) as repo:
        page = await _loaded(repo, model)
        await _churn(page, model, 30, seed=6)
        batches = 0

        def stop() -> bool:
            nonlocal batches
            batches += 1
            return batches > 3

        result = await gc.collect(page, repo.history_retention, stop=stop)
        assert result.deferred == "stopped" and result.pieces_freed > 0
        report = await ck.check_page(page)
        assert report.healthy, report.problems
    with _db(tmp_path) as conn:
        assert _baseless(conn) == 0


async def test_dropping_a_damaged_base_drops_the_deltas_made_against_it(tmp_path: Path) -> None:
    await _churned(tmp_path, 30, seed=7)
    with _db(tmp_path) as conn:
        _, base, on_it = _a_base(conn)
    async with await Repository.open(tmp_path) as repo:
        page = await repo.ledger("l").page("p")
        gone = await ck.drop_pieces(page, [base])
        assert base in gone and set(on_it) <= set(gone)
    with _db(tmp_path) as conn:
        assert _baseless(conn) == 0
