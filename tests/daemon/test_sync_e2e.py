"""Several real daemons sharing a bucket on moto's HTTP server (loopback only)."""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import boto3

from ledgerd.daemon.client import Client, NotFoundError
from ledgerd.store.repo.repository import encode_name
from ledgerd.store.sqlite.schema import FORMAT_VERSION
from ledgerd.sync import pack
from ledgerd.sync.layout import PackName
from tests.daemon.conftest import AWS, ROOT, Daemon, _ls, _start, _sync, start_daemon

FORMAT_DIR = str(FORMAT_VERSION)
"""The directory of the data directory's pages (``{data}/{FORMAT_VERSION}/ledgers``)."""


def test_writes_propagate_and_converge(three: list[Daemon]) -> None:
    a, b, c = three
    with Client(a.socket) as ca, Client(b.socket) as cb, Client(c.socket) as cc:
        ca.put("notes", "inbox", b"hello", b"from a")
        _sync(a)
        _sync(b)
        _sync(c)
        assert cb.get("notes", "inbox", b"hello") == b"from a"
        assert cc.get("notes", "inbox", b"hello") == b"from a"
        # Disjoint concurrent writes all survive; the same key converges everywhere.
        ca.put("notes", "inbox", b"only-a", b"1")
        cb.put("notes", "inbox", b"only-b", b"2")
        cc.batch("notes", "inbox", puts=[(b"only-c%d" % i, b"3") for i in range(50)])
        for cl, v in ((ca, b"A"), (cb, b"B"), (cc, b"C")):
            # A transaction commits (and takes its dot) before it returns; a plain put
            # is committed a pause later, so under load a's could commit after c's.
            with cl.transaction("notes", "inbox") as txn:
                txn.put(b"same", v)
        for _ in range(2):
            for d in three:
                _sync(d)
    listings = [_ls(d) for d in three]
    assert listings[0] == listings[1] == listings[2]
    keys = {x["key"] for x in listings[0]}
    assert len(keys) == 1 + 2 + 50 + 1
    # The last write of "same" (c's, the largest dot) wins everywhere; the other two
    # stay as its siblings on every device, one conflict (nobody is asked).
    same = next(x for x in listings[0] if x["key"] == base64.b64encode(b"same").decode())
    assert same["value"] == base64.b64encode(b"C").decode()
    for d in three:
        st = json.loads(d.ledgerctl("status", "--json", check=True).stdout)
        page = next(p for p in st["open_pages"] if p["page_text"] == "inbox")
        assert page["unuploaded_writes"] is False and page["sync"] == "synced", page
        assert page["last_sync"] and page["last_error"] is None, page
        assert page["heads"] == 1 and page["conflicts"] == 1 and page["conflict"] is None, page


def test_new_device_bootstraps_and_lazy_values_wait_for_a_read(
    short_tmp: Path, s3_endpoint: str, bucket: str
) -> None:
    a = _start(short_tmp / "a", s3_endpoint, bucket)
    try:
        with Client(a.socket) as ca:
            ca.put("notes", "inbox", b"eager", b"e" * 1000)
            ca.put("notes", "photos", b"photo", os.urandom(300_000), lazy=True)
            ca.put("other", "page", b"k", b"v")
        _sync(a)
        d = _start(short_tmp / "d", s3_endpoint, bucket)
        try:
            _sync(d)
            assert sorted(d.ledgerctl("ledgers", check=True).stdout.split()) == [b"notes", b"other"]
            db = (
                d.data
                / FORMAT_DIR
                / "ledgers"
                / encode_name(b"notes")
                / encode_name(b"photos")
                / "page.sqlite"
            )
            conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
            try:
                lazy = conn.execute("SELECT count(*) FROM remote_pieces").fetchone()[0]
                stored = conn.execute(
                    "SELECT count(*) FROM objects o JOIN remote_pieces r ON r.digest = o.digest"
                ).fetchone()[0]
            finally:
                conn.close()
            assert lazy > 0 and stored == 0  # known, not fetched
            with Client(d.socket) as cd:
                assert len(cd.get("notes", "photos", b"photo")) == 300_000  # fetched now
                assert cd.get("other", "page", b"k") == b"v"
            conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
            try:  # fetched: stored, and no longer located in the cloud
                assert conn.execute("SELECT count(*) FROM remote_pieces").fetchone()[0] == 0
            finally:
                conn.close()
        finally:
            assert d.stop() == 0
    finally:
        assert a.stop() == 0


