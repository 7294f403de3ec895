"""Sync at scale (issue 16): requests and bytes counted with CountingStore."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import msgpack
import pytest

from ledgerd.store import Priority, Repository
from ledgerd.store.pieces import digest as dg
from ledgerd.sync import layout, pack
from ledgerd.sync.engine import SyncEngine
from ledgerd.sync.errors import BucketIdentityError
from ledgerd.sync.folder import FolderStore
from ledgerd.sync.layout import PackName
from ledgerd.sync.testing import CountingStore
from tests.sync.doubles import put_pack
from tests.sync.test_engine import Device, _keys, device


def _read_packs(root: Path) -> list[tuple[PackName, pack.Header, bytes]]:
    out = []
    for f in sorted((root / "packs").iterdir()):
        pn = PackName.parse(f"packs/{f.name}")
        assert pn is not None
        data = f.read_bytes()
        out.append((pn, pack.decode_header(data[: pn.head_end], pn.head_end, pn.eager_end), data))
    return out


# -- 1. one pack per round; a device fetches the parts of the pages it holds -------------


async def test_two_hundred_changed_pages_go_up_in_one_put(
    tmp_path: Path, bucket: FolderStore
) -> None:
    async with device(tmp_path / "a", bucket) as a, device(tmp_path / "b", bucket) as b:
        for i in range(200):
            async with a.repo.page(b"l", b"p%03d" % i) as pg:
                await pg.put(b"k", b"v%d" % i)
        a.cloud.reset()
        stats = await a.engine.round()
        assert stats.uploaded_packs == 1
        assert a.cloud.counts["put"] <= 2, a.cloud.counts  # the pack (+ the marker, once)
        shown = a.engine.status()["last_round"]  # what status shows of the round
        assert shown["put"] == a.cloud.counts["put"] and shown["list"] == a.cloud.counts["list"]
        assert shown["bytes_up"] == a.cloud.bytes_put and shown["uploaded_packs"] == 1
        b.cloud.reset()
        await b.engine.round()
        # The marker (b's first contact with the bucket), then index and sections: one GET.
        assert b.cloud.counts["get"] == 2, b.cloud.counts
        assert b.engine.status()["last_round"]["bytes_down"] == b.cloud.bytes_got
        assert (await _keys(b.repo, "l", "p123")) == {b"k": b"v123"}
        assert len(await b.repo.ledger("l").pages()) == 200


async def test_a_page_larger_than_a_pack_sends_its_entries_last(
    tmp_path: Path, bucket: FolderStore
) -> None:
    max_pack = 300_000
    rng = random.Random(5)
    async with device(tmp_path / "a", bucket, max_pack=max_pack) as a:
        big = await a.repo.ledger("l").page("big")
        for i in range(6):
            await big.put(b"v%d" % i, rng.randbytes(120_000))
        small = await a.repo.ledger("l").page("small")
        await small.put(b"k", b"v")
        a.cloud.reset()
        stats = await a.engine.round()
        # 720 kB of incompressible values: three packs (+1), never one per page.
        assert 3 <= stats.uploaded_packs <= 4
        assert a.cloud.counts["put"] <= stats.uploaded_packs + 1
    packs = _read_packs(tmp_path / "bucket")
    with_entries: dict[bytes, int] = {}
    last_piece: dict[bytes, int] = {}
    for i, (_, header, data) in enumerate(packs):
        for p in header.pages:
            entries, eager = pack.decode_section(data[p.eager.offset : p.eager.end], p.eager)
            if eager or p.lazy:
                last_piece[p.page] = i
            if entries:
                assert p.page not in with_entries, "a page's entries went up twice"
                with_entries[p.page] = i
    # Pieces are in the bucket before any entry that references them.
    assert with_entries[b"big"] == last_piece[b"big"] and with_entries[b"big"] > 0
    async with device(tmp_path / "b", bucket) as b:
        await b.engine.sync()
        assert len(await _keys(b.repo, "l", "big")) == 6


def test_a_section_s_size_counts_the_values_its_entries_carry() -> None:
    """A value of up to 128 bytes is its digest, in its entry: a page of such values is
    sized by them, not by a flat guess per entry (which sized a page of 128-byte
    values at a third of its bytes)."""
    dot = bytes(16)
    small = [(b"k%05d" % i, dg.value_chunk_digest(b"v" * 128), 0, dot) for i in range(1000)]
    hashed = [(b"k%05d" % i, dg.value_chunk_digest(b"v" * 200), 0, dot) for i in range(1000)]
    assert pack.entries_size(small) == 1000 * (6 + 129 + pack.ENTRY_OVERHEAD)
    assert pack.entries_size(hashed) == 1000 * (6 + 33 + pack.ENTRY_OVERHEAD)
    section = pack.Section(b"l", b"p", [list(e) for e in small], [])
    encoded = len(msgpack.packb(section.entries, use_bin_type=True))
    assert 0.95 * encoded <= section.size() <= 1.25 * encoded


async def test_pages_of_small_values_go_up_in_packs_of_at_most_max_pack(
    tmp_path: Path, bucket: FolderStore
) -> None:
    """Two pages whose entries carry 100-byte values, each about 0.6 of ``max_pack``: two
    packs, not one of 1.2 times it."""
    max_pack = 200_000
    async with device(tmp_path / "a", bucket, max_pack=max_pack) as a:
        for name in ("p1", "p2"):
            page = await a.repo.ledger("l").page(name)
            await page.write([(b"k%05d" % i, os.urandom(100)) for i in range(800)])
        stats = await a.engine.round()
        assert stats.uploaded_packs == 2, stats


async def test_a_device_fetches_only_the_sections_of_the_pages_it_holds(
    tmp_path: Path, bucket: FolderStore
) -> None:
    rng = random.Random(3)
    async with device(tmp_path / "a", bucket) as a:
        for i in range(30):
            async with a.repo.page(b"other", b"p%02d" % i) as pg:
                await pg.put(b"k", rng.randbytes(20_000))
        async with a.repo.page(b"mine", b"p") as pg:
            await pg.put(b"k", b"mine")
            await pg.put(b"photo", rng.randbytes(50_000), Priority.LAZY)
        await a.engine.sync()
    size = sum(p.stat().st_size for p in (tmp_path / "bucket" / "packs").iterdir())
    assert size > 600_000

    def holds(ledger: bytes, page: bytes) -> bool:
        return ledger == b"mine"

    async with device(tmp_path / "b", bucket, wants=holds) as b:
        await b.engine.sync()
        # The marker (a first contact with the bucket), then the index and this page's
        # EAGER section: two ranged GETs, a few kB.
        assert b.cloud.counts["get"] == 3, b.cloud.gets
        assert b.cloud.bytes_got < 4_000, b.cloud.bytes_got
        assert await b.repo.ledgers() == [b"mine"]
        pb = await b.repo.ledger("mine").page("p")
        assert await pb.get(b"k") == b"mine"
        assert b.cloud.counts["get"] == 3
        assert len(await pb.get(b"photo")) == 50_000  # LAZY: now, by its own ranges
        assert b.cloud.bytes_got < 60_000, b.cloud.bytes_got


async def test_ten_thousand_pages_in_the_bucket_an_idle_poll_is_one_list(
    tmp_path: Path, bucket: FolderStore
) -> None:
    """A pack of 10,000 pages (planted: making 10,000 SQLite pages takes minutes here):
    a device that holds one of them reads the index and one section, then idles on
    one LIST per poll."""
    x = os.urandom(16)
    sections = [
        pack.Section(b"l", b"p%05d" % i, [], [(_digest(b"value %140d" % i), b"value %140d" % i)])
        for i in range(10_000)
    ]
    await put_pack(bucket, x, 1, sections, int(time.time() * 1000))
    async with device(tmp_path / "b", bucket, wants=lambda _l, p: p == b"p04242") as b:
        await b.engine.sync()
        # The index and one section (and the marker: a first contact with the bucket).
        packs = [g for g in b.cloud.gets if g[0].startswith("packs/")]
        assert len(packs) == 2 and b.cloud.counts["get"] == 3, b.cloud.gets
        assert await b.repo.ledger("l").pages() == [b"p04242"]
        for _ in range(3):
            b.cloud.reset()
            await b.engine.round()
            assert b.cloud.counts == {"list": 1}, b.cloud.counts


def _digest(data: bytes) -> bytes:
    assert len(data) > 32  # hashed, not inline
    return dg.value_chunk_digest(data)


# -- 2. the feed: one LIST per idle poll, whatever the number of devices; skewed clocks ---


async def test_twenty_idle_devices_cost_one_list_per_poll(
    tmp_path: Path, bucket: FolderStore
) -> None:
    for i in range(20):
        async with device(tmp_path / f"d{i}", bucket) as d:
            pg = await d.repo.ledger("l").page(f"p{i}")
            await pg.put(b"k", b"from %d" % i)
            await d.engine.sync()
    async with device(tmp_path / "b", bucket) as b:
        await b.engine.sync()
        assert len(await b.repo.ledger("l").pages()) == 20
        for _ in range(3):
            b.cloud.reset()
            await b.engine.round()
            assert b.cloud.counts == {"list": 1}, b.cloud.counts


async def test_clocks_an_hour_off_miss_nothing(tmp_path: Path, bucket: FolderStore) -> None:
    hour = 3600.0

    def skewed(by: float):
        return lambda: time.time() + by

    async with (
        device(tmp_path / "slow", bucket, clock=skewed(-hour)) as slow,
        device(tmp_path / "fast", bucket, clock=skewed(hour)) as fast,
        device(tmp_path / "ok", bucket) as ok,
    ):
        everyone = (slow, fast, ok)
        written: set[bytes] = set()
        for i in range(4):
            for n, d in enumerate(everyone):
                key = b"%d-%d" % (i, n)
                pg = await d.repo.ledger("l").page(f"p{n}")  # each its own page
                await pg.put(key, b"v")
                written.add(key)
                await d.engine.round()  # upload; the others poll now and then
                for other in everyone:
                    if other is not d:
                        await other.engine.round()
        for d in everyone:
            await d.engine.round()
        for d in everyone:
            got: set[bytes] = set()
            for n in range(3):
                got |= set(await _keys(d.repo, "l", f"p{n}"))
            assert got == written
            assert d.engine.status()["gaps"] == []


async def _land_behind(
    tmp_path: Path, bucket: FolderStore, a: Device, b: Device, wait: Callable[[], None]
) -> None:
    """A writes "one" and "two"; the pack of "two" lands only after B listed a pack
    that another device named an hour later, below that name, as a PUT slower than
    the window would; ``wait`` runs between B's listing and the landing."""
    await _put(a, "p", b"one")
    await a.engine.round()
    await b.engine.round()
    hidden = _read_packs(tmp_path / "bucket")[-1][0]
    await _put(a, "p", b"two")
    await a.engine.round()
    newest = _read_packs(tmp_path / "bucket")[-1][0]
    src = tmp_path / "bucket" / newest.name
    data = src.read_bytes()
    header = pack.decode_header(data[: newest.head_end], newest.head_end, newest.eager_end)
    sections = []
    for p in header.pages:
        stored = data[p.eager.offset : p.eager.end]
        entries, eager = pack.decode_section(stored, p.eager)
        sections.append(
            pack.Section(p.ledger, p.page, entries, list(eager.items()), [], p.since, p.upto, p.ctx)
        )
    src.unlink()
    far = int(time.time() * 1000) + 3_600_000
    await put_pack(bucket, os.urandom(16), 1, [], far)  # another device, an hour later
    await b.engine.round()
    wait()
    await b.engine.round()
    await put_pack(bucket, a.repo.device_id, newest.seq, sections, hidden.time + 1)
    await b.engine.round()


