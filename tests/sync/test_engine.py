"""Page sync between devices in one process: protocol, request budget, lazy values, faults."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ledgerd.store import HISTORY_RETENTION, ObjectNotFoundError, Priority, Repository
from ledgerd.store.pieces import digest as dg
from ledgerd.sync import crypto, pack
from ledgerd.sync.cloud import CloudStore, Retrying
from ledgerd.sync.crypto import KeyRing
from ledgerd.sync.engine import SyncEngine
from ledgerd.sync.folder import FolderStore
from ledgerd.sync.layout import PackName
from ledgerd.sync.testing import CountingStore
from tests.sync.doubles import FaultyStore, put_pack


@dataclass
class Device:
    repo: Repository
    engine: SyncEngine
    cloud: CountingStore


ENCRYPTION: dict[str, KeyRing | None] = {"keys": None}
"""The keys :func:`device` gives its engine unless told otherwise: the ``encryption``
fixture runs a test module's tests on a plain and on an encrypted bucket."""
_DEFAULT: Any = object()


@pytest.fixture(params=["plain", "encrypted"])
def encryption(request: pytest.FixtureRequest) -> Iterator[KeyRing | None]:
    """Every device of the test encrypts (with one key) or none does."""
    keys = None
    if request.param == "encrypted":
        keys = crypto.parse_key_file(crypto.key_line(crypto.new_key()), "test keys")
    ENCRYPTION["keys"] = keys
    try:
        yield keys
    finally:
        ENCRYPTION["keys"] = None


@contextlib.asynccontextmanager
async def device(
    path: Path,
    cloud: CloudStore,
    keys: KeyRing | None = _DEFAULT,
    max_open_pages: int = 1024,
    history_retention: float = HISTORY_RETENTION,
    compaction_settle: float = 0.0,
    **kw: Any,
) -> AsyncIterator[Device]:
    """A repository syncing through ``cloud`` (requests counted); ``kw`` for the engine;
    ``keys`` (by default those of the ``encryption`` fixture, if used) to encrypt.
    Compaction takes a checkpoint as covering at once (``compaction_settle``): these
    tests drive it step by step on a simulated wall clock; the settling has tests of
    its own (``tests/sync/test_compaction_settle.py``) and the simulation runs with it."""
    counting = CountingStore(cloud)
    keys = ENCRYPTION["keys"] if keys is _DEFAULT else keys
    engine = SyncEngine(counting, keys=keys, compaction_settle=compaction_settle, **kw)
    repo = await Repository.open(
        path,
        hooks=engine.hooks(),
        max_open_pages=max_open_pages,
        history_retention=history_retention,
    )
    await engine.start(repo, background=False)
    try:
        yield Device(repo, engine, counting)
    finally:
        await repo.close()


async def _keys(repo: Repository, ledger: str = "l", page: str = "p") -> dict[bytes, bytes]:
    pg = await repo.ledger(ledger).page(page)
    res = await pg.entries()
    return {kv.key: kv.value for kv in res.items}


async def test_writes_on_one_device_appear_on_another(
    tmp_path: Path, bucket: FolderStore, encryption: KeyRing | None
) -> None:
    async with device(tmp_path / "a", bucket) as a, device(tmp_path / "b", bucket) as b:
        pa = await a.repo.ledger("l").page("p")
        await pa.put(b"k", b"from a")
        await pa.put(b"big", random.Random(1).randbytes(300_000))
        await a.engine.sync()
        await b.engine.sync()
        got = await _keys(b.repo)
        assert got[b"k"] == b"from a" and len(got[b"big"]) == 300_000
        pb = await b.repo.ledger("l").page("p")
        assert pb.head.root == pa.head.root  # the same state
        # Disjoint concurrent writes both survive; the same key converges.
        await pa.put(b"only-a", b"1")
        await pb.put(b"only-b", b"2")
        await pa.put(b"same", b"a")
        await pb.put(b"same", b"b")
        for _ in range(2):
            await a.engine.sync()
            await b.engine.sync()
        ka, kb = await _keys(a.repo), await _keys(b.repo)
        assert ka == kb and ka[b"only-a"] == b"1" and ka[b"only-b"] == b"2"
        assert ka[b"same"] in (b"a", b"b")
        assert pa.head.root == pb.head.root and len(await pa.heads()) == len(await pb.heads()) == 1


