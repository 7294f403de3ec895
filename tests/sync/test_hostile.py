"""What a buggy or malicious device (or a damaged bucket) uploads is refused through the
real sync path: no crash, no hang, no page left half-imported or corrupt, nothing of it
uploaded again, and other pages and later packs go on."""

from __future__ import annotations

import contextlib
import os
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from pathlib import Path

import msgpack
import pytest
import zstandard

from ledgerd.store import Priority, Repository
from ledgerd.store.errors import StoreError
from ledgerd.store.pieces import digest as dg
from ledgerd.sync import layout, pack
from ledgerd.sync.folder import FolderStore
from ledgerd.sync.layout import PackName
from tests.sync.doubles import mark_plain, put_pack
from tests.sync.test_engine import Device, _keys, device

_DELTA = {"since": -1, "upto": -1, "ctx": {}}
"""A page entry's delta fields in a hand-made pack header."""


def _now_ms() -> int:
    return int(time.time() * 1000)


async def _uploaded(tmp_path: Path, d: Device) -> tuple[set[bytes], set[bytes]]:
    """Keys and piece digests in every pack ``d`` put in the bucket (plain)."""
    keys: set[bytes] = set()
    digests: set[bytes] = set()
    for p in (tmp_path / "bucket" / "packs").iterdir():
        pn = PackName.parse(f"{layout.PACKS}{p.name}")
        if pn is None or pn.device != d.repo.device_id.hex():
            continue
        data = p.read_bytes()
        for s in pack.decode_all(data, pn.head_end, pn.eager_end):
            keys.update(e[0] for e in s.entries)
            digests.update(x for x, _ in [*s.eager, *s.lazy])
    return keys, digests


async def test_a_delta_no_ledgerd_makes_is_refused_and_goes_no_further(
    tmp_path: Path, bucket: FolderStore
) -> None:
    """Another device uploads a delta whose keys are out of order (a tree built from it
    would hide one from lookups). b refuses the pack, reports it, keeps a's page as it
    was, takes a's later pack, and uploads nothing of the bad delta."""
    async with device(tmp_path / "a", bucket) as a:
        pa = await a.repo.ledger("l").page("p")
        await pa.write([(b"k%d" % i, b"v%d" % i) for i in range(20)])
        await a.engine.sync()
        dot = (int(time.time() * 1e6)).to_bytes(8, "big") + bytes(8)
        value = dg.value_chunk_digest(b"injected")
        bad = [[b"z", value, 0, dot], [b"a", value, 0, dot]]
        section = pack.Section(b"l", b"p", bad, since=-1, upto=dg.INLINE_LIMIT)
        name = await put_pack(bucket, os.urandom(16), 1, [section], _now_ms())
        await pa.put(b"later", b"still comes")
        await a.engine.sync()
        async with device(tmp_path / "b", bucket, retry_first=3600) as b:
            await b.engine.sync()
            pb = await b.repo.ledger("l").page("p")
            assert pb.head.root == pa.head.root  # a's later pack came in; the bad one did not
            got = await _keys(b.repo)
            assert len(got) == 21 and got[b"later"] == b"still comes" and b"z" not in got
            packs = b.engine.status()["packs"]
            assert [(p["pack"], p["state"]) for p in packs] == [(name, "refused")]
            assert "CorruptObjectError" in packs[0]["error"]
            assert "order" in packs[0]["error"]
            await pb.put(b"mine", b"b's own")
            await b.engine.sync()
            keys, _ = await _uploaded(tmp_path, b)
            assert keys == {b"mine"}


def _bomb(inflated: int, claims: bool = True) -> bytes:
    """A zstd frame of ``inflated`` zero bytes, ~32 KiB a GiB; ``claims``: it says its
    size in its header."""
    obj = zstandard.ZstdCompressor(level=1).compressobj(size=inflated if claims else -1)
    step = bytes(1 << 20)
    parts = [obj.compress(step) for _ in range(inflated >> 20)]
    return b"".join([*parts, obj.flush()])


