"""``ledgerctl status`` and ``GET /v1/status`` as issue 41 asks: every page the daemon
keeps (open or not, never a deleted one) with its sync state and the time it last synced,
bounded with a cursor; the devices sharing the bucket with their clocks; each conflict
with the commands that resolve it; and ``ledgerctl sync`` saying what it retries."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import aiohttp

from ledgerd.daemon.cli_status import status_lines
from ledgerd.daemon.client import AsyncClient
from tests.daemon.conftest import AWS, Daemon, _start, start_daemon
from tests.daemon.test_cli import run_on_pty

SYNCED_AT = re.compile(r"synced   last synced \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC \(\d+ s ago\)")


def _status(d: Daemon, *args: str) -> dict[str, Any]:
    return dict(json.loads(d.ledgerctl("status", "--json", *args, check=True).stdout))


def _lines(d: Daemon, *args: str) -> list[str]:
    return d.ledgerctl("status", *args, check=True).stdout.decode().splitlines()


def _page_line(lines: list[str], name: str) -> str:
    (line,) = [x for x in lines if re.match(rf"page     {re.escape(name)} ", x)]
    return line


def test_status_lists_closed_pages_with_their_last_sync_and_never_a_deleted_one(
    short_tmp: Path,
) -> None:
    bucket = short_tmp / "bucket"
    env = {"LEDGERD_SYNC_INTERVAL": "60"}
    d = start_daemon(short_tmp / "a", "--cloud", f"file://{bucket}", env=env)
    try:
        for page in ("inbox", "todo", "old"):
            d.ledgerctl("put", "notes", page, "k", "v", check=True)
        d.ledgerctl("put", "_local", "cfg", "k", "v", check=True)
        d.ledgerctl("sync", check=True)
        d.ledgerctl("rm", "--yes", "notes", "old", check=True)
        # Deleted but still open: neither the open pages nor the pages list it.
        st = _status(d)
        assert "old" not in [p["page_text"] for p in st["open_pages"]], st["open_pages"]
        assert "old" not in [p["page_text"] for p in st["pages"]], st["pages"]
    finally:
        assert d.stop() == 0, d.log_text()
    d = start_daemon(short_tmp / "a", "--cloud", f"file://{bucket}", env=env)
    try:
        d.ledgerctl("sync", check=True)  # (the round that looks at the pages used lately)
        d.ledgerctl("put", "notes", "todo", "k2", "v2", check=True)
        st = _status(d)
        assert st["open_pages"] and all(p["page_text"] == "todo" for p in st["open_pages"])
        pages = {(p["ledger_text"], p["page_text"]): p for p in st["pages"]}
        assert sorted(pages) == [("_local", "cfg"), ("notes", "inbox"), ("notes", "todo")]
        assert st["pages_total"] == 3 and st["pages_next"] is None
        inbox = pages["notes", "inbox"]
        # Closed, and its last sync time is the one recorded before the restart.
        assert not inbox["open"] and inbox["sync"] == "synced" and inbox["last_sync"], inbox
        assert pages["notes", "todo"]["open"] and pages["_local", "cfg"]["sync"] == "local"
        lines = _lines(d)
        assert SYNCED_AT.search(_page_line(lines, "notes/inbox")), lines
        assert "local    the _local ledger" in _page_line(lines, "_local/cfg")
        assert not [x for x in lines if "notes/old" in x], lines
        bucket.rename(short_tmp / "moved")  # an unmounted share: nothing goes up
        d.ledgerctl("put", "notes", "todo", "k3", "v3", check=True)
        assert d.ledgerctl("sync", "--timeout", "3").returncode == 4
        line = _page_line(_lines(d), "notes/todo")
        # Its upload failed: why, and when it last synced.
        assert re.search(
            r"error    NoBucketError: .*; last synced .* UTC \(\d+ s ago\)  open$", line
        )
    finally:
        assert d.stop() == 0, d.log_text()


async def test_pages_are_bounded_and_followed_with_a_token(daemon: Daemon) -> None:
    async with AsyncClient(daemon.socket) as c:
        for i in range(25):
            await c.put("notes", f"p{i:02d}", b"k", b"v")
        first = await c.status(pages_limit=10)
        assert len(first["pages"]) == 10 and first["pages_total"] == 25
        seen = [p["page_text"] for p in first["pages"]]
        token = first["pages_next"]
        while token:
            more = await c.status(pages_limit=10, pages_after=token)
            seen += [p["page_text"] for p in more["pages"]]
            token = more["pages_next"]
        assert seen == [f"p{i:02d}" for i in range(25)]
        assert (await c.status(pages_limit=0))["pages"] == []
    async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(daemon.socket))) as s:
        for bad in ("pages_limit=10001", "pages_limit=-1", "pages_after=AA%3D%3D"):
            async with s.get(f"http://ledgerd/v1/status?{bad}") as r:
                assert r.status == 400, (bad, await r.text())
    lines = _lines(daemon)
    pages = [x for x in lines if x.startswith("page     ")]
    assert len(pages) == 21 and pages[-1] == (
        "page     ... and 5 more pages (ledgerctl status --pages all, or --json --pages all)"
    ), lines
    assert len([x for x in _lines(daemon, "--pages", "all") if x.startswith("page")]) == 25
    assert len(_status(daemon, "--pages", "all")["pages"]) == 25
    assert len(_status(daemon, "--pages", "3")["pages"]) == 3
    assert daemon.ledgerctl("status", "--pages", "0").returncode == 2


def test_devices_sharing_the_bucket_and_a_conflict_with_its_commands(
    short_tmp: Path, s3_endpoint: str, bucket: str
) -> None:
    a = _start(short_tmp / "a", s3_endpoint, bucket)
    b = _start(short_tmp / "b", s3_endpoint, bucket)
    try:
        for d in (a, b):
            d.ledgerctl("policy", "notes", "inbox", "automatic_with_fallback", check=True)
        a.ledgerctl("put", "notes", "inbox", "k", "from a", check=True)
        b.ledgerctl("put", "notes", "inbox", "k", "from b", check=True)
        a.ledgerctl("sync", check=True)
        b.ledgerctl("sync", check=True)
        st = _status(b)
        own, other = st["devices"]
        assert own["this_device"] and own["device"] == st["device_id"]
        assert own["last_pack_at"] is not None
        assert other["device"] == _status(a)["device_id"] and not other["this_device"]
        assert other["last_pack_at"] and other["clock_ahead_s"] is not None, other
        (conflict,) = st["conflicts"]
        assert conflict["ledger_text"] == "notes" and conflict["page_text"] == "inbox"
        assert conflict["keys"] == 1 and conflict["waiting"], conflict
        assert conflict["resolver_connected"] is False
        lines = _lines(b)
        assert re.fullmatch(
            rf"device   {st['device_id']}  this device, newest pack \S+ \S+ UTC \(\d+ s ago\)",
            lines[1],
        ), lines
        (dev,) = [x for x in lines if x.startswith(f"device   {other['device']}")]
        assert re.search(r"clock (not behind|at most \d+ s behind) this one", dev), dev
        assert re.search(r"newest pack \S+ \S+ UTC \(\d+ s ago\)", dev), dev
        assert (
            "conflict notes/inbox  1 key waits for a resolver (no resolver connected)"
            "  \u2192 ledgerctl conflicts notes inbox; "
            "ledgerctl resolve notes inbox KEY --take ours|theirs|VALUE"
        ) in lines, lines
        # Closed (here by a restart), the page's conflicts are those of its last sync.
        assert b.stop() == 0, b.log_text()
        b = _start(short_tmp / "b", s3_endpoint, bucket)
        st = _status(b)
        assert st["open_pages"] == [], st["open_pages"]
        (conflict,) = st["conflicts"]
        assert conflict["keys"] == 1 and conflict["waiting"] and not conflict["open"]
        (page,) = st["pages"]
        assert page["conflicts"] == 1 and not page["open"], page
        assert (
            "conflict notes/inbox  1 key waits for a resolver (no resolver connected) at its "
            "last sync  \u2192 ledgerctl conflicts notes inbox; "
            "ledgerctl resolve notes inbox KEY --take ours|theirs|VALUE"
        ) in _lines(b)
    finally:
        for d in (a, b):
            assert d.stop() == 0, d.log_text()


def test_sync_says_what_it_retries_and_why(short_tmp: Path) -> None:
    env = {**AWS, "LEDGERD_ENDPOINT_URL": "http://127.0.0.1:9", "LEDGERD_SYNC_INTERVAL": "60"}
    d = start_daemon(short_tmp / "a", "--cloud", "s3://nowhere/p", env=env)
    try:
        d.ledgerctl("put", "notes", "inbox", "k", "v", check=True)
        out = d.ledgerctl("sync", "--timeout", "4")
        assert out.returncode == 4
        err = out.stderr.decode()
        (said,) = [x for x in err.splitlines() if x.startswith("retrying: ")]
        assert re.fullmatch(
            r"retrying: TransientCloudError: list \S+: cannot reach http://127.0.0.1:9 "
            r"\(connection refused\); (next try in \d+ s|trying again now)",
            said,
        ), err
        quiet = d.ledgerctl("sync", "--timeout", "2", "--quiet")
        assert quiet.returncode == 4 and "retrying" not in quiet.stderr.decode()
    finally:
        assert d.stop() == 0, d.log_text()


def test_on_a_terminal_the_retry_line_goes_above_the_progress_bar(short_tmp: Path) -> None:
    env = {**AWS, "LEDGERD_ENDPOINT_URL": "http://127.0.0.1:9", "LEDGERD_SYNC_INTERVAL": "60"}
    d = start_daemon(short_tmp / "a", "--cloud", "s3://nowhere/p", env=env)
    try:
        d.ledgerctl("put", "notes", "inbox", "k", "v", check=True)
        code, shown = run_on_pty(d, "sync", "--timeout", "4")
        assert code == 4
        text = shown.decode()
        # The bar was drawn (0/1 pages), and the line that says why stands on its own.
        assert "0/1" in text, text
        assert re.search(r"(^|\r)retrying: [^\r\n]*cannot reach http://127\.0\.0\.1:9", text), text
    finally:
        assert d.stop() == 0, d.log_text()


def test_status_lines_read_as_the_issue_asks() -> None:
    page = {"ledger": "bm90ZXM=", "page": "aW5ib3g=", "ledger_text": "notes"}
    st = {
        "version": "0",
        "pid": 1,
        "device_id": "aa",
        "data_dir": "/data",
        "uptime_s": 1.0,
        "cloud": "s3://b/p",
        "sync_error": None,
        "sync": {},
        "open_pages": [],
        "devices": [
            {"device": "aa", "this_device": True, "last_pack_at": 988.0},
            {"device": "bb", "last_pack_at": 900.0, "clock_ahead_s": 3.4},
            {"device": "cc", "last_pack_at": None, "clock_ahead_s": None},
        ],
        "pages": [
            {**page, "sync": "synced", "last_sync": 988.0, "open": True},
            {**page, "page": "dG9kbw==", "sync": "pending", "last_sync": None},
            {**page, "page": "eA==", "sync": "error", "last_error": "disk full"},
        ],
        "pages_total": 4,
        "conflicts": [
            {**page, "keys": 2, "waiting": "2 keys need a conflict resolver", "policy": "custom"},
            {**page, "page": "/w==", "keys": 1, "waiting": None, "policy": "last_one_wins"},
        ],
    }
    assert status_lines(st, now=1000.0) == [
        "ledgerd 0 (pid 1), up 1s",
        "device   aa  this device, newest pack 1970-01-01 00:16:28 UTC (12 s ago)",
        "data     /data",
        "cloud    s3://b/p",
        "device   bb  clock at least 3 s ahead of this one, "
        "newest pack 1970-01-01 00:15:00 UTC (100 s ago)",
        "device   cc  clock unknown (none of its writes imported since ledgerd started), "
        "no pack listed",
        "page     notes/inbox  synced   last synced 1970-01-01 00:16:28 UTC (12 s ago)  open",
        "page     notes/todo   pending  waiting for upload, never synced",
        "page     notes/x      error    disk full",
        "page     ... and 1 more page (ledgerctl status --pages all, or --json --pages all)",
        "conflict notes/inbox  2 keys wait for a resolver (no resolver connected)  \u2192 "
        "ledgerctl conflicts notes inbox; ledgerctl resolve notes inbox KEY --take "
        "ours|theirs|VALUE",
        # A name that is not UTF-8 goes in hex, and so does the other (--hex takes both).
        "conflict notes/hex:ff  1 key holds concurrent values (reads show the winner, "
        "last_one_wins)  \u2192 ledgerctl --hex conflicts 6e6f746573 ff; "
        "ledgerctl --hex resolve 6e6f746573 ff KEY --take ours|theirs|VALUE",
    ]
