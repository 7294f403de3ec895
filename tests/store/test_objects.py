"""The object store: round trips, ranged reads, dedup, edit locality, status, corruption."""

from __future__ import annotations

import hashlib
import random
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ledgerd.store.errors import CorruptObjectError, ObjectNotFoundError, RangeError
from ledgerd.store.pieces import digest as dg
from ledgerd.store.pieces import split
from ledgerd.store.pieces.objects import ObjectStore
from ledgerd.store.sqlite import sql
from ledgerd.store.sqlite.schema import LOCAL, SYNCED, TRANSIENT

MiB = 1024 * 1024


def _data(seed: int, n: int) -> bytes:
    return random.Random(seed).randbytes(n)


async def _stream(seed: int, total: int, block: int = 1 * MiB) -> AsyncIterator[bytes]:
    rng = random.Random(seed)
    sent = 0
    while sent < total:
        n = min(block, total - sent)
        yield rng.randbytes(n)
        sent += n


async def _read(
    objects: ObjectStore, d: bytes, offset: int = 0, length: int | None = None
) -> bytes:
    return b"".join([b async for b in await objects.read(d, offset, length)])


async def _rows(objects: ObjectStore, table: str = "objects") -> int:
    return int((await objects.db.read_all(f"SELECT count(*) FROM {table}"))[0][0])


@pytest.mark.parametrize("size", [0, 1, 32, 33, 4095, 4096, 65535, 65536, MiB])
async def test_round_trip_and_ranged_reads(objects: ObjectStore, size: int) -> None:
    data = _data(size, size)
    ref = await objects.put_value(data, "Itest")
    assert ref.size == size == await objects.size(ref.digest)
    assert await _read(objects, ref.digest) == data
    rng = random.Random(size)
    for _ in range(25):
        off = rng.randint(0, size)
        length = rng.randint(0, size - off + 10)
        assert await _read(objects, ref.digest, off, length) == data[off : off + length]
    if size <= dg.INLINE_LIMIT:
        assert await _rows(objects) == 0  # inline values are never rows


async def test_64_mib_streamed_round_trip(objects: ObjectStore) -> None:
    size = 64 * MiB
    ref = await objects.put_value(_stream(7, size), "Itest")
    assert ref.size == size
    want = hashlib.sha256()
    async for block in _stream(7, size):
        want.update(block)
    got = hashlib.sha256()
    async for block in await objects.read(ref.digest):
        assert len(block) <= split.MAX_CHUNK
        got.update(block)
    assert got.digest() == want.digest()
    # Ranged reads checked against the regenerated source bytes.
    source = b"".join([b async for b in _stream(7, size)])
    rng = random.Random(8)
    for _ in range(20):
        off = rng.randint(0, size - 1)
        length = rng.randint(1, 300_000)
        assert await _read(objects, ref.digest, off, length) == source[off : off + length]


async def test_file_source(objects: ObjectStore, tmp_path: Path) -> None:
    src = tmp_path / "in.bin"
    data = _data(9, 3 * MiB + 17)
    src.write_bytes(data)
    ref = await objects.put_value(src, "Itest")
    out = tmp_path / "out.bin"
    assert await objects.read_to_file(ref.digest, out) == len(data)
    assert out.read_bytes() == data


async def test_range_past_end_is_an_error(objects: ObjectStore) -> None:
    ref = await objects.put_value(b"a" * 100, "Itest")
    assert await _read(objects, ref.digest, 100, 5) == b""
    with pytest.raises(RangeError):
        await objects.read(ref.digest, 101)
    with pytest.raises(RangeError):
        await objects.read(ref.digest, -1)


async def test_same_value_twice_adds_no_rows(objects: ObjectStore) -> None:
    data = _data(10, 2 * MiB)
    a = await objects.put_value(data, "Ia")
    tables = ("objects", "unsynced", "journal_pieces")
    before = {t: await _rows(objects, t) for t in tables}
    b = await objects.put_value(data, "Ia")
    assert a == b
    assert {t: await _rows(objects, t) for t in tables} == before


async def test_values_sharing_a_run_share_its_chunks(objects: ObjectStore) -> None:
    shared = _data(11, 4 * MiB)
    a = await objects.put_value(_data(12, 300_000) + shared, "Ia")
    n_a = await _rows(objects)
    b = await objects.put_value(_data(13, 500_000) + shared + _data(14, 1000), "Ia")
    n_new = await _rows(objects) - n_a
    assert a.digest != b.digest
    # ~4 MiB shared at ~20 KiB per chunk: about 200 chunks reused; b adds only the
    # chunks of its own prefix and suffix, the seams, and its index pieces.
    n_b_total = len(split.split_bytes(_data(13, 500_000) + shared + _data(14, 1000))[0])
    assert n_new < n_b_total - 150


async def test_insert_in_middle_of_16_mib_is_local(objects: ObjectStore) -> None:
    data = _data(15, 16 * MiB)
    pieces, root = split.split_bytes(data)
    await objects.put_value(data, "Ia")
    before = {bytes(r[0]) for r in await objects.db.read_all("SELECT digest FROM objects")}
    mid = len(data) // 2
    edited = data[:mid] + b"!" + data[mid:]
    ref = await objects.put_value(edited, "Ia")
    assert await _read(objects, ref.digest, mid - 3, 7) == edited[mid - 3 : mid + 4]
    after = {bytes(r[0]) for r in await objects.db.read_all("SELECT digest FROM objects")}
    new = after - before
    new_chunks = [d for d in new if not dg.is_index(d)]
    new_index = [d for d in new if dg.is_index(d)]
    height = _height(pieces, root.digest)
    assert height >= 2  # the test is only meaningful with a multi-level index
    assert len(new_chunks) <= 3
    assert 1 <= len(new_index) <= height  # one index piece per level on the path to the root