async def test_a_pack_that_lands_behind_the_newest_name_is_listed_within_a_window(
    tmp_path: Path, bucket: FolderStore
) -> None:
    """A reader's cursor follows the newest name it listed a window late: a pack that
    lands below a name an hour ahead (its writer listed before that name went up, or
    its PUT was slow) is listed at once, whatever the clocks (sync.feed: The cursor)."""
    async with device(tmp_path / "a", bucket) as a, device(tmp_path / "b", bucket) as b:
        await _land_behind(tmp_path, bucket, a, b, lambda: None)
        assert set(await _keys(b.repo, "l", "p")) == {b"one", b"two"}
        assert b.engine.status()["gaps"] == []


async def test_a_pack_that_went_up_behind_the_cursor_is_found_through_its_gap(
    tmp_path: Path, bucket: FolderStore
) -> None:
    """A PUT slower than the window: its pack is below the reader's cursor when it
    lands (a window after the newest name). The device's next pack shows the gap, and
    the probe finds it."""
    mono = [0.0]

    def a_window_passes() -> None:
        mono[0] += 1000.0

    async with (
        device(tmp_path / "a", bucket) as a,
        device(tmp_path / "b", bucket, monotonic=lambda: mono[0]) as b,
    ):
        await _land_behind(tmp_path, bucket, a, b, a_window_passes)
        assert set(await _keys(b.repo, "l", "p")) == {b"one"}  # not seen yet: behind
        await _put(a, "p", b"three")
        await a.engine.round()  # feed time above the far pack: seen, and so is the gap
        await b.engine.sync()
        assert set(await _keys(b.repo, "l", "p")) == {b"one", b"two", b"three"}
        assert b.engine.status()["gaps"] == []