async def _put_raw_pack(
    bucket: FolderStore, device: bytes, pages: list[list[object]], body: bytes
) -> str:
    """A format-2 pack with the index ``pages`` as given (lengths unchecked) and ``body``."""
    now = _now_ms()  # once: the name must carry the header's time
    header = msgpack.packb(
        {"device": device, "seq": 1, "time": now, "pages": pages}, use_bin_type=True
    )
    head_end = len(pack.MAGIC3) + 4 + len(header)
    data = pack.MAGIC3 + len(header).to_bytes(4, "big") + header + body
    name = PackName.make(now, device.hex(), 1, head_end, len(data)).name
    await mark_plain(bucket)
    await bucket.put(name, data)
    return name


async def _refused_cheaply(
    tmp_path: Path,
    bucket: FolderStore,
    name: str,
    error: str,
    most: int = 32 << 20,
    page: str = "p",
    then: Callable[[Device], Awaitable[None]] | None = None,
) -> None:
    """a puts page ``page``; b syncs (and does ``then``) holding at most ``most`` bytes
    more, refuses pack ``name`` (its error saying ``error``) and still takes a's page."""
    async with device(tmp_path / "a", bucket) as a:
        pa = await a.repo.ledger("l").page(page)
        await pa.put(b"k", b"v")
        await pa.flush()
        await a.engine.sync()
        async with device(tmp_path / "b", bucket, retry_first=3600) as b:
            tracemalloc.start()
            try:
                await b.engine.sync()
                if then is not None:
                    await then(b)
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
            assert peak < most, peak
            assert await _keys(b.repo, page=page) == {b"k": b"v"}
            packs = b.engine.status()["packs"]
            assert [(p["pack"], p["state"]) for p in packs] == [(name, "refused")]
            assert error in packs[0]["error"]


@pytest.mark.parametrize(
    ("declared", "claims"), [(8 << 30, True), (8 << 20, True), (8 << 20, False)]
)
async def test_a_decompression_bomb_is_refused_without_inflating_it(
    tmp_path: Path, bucket: FolderStore, declared: int, claims: bool
) -> None:
    """A 32 KiB section that inflates to 1 GiB: declared past MAX_SECTION, or
    declared small (it is cut where it passes its declared size). b refuses it holding
    at most a few MiB more, and still takes a's page."""
    bomb = _bomb(1 << 30, claims)
    name = await _put_raw_pack(
        bucket,
        os.urandom(16),
        [[b"l", b"p", [0, len(bomb), declared, pack.ZSTD], [], _DELTA]],
        bomb,
    )
    await _refused_cheaply(tmp_path, bucket, name, "bytes")


@pytest.mark.parametrize("kind", ["dot_past_the_limit", "dot_twice", "since_after_upto", "tag"])
async def test_a_delta_inconsistent_with_itself_is_refused(
    tmp_path: Path, bucket: FolderStore, kind: str
) -> None:
    """Deltas no ledgerd makes: a dot at a time SQLite cannot hold (past the year 2255),
    one key holding a dot twice, a range of the writer's clock that ends before it
    begins, a context naming a malformed writer. Each is refused as corrupt; the page
    keeps a's state."""
    async with device(tmp_path / "a", bucket) as a:
        pa = await a.repo.ledger("l").page("p")
        await pa.put(b"k", b"v")
        await a.engine.sync()
        now = int(time.time() * 1e6)
        dot = now.to_bytes(8, "big") + bytes(8)
        value = dg.value_chunk_digest(b"injected")
        entries: list[object] = [[b"x", value, 0, dot]]
        since, upto = -1, now
        ctx: dict[bytes, int] = {}
        if kind == "dot_past_the_limit":
            entries = [[b"x", value, 0, b"\xff" * 16]]
        elif kind == "dot_twice":
            entries = [[b"x", value, 0, dot, [[value, 0, dot]]]]
        section = pack.Section(b"l", b"p", entries, since=since, upto=upto, ctx=ctx)
        if kind == "since_after_upto":
            section.since, section.upto = now, now - 1
        elif kind == "tag":
            section.ctx = {b"short": 1}
        name = await put_pack(bucket, os.urandom(16), 1, [section], _now_ms())
        async with device(tmp_path / "b", bucket, retry_first=3600) as b:
            await b.engine.sync()
            assert await _keys(b.repo) == {b"k": b"v"}
            packs = b.engine.status()["packs"]
            assert [(p["pack"], p["state"]) for p in packs] == [(name, "refused")]
            assert "Corrupt" in packs[0]["error"]