async def test_upload_round_budget_and_idle_poll(tmp_path: Path, bucket: FolderStore) -> None:
    async with device(tmp_path / "a", bucket) as a, device(tmp_path / "b", bucket) as b:
        pa = await a.repo.ledger("l").page("p")
        await pa.write([(b"k%05d" % i, b"v" * 100) for i in range(10_000)])
        await pa.flush()
        a.cloud.reset()
        stats = await a.engine.round()
        # One pack (+ the bucket's marker and the device, once).
        assert a.cloud.counts["put"] <= 3, a.cloud.counts
        assert stats.uploaded_packs == 1
        await b.engine.sync()
        assert len(await _keys(b.repo)) == 10_000
        b.cloud.reset()
        await b.engine.round()  # an idle background poll
        assert b.cloud.counts["get"] == 0
        assert b.cloud.counts["list"] <= 1, b.cloud.counts  # one remote device, one ledger
        assert b.cloud.counts["put"] == 0


async def test_lazy_values_are_fetched_on_first_read(
    tmp_path: Path, bucket: FolderStore, encryption: KeyRing | None
) -> None:
    async with device(tmp_path / "a", bucket) as a, device(tmp_path / "b", bucket) as b:
        pa = await a.repo.ledger("l").page("p")
        photo = random.Random(2).randbytes(200_000)
        await pa.put(b"photo", photo, Priority.LAZY)
        await pa.put(b"eager", b"e" * 100)
        await a.engine.sync()
        b.cloud.reset()
        await b.engine.sync()
        gets_for_import = b.cloud.counts["get"]
        # One ranged GET: commits and EAGER pieces only; and, a first contact with the
        # bucket, one of its marker (plain) or its encryption descriptor.
        assert gets_for_import == 2
        pb = await b.repo.ledger("l").page("p")
        assert b.cloud.bytes_got < 100_000  # the photo did not travel
        assert await pb.get(b"photo") == photo  # fetched now, ranged GETs of its pieces
        assert b.cloud.counts["get"] > gets_for_import
        n = b.cloud.counts["get"]
        assert await pb.get(b"photo") == photo
        assert b.cloud.counts["get"] == n  # stored after the first read


async def test_lazy_value_offline_is_a_clear_error(
    tmp_path: Path, bucket: FolderStore, encryption: KeyRing | None
) -> None:
    async with device(tmp_path / "a", bucket) as a:
        pa = await a.repo.ledger("l").page("p")
        await pa.put(b"photo", b"p" * 100_000, Priority.LAZY)
        await a.engine.sync()
    offline = FaultyStore(bucket, rate=0.0)
    async with device(tmp_path / "b", offline) as b:
        await b.engine.sync()
        offline.rate = 1.0  # the network goes away
        pb = await b.repo.ledger("l").page("p")
        with pytest.raises(ObjectNotFoundError, match="needs fetch"):
            await pb.get(b"photo")


async def test_bit_flip_in_a_pack_is_refused(
    tmp_path: Path, bucket: FolderStore, encryption: KeyRing | None
) -> None:
    async with device(tmp_path / "a", bucket) as a:
        pa = await a.repo.ledger("l").page("p")
        await pa.put(b"k", b"v" * 500)
        await a.engine.sync()
    packs = sorted((tmp_path / "bucket" / "packs").iterdir())
    data = bytearray(packs[0].read_bytes())
    data[-5] ^= 0x01  # in the page's section (the pack's last part)
    packs[0].chmod(0o644)
    packs[0].write_bytes(bytes(data))
    async with device(tmp_path / "b", bucket) as b:
        await b.engine.round()
        pb = await b.repo.ledger("l").page("p")
        assert not await pb.contains(b"k")
        status = await b.engine.page_status(pb)
        assert status["last_error"] and "refused" in status["last_error"]


