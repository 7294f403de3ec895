"""What goes wrong in a bucket or on a device stays local to it (issue 13 regressions)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import sqlite3
import time
import tracemalloc
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ledgerd.store import ObjectNotFoundError, Page, Priority, Repository
from ledgerd.store.page import exchange as ex
from ledgerd.store.pieces import digest as dg
from ledgerd.store.tree import commit
from ledgerd.sync import engine, pack
from ledgerd.sync.cloud import Retrying
from ledgerd.sync.crypto import KeyRing
from ledgerd.sync.errors import BucketIdentityError, SyncTimeoutError, TransientCloudError
from ledgerd.sync.folder import FolderStore
from tests.sync.doubles import FaultyStore, put_pack
from tests.sync.test_compaction import Clock
from tests.sync.test_engine import ENCRYPTION, Device, _keys, device
from tests.sync.test_engine import encryption as encryption  # the fixture


@pytest.fixture(autouse=True)
def _plain_and_encrypted(encryption: KeyRing | None) -> None:
    """Every fault test runs on a plain and on an encrypted bucket (``encryption``)."""


PLAIN_ONLY = pytest.mark.parametrize("encryption", ["plain"], indirect=True)
"""For the tests that write plain packs into the bucket, or read its files: they run
on the plain bucket only (not made and skipped on the encrypted one)."""


def _packs(tmp_path: Path, device: bytes) -> list[Path]:
    """The device's packs, by sequence (their feed times grow with it)."""
    return sorted(p for p in (tmp_path / "bucket" / "packs").iterdir() if device.hex() in p.name)


async def _write(d: Device, page: str, key: bytes, value: bytes = b"v") -> None:
    pg = await d.repo.ledger("l").page(page)
    await pg.put(key, value)
    await pg.flush()


# -- 1. one page that cannot be synced -------------------------------------------------


def _newer_schema(repo: Repository, page: bytes) -> None:
    conn = sqlite3.connect(repo.page_path(b"l", page))
    conn.execute("PRAGMA user_version = 999")
    conn.close()


async def test_a_page_that_cannot_be_synced_does_not_stop_the_others(
    tmp_path: Path, bucket: FolderStore
) -> None:
    async with device(tmp_path / "a", bucket) as a:
        for name in ("p1", "p2"):
            await _write(a, name, b"k", name.encode())
        await a.repo.close_idle(0)
        _newer_schema(a.repo, b"p1")  # written by a newer ledgerd
        await a.engine.sync()  # p1 cannot be uploaded; p2 is
        st = a.engine.status()
        assert [p["page_text"] for p in st["pages"]] == ["p1"]  # reported although closed
        assert "newer" in st["pages"][0]["error"]
        assert a.engine.problems() and "newer" in a.engine.problems()[0]["error"]
        async with device(tmp_path / "b", bucket) as b:
            await _write(b, "p1", b"mine")
            await b.repo.close_idle(0)
            _newer_schema(b.repo, b"p1")
            await _write(a, "p3", b"k", b"p3")
            await a.engine.sync()
            await b.engine.sync()  # p2 and p3 come down; p1 cannot take anything here
            assert (await _keys(b.repo, "l", "p2"))[b"k"] == b"p2"
            assert (await _keys(b.repo, "l", "p3"))[b"k"] == b"p3"


# -- 2. a corrupt pack ------------------------------------------------------------------


@PLAIN_ONLY
async def test_a_corrupt_pack_is_retried_with_backoff_and_does_not_block_later_packs(
    tmp_path: Path, bucket: FolderStore
) -> None:
    async with device(tmp_path / "a", bucket) as a:
        await _write(a, "p", b"k", b"v" * 500)
        await a.engine.sync()
        await _write(a, "q", b"k", b"later")
        await a.engine.sync()
    bad = _packs(tmp_path, a.repo.device_id)[0]
    data = bytearray(bad.read_bytes())
    data[-100] ^= 0x01
    bad.chmod(0o600)
    bad.write_bytes(bytes(data))
    async with device(tmp_path / "b", bucket, retry_first=3600) as b:
        await b.engine.sync()
        assert (await _keys(b.repo, "l", "q")) == {b"k": b"later"}  # not blocked
        packs = b.engine.status()["packs"]
        assert [(p["pack"], p["state"]) for p in packs] == [(f"packs/{bad.name}", "refused")]
        assert "refused" in packs[0]["error"]
        b.cloud.reset()
        for _ in range(3):  # polls in the backoff do not fetch it again
            await b.engine.round()
        assert b.cloud.counts["get"] == 0


