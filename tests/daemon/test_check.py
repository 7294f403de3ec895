"""``ledgerctl check``: damage made to a stopped daemon's files is found and repaired."""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ledgerd.daemon.client import Client, LedgerError
from ledgerd.store.pieces import digest as dg
from ledgerd.store.repo.repository import encode_name
from ledgerd.store.sqlite.schema import FORMAT_VERSION
from tests.daemon.conftest import Daemon, start_daemon

FORMAT_DIR = str(FORMAT_VERSION)
"""The directory of the data directory's pages (``{data}/{FORMAT_VERSION}/ledgers``)."""

VALUE = os.urandom(4000)  # under split.MIN_CHUNK: one chunk, stored as one piece (5,000
# random bytes were cut in two now and then, and the tests below missed their piece)
DIGEST = dg.chunk_digest(dg.Kind.VALUE, VALUE)


def _start(base: Path) -> Daemon:
    return start_daemon(
        base, "--cloud", f"file://{base}/bucket", env={"LEDGERD_SYNC_INTERVAL": "60"}
    )


def _page_file(d: Daemon, ledger: bytes = b"notes", page: bytes = b"inbox") -> Path:
    return d.data / FORMAT_DIR / "ledgers" / encode_name(ledger) / encode_name(page) / "page.sqlite"


@pytest.fixture
def synced(short_tmp: Path) -> Iterator[Daemon]:
    """A daemon that wrote VALUE and other pages, synced, and stopped."""
    d = _start(short_tmp)
    with Client(d.socket) as c:
        c.put("notes", "inbox", b"photo", VALUE)
        c.put("notes", "inbox", b"note", b"n" * 100)
        c.put("notes", "other", b"k", b"v" * 100)
        c.sync()
    assert d.stop() == 0, d.log_text()
    yield d


def _check(d: Daemon, *args: str) -> tuple[int, str]:
    out = d.ledgerctl("check", *args)
    assert out.returncode in (0, 1), out.stderr.decode()
    return out.returncode, out.stdout.decode()


def _restart_check_and_repair(d: Daemon) -> None:
    d2 = _start(d.data.parent)
    try:
        code, text = _check(d2)
        assert code == 1, text
        assert "notes inbox: DAMAGED" in text and DIGEST.hex() in text, text
        assert "notes other" not in text  # the healthy page is not listed
        code, text = _check(d2, "notes", "inbox", "--repair")
        assert code == 0, text
        assert "ok (repaired)" in text, text
        with Client(d2.socket) as c:
            assert c.get("notes", "inbox", b"photo") == VALUE
        code, text = _check(d2, "--json")
        assert code == 0 and json.loads(text)["healthy"], text
    finally:
        assert d2.stop() == 0, d2.log_text()


def test_a_flipped_byte_is_found_and_restored_from_the_bucket(synced: Daemon) -> None:
    path = _page_file(synced)
    raw = bytearray(path.read_bytes())
    at = raw.find(VALUE[1000:1100])
    assert at > 0 and raw.find(VALUE[1000:1100], at + 1) == -1
    raw[at + 10] ^= 0x01
    path.write_bytes(bytes(raw))
    _restart_check_and_repair(synced)


def test_a_damaged_tree_node_is_reported_as_damage_and_rebuilt_from_the_bucket(
    synced: Daemon,
) -> None:
    """A flipped byte in the tree node that holds the keys failed the page's open,
    so ``check --repair`` said "1 problem, 0 repaired" (an open that failed names no
    piece) and ``get`` exit 4. The page now opens, the piece is named, the tree is
    rebuilt from the bucket, and reads before the repair say the data is damaged."""
    conn = sqlite3.connect(_page_file(synced), isolation_level=None)
    try:
        rows = conn.execute(  # the tree nodes that hold the key "photo": the head's leaf
            "SELECT id, digest, data FROM objects WHERE instr(data, ?) > 0", (b"photo",)
        ).fetchall()
        nodes = [r for r in rows if dg.kind_of(bytes(r[1])) is dg.Kind.TREE]
        assert nodes, rows
        for row_id, _, blob in nodes:
            data = bytearray(blob)
            data[data.find(b"photo")] ^= 0x01
            conn.execute("UPDATE objects SET data = ? WHERE id = ?", (bytes(data), row_id))
    finally:
        conn.close()
    d = _start(synced.data.parent)
    try:
        out = d.ledgerctl("get", "notes", "inbox", "note")
        assert out.returncode == 5, out
        err = out.stderr.decode()
        assert err.startswith("ledgerctl: damaged data: ") and "(corrupt)" in err, err
        assert "check --repair" in err and "cannot reach" not in err, err
        code, text = _check(d, "notes", "inbox")
        assert code == 1 and "corrupt_piece: tree node piece" in text, text
        code, text = _check(d, "notes", "inbox", "--repair")
        assert code == 0 and "ok (repaired)" in text and " 0 problems" in text, text
        with Client(d.socket) as c:
            assert c.get("notes", "inbox", b"note") == b"n" * 100
            assert c.get("notes", "inbox", b"photo") == VALUE
    finally:
        assert d.stop() == 0, d.log_text()