async def test_restart_neither_redownloads_nor_skips(
    tmp_path: Path, bucket: FolderStore, encryption: KeyRing | None
) -> None:
    async with device(tmp_path / "a", bucket) as a:
        pa = await a.repo.ledger("l").page("p")
        await pa.put(b"one", b"1")
        await a.engine.sync()
        async with device(tmp_path / "b", bucket) as b:
            await b.engine.sync()
        await pa.put(b"two", b"2")
        await a.engine.sync()
    async with device(tmp_path / "b", bucket) as b:
        await b.engine.sync()
        # Only the new pack (and the encryption descriptor, read when sync starts).
        assert b.cloud.counts["get"] == 1 + (encryption is not None)
        assert set(await _keys(b.repo)) == {b"one", b"two"}


async def test_new_device_bootstraps_and_faults_converge(
    tmp_path: Path, bucket: FolderStore, encryption: KeyRing | None
) -> None:
    flaky = Retrying(FaultyStore(bucket, rate=0.3, seed=7), deadline=60, first=0.001, most=0.01)
    async with device(tmp_path / "a", flaky) as a, device(tmp_path / "b", flaky) as b:
        for i in range(20):
            pa = await a.repo.ledger("l").page(f"p{i % 3}")
            pb = await b.repo.ledger("l").page(f"p{i % 3}")
            await pa.put(b"a%d" % i, b"x")
            await pb.put(b"b%d" % i, b"y")
            if i % 5 == 0:
                await a.engine.sync()
                await b.engine.sync()
        for _ in range(3):
            await a.engine.sync()
            await b.engine.sync()
        async with device(tmp_path / "c", flaky) as c:
            await c.engine.sync()
            for p in ("p0", "p1", "p2"):
                ka, kb, kc = [await _keys(x.repo, "l", p) for x in (a, b, c)]
                assert ka == kb == kc and len(ka) == 2 * len(
                    [i for i in range(20) if i % 3 == int(p[1])]
                )
        # Nothing duplicated: no device uploaded one write of a key twice (a pack whose
        # PUT failed goes up again under its own name, or not at all).
        codec = a.engine.codec
        seen: dict[str, list[tuple[bytes, bytes]]] = {}
        for f in sorted((tmp_path / "bucket" / "packs").iterdir()):
            pn = PackName.parse(f"packs/{f.name}")
            assert pn is not None
            data = f.read_bytes()
            seal = (codec, pn.ident) if codec is not None else None
            header = pack.decode_header(data[: pn.head_end], pn.head_end, pn.eager_end, seal)
            for pi in header.pages:
                stored = data[pi.eager.offset : pi.eager.end]
                entries, _ = pack.decode_section(stored, pi.eager, codec)
                seen.setdefault(pn.device, []).extend((e[0], e[3]) for e in entries)
    for dev, writes in seen.items():
        assert len(writes) == len(set(writes)), f"{dev} uploaded a write twice"


async def test_a_bad_device_does_not_block_the_others(tmp_path: Path, bucket: FolderStore) -> None:
    await put_pack(bucket, bytes(16), 1, [pack.Section(b"l", b"junk", [], [(b"", b"x")])])
    async with device(tmp_path / "a", bucket) as a, device(tmp_path / "b", bucket) as b:
        pa = await a.repo.ledger("l").page("p")
        await pa.put(b"k", b"v")
        await a.engine.sync()
        await b.engine.sync()  # refuses the bad pack, still downloads from a
        assert (await _keys(b.repo)) == {b"k": b"v"}
        junk = await b.repo.ledger("l").page("junk")
        assert "unreadable" in ((await b.engine.page_status(junk))["last_error"] or "")


async def test_an_entry_no_ledgerd_makes_is_refused(tmp_path: Path, bucket: FolderStore) -> None:
    async with device(tmp_path / "a", bucket) as a, device(tmp_path / "b", bucket) as b:
        pa = await a.repo.ledger("l").page("p")
        await pa.put(b"k", b"v")
        await a.engine.sync()
        liar = [[b"k", dg.value_chunk_digest(b"v"), 0, b"short dot"]]
        section = pack.Section(b"l", b"p", liar, since=-1, upto=0)
        await put_pack(bucket, a.repo.device_id, 50, [section], int(time.time() * 1000))
        await b.engine.sync()
        pb = await b.repo.ledger("l").page("p")
        assert await pb.get(b"k") == b"v"
        assert "dot" in ((await b.engine.page_status(pb))["last_error"] or "")


