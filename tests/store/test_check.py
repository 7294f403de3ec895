"""The integrity check of a page: what it finds on disk, and the local repairs."""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from ledgerd.store import Page, Priority, Repository
from ledgerd.store.documents.docmodel import parse_ulid
from ledgerd.store.errors import CorruptObjectError
from ledgerd.store.page import check as ck
from ledgerd.store.pieces import digest as dg
from ledgerd.store.sqlite.schema import FORMAT_VERSION


async def _page_with_data(root: Path) -> tuple[Repository, bytes, bytes]:
    repo = await Repository.open(root)
    page = await repo.ledger("l").page("p")
    big = os.urandom(300_000)  # several chunks under an index
    await page.put(b"big", big, Priority.LAZY)
    await page.put(b"small", b"s" * 1000)
    for i in range(200):
        await page.put(b"k%03d" % i, b"v" * 40 + b"%d" % i)
    await page.flush()
    entry = await page.get_entry(b"small")
    assert entry is not None
    return repo, big, entry.value


async def test_a_healthy_page_has_no_problem(tmp_path: Path) -> None:
    repo, _, _ = await _page_with_data(tmp_path)
    try:
        page = await repo.ledger("l").page("p")
        report = await ck.check_page(page)
        assert report.healthy and report.problems == []
        assert report.commits >= 2 and report.stored > 10 and report.reachable > 10
    finally:
        await repo.close()


@contextlib.contextmanager
def _db(root: Path) -> Iterator[sqlite3.Connection]:
    """The page file of ``root``'s only page, open for damage (the repository closed)."""
    conn = sqlite3.connect(
        next(root.glob(f"{FORMAT_VERSION}/ledgers/*/*/page.sqlite")), isolation_level=None
    )
    try:
        yield conn
    finally:
        conn.close()


@contextlib.asynccontextmanager
async def _reopened(root: Path) -> AsyncIterator[Page]:
    """The page, in the repository opened again (after its file was damaged)."""
    repo = await Repository.open(root)
    try:
        yield await repo.ledger("l").page("p")
    finally:
        await repo.close()


async def test_corrupt_missing_and_transient_pieces_are_named(tmp_path: Path) -> None:
    repo, _, small = await _page_with_data(tmp_path)
    await repo.close()
    with _db(tmp_path) as conn:
        data = conn.execute("SELECT data FROM objects WHERE digest = ?", (small,)).fetchone()[0]
        flipped = bytes([data[0] ^ 1]) + data[1:]
        conn.execute("UPDATE objects SET data = ? WHERE digest = ?", (flipped, small))
        # A chunk of the big value, gone; a tree node made transient.
        big_chunk = conn.execute(
            "SELECT digest FROM objects WHERE length(data) > 4000 AND digest != ? LIMIT 1",
            (small,),
        ).fetchone()[0]
        conn.execute("DELETE FROM objects WHERE digest = ?", (big_chunk,))
        node = conn.execute("SELECT root FROM commits ORDER BY generation DESC").fetchone()[0]
        conn.execute(
            "INSERT OR REPLACE INTO unsynced (id, status) "
            "SELECT id, 0 FROM objects WHERE digest = ?",
            (node,),
        )
        conn.execute("DELETE FROM heads")
    async with _reopened(tmp_path) as page:
        report = await ck.check_page(page)
        codes = {p.code: p for p in report.problems}
        assert not report.healthy
        assert codes[ck.CORRUPT_PIECE].digest == small
        assert codes[ck.CORRUPT_PIECE].key == b"small"
        assert codes[ck.MISSING_PIECE].digest == bytes(big_chunk)
        assert codes[ck.MISSING_PIECE].key == b"big"
        assert codes[ck.TRANSIENT_PIECE].digest == bytes(node)
        assert dg.short(small) in codes[ck.CORRUPT_PIECE].message
        assert report.bad_pieces() == [small, bytes(big_chunk)] or set(report.bad_pieces()) == {
            small,
            bytes(big_chunk),
        }
        await ck.repair_local(page, report)
        # A repair with the bytes, as sync brings them back from the cloud.
        assert await ck.restore_pieces(page, {small: b"s" * 1000}) == [small]
        again = await ck.check_page(page)
        assert {p.code for p in again.problems} == {ck.MISSING_PIECE}
        assert await page.get(b"small") == b"s" * 1000


