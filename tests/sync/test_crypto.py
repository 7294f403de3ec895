"""Client-side encryption (issue 18): nothing readable in the bucket, wrong or missing
keys and tampering refused with nothing stored, key files, rotation, passphrases."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import random
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ledgerd.store import CorruptObjectError, ObjectKeyMissingError, Priority
from ledgerd.sync import crypto, progress
from ledgerd.sync.cloud import Forwarding
from ledgerd.sync.errors import BucketIdentityError
from ledgerd.sync.folder import FolderStore
from ledgerd.sync.layout import MARKER, PackName, marker, marker_name
from ledgerd.sync.s3 import S3Store
from tests.sync.test_engine import Device, _keys, device

SECRETS = [b"ZEBRA-LEDGER", b"QUOKKA-PAGE", b"NARWHAL-KEY", b"PANGOLIN-VALUE"]


def ring(*entries: bytes | str) -> crypto.KeyRing:
    text = "".join(
        f"passphrase {e}\n" if isinstance(e, str) else crypto.key_line(e) for e in entries
    )
    return crypto.parse_key_file(text, "test keys")


def _objects(tmp_path: Path) -> dict[str, bytes]:
    root = tmp_path / "bucket"
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


async def _fill(d: Device) -> dict[bytes, bytes]:
    """Known plain text in every place it could leak: ledger, page, keys, small values,
    a LAZY value (incompressible, so that only encryption can hide it)."""
    page = await d.repo.ledger(SECRETS[0]).page(SECRETS[1])
    rng = random.Random(7)
    rows = {SECRETS[2] + b"%d" % i: SECRETS[3] + b"%d" % i for i in range(50)}
    await page.write(list(rows.items()))
    lazy = SECRETS[3] + rng.randbytes(400_000) + SECRETS[3]
    await page.put(b"big-" + SECRETS[2], lazy, Priority.LAZY)
    rows[b"big-" + SECRETS[2]] = lazy
    await d.engine.sync()
    return rows


def _leaks(objects: dict[str, bytes]) -> list[tuple[str, bytes]]:
    words = [*SECRETS, *(w.hex().encode() for w in SECRETS)]
    words += [base64.urlsafe_b64encode(s).rstrip(b"=") for s in SECRETS]
    return [(n, w) for n, data in objects.items() for w in words if w in data or w in n.encode()]


@pytest.mark.parametrize("encrypted", [False, True])
async def test_an_encrypted_bucket_holds_no_plain_text(
    tmp_path: Path, bucket: FolderStore, encrypted: bool
) -> None:
    keys = ring(crypto.new_key()) if encrypted else None
    async with device(tmp_path / "a", bucket, keys=keys) as a:
        rows = await _fill(a)
        device_hex = a.repo.device_id.hex()
        async with device(tmp_path / "b", bucket, keys=keys) as b:
            await b.engine.sync()
            assert await _keys(b.repo, SECRETS[0].decode(), SECRETS[1].decode()) == rows
    objects = _objects(tmp_path)
    leaks = _leaks(objects)
    if not encrypted:  # the scan finds what a plain bucket shows
        assert leaks
        return
    assert not leaks, leaks
    assert not any(device_hex in n or device_hex.encode() in v for n, v in objects.items())
    assert not any(b"LDGPACK2" in v for v in objects.values())


async def test_sizes_are_padded_to_buckets() -> None:
    assert crypto.sealed_size(1) == crypto.sealed_size(200) == crypto.MIN_PADDED + crypto.OVERHEAD
    for n in (300, 1000, 10_000, 123_457, 5_000_001):
        assert n + 4 <= crypto.padded(n + 4) <= (n + 4) * 1.12 + 1
        assert crypto.padded(n) == crypto.padded(crypto.padded(n))  # a bucket is its own size


async def _refused_and_nothing_stored(
    tmp_path: Path, bucket: FolderStore, keys: crypto.KeyRing | None, error: type[Exception]
) -> str:
    before = _objects(tmp_path)
    async with device(tmp_path / "refused", bucket, keys=keys) as b:
        with pytest.raises(error) as e:
            await b.engine.sync()
        assert b.engine.bucket_error and b.engine.bucket_error == str(e.value)
        assert b.engine.health()["healthy"] is False
        assert await b.repo.ledgers() == []
    assert _objects(tmp_path) == before  # nothing written to the bucket either
    return str(e.value)


async def test_a_wrong_key_is_refused_with_one_clear_error(
    tmp_path: Path, bucket: FolderStore
) -> None:
    key = crypto.new_key()
    async with device(tmp_path / "a", bucket, keys=ring(key)) as a:
        await _fill(a)
    message = await _refused_and_nothing_stored(
        tmp_path, bucket, ring(crypto.new_key()), crypto.EncryptionKeyMismatchError
    )
    assert message.startswith("encryption key mismatch")
    assert key.hex() not in message and crypto.key_line(key).split()[1] not in message


async def test_a_damaged_descriptor_is_not_called_a_key_mismatch(
    tmp_path: Path, bucket: FolderStore
) -> None:
    # The device has the very key the bucket names, but its sealed secret does not
    # authenticate: the descriptor was damaged, and the error says that rather than
    # "none of this device's keys (ids X) opens the bucket (its keys: X)".
    key = crypto.new_key()
    async with device(tmp_path / "a", bucket, keys=ring(key)) as a:
        await _fill(a)
    path = tmp_path / "bucket" / crypto.DESCRIPTOR
    doc = json.loads(path.read_bytes())
    secret = bytearray(base64.b64decode(doc["secret"]))
    secret[-1] ^= 0x01
    doc["secret"] = base64.b64encode(bytes(secret)).decode()
    path.write_text(json.dumps(doc))
    message = await _refused_and_nothing_stored(
        tmp_path, bucket, ring(key), crypto.EncryptionKeyMismatchError
    )
    assert "damaged or was tampered with" in message, message
    assert crypto.DESCRIPTOR in message, message


async def test_no_key_for_an_encrypted_bucket_is_refused(
    tmp_path: Path, bucket: FolderStore
) -> None:
    async with device(tmp_path / "a", bucket, keys=ring(crypto.new_key())) as a:
        await _fill(a)
    message = await _refused_and_nothing_stored(
        tmp_path, bucket, None, crypto.EncryptionKeyMissingError
    )
    assert "encryption_key_file" in message


async def test_a_key_for_a_plain_bucket_is_refused(tmp_path: Path, bucket: FolderStore) -> None:
    async with device(tmp_path / "a", bucket) as a:
        await _fill(a)
    await _refused_and_nothing_stored(
        tmp_path, bucket, ring(crypto.new_key()), crypto.BucketNotEncryptedError
    )


# -- tampering ------------------------------------------------------------------------


def _pack_files(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "bucket" / "packs").iterdir())


async def _two_pages(tmp_path: Path, bucket: FolderStore, keys: crypto.KeyRing) -> None:
    async with device(tmp_path / "a", bucket, keys=keys) as a:
        for name in ("p1", "p2"):
            pg = await a.repo.ledger("l").page(name)
            await pg.put(b"k", name.encode())
        await a.engine.sync()


async def _import_refused(tmp_path: Path, bucket: FolderStore, keys: crypto.KeyRing) -> Device:
    async with device(tmp_path / "b", bucket, keys=keys) as b:
        await b.engine.sync()
        held = list(b.engine._held())
        assert held and all(h.state == progress.REFUSED for h in held), held
        assert all("authenticate" in h.reason for h in held), [h.reason for h in held]
        assert await b.repo.ledgers() == [] or not (await _keys(b.repo, "l", "p1"))
        return b


async def test_a_flipped_bit_is_refused(tmp_path: Path, bucket: FolderStore) -> None:
    keys = ring(crypto.new_key())
    await _two_pages(tmp_path, bucket, keys)
    (path,) = _pack_files(tmp_path)
    pn = PackName.parse(f"packs/{path.name}")
    assert pn is not None
    data = bytearray(path.read_bytes())
    data[pn.head_end + 40] ^= 1  # in the first EAGER section
    os.chmod(path, 0o600)
    path.write_bytes(bytes(data))
    await _import_refused(tmp_path, bucket, keys)


async def test_swapped_sections_are_refused(tmp_path: Path, bucket: FolderStore) -> None:
    keys = ring(crypto.new_key())
    await _two_pages(tmp_path, bucket, keys)
    (path,) = _pack_files(tmp_path)
    pn = PackName.parse(f"packs/{path.name}")
    assert pn is not None
    data = path.read_bytes()
    size = (pn.eager_end - pn.head_end) // 2  # padded: two small sections, one size
    assert size == crypto.MIN_PADDED + crypto.OVERHEAD
    one, two = data[pn.head_end : pn.head_end + size], data[pn.head_end + size : pn.eager_end]
    path.write_bytes(data[: pn.head_end] + two + one + data[pn.eager_end :])
    await _import_refused(tmp_path, bucket, keys)


async def test_a_pack_replayed_under_a_new_name_is_refused(
    tmp_path: Path, bucket: FolderStore
) -> None:
    keys = ring(crypto.new_key())
    async with device(tmp_path / "a", bucket, keys=keys) as a:
        pg = await a.repo.ledger("l").page("p1")
        await pg.put(b"k", b"first")
        await a.engine.sync()
        (old,) = _pack_files(tmp_path)
        await pg.put(b"k", b"second")
        await a.engine.sync()
    async with device(tmp_path / "b", bucket, keys=keys) as b:
        await b.engine.sync()
        assert (await _keys(b.repo, "l", "p1"))[b"k"] == b"second"
    # The old pack again, as the device's next one (new sequence, new feed time).
    pn = PackName.parse(f"packs/{old.name}")
    assert pn is not None
    replay = PackName.make(pn.time + 10_000, pn.device, pn.seq + 2, pn.head_end, pn.eager_end)
    await bucket.put(replay.name, old.read_bytes())
    async with device(tmp_path / "b", bucket, keys=keys) as b:
        await b.engine.sync()
        (held,) = list(b.engine._held())
        assert held.state == progress.REFUSED and "authenticate" in held.reason
        assert (await _keys(b.repo, "l", "p1"))[b"k"] == b"second"


async def test_a_tampered_lazy_piece_is_refused(tmp_path: Path, bucket: FolderStore) -> None:
    keys = ring(crypto.new_key())
    async with device(tmp_path / "a", bucket, keys=keys) as a:
        pg = await a.repo.ledger("l").page("p")
        await pg.put(b"big", random.Random(1).randbytes(3_000_000), Priority.LAZY)
        await a.engine.sync()
    (path,) = _pack_files(tmp_path)
    data = bytearray(path.read_bytes())
    data[-100] ^= 1  # in the last LAZY piece
    path.write_bytes(bytes(data))
    async with device(tmp_path / "b", bucket, keys=keys) as b:
        await b.engine.sync()
        pg = await b.repo.ledger("l").page("p")
        with pytest.raises(CorruptObjectError, match="cloud.s copy"):
            await pg.get(b"big")


# -- key files -----------------------------------------------------------------------


def test_key_init_writes_a_private_key_file_and_never_overwrites(tmp_path: Path) -> None:
    path = tmp_path / "key"
    key = crypto.write_key_file(path)
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert crypto.load_key_file(path).secrets[0].value == key
    with pytest.raises(FileExistsError):
        crypto.write_key_file(path)
    assert crypto.load_key_file(path).secrets[0].value == key


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620])
def test_a_key_file_others_can_read_is_refused(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "key"
    key = crypto.write_key_file(path)
    os.chmod(path, mode)
    with pytest.raises(crypto.KeyFileError, match="chmod 600") as e:
        crypto.load_key_file(path)
    assert crypto.key_line(key).split()[1] not in str(e.value)


def test_a_malformed_key_file_names_the_line_not_its_content(tmp_path: Path) -> None:
    with pytest.raises(crypto.KeyFileError, match="line 2") as e:
        crypto.parse_key_file("# keys\nkey c2VjcmV0LXRleHQ=\n", "f")
    assert "c2VjcmV0" not in str(e.value)
    assert "hidden-words" not in repr(crypto.parse_key_file("passphrase hidden-words\n", "f"))


def test_the_key_file_comes_from_systemd_credentials(tmp_path: Path) -> None:
    (tmp_path / crypto.CREDENTIAL).write_text(crypto.key_line(crypto.new_key()))
    env = {"CREDENTIALS_DIRECTORY": str(tmp_path)}
    assert crypto.find_key_file(None, env) == tmp_path / crypto.CREDENTIAL
    assert crypto.find_key_file(Path("/x"), env) == Path("/x")
    assert crypto.find_key_file(None, {}) is None


# -- rotation and passphrases ----------------------------------------------------------


async def test_rotation_reencrypts_this_devices_packs_with_the_new_key(
    tmp_path: Path, bucket: FolderStore
) -> None:
    old, new = crypto.new_key(), crypto.new_key()
    async with device(tmp_path / "a", bucket, keys=ring(old)) as a:
        rows = await _fill(a)
        first = set(_pack_files(tmp_path))
        assert await a.engine.reencrypt(ring(new, old)) == len(first)
        assert await a.engine.reencrypt() == 0  # done: every pack of it has the new key
        pg = await a.repo.ledger("l").page("after")
        await pg.put(b"k", b"written with the new key")
        await a.engine.sync()
    assert any(n.startswith(crypto.KEY_OBJECT) for n in _objects(tmp_path))
    for path in first:  # what compaction does once nothing needs them
        path.unlink()
    # A device with only the new key reads everything.
    async with device(tmp_path / "c", bucket, keys=ring(new)) as c:
        await c.engine.sync()
        assert not list(c.engine._held())
        assert await _keys(c.repo, SECRETS[0].decode(), SECRETS[1].decode()) == rows
        assert (await _keys(c.repo, "l", "after"))[b"k"] == b"written with the new key"
    # And the old key alone no longer opens the bucket's new objects.
    async with device(tmp_path / "d", bucket, keys=ring(old)) as d:
        await d.engine.sync()
        held = list(d.engine._held())
        assert held and all(h.state == progress.KEY_MISSING for h in held)
        # The reason names the missing key and says what to do about it.
        for h in held:
            assert "which this device does not have" in h.reason, h.reason
            assert "copy that file here and restart ledgerd" in h.reason, h.reason
        assert await d.repo.ledgers() == []


async def test_a_passphrase_opens_the_bucket_and_a_wrong_one_does_not(
    tmp_path: Path, bucket: FolderStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(crypto, "SCRYPT_N", 1 << 12)  # the bucket records its cost
    async with device(tmp_path / "a", bucket, keys=ring("correct horse battery")) as a:
        rows = await _fill(a)
    async with device(tmp_path / "b", bucket, keys=ring("correct horse battery")) as b:
        await b.engine.sync()
        assert await _keys(b.repo, SECRETS[0].decode(), SECRETS[1].decode()) == rows
    assert b'"n": 4096' in _objects(tmp_path)[crypto.DESCRIPTOR]
    await _refused_and_nothing_stored(
        tmp_path, bucket, ring("wrong horse battery"), crypto.EncryptionKeyMismatchError
    )


def test_key_errors_are_bucket_identity_errors() -> None:
    for cls in (
        crypto.EncryptionKeyMismatchError,
        crypto.EncryptionKeyMissingError,
        crypto.BucketNotEncryptedError,
    ):
        assert issubclass(cls, BucketIdentityError)


class _ListTogether(Forwarding):
    """A bucket whose first ``n`` listings of the marker wait for each other: devices
    starting at the same moment all see it empty before any of them writes."""

    def __init__(self, inner: FolderStore, n: int = 2) -> None:
        super().__init__(inner)
        self._waiting = n
        self._all_listed = asyncio.Event()

    async def list(self, prefix: str = "", after: str = "") -> AsyncIterator[str]:
        names = [n async for n in super().list(prefix, after)]
        if prefix.startswith(MARKER) and not self._all_listed.is_set():
            self._waiting -= 1
            if self._waiting == 0:
                self._all_listed.set()
            await self._all_listed.wait()
        for n in names:
            yield n


@pytest.mark.parametrize("order", [("keyed", "keyless"), ("keyless", "keyed")])
async def test_a_keyed_and_a_keyless_device_starting_together_do_not_mix_a_bucket(
    tmp_path: Path, bucket: FolderStore, order: tuple[str, str]
) -> None:
    """Both list the empty bucket before either writes; the one whose marker lands
    first decides whether the bucket is encrypted, and the other is refused, instead
    of both going on (plain packs in an encrypted bucket)."""
    together = _ListTogether(bucket)
    key = ring(crypto.new_key())
    async with (
        device(tmp_path / "keyed", together, keys=key) as k,
        device(tmp_path / "keyless", together, keys=None) as p,
    ):
        devices = {"keyed": k, "keyless": p}
        for name, d in devices.items():
            page = await d.repo.ledger("l").page("p")
            await page.put(b"from", name.encode())
        results = dict(
            zip(
                order,
                await asyncio.gather(
                    *(devices[name].engine.sync() for name in order), return_exceptions=True
                ),
                strict=True,
            )
        )
    failed = {name for name, r in results.items() if isinstance(r, BaseException)}
    assert len(failed) == 1, results
    (loser,) = failed
    (winner,) = set(results) - failed
    refusal = {
        "keyless": crypto.EncryptionKeyMissingError,
        "keyed": crypto.BucketNotEncryptedError,
    }
    assert isinstance(results[loser], refusal[loser]), results[loser]
    assert (crypto.DESCRIPTOR in _objects(tmp_path)) == (winner == "keyed")
    # A later device of the winner's kind reads the winner's page, and only it.
    async with device(tmp_path / "n", bucket, keys=key if winner == "keyed" else None) as n:
        await n.engine.sync()
        assert await _keys(n.repo) == {b"from": winner.encode()}


async def test_a_marker_saying_encrypted_without_a_descriptor_is_finished_by_a_keyed_device(
    tmp_path: Path, bucket: FolderStore
) -> None:
    """The first device wrote the marker and stopped before the descriptor: a keyless
    device is refused, with nothing written, and a keyed one writes the descriptor."""
    await bucket.put(marker_name(), marker(None, 0.0, True))
    await _refused_and_nothing_stored(tmp_path, bucket, None, crypto.EncryptionKeyMissingError)
    key = ring(crypto.new_key())
    async with device(tmp_path / "k", bucket, keys=key) as k:
        await _fill(k)
    assert crypto.DESCRIPTOR in _objects(tmp_path)
    assert not _leaks(_objects(tmp_path))


async def test_a_lazy_piece_sealed_with_a_key_this_device_lost_is_key_missing(
    tmp_path: Path, moto_store: S3Store
) -> None:
    """A LAZY value imported while this device had the key that sealed it, read after
    that key left its key file (rotation on another device, the old key dropped here
    too soon): the read says the key is missing (which one, what to do), not that the
    cloud's copy does not match its digest; nothing is held or marked; and the value
    reads once the key is back."""
    old, new = crypto.new_key(), crypto.new_key()
    value = random.Random(5).randbytes(400_000)
    async with device(tmp_path / "a", moto_store, keys=ring(old)) as a:
        pg = await a.repo.ledger("l").page("p")
        await pg.put(b"big", value, Priority.LAZY)
        await a.engine.sync()
        codec = a.engine.codec
        assert codec is not None
        old_id = codec.write_kid.hex()
    async with device(tmp_path / "b", moto_store, keys=ring(old)) as b:
        await b.engine.sync()  # imported: the value stays in the bucket
    async with device(tmp_path / "a", moto_store, keys=ring(new, old)) as a:
        await a.engine.sync()  # registers the new key
    async with device(tmp_path / "b", moto_store, keys=ring(new)) as b:
        await b.engine.sync()
        pg = await b.repo.ledger("l").page("p")
        for _ in range(2):  # and the same again: nothing was marked by the first
            with pytest.raises(ObjectKeyMissingError) as e:
                await pg.get(b"big")
            message = str(e.value)
            assert f"sealed with key {old_id}, which this device does not have" in message
            assert "copy that file here and restart ledgerd" in message, message
            assert "digest" not in message and "corrupt" not in message.lower(), message
        assert not list(b.engine._held())
        assert b.engine.health()["healthy"] is True
    async with device(tmp_path / "b", moto_store, keys=ring(new, old)) as b:
        pg = await b.repo.ledger("l").page("p")
        assert await pg.get(b"big") == value


async def test_first_reads_before_a_round_check_the_bucket_once(
    tmp_path: Path, bucket: FolderStore
) -> None:
    """LAZY values read at once after a start, before its first round: each read needs
    the bucket's codec, and they share one check of the bucket (one read of its
    descriptor, one key derivation: a passphrase's scrypt takes 128 MiB), not one each."""
    key = crypto.new_key()
    values = {b"v%d" % i: random.Random(i).randbytes(300_000) for i in range(6)}
    async with device(tmp_path / "a", bucket, keys=ring(key)) as a:
        pg = await a.repo.ledger("l").page("p")
        for k, v in values.items():
            await pg.put(k, v, Priority.LAZY)
        await a.engine.sync()
    async with device(tmp_path / "b", bucket, keys=ring(key)) as b:
        await b.engine.sync()  # imported: the values stay in the bucket
    async with device(tmp_path / "b", bucket, keys=ring(key)) as b:
        pg = await b.repo.ledger("l").page("p")
        b.cloud.reset()
        got = await asyncio.gather(*(pg.get(k) for k in values))
        assert got == list(values.values())
        descriptor_reads = [g for g in b.cloud.gets if g[0] == crypto.DESCRIPTOR]
        assert len(descriptor_reads) == 1, b.cloud.gets