async def test_a_name_promising_a_huge_header_is_refused_before_it_is_read(
    tmp_path: Path, bucket: FolderStore
) -> None:
    """A pack named with its header ending 100 MiB in, over an object that long (a
    sparse file here): b refuses it without reading it (a few MiB at most), and still
    takes a's page. Before, the header was fetched and held whole, however long."""
    size = 100 << 20
    assert size > pack.MAX_HEAD_END
    name = PackName.make(_now_ms(), os.urandom(16).hex(), 1, size, size).name
    await mark_plain(bucket)
    await bucket.put(name, pack.MAGIC3)
    with open(tmp_path / "bucket" / name, "r+b") as f:
        f.truncate(size)
    await _refused_cheaply(tmp_path, bucket, name, "header would end")


@pytest.mark.parametrize("field", ["time", "seq"])
async def test_a_name_at_the_end_of_its_digits_does_not_stop_anyone_syncing(
    tmp_path: Path, bucket: FolderStore, field: str
) -> None:
    """An object named with the largest feed time (any device) or the largest sequence
    of a's own device. Feed times and sequences follow the largest listed, so a's
    next packs took a 14-digit time or a 17-digit sequence: names no ledgerd reads,
    ignored by every device (and by a) for good. Now a listed name raises them only
    up to a ceiling far below the end of their digits; b gets both of a's rounds."""
    async with device(tmp_path / "a", bucket) as a:
        pa = await a.repo.ledger("l").page("p")
        await pa.put(b"k0", b"v0")
        await pa.flush()
        await a.engine.sync()  # a has listed the bucket and has a sequence
        own = a.repo.device_id.hex()
        if field == "time":
            name = PackName.make(10**13 - 1, os.urandom(16).hex(), 1, 12, 12).name
        else:
            name = PackName.make(_now_ms(), own, 10**16 - 1, 12, 12).name
        await bucket.put(name, b"x" * 12)
        for i in (1, 2):
            await pa.put(b"k%d" % i, b"v%d" % i)
            await pa.flush()
            await a.engine.sync()
        listed = [
            PackName.parse(f"{layout.PACKS}{p.name}") for p in (bucket.root / "packs").iterdir()
        ]
        mine = [pn for pn in listed if pn is not None and pn.device == own and pn.name != name]
        assert len(mine) == 3  # none of them unreadable
        async with device(tmp_path / "b", bucket, retry_first=3600) as b:
            await b.engine.sync()
            assert await _keys(b.repo) == {b"k0": b"v0", b"k1": b"v1", b"k2": b"v2"}
            packs = b.engine.status()["packs"]
            assert [(p["pack"], p["state"]) for p in packs] == [(name, "refused")]


@pytest.mark.parametrize("item", [b"\x90", b"\x80", b"\x81\xa0\xc0"])
async def test_a_header_of_tiny_containers_is_refused_before_it_costs_more_than_a_real_one(
    tmp_path: Path, bucket: FolderStore, item: bytes
) -> None:
    """A 2 MiB header whose page list holds a million empty arrays or maps (one to
    three bytes each, 56 to 184 bytes each in memory): it was parsed whole before
    anything was checked, about 70 times its size (4.5 GiB for a 64 MiB header,
    which costs a few KiB compressed and sealed). A real header's containers take
    more than four bytes each, so b refuses one with more, holding at most about
    what a real header of that size costs (about 18 times it), and takes a's page."""
    device_id, now = os.urandom(16), _now_ms()
    n = (2 << 20) // len(item)
    head = msgpack.packb({"device": device_id, "seq": 1, "time": now}, use_bin_type=True)
    header = bytes([head[0] + 1]) + head[1:] + msgpack.packb("pages")
    header += b"\xdd" + n.to_bytes(4, "big") + item * n
    size = len(header)
    head_end = len(pack.MAGIC3) + 4 + size
    name = PackName.make(now, device_id.hex(), 1, head_end, head_end).name
    await mark_plain(bucket)
    await bucket.put(name, pack.MAGIC3 + size.to_bytes(4, "big") + header)
    await _refused_cheaply(tmp_path, bucket, name, "containers", most=24 * size)


