"""The document layer's operations through the embedded API, and bad input."""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import weakref
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from ledgerd.store import (
    AttachmentNotFoundError,
    ClosedError,
    DocumentConflictError,
    DocumentNotFoundError,
    DocumentStore,
    DocumentTooLargeError,
    HeldBudget,
    IndexNotFoundError,
    InvalidArgumentError,
    InvalidDocumentError,
    InvalidIdError,
    InvalidNameError,
    Page,
    Repository,
    RevisionInFutureError,
    RevisionInPastError,
    StoreError,
)
from ledgerd.store.documents import docindex, doclayout
from ledgerd.store.documents.doclayout import State
from ledgerd.store.documents.docmodel import RevClock, loads, ulid_text
from ledgerd.store.keys import tuple as tup
from ledgerd.store.page.gc import collect
from ledgerd.store.tree import btree, commit
from tests.exchanges import mark_all_uploaded


@pytest.fixture
async def page(tmp_path: Path) -> AsyncIterator[Page]:
    async with await Repository.open(tmp_path) as repo:
        yield await repo.ledger("app").page("docs")


async def _tree(page: Page) -> dict[bytes, bytes]:
    return {e.key: e.value for e in (await page.entries()).items}


async def test_create_get_replace_and_meta(page: Page) -> None:
    docs = await DocumentStore.open(page)
    assert await DocumentStore.open(page) is docs  # one per page
    a = await docs.create("notes", {"title": "hello", "tags": ["x"]})
    assert len(a.id) == 26 and len(a.rev) == 26
    got = await docs.get("notes", a.id)
    assert got == a
    j = got.to_json()
    assert set(j) == {"_meta", "_data", "_attachments"}
    assert j["_meta"]["_id"] == a.id and j["_meta"]["_rev"] == a.rev
    assert j["_meta"]["_createdAt"].endswith("Z") and "_updatedAt" not in j["_meta"]
    b = await docs.replace("notes", a.id, {"title": "hi"}, expected_rev=a.rev)
    assert b.rev > a.rev and b.created_at == a.created_at and b.updated_at is not None
    assert "_updatedAt" in b.to_json()["_meta"]
    assert (await docs.get("notes", a.id)).data == {"title": "hi"}
    # ids are given lowercase too (Crockford's base 32 is case-insensitive)
    assert (await docs.get("notes", a.id.lower())).rev == b.rev
    # A stale expected revision is a conflict, and stores nothing.
    before = page.head.id
    with pytest.raises(DocumentConflictError) as e:
        await docs.replace("notes", a.id, {"title": "lost"}, expected_rev=a.rev)
    assert e.value.code == "conflict"
    assert page.head.id == before
    # Without an expected revision, replace always applies.
    c = await docs.replace("notes", a.id, {"title": "forced"})
    assert c.rev > b.rev


async def test_soft_delete_hides_and_purge_keeps_a_tombstone(page: Page) -> None:
    docs = await DocumentStore.open(page)
    a = await docs.create("notes", {"n": 1})
    keep = await docs.create("notes", {"n": 2})
    d, att = await docs.put_attachment("notes", a.id, b"payload" * 1000, filename="p.bin")
    deleted = await docs.delete("notes", a.id, expected_rev=d.rev)
    assert deleted.deleted and deleted.deleted_at is not None
    assert deleted.to_json()["_meta"]["_deleted"] is True
    with pytest.raises(DocumentNotFoundError):
        await docs.get("notes", a.id)
    assert (await docs.get("notes", a.id, include_deleted=True)).data == {"n": 1}
    assert [x.id for x in (await docs.list_documents("notes")).items] == [keep.id]
    listed = await docs.list_documents("notes", include_deleted=True)
    assert [x.id for x in listed.items] == [a.id, keep.id]
    with pytest.raises(DocumentNotFoundError):  # a deleted document is not replaced
        await docs.replace("notes", a.id, {"n": 3})
    att_key = doclayout.attachment_key("notes", bytes.fromhex(_hex(a.id)), _raw(att.id))
    assert att_key in await _tree(page)  # a soft delete keeps the attachment
    purged = await docs.purge("notes", a.id)
    assert purged.purged and purged.data is None and purged.attachments == ()
    assert purged.rev > deleted.rev
    j = purged.to_json()["_meta"]
    assert j["_purged"] is True and "_purgedAt" in j and j["_deleted"] is True
    assert att_key not in await _tree(page)  # the content left the head
    tomb = await docs.get("notes", a.id, include_deleted=True)
    assert tomb.purged and tomb.data is None
    with pytest.raises(DocumentNotFoundError):
        await docs.purge("notes", a.id)


def _raw(text: str) -> bytes:
    from ledgerd.store.documents.docmodel import parse_ulid

    return parse_ulid(text)


def _hex(text: str) -> str:
    return _raw(text).hex()


async def test_listing_in_id_order_with_continuation(page: Page) -> None:
    docs = await DocumentStore.open(page)
    made = await docs.create_many("c", [{"i": i} for i in range(25)])
    await docs.create("other", {"i": -1})  # another collection is another range
    ids = [d.id for d in made]
    assert ids == sorted(ids)  # ids made by one device increase
    seen: list[str] = []
    token = None
    while True:
        res = await docs.list_documents("c", limit=10, token=token)
        seen += [d.id for d in res.items]
        token = res.token
        if token is None:
            break
    assert seen == ids
    await docs.delete("c", ids[3])
    assert len((await docs.list_documents("c", limit=1000)).items) == 24


async def test_revisions_supplied_by_a_client(page: Page) -> None:
    now = [1_800_000_000_000]
    clock = RevClock(lambda: now[0])
    docs = await DocumentStore.open(page, clock=clock, rev_tolerance=5)
    a = await docs.create("c", {"v": 1})
    # In the past of the current revision: refused, nothing stored.
    head = page.head.id
    with pytest.raises(RevisionInPastError) as e:
        await docs.replace("c", a.id, {"v": 2}, new_rev=a.rev)
    assert e.value.code == "conflict"
    from ulid import ULID

    future = str(ULID.from_timestamp((now[0] + 60_000) / 1000))
    with pytest.raises(RevisionInFutureError):
        await docs.replace("c", a.id, {"v": 2}, new_rev=future)
    assert page.head.id == head
    ok = str(ULID.from_timestamp((now[0] + 3_000) / 1000))
    b = await docs.replace("c", a.id, {"v": 2}, new_rev=ok)
    assert b.rev == ok
    # The device's clock now runs after that revision, though its wall clock is behind.
    c = await docs.replace("c", a.id, {"v": 3})
    assert c.rev > ok
    # A create has no current revision to be behind of: a document copied from another
    # store keeps its revision, however old (all zeros included); the next edit here
    # is newer.
    for old in (str(ULID.from_timestamp(1_500_000_000)), "0" * 26):
        d = await docs.create("c", {"v": 4}, new_rev=old)
        assert d.rev == old
        assert (await docs.replace("c", d.id, {"v": 5})).rev > old


async def test_a_slow_clock_still_writes_newer_revisions_once_it_read_newer_ones(
    page: Page,
) -> None:
    fast = RevClock(lambda: 2_000_000_000_000)
    docs = await DocumentStore.open(page, clock=fast)
    a = await docs.create("c", {"v": 1})
    await docs.close()
    slow = RevClock(lambda: 1_000_000_000_000)  # a restart with a clock far behind
    docs = await DocumentStore.open(page, clock=slow)
    other = await docs.create("c", {"v": 2})
    assert other.rev > a.rev  # the floor comes from the revisions in the page
    b = await docs.replace("c", a.id, {"v": 3})
    assert b.rev > a.rev


@pytest.mark.parametrize(
    "data, error",
    [
        ({"_secret": 1}, InvalidDocumentError),
        ({"x": float("nan")}, InvalidDocumentError),
        ({"x": 2**70}, InvalidDocumentError),
        ({1: "x"}, InvalidDocumentError),
        ({"x": b"bytes"}, InvalidDocumentError),
        ({"x": {1, 2}}, InvalidDocumentError),
        ({"x": ["\ud800"]}, InvalidDocumentError),  # half a UTF-16 pair: not UTF-8 text
        ({"x": {"\udfff": 1}}, InvalidDocumentError),
        ({"x": "y" * 2_000_000}, DocumentTooLargeError),
    ],
)
async def test_bad_documents_store_nothing(page: Page, data: Any, error: type[Exception]) -> None:
    docs = await DocumentStore.open(page)
    a = await docs.create("c", {"v": 1})
    before = page.head.id
    with pytest.raises(error) as e:
        await docs.create("c", data)
    assert isinstance(e.value, StoreError) and isinstance(e.value, InvalidArgumentError)
    with pytest.raises(error):
        await docs.replace("c", a.id, data)
    assert page.head.id == before
    assert (await docs.get("c", a.id)).data == {"v": 1}