async def _put(d, page: str, key: bytes) -> None:
    pg = await d.repo.ledger("l").page(page)
    await pg.put(key, b"v")
    await pg.flush()


# -- 4. compression ---------------------------------------------------------------------


async def test_pieces_are_compressed_when_smaller(tmp_path: Path, bucket: FolderStore) -> None:
    text = b"".join(b"line %06d of a very compressible document\n" % i for i in range(20_000))
    noise = random.Random(4).randbytes(200_000)
    async with device(tmp_path / "a", bucket) as a, device(tmp_path / "b", bucket) as b:
        pa = await a.repo.ledger("l").page("p")
        await pa.put(b"text", text)
        await pa.put(b"lazy text", text[::-1], Priority.LAZY)
        await pa.put(b"noise", noise, Priority.LAZY)
        await a.engine.sync()
        assert a.cloud.bytes_put < len(text) // 3 + len(noise) + 100_000, a.cloud.bytes_put
        await b.engine.sync()
        pb = await b.repo.ledger("l").page("p")
        assert await pb.get(b"text") == text
        assert await pb.get(b"lazy text") == text[::-1]
        assert await pb.get(b"noise") == noise
        # Same digests on both sides: the same commits and root.
        assert pb.head.root == pa.head.root
    packs = _read_packs(tmp_path / "bucket")
    parts = [
        part for _, h, _ in packs for p in h.pages for part in [p.eager, *(x for _, x in p.lazy)]
    ]
    assert any(p.codec == pack.ZSTD for p in parts) and any(p.codec == pack.RAW for p in parts)