async def test_pieces_shared_with_an_eager_value_travel_eager(
    tmp_path: Path, bucket: FolderStore
) -> None:
    blob = random.Random(3).randbytes(200_000)
    async with device(tmp_path / "a", bucket) as a:
        pa = await a.repo.ledger("l").page("p")
        await pa.put(b"attachment", blob, Priority.LAZY)
        await pa.put(b"copy", blob)  # EAGER, same pieces
        await a.engine.sync()
    offline = FaultyStore(bucket, rate=0.0)
    async with device(tmp_path / "b", offline) as b:
        await b.engine.sync()
        offline.rate = 1.0
        pb = await b.repo.ledger("l").page("p")
        assert await pb.get(b"copy") == blob  # available offline


async def test_sync_leaves_open_only_the_pages_that_were_open(
    tmp_path: Path, bucket: FolderStore
) -> None:
    async with device(tmp_path / "a", bucket) as a:
        for name in ("p1", "p2", "p3"):
            page = await a.repo.ledger("l").page(name)
            await page.put(b"k", name.encode())
            await page.flush()  # committed: nothing left under way in it
        assert await a.repo.close_idle(0) == 3
        kept = await a.repo.ledger("l").page("p1")  # in use by the application
        with kept.lease():
            await a.engine.sync()  # the first round visits and uploads every page
            assert [p.id for p in a.repo.open_pages()] == [b"p1"]
    async with device(tmp_path / "b", bucket) as b:
        await b.engine.sync()  # pages it downloads into are closed again too
        assert b.repo.open_pages() == []
        for name in ("p1", "p2", "p3"):
            assert (await _keys(b.repo, "l", name))[b"k"] == name.encode()


async def test_sync_survives_pages_closing_under_it(
    tmp_path: Path, bucket: FolderStore, encryption: KeyRing | None
) -> None:
    async with device(tmp_path / "a", bucket) as a, device(tmp_path / "b", bucket) as b:
        await (await a.repo.ledger("l").page("p")).put(b"k", b"from a")
        await a.engine.sync()
        stop = asyncio.Event()

        async def closer() -> None:  # the daemon's idle closer, at its most eager
            while not stop.is_set():
                await b.repo.close_idle(0)
                await asyncio.sleep(0)

        task = asyncio.create_task(closer())
        try:
            await b.engine.sync()
        finally:
            stop.set()
            await task
        await b.engine.sync()  # a pack put off by a closing page comes next round
        assert await _keys(b.repo) == {b"k": b"from a"}


@pytest.mark.parametrize("first", ["sync", "application"])
async def test_sync_leaves_open_a_page_the_application_opened(
    tmp_path: Path, bucket: FolderStore, first: str
) -> None:
    async with device(tmp_path / "a", bucket) as a:
        page = await a.repo.ledger("l").page("p")
        await page.put(b"k", b"v")
        await page.close()
        if first == "sync":
            sync = asyncio.create_task(a.engine.sync())
            while not a.repo.is_open(b"l", b"p"):  # the sync step has opened it
                await asyncio.sleep(0)
            mine = await a.repo.ledger("l").page("p")  # and so does the application
            await sync
        else:
            opening = asyncio.create_task(a.repo.ledger("l").page("p"))
            await asyncio.sleep(0)  # the application holds the page's opening lock
            await a.engine.sync(b"l", b"p")  # when a sync step comes for the same page
            mine = await opening
        await mine.put(b"k2", b"still open")
        assert not mine.closed