# -- 3. gaps in a device's log, and packs waiting for parents ---------------------------


@PLAIN_ONLY
async def test_a_pack_missing_from_the_middle_is_picked_up_when_it_appears(
    tmp_path: Path, bucket: FolderStore
) -> None:
    async with device(tmp_path / "a", bucket) as a:
        for page in ("p", "q", "p", "r"):  # sequences 1 to 4
            await _write(a, page, page.encode() + b"%d" % time.monotonic_ns())
            await a.engine.sync()
    packs = _packs(tmp_path, a.repo.device_id)
    assert len(packs) == 4
    away = tmp_path / "away"
    away.mkdir()
    for p in packs[:2]:
        p.rename(away / p.name)
    async with device(tmp_path / "b", bucket) as b:
        await b.engine.sync()
        assert len(await _keys(b.repo, "l", "r")) == 1  # the pages not in the way go on
        st = b.engine.status()
        assert [(g["first_seq"], g["last_seq"]) for g in st["gaps"]] == [(1, 2)]
        assert [(p["seq"], p["state"]) for p in st["packs"]] == [(3, "waiting")]
        assert any("waits" in p["error"] for p in b.engine.problems())
        for p in away.iterdir():
            p.rename(packs[0].parent / p.name)
        await b.engine.sync()
        assert len(await _keys(b.repo, "l", "p")) == 2
        assert len(await _keys(b.repo, "l", "q")) == 1
        st = b.engine.status()
        assert st["gaps"] == [] and st["packs"] == [] and b.engine.problems() == []


# -- 4. names from list, and what a folder bucket holds ----------------------------------


async def test_junk_named_like_a_pack_is_ignored(tmp_path: Path, bucket: FolderStore) -> None:
    async with device(tmp_path / "a", bucket) as a:
        await _write(a, "p", b"k")
        await a.engine.sync()
        dev = a.repo.device_id.hex()
        for junk in (
            "-1.-1.-1.-1.-1",
            f"{int(time.time() * 1000):013d}.{dev}.0000000000000009.-1.5",
            f"{int(time.time() * 1000):013d}.{dev}.0000000000000009.5.3",
            f"{int(time.time() * 1000):013d}.{dev}.0000000000000000.50.60",
        ):
            await bucket.put(f"packs/{junk}", b"junk")
        async with device(tmp_path / "b", bucket) as b:
            await b.engine.sync()
            assert b.engine.problems() == []
            assert await b.repo.ledgers() == [b"l"]  # no junk ledger
            assert await _keys(b.repo, "l", "p") == {b"k": b"v"}


async def test_a_fifo_named_like_a_pack_does_not_block_sync(
    tmp_path: Path, bucket: FolderStore
) -> None:
    async with device(tmp_path / "a", bucket) as a:
        await _write(a, "p", b"k")
        await a.engine.sync()
        name = f"{int(time.time() * 1000):013d}.{a.repo.device_id.hex()}.{2:016d}.20.40"
        fifo = tmp_path / "bucket" / "packs" / name
        os.mkfifo(fifo)
        try:
            async with device(tmp_path / "b", bucket) as b:
                await asyncio.wait_for(b.engine.sync(), 20)
                assert await _keys(b.repo, "l", "p") == {b"k": b"v"}
            with pytest.raises(Exception, match="not a regular file"):
                await bucket.get(f"packs/{fifo.name}")
        finally:  # a reader stuck opening the FIFO (the old code) is let go
            with contextlib.suppress(OSError):
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