def _height(pieces: list[split.Piece], root: bytes) -> int:
    by = {p.digest: p.data for p in pieces}
    h, d = 0, root
    while dg.is_index(d):
        h += 1
        d = split.decode_index(by[d])[0].digest
    return h


async def test_status_moves_forward_and_discard_collects(objects: ObjectStore) -> None:
    data = _data(16, 200_000)
    ref = await objects.put_value(data, "Ejournal")
    digests = [bytes(r[0]) for r in await objects.db.read_all("SELECT digest FROM objects")]
    assert digests and all([await objects.status(d) == TRANSIENT for d in digests])
    # Another journal stages the same value; discarding the first keeps it.
    await objects.put_value(data, "Iother")
    assert await objects.discard("Ejournal") == 0
    await objects.db.run(lambda conn: sql.mark_local(conn, "Iother"), write=True)
    assert all([await objects.status(d) == LOCAL for d in digests])
    await objects.mark_synced(digests)
    assert all([await objects.status(d) == SYNCED for d in digests])
    # Staging the value again never moves status backwards.
    await objects.put_value(data, "Ithird")
    assert all([await objects.status(d) == SYNCED for d in digests])
    assert await _read(objects, ref.digest) == data


async def test_discarded_journal_leaves_no_trace(objects: ObjectStore) -> None:
    await objects.put_value(_data(17, MiB), "Ekept")
    kept = await _rows(objects)
    await objects.put_value(_data(18, 2 * MiB), "Egone")
    assert await _rows(objects) > kept
    assert await objects.discard("Egone") > 0
    assert await _rows(objects) == kept
    assert await _rows(objects, "journal_pieces") == kept


async def test_failed_stream_leaves_no_trace(objects: ObjectStore) -> None:
    async def broken() -> AsyncIterator[bytes]:
        yield _data(19, 5 * MiB)
        raise ConnectionResetError("client went away")

    with pytest.raises(ConnectionResetError):
        await objects.put_value(broken(), "Ia")
    assert await _rows(objects) == 0
    assert await _rows(objects, "journal_pieces") == 0


async def test_recover_drops_staged_and_explicit_pieces(objects: ObjectStore) -> None:
    token, _ = await objects.stage_value(_data(20, MiB))  # as if the writer crashed here
    await objects.put_value(_data(21, MiB), "Etxn")
    await objects.put_value(_data(22, MiB), "Iplain")
    plain = {
        bytes(r[0])
        for r in await objects.db.read_all(
            "SELECT digest FROM journal_pieces WHERE journal_id = 'Iplain'"
        )
    }
    assert token.startswith("U")
    assert await objects.recover() > 0
    left = {bytes(r[0]) for r in await objects.db.read_all("SELECT digest FROM objects")}
    assert left == plain


@pytest.mark.parametrize("which", ["chunk", "index"])
async def test_corrupted_row_is_detected(objects: ObjectStore, which: str) -> None:
    data = _data(23, 3 * MiB)
    ref = await objects.put_value(data, "Ia")
    rows = await objects.db.read_all("SELECT digest, data FROM objects")
    victim, content = next(
        (bytes(d), bytes(v)) for d, v in rows if dg.is_index(bytes(d)) == (which == "index")
    )
    flipped = bytearray(content)
    flipped[len(flipped) // 2] ^= 0x01
    async with objects.db.write() as conn:
        await conn.execute("UPDATE objects SET data = ? WHERE digest = ?", (bytes(flipped), victim))
    with pytest.raises(CorruptObjectError, match="does not match its digest"):
        await _read(objects, ref.digest)


async def test_missing_piece_is_not_found(objects: ObjectStore) -> None:
    ref = await objects.put_value(_data(24, MiB), "Ia")
    async with objects.db.write() as conn:
        await conn.execute(
            "DELETE FROM objects WHERE digest IN (SELECT digest FROM objects LIMIT 1)"
        )
    with pytest.raises(ObjectNotFoundError):
        await _read(objects, ref.digest)


async def test_fetcher_supplies_missing_pieces_and_is_verified(objects: ObjectStore) -> None:
    data = _data(25, MiB)
    pieces, root = split.split_bytes(data)
    cloud = {p.digest: p.data for p in pieces}
    calls: list[int] = []

    async def fetch(digests: list[bytes]) -> dict[bytes, bytes]:
        calls.append(len(digests))
        return {d: cloud[d] for d in digests}

    objects.fetcher = fetch
    assert await _read(objects, root.digest) == data
    assert calls and await objects.status(root.digest) == SYNCED
    n = len(calls)
    assert await _read(objects, root.digest) == data
    assert len(calls) == n  # stored after the first fetch

    victim = next(d for d in cloud if not dg.is_index(d))
    cloud[victim] = cloud[victim][:-1]
    async with objects.db.write() as conn:
        await conn.execute("DELETE FROM objects WHERE digest = ?", (victim,))
    objects.clear_cache()  # as in a fresh process
    with pytest.raises(CorruptObjectError):
        await _read(objects, root.digest)
    assert not await objects.db.read_all("SELECT 1 FROM objects WHERE digest = ?", (victim,))


async def test_piece_cache_is_bounded_across_views(objects: ObjectStore) -> None:
    view = objects.overlaid({b"m": b"in memory"})  # a transaction's view shares the cache
    piece = 60 * 1024
    budget = objects.cache.cache.budget
    n = 2 * budget // piece
    for i in range(n):
        (view if i % 2 else objects).remember([(b"%05d" % i, bytes(piece))])
    held = [d for i in range(n) if (d := b"%05d" % i) in objects.cache]
    assert 0 < len(held) * piece <= objects.cache.cache.used <= budget
    assert b"%05d" % (n - 1) in held  # the newest stay
