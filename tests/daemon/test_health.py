"""Health for probes, and a status that tells the truth about sync."""

from __future__ import annotations

import time
from pathlib import Path

from ledgerd.daemon.client import Client, LedgerError
from tests.daemon.conftest import Daemon, start_daemon


def test_health_of_a_daemon_without_cloud(daemon: Daemon) -> None:
    with Client(daemon.socket) as c:
        h = c.health()
        assert h["status"] == "ok" and h["up"] and h["repository"]["open"]
        assert h["sync"] == {"enabled": False, "state": "off"}
        assert c.health(sync=True)["status"] == "ok"


def test_a_missing_bucket_is_not_synced_and_health_says_why(short_tmp: Path) -> None:
    bucket = short_tmp / "bucket"
    d = start_daemon(short_tmp, "--cloud", f"file://{bucket}", env={"LEDGERD_SYNC_INTERVAL": "60"})
    try:
        with Client(d.socket) as c:
            c.put("notes", "inbox", b"k", b"v")
            c.sync()
            h = c.health(sync=True)
            assert h["status"] == "ok" and h["sync"]["healthy"] and h["sync"]["synced"], h
            assert c.status()["sync"]["synced"] is True
            bucket.rename(short_tmp / "moved")  # an unmounted share, a moved folder
            c.put("notes", "inbox", b"k2", b"v2")
            try:
                c.sync()
            except LedgerError as e:
                assert e.code == "bucket_marker_missing" and e.status == 503
            h = c.health()
            assert h["status"] == "degraded" and not h["sync"]["healthy"], h
            assert any("marker" in r for r in h["sync"]["reasons"]), h
            assert h["sync"]["synced"] is False
            st = c.status()["sync"]
            assert st["synced"] is False
            assert _problems(st["reasons"]) == _problems(h["sync"]["reasons"])
            strict = c.health(sync=True)
            assert strict["status"] == "degraded"

            async def raw() -> int:
                async with c.aio.session.get(c.url("/v1/health?sync=1")) as resp:
                    return resp.status

            assert c._call(raw()) == 503
            (short_tmp / "moved").rename(bucket)
            c.sync()
            assert c.health(sync=True)["sync"]["synced"] is True
    finally:
        assert d.stop() == 0, d.log_text()


def test_an_unreachable_endpoint_is_a_reason_while_the_round_retries(short_tmp: Path) -> None:
    # A round retries transient failures for up to a minute: meanwhile health and
    # status say what is failing, not only that no round has finished.
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:1",  # nothing listens there
    }
    d = start_daemon(short_tmp, "--cloud", "s3://bucket/x", env=env)
    try:
        with Client(d.socket) as c:
            c.put("notes", "inbox", b"k", b"v")
            assert c.get("notes", "inbox", b"k") == b"v"  # local writes go on
            deadline = time.monotonic() + 20
            while True:
                reasons = c.health()["sync"]["reasons"]
                if any(
                    "cannot reach http://127.0.0.1:1 (connection refused)" in r for r in reasons
                ):
                    break
                assert time.monotonic() < deadline, reasons
                time.sleep(0.2)
            assert _problems(c.status()["sync"]["reasons"]) == _problems(reasons)
            text = d.ledgerctl("status").stdout.decode()
            assert "cannot reach http://127.0.0.1:1 (connection refused)" in text, text
    finally:
        assert d.stop() == 0, d.log_text()


def _problems(reasons: list[str]) -> list[str]:
    """The reasons but the pages waiting for upload, which come and go between two
    calls as rounds take them and fail."""
    return [r for r in reasons if not r.endswith("waiting for upload")]
