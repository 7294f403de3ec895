"""``ledgerctl gc`` and ``du`` against a running daemon: history retention, the space
given back, purge (the bytes of a deleted key leave the files), ``history_pruned``."""

from __future__ import annotations

import json
import os
import random
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ledgerd.daemon.client import Client, LedgerError
from ledgerd.store.repo.repository import encode_name
from ledgerd.store.sqlite.schema import FORMAT_VERSION
from tests.daemon.conftest import Daemon, start_daemon

FORMAT_DIR = str(FORMAT_VERSION)
"""The directory of the data directory's pages (``{data}/{FORMAT_VERSION}/ledgers``)."""

MiB = 1024 * 1024


def _page_files(d: Daemon, ledger: bytes, page: bytes) -> list[Path]:
    db = d.data / FORMAT_DIR / "ledgers" / encode_name(ledger) / encode_name(page) / "page.sqlite"
    return [p for p in (db, db.with_name("page.sqlite-wal")) if p.exists()]


def _start(short_tmp: Path, gc_interval: str) -> Daemon:
    """A daemon syncing to a folder, keeping no history, collecting every
    ``gc_interval`` seconds (0: only when asked)."""
    return start_daemon(
        short_tmp,
        "--cloud",
        f"file://{short_tmp}/bucket",
        env={
            "LEDGERD_SYNC_INTERVAL": "60",
            "LEDGERD_HISTORY_RETENTION": "0",
            "LEDGERD_GC_INTERVAL": gc_interval,
        },
    )


@pytest.fixture
def d(short_tmp: Path) -> Iterator[Daemon]:
    daemon = _start(short_tmp, "0")
    yield daemon
    assert daemon.stop() == 0, daemon.log_text()


def test_gc_after_a_synced_bulk_load_gives_the_space_back(d: Daemon) -> None:
    rng = random.Random(3)
    with Client(d.socket) as c:
        for _ in range(30):
            c.batch("bulk", "p", [(rng.randbytes(16), rng.randbytes(100)) for _ in range(500)])
        history = c.history("bulk", "p", limit=1000)
        first = history[-2]["id"]  # the first load's commit (the last is the empty page's)
        c.sync()
        before = sum(p.stat().st_size for p in _page_files(d, b"bulk", b"p"))
        out = d.ledgerctl("gc", "bulk", "p", "--json")
        assert out.returncode == 0, out.stderr.decode()
        doc = json.loads(out.stdout)
        # All but the head and the empty page's first commit.
        assert doc["commits_pruned"] == len(history) - 2 > 1 and doc["bytes_freed"] > 0, doc
        (page,) = [json.loads(x) for x in d.ledgerctl("du", "bulk", "--json").stdout.splitlines()]
        assert page["entries"] == 30 * 500
        after = sum(p.stat().st_size for p in _page_files(d, b"bulk", b"p"))
        assert after < before / 2, (before, after)
        assert page["file_bytes"] == after and page["synced"] and page["retained_commits"] == 1
        assert after <= 2 * page["live_bytes"] + MiB, page
        with pytest.raises(LedgerError) as e:
            c.get("bulk", "p", b"anything", at=first)
        assert (e.value.code, e.value.status) == ("history_pruned", 410)
    text = d.ledgerctl("gc").stdout.decode()
    assert text.splitlines()[-1].startswith("collected 1 page: 0 commits pruned"), text
    assert f"1 of {len(history)} commits kept, synced" in d.ledgerctl("du").stdout.decode()


def test_a_deleted_key_leaves_no_byte_in_the_files_once_collected(d: Daemon) -> None:
    secret = b"SECRET-" + os.urandom(24).hex().encode()  # once in the value, nowhere else
    big = secret + os.urandom(200_000)  # several chunks, the first holds the secret
    with Client(d.socket) as c:
        c.put("notes", "inbox", b"keep", b"k" * 500)
        c.put("notes", "inbox", b"small", secret)
        c.put("notes", "inbox", b"big", big)
        c.sync()
        files = b"".join(p.read_bytes() for p in _page_files(d, b"notes", b"inbox"))
        assert secret in files  # (the test would prove nothing otherwise)
        c.delete("notes", "inbox", b"small")
        c.delete("notes", "inbox", b"big")
        c.sync()
        assert d.ledgerctl("gc", "notes", "inbox").returncode == 0
        assert c.get("notes", "inbox", b"keep") == b"k" * 500
    for path in _page_files(d, b"notes", b"inbox"):
        assert secret not in path.read_bytes(), path


def test_the_daemon_collects_in_the_background(short_tmp: Path) -> None:
    d = _start(short_tmp, "0.1")
    try:
        with Client(d.socket) as c:
            for i in range(3):
                c.put("notes", "inbox", b"k", b"version %d " % i * 20)
                c.history("notes", "inbox")  # (flushes: one commit each)
            c.sync()
            deadline = time.monotonic() + 30
            while c.du("notes", "inbox")["pages"][0]["pruned_commits"] < 2:
                assert time.monotonic() < deadline, d.log_text()[-3000:]
            assert c.get("notes", "inbox", b"k") == b"version 2 " * 20
            metrics = c.metrics()
            assert "ledgerd_gc_pruned_commits_total" in metrics
    finally:
        assert d.stop() == 0, d.log_text()


def test_ledgerctl_evict(d: Daemon) -> None:
    with Client(d.socket) as c:
        c.put("notes", "inbox", b"k", b"v" * 100)
        # A transaction holds the page. (Being unsynced is not a refusal that can be
        # waited for here: a write's upload starts at once, and on a loaded machine it
        # could finish before the evict. tests/store/test_eviction.py covers it.)
        with c.transaction("notes", "inbox") as txn:
            assert txn.get(b"k") == b"v" * 100
            with pytest.raises(LedgerError) as e:
                c.evict("notes", "inbox")
            assert (e.value.code, e.value.status) == ("not_evictable", 409)
            assert "in use" in str(e.value)
        c.sync()
    out = d.ledgerctl("evict", "notes", "inbox")  # synced now; closed if idle
    assert out.returncode == 0, out
    page_dir = d.data / FORMAT_DIR / "ledgers" / encode_name(b"notes") / encode_name(b"inbox")
    assert not (page_dir / "page.sqlite").exists()  # its storage is gone
    # du lists nothing of an evicted page (that would fetch it back), so its logical
    # size is unknown: '?' and null, not '0 entries' (before: 0 bytes, 0 entries).
    shown = d.ledgerctl("du", "notes", "inbox")
    assert shown.returncode == 0, shown
    assert re.fullmatch(
        r" +\? +\? entries  notes/inbox  \(on disk .*evicted.*\)\n", shown.stdout.decode()
    )
    (doc,) = [json.loads(x) for x in d.ledgerctl("du", "notes", "--json").stdout.splitlines()]
    assert (doc["entries"], doc["key_bytes"], doc["value_bytes"]) == (None, None, None)
    assert doc["evicted"] is True and not (page_dir / "page.sqlite").exists()
    with Client(d.socket) as c:  # the next use brings it back from the bucket
        assert c.get("notes", "inbox", b"k") == b"v" * 100