def test_killed_mid_upload_completes_after_restart(
    short_tmp: Path, s3_endpoint: str, bucket: str
) -> None:
    a = _start(short_tmp / "a", s3_endpoint, bucket)
    with Client(a.socket) as ca:
        ca.put("notes", "inbox", b"big", os.urandom(20 * 1024 * 1024))
        ca.put("notes", "inbox", b"small", b"s")
    env = {**os.environ, "LEDGERD_SOCKET": str(a.socket)}
    syncing = subprocess.Popen(
        [sys.executable, "-m", "ledgerd.daemon.cli", "sync"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    a.proc.send_signal(signal.SIGKILL)  # somewhere in the round
    a.proc.wait(30)
    syncing.wait(60)
    a.notify.close()
    a2 = _start(short_tmp / "a", s3_endpoint, bucket)
    b = _start(short_tmp / "b", s3_endpoint, bucket)
    try:
        _sync(a2)
        _sync(b)
        with Client(b.socket) as cb:
            assert len(cb.get("notes", "inbox", b"big")) == 20 * 1024 * 1024
            assert cb.get("notes", "inbox", b"small") == b"s"
    finally:
        assert a2.stop() == 0 and b.stop() == 0


def test_background_poll_and_debounce_sync_without_asking(
    short_tmp: Path, s3_endpoint: str, bucket: str
) -> None:
    env = {
        **AWS,
        "LEDGERD_ENDPOINT_URL": s3_endpoint,
        "LEDGERD_SYNC_INTERVAL": "0.3",
        "LEDGERD_SYNC_DEBOUNCE": "0.05",
    }
    a = start_daemon(short_tmp / "a", "--cloud", f"s3://{bucket}/bg", env=env)
    b = start_daemon(short_tmp / "b", "--cloud", f"s3://{bucket}/bg", env=env)
    try:
        with Client(a.socket) as ca, Client(b.socket) as cb:
            ca.put("notes", "inbox", b"k", b"arrives by itself")
            deadline = time.monotonic() + 30
            while True:  # wait for the condition, bounded
                with contextlib.suppress(NotFoundError):  # not there yet
                    if cb.get("notes", "inbox", b"k") == b"arrives by itself":
                        break
                assert time.monotonic() < deadline, "background sync never delivered"
                time.sleep(0.1)
    finally:
        assert a.stop() == 0 and b.stop() == 0


def test_sync_reports_why_it_cannot_finish(short_tmp: Path, daemon: Daemon) -> None:
    out = daemon.ledgerctl("sync")
    assert out.returncode == 4 and b"cloud sync is off" in out.stderr
    with socket.socket() as s:  # nothing listens here
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**AWS, "LEDGERD_ENDPOINT_URL": f"http://127.0.0.1:{port}"}
    d = start_daemon(short_tmp / "x", "--cloud", "s3://nowhere/x", env=env)
    try:
        with Client(d.socket) as c:
            c.put("notes", "inbox", b"k", b"v")
        out = d.ledgerctl("sync", "--timeout", "3")
        assert out.returncode != 0
        # One line for the failure, after those that said what was being retried.
        *retrying, failed = out.stderr.strip().splitlines()
        assert all(x.startswith(b"retrying: ") for x in retrying), out.stderr
        assert b"sync" in failed and b"last error" in failed, out.stderr
        assert b"connect" in failed.lower()  # the reason
    finally:
        assert d.stop() == 0


def test_status_names_a_refused_pack_and_sync_fails_with_it(
    short_tmp: Path, s3_endpoint: str, bucket: str
) -> None:
    a = _start(short_tmp / "a", s3_endpoint, bucket)
    b = _start(short_tmp / "b", s3_endpoint, bucket)
    try:
        with Client(a.socket) as ca:
            ca.put("notes", "inbox", b"k", b"v")
        _sync(a)
        s3 = boto3.client(
            "s3",
            endpoint_url=s3_endpoint,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        device = json.loads(a.ledgerctl("status", "--json", check=True).stdout)["device_id"]
        # A pack of a's (sequence 9) whose section of notes/other is not readable.
        bad = pack.Section(b"notes", b"other", [], [(b"", b"x")])
        now = int(time.time() * 1000)
        data, head_end, eager_end = pack.encode(bytes.fromhex(device), 9, now, [bad])
        junk = "e2e/" + PackName.make(now, device, 9, head_end, eager_end).name
        s3.put_object(Bucket=bucket, Key=junk, Body=data)
        out = b.ledgerctl("sync", "--timeout", "30")
        assert out.returncode != 0 and b"refused" in out.stderr
        st = json.loads(b.ledgerctl("status", "--json", check=True).stdout)
        assert [p["pack"] for p in st["sync"]["packs"]] == [junk.removeprefix("e2e/")]
        assert st["sync"]["packs"][0]["page_text"] == "other"  # a page that is not open
        assert st["sync"]["gaps"] and st["sync_error"]
        with Client(b.socket) as cb:
            assert cb.get("notes", "inbox", b"k") == b"v"  # the rest came down
    finally:
        assert a.stop() == 0 and b.stop() == 0


def test_a_write_is_readable_on_another_daemon_within_a_second(
    short_tmp: Path, s3_endpoint: str, bucket: str
) -> None:
    """Default settings (no sync settings in the environment): the median time from a
    write on one daemon to the value being readable on another is under a second."""
    env = {**AWS, "LEDGERD_ENDPOINT_URL": s3_endpoint}
    a = start_daemon(short_tmp / "a", "--cloud", f"s3://{bucket}/fast", env=env)
    b = start_daemon(short_tmp / "b", "--cloud", f"s3://{bucket}/fast", env=env)
    try:
        latencies = []
        with Client(a.socket) as ca, Client(b.socket) as cb:
            for i in range(9):
                value = b"value %d" % i
                t0 = time.monotonic()
                ca.put("notes", "inbox", b"k", value)
                while True:  # wait for the condition, bounded
                    with contextlib.suppress(NotFoundError):
                        if cb.get("notes", "inbox", b"k") == value:
                            break
                    assert time.monotonic() - t0 < 60, "never arrived"
                    time.sleep(0.01)
                latencies.append(time.monotonic() - t0)
        latencies.sort()
        assert latencies[len(latencies) // 2] < 1.0, latencies
        st = json.loads(b.ledgerctl("status", "--json", check=True).stdout)["sync"]
        assert st["last_round"]["list"] >= 1 and st["requests"]["get"] >= 1
    finally:
        assert a.stop() == 0 and b.stop() == 0


def test_a_watch_announces_a_lazy_value_not_on_this_device(short_tmp: Path) -> None:
    """A LAZY value that came through sync and was never read here is announced with
    ``value`` and ``size`` null (docs/storage.md, "Writes"): the clients' watches give
    it as an Item with size None, and ``ledgerctl watch`` prints it, instead of failing
    on ``int(None)``."""
    from tests.daemon.test_cli import Watcher

    env = {"LEDGERD_SYNC_INTERVAL": "60"}
    cloud = f"file://{short_tmp}/bucket"
    a = start_daemon(short_tmp / "a", "--cloud", cloud, env=env)
    b = start_daemon(short_tmp / "b", "--cloud", cloud, env=env)
    watchers: list[Watcher] = []
    try:
        with Client(a.socket) as ca, Client(b.socket) as cb:
            cb.put("notes", "inbox", b"init", b"0")
            watch = cb.subscribe("notes", "inbox")
            watchers = [Watcher(b, "notes", "inbox"), Watcher(b, "notes", "inbox", "--json")]
            deadline = time.monotonic() + 60
            for n in itertools.count():  # until both ledgerctl watches are subscribed
                cb.put("notes", "inbox", b"sentinel", b"%d" % n)
                soon = time.monotonic() + 0.5
                if all(
                    w.read_until(lambda s: "sentinel" in s or "c2VudGluZWw=" in s, soon) is not None
                    for w in watchers
                ):
                    break
                assert time.monotonic() < deadline, "the watchers never started"
            ca.put("notes", "inbox", b"photo", os.urandom(300_000), lazy=True)
            _sync(a)
            _sync(b)
            for change in watch:
                photo = [i for i in change.changed if i.key == b"photo"]
                if photo:
                    break
            assert photo[0].value is None and photo[0].size is None
            assert photo[0].priority == "lazy"
            watch.close()
            text, js = watchers
            seen: list[str] = []

            def photo_line(line: str) -> bool:
                seen.append(line)
                return line.startswith("put\tphoto\t") or '"key":"cGhvdG8="' in line

            assert text.read_until(photo_line, deadline) is not None
            assert seen[-1] == "put\tphoto\t<not on this device>"
            assert js.read_until(photo_line, deadline) is not None
            doc = json.loads(seen[-1])
            assert (doc["value"], doc["size"], doc["priority"]) == (None, None, "lazy")
            assert len(cb.get("notes", "inbox", b"photo")) == 300_000  # fetched when read
    finally:
        for w in watchers:
            w.stop()
        assert a.stop() == 0 and b.stop() == 0