async def test_deep_nesting_and_invalid_json_text() -> None:
    deep: Any = 1
    for _ in range(100):
        deep = [deep]
    from ledgerd.store.documents.docmodel import check_data

    with pytest.raises(InvalidDocumentError):
        check_data(deep)
    with pytest.raises(InvalidDocumentError):
        loads("{not json")
    with pytest.raises(InvalidDocumentError):
        loads("[NaN]")
    assert loads(b'{"a": [1, 2.5, null, true]}') == {"a": [1, 2.5, None, True]}


async def test_malformed_ids_names_and_tokens(page: Page) -> None:
    docs = await DocumentStore.open(page)
    a = await docs.create("c", {"v": 1})
    for bad in ["", "_design", "a\0b", "x" * 513, "é" * 257, "a\ud800"]:
        with pytest.raises(InvalidIdError) as e:
            await docs.get("c", bad)
        assert e.value.code == "invalid_id"
    for chosen in ["nope", "0" * 25, "U" * 26, "8" + "0" * 25, "x" * 512]:  # not ULIDs: ids
        with pytest.raises(DocumentNotFoundError):
            await docs.get("c", chosen)
    with pytest.raises(InvalidIdError):
        await docs.replace("c", a.id, {"v": 2}, expected_rev="garbage")
    for coll in ["", "_hidden", "x" * 200, "c\ud800"]:
        with pytest.raises(InvalidNameError):
            await docs.create(coll, {"v": 1})
        with pytest.raises(InvalidNameError):
            await docs.list_documents(coll)
    with pytest.raises(DocumentNotFoundError) as nf:
        await docs.get("c", ulid_text(bytes(16)))
    assert nf.value.code == "document_not_found"
    with pytest.raises(InvalidArgumentError):
        await docs.list_documents("c", limit=0)
    with pytest.raises(IndexNotFoundError) as ie:
        await docs.query("c", "nope", "x")
    assert ie.value.code == "index_not_found"
    await docs.declare_index("c", "by_v", "v")
    with pytest.raises(InvalidArgumentError):
        await docs.query("c", "by_v", 1, token=b"\xc1garbage")
    with pytest.raises(InvalidArgumentError):
        await docs.query("c", "by_v", 1, start=0)  # no sort key
    with pytest.raises(InvalidNameError):
        await docs.declare_index("c", "_primary", "v")
    with pytest.raises(InvalidArgumentError):
        await docs.declare_index("c", "bad_path", "_meta.x")


async def test_reserved_slash_in_indexed_values(page: Page) -> None:
    docs = await DocumentStore.open(page)
    await docs.declare_index("c", "by_path", "path")
    before = page.head.id
    with pytest.raises(InvalidDocumentError):
        await docs.create("c", {"path": "a/b"})
    assert page.head.id == before
    await docs.create("c", {"other": "a/b"})  # not an indexed field: fine


async def test_attachments_streamed_ranged_replaced_and_removed(page: Page) -> None:
    docs = await DocumentStore.open(page)
    a = await docs.create("c", {"v": 1})
    content = bytes(range(256)) * 4000  # about 1 MB, several chunks

    async def stream() -> AsyncIterator[bytes]:
        for i in range(0, len(content), 65536):
            yield content[i : i + 65536]

    d, att = await docs.put_attachment(
        "c", a.id, stream(), filename="photo.jpg", content_type="image/jpeg"
    )
    assert att.length == len(content) and att.content_type == "image/jpeg"
    assert d.attachments == (att,) and d.rev > a.rev
    assert d.to_json()["_attachments"] == [
        {"_id": att.id, "_filename": "photo.jpg", "_contentType": "image/jpeg", "_length": 1024000}
    ]
    whole = b"".join([c async for c in await docs.read_attachment("c", a.id, att.id)])
    assert whole == content
    part = b"".join([c async for c in await docs.read_attachment("c", a.id, att.id, 70000, 100)])
    assert part == content[70000:70100]
    entry = await page.get_entry(doclayout.attachment_key("c", _raw(a.id), _raw(att.id)))
    assert entry is not None and entry.priority.name == "LAZY"
    # Replace its content in place, with the same id.
    d2, att2 = await docs.put_attachment(
        "c", a.id, b"small", filename="s.txt", attachment_id=att.id
    )
    assert att2.id == att.id and att2.length == 5 and len(d2.attachments) == 1
    with pytest.raises(AttachmentNotFoundError):
        await docs.read_attachment("c", a.id, ulid_text(bytes(16)))
    with pytest.raises(DocumentConflictError):
        await docs.delete_attachment("c", a.id, att.id, expected_rev=d.rev)
    d3 = await docs.delete_attachment("c", a.id, att.id, expected_rev=d2.rev)
    assert d3.attachments == ()
    assert doclayout.attachment_key("c", _raw(a.id), _raw(att.id)) not in await _tree(page)


async def test_an_attachment_upload_does_not_hold_other_writes(page: Page) -> None:
    """The content streams in before the write lock: other documents are written
    meanwhile, and the attachment lands on the moved page without losing them."""
    docs = await DocumentStore.open(page)
    a = await docs.create("c", {"v": 1})
    gate = asyncio.Event()

    async def slow() -> AsyncIterator[bytes]:
        yield b"x" * 100_000
        await gate.wait()
        yield b"y" * 100_000

    upload = asyncio.create_task(docs.put_attachment("c", a.id, slow(), filename="f"))
    others = [await docs.create("c", {"v": i}) for i in range(3)]
    b = await docs.replace("c", a.id, {"v": 2})
    gate.set()
    d, att = await upload
    assert d.rev > b.rev and d.data == {"v": 2}
    assert len(await page.heads()) == 1
    for o in others:
        assert (await docs.get("c", o.id)).data == o.data
    got = b"".join([c async for c in await docs.read_attachment("c", a.id, att.id)])
    assert got == b"x" * 100_000 + b"y" * 100_000


async def test_indexes_query_in_order_with_continuation(page: Page) -> None:
    docs = await DocumentStore.open(page)
    await docs.declare_index("people", "by_city_age", "address.city", "age")
    made = await docs.create_many(
        "people",
        [{"address": {"city": c}, "age": a} for c, a in [("Paris", 30), ("Oslo", 20)] * 5]
        + [{"address": {"city": "Paris"}, "age": 2.5}, {"name": "no city"}],
    )
    res = await docs.query("people", "by_city_age", "Paris", limit=3)
    assert [d.data["age"] for d in res.items] == [2.5, 30, 30]
    all_paris = [d.id for d in res.items]
    while res.token:
        res = await docs.query("people", "by_city_age", "Paris", limit=3, token=res.token)
        all_paris += [d.id for d in res.items]
    assert len(all_paris) == 6 and len(set(all_paris)) == 6
    ranged = await docs.query("people", "by_city_age", "Paris", start=3, end=31)
    assert [d.data["age"] for d in ranged.items] == [30] * 5
    # Soft-deleted documents leave queries unless asked for; a purge leaves them.
    victim = made[0]
    await docs.delete("people", victim.id)
    assert victim.id not in [
        d.id for d in (await docs.query("people", "by_city_age", "Paris")).items
    ]
    with_deleted = await docs.query("people", "by_city_age", "Paris", include_deleted=True)
    assert victim.id in [d.id for d in with_deleted.items]
    await docs.purge("people", victim.id)
    with_deleted = await docs.query("people", "by_city_age", "Paris", include_deleted=True)
    assert victim.id not in [d.id for d in with_deleted.items]
    # An update moves a document in the index.
    moved = made[1]
    await docs.replace("people", moved.id, {"address": {"city": "Paris"}, "age": 99})
    assert (await docs.query("people", "by_city_age", "Paris", start=99)).items[0].id == moved.id
    info = await docs.indexes("people")
    assert [(i.name, i.partition, i.sort, i.ready) for i in info] == [
        ("by_city_age", "address.city", "age", True)
    ]


async def _by_k(docs: DocumentStore, deleted: bool = False) -> dict[int, list[str]]:
    return {
        k: [d.id for d in (await docs.query("c", "by_k", k, include_deleted=deleted)).items]
        for k in range(3)
    }


async def _scan_by_k(docs: DocumentStore, deleted: bool = False) -> dict[int, list[str]]:
    """What the index must hold: a scan of the documents, sorted by (v, id)."""
    listing = await docs.list_documents("c", limit=1000, include_deleted=deleted)
    live = [d for d in listing.items if not d.purged]
    return {
        k: [d.id for d in sorted(live, key=lambda d: (d.data["v"], d.id)) if d.data["k"] == k]
        for k in range(3)
    }


