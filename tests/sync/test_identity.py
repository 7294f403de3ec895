"""Bucket identity: the marker and the encryption descriptor are written once, only
into a bucket that holds nothing; each device remembers them and refuses a bucket
whose identity objects vanished or changed; a pack sealed under a key the bucket
never registered is refused, not waited for (the issue of the deleted descriptor)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from ledgerd.daemon import errors as api_errors
from ledgerd.sync import crypto, layout, progress
from ledgerd.sync import errors as sync_errors
from ledgerd.sync.cloud import CloudStore, Forwarding
from ledgerd.sync.context import IDENTITY, SEEN, Identity
from ledgerd.sync.errors import (
    AlreadyExistsError,
    BucketIdentityChangedError,
    BucketIdentityError,
    BucketIdentityMissingError,
    BucketMarkerMissingError,
)
from ledgerd.sync.folder import FolderStore
from ledgerd.sync.s3 import S3Store
from tests.sync.conftest import BUCKET
from tests.sync.test_crypto import SECRETS, _fill, ring
from tests.sync.test_engine import Device, _keys, device


@pytest.fixture(params=["folder", "moto"])
async def cloud(
    request: pytest.FixtureRequest, tmp_path: Path, aws_env: None
) -> AsyncIterator[CloudStore]:
    """A real folder bucket, or a bucket of moto in-process."""
    if request.param == "folder":
        (tmp_path / "bucket").mkdir()
        yield FolderStore(tmp_path / "bucket")
        return
    with mock_aws():
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket=BUCKET)
        s = S3Store(BUCKET, "prefix/x", region="us-east-1")
        yield s
        await s.close()


async def _objects(store: CloudStore) -> dict[str, bytes]:
    names = [n async for n in store.list()]
    return {n: await store.get(n) for n in names}


async def _refused(
    path: Path,
    store: CloudStore,
    keys: crypto.KeyRing | None,
    error: type[BucketIdentityError],
    code: str,
) -> str:
    """A device at ``path`` is refused the bucket with ``error`` (and ``code`` in
    status), and writes nothing to the bucket; returns the message."""
    before = await _objects(store)
    async with device(path, store, keys=keys) as d:
        with pytest.raises(error) as e:
            await d.engine.sync()
        assert type(e.value) is error, e.value
        st = d.engine.status()
        assert st["bucket_error_code"] == code and st["bucket_error"] == str(e.value)
        assert d.engine.health()["healthy"] is False
    assert await _objects(store) == before
    return str(e.value)


async def _write_and_converge(devices: dict[str, Device]) -> None:
    """Each device writes its name under ``l/p``; after two rounds each, every device
    holds every write and nothing is held."""
    for name, d in devices.items():
        pg = await d.repo.ledger("l").page("p")
        await pg.put(name.encode(), b"from " + name.encode())
    for _ in range(2):
        for d in devices.values():
            await d.engine.sync()
    want = {n.encode(): b"from " + n.encode() for n in devices}
    for d in devices.values():
        assert await _keys(d.repo) == want
        assert not list(d.engine._held())


class _Listings(Forwarding):
    """Records the prefix of every listing."""

    def __init__(self, inner: CloudStore) -> None:
        super().__init__(inner)
        self.prefixes: list[str] = []

    async def list(self, prefix: str = "", after: str = "") -> AsyncIterator[str]:
        self.prefixes.append(prefix)
        async for n in super().list(prefix, after):
            yield n


# -- the reproduction ------------------------------------------------------------


async def test_a_deleted_descriptor_is_refused_at_every_step_and_nothing_is_lost(
    tmp_path: Path, cloud: CloudStore
) -> None:
    """The descriptor of an encrypted bucket deleted: a new device with the same key
    file is refused (it wrote a new descriptor, with a new salt and secret), and so is
    one without a key; the devices that synced say the descriptor is missing (they
    said "the bucket is not encrypted", or accepted a new descriptor after a restart);
    nothing is written. Put back, it is accepted by every device again, and the
    writes of each reach every other."""
    keys = ring(crypto.new_key())
    async with device(tmp_path / "a", cloud, keys=keys) as a:
        rows = await _fill(a)
    original = await cloud.get(crypto.DESCRIPTOR)
    async with device(tmp_path / "b", cloud, keys=keys) as b:
        await b.engine.sync()
        await cloud.delete(crypto.DESCRIPTOR)
        # A running device meets it at its next check (ledgerctl sync, a start).
        with pytest.raises(BucketIdentityMissingError) as e:
            await b.engine.sync()
        assert "not encrypted" not in str(e.value)
    for name, k in (("new", keys), ("keyless", None)):
        message = await _refused(
            tmp_path / name, cloud, k, BucketIdentityMissingError, "bucket_identity_missing"
        )
        assert crypto.DESCRIPTOR in message and "is missing" in message, message
        assert "restore" in message and "new cloud URL" in message, message
    for name in ("a", "b"):
        message = await _refused(
            tmp_path / name, cloud, keys, BucketIdentityMissingError, "bucket_identity_missing"
        )
        assert "not encrypted" not in message, message
        assert "encrypted when this device last synced with it" in message, message
    assert crypto.DESCRIPTOR not in await _objects(cloud)
    await cloud.put(crypto.DESCRIPTOR, original)  # restored from a backup
    async with (
        device(tmp_path / "a", cloud, keys=keys) as a,
        device(tmp_path / "b", cloud, keys=keys) as b,
        device(tmp_path / "new", cloud, keys=keys) as n,
    ):
        await _write_and_converge({"a": a, "b": b, "new": n})
        for d in (a, b, n):
            assert await _keys(d.repo, SECRETS[0].decode(), SECRETS[1].decode()) == rows


async def test_a_replaced_descriptor_is_refused_until_the_original_is_back(
    tmp_path: Path, cloud: CloudStore
) -> None:
    """What a new device did before: a second descriptor (same key file, new salt and
    secret) in place of the deleted one. The devices that remember the first refuse it
    as a changed identity (they took it after a restart and held their own packs as
    ``key_missing``); with the original back they sync again."""
    keys = ring(crypto.new_key())
    async with device(tmp_path / "a", cloud, keys=keys) as a:
        await _fill(a)
    original = await cloud.get(crypto.DESCRIPTOR)
    await cloud.delete(crypto.DESCRIPTOR)
    await crypto.create_descriptor(cloud, keys)
    message = await _refused(
        tmp_path / "a", cloud, keys, BucketIdentityChangedError, "bucket_identity_changed"
    )
    assert "not the one this device synced with" in message, message
    assert "put the original" in message, message
    await cloud.delete(crypto.DESCRIPTOR)
    await cloud.put(crypto.DESCRIPTOR, original)
    async with (
        device(tmp_path / "a", cloud, keys=keys) as a,
        device(tmp_path / "b", cloud, keys=keys) as b,
    ):
        await _write_and_converge({"a": a, "b": b})


@pytest.mark.parametrize("encrypted", [False, True])
async def test_a_deleted_marker_is_refused_and_accepted_again_once_restored(
    tmp_path: Path, cloud: CloudStore, encrypted: bool
) -> None:
    keys = ring(crypto.new_key()) if encrypted else None
    async with device(tmp_path / "a", cloud, keys=keys) as a:
        pg = await a.repo.ledger("l").page("p")
        await pg.put(b"a", b"from a")
        await a.engine.sync()
    marker = await cloud.get(layout.marker_name())
    await cloud.delete(layout.marker_name())
    message = await _refused(
        tmp_path / "new", cloud, keys, BucketIdentityMissingError, "bucket_identity_missing"
    )
    assert "holds ledgerd data (packs) but no ledgerd-bucket marker" in message, message
    message = await _refused(
        tmp_path / "a", cloud, keys, BucketMarkerMissingError, "bucket_marker_missing"
    )
    assert message.startswith("the bucket has no ledgerd-bucket marker"), message
    await cloud.put(layout.marker_name(), marker)
    async with (
        device(tmp_path / "a", cloud, keys=keys) as a,
        device(tmp_path / "new", cloud, keys=keys) as n,
    ):
        await _write_and_converge({"a": a, "new": n})


async def test_a_descriptor_appearing_in_a_plain_bucket_is_a_changed_identity(
    tmp_path: Path, cloud: CloudStore
) -> None:
    async with device(tmp_path / "a", cloud, keys=None) as a:
        pg = await a.repo.ledger("l").page("p")
        await pg.put(b"a", b"from a")
        await a.engine.sync()
    await crypto.create_descriptor(cloud, ring(crypto.new_key()))
    message = await _refused(
        tmp_path / "a", cloud, None, BucketIdentityChangedError, "bucket_identity_changed"
    )
    assert "not encrypted when this device last synced" in message, message


async def test_sealed_packs_under_an_older_marker_without_descriptor_are_not_a_plain_bucket(
    tmp_path: Path, bucket: FolderStore
) -> None:
    """A marker of an older ledgerd does not say whether the bucket is encrypted; with
    the descriptor gone, the packs say it: a new device (keyed or not) is refused as
    the descriptor missing, never told "not encrypted" nor let to write plain packs."""
    keys = ring(crypto.new_key())
    async with device(tmp_path / "a", bucket, keys=keys) as a:
        pg = await a.repo.ledger("l").page("p")
        await pg.put(b"a", b"from a")
        await a.engine.sync()
    old = {"ledgerd_bucket": layout.BUCKET_FORMAT, "created_at": 0.0, "created_by": "0" * 32}
    await bucket.delete(layout.marker_name())
    await bucket.put(layout.marker_name(), json.dumps(old).encode())
    await bucket.delete(crypto.DESCRIPTOR)
    for name, k in (("keyed", keys), ("keyless", None)):
        message = await _refused(
            tmp_path / name, bucket, k, BucketIdentityMissingError, "bucket_identity_missing"
        )
        assert "it holds encrypted packs" in message, message


async def test_a_refused_bucket_s_data_is_listed_once_not_every_round(
    tmp_path: Path, bucket: FolderStore
) -> None:
    """A bucket refused because it holds data without its marker is checked again every
    round; its packs are listed once (a listing of them can take many requests)."""
    async with device(tmp_path / "a", bucket) as a:
        pg = await a.repo.ledger("l").page("p")
        await pg.put(b"a", b"from a")
        await a.engine.sync()
    await bucket.delete(layout.marker_name())
    listings = _Listings(bucket)
    async with device(tmp_path / "new", listings) as n:
        for _ in range(3):
            with pytest.raises(BucketIdentityMissingError):
                await n.engine.sync()
    assert listings.prefixes.count(layout.PACKS) == 1, listings.prefixes


# -- what a device remembers -----------------------------------------------------------------


async def test_a_device_remembers_the_fingerprint_never_the_key_or_secret(
    tmp_path: Path, bucket: FolderStore
) -> None:
    key = crypto.new_key()
    async with device(tmp_path / "a", bucket, keys=ring(key)) as a:
        await _fill(a)
        raw = await a.repo.get_meta(f"{IDENTITY}/{a.engine.location}")
    assert raw is not None
    desc = crypto.parse_descriptor((tmp_path / "bucket" / crypto.DESCRIPTOR).read_bytes())
    assert Identity.decode(raw) == Identity(
        frozenset({layout.BUCKET_FORMAT}), True, desc.fingerprint
    )
    for secret in (key, crypto.key_line(key).split()[1].encode(), desc.secret, desc.salt):
        assert secret not in raw and secret.hex().encode() not in raw


async def test_a_device_of_an_older_ledgerd_is_never_told_not_encrypted(
    tmp_path: Path, bucket: FolderStore
) -> None:
    """A device whose repository remembers only that it saw the bucket (an older
    ledgerd's) and whose bucket lost its descriptor: identity missing; it learns the
    identity at its first good check after the upgrade."""
    keys = ring(crypto.new_key())
    async with device(tmp_path / "a", bucket, keys=keys) as a:
        await _fill(a)
        await a.repo.delete_meta(f"{IDENTITY}/{a.engine.location}")
        assert await a.repo.get_meta(f"{SEEN}/{a.engine.location}") is not None
    original = await bucket.get(crypto.DESCRIPTOR)
    await bucket.delete(crypto.DESCRIPTOR)
    message = await _refused(
        tmp_path / "a", bucket, keys, BucketIdentityMissingError, "bucket_identity_missing"
    )
    assert "not encrypted" not in message, message
    await bucket.put(crypto.DESCRIPTOR, original)
    async with device(tmp_path / "a", bucket, keys=keys) as a:
        await a.engine.sync()
        raw = await a.repo.get_meta(f"{IDENTITY}/{a.engine.location}")
        assert raw is not None and Identity.decode(raw).encrypted is True


# -- two first devices -------------------------------------------------------------------


class _DescriptorRace(Forwarding):
    """Two devices decide to write the descriptor before either's lands: each put of
    it waits for the other's. ``overwrite``: the store does not refuse an existing name
    (an S3 store without ``If-None-Match``): the last put wins, and both read after
    both wrote."""

    def __init__(self, inner: CloudStore, overwrite: bool) -> None:
        super().__init__(inner)
        self.overwrite = overwrite
        self.outcomes: list[str] = []
        self._arrived = self._done = 0
        self._both_arrived = asyncio.Event()
        self._both_done = asyncio.Event()
        self._one_at_a_time = asyncio.Lock()

    async def put(self, name: str, data: bytes) -> None:
        if name != crypto.DESCRIPTOR:
            return await super().put(name, data)
        self._arrived += 1
        if self._arrived == 2:
            self._both_arrived.set()
        await self._both_arrived.wait()
        try:
            async with self._one_at_a_time:
                if self.overwrite:
                    await self.inner.delete(name)
                await super().put(name, data)
            self.outcomes.append("wrote")
        except AlreadyExistsError:
            self.outcomes.append("refused")
            raise
        finally:
            self._done += 1
            if self._done == 2:
                self._both_done.set()
            await self._both_done.wait()


@pytest.mark.parametrize("overwrite", [False, True])
async def test_two_first_devices_of_an_encrypted_bucket_agree_on_one_descriptor(
    tmp_path: Path, cloud: CloudStore, overwrite: bool
) -> None:
    keys = ring(crypto.new_key())
    race = _DescriptorRace(cloud, overwrite)
    async with (
        device(tmp_path / "a", race, keys=keys) as a,
        device(tmp_path / "b", race, keys=keys) as b,
    ):
        await asyncio.wait_for(asyncio.gather(a.engine.sync(), b.engine.sync()), 60)
        assert sorted(race.outcomes) == (["wrote"] * 2 if overwrite else ["refused", "wrote"])
        landed = crypto.parse_descriptor(await cloud.get(crypto.DESCRIPTOR)).fingerprint
        for d in (a, b):
            raw = await d.repo.get_meta(f"{IDENTITY}/{d.engine.location}")
            assert raw is not None and Identity.decode(raw).descriptor == landed
        await _write_and_converge({"a": a, "b": b})


# -- packs sealed under keys the bucket never registered ---------------------------------------


async def test_packs_of_another_bucket_are_refused_not_waited_for(
    tmp_path: Path, bucket: FolderStore
) -> None:
    """The same key file on two buckets: packs of one, copied into the other, are
    sealed under a key id this bucket never registered (its salt differs): refused,
    "written for another bucket?", not ``key_missing`` with "copy that file here".
    Three of them cost one listing of the bucket's key objects, not one each."""
    keys = ring(crypto.new_key())
    (tmp_path / "other").mkdir()
    other = FolderStore(tmp_path / "other")
    async with device(tmp_path / "x", other, keys=keys) as x:
        pg = await x.repo.ledger("l").page("foreign")
        for i in range(3):
            await pg.put(b"k", b"from another bucket %d" % i)
            await x.engine.sync()
    async with device(tmp_path / "a", bucket, keys=keys) as a:
        pg = await a.repo.ledger("l").page("p")
        await pg.put(b"a", b"from a")
        await a.engine.sync()
    for path in (tmp_path / "other" / "packs").iterdir():
        await bucket.put(f"packs/{path.name}", path.read_bytes())
    listings = _Listings(bucket)
    async with device(tmp_path / "b", listings, keys=keys) as b:
        for _ in range(2):
            await b.engine.sync()
            held = list(b.engine._held())
            assert len(held) == 3 and all(h.state == progress.REFUSED for h in held), held
            for h in held:
                assert "never registered (written for another bucket?)" in h.reason, h.reason
                assert "copy that file here" not in h.reason, h.reason
        assert await _keys(b.repo) == {b"a": b"from a"}
        assert await b.repo.ledger("l").pages() == [b"p"]
    assert listings.prefixes.count(crypto.KEY_OBJECT) == 1, listings.prefixes


async def test_a_key_registered_after_the_check_is_key_missing_not_foreign(
    tmp_path: Path, bucket: FolderStore
) -> None:
    """b checked the bucket; a then registers a new write key and seals a pack with
    it. b's next background round (no new check of the bucket) reads the key objects
    again (one LIST) before it calls the key foreign: the pack is ``key_missing``,
    and imports once b has the key."""
    old, new = crypto.new_key(), crypto.new_key()
    async with device(tmp_path / "b", bucket, keys=ring(old)) as b:
        await b.engine.sync()
        async with device(tmp_path / "a", bucket, keys=ring(new, old)) as a:
            pg = await a.repo.ledger("l").page("p")
            await pg.put(b"k", b"sealed with the new key")
            await a.engine.sync()
        b.cloud.reset()
        await b.engine.round()
        (held,) = list(b.engine._held())
        assert held.state == progress.KEY_MISSING, held
        assert "copy that file here and restart ledgerd" in held.reason, held.reason
        key_lists = b.cloud.counts["list"] - 1  # (the round's listing of the feed)
        assert key_lists == 1, b.cloud.counts
    async with device(tmp_path / "b", bucket, keys=ring(new, old)) as b:
        await b.engine.sync()
        assert await _keys(b.repo) == {b"k": b"sealed with the new key"}


# -- codes --------------------------------------------------------------------------------


def test_every_bucket_identity_code_has_its_api_error() -> None:
    classes = [
        c
        for module in (sync_errors, crypto)
        for c in vars(module).values()
        if isinstance(c, type) and issubclass(c, BucketIdentityError)
    ]
    codes = {c.code for c in classes}
    assert {"bucket_identity_missing", "bucket_identity_changed"} <= codes
    for code in codes:
        assert api_errors.BUCKET_ERRORS[code].code == code
        assert api_errors.BUCKET_ERRORS[code].status == 503