async def test_a_lazy_piece_declared_huge_is_refused_before_anyone_fetches_it(
    tmp_path: Path, bucket: FolderStore
) -> None:
    """h's pack of a LAZY value, its first LAZY piece rewritten to lie 100 MiB long
    over an object that long (a sparse file): b imported it, recording that location,
    and reading the value fetched all 100 MiB into memory before the digest check
    failed (a real piece is at most 64 KiB: a value is split). b now refuses the pack
    (holding a few MiB at most), and takes a's page."""
    async with device(tmp_path / "h", bucket) as h:
        ph = await h.repo.ledger("l").page("p")
        await ph.put(b"photo", os.urandom(200_000), Priority.LAZY)
        await h.engine.sync()
    (path,) = (bucket.root / "packs").iterdir()
    pn = PackName.parse(f"{layout.PACKS}{path.name}")
    assert pn is not None
    data = path.read_bytes()
    path.unlink()
    header = msgpack.unpackb(data[pack.PREFIX : pn.head_end], raw=False)
    lazy = header["pages"][0][3]
    assert lazy and lazy[0][4] == pack.RAW  # random bytes stay raw
    big = 100 << 20
    lazy[0][2] = lazy[0][3] = big
    head = msgpack.packb(header, use_bin_type=True)
    body = data[pn.head_end :]
    head_end = pack.PREFIX + len(head)
    name = PackName.make(
        pn.time, pn.device, pn.seq, head_end, head_end + pn.eager_end - pn.head_end
    ).name
    await bucket.put(name, pack.MAGIC3 + len(head).to_bytes(4, "big") + head + body)
    with open(bucket.root / name, "r+b") as f:
        f.truncate(head_end + lazy[0][1] + big)

    async def read_the_photo(b: Device) -> None:
        pb = await b.repo.ledger("l").page("p")
        with contextlib.suppress(StoreError):
            await pb.get(b"photo")

    await _refused_cheaply(tmp_path, bucket, name, "LAZY piece", page="q", then=read_the_photo)


async def test_a_device_whose_saved_clocks_passed_the_ceilings_syncs_again(
    tmp_path: Path, bucket: FolderStore
) -> None:
    """A device hit by such a name before listed names were held below the ceilings
    saved a feed time and a sequence at the end of their digits: its next names would
    not fit (PackName.make refuses them). Loaded, they are held to the ceilings, so
    it uploads readable packs again and b gets them."""
    async with device(tmp_path / "a", bucket) as a:
        pa = await a.repo.ledger("l").page("p")
        await pa.put(b"k0", b"v0")
        await pa.flush()
        await a.engine.sync()
    async with await Repository.open(tmp_path / "a") as repo:  # as that version left them
        await repo.set_meta("sync/feed", str(10**13 - 1).encode())
        await repo.set_meta("sync/seq_time", str(10**13 - 1).encode())
        await repo.set_meta("sync/seq", str(10**16 - 1).encode())
    async with device(tmp_path / "a", bucket) as a:
        pa = await a.repo.ledger("l").page("p")
        await pa.put(b"k1", b"v1")
        await pa.flush()
        await a.engine.sync()
        own = a.repo.device_id.hex()
    listed = [PackName.parse(f"{layout.PACKS}{p.name}") for p in (bucket.root / "packs").iterdir()]
    assert len([pn for pn in listed if pn is not None and pn.device == own]) == 2
    async with device(tmp_path / "b", bucket) as b:
        await b.engine.sync()
        assert await _keys(b.repo) == {b"k0": b"v0", b"k1": b"v1"}