async def test_writes_keep_the_indexes_from_their_own_records(
    page: Page, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write whose commit follows the one the indexes reflect brings them up from the
    records it wrote (no tree diff, no body read back); when something else moved the
    head, the diff does. Both leave the index equal to a scan of the documents."""
    docs = await DocumentStore.open(page)
    await docs.declare_index("c", "by_k", "k", "v")
    await docs.create("c", {"k": 0, "v": 0.0})
    await docs.query("c", "by_k", 0)  # the index is built and ready
    diffs: list[object] = []
    real_diff = btree.diff

    def counting_diff(*args: Any) -> Any:
        diffs.append(args)
        return real_diff(*args)

    monkeypatch.setattr(btree, "diff", counting_diff)
    made = await docs.create_many("c", [{"k": i % 3, "v": (i * 7) % 10 / 10} for i in range(30)])
    await docs.replace("c", made[0].id, {"k": 2, "v": 0.05})
    await docs.delete("c", made[1].id)
    await docs.purge("c", made[2].id)
    d, a = await docs.put_attachment("c", made[3].id, b"x", filename="x")
    await docs.delete_attachment("c", made[3].id, a.id)
    assert await _by_k(docs) == await _scan_by_k(docs)
    assert await _by_k(docs, True) == await _scan_by_k(docs, True)
    assert diffs == []
    await page.put(b"other", b"plain write")  # moves the head under the views
    await docs.replace("c", made[4].id, {"k": 1, "v": 0.99})
    assert diffs != []
    assert await _by_k(docs) == await _scan_by_k(docs)
    await docs.rebuild_index("c", "by_k")
    assert await _by_k(docs, True) == await _scan_by_k(docs, True)


def _fail_storing_rows_once(monkeypatch: pytest.MonkeyPatch) -> list[StoreError]:
    """Make the next store of index rows fail as a disk error would; returns the
    failures still to come (empty once it has failed)."""
    failures = [StoreError("disk I/O error")]
    real_write_rows = docindex._write_rows

    def failing_write_rows(conn: Any, rows: Any) -> None:
        if failures:
            raise failures.pop()
        real_write_rows(conn, rows)

    monkeypatch.setattr(docindex, "_write_rows", failing_write_rows)
    return failures


@pytest.mark.parametrize("size", [1, 40])  # a few rows store inline, many on the thread
async def test_a_write_and_its_index_rows_are_stored_together(
    page: Page, monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    """A write's index rows go in the SQLite transaction of its commit: if storing
    them fails, the write fails and nothing of it is stored, documents or rows; the
    next write and every query go on as if it had never been tried. (With room for
    no held row: every write stores its rows.)"""
    docs = await DocumentStore.open(page, held_index_bytes=1)
    await docs.declare_index("c", "by_k", "k", "v")
    await docs.create("c", {"k": 0, "v": 0.0})
    await docs.query("c", "by_k", 0)  # the index is built and ready
    head = page.head.id
    failures = _fail_storing_rows_once(monkeypatch)
    with pytest.raises(StoreError):
        await docs.create_many("c", [{"k": i % 3, "v": i / 10} for i in range(size)])
    assert not failures and page.head.id == head
    assert [d.data for d in (await docs.list_documents("c")).items] == [{"k": 0, "v": 0.0}]
    assert await _by_k(docs) == await _scan_by_k(docs)
    made = await docs.create_many("c", [{"k": i % 3, "v": i / 10} for i in range(size)])
    assert docs.views.reflected == page.head.id  # stored with the commit: nothing to catch up
    assert await _by_k(docs) == await _scan_by_k(docs)
    await docs.replace("c", made[-1].id, {"k": 2, "v": 0.45})
    assert await _by_k(docs) == await _scan_by_k(docs)


async def _stored_reflected(page: Page) -> bytes | None:
    rows = await page.db.read_all("SELECT value FROM doc_state WHERE name = 'reflected'")
    return bytes(rows[0][0]) if rows else None


def _rows_stored_when_let(
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[threading.Event, Callable[[], None]]:
    """Storing index rows waits, on the SQLite thread, until ``let_go()``: the event is
    set when a store begins; ``let_go`` lets it go on, and later stores at once."""
    storing, go_on = threading.Event(), threading.Event()
    real_write_rows = docindex._write_rows

    def held_write_rows(conn: Any, rows: Any) -> None:  # on the SQLite thread
        storing.set()
        go_on.wait(10)
        real_write_rows(conn, rows)

    def let_go() -> None:
        monkeypatch.setattr(docindex, "_write_rows", real_write_rows)
        go_on.set()

    monkeypatch.setattr(docindex, "_write_rows", held_write_rows)
    return storing, let_go


async def _stored_rows(page: Page) -> int:
    return int((await page.db.read_all("SELECT count(*) FROM doc_index_rows"))[0][0])


async def test_index_rows_are_held_until_a_write_takes_them_over_the_bound(page: Page) -> None:
    """A write's index rows wait in memory and are stored with the write that takes
    them over ``held_index_bytes`` (in its SQLite transaction), or before a query;
    a row held for a document is replaced by its later one, whatever it is (moved,
    no longer indexed, deleted, purged)."""
    row = docindex.HELD_ROW_OVERHEAD + 16 + 18  # a document id and a (k, v) key
    docs = await DocumentStore.open(page, held_index_bytes=30 * row)
    await docs.declare_index("c", "by_k", "k", "v")
    await docs.query("c", "by_k", 0)  # built and ready
    made = await docs.create_many("c", [{"k": i % 3, "v": i / 10} for i in range(10)])
    start = await _stored_reflected(page)
    assert docs.views.reflected == page.head.id != start
    assert await _stored_rows(page) == 0
    await docs.replace("c", made[0].id, {"k": 2, "v": 0.95})  # moved
    await docs.replace("c", made[1].id, {"v": 0.5})  # no longer indexed
    await docs.delete("c", made[2].id)
    await docs.purge("c", made[3].id)
    assert await _stored_reflected(page) == start and await _stored_rows(page) == 0
    more = await docs.create_many("c", [{"k": 1, "v": 2 + i / 10} for i in range(12)])
    # 10 + 4 + 12 rows (a row written again counts again): within 30 rows.
    assert await _stored_reflected(page) == start
    last = await docs.create_many("c", [{"k": 0, "v": 3 + i / 10} for i in range(5)])
    assert await _stored_reflected(page) == page.head.id  # over the bound: stored with it
    assert await _stored_rows(page) == 10 - 1 - 1 + 12 + 5  # not made[1] nor made[3]
    assert docs.views.reflected == page.head.id
    got = await _by_k(docs)
    assert got[2][-1] == made[0].id and made[1].id not in sum(got.values(), [])
    assert made[2].id in (await _by_k(docs, True))[2] and made[2].id not in got[2]
    assert got[1][-12:] == [d.id for d in more] and got[0][-5:] == [d.id for d in last]
    await docs.create("c", {"k": 0, "v": 9.0})
    assert await _stored_reflected(page) != page.head.id
    await docs.query("c", "by_k", 0)  # a query stores what is held first
    assert await _stored_reflected(page) == page.head.id


async def test_held_index_rows_survive_a_failed_store_and_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If storing the held rows fails, they stay held and the next store has them. If
    the process ends without storing them, the database's rows reflect an older
    commit and opening the page catches up from there, revision floor included."""
    async with await Repository.open(tmp_path) as repo:
        page = await repo.ledger("app").page("docs")
        docs = await DocumentStore.open(page)
        await docs.declare_index("c", "by_k", "k", "v")
        await docs.query("c", "by_k", 0)
        made = await docs.create_many("c", [{"k": i % 3, "v": i / 10} for i in range(30)])
        failures = _fail_storing_rows_once(monkeypatch)
        with pytest.raises(StoreError):
            await docs.query("c", "by_k", 0)
        assert not failures
        assert await _by_k(docs) == await _scan_by_k(docs)
        assert await _stored_reflected(page) == page.head.id
        await docs.replace("c", made[0].id, {"k": 1, "v": 7.0})
        await docs.delete("c", made[1].id)
        latest = (await docs.create("c", {"k": 2, "v": 8.0})).rev
        assert await _stored_reflected(page) != page.head.id
        want = await _scan_by_k(docs)
        # As in a crash, the page closes and the held rows are not stored.
        page.not_when_closing(docs._page_closing)
    async with await Repository.open(tmp_path) as repo:
        page = await repo.ledger("app").page("docs")
        assert await _stored_reflected(page) != page.head.id
        docs = await DocumentStore.open(page)
        assert await _by_k(docs) == want
        assert (await docs.create("c", {"k": 0, "v": 0.0})).rev > latest
        # A page that closes stores them.
        await docs.create("c", {"k": 1, "v": 0.0})
        head = page.head.id
        assert await _stored_reflected(page) != head
    async with await Repository.open(tmp_path) as repo:
        page = await repo.ledger("app").page("docs")
        assert await _stored_reflected(page) == head


async def test_pages_share_one_budget_for_held_index_rows(tmp_path: Path) -> None:
    """Stores given one budget hold rows only while all of theirs fit in it: past
    it, a write stores its page's held rows with it; storing, or the page closing,
    gives their share back."""
    row = docindex.HELD_ROW_OVERHEAD + 16 + 9  # a document id and a (k,) key
    budget = HeldBudget(25 * row)
    async with await Repository.open(tmp_path) as repo:
        pages = [await repo.ledger("app").page(name) for name in ("a", "b")]
        a, b = [await DocumentStore.open(p, held_budget=budget) for p in pages]
        for docs in (a, b):
            await docs.declare_index("c", "by_k", "k")
            await docs.query("c", "by_k", 0)
        await a.create_many("c", [{"k": i % 3} for i in range(20)])
        assert budget.used == 20 * row
        assert await _stored_reflected(pages[0]) != pages[0].head.id
        await b.create_many("c", [{"k": i % 3} for i in range(10)])  # 30 rows: over
        assert budget.used == 20 * row
        assert await _stored_reflected(pages[1]) == pages[1].head.id
        await a.query("c", "by_k", 0)  # stores a's rows, and gives their share back
        assert budget.used == 0
        await b.create_many("c", [{"k": i % 3} for i in range(10)])
        assert budget.used == 10 * row
        assert await _stored_reflected(pages[1]) != pages[1].head.id
        head = pages[1].head.id
        await pages[1].close()
        assert budget.used == 0
        assert await _stored_reflected(await repo.ledger("app").page("b")) == head


async def test_closing_a_store_gives_its_share_back_even_if_storing_fails(
    page: Page, monkeypatch: pytest.MonkeyPatch
) -> None:
    budget = HeldBudget(docindex.HELD_BYTES)
    docs = await DocumentStore.open(page, held_budget=budget)
    await docs.declare_index("c", "by_k", "k")
    await docs.query("c", "by_k", 0)
    await docs.create_many("c", [{"k": i % 3} for i in range(10)])
    assert budget.used > 0
    failures = _fail_storing_rows_once(monkeypatch)
    with pytest.raises(StoreError):
        await docs.close()
    assert not failures and budget.used == 0
    again = await DocumentStore.open(page, held_budget=budget)  # catches up from the stored
    assert len((await again.query("c", "by_k", 1)).items) == 3


@pytest.mark.parametrize("indexed", [True, False])
async def test_history_collection_keeps_the_commit_the_views_reflect_in_memory(
    tmp_path: Path, indexed: bool
) -> None:
    """While a write's rows are held (or it had none to store), the views reflect a
    commit the database does not name: a collection that keeps no history must keep
    its tree too, or the next catch-up cannot diff from it."""
    async with await Repository.open(tmp_path, history_retention=0) as repo:
        page = await repo.ledger("app").page("docs")
        docs = await DocumentStore.open(page)
        await docs.declare_index("c", "by_k", "k", "v")
        await docs.query("c", "by_k", 0)
        coll = "c" if indexed else "other"
        made = await docs.create_many(coll, [{"k": i % 3, "v": i / 10} for i in range(30)])
        await docs.replace(coll, made[5].id, {"k": 1, "v": 9.0})
        assert await _stored_reflected(page) != docs.views.reflected == page.head.id
        await page.put(b"plain", b"a write that moves the head past the views")
        await page.flush()
        await mark_all_uploaded(page)  # as a sync round: all in the cloud
        assert (await collect(page, 0)).commits_pruned > 0
        page.nodes.clear_cache()  # as the cache does in time
        assert await _by_k(docs) == await _scan_by_k(docs)


async def test_a_catch_up_cancelled_while_storing_leaves_the_views_at_what_it_stored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A catch-up whose caller is cancelled while its SQLite transaction runs (it goes
    on to its end) leaves the views in memory at the commit it stored. Before, memory
    stayed at the older commit, which neither the database nor a snapshot kept any
    more: history collection pruned its tree and the next query failed to catch up."""
    async with await Repository.open(tmp_path, history_retention=0) as repo:
        page = await repo.ledger("app").page("docs")
        docs = await DocumentStore.open(page, held_index_bytes=1)  # no rows held
        await docs.declare_index("c", "by_k", "k", "v")
        await docs.query("c", "by_k", 0)
        await docs.create_many("c", [{"k": i % 3, "v": i / 10} for i in range(30)])
        assert await _stored_reflected(page) == docs.views.reflected == page.head.id
        await page.put(b"plain", b"a write that moves the head past the views")
        await page.flush()
        storing, let_go = _rows_stored_when_let(monkeypatch)
        catch_up = asyncio.create_task(docs.views.catch_up())
        await asyncio.to_thread(storing.wait, 10)
        catch_up.cancel()
        let_go()
        with pytest.raises(asyncio.CancelledError):
            await catch_up
        await page.db.run(lambda conn: None, write=True)  # after the catch-up's transaction
        assert await _stored_reflected(page) == docs.views.reflected == page.head.id
        await mark_all_uploaded(page)  # as a sync round: all in the cloud
        assert (await collect(page, 0)).commits_pruned > 0
        page.nodes.clear_cache()
        await docs.create("c", {"k": 1, "v": 5.0})
        assert await _by_k(docs) == await _scan_by_k(docs)


async def test_a_write_cancelled_while_its_rows_are_stored_leaves_the_views_at_its_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write of the document layer whose caller is cancelled while its commit stores
    the index rows (the commit goes on to its end) leaves the views in memory at that
    commit. Before, memory stayed at the transaction's base, which neither the database
    nor a snapshot kept any more: history collection pruned its tree and the next query
    failed to catch up."""
    async with await Repository.open(tmp_path, history_retention=0) as repo:
        page = await repo.ledger("app").page("docs")
        docs = await DocumentStore.open(page, held_index_bytes=1)  # rows stored with each write
        await docs.declare_index("c", "by_k", "k", "v")
        await docs.query("c", "by_k", 0)
        await docs.create_many("c", [{"k": i % 3, "v": i / 10} for i in range(30)])
        storing, let_go = _rows_stored_when_let(monkeypatch)
        write = asyncio.create_task(
            docs.create_many("c", [{"k": 1, "v": 3 + i} for i in range(30)])
        )
        await asyncio.to_thread(storing.wait, 10)
        write.cancel()
        let_go()
        await asyncio.wait({write})
        assert write.cancelled()
        del write
        gc.collect()  # nothing of the write (its transaction) keeps its base any more
        await page.flush()
        assert await _stored_reflected(page) == docs.views.reflected == page.head.id
        await mark_all_uploaded(page)  # as a sync round: all in the cloud
        assert (await collect(page, 0)).commits_pruned > 0
        page.nodes.clear_cache()
        assert await _by_k(docs) == await _scan_by_k(docs)


async def test_a_page_closing_during_a_write_stores_its_rows_and_gives_their_share_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page that closes while a write of the document layer is being committed
    (too far to stop) waits for it: the write's rows are stored with the rest, and
    their share of the budget is given back."""
    budget = HeldBudget(docindex.HELD_BYTES)
    async with await Repository.open(tmp_path) as repo:
        page = await repo.ledger("app").page("docs")
        release = asyncio.Event()

        async def let_the_commit_go_on() -> None:  # the first thing the page does closing
            release.set()

        page.when_closing(let_the_commit_go_on)
        docs = await DocumentStore.open(page, held_budget=budget)
        await docs.declare_index("c", "by_k", "k")
        await docs.query("c", "by_k", 0)
        entered = asyncio.Event()
        real_store = page.graph.store

        async def store_when_released(*args: Any, **kwargs: Any) -> None:
            entered.set()
            await release.wait()
            await real_store(*args, **kwargs)

        monkeypatch.setattr(page.graph, "store", store_when_released)
        write = asyncio.create_task(docs.create("c", {"k": 1}))
        await entered.wait()  # past the closed check: this commit completes
        await page.close()
        await write
        head = page.head.id
        assert budget.used == 0
        again = await repo.ledger("app").page("docs")
        assert await _stored_reflected(again) == head


async def test_a_closing_hook_that_undoes_itself_lets_the_next_one_run(tmp_path: Path) -> None:
    """A page's closing hook may undo itself while the page runs them: every other hook
    still runs. Before, the next one was skipped: here the document store's, so its
    held rows were never stored nor their share of the budget given back."""
    budget = HeldBudget(docindex.HELD_BYTES)
    async with await Repository.open(tmp_path) as repo:
        page = await repo.ledger("app").page("docs")

        async def once() -> None:
            page.not_when_closing(once)

        page.when_closing(once)
        docs = await DocumentStore.open(page, held_budget=budget)  # its hook comes next
        await docs.declare_index("c", "by_k", "k")
        await docs.query("c", "by_k", 0)
        await docs.create_many("c", [{"k": i % 3} for i in range(10)])
        head = page.head.id
        assert await _stored_reflected(page) != head
        await page.close()
        assert budget.used == 0
        assert await _stored_reflected(await repo.ledger("app").page("docs")) == head


async def test_dropping_or_rebuilding_an_index_leaves_none_of_its_held_rows(page: Page) -> None:
    """Rows held for an index that is dropped, or rebuilt under a new row id, are
    never stored for it afterwards."""
    orphans = "SELECT count(*) FROM doc_index_rows WHERE ix NOT IN (SELECT id FROM doc_indexes)"
    docs = await DocumentStore.open(page)
    await docs.declare_index("c", "by_k", "k", "v")
    await docs.declare_index("c", "by_v", "v")
    await docs.query("c", "by_k", 0)
    await docs.query("c", "by_v", 0.0)
    await docs.create_many("c", [{"k": i % 3, "v": i / 10} for i in range(10)])
    await docs.rebuild_index("c", "by_k")  # the lower row id: its new one differs
    await docs.rebuild_index("c", "by_v")
    assert await _by_k(docs) == await _scan_by_k(docs)
    assert (await page.db.read_all(orphans))[0][0] == 0
    assert await _stored_rows(page) == 20
    await docs.create("c", {"k": 1, "v": 5.0})
    await docs.drop_index("c", "by_v")
    await docs.drop_index("c", "by_k")
    assert await _stored_rows(page) == 0


async def test_declaring_an_index_builds_it_from_existing_documents(page: Page) -> None:
    docs = await DocumentStore.open(page)
    await docs.create_many("c", [{"k": i % 7, "v": i} for i in range(2500)])
    await docs.declare_index("c", "by_k", "k", "v")
    more = await docs.create("c", {"k": 3, "v": -1})  # a write while it builds
    res = await docs.query("c", "by_k", 3, limit=1000)
    want = sorted([i for i in range(2500) if i % 7 == 3] + [-1])
    assert [d.data["v"] for d in res.items] == want
    assert res.items[0].id == more.id
    # Rebuild on request: same answers.
    await docs.rebuild_index("c", "by_k")
    res2 = await docs.query("c", "by_k", 3, limit=1000)
    assert [d.id for d in res2.items] == [d.id for d in res.items]
    await docs.drop_index("c", "by_k")
    with pytest.raises(IndexNotFoundError):
        await docs.query("c", "by_k", 3)
    with pytest.raises(IndexNotFoundError):
        await docs.drop_index("c", "by_k")


@pytest.mark.parametrize("damage", ["drop tables", "unknown commit"])
async def test_missing_or_damaged_index_tables_are_rebuilt(tmp_path: Path, damage: str) -> None:
    async with await Repository.open(tmp_path) as repo:
        page = await repo.ledger("app").page("docs")
        docs = await DocumentStore.open(page)
        await docs.declare_index("c", "by_k", "k")
        await docs.create_many("c", [{"k": i % 3} for i in range(30)])
        assert len((await docs.query("c", "by_k", 1)).items) == 10
        await docs.close()

        def work(conn: Any) -> None:
            if damage == "drop tables":
                for table in ("doc_index_rows", "doc_indexes", "doc_state"):
                    conn.execute(f"DROP TABLE {table}")
            else:
                some = "SELECT doc FROM doc_index_rows LIMIT 7"
                conn.execute(f"DELETE FROM doc_index_rows WHERE doc IN ({some})")
                conn.execute("UPDATE doc_state SET value = x'00' WHERE name = 'reflected'")

        await page.db.run(work, write=True)
    async with await Repository.open(tmp_path) as repo:
        page = await repo.ledger("app").page("docs")
        docs = await DocumentStore.open(page)
        assert len((await docs.query("c", "by_k", 1)).items) == 10
        assert len((await docs.query("c", "by_k", 0)).items) == 10


def _builds_under_way() -> list[asyncio.Task[Any]]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith("index-")]


@pytest.mark.parametrize("failing", ["reading definitions", "catching up"])
async def test_a_failed_open_leaves_nothing_behind(
    page: Page, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    """An open that fails (the database raising while it reads the definitions or
    catches up) leaves no closing hook on the page and no index build running, and
    the next open works. Before, a failed catch-up left the hook of a store nobody
    had, and its build went on writing rows for an index the next open replaced."""
    orphans = "SELECT count(*) FROM doc_index_rows WHERE ix NOT IN (SELECT id FROM doc_indexes)"
    docs = await DocumentStore.open(page)
    await docs.create_many("c", [{"k": i % 3, "v": -i} for i in range(30)])
    await docs.declare_index("c", "by_k", "k", "v")
    await docs.query("c", "by_k", 0)
    await docs.close()
    # As a crash in the middle of a build leaves it: the next open builds it again.
    await page.db.run(lambda conn: conn.execute("UPDATE doc_indexes SET ready = 0"), write=True)
    await page.put(b"plain", b"a write the next open catches up with")
    await page.flush()
    # Every store of index rows fails (the open's catch-up, its build's), or the read
    # of the definitions, until the open has failed.
    if failing == "catching up":

        def failing_write_rows(conn: Any, rows: Any) -> None:
            raise StoreError("disk I/O error")

        monkeypatch.setattr(docindex, "_write_rows", failing_write_rows)
    else:
        real_read_all = page.db.read_all

        async def failing_read_all(sql: str, *args: Any, **kwargs: Any) -> Any:
            if "FROM doc_indexes" in sql:
                raise StoreError("disk I/O error")
            return await real_read_all(sql, *args, **kwargs)

        monkeypatch.setattr(page.db, "read_all", failing_read_all)
    with pytest.raises(StoreError):
        await DocumentStore.open(page)
    monkeypatch.undo()
    assert page._closing == [] and _builds_under_way() == []
    again = await DocumentStore.open(page)
    assert page._closing == [again._page_closing]
    assert await _by_k(again) == await _scan_by_k(again)
    assert (await page.db.read_all(orphans))[0][0] == 0


async def test_closing_a_page_stops_its_index_builds(page: Page) -> None:
    """A page that closes cancels the index builds under way and waits for them (the
    next open builds them again). Before, a build went on and failed with ClosedError,
    logged as a task exception nobody retrieved."""
    errors: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _, context: errors.append(context))
    try:
        docs = await DocumentStore.open(page)
        await docs.create_many("c", [{"k": i % 7, "v": i} for i in range(2500)])
        await docs.declare_index("c", "by_k", "k", "v")
        builds = _builds_under_way()
        assert builds
        await page.close()
        ended = all(t.done() for t in builds)
        await asyncio.wait(builds)
        del builds
        gc.collect()  # a task exception nobody retrieved is reported now
        assert ended and errors == []
    finally:
        loop.set_exception_handler(None)


async def test_a_failed_build_is_logged_and_the_next_query_builds_again(
    page: Page, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A build that fails with no query waiting for it says so in the log (asyncio
    reports no unretrieved exception), and the next query builds the index again."""
    errors: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _, context: errors.append(context))
    try:
        docs = await DocumentStore.open(page)
        await docs.create_many("c", [{"k": i % 7, "v": i} for i in range(300)])
        failures = [StoreError("disk I/O error")]
        real_store_chunk = docindex.Views._store_chunk

        async def failing_store_chunk(self: Any, *args: Any) -> None:
            if failures:
                raise failures.pop()
            await real_store_chunk(self, *args)

        monkeypatch.setattr(docindex.Views, "_store_chunk", failing_store_chunk)
        with caplog.at_level(logging.ERROR, logger="ledgerd.store.documents.docindex"):
            await docs.declare_index("c", "by_k", "k", "v")
            builds = _builds_under_way()
            assert builds
            await asyncio.wait(builds)
        assert failures == []
        assert [t.exception() for t in builds] != [None]
        assert "building index c/by_k failed" in caplog.text
        del builds
        gc.collect()
        assert errors == []
        assert await _by_k(docs) == await _scan_by_k(docs)
    finally:
        loop.set_exception_handler(None)


