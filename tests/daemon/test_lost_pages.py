"""A lost page (its page.sqlite gone, its -wal left) through the real daemon: every
route answers 500 ``corrupt``, a restart keeps it, and DELETE removes what remains."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ledgerd.daemon.client import Client, LedgerError
from ledgerd.store.repo.repository import encode_name
from ledgerd.store.sqlite.schema import FORMAT_VERSION
from tests.daemon.conftest import Daemon, start_daemon

FORMAT_DIR = str(FORMAT_VERSION)
"""The directory of the data directory's pages (``{data}/{FORMAT_VERSION}/ledgers``)."""


def _page_dir(d: Daemon, ledger: bytes = b"notes", page: bytes = b"inbox") -> Path:
    return d.data / FORMAT_DIR / "ledgers" / encode_name(ledger) / encode_name(page)


def _lose(base: Path) -> tuple[Path, bytes, str]:
    """A daemon wrote notes/inbox (a key and a document) and notes/other, and stopped;
    then inbox's page.sqlite went, its -wal staying."""
    d = start_daemon(base)
    with Client(d.socket) as c:
        c.put("notes", "inbox", b"k", b"v" * 100)
        doc_id = c.documents("notes", "inbox").create("c", {"n": 1})["_meta"]["_id"]
        c.put("notes", "other", b"k", b"v" * 100)
        wal = _page_dir(d) / "page.sqlite-wal"
        held = wal.read_bytes()
    assert d.stop() == 0, d.log_text()
    for f in wal.parent.iterdir():
        f.unlink()
    wal.write_bytes(held)
    return wal, held, doc_id


def _corrupt(call: Callable[[], Any]) -> str:
    with pytest.raises(LedgerError) as e:
        call()
    assert (e.value.code, e.value.status) == ("corrupt", 500), e.value
    assert "page.sqlite-wal remains" in str(e.value) and "kept" in str(e.value), e.value
    return str(e.value)


def test_every_use_of_a_lost_page_answers_corrupt(short_tmp: Path) -> None:
    # A read answered 404 page_not_found (no page.sqlite: "no such page") while a write
    # answered 500 corrupt; du and gc of it said page_not_found too.
    wal, held, doc_id = _lose(short_tmp)
    d = start_daemon(short_tmp)
    try:
        with Client(d.socket) as c:
            _corrupt(lambda: c.get("notes", "inbox", b"k"))
            _corrupt(lambda: list(c.entries("notes", "inbox")))
            _corrupt(lambda: c.heads("notes", "inbox"))
            _corrupt(lambda: c.history("notes", "inbox"))
            _corrupt(lambda: c.policy("notes", "inbox"))
            _corrupt(lambda: c.delete("notes", "inbox", b"k"))
            _corrupt(lambda: c.put("notes", "inbox", b"k", b"w"))
            _corrupt(lambda: c.documents("notes", "inbox").get("c", doc_id))
            _corrupt(lambda: list(c.documents("notes", "inbox").list_documents("c")))
            _corrupt(lambda: c.evict("notes", "inbox"))
            [du] = c.du("notes", "inbox")["pages"]
            assert "page.sqlite-wal remains" in du["error"], du
            assert [p.get("error", "") for p in c.du()["pages"]] == [du["error"], ""]
            [gc] = c.gc("notes", "inbox")["errors"]
            assert "page.sqlite-wal remains" in gc["message"], gc
            assert c.get("notes", "other", b"k") == b"v" * 100
    finally:
        assert d.stop() == 0, d.log_text()
    assert wal.read_bytes() == held and not wal.with_name("page.sqlite").exists()


def test_a_restart_after_a_write_to_a_lost_page_keeps_its_wal(short_tmp: Path) -> None:
    # The refused write had marked the page unwritten; the next start took it for a
    # page whose making was cut short and removed its directory, -wal included.
    wal, held, _ = _lose(short_tmp)
    d = start_daemon(short_tmp)
    with Client(d.socket) as c:
        _corrupt(lambda: c.put("notes", "inbox", b"k", b"w"))
        _corrupt(lambda: c.documents("notes", "inbox").create("c", {"n": 2}))
    assert d.stop() == 0, d.log_text()
    d = start_daemon(short_tmp)
    try:
        assert wal.read_bytes() == held
        out = d.ledgerctl("check", "notes", "inbox")
        assert out.returncode == 1 and b"notes inbox: DAMAGED" in out.stdout, out
    finally:
        assert d.stop() == 0, d.log_text()
    assert wal.read_bytes() == held


def test_deleting_a_lost_page_removes_what_remains_and_frees_its_name(short_tmp: Path) -> None:
    wal, _, _ = _lose(short_tmp)
    d = start_daemon(short_tmp)
    try:
        with Client(d.socket) as c:
            c.delete_page("notes", "inbox")
            assert not wal.parent.exists()
            assert c.pages("notes") == [b"other"]
            c.put("notes", "inbox", b"k", b"new")  # a write makes it anew
            assert c.get("notes", "inbox", b"k") == b"new"
            with pytest.raises(LedgerError) as e:
                c.delete_page("notes", "gone")
            assert e.value.code == "page_not_found", e.value
        out = d.ledgerctl("check")
        assert out.returncode == 0, out
    finally:
        assert d.stop() == 0, d.log_text()
