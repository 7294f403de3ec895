"""Retries, error classification and name checks at the cloud boundary."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
import time
from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from ledgerd.sync import folder
from ledgerd.sync.cloud import Retrying, check_name
from ledgerd.sync.errors import (
    AlreadyExistsError,
    CloudNotFoundError,
    InvalidNameError,
    NoBucketError,
    PermanentCloudError,
    TransientCloudError,
)
from ledgerd.sync.folder import FolderStore
from ledgerd.sync.s3 import BlockingCalls, S3Store
from ledgerd.sync.testing import CountingStore
from ledgerd.sync.url import open_store
from tests.sync.doubles import FaultyStore


async def test_transient_failures_are_retried(tmp_path: Path) -> None:
    counting = CountingStore(FolderStore(tmp_path))
    faulty = FaultyStore(counting, rate=0.3, seed=1)
    store = Retrying(faulty, deadline=30, first=0.001, most=0.01)
    for i in range(50):
        # AlreadyExists: an earlier attempt stored it, then its reply was lost.
        with contextlib.suppress(AlreadyExistsError):
            await store.put(f"o/{i:04d}", b"%d" % i)
    assert faulty.failures > 5
    assert [n async for n in store.list("o/")] == [f"o/{i:04d}" for i in range(50)]
    for i in range(50):
        assert await store.get(f"o/{i:04d}") == b"%d" % i


async def test_permanent_failures_are_not_retried(tmp_path: Path) -> None:
    counting = CountingStore(FolderStore(tmp_path))
    store = Retrying(counting, deadline=30, first=0.001)
    with pytest.raises(CloudNotFoundError):
        await store.get("missing")
    assert counting.counts["get"] == 1


async def test_retries_stop_at_the_deadline(tmp_path: Path) -> None:
    store = Retrying(FaultyStore(FolderStore(tmp_path), rate=1.0), deadline=0.2, first=0.01)
    with pytest.raises(TransientCloudError):
        await store.put("x", b"y")


async def test_missing_bucket_advice_names_the_endpoint(moto_server: str) -> None:
    """With an endpoint configured, the ``aws s3 mb`` it suggests goes to that endpoint."""
    missing = S3Store("no-such-bucket", endpoint_url=moto_server, region="us-east-1")
    with pytest.raises(NoBucketError) as e:
        await missing.put("x", b"y")
    assert f"aws s3 mb s3://no-such-bucket --endpoint-url {moto_server})" in str(e.value)
    await missing.close()


async def test_s3_errors_are_classified(aws_env: None) -> None:
    with mock_aws():
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="exists")
        missing = S3Store("no-such-bucket", region="us-east-1")
        with pytest.raises(NoBucketError, match="NoSuchBucket") as e:
            await missing.put("x", b"y")
        assert e.value.code == "bucket_not_found"
        # The message names the bucket (S3's own names only the key) and says what to do.
        assert "the S3 bucket no-such-bucket does not exist" in str(e.value)
        assert "create it first" in str(e.value)
        assert "aws s3 mb s3://no-such-bucket)" in str(e.value)  # no endpoint: none named
        await missing.close()
    # Nothing listens on this port: a connection error is transient.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dead = S3Store("b", endpoint_url=f"http://127.0.0.1:{port}", region="us-east-1", timeout=2)
    with pytest.raises(TransientCloudError):
        await dead.get("x")
    await dead.close()


async def test_s3_without_credentials_says_where_they_come_from(
    aws_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No AWS credentials anywhere: botocore's "Unable to locate credentials" was all that
    ledgerctl sync and status said; the error now names the usual ways to give them. It is
    permanent (a retry cannot find them) and fails before any request is sent."""
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(k)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # (no instance role lookup)
    with socket.socket() as s:  # nothing listens here: a request sent would be transient
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = S3Store("b", endpoint_url=f"http://127.0.0.1:{port}", region="us-east-1", timeout=2)
    try:
        with pytest.raises(PermanentCloudError) as e:
            [name async for name in store.list("x/")]
    finally:
        await store.close()
    text = str(e.value)
    assert text.startswith("list x/: Unable to locate credentials"), text
    assert "AWS_ACCESS_KEY_ID" in text and "AWS_PROFILE" in text, text