async def test_changes_feed_since_a_commit_then_live(page: Page) -> None:
    docs = await DocumentStore.open(page)
    a = await docs.create("c", {"v": 1})
    mark = page.head.id
    b = await docs.create("c", {"v": 2})
    await docs.replace("c", a.id, {"v": 3})
    feed = docs.changes(mark)
    first = await anext(feed)
    assert {d.id for d in first.documents} == {a.id, b.id}
    assert first.commit == page.head.id
    nxt = asyncio.ensure_future(anext(feed))
    await docs.delete("c", b.id)
    second = await nxt
    assert [(d.id, d.deleted) for d in second.documents] == [(b.id, True)]
    await feed.aclose()
    # Resumed from the last commit seen: only what came after.
    await docs.purge("c", a.id)
    resumed = [c async for c in docs.changes(second.commit, follow=False)]
    assert [(d.id, d.purged) for c in resumed for d in c.documents] == [(a.id, True)]
    # From the beginning, every document once, in its latest state.
    everything = [c async for c in docs.changes(None, follow=False, collection="c")]
    assert sorted(d.id for c in everything for d in c.documents) == sorted([a.id, b.id])


async def test_documents_whose_keys_left_the_page_are_reported_purged(page: Page) -> None:
    """A page deleted or cleared (or a document's keys deleted through the key API)
    removes documents with no revision: the feed reported nothing for them, so a
    follower mirroring the page kept them for good. They come once, as purged, with
    their last revision and the time of the change."""
    docs = await DocumentStore.open(page)
    a = await docs.create("c", {"v": 1})
    b = await docs.create("c", {"v": 2})
    b_deleted = await docs.delete("c", b.id)
    gone_before = await docs.purge("c", (await docs.create("c", {"v": 3})).id)
    mark = page.head.id
    feed = docs.changes(mark)
    nxt = asyncio.ensure_future(anext(feed))
    await page.clear()
    await page.flush()
    async with asyncio.timeout(30):  # (the feed used to stay silent)
        batch = await nxt
    await feed.aclose()
    got = {d.id: d for d in batch.documents}
    assert set(got) == {a.id, b.id, gone_before.id}
    when = page.head.timestamp // 1000
    assert all((d.state, d.data) == (State.PURGED, None) for d in got.values())
    assert (got[a.id].rev, got[a.id].deleted_at, got[a.id].purged_at) == (a.rev, when, when)
    # Deleted before: that time is kept. Purged before: reported as it was.
    assert (got[b.id].deleted_at, got[b.id].purged_at) == (b_deleted.deleted_at, when)
    assert (got[gone_before.id].rev, got[gone_before.id].purged_at) == (
        gone_before.rev,
        gone_before.purged_at,
    )
    # Listed again from before the clear, and by page (the same documents).
    paged = await docs.changes_page(mark)
    assert {d.id for d in paged.documents} == set(got)
    # A document made and removed after the mark was never seen: not reported.
    mark = page.head.id
    await docs.create("c", {"v": 4})
    await page.clear()
    await page.flush()
    assert [d.id for d in (await docs.changes_page(mark)).documents] == []