def test_a_damaged_tree_is_rebuilt_when_two_commits_went_up_in_one_pack(
    short_tmp: Path,
) -> None:
    """The bucket holds states as they were uploaded, not every commit: two commits
    uploaded in one pack come back as one, so the first one's damaged tree could not
    be made again and ``check --repair`` ended "1 problem" (missing tree node) whenever
    the first upload round started after the second put. That commit's history is
    now pruned and the page is healthy."""
    d = start_daemon(short_tmp)  # no cloud yet: both commits wait for one upload
    with Client(d.socket) as c:
        c.put("notes", "inbox", b"photo", VALUE)
        deadline = time.monotonic() + 30
        while len(c.history("notes", "inbox")) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)  # the photo's own commit (after the first one)
        c.put("notes", "inbox", b"note", b"n" * 100)
    assert d.stop() == 0, d.log_text()
    d = _start(short_tmp)
    with Client(d.socket) as c:
        assert len(c.history("notes", "inbox")) == 3
        c.sync()
    assert d.stop() == 0, d.log_text()
    conn = sqlite3.connect(_page_file(d), isolation_level=None)
    try:
        rows = conn.execute("SELECT id, digest, data FROM objects").fetchall()
        nodes = [r for r in rows if dg.kind_of(bytes(r[1])) is dg.Kind.TREE and b"photo" in r[2]]
        assert len(nodes) == 2, rows  # the leaf of each commit
        for row_id, _, blob in nodes:
            data = bytearray(blob)
            data[data.find(b"photo")] ^= 0x01
            conn.execute("UPDATE objects SET data = ? WHERE id = ?", (bytes(data), row_id))
    finally:
        conn.close()
    d = _start(short_tmp)
    try:
        code, text = _check(d, "notes", "inbox", "--repair")
        assert code == 0 and "ok (repaired)" in text and " 0 problems" in text, text
        assert "1 older commits" in text, text
        with Client(d.socket) as c:
            assert c.get("notes", "inbox", b"note") == b"n" * 100
            assert c.get("notes", "inbox", b"photo") == VALUE
        code, text = _check(d, "--json")
        assert code == 0 and json.loads(text)["healthy"], text
    finally:
        assert d.stop() == 0, d.log_text()


def test_a_missing_piece_is_found_and_restored_from_the_bucket(synced: Daemon) -> None:
    conn = sqlite3.connect(_page_file(synced), isolation_level=None)
    try:
        assert conn.execute("DELETE FROM objects WHERE digest = ?", (DIGEST,)).rowcount == 1
    finally:
        conn.close()
    _restart_check_and_repair(synced)


def test_what_the_bucket_lost_is_found_with_cloud_and_uploaded_again(synced: Daemon) -> None:
    packs = sorted((synced.data.parent / "bucket" / "packs").glob("*"))  # every page's
    assert packs
    for p in packs:
        p.unlink()
    d = _start(synced.data.parent)
    try:
        code, text = _check(d)
        assert code == 0, text  # nothing local is wrong
        code, text = _check(d, "notes", "--cloud")
        assert code == 1, text
        assert "not_in_cloud" in text and DIGEST.hex() in text, text
        code, text = _check(d, "notes", "--cloud", "--repair")
        assert code == 0, text
        assert list((d.data.parent / "bucket" / "packs").glob("*"))  # uploaded again
        code, text = _check(d, "--cloud")
        assert code == 0, text
    finally:
        assert d.stop() == 0, d.log_text()


def test_bad_check_requests_are_refused(synced: Daemon) -> None:
    d = _start(synced.data.parent)
    try:
        assert d.ledgerctl("check", "nope").returncode == 1  # no such ledger: not found
        assert d.ledgerctl("check", "notes", "nope").returncode == 1
        with Client(d.socket) as c:
            bodies: list[object] = [
                {"cloud": "yes"},
                {"page": "cA=="},
                {"ledger": "%%%"},
                [],
                {"x": 1},
            ]
            for body in bodies:
                resp = c._call(_post(c, body))
                assert resp == 400, body
    finally:
        assert d.stop() == 0, d.log_text()