async def test_folder_list_reads_only_under_the_prefix(
    tmp_path: Path, bucket: FolderStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    for n in ("log/a/1", "log/b/1", "devices/x", "other/deep/y"):
        await bucket.put(n, b"x")
    seen: list[str] = []
    real = os.scandir

    def spy(path: os.PathLike[str] | str) -> os._ScandirIterator[str]:
        seen.append(os.path.relpath(str(path), bucket.root))
        return real(path)

    monkeypatch.setattr(os, "scandir", spy)
    assert [n async for n in bucket.list("log/a/")] == ["log/a/1"]
    assert seen and all(s.startswith("log/a") for s in seen), seen


async def test_folder_objects_are_private_whatever_the_umask(
    tmp_path: Path, bucket: FolderStore
) -> None:
    old = os.umask(0)
    try:
        await bucket.put("log/dev/obj", b"x")
    finally:
        os.umask(old)
    assert (tmp_path / "bucket" / "log" / "dev" / "obj").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "bucket" / "log" / "dev").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "bucket" / "log").stat().st_mode & 0o777 == 0o700


# -- 5. bucket identity ------------------------------------------------------------------


async def test_a_bucket_that_went_away_is_not_recreated(tmp_path: Path) -> None:
    root = tmp_path / "share"
    store = FolderStore(root)
    async with device(tmp_path / "a", store) as a:
        await _write(a, "p", b"k")
        await a.engine.sync()  # the first daemon creates and marks the bucket
        crypt = ["ledgerd-bucket.crypt"] if ENCRYPTION["keys"] else []
        assert sorted(p.name for p in root.iterdir() if p.name.startswith("ledgerd")) == [
            "ledgerd-bucket.5",
            *crypt,
        ]
        root.rename(tmp_path / "unmounted")
        await _write(a, "p", b"k2")
        with pytest.raises(BucketIdentityError, match="no ledgerd-bucket marker"):
            await a.engine.sync()
        assert not root.exists()
        assert "moved, unmounted" in (a.engine.status()["bucket_error"] or "")
        assert a.engine.status()["bucket_error_code"] == "bucket_marker_missing"
        assert "moved, unmounted" in (a.engine.last_error or "")
        root.mkdir()  # an empty folder where the share was: still not the bucket
        with pytest.raises(BucketIdentityError):
            await a.engine.sync()
        assert list(root.iterdir()) == []
        root.rmdir()
        (tmp_path / "unmounted").rename(root)
        await a.engine.sync()  # back: on it goes
        assert a.engine.problems() == []


async def test_failed_uploads_leave_no_gap_in_the_devices_sequence(
    tmp_path: Path, bucket: FolderStore
) -> None:
    # An upload that fails (the endpoint down past the retry deadline, access
    # denied) must not spend a sequence number for good: every other device would
    # show a gap in its log forever and never be synced.
    class Down(FaultyStore):
        down = False

        async def put(self, name: str, data: bytes) -> None:
            if self.down and name.startswith("packs/"):
                raise TransientCloudError("connection refused by 127.0.0.1:9")
            await super().put(name, data)

    down = Down(bucket, rate=0.0)
    async with device(tmp_path / "a", down) as a, device(tmp_path / "b", bucket) as b:
        await _write(a, "p", b"k1")
        await a.engine.sync()
        down.down = True
        for i in range(3):
            await _write(a, "p", b"k%d" % (i + 2))
            await a.engine.sync(timeout=5)  # the page's upload failed: a problem
            assert "connection refused" in str(a.engine.problems()), a.engine.problems()
        down.down = False
        await _write(a, "p", b"k5")
        await a.engine.sync()
        await b.engine.sync()
        assert await _keys(b.repo) == {b"k%d" % i: b"v" for i in range(1, 6)}
        assert b.engine.status()["gaps"] == [], b.engine.status()["gaps"]
        assert b.engine.health()["healthy"], b.engine.health()