@pytest.mark.parametrize("write", ["create", "declare_index"])
async def test_a_document_write_marks_a_page_cleared_since_its_store_opened(
    page: Page, write: str
) -> None:
    """The marker that makes a page a document page (reads look for it; merges take
    documents whole only where it is) was put only when the store opened: after the
    page was deleted or cleared, new documents went into a page without it, which
    reads then refused as "holds no documents" and merges treated key by key."""
    docs = await DocumentStore.open(page)
    await docs.create("c", {"v": 1})
    await page.clear()
    await page.flush()
    assert not await DocumentStore.holds_documents(page)
    if write == "create":
        await docs.create("c", {"v": 2})
    else:
        await docs.declare_index("c", "by_v", "v")
    assert await DocumentStore.holds_documents(page)
    again = await DocumentStore.open(page)
    assert again is docs


async def test_a_long_change_comes_in_batches_and_pages(page: Page) -> None:
    docs = await DocumentStore.open(page)
    made = await docs.create_many("c", [{"n": i} for i in range(25)])
    await docs.create("other", {"n": -1})
    ids = sorted(d.id for d in made)
    head = page.head.id
    # Followed or not, a change of 25 documents comes as batches of at most 10; the
    # cut ones resume from where the change started, the last from the head.
    batches = [c async for c in docs.changes(None, follow=False, collection="c", batch=10)]
    assert [len(c.documents) for c in batches] == [10, 10, 5]
    assert [d.id for c in batches for d in c.documents] == ids
    assert [c.commit for c in batches] == [commit.FIRST.id, commit.FIRST.id, head]
    assert [c.token is None for c in batches] == [False, False, True]
    resumed = [c async for c in docs.changes(batches[0].commit, follow=False, collection="c")]
    assert {d.id for c in resumed for d in c.documents} == set(ids)  # at least once
    # Pages: the token continues up to the head the first page saw.
    pages, token = [], None
    while True:
        got = await docs.changes_page(None, collection="c", limit=10, token=token)
        pages.append(got)
        await docs.create("c", {"n": "later"})  # after the first page: not in these
        token = got.token
        if token is None:
            break
    assert [d.id for p in pages for d in p.documents] == ids
    assert pages[-1].commit == head
    with pytest.raises(InvalidArgumentError, match="token"):
        await docs.changes_page(None, token=b"\x93garbage")
    with pytest.raises(InvalidArgumentError, match="another collection"):
        await docs.changes_page(None, collection="other", token=pages[0].token)