async def test_heads_that_disagree_with_the_commits_are_rebuilt(tmp_path: Path) -> None:
    repo, _, _ = await _page_with_data(tmp_path)
    await repo.close()
    with _db(tmp_path) as conn:
        head = conn.execute("SELECT commit_id FROM heads").fetchone()[0]
        conn.execute("DELETE FROM heads")  # the page opens on its first, empty commit
    async with _reopened(tmp_path) as page:
        assert await page.get_entry(b"small") is None
        report = await ck.check_page(page)
        assert [p.code for p in report.problems] == [ck.HEADS]
        await ck.repair_local(page, report)
        assert report.healthy
        assert (await ck.check_page(page)).problems == []
        assert [h.id for h in await page.heads()] == [bytes(head)]
        assert await page.get(b"small") == b"s" * 1000


async def test_a_digest_stored_twice_is_named_and_its_second_row_dropped(tmp_path: Path) -> None:
    """No constraint keeps a digest to one row since schema version 2: the check finds
    a second row (a scan of the prefix index) and the local repair keeps the first, local
    if either was."""
    repo, _, small = await _page_with_data(tmp_path)
    await repo.close()
    with _db(tmp_path) as conn:
        first = conn.execute("SELECT id FROM objects WHERE digest = ?", (small,)).fetchone()[0]
        conn.execute("DELETE FROM unsynced WHERE id = ?", (first,))  # synced
        conn.execute(
            "INSERT INTO objects (digest, data) SELECT digest, data FROM objects WHERE id = ?",
            (first,),
        )
        conn.execute("INSERT INTO unsynced (id, status) SELECT max(id), 1 FROM objects")
    async with _reopened(tmp_path) as page:
        assert await page.get(b"small") == b"s" * 1000  # either row reads
        report = await ck.check_page(page)
        assert [(p.code, p.digest) for p in report.problems] == [(ck.DUPLICATE_PIECE, small)]
        await ck.repair_local(page, report)
        assert report.healthy and (await ck.check_page(page)).problems == []
        assert await page.get(b"small") == b"s" * 1000
        rows = await page.db.read_all(
            "SELECT o.id, status FROM piece_status o WHERE digest = ?", (small,)
        )
        assert [tuple(r) for r in rows] == [(first, 1)]  # the first, local as the second was


async def test_requeue_makes_synced_pieces_and_writes_pending_again(tmp_path: Path) -> None:
    repo, _, small = await _page_with_data(tmp_path)
    try:
        page = await repo.ledger("l").page("p")
        from ledgerd.store.page import exchange as ex

        up = await ex.pending_delta(page)
        assert up is not None
        await ex.mark_uploaded(page, up)
        assert await ex.pending_delta(page) is None
        assert small in await ck.synced_pieces(page)
        done = await ck.requeue(page, [small, b"\x00" + b"x" * 32], -1)
        assert done == [small]
        again = await ex.pending_delta(page)  # every write of this device goes up again
        assert again is not None and small in again.eager
        assert [e[0] for e in again.entries] == [e[0] for e in up.entries]
    finally:
        await repo.close()


async def test_commit_rows_holding_values_of_the_wrong_type_are_reported(tmp_path: Path) -> None:
    """Garbage in the commits table (a text generation, an integer root, a text row in
    heads or commit_parents) is reported as problems; the check does not fail."""
    repo, _, _ = await _page_with_data(tmp_path)
    await repo.close()
    with _db(tmp_path) as conn:
        head = bytes(conn.execute("SELECT commit_id FROM heads").fetchone()[0])
        conn.execute("UPDATE commits SET generation = 'x', root = 12 WHERE id = ?", (head,))
        conn.execute("INSERT INTO commit_parents VALUES ('child', 7)")
    async with _reopened(tmp_path) as page:
        report = await ck.check_page(page)
        assert not report.healthy
        assert any(p.code == ck.COMMIT and p.commit == head for p in report.problems)
        assert {p.code for p in report.problems} >= {ck.COMMIT}
        assert await page.get(b"small") == b"s" * 1000