@pytest.mark.parametrize("landed", [False, True], ids=["lost", "landed"])
async def test_a_device_killed_during_an_upload_leaves_no_gap_in_its_sequence(
    tmp_path: Path, bucket: FolderStore, landed: bool
) -> None:
    # A pack's sequence number is saved before its PUT; a device killed during the
    # PUT (here: a failed PUT, then a restart, which forgets the pack it held) went
    # on at the next number, and every other device showed a gap in its log for
    # good: never synced. The spent number now goes up in an empty pack, unless the
    # pack that had it landed after all.
    class Down(FaultyStore):
        down = False

        async def put(self, name: str, data: bytes) -> None:
            if self.down and name.startswith("packs/"):
                if landed:
                    await super().put(name, data)  # the PUT landed; its answer did not
                raise TransientCloudError("connection reset by 127.0.0.1:9")
            await super().put(name, data)

    down = Down(bucket, rate=0.0)
    async with device(tmp_path / "b", bucket) as b:
        async with device(tmp_path / "a", down) as a:
            await _write(a, "p", b"k1")
            await a.engine.sync()
            down.down = True
            await _write(a, "p", b"k2")
            await a.engine.sync(timeout=5)  # the upload failed: its number is spent
        down.down = False
        async with device(tmp_path / "a", down) as a:  # the restart
            await _write(a, "p", b"k3")
            await a.engine.sync()
        await b.engine.sync()
        assert await _keys(b.repo) == {b"k%d" % i: b"v" for i in range(1, 4)}
        assert b.engine.status()["gaps"] == [], b.engine.status()["gaps"]
        assert b.engine.health()["synced"], b.engine.health()


async def test_a_bucket_of_a_newer_layout_is_refused(tmp_path: Path, bucket: FolderStore) -> None:
    await bucket.put("ledgerd-bucket.99", b"{}")
    async with device(tmp_path / "a", bucket) as a:
        await _write(a, "p", b"k")
        with pytest.raises(BucketIdentityError, match="upgrade ledgerd"):
            await a.engine.sync()
        assert a.engine.status()["bucket_error_code"] == "bucket_layout_unsupported"
    assert not (tmp_path / "bucket" / "packs").exists()


# -- 6. errors said for what they are -------------------------------------------------------


async def test_the_last_upload_at_stop_logs_its_failure(
    tmp_path: Path, bucket: FolderStore, caplog: pytest.LogCaptureFixture
) -> None:
    class Stuck(FaultyStore):
        stuck = False

        async def put(self, name: str, data: bytes) -> None:
            if self.stuck:
                await asyncio.Event().wait()
            await super().put(name, data)

    stuck = Stuck(bucket, rate=0.0)
    async with device(tmp_path / "a", stuck) as a:
        await a.engine.sync()
        await _write(a, "p", b"k")
        stuck.stuck = True
        with caplog.at_level(logging.WARNING, "ledgerd.sync.engine"):
            await a.engine.stop(final_upload_timeout=0.2)
        assert "did not finish within 0.2s" in caplog.text


@PLAIN_ONLY
async def test_a_corrupt_cloud_copy_is_not_called_local_corruption(
    tmp_path: Path, bucket: FolderStore
) -> None:
    async with device(tmp_path / "a", bucket) as a:
        pa = await a.repo.ledger("l").page("p")
        await pa.put(b"photo", random.Random(5).randbytes(100_000), Priority.LAZY)
        await a.engine.sync()
    async with device(tmp_path / "b", bucket) as b:
        await b.engine.sync()
        f = _packs(tmp_path, a.repo.device_id)[-1]
        data = bytearray(f.read_bytes())
        data[-10] ^= 0x01  # in the LAZY region
        f.write_bytes(bytes(data))
        pb = await b.repo.ledger("l").page("p")
        with pytest.raises(Exception, match="cloud's copy") as e:
            await pb.get(b"photo")
        assert str(b.repo.root) not in str(e.value)


async def test_sync_against_an_unreachable_cloud_says_why(
    tmp_path: Path, bucket: FolderStore
) -> None:
    class Down(FaultyStore):
        async def get(self, name: str, offset: int = 0, length: int | None = None) -> bytes:
            raise TransientCloudError("connection refused by 127.0.0.1:9")

        async def list(self, prefix: str = "", after: str = "") -> AsyncIterator[str]:
            for name in await self.names():
                yield name

        async def names(self) -> tuple[str, ...]:
            raise TransientCloudError("connection refused by 127.0.0.1:9")

    store = Retrying(Down(bucket, rate=0.0), deadline=60, first=0.01, most=0.05)
    async with device(tmp_path / "a", store) as a:
        with pytest.raises(SyncTimeoutError, match="connection refused"):
            await a.engine.sync(timeout=0.5)