async def test_lone_surrogates_in_names_paths_and_query_values_are_refused(page: Page) -> None:
    """Strings with no UTF-8 form: a clear error with a stable code, nothing stored."""
    docs = await DocumentStore.open(page)
    await docs.create("c", {"k": "x", "v": 1.5})
    before = page.head.id
    with pytest.raises(InvalidArgumentError, match="UTF-8"):
        await docs.declare_index("c", "by_k", "k\ud800")
    with pytest.raises(InvalidArgumentError, match="UTF-8"):
        await docs.declare_index("c", "by_k", "k", ["v", "\udfff"])
    assert page.head.id == before
    await docs.declare_index("c", "by_k", "k", "v")
    for partition, start in [("\ud800", None), ("x", "\ud800")]:
        with pytest.raises(InvalidArgumentError, match="UTF-8"):
            await docs.query("c", "by_k", partition, start=start)
    assert [d.data for d in (await docs.query("c", "by_k", "x")).items] == [{"k": "x", "v": 1.5}]


async def test_an_index_path_is_bounded(page: Page) -> None:
    """A definition travels with the page: a path of a megabyte is refused, not stored."""
    docs = await DocumentStore.open(page)
    await docs.create("c", {"k": "x"})
    before = page.head.id
    paths: list[str | list[str]] = ["k" * 1_000_000, ["a"] * 600, "é" * 513]
    for path in paths:
        with pytest.raises(InvalidArgumentError, match="over 1024 bytes") as e:
            await docs.declare_index("c", "by_k", path)
        assert len(str(e.value)) < 200
        with pytest.raises(InvalidArgumentError, match="over 1024 bytes"):
            await docs.declare_index("c", "by_k", "k", path)
    assert page.head.id == before
    await docs.declare_index("c", "by_k", ["a" * 500, "b" * 523])  # 1,024 bytes: taken


async def test_a_query_by_an_integer_past_every_double_orders_as_infinity(page: Page) -> None:
    """An integer too large for a double (JSON allows it: ``?eq=1`` followed by 400
    zeros) is queried as the infinity of its sign, as ``1e400`` is: before, converting
    it raised ``OverflowError`` (a 500 over HTTP)."""
    docs = await DocumentStore.open(page)
    await docs.declare_index("c", "by_k", "k", "v")
    a = await docs.create("c", {"k": 1, "v": 2**63 - 1})
    b = await docs.create("c", {"k": 1, "v": -(2**63)})
    huge = 10**400
    assert (await docs.query("c", "by_k", huge)).items == []
    assert (await docs.query("c", "by_k", 1, start=huge)).items == []
    assert [d.id for d in (await docs.query("c", "by_k", 1, end=huge)).items] == [b.id, a.id]
    assert [d.id for d in (await docs.query("c", "by_k", 1, start=-huge)).items] == [b.id, a.id]
    assert (await docs.query("c", "by_k", 1, end=-huge)).items == []


async def _redefine(page: Page, partition: list[str], sort: list[str] | None) -> None:
    """Change the definition of c/by_k in the tree, as a merge or another writer would."""
    raw = doclayout.encode_definition(partition, sort)
    await page.put(doclayout.index_key("c", "by_k"), raw)
    await page.flush()


async def test_a_definition_changing_under_its_own_build_leaves_the_views_whole(
    page: Page,
) -> None:
    """A build whose catch-up finds its own index redefined is cancelled by it. Before,
    that cancellation hit the catch-up in the middle of storing the new definition: the
    database had the new index and the views in memory had none, so the index was not
    found and declaring it again failed on its UNIQUE row (a 500) until the page closed."""
    docs = await DocumentStore.open(page)
    await docs.create_many("c", [{"k": i % 3, "v": -i} for i in range(30)])
    await docs.declare_index("c", "by_k", "k")  # its build starts, waiting for the lock
    async with docs.views.lock:
        await _redefine(page, ["k"], ["v"])  # what the build's catch-up will find
    assert await _by_k(docs) == await _scan_by_k(docs)
    await docs.declare_index("c", "by_k", "v")
    await docs.declare_index("c", "by_k", "k", "v")
    assert await _by_k(docs) == await _scan_by_k(docs)
    assert [(i.name, i.partition, i.sort) for i in await docs.indexes("c")] == [("by_k", "k", "v")]