class _HeldDescriptor(FolderStore):
    """A folder bucket whose descriptor reads wait while ``hold`` is clear, once armed."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.armed = False
        self.reading = asyncio.Event()
        self.hold = asyncio.Event()

    async def get(self, name: str, offset: int = 0, length: int | None = None) -> bytes:
        if self.armed and name == crypto.DESCRIPTOR:
            self.reading.set()
            await self.hold.wait()
        return await super().get(name, offset, length)


async def test_a_check_asked_for_while_a_read_s_check_runs_is_a_check_of_its_own(
    tmp_path: Path,
) -> None:
    """A round that asks for the bucket to be checked again (the first round, a key
    rotation with the key file read again) while a read's check of the bucket is under
    way gets a check that starts after it asked, not the outcome of the one under way
    (which read the bucket with what was known before)."""
    key = crypto.new_key()
    (tmp_path / "bucket").mkdir()
    cloud = _HeldDescriptor(tmp_path / "bucket")
    async with device(tmp_path / "a", cloud, keys=ring(key)) as a:
        pg = await a.repo.ledger("l").page("p")
        await pg.put(b"big", random.Random(1).randbytes(300_000), Priority.LAZY)
        await a.engine.sync()
    async with device(tmp_path / "b", cloud, keys=ring(key)) as b:
        await b.engine.sync()
    async with device(tmp_path / "b", cloud, keys=ring(key)) as b:
        pg = await b.repo.ledger("l").page("p")
        b.cloud.reset()
        cloud.armed = True
        read = asyncio.ensure_future(pg.get(b"big"))
        await cloud.reading.wait()  # the read's check is under way
        cloud.reading.clear()
        asked = b.engine.ctx.checks_asked
        rotating = asyncio.ensure_future(b.engine.reencrypt())
        while b.engine.ctx.checks_asked == asked:  # until it asked for a check
            await asyncio.sleep(0)
        cloud.hold.set()
        assert len(await read) == 300_000
        await rotating
        descriptor_reads = [g for g in b.cloud.gets if g[0] == crypto.DESCRIPTOR]
        assert len(descriptor_reads) == 2, b.cloud.gets