def test_a_damaged_compressed_section_is_refused() -> None:
    section = pack.Section(b"l", b"p", [b"c" * 100], [(_digest(b"x" * 5000), b"x" * 5000)])
    data, head_end, eager_end = pack.encode(os.urandom(16), 1, 1, [section])
    header = pack.decode_header(data[:head_end], head_end, eager_end)
    part = header.pages[0].eager
    assert part.codec == pack.ZSTD
    stored = bytearray(data[part.offset : part.end])
    stored[len(stored) // 2] ^= 0xFF
    with pytest.raises(pack.CorruptPackError):
        pack.decode_section(bytes(stored), part)
    # A bomb: a section claiming a small raw size cannot make the reader inflate more.
    bomb = pack.Part(part.offset, part.stored, 10, pack.ZSTD)
    with pytest.raises(pack.CorruptPackError):
        pack.decode_section(data[part.offset : part.end], bomb)


def test_a_section_of_many_tiny_items_is_refused_before_they_are_made() -> None:
    """16 million empty strings fit in 32 MiB and would take several times that as
    objects: no item of a section is under MIN_ITEM bytes, so the count is refused."""
    import tracemalloc

    for commits, pieces in [([b""] * 4_000_000, []), ([], [[b"", b""]] * 2_000_000)]:
        raw = msgpack.packb([commits, pieces], use_bin_type=True)
        part = pack.Part(0, len(raw), len(raw), pack.RAW)
        tracemalloc.start()
        try:
            with pytest.raises(pack.CorruptPackError, match="max_array_len"):
                pack.decode_section(raw, part)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 4 * len(raw), (peak, len(raw))


@pytest.mark.parametrize("pieces", [10, 2000])  # decoded on the loop, and on a thread
async def test_a_section_reads_the_same_on_the_loop_and_off_it(pieces: int) -> None:
    rng = random.Random(8)
    values = [rng.randbytes(200) for _ in range(pieces)]
    section = pack.Section(b"l", b"p", [b"c" * 100], [(_digest(v), v) for v in values])
    data, head_end, eager_end = pack.encode(os.urandom(16), 1, 1, [section])
    part = pack.decode_header(data[:head_end], head_end, eager_end).pages[0].eager
    stored = data[part.offset : part.end]
    assert (part.raw > pack.OFF_LOOP_BYTES) == (pieces == 2000)
    assert await pack.decode_section_async(stored, part) == pack.decode_section(stored, part)
    commits, eager = await pack.decode_section_async(stored, part)
    assert commits == [b"c" * 100] and sorted(eager.values()) == sorted(values)
    with pytest.raises(pack.CorruptPackError):  # an error comes back from the thread too
        await pack.decode_section_async(stored[: len(stored) // 2], part)


def test_entries_and_delta_fields_come_through_a_pack() -> None:
    dot = (5).to_bytes(8, "big") + b"t" * 8
    e = [b"k", dg.value_chunk_digest(b"v"), 0, dot]
    section = pack.Section(b"l", b"p", [e] * 3, since=1, upto=5, ctx={b"t" * 8: 5})
    data, head_end, eager_end = pack.encode(os.urandom(16), 7, 9, [section])
    header = pack.decode_header(data[:head_end], head_end, eager_end)
    assert (header.seq, header.time) == (7, 9)
    p = header.pages[0]
    assert (p.since, p.upto, p.ctx) == (1, 5, {b"t" * 8: 5})
    entries, _ = pack.decode_section(data[head_end:eager_end], p.eager)
    assert entries == [e] * 3


# -- 3. adaptive polling -------------------------------------------------------------------


class _Timed(CountingStore):
    """Counts, and remembers when each LIST was made."""

    def __init__(self, inner: FolderStore) -> None:
        super().__init__(inner)
        self.listed_at: list[float] = []

    async def list(self, prefix: str = "", after: str = "") -> AsyncIterator[str]:
        self.listed_at.append(time.monotonic())
        async for n in super().list(prefix, after):
            yield n


@contextlib.asynccontextmanager
async def _running(path: Path, cloud: _Timed, **kw: float) -> AsyncIterator[SyncEngine]:
    engine = SyncEngine(cloud, **kw)  # type: ignore[arg-type]
    repo = await Repository.open(path, hooks=engine.hooks())
    await engine.start(repo)  # the background loop
    try:
        yield engine
    finally:
        await engine.stop()
        await repo.close()


async def _until(cond: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


async def test_idle_devices_back_off_to_the_longest_interval(
    tmp_path: Path, bucket: FolderStore
) -> None:
    """Six idle devices, times scaled down: sync_interval_max stands for 60 s. Once idle,
    each lists at most once per sync_interval_max: 1 LIST per device-minute (the goal
    allows 3)."""
    most = 0.25
    kw = {"poll_interval": 0.01, "poll_interval_max": most, "active_for": 0.05}
    clouds = [_Timed(bucket) for _ in range(6)]
    async with contextlib.AsyncExitStack() as stack:
        engines = [
            await stack.enter_async_context(_running(tmp_path / f"d{i}", c, **kw))
            for i, c in enumerate(clouds)
        ]
        await _until(lambda: all(e.interval == most for e in engines))
        start = [len(c.listed_at) for c in clouds]
        await _until(
            lambda: all(len(c.listed_at) >= s + 4 for c, s in zip(clouds, start, strict=True))
        )
        for c, s in zip(clouds, start, strict=True):
            times = c.listed_at[s:]
            gaps = [b - a for a, b in itertools.pairwise(times)]
            assert min(gaps) >= 0.9 * most, gaps
        # A local write makes that device poll fast again at once.
        before = len(clouds[0].listed_at)
        async with engines[0].repo.page(b"l", b"p") as pg:
            await pg.put(b"k", b"v")
        await _until(lambda: clouds[0].counts["put"] >= 1 and engines[0].interval < most)
        assert len(clouds[0].listed_at) > before


# -- 5. other layouts -----------------------------------------------------------------------


@pytest.mark.parametrize("version", [1, 2, 3])
async def test_a_bucket_of_an_unreleased_layout_is_refused(
    tmp_path: Path, bucket: FolderStore, version: int
) -> None:
    """Layouts 1-3 (unreleased development versions, whose packs carried commit graphs)
    are not read: a device says so and suggests a new cloud URL, writing nothing."""
    await bucket.put(f"ledgerd-bucket.{version}", b'{"ledgerd_bucket": %d}' % version)
    async with device(tmp_path / "a", bucket) as a:
        await _put(a, "p", b"before")
        with pytest.raises(BucketIdentityError, match="new cloud URL"):
            await a.engine.sync()
    assert sorted(p.name for p in (tmp_path / "bucket").iterdir()) == [f"ledgerd-bucket.{version}"]


def test_a_newer_layout_is_refused() -> None:
    with pytest.raises(BucketIdentityError, match="upgrade ledgerd"):
        layout.check_version(layout.BUCKET_FORMAT + 1)


# -- small changes move little ------------------------------------------------------------


async def test_a_one_key_change_in_a_large_page_moves_little(
    tmp_path: Path, bucket: FolderStore
) -> None:
    """A delta carries the keys a device wrote: a one-key change in a 100,000-entry
    page moves a few hundred bytes up and down."""
    rng = random.Random(4)
    async with device(tmp_path / "a", bucket) as a, device(tmp_path / "b", bucket) as b:
        pa = await a.repo.ledger("l").page("p")
        for i in range(0, 100_000, 10_000):
            await pa.write([(b"e%08d" % j, rng.randbytes(100)) for j in range(i, i + 10_000)])
        await a.engine.sync()
        await b.engine.sync()
        a.cloud.reset()
        b.cloud.reset()
        await pa.put(b"e%08d" % 50_000, b"changed" * 10)
        await a.engine.sync()
        assert a.cloud.counts["put"] == 1
        assert a.cloud.bytes_put <= 8 * 1024, a.cloud.bytes_put
        await b.engine.sync()
        assert b.cloud.bytes_got <= 8 * 1024, b.cloud.bytes_got
        pb = await b.repo.ledger("l").page("p")
        assert await pb.get(b"e%08d" % 50_000) == b"changed" * 10
        assert pb.head.root == pa.head.root