async def test_a_query_waiting_for_a_build_that_is_cancelled_waits_for_the_next(
    page: Page,
) -> None:
    """A query waits for its index's build; a redefinition cancels that build and starts
    another. Before, the query ended with the build's CancelledError (over HTTP: the
    connection closed with no answer)."""
    docs = await DocumentStore.open(page)
    await docs.create_many("c", [{"k": i % 3, "v": -i} for i in range(1000)])
    await docs.declare_index("c", "by_k", "k")
    (ix, _, ready) = docs.views.indexes[("c", "by_k")]
    assert not ready
    query = asyncio.create_task(docs.query("c", "by_k", 1, limit=1000))
    while not query.done() and docs.views._builds.get(ix) is not None:
        # wait until the query waits for the build (it holds no lock then)
        await asyncio.sleep(0)
        if docs.views.lock.locked():
            continue
        break
    await docs.declare_index("c", "by_k", "k", "v")  # cancels the build under way
    res = await query
    assert [d.id for d in res.items] == (await _scan_by_k(docs))[1]


@pytest.mark.parametrize("change", ["redefined", "dropped"])
async def test_a_rebuild_takes_the_definition_it_finds_under_the_lock(
    page: Page, change: str
) -> None:
    """A rebuild waiting for the lock while a catch-up redefines or drops the index
    rebuilds what the catch-up left. Before, it rebuilt the definition it had read
    before waiting: the old one came back (or a dropped index rose again), with the
    views reflecting the head, so queries used it until the page closed."""
    docs = await DocumentStore.open(page)
    await docs.create_many("c", [{"k": i % 3, "v": -i} for i in range(30)])
    await docs.declare_index("c", "by_k", "k")
    await docs.query("c", "by_k", 0)  # built
    async with docs.views.lock:
        if change == "redefined":
            await _redefine(page, ["k"], ["v"])
        else:
            await page.delete(doclayout.index_key("c", "by_k"))
            await page.flush()
        catch_up = asyncio.create_task(docs.views.catch_up())
        await asyncio.sleep(0)  # the catch-up waits for the lock first
        rebuild = asyncio.create_task(docs.views.rebuild("c", "by_k"))
        await asyncio.sleep(0)  # then the rebuild
    await catch_up
    found = await rebuild
    listed = [(i.name, i.partition, i.sort) for i in await docs.indexes("c")]
    if change == "redefined":
        assert found and listed == [("by_k", "k", "v")]
        assert await _by_k(docs) == await _scan_by_k(docs)
    else:
        assert not found and listed == []
        with pytest.raises(IndexNotFoundError):
            await docs.query("c", "by_k", 0)


async def test_declaring_an_index_answers_what_it_declared_even_if_dropped_meanwhile(
    page: Page,
) -> None:
    """``declare_index`` returns the index as declared. Before, it returned nothing and
    the HTTP API listed the indexes to answer: an index dropped by another request in
    between was a 500 ("declared but is not listed")."""
    docs = await DocumentStore.open(page)
    await docs.create("c", {"k": 1})
    async with docs.views.lock:  # the declaration's catch-up waits: a drop comes first
        declare = asyncio.create_task(docs.declare_index("c", "by_k", ["k"], "v.w"))
        while await page.get_entry(doclayout.index_key("c", "by_k")) is None:
            await asyncio.sleep(0)  # until it is in the tree
        await page.delete(doclayout.index_key("c", "by_k"))
        await page.flush()
    info = await declare
    assert (info.collection, info.name, info.partition, info.sort) == ("c", "by_k", "k", "v.w")
    assert not info.ready and await docs.indexes("c") == []
    again = await docs.declare_index("c", "by_k", "k")
    await docs.query("c", "by_k", 1)
    assert (await docs.declare_index("c", "by_k", "k")).ready and not again.sort


async def test_index_info_tells_a_dotted_name_from_a_nested_path(page: Page) -> None:
    """``partition`` and ``sort`` read as dotted text; ``partition_path`` and
    ``sort_path`` keep the names, so a field named "a.b" is not ["a", "b"]."""
    docs = await DocumentStore.open(page)
    declared = await docs.declare_index("c", "dotted", ["a.b"], ["n", "x.y"])
    nested = await docs.declare_index("c", "nested", "a.b")
    assert (declared.partition, declared.partition_path) == ("a.b", ("a.b",))
    assert (declared.sort, declared.sort_path) == ("n.x.y", ("n", "x.y"))
    assert (nested.partition_path, nested.sort_path) == (("a", "b"), None)
    listed = {i.name: i for i in await docs.indexes("c")}
    assert listed["dotted"].partition_path == ("a.b",)
    assert listed["dotted"].sort_path == ("n", "x.y")
    assert listed["nested"].partition_path == ("a", "b")
    await docs.create("c", {"a.b": 1, "n": {"x.y": 2}, "a": {"b": 3}})
    assert len((await docs.query("c", "dotted", 1)).items) == 1
    assert len((await docs.query("c", "nested", 3)).items) == 1


@pytest.mark.parametrize("closing", ["page", "store"])
async def test_a_query_waiting_for_a_build_when_closing_starts_no_other(
    page: Page, caplog: pytest.LogCaptureFixture, closing: str
) -> None:
    """A query waiting for an index's build when the page (or the document store)
    closes ends with ClosedError and starts no build. Before, it saw the build
    cancelled and started another on the closing store: that one ran against a
    database being closed (or beside the next store's views), failed, and was logged
    as a failed build."""
    docs = await DocumentStore.open(page)
    await docs.create_many("c", [{"k": i % 7, "v": i} for i in range(2500)])
    await docs.declare_index("c", "by_k", "k", "v")
    (ix, _, ready) = docs.views.indexes[("c", "by_k")]
    build = docs.views._builds[ix]
    assert not ready
    waiting = asyncio.Event()

    class Asyncio:  # docindex's asyncio, telling when a caller waits for the build
        def __getattr__(self, name: str) -> Any:
            return getattr(asyncio, name)

        async def wait(self, fs: Any, *args: Any, **kwargs: Any) -> Any:
            if build in fs:
                waiting.set()
            return await asyncio.wait(fs, *args, **kwargs)

    with caplog.at_level(logging.ERROR, logger="ledgerd.store.documents.docindex"):
        with pytest.MonkeyPatch.context() as m:
            m.setattr(docindex, "asyncio", Asyncio())
            query = asyncio.create_task(docs.query("c", "by_k", 1))
            await waiting.wait()  # the query waits for the build
            await (page.close() if closing == "page" else docs.close())
        with pytest.raises(StoreError) as e:
            await query
        assert isinstance(e.value, ClosedError)
        assert _builds_under_way() == []
    assert "building index" not in caplog.text