async def _post(c: Client, body: object) -> int:
    resp = await c.aio.session.post(c.url("/v1/check"), json=body)
    async with resp:
        return resp.status


def test_a_page_written_by_a_newer_ledgerd_is_refused_with_its_own_code(synced: Daemon) -> None:
    """A page file whose schema version is above this ledgerd's (a newer one wrote it):
    its reads are 500 ``schema_too_new`` (not ``internal``, which says a bug) with no
    traceback, the file is left as it is, and the other pages are served."""
    f = _page_file(synced)
    with sqlite3.connect(f) as conn:
        conn.execute("PRAGMA user_version = 999")
    conn.close()
    d2 = _start(synced.data.parent)
    try:
        with Client(d2.socket) as c:
            with pytest.raises(LedgerError) as e:
                c.get("notes", "inbox", b"note")
            assert (e.value.code, e.value.status) == ("schema_too_new", 500), e.value
            assert "newer" in str(e.value)
            assert c.get("notes", "other", b"k") == b"v" * 100
    finally:
        assert d2.stop() == 0, d2.log_text()
    assert "Traceback" not in d2.log_text()
    with sqlite3.connect(f) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 999
    conn.close()


def test_check_says_in_text_when_it_read_no_bucket(short_tmp: Path) -> None:
    """``--cloud`` on a daemon without cloud sync: the note that no bucket was read is in
    the text output (it was only in ``--json``), and the verdict does not claim the
    bucket; a healthy page's note is printed once."""
    d = start_daemon(short_tmp / "d")
    try:
        with Client(d.socket) as c:
            c.put("notes", "inbox", b"k", b"v")
            c.put("notes", "other", b"k", b"v")
        code, text = _check(d, "--cloud")
        assert code == 0, text
        assert text.count("note: cloud sync is off") == 1, text
        assert text.splitlines()[-1].startswith("checked 2 pages: healthy"), text
    finally:
        assert d.stop() == 0


def test_a_page_file_truncated_to_nothing_is_refused_and_listed_by_check(
    synced: Daemon,
) -> None:
    """A page.sqlite cut to 0 bytes (disk trouble) opened as a new, empty page: its
    keys gone without a word. Its reads are now 500 ``corrupt``, check lists it as
    damaged, the file is left as it is, and the other pages are served."""
    f = _page_file(synced)
    for side in f.parent.iterdir():
        if side != f:
            side.unlink()
    f.write_bytes(b"")
    d2 = _start(synced.data.parent)
    try:
        with Client(d2.socket) as c:
            with pytest.raises(LedgerError) as e:
                c.get("notes", "inbox", b"note")
            assert (e.value.code, e.value.status) == ("corrupt", 500), e.value
            assert "empty" in str(e.value)
            assert c.get("notes", "other", b"k") == b"v" * 100
        code, text = _check(d2)
        assert code == 1 and "notes inbox: DAMAGED" in text and "empty" in text, text
        assert "notes other" not in text
    finally:
        assert d2.stop() == 0, d2.log_text()
    assert f.stat().st_size == 0


