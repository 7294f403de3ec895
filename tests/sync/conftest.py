"""Cloud stores for the contract suite: a folder, moto in-process, moto's HTTP server, and
a folder behind every wrapper (retries, metering, counting, injected faults at rate 0)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import boto3
import pytest
from moto import mock_aws
from moto.server import ThreadedMotoServer

from ledgerd.sync.cloud import CloudStore, Forwarding, Retrying
from ledgerd.sync.folder import FolderStore
from ledgerd.sync.metered import Metered
from ledgerd.sync.s3 import S3Store
from ledgerd.sync.testing import CountingStore
from tests.sync.doubles import FaultyStore

BUCKET = "ledgerd-test"


@pytest.fixture(autouse=True)
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fake credentials and region; no real AWS endpoint is ever reached."""
    for k in list(os.environ):
        if k.startswith("AWS_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")


@pytest.fixture(scope="session")
def moto_server() -> Iterator[str]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def bucket(tmp_path: Path) -> FolderStore:
    """A bucket in a folder of the test's temporary directory."""
    (tmp_path / "bucket").mkdir()
    return FolderStore(tmp_path / "bucket")


@pytest.fixture
async def moto_store(aws_env: None) -> AsyncIterator[S3Store]:
    """A bucket of moto in-process."""
    with mock_aws():
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket=BUCKET)
        s = S3Store(BUCKET, "prefix/x", region="us-east-1")
        yield s
        await s.close()


@pytest.fixture(params=["folder", "moto", "moto-server", "wrapped"])
async def store(
    request: pytest.FixtureRequest, tmp_path: Path, aws_env: None
) -> AsyncIterator[CloudStore]:
    kind = request.param
    s: CloudStore
    if kind in ("folder", "wrapped"):
        s = FolderStore(tmp_path / "bucket")
        if kind == "wrapped":
            s = Retrying(Metered(CountingStore(FaultyStore(Forwarding(s), rate=0.0))))
        await s.create_bucket()
        yield s
        await s.close()
        return
    if kind == "moto":
        with mock_aws():
            boto3.client("s3", region_name="us-east-1").create_bucket(Bucket=BUCKET)
            s = S3Store(BUCKET, "prefix/x", region="us-east-1")
            yield s
            await s.close()
        return
    endpoint = request.getfixturevalue("moto_server")
    bucket = f"{BUCKET}-{os.urandom(4).hex()}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    s = S3Store(bucket, "", endpoint_url=endpoint, region="us-east-1")
    yield s
    await s.close()