@pytest.mark.parametrize("change", ["dropped", "redefined"])
async def test_a_query_racing_a_definition_change_answers_as_of_the_new_definition(
    page: Page, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    """A query that found its index ready, then waited for the lock while the index was
    dropped or redefined, answers for what the catch-up left: no such index, or the
    new definition once built. Before, it read the rows of the index it had found,
    deleted by then, and answered an empty page as of the head."""
    docs = await DocumentStore.open(page)
    await docs.create_many("c", [{"k": i % 3, "v": -i} for i in range(30)])
    await docs.declare_index("c", "by_k", "k")
    await docs.query("c", "by_k", 1)  # built
    found, go = asyncio.Event(), asyncio.Event()
    real_index = docindex.Views.index

    async def index(self: Any, collection: str, name: str) -> Any:
        got = await real_index(self, collection, name)
        if not found.is_set():
            found.set()
            await go.wait()
        return got

    monkeypatch.setattr(docindex.Views, "index", index)
    query = asyncio.create_task(docs.query("c", "by_k", 1))
    await found.wait()  # the query found the index ready
    if change == "dropped":
        await docs.drop_index("c", "by_k")
    else:
        await docs.declare_index("c", "by_k", "k", "v")
    go.set()
    if change == "dropped":
        with pytest.raises(IndexNotFoundError):
            await query
    else:
        assert [d.id for d in (await query).items] == (await _scan_by_k(docs))[1]


async def test_a_store_opened_while_another_closes_waits_and_is_a_new_one(
    page: Page, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``DocumentStore.open`` while the page's store is closing (storing its held rows)
    waits for the close and returns a new store; the closed one refuses writes and
    queries (ClosedError) and the new one's indexes equal a scan. Before, open returned
    the store being closed, whose later writes held index rows that nothing stored."""
    docs = await DocumentStore.open(page)
    await docs.declare_index("c", "by_k", "k", "v")
    await docs.query("c", "by_k", 0)
    await docs.create_many("c", [{"k": i % 3, "v": i / 10} for i in range(30)])  # held
    storing, let_go = _rows_stored_when_let(monkeypatch)
    closing = asyncio.create_task(docs.close())
    await asyncio.to_thread(storing.wait, 10)
    opening = asyncio.create_task(DocumentStore.open(page))
    let_go()
    await closing
    again = await opening
    assert again is not docs
    with pytest.raises(ClosedError):
        await docs.create("c", {"k": 1, "v": 9.0})
    with pytest.raises(ClosedError):
        await docs.query("c", "by_k", 1)
    await again.create("c", {"k": 1, "v": 9.5})
    assert await _by_k(again) == await _scan_by_k(again)
    assert sum(map(len, (await _by_k(again)).values())) == 31


async def test_a_failed_open_raises_its_own_error_when_cleaning_up_fails_too(
    page: Page, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An open that fails, and whose clean-up fails as well, raises the open's error
    (the clean-up's is logged). Before, the clean-up's error replaced it."""

    async def failing_open(self: DocumentStore) -> None:
        raise InvalidArgumentError("the open's own failure")

    async def failing_close(self: docindex.Views) -> None:
        raise StoreError("the clean-up's failure")

    monkeypatch.setattr(DocumentStore, "_open", failing_open)
    monkeypatch.setattr(docindex.Views, "close", failing_close)
    with caplog.at_level(logging.WARNING), pytest.raises(InvalidArgumentError, match="own"):
        await DocumentStore.open(page)
    assert "cleaning up a failed open failed" in caplog.text


async def test_a_followed_changes_feed_keeps_its_watcher(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A changes feed that keeps up keeps the one watcher it started with, however many
    bytes it has been told of in all (here five times ``max_watch_queue_bytes``): it takes
    the notifications through :meth:`Watcher.wake`, which takes their bytes off the
    account. Before, it took them from the queue itself, the account only grew, and the
    watcher was ended as behind every kilobyte or so (the feed then watched anew)."""
    async with await Repository.open(tmp_path, max_watch_queue_bytes=2000) as repo:
        page = await repo.ledger("app").page("docs")
        docs = await DocumentStore.open(page)
        watches = 0
        real_watch = Page.watch

        def counted(self: Page, prefix: bytes = b"") -> Any:
            nonlocal watches
            watches += 1
            return real_watch(self, prefix)

        monkeypatch.setattr(Page, "watch", counted)
        feed = docs.changes()
        seen: list[int] = []
        for i in range(0, 20, 2):  # two changes a read: one waits when the next comes
            await docs.create("c", {"text": "x" * 500, "i": i})
            await docs.create("c", {"text": "x" * 500, "i": i + 1})
            while len(seen) < i + 2:
                got = await asyncio.wait_for(anext(feed), 10)
                seen += [d.data["i"] for d in got.documents]
        assert seen == list(range(20))
        await feed.aclose()
        assert watches == 1


def test_a_long_name_or_id_is_cut_visibly_in_messages() -> None:
    """A message quotes at most 60 characters of a name, id or path it refuses, and
    shows where it cut: before, ``{name!r:.60}`` left the quote open, so the message
    read ``collection name 'xxx…xxx must be 1-128 bytes``."""
    from ledgerd.store.documents.docmodel import (
        check_collection,
        check_index_name,
        parse_path,
        parse_ulid,
    )

    cases: list[tuple[Callable[[], Any], str]] = [
        (lambda: check_collection("x" * 300), "collection name "),
        (lambda: check_index_name("y" * 300), "index name "),
        (lambda: parse_ulid("z" * 300), "id "),
        (lambda: parse_path("p" * 2000), "path "),
    ]
    for call, prefix in cases:
        with pytest.raises(StoreError) as e:
            call()
        text = str(e.value)
        letter = text[len(prefix) + 1]
        assert text.startswith(f"{prefix}'{letter * 60}'… ("), text
    with pytest.raises(StoreError, match=r"^collection name '' must be"):
        check_collection("")


async def test_a_collection_whose_name_extends_another_with_nul_stays_apart(page: Page) -> None:
    """A collection named "a\\0b" packs as "a"'s prefix followed by 0xff: a range up to
    the prefix's strinc took its documents into "a"'s listings, changes and index builds
    (which then failed with a KeyError on every query)."""
    docs = await DocumentStore.open(page)
    inner = await docs.create("a\x00b", {"city": "X"})
    outer = await docs.create("a", {"city": "X"})
    assert [d.id for d in (await docs.list_documents("a")).items] == [outer.id]
    assert [d.id for d in (await docs.list_documents("a\x00b")).items] == [inner.id]
    got = await docs.changes_page(None, collection="a")
    assert [(d.collection, d.id) for d in got.documents] == [("a", outer.id)]
    batches = [b async for b in docs.changes(None, collection="a", follow=False)]
    assert [d.id for b in batches for d in b.documents] == [outer.id]
    await docs.declare_index("a", "by_city", "city")  # built from the documents there
    assert [d.id for d in (await docs.query("a", "by_city", "X")).items] == [outer.id]


async def test_an_index_partition_that_extends_another_with_nul_stays_apart(page: Page) -> None:
    """Partition "a" packs as a prefix of "a\\0b" (then 0xff): an equality query on "a"
    also returned the documents of "a\\0b"."""
    docs = await DocumentStore.open(page)
    await docs.declare_index("c", "p", "city")
    await docs.declare_index("c", "ps", "city", "n")
    a = await docs.create("c", {"city": "a", "n": 2})
    ab = await docs.create("c", {"city": "a\x00b", "n": 1})
    for index in ("p", "ps"):
        assert [d.id for d in (await docs.query("c", index, "a")).items] == [a.id]
        assert [d.id for d in (await docs.query("c", index, "a\x00b")).items] == [ab.id]
    assert [d.id for d in (await docs.query("c", "ps", "a", start=0)).items] == [a.id]


async def test_minus_zero_is_indexed_as_zero(page: Page) -> None:
    """-0.0 (Python's json writes it) equals 0 as a double, but packed apart: ``eq=0``
    missed a document whose value was -0.0, and a sort range from 0 left it out."""
    docs = await DocumentStore.open(page)
    await docs.declare_index("c", "by_n", "n")
    await docs.declare_index("c", "by_k", "k", "n")
    neg = await docs.create("c", loads('{"n": -0.0, "k": 1}'))
    pos = await docs.create("c", {"n": 0, "k": 1})
    for zero in (0, 0.0, -0.0):
        assert [d.id for d in (await docs.query("c", "by_n", zero)).items] == [neg.id, pos.id]
        got = await docs.query("c", "by_k", 1, start=zero, end=1)
        assert [d.id for d in got.items] == [neg.id, pos.id]
    assert (await docs.query("c", "by_k", 1, start=-1, end=zero)).items == []


async def test_index_rows_of_an_older_key_format_are_rebuilt(tmp_path: Path) -> None:
    """Rows stored before -0.0 was packed as 0.0 are built again on open."""
    async with await Repository.open(tmp_path) as repo:
        page = await repo.ledger("app").page("docs")
        docs = await DocumentStore.open(page)
        neg = await docs.create("c", loads('{"n": -0.0}'))
        await docs.declare_index("c", "by_n", "n")  # built at the head: no catch-up on open
        assert [d.id for d in (await docs.query("c", "by_n", 0)).items] == [neg.id]
        await docs.close()

        def as_before(conn: Any) -> None:  # the row as the older format packed it
            old = tup.pack((-0.0,))
            conn.execute("UPDATE doc_index_rows SET key = ?", (old,))
            conn.execute("DELETE FROM doc_state WHERE name = 'key_format'")

        await page.db.run(as_before, write=True)
    async with await Repository.open(tmp_path) as repo:
        page = await repo.ledger("app").page("docs")
        docs = await DocumentStore.open(page)
        assert [d.id for d in (await docs.query("c", "by_n", 0)).items] == [neg.id]


async def test_a_closed_page_leaves_nothing_of_its_document_store_in_memory(
    tmp_path: Path,
) -> None:
    """The registry of open stores forgets a store when its page closes, even if the
    store itself was never closed: its value holds the page, so an entry left there
    kept every page ever opened (its database, its history) for the life of the
    process (found by the simulation's workers, which grew to 1.2 GB)."""

    async with await Repository.open(tmp_path) as repo:
        page = await repo.ledger("app").page("docs")
        docs = await DocumentStore.open(page)
        await docs.create("c", {"a": 1})
        gone = weakref.ref(page)
        await page.close()
        del page, docs
    gc.collect()
    assert gone() is None