async def test_heads_naming_no_stored_commit_are_found_and_rebuilt(tmp_path: Path) -> None:
    """A heads row naming a commit that is not stored (or not even a blob) does not keep
    the page from opening: it opens on the heads that are there, the check reports
    `heads` and the local repair rebuilds them, as for an empty heads table."""
    repo, _, _ = await _page_with_data(tmp_path)
    await repo.close()
    with _db(tmp_path) as conn:
        head = bytes(conn.execute("SELECT commit_id FROM heads").fetchone()[0])
        conn.execute("INSERT INTO heads VALUES (?, 5)", (b"\x01" * 32,))
        conn.execute("INSERT INTO heads VALUES ('garbage', 6)")
    async with _reopened(tmp_path) as page:
        assert await page.get(b"small") == b"s" * 1000
        assert [h.id for h in await page.heads()] == [head]
        report = await ck.check_page(page)
        assert {p.code for p in report.problems} == {ck.HEADS}
        await ck.repair_local(page, report)
        assert report.healthy
        assert (await ck.check_page(page)).problems == []
    with _db(tmp_path) as conn:
        conn.execute("UPDATE heads SET commit_id = ?", (b"\x02" * 32,))  # the only head
    async with _reopened(tmp_path) as page:
        report = await ck.check_page(page)
        assert [p.code for p in report.problems] == [ck.HEADS]
        await ck.repair_local(page, report)
        assert [h.id for h in await page.heads()] == [head]
        assert await page.get(b"small") == b"s" * 1000


async def test_damaged_journal_entries_are_not_committed_into_the_tree(tmp_path: Path) -> None:
    """A crash's implicit journal is committed when the page opens; entries a damaged
    file made unusable (a value that is no digest, a priority that is none, a key that
    is not a blob) are left out, so no commit holds an undecodable tree node, and the
    good entries are committed."""
    repo, _, _ = await _page_with_data(tmp_path)
    await repo.close()
    good = dg.chunk_digest(dg.Kind.VALUE, b"ok")
    assert dg.is_inline(good)
    with _db(tmp_path) as conn:
        conn.execute("INSERT INTO journals VALUES ('I1', 0, NULL)")
        conn.executemany(
            "INSERT INTO journal_entries VALUES ('I1', ?, ?, ?)",
            [
                (b"good", good, 0),
                (b"bad digest", b"\x1c" + b"x" * 32, 0),
                (b"empty digest", b"", 0),
                (b"bad priority", good, 7),
                ("text key", good, 0),
            ],
        )
    async with _reopened(tmp_path) as page:
        assert await page.get(b"good") == b"ok"
        for key in (b"bad digest", b"empty digest", b"bad priority", b"text key"):
            assert await page.get_entry(key) is None
        assert len((await page.entries()).items) == 203
        report = await ck.check_page(page)
        assert report.problems == []


async def test_a_stored_piece_that_is_not_a_blob_reads_as_corrupt(tmp_path: Path) -> None:
    """An objects row whose data a damaged file turned into text is a CorruptObjectError
    to a read, as a flipped byte is (not a TypeError), and the check names it."""
    repo, _, small = await _page_with_data(tmp_path)
    await repo.close()
    with _db(tmp_path) as conn:
        conn.execute("UPDATE objects SET data = 'text' WHERE digest = ?", (small,))
    async with _reopened(tmp_path) as page:
        with pytest.raises(CorruptObjectError, match=dg.short(small)):
            await page.get(b"small")
        with pytest.raises(CorruptObjectError, match=dg.short(small)):
            await page.entries()
        report = await ck.check_page(page)
        assert [(p.code, p.digest) for p in report.problems] == [(ck.CORRUPT_PIECE, small)]


