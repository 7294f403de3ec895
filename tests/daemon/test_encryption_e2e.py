"""Encrypted sync between real daemons (issue 18): key files, the key mismatch error in
``ledgerctl sync`` and status, ``ledgerd key`` commands, nothing plain in the bucket."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import boto3

from ledgerd.daemon.client import Client
from tests.daemon.conftest import AWS, ROOT, Daemon, UnixHTTPConnection, start_daemon


def _ledgerd(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "ledgerd.daemon", *args],
        capture_output=True,
        cwd=ROOT,
        timeout=120,
    )


def _start(base: Path, endpoint: str, bucket: str, key: Path | None) -> Daemon:
    env = {**AWS, "LEDGERD_ENDPOINT_URL": endpoint, "LEDGERD_SYNC_INTERVAL": "60"}
    if key is not None:
        env["LEDGERD_ENCRYPTION_KEY_FILE"] = str(key)
    return start_daemon(base, "--cloud", f"s3://{bucket}/enc", env=env)


def _objects(endpoint: str, bucket: str) -> dict[str, bytes]:
    s3 = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    names = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]
    return {n: s3.get_object(Bucket=bucket, Key=n)["Body"].read() for n in names}


def _shared_key(base: Path) -> tuple[Path, Path, Callable[[str, Path], Daemon]]:
    """Two key files holding one key, and how to start a daemon (its directory named
    under ``base``) on a folder bucket with one of them."""
    key_a, key_b = base / "key-a", base / "key-b"
    assert _ledgerd("key", "init", str(key_a)).returncode == 0
    key_b.write_bytes(key_a.read_bytes())
    os.chmod(key_b, 0o600)
    cloud = f"file://{base / 'bucket'}"

    def start(name: str, key: Path) -> Daemon:
        env = {"LEDGERD_ENCRYPTION_KEY_FILE": str(key), "LEDGERD_SYNC_INTERVAL": "60"}
        return start_daemon(base / name, "--cloud", cloud, env=env)

    return key_a, key_b, start


def _new_key_uploads(a: Daemon, key_a: Path, start: Callable[[str, Path], Daemon]) -> Daemon:
    """``a`` stopped, a new key added first to its file, restarted: it uploads a pack
    sealed with that key (notes/inbox k2). Returns the restarted daemon."""
    assert a.stop() == 0, a.log_text()
    assert _ledgerd("key", "add", str(key_a)).returncode == 0  # a new key, first
    a = start("a", key_a)
    a.ledgerctl("put", "notes", "inbox", "k2", "sealed with the new key", check=True)
    a.ledgerctl("sync", check=True)
    return a


def test_key_init_refuses_to_overwrite_and_a_readable_key_stops_the_daemon(
    short_tmp: Path,
) -> None:
    key = short_tmp / "key"
    assert _ledgerd("key", "init", str(key)).returncode == 0
    assert os.stat(key).st_mode & 0o777 == 0o600
    before = key.read_bytes()
    out = _ledgerd("key", "init", str(key))
    assert out.returncode == 2 and b"not overwritten" in out.stderr
    assert key.read_bytes() == before
    os.chmod(key, 0o644)
    env = {**os.environ, "LEDGERD_ENCRYPTION_KEY_FILE": str(key)}
    out = subprocess.run(
        [sys.executable, "-m", "ledgerd.daemon", "--check-config"],
        capture_output=True,
        cwd=ROOT,
        env=env,
        timeout=60,
    )
    assert out.returncode == 2 and b"chmod 600" in out.stderr
    os.chmod(key, 0o600)
    out = subprocess.run(
        [sys.executable, "-m", "ledgerd.daemon", "--check-config"],
        capture_output=True,
        cwd=ROOT,
        env=env,
        timeout=60,
    )
    secret = before.split(b"\nkey ")[1].strip()
    assert out.returncode == 0 and secret not in out.stdout + out.stderr


def test_a_missing_bucket_gets_its_own_code(short_tmp: Path, s3_endpoint: str) -> None:
    # Like the encryption errors: the code in POST /v1/sync's answer (ledgerctl's
    # one line) and in status, beside the message.
    d = _start(short_tmp / "a", s3_endpoint, "no-such-bucket", None)
    try:
        out = d.ledgerctl("sync", "--timeout", "30")
        assert out.returncode == 4, out.stderr
        assert b"(bucket_not_found)" in out.stderr and b"NoSuchBucket" in out.stderr
        st = json.loads(d.ledgerctl("status", "--json", check=True).stdout)["sync"]
        assert st["bucket_error_code"] == "bucket_not_found" and st["bucket_error"]
    finally:
        assert d.stop() == 0, d.log_text()


def test_encrypted_daemons_sync_and_a_wrong_key_gets_one_clear_error(
    short_tmp: Path, s3_endpoint: str, bucket: str
) -> None:
    key, wrong = short_tmp / "key", short_tmp / "wrong"
    for k in (key, wrong):
        assert _ledgerd("key", "init", str(k)).returncode == 0
    a = _start(short_tmp / "a", s3_endpoint, bucket, key)
    b = _start(short_tmp / "b", s3_endpoint, bucket, key)
    c = _start(short_tmp / "c", s3_endpoint, bucket, wrong)
    d = _start(short_tmp / "d", s3_endpoint, bucket, None)
    try:
        with Client(a.socket) as ca:
            ca.put("SECRET-LEDGER", "SECRET-PAGE", b"SECRET-KEY", b"SECRET-VALUE")
        for x in (a, b):
            out = x.ledgerctl("sync", "--timeout", "60")
            assert out.returncode == 0, out.stderr
        with Client(b.socket) as cb:
            assert cb.get("SECRET-LEDGER", "SECRET-PAGE", b"SECRET-KEY") == b"SECRET-VALUE"
        st = json.loads(a.ledgerctl("status", "--json", check=True).stdout)["sync"]
        assert st["encryption"]["on"] and len(st["encryption"]["write_key"]) == 8
        for x, code in ((c, "encryption_key_mismatch"), (d, "encryption_key_missing")):
            out = x.ledgerctl("sync", "--timeout", "30")
            assert out.returncode == 4, out.stderr
            assert f"({code})".encode() in out.stderr
            assert len(out.stderr.strip().splitlines()) == 1
            st = json.loads(x.ledgerctl("status", "--json", check=True).stdout)
            assert st["sync"]["bucket_error_code"] == code and st["sync_error"]
            assert json.loads(x.ledgerctl("ledgers", "--json", check=True).stdout or b"[]") in (
                [],
                {"ledgers": []},
            )
        text = b"".join((a.log_text() + b.log_text() + c.log_text()).encode().split())
        for k in (key, wrong):
            assert k.read_bytes().split(b"\nkey ")[1].strip() not in text
    finally:
        for x in (a, b, c, d):
            assert x.stop() == 0, x.log_text()
    for name, data in _objects(s3_endpoint, bucket).items():
        assert b"SECRET" not in data and "SECRET" not in name, name


def test_key_rotate_counts_its_packs_in_words(short_tmp: Path) -> None:
    """``ledgerd key rotate`` after ``key add``, daemon stopped: ``re-encrypted 1 pack``
    (not ``1 packs``), then ``0 packs`` once done."""
    key, cloud = short_tmp / "key", f"file://{short_tmp / 'bucket'}"
    assert _ledgerd("key", "init", str(key)).returncode == 0
    env = {"LEDGERD_ENCRYPTION_KEY_FILE": str(key)}
    d = start_daemon(short_tmp / "a", "--cloud", cloud, env=env)
    try:
        d.ledgerctl("put", "notes", "inbox", "k", "v", check=True)
        d.ledgerctl("sync", check=True)
    finally:
        assert d.stop() == 0, d.log_text()
    assert _ledgerd("key", "add", str(key)).returncode == 0

    def rotate() -> bytes:
        out = subprocess.run(
            [sys.executable, "-m", "ledgerd.daemon", "key", "rotate"]
            + ["--data-dir", str(short_tmp / "a" / "data"), "--cloud", cloud],
            capture_output=True,
            cwd=ROOT,
            env={**os.environ, **env},
            timeout=120,
        )
        assert out.returncode == 0, out.stderr
        return out.stderr.split(b" with key ")[0]

    assert rotate() == b"re-encrypted 1 pack"
    assert rotate() == b"re-encrypted 0 packs"


def test_a_pack_sealed_with_a_key_this_device_lacks_is_key_missing_not_corrupt(
    short_tmp: Path,
) -> None:
    """After ``key add`` on one device, another without the new key holds its packs as
    ``key_missing`` (not ``refused``/``CorruptPackError``: nothing is damaged), says so in
    status and its log, and imports them once the key file is copied and it restarts."""
    key_a, key_b, start = _shared_key(short_tmp)
    a = start("a", key_a)
    b = start("b", key_b)
    try:
        a.ledgerctl("put", "notes", "inbox", "k", "v", check=True)
        a.ledgerctl("sync", check=True)
        b.ledgerctl("sync", check=True)
        a = _new_key_uploads(a, key_a, start)
        out = b.ledgerctl("sync", "--timeout", "30")
        assert out.returncode == 4, out.stderr
        assert b"PackKeyMissingError" in out.stderr and b"Corrupt" not in out.stderr
        st = json.loads(b.ledgerctl("status", "--json", check=True).stdout)
        held = st["sync"]["packs"]
        assert held and all(h["state"] == "key_missing" for h in held), held
        for h in held:
            assert h["error"].startswith("cannot open it: PackKeyMissingError: "), h
            assert "copy that file here and restart ledgerd" in h["error"], h
        text = b.ledgerctl("status", check=True).stdout.decode()
        assert re.search(r"\(key_missing, 1 attempt(, retry in \d+s)?\): cannot open it", text), (
            text
        )
        assert "Corrupt" not in text and "Corrupt" not in b.log_text()
        assert "PackKeyMissingError" in b.log_text()
        # The key arrives and the daemon restarts: the held pack is imported.
        assert b.stop() == 0, b.log_text()
        key_b.write_bytes(key_a.read_bytes())
        b = start("b", key_b)
        b.ledgerctl("sync", "--timeout", "30", check=True)
        got = b.ledgerctl("get", "notes", "inbox", "k2", check=True).stdout
        assert got == b"sealed with the new key"
        assert json.loads(b.ledgerctl("status", "--json", check=True).stdout)["sync"]["packs"] == []
    finally:
        for x in (a, b):
            assert x.stop() == 0, x.log_text()


def test_a_lazy_value_sealed_with_a_key_this_device_lost_is_key_missing_not_corrupt(
    short_tmp: Path,
) -> None:
    """A LAZY value imported while this device had the key that sealed it, read after
    the key left its key file (the old key dropped after a rotation, too soon): 503
    ``encryption_key_missing`` naming the key (not 500 ``corrupt``, "does not match its
    digest"), the same in ``ledgerctl get``; once the key file has it again and the
    daemon restarted, the value reads."""
    key_a, key_b, start = _shared_key(short_tmp)
    value = os.urandom(300_000)
    a = start("a", key_a)
    b = start("b", key_b)
    try:
        a.ledgerctl("put", "--lazy", "notes", "inbox", "big", input=value, check=True)
        a.ledgerctl("sync", check=True)
        b.ledgerctl("sync", check=True)  # imported: the value stays in the bucket
        a = _new_key_uploads(a, key_a, start)  # registers a new key
        assert b.stop() == 0, b.log_text()
        new_only = next(x for x in key_a.read_text().splitlines() if x.startswith("key ")) + "\n"
        key_b.write_text(new_only)  # b's file has the new key only: the old one is lost
        b = start("b", key_b)
        conn = UnixHTTPConnection(b.socket)
        conn.request("GET", "/v1/ledgers/notes/pages/inbox/keys/big")
        resp = conn.getresponse()
        body = json.loads(resp.read())
        conn.close()
        assert resp.status == 503, body
        assert body["error"]["code"] == "encryption_key_missing", body
        message = body["error"]["message"]
        assert re.search(r"sealed with key [0-9a-f]{8}, which this device does not have", message)
        assert "copy that file here and restart ledgerd" in message, message
        assert "digest" not in message, message
        out = b.ledgerctl("get", "notes", "inbox", "big")
        assert out.returncode == 4 and out.stdout == b"", out
        assert out.stderr.rstrip().endswith(b"(encryption_key_missing)"), out.stderr
        assert b"which this device does not have" in out.stderr, out.stderr
        assert "Corrupt" not in b.log_text() and "corrupt" not in b.log_text()
        # The key file has the old key again, the daemon restarts: the value reads.
        assert b.stop() == 0, b.log_text()
        key_b.write_bytes(key_a.read_bytes())
        b = start("b", key_b)
        assert b.ledgerctl("get", "notes", "inbox", "big", check=True).stdout == value
    finally:
        for x in (a, b):
            assert x.stop() == 0, x.log_text()


def test_a_deleted_descriptor_stops_every_device_until_it_is_put_back(short_tmp: Path) -> None:
    """The issue's reproduction with real daemons: ``ledgerd-bucket.crypt`` deleted from
    an encrypted bucket. A new device with the same key file writes no new descriptor
    and is refused, and so are the devices that synced (never "not encrypted"), even
    after a restart: ``bucket_identity_missing`` in ``ledgerctl sync``, status and the
    HTTP API. The descriptor put back, every device syncs again and nothing is lost."""
    key_a, key_b, start = _shared_key(short_tmp)
    key_c = short_tmp / "key-c"
    key_c.write_bytes(key_a.read_bytes())
    os.chmod(key_c, 0o600)
    a = start("a", key_a)
    b = start("b", key_b)
    c: Daemon | None = None
    try:
        a.ledgerctl("put", "notes", "inbox", "k", "from a", check=True)
        a.ledgerctl("sync", check=True)
        b.ledgerctl("sync", check=True)
        descriptor = short_tmp / "bucket" / "ledgerd-bucket.crypt"
        saved = descriptor.read_bytes()
        descriptor.unlink()
        c = start("c", key_c)
        assert a.stop() == 0, a.log_text()
        a = start("a", key_a)  # a restart: it took the new descriptor before
        for x in (c, a, b):
            out = x.ledgerctl("sync", "--timeout", "30")
            assert out.returncode == 4, out.stderr
            assert out.stderr.rstrip().endswith(b"(bucket_identity_missing)"), out.stderr
            assert b"not encrypted" not in out.stderr and b"ledgerd-bucket.crypt" in out.stderr
            assert len(out.stderr.strip().splitlines()) == 1
            st = json.loads(x.ledgerctl("status", "--json", check=True).stdout)["sync"]
            assert st["bucket_error_code"] == "bucket_identity_missing", st
            assert "restore ledgerd-bucket.crypt" in st["bucket_error"], st
        conn = UnixHTTPConnection(c.socket)
        conn.request("POST", "/v1/sync?timeout=30")
        resp = conn.getresponse()
        body = json.loads(resp.read())
        conn.close()
        assert resp.status == 503 and body["error"]["code"] == "bucket_identity_missing", body
        assert not descriptor.exists()  # nobody started a new identity
        assert c.ledgerctl("get", "notes", "inbox", "k").returncode == 1  # nothing came
        descriptor.write_bytes(saved)  # from a backup
        os.chmod(descriptor, 0o600)
        for x in (a, b, c):
            x.ledgerctl("sync", "--timeout", "60", check=True)
        b.ledgerctl("put", "notes", "inbox", "k2", "from b", check=True)
        b.ledgerctl("sync", check=True)
        for x in (a, c):
            x.ledgerctl("sync", "--timeout", "60", check=True)
            assert x.ledgerctl("get", "notes", "inbox", "k", check=True).stdout == b"from a"
            assert x.ledgerctl("get", "notes", "inbox", "k2", check=True).stdout == b"from b"
        for x in (a, b, c):
            st = json.loads(x.ledgerctl("status", "--json", check=True).stdout)["sync"]
            assert st["packs"] == [] and st["bucket_error_code"] is None, st
    finally:
        for y in (a, b, c):
            if y is not None:
                assert y.stop() == 0, y.log_text()