# -- 7. lazy reads: few GETs, bounded time ----------------------------------------------------


async def test_a_lazy_value_is_read_with_a_handful_of_gets(
    tmp_path: Path, bucket: FolderStore
) -> None:
    blob = random.Random(7).randbytes(3 * 1024 * 1024)
    async with device(tmp_path / "a", bucket) as a:
        pa = await a.repo.ledger("l").page("p")
        await pa.put(b"other", random.Random(8).randbytes(500_000), Priority.LAZY)
        await pa.put(b"big", blob, Priority.LAZY)
        await a.engine.sync()
    async with device(tmp_path / "b", bucket) as b:
        await b.engine.sync()
        b.cloud.reset()
        pb = await b.repo.ledger("l").page("p")
        assert await pb.get(b"big") == blob
        assert b.cloud.counts["get"] <= 4, b.cloud.counts
        assert b.cloud.bytes_got < 2 * len(blob)


async def test_a_lazy_read_that_cannot_complete_fails_in_bounded_time(
    tmp_path: Path, bucket: FolderStore
) -> None:
    async with device(tmp_path / "a", bucket) as a:
        pa = await a.repo.ledger("l").page("p")
        await pa.put(b"photo", b"p" * 100_000, Priority.LAZY)
        await a.engine.sync()

    class Away(FaultyStore):
        away = False

        async def get(self, name: str, offset: int = 0, length: int | None = None) -> bytes:
            if self.away:
                await asyncio.Event().wait()  # a share that hangs
            return await super().get(name, offset, length)

    away = Away(bucket, rate=0.0)
    async with device(tmp_path / "b", away, fetch_timeout=0.3) as b:
        await b.engine.sync()
        away.away = True
        pb = await b.repo.ledger("l").page("p")
        started = time.monotonic()
        with pytest.raises(ObjectNotFoundError, match="within 0.3s"):
            await asyncio.wait_for(pb.get(b"photo"), 30)
        assert time.monotonic() - started < 10


# -- 8. a round's cost follows the changed pages ----------------------------------------------


def _spy_on_opens(repo: Repository, opened: list[bytes], mp: pytest.MonkeyPatch) -> None:
    """Record the id of every page ``repo`` opens from now on."""
    real = repo._open_new

    async def spy(ledger: bytes, page_id: bytes) -> Page:
        opened.append(page_id)
        return await real(ledger, page_id)

    mp.setattr(repo, "_open_new", spy)


async def test_a_round_opens_only_the_changed_pages(
    tmp_path: Path, bucket: FolderStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine, "PENDING_SLACK_MS", 0)  # no clock steps in this test
    async with device(tmp_path / "a", bucket) as a:
        for i in range(40):
            await _write(a, f"p{i:02d}", b"k")
        await a.engine.sync()
        await a.repo.close_idle(0)
        opened: list[bytes] = []
        _spy_on_opens(a.repo, opened, monkeypatch)
        await _write(a, "p07", b"k2")
        await a.repo.close_idle(0)
        opened.clear()
        await a.engine.sync()
        assert opened == [b"p07"]
    # A commit just before a crash (no round, no stop) goes up after the restart.
    async with device(tmp_path / "a", bucket) as a:
        await _write(a, "p09", b"k", b"before the crash")
    async with device(tmp_path / "a", bucket) as a:
        opened = []
        _spy_on_opens(a.repo, opened, monkeypatch)
        a.cloud.reset()
        await a.engine.sync()
        assert b"p09" in opened and len(opened) <= 2
    # Listings a window apart: the cursor, which trails the newest name by a window,
    # moves on and is saved; the next process starts its listing there.
    clock = Clock()
    clock.now = time.time() + 60
    async with device(tmp_path / "a", bucket, clock=clock) as a:
        for _ in range(3):
            await a.engine.sync()
            clock.now += 200
    async with device(tmp_path / "a", bucket, feed_window=0, clock=clock) as a:
        a.cloud.reset()
        await a.engine.sync()
        assert a.cloud.names_listed <= 3  # the marker and the newest pack: not the whole feed
    async with device(tmp_path / "b", bucket) as b:
        await b.engine.sync()
        assert (await _keys(b.repo, "l", "p09"))[b"k"] == b"before the crash"