def test_check_names_document_records_that_do_not_decode(short_tmp: Path) -> None:
    """``ledgerctl check`` walked a document page's pieces, all sound, and called it
    healthy while a record did not decode (only a listing named it, in ``damaged``)
    and another was of a newer ledgerd's layout. Now it reads the head's records and
    names both (``damaged_document``, ``unsupported_layout``: exit 1, the page's
    pieces not called damaged); ``--repair`` leaves them as they are; once the damaged
    one is purged, only the other is left."""
    import msgpack

    from ledgerd.store.documents import doclayout
    from ledgerd.store.documents.docmodel import RevClock, parse_ulid

    d = _start(short_tmp)
    try:
        with Client(d.socket) as c:
            docs = c.documents("app", "people")
            ids = [docs.create("c", {"n": i})["_meta"]["_id"] for i in range(5)]
            bad, newer = (doclayout.body_key("c", parse_ulid(i)) for i in ids[1:3])
            c.put("app", "people", bad, b"\x93not a record")
            rev = RevClock().next()
            c.put("app", "people", newer, msgpack.packb([2, rev, {"n": "new"}]))
            head = doclayout.encode_head(rev, doclayout.State.LIVE)
            c.put("app", "people", doclayout.head_key("c", parse_ulid(ids[2])), head)
            c.put("notes", "inbox", b"k", b"v")
            c.heads("app", "people")  # (commits the journal)
        code, text = _check(d)
        assert code == 1, text
        assert "app people: DOCUMENTS NOT READABLE" in text, text
        assert f"damaged_document: document {ids[1]} in 'c' is damaged" in text, text
        assert f"unsupported_layout: document {ids[2]} in 'c'" in text, text
        assert "notes inbox" not in text and "piece" not in text, text
        code, text = _check(d, "app", "people", "--json")
        page = json.loads(text)["pages"][0]
        found = sorted((p["code"], p["digest"]) for p in page["problems"])
        assert found == [("damaged_document", None), ("unsupported_layout", None)], found
        assert all(p["key"] for p in page["problems"]), page  # (each names its body's key)
        assert page["documents"] == 5 and not page["healthy"], page
        code, text = _check(d, "app", "people", "--repair")
        assert code == 1 and "DOCUMENTS NOT READABLE" in text, text
        with Client(d.socket) as c:
            docs = c.documents("app", "people")
            damaged: list[dict[str, object]] = []
            listed = list(docs.list_documents("c", on_damaged=damaged.append))
            assert len(listed) == 3 and [x["_id"] for x in damaged] == ids[1:3]
            docs.purge("c", ids[1])
        code, text = _check(d, "app", "people", "--json")
        page = json.loads(text)["pages"][0]
        assert [p["code"] for p in page["problems"]] == ["unsupported_layout"], page
    finally:
        assert d.stop() == 0, d.log_text()


def test_a_page_whose_file_is_gone_but_its_wal_remains_is_listed_by_check(
    short_tmp: Path,
) -> None:
    """A page.sqlite lost while its -wal remains is refused as damaged when used, but
    with no page.sqlite it was in no listing, so ``ledgerctl check`` passed over it
    ("healthy"). It is now listed as damaged, with the ``sqlite`` code other refused
    pages get, checked alone too, and its -wal is left as it is."""
    d = start_daemon(short_tmp / "d")
    with Client(d.socket) as c:
        c.put("notes", "inbox", b"k", b"v" * 100)
        c.put("notes", "other", b"k", b"v" * 100)
        wal = _page_file(d).with_name("page.sqlite-wal").read_bytes()
    assert d.stop() == 0, d.log_text()
    f = _page_file(d)
    for side in f.parent.iterdir():
        side.unlink()
    f.with_name("page.sqlite-wal").write_bytes(wal)
    d2 = start_daemon(short_tmp / "d")
    try:
        code, text = _check(d2)
        assert code == 1 and "notes inbox: DAMAGED" in text and "remains" in text, text
        assert "notes other" not in text
        code, text = _check(d2, "--json")
        report = json.loads(text)
        assert code == 1 and not report["healthy"] and report["checked_pages"] == 2, text
        [damaged] = [p for p in report["pages"] if p["problems"]]
        assert [x["code"] for x in damaged["problems"]] == ["sqlite"], damaged
        code, text = _check(d2, "notes", "inbox")
        assert code == 1 and "notes inbox: DAMAGED" in text, text
        with Client(d2.socket) as c:
            with pytest.raises(LedgerError) as e:  # (a read too: see test_lost_pages)
                c.put("notes", "inbox", b"k", b"w")
            assert (e.value.code, e.value.status) == ("corrupt", 500), e.value
            assert c.get("notes", "other", b"k") == b"v" * 100
    finally:
        assert d2.stop() == 0, d2.log_text()
    assert f.with_name("page.sqlite-wal").read_bytes() == wal and not f.exists()


def test_check_of_a_body_key_whose_id_is_not_a_ulid_is_not_internal(short_tmp: Path) -> None:
    """A body key whose id is over 16 bytes, written through the key API into a
    document page with a body that is no record, made the check fail as a whole:
    ``POST /v1/check`` answered 500 ``internal``. It is named as a damaged document."""
    from ledgerd.store.documents import doclayout

    d = _start(short_tmp)
    try:
        with Client(d.socket) as c:
            c.documents("app", "people").create("c", {"n": 1})
            c.put("app", "people", doclayout.body_key("c", b"\xff" * 20), b"\x93not a record")
            c.heads("app", "people")  # (commits the journal)
        code, text = _check(d, "app", "people", "--json")
        page = json.loads(text)["pages"][0]
        assert code == 1 and [p["code"] for p in page["problems"]] == ["damaged_document"], text
    finally:
        assert d.stop() == 0, d.log_text()