async def test_document_records_that_do_not_decode_are_named_not_their_pieces(
    tmp_path: Path,
) -> None:
    """A document record that does not decode was found only by listings (in
    ``damaged``): the check walked its pieces, which are sound, and called the page
    healthy. Now the head's records are read: a damaged one is ``damaged_document``,
    one of a newer ledgerd's layout ``unsupported_layout``, each naming its document
    and key, no piece; a large record (several pieces) is read whole; a record
    damaged only in the history, and a page that holds no documents, are not
    reported; a record whose piece is corrupt is that piece's problem alone."""
    import msgpack

    from ledgerd.store import DocumentStore
    from ledgerd.store.documents import doclayout
    from ledgerd.store.documents.docmodel import RevClock, parse_ulid

    async with await Repository.open(tmp_path) as repo:
        page = await repo.ledger("l").page("p")
        docs = await DocumentStore.open(page)
        made = await docs.create_many("c", [{"n": i} for i in range(300)])
        large = await docs.create("c", {"text": os.urandom(300_000).hex()})
        ids = [d.id for d in made]
        bad, newer, healed = (doclayout.body_key("c", parse_ulid(i)) for i in ids[:3])
        await page.write([(bad, b"\x93not a record"), (healed, b"\x93not a record")])
        rev = RevClock().next()
        await page.write(
            [
                (newer, msgpack.packb([2, rev, {"n": "new"}])),
                (
                    doclayout.head_key("c", parse_ulid(ids[1])),
                    doclayout.encode_head(rev, doclayout.State.LIVE),
                ),
            ]
        )
        await page.flush()
        await docs.purge("c", ids[2])  # damaged in the history only
        other = await repo.ledger("l").page("keys")  # no marker: not a document page
        await other.put(doclayout.body_key("c", parse_ulid(ids[0])), b"\x93not a record")
        await other.flush()
        report = await ck.check_page(page)
        found = sorted((p.code, p.key, p.digest) for p in report.problems)
        assert found == [(ck.DAMAGED_DOCUMENT, bad, None), (ck.UNSUPPORTED_LAYOUT, newer, None)]
        messages = {p.code: p.message for p in report.problems}
        assert ids[0] in messages[ck.DAMAGED_DOCUMENT]
        assert ids[1] in messages[ck.UNSUPPORTED_LAYOUT]
        assert "layout 2" in messages[ck.UNSUPPORTED_LAYOUT]
        assert report.documents == 301 and report.bad_pieces() == [] and not report.healthy
        await ck.repair_local(page, report)  # nothing of it is repaired here
        assert not any(p.repaired for p in report.problems)
        keys_report = await ck.check_page(other)
        assert keys_report.healthy and keys_report.documents == 0
        big = await page.get_entry(doclayout.body_key("c", parse_ulid(large.id)))
        assert big is not None and dg.is_index(big.value)


async def test_a_document_record_with_a_corrupt_piece_is_the_piece_s_problem(
    tmp_path: Path,
) -> None:
    """A record whose piece does not match its digest is reported as that piece
    (``corrupt_piece``, to be repaired from the bucket), never as a damaged document."""
    from ledgerd.store import DocumentStore
    from ledgerd.store.documents import doclayout
    from ledgerd.store.documents.docmodel import parse_ulid

    async with await Repository.open(tmp_path) as repo:
        page = await repo.ledger("l").page("p")
        docs = await DocumentStore.open(page)
        doc = await docs.create("c", {"text": "x" * 2000})
        key = doclayout.body_key("c", parse_ulid(doc.id))
        entry = await page.get_entry(key)
        assert entry is not None and not dg.is_inline(entry.value)
    with _db(tmp_path) as conn:
        data = conn.execute("SELECT data FROM objects WHERE digest = ?", (entry.value,)).fetchone()
        flipped = bytes([data[0][0] ^ 1]) + data[0][1:]
        conn.execute("UPDATE objects SET data = ? WHERE digest = ?", (flipped, entry.value))
    async with _reopened(tmp_path) as page:
        report = await ck.check_page(page)
        assert [(p.code, p.key) for p in report.problems] == [(ck.CORRUPT_PIECE, key)]
        assert report.bad_pieces() == [entry.value]