# -- 9. uploads stream; one snapshot -----------------------------------------------------------


async def test_an_upload_holds_about_one_pack_in_memory(
    tmp_path: Path, bucket: FolderStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    max_pack = 256 * 1024
    # A checkpoint is built in memory, up to its own bound (max_checkpoint): none here.
    async with device(tmp_path / "a", bucket, max_pack=max_pack, max_checkpoint=max_pack) as a:
        pa = await a.repo.ledger("l").page("p")
        rng = random.Random(9)
        for i in range(16):
            await pa.put(b"v%d" % i, rng.randbytes(200_000))
        await pa.flush()
        read: list[int] = []
        real = ex.read_pieces

        async def spy(page: object, digests: list[bytes]) -> dict[bytes, bytes]:
            got = await real(page, digests)  # type: ignore[arg-type]
            read.append(sum(map(len, got.values())))
            return got

        monkeypatch.setattr(ex, "read_pieces", spy)
        tracemalloc.start()
        try:
            await a.engine.sync()
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert len(read) > 8 and max(read) <= max_pack + 70_000, read
        assert peak < 1.5 * 1024 * 1024 + 4 * max_pack, peak


async def test_a_delta_reads_one_snapshot(tmp_path: Path) -> None:
    async with await Repository.open(tmp_path / "r") as repo:
        page = await repo.ledger("l").page("p")
        await page.put(b"a", b"x" * 1000)
        await page.flush()
        await ex.mark_uploaded(page, await ex.pending_delta(page))  # type: ignore[arg-type]
        await page.put(b"b", b"x" * 1000)
        await page.flush()
        first = await ex.pending_delta(page)
        real = page.load_commit
        raced: list[bytes] = []

        async def racing(cid: bytes) -> commit.Commit:
            if not raced:  # a commit lands while the delta is being read
                raced.append(cid)
                await page.put(b"c", b"y" * 1000)
                await page.flush()
            return await real(cid)

        page.load_commit = racing  # type: ignore[method-assign]
        try:
            up = await ex.pending_delta(page)
        finally:
            page.load_commit = real  # type: ignore[method-assign]
        assert raced and first is not None and up is not None
        # The write that landed meanwhile is not in it, so neither are its pieces.
        assert up.entries == first.entries and (up.since, up.upto) == (first.since, first.upto)
        assert set(up.eager) | set(up.lazy) == set(first.eager) | set(first.lazy)


# -- 10. clock skew ---------------------------------------------------------------------------


@PLAIN_ONLY
async def test_a_device_with_a_clock_far_ahead_is_reported(
    tmp_path: Path, bucket: FolderStore
) -> None:
    async with device(tmp_path / "a", bucket) as a, device(tmp_path / "b", bucket) as b:
        pa = await a.repo.ledger("l").page("p")
        await pa.put(b"k", b"v")
        await pa.flush()
        await a.engine.sync()
        ahead = commit.now_us() + 3600 * 1_000_000
        dot = ahead.to_bytes(8, "big") + a.repo.device_id[:8]
        entry = [b"k2", dg.value_chunk_digest(b"v"), 0, dot]
        section = pack.Section(b"l", b"p", [entry], since=-1, upto=ahead)
        await put_pack(bucket, a.repo.device_id, 9, [section], int(time.time() * 1000))
        await b.engine.sync()
        skew = b.engine.status()["clock_skew"]
        assert [s["device"] for s in skew] == [a.repo.device_id.hex()]
        assert 3500 < skew[0]["ahead_s"] < 3700