async def test_s3_listing_pages_and_skips_foreign_names(aws_env: None) -> None:
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket="bkt")
        store = S3Store("bkt", "root", region="us-east-1", page_size=7)
        for i in range(30):
            await store.put(f"k/{i:03d}", b"")
        client.put_object(Bucket="bkt", Key="root/k/bad name", Body=b"")
        names = [n async for n in store.list("k/")]
        assert names == [f"k/{i:03d}" for i in range(30)]
        assert [n async for n in store.list("k/", after="k/027")] == ["k/028", "k/029"]
        await store.close()


async def test_folder_skips_temporary_and_foreign_files(tmp_path: Path) -> None:
    store = FolderStore(tmp_path)
    await store.put("a/x", b"1")
    (tmp_path / "a" / ".tmp-123").write_bytes(b"partial")
    (tmp_path / "a" / "bad name").write_bytes(b"foreign")
    assert [n async for n in store.list()] == ["a/x"]


async def test_folder_removes_a_killed_puts_stale_temporary_file(tmp_path: Path) -> None:
    """A daemon SIGKILLed in the middle of a folder put leaves its ``.tmp-`` file in the
    shared bucket (found by the sync crash torture: one per writer killed mid-upload,
    never removed). A listing of its directory removes one not written to for
    STALE_TMP seconds; a fresh one (a put going on) stays."""
    store = FolderStore(tmp_path)
    await store.put("packs/x", b"1")
    stale = tmp_path / "packs" / ".tmp-killed"
    stale.write_bytes(b"partial")
    old = time.time() - folder.STALE_TMP - 60
    os.utime(stale, (old, old))
    fresh = tmp_path / "packs" / ".tmp-going-on"
    fresh.write_bytes(b"partial")
    assert [n async for n in store.list("packs/")] == ["packs/x"]
    assert not stale.exists()
    assert fresh.exists()


def test_names() -> None:
    assert check_name("ledgers/bm90ZXM/log/0011/00000001") == "ledgers/bm90ZXM/log/0011/00000001"
    with pytest.raises(InvalidNameError):
        check_name("a/../b")


async def test_open_store_from_url(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}/cloud")
    await store.create_bucket()
    await store.put("x", b"1")
    assert (tmp_path / "cloud" / "x").read_bytes() == b"1"
    s3 = open_store("s3://bucket/some/prefix", endpoint_url="http://127.0.0.1:1")
    assert isinstance(s3, Retrying) and isinstance(s3.inner, S3Store)
    assert s3.inner.prefix == "some/prefix/"
    await s3.close()
    with pytest.raises(PermanentCloudError):
        open_store("ftp://x/y")
    # A host in a file: URL is refused (it was dropped: file://relative/path was /path).
    with pytest.raises(PermanentCloudError, match="names the host 'relative'"):
        open_store("file://relative/path")
    local = open_store(f"file://localhost{tmp_path}/cloud")
    assert await local.get("x") == b"1"


async def test_s3_calls_left_hanging_are_not_waited_for() -> None:
    """A boto3 call cannot be cancelled: its task gives up on it at once, its thread is a
    daemon thread (the interpreter does not wait for it at exit), and a closed pool
    runs nothing more."""
    calls = BlockingCalls(2, "s3-test")
    started, release = threading.Event(), threading.Event()

    def hang() -> int:
        started.set()
        release.wait(30)
        return 1

    try:
        task = asyncio.ensure_future(calls.run(hang))
        assert await asyncio.to_thread(started.wait, 10)
        threads = [t for t in threading.enumerate() if t.name.startswith("s3-test")]
        assert threads and all(t.daemon for t in threads)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await calls.run(lambda: 2) == 2  # the other thread
        calls.close()
        with pytest.raises(PermanentCloudError):
            await calls.run(lambda: 3)
    finally:
        release.set()


async def test_s3_makes_one_attempt_per_call() -> None:
    """Retries are Retrying's: botocore makes one attempt (a hanging endpoint costs one
    read timeout per call, not two)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    accepted: list[socket.socket] = []

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                accepted.append(server.accept()[0])

    threading.Thread(target=accept, daemon=True).start()
    store = S3Store("b", endpoint_url=f"http://127.0.0.1:{server.getsockname()[1]}", timeout=0.3)
    try:
        with pytest.raises(TransientCloudError):
            await store.get("x")
        assert len(accepted) == 1
    finally:
        await store.close()
        server.close()
        for c in accepted:
            c.close()