async def test_a_body_key_whose_id_is_not_a_ulid_is_named_not_a_crash(tmp_path: Path) -> None:
    """A document page's key API can write a body key whose id is not 16 bytes, with a
    body that is no record: the check named it with ulid_text, which fails (IndexError)
    on an id over 16 bytes, so the whole check failed (500 ``internal`` over HTTP)."""
    from ledgerd.store import DocumentStore
    from ledgerd.store.documents import doclayout

    async with await Repository.open(tmp_path) as repo:
        page = await repo.ledger("l").page("p")
        docs = await DocumentStore.open(page)
        await docs.create("c", {"n": 1})
        odd = doclayout.body_key("c", b"\xff" * 20)
        await page.put(odd, b"\x93not a record")
        await page.flush()
        report = await ck.check_page(page)
        assert [(p.code, p.key) for p in report.problems] == [(ck.DAMAGED_DOCUMENT, odd)]
        assert ("ff" * 20) in report.problems[0].message


async def test_a_body_key_whose_id_is_not_a_ulid_is_damaged_even_if_its_record_reads(
    tmp_path: Path,
) -> None:
    """A record that reads, under a body key whose id is not 16 bytes, passed the check
    (the page called healthy) while the documents API can show no document for it (it
    names it in ``damaged``). Now it is a damaged document too, its id's length said."""
    from ledgerd.store import DocumentStore
    from ledgerd.store.documents import doclayout

    async with await Repository.open(tmp_path) as repo:
        page = await repo.ledger("l").page("p")
        docs = await DocumentStore.open(page)
        made = await docs.create("c", {"n": 1})
        good = await page.get(doclayout.body_key("c", parse_ulid(made.id)))
        assert good is not None
        odd = doclayout.body_key("c", b"\x01\x02")
        await page.put(odd, good)
        await page.flush()
        report = await ck.check_page(page)
        assert [(p.code, p.key) for p in report.problems] == [(ck.DAMAGED_DOCUMENT, odd)]
        assert "id 0102 (not a ULID)" in report.problems[0].message
        assert "2 bytes, not 16" in report.problems[0].message


async def test_index_definitions_that_do_not_decode_are_named(tmp_path: Path) -> None:
    """An index definition of a newer ledgerd's layout, or a damaged one, was passed
    over by the check (its piece is sound): the page was called healthy. Now the
    head's definitions are read: ``unsupported_layout`` and ``damaged_index_definition``,
    each naming its index and key; a sound definition, one dropped since, and a
    document record count as before."""
    import msgpack

    from ledgerd.store import DocumentStore
    from ledgerd.store.documents import doclayout

    async with await Repository.open(tmp_path) as repo:
        page = await repo.ledger("l").page("p")
        docs = await DocumentStore.open(page)
        await docs.declare_index("c", "fine", "n")
        await docs.create("c", {"n": 1})
        newer, bad, gone = (doclayout.index_key("c", n) for n in ("newer", "bad", "gone"))
        await page.write(
            [
                (newer, msgpack.packb([2, {"partition": ["n"]}])),
                (bad, b"\x93not a definition"),
                (gone, b"\x93not a definition"),
            ]
        )
        await page.flush()
        await page.delete(gone)
        await page.flush()
        report = await ck.check_page(page)
        found = sorted((p.code, p.key, p.digest) for p in report.problems)
        assert found == [
            (ck.DAMAGED_INDEX_DEFINITION, bad, None),
            (ck.UNSUPPORTED_LAYOUT, newer, None),
        ]
        messages = {p.code: p.message for p in report.problems}
        assert "index 'bad' on 'c' is damaged" in messages[ck.DAMAGED_INDEX_DEFINITION]
        assert "index 'newer' on 'c'" in messages[ck.UNSUPPORTED_LAYOUT]
        assert "layout 2" in messages[ck.UNSUPPORTED_LAYOUT]
        assert report.documents == 1 and not report.healthy