async def test_a_round_with_every_open_page_busy_waits_for_room_and_imports_every_page(
    tmp_path: Path, bucket: FolderStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With max_open_pages=4 and every slot held by the application (requests, sessions,
    # watchers), each import's open failed at once with TooManyOpenPagesError: the
    # round ended with every page held back ("sync incomplete: TooManyOpenPagesError"
    # over HTTP), and the next rounds too while the slots stayed busy. Now a sync step
    # waits (bounded) for a page to be released, and closes what it opened after it:
    # one sync imports every page within the bound.
    async with device(tmp_path / "a", bucket) as a:
        for i in range(10):
            async with a.repo.page(b"l", b"p%d" % i) as page:
                await page.put(b"k", b"v%d" % i)
        await a.engine.sync()
    async with device(tmp_path / "b", bucket, max_open_pages=4) as b:
        for i in (0, 1):  # pending here too: the upload leases them, the imports merge
            async with b.repo.page(b"l", b"p%d" % i) as page:
                await page.put(b"mine", b"b")
        waiting = asyncio.Event()
        look = getattr(b.repo, "_room_freed", None)  # (an open waiting for room)

        async def noted(timeout: float) -> None:
            waiting.set()
            assert look is not None
            await look(timeout)

        monkeypatch.setattr(b.repo, "_room_freed", noted, raising=False)
        peak, opened = 0, b.repo._open_new

        async def note_peak(ledger: bytes, page_id: bytes) -> Any:
            nonlocal peak
            page = await opened(ledger, page_id)
            peak = max(peak, len(b.repo.open_pages()))
            return page

        monkeypatch.setattr(b.repo, "_open_new", note_peak)
        with contextlib.ExitStack() as held:
            for i in range(4):  # the application holds every slot
                page = await b.repo.ledger("u").page(f"q{i}")
                held.enter_context(page.lease())
            syncing = asyncio.create_task(b.engine.round(full=True))
            waited = asyncio.create_task(waiting.wait())
            await asyncio.wait([syncing, waited], return_when=asyncio.FIRST_COMPLETED)
            waited.cancel()
            # It waits for room rather than fail (before: the round ended, every
            # import held back with "not imported now: TooManyOpenPagesError").
            assert not syncing.done(), (syncing.result(), b.engine.problems())
        stats = await syncing  # one round, released pages given to it
        assert stats.downloaded_packs >= 1
        assert b.engine.problems() == [], b.engine.problems()
        for i in range(10):
            got = await _keys(b.repo, "l", f"p{i}")
            assert got[b"k"] == b"v%d" % i and got.get(b"mine", b"b") == b"b"
        assert 0 < peak <= 4, peak


async def test_health_names_uploads_waiting_as_the_reason_for_not_synced(
    tmp_path: Path, bucket: FolderStore
) -> None:
    """Every reason for healthy or synced being false is in reasons: writes waiting for
    upload make a healthy device not synced, and say so."""
    async with device(tmp_path / "a", bucket) as a:
        page = await a.repo.ledger("l").page("p")
        await page.put(b"k", b"v")
        await a.engine.sync()
        assert a.engine.health()["synced"] and a.engine.health()["reasons"] == []
        await page.put(b"k", b"w")
        await page.flush()
        h = a.engine.health()
        assert h["healthy"] and not h["synced"], h
        assert h["reasons"] == ["1 page waiting for upload"], h
        await a.engine.sync()
        assert a.engine.health()["synced"] and a.engine.health()["reasons"] == []


async def test_an_idle_device_between_its_polls_is_healthy(
    tmp_path: Path, bucket: FolderStore
) -> None:
    """An idle device polls every ``poll_interval_max``: waiting that long (or longer,
    by the round's own time) for its next round is no sign of trouble; twice that is."""
    async with device(tmp_path / "a", bucket, poll_interval_max=300.0) as a:
        await a.engine.sync()
        assert a.engine.health()["healthy"]
        a.engine.board.last_round_ok = time.time() - 301  # just past one idle interval
        h = a.engine.health()
        assert h["healthy"] and h["reasons"] == [], h
        a.engine.board.last_round_ok = time.time() - 601
        h = a.engine.health()
        assert not h["healthy"] and h["reasons"][0].startswith("no sync round has finished for")
