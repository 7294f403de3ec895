"""What a user and an operator see of sync: each page's ``sync`` state (``off`` without a
cloud, ``synced``, ``pending``) in ``ledgerctl du``, status, health and metrics."""

from __future__ import annotations

import json
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from ledgerd.daemon.client import Client
from tests.daemon.conftest import Daemon, start_daemon


def _metric(c: Client, name: str, **labels: str) -> float:
    async def get() -> str:
        async with c.aio.session.get(c.url("/v1/metrics")) as resp:
            assert resp.status == 200
            return await resp.text()

    for family in text_string_to_metric_families(c._call(get())):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    raise AssertionError(f"no metric {name}")


def _du(d: Daemon) -> tuple[str, dict[str, object]]:
    text = d.ledgerctl("du", "notes", "inbox", check=True).stdout.decode()
    (line,) = d.ledgerctl("du", "notes", "inbox", "--json", check=True).stdout.splitlines()
    return text, json.loads(line)


def test_without_a_cloud_every_output_says_local_only(daemon: Daemon) -> None:
    daemon.ledgerctl("put", "notes", "inbox", "k", "v", check=True)
    text, doc = _du(daemon)
    assert "local only" in text and "synced" not in text, text
    assert doc["sync"] == "off" and doc["synced"] is False, doc
    status = daemon.ledgerctl("status", check=True).stdout.decode()
    assert "cloud    off (sync is off: every page is local only)" in status, status
    st = json.loads(daemon.ledgerctl("status", "--json", check=True).stdout)
    assert [p["sync"] for p in st["open_pages"]] == ["off"], st
    with Client(daemon.socket) as c:
        assert c.health(sync=True)["sync"] == {"enabled": False, "state": "off"}
        assert _metric(c, "ledgerd_sync_enabled") == 0.0


def test_with_a_folder_bucket_pages_are_synced_or_pending(short_tmp: Path) -> None:
    bucket = short_tmp / "bucket"
    env = {"LEDGERD_SYNC_INTERVAL": "60"}
    d = start_daemon(short_tmp / "a", "--cloud", f"file://{bucket}", env=env)
    try:
        d.ledgerctl("put", "notes", "inbox", "k", "v", check=True)
        d.ledgerctl("sync", check=True)
        text, doc = _du(d)
        assert text.rstrip().endswith("kept, synced)") and doc["sync"] == "synced", (text, doc)
        st = json.loads(d.ledgerctl("status", "--json", check=True).stdout)
        assert [p["sync"] for p in st["open_pages"]] == ["synced"], st
        with Client(d.socket) as c:
            assert c.health()["sync"]["state"] == "synced"
            assert _metric(c, "ledgerd_sync_enabled") == 1.0
            bucket.rename(short_tmp / "moved")  # an unmounted share: nothing goes up
            d.ledgerctl("put", "notes", "inbox", "k2", "v2")
            assert d.ledgerctl("sync", "--timeout", "5").returncode == 4
            text, doc = _du(d)
            assert "not synced" in text and doc["sync"] == "pending", (text, doc)
            st = json.loads(d.ledgerctl("status", "--json", check=True).stdout)
            assert [p["sync"] for p in st["open_pages"]] == ["pending"], st
            assert c.health()["sync"]["state"] == "degraded"
    finally:
        assert d.stop() == 0, d.log_text()


def test_metrics_show_a_held_pack_that_fails_no_round(short_tmp: Path) -> None:
    # A pack that cannot be imported leaves every round "ok": only the sync gauges
    # tell a scraper that this device is stuck, and on what.
    bucket = short_tmp / "bucket"
    d = start_daemon(short_tmp / "a", "--cloud", f"file://{bucket}")
    try:
        d.ledgerctl("put", "notes", "inbox", "k", "v", check=True)
        d.ledgerctl("sync", check=True)
        with Client(d.socket) as c:
            assert _metric(c, "ledgerd_sync_healthy") == 1.0
            assert _metric(c, "ledgerd_sync_synced") == 1.0
            assert _metric(c, "ledgerd_sync_held_packs") == 0.0
            assert _metric(c, "ledgerd_sync_last_round_ok_timestamp_seconds") > 0
            name = f"packs/{int(time.time() * 1000):013d}.{'ab' * 16}.{3:016d}.96.200"
            (bucket / name).write_bytes(b"not a pack at all, by hand")
            assert d.ledgerctl("sync", "--timeout", "10").returncode == 4
            assert _metric(c, "ledgerd_sync_healthy") == 0.0
            assert _metric(c, "ledgerd_sync_held_packs", state="refused") == 1.0
            assert _metric(c, "ledgerd_sync_gaps") == 1.0  # its sequences 1 and 2
            assert _metric(c, "ledgerd_sync_pending_uploads") == 0.0
    finally:
        assert d.stop() == 0, d.log_text()


def test_status_after_a_restart_says_a_page_is_synced(short_tmp: Path) -> None:
    # The time of a page's last upload or import is kept in memory only: after a
    # restart the page's line said nothing, as if it had never synced.
    bucket = short_tmp / "bucket"
    env = {"LEDGERD_SYNC_INTERVAL": "60"}
    d = start_daemon(short_tmp / "a", "--cloud", f"file://{bucket}", env=env)
    try:
        d.ledgerctl("put", "notes", "inbox", "k", "v", check=True)
        d.ledgerctl("sync", check=True)
    finally:
        assert d.stop() == 0, d.log_text()
    d = start_daemon(short_tmp / "a", "--cloud", f"file://{bucket}", env=env)
    try:
        d.ledgerctl("get", "notes", "inbox", "k", check=True)  # opens the page
        text = d.ledgerctl("status", check=True).stdout.decode()
        assert "\npage     notes/inbox  synced" in text, text
    finally:
        assert d.stop() == 0, d.log_text()


def test_an_evicted_page_is_synced(short_tmp: Path) -> None:
    # Evicted, a page is not opened for du (that would fetch it back): its sync state
    # is still given, as for every other page (eviction needs it fully synced).
    d = start_daemon(short_tmp / "a", "--cloud", f"file://{short_tmp / 'bucket'}")
    try:
        d.ledgerctl("put", "notes", "inbox", "k", "v", check=True)
        d.ledgerctl("sync", check=True)
        d.ledgerctl("evict", "notes", "inbox", check=True)
        text, doc = _du(d)
        assert doc["evicted"] is True and doc["sync"] == "synced", doc
        assert "evicted" in text, text
    finally:
        assert d.stop() == 0, d.log_text()
