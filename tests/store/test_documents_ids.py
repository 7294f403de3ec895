"""Client-chosen document ids and bulk writes (``_bulk_docs``) in the embedded API."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledgerd.store import (
    BulkWrite,
    DocumentConflictError,
    DocumentNotFoundError,
    DocumentStore,
    InvalidIdError,
    Page,
    Repository,
)
from ledgerd.store.documents import doclayout
from ledgerd.store.documents.docmodel import ID_LIMIT
from tests.store.test_documents_convergence import _two_devices


async def test_a_chosen_id_creates_reads_replaces_and_lists(page: Page) -> None:
    docs = await DocumentStore.open(page)
    await docs.declare_index("people", "by_city", "city")
    made = await docs.create("people", {"city": "Oslo"})
    ann = await docs.create("people", {"city": "Oslo", "name": "Ann"}, id="ann@example.com")
    assert ann.id == "ann@example.com"
    assert (await docs.get("people", "ann@example.com")).data["name"] == "Ann"
    with pytest.raises(DocumentConflictError) as e:  # taken: CouchDB's 409
        await docs.create("people", {"city": "Bergen"}, id="ann@example.com")
    assert e.value.code == "conflict"
    ann2 = await docs.replace("people", ann.id, {"city": "Oslo", "age": 3}, expected_rev=ann.rev)
    assert ann2.rev > ann.rev
    listed = await docs.list_documents("people")
    assert [d.id for d in listed.items] == [made.id, "ann@example.com"]  # ULIDs first
    found = await docs.query("people", "by_city", "Oslo")
    assert {d.id for d in found.items} == {made.id, "ann@example.com"}
    # One at a time: the listing's and the query's tokens cross a chosen id.
    ids, token = [], None
    while True:
        got = await docs.list_documents("people", limit=1, token=token)
        ids += [d.id for d in got.items]
        if (token := got.token) is None:
            break
    assert ids == [made.id, "ann@example.com"]
    q = await docs.query("people", "by_city", "Oslo", limit=1)
    assert q.token is not None
    rest = await docs.query("people", "by_city", "Oslo", limit=1, token=q.token)
    assert {d.id for d in q.items + rest.items} == {made.id, "ann@example.com"}
    # A ULID's text names the ULID document, in any case, as before.
    assert (await docs.get("people", made.id.lower())).id == made.id


async def test_a_deleted_documents_id_can_be_taken_again(page: Page) -> None:
    docs = await DocumentStore.open(page)
    a = await docs.create("c", {"v": 1}, id="slug")
    await docs.put_attachment("c", "slug", b"abc", filename="a.txt")
    gone = await docs.delete("c", "slug")
    again = await docs.create("c", {"v": 2}, id="slug")
    assert again.rev > gone.rev > a.rev and again.data == {"v": 2} and not again.attachments
    keys = [e.key async for e in page.iter_entries(prefix=doclayout.doc_prefix("c", "slug"))]
    assert not any(doclayout.parse_doc_key(k).part == doclayout.ATTACHMENT for k in keys)  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "bad", ["", "_design/x", "a\0b", "x" * (ID_LIMIT + 1), "é" * (ID_LIMIT // 2 + 1), "a\ud800"]
)
async def test_ids_that_cannot_be_chosen_are_refused_and_store_nothing(
    page: Page, bad: str
) -> None:
    docs = await DocumentStore.open(page)
    head = page.head.id
    with pytest.raises(InvalidIdError) as e:
        await docs.create("c", {"v": 1}, id=bad)
    assert e.value.code == "invalid_id"
    with pytest.raises(InvalidIdError):
        DocumentStore.check("c", doc_id=bad)
    assert page.head.id == head


async def test_the_longest_id_and_a_ulid_given_as_an_id(page: Page) -> None:
    docs = await DocumentStore.open(page)
    longest = "é" * (ID_LIMIT // 2)
    assert (await docs.create("c", {}, id=longest)).id == longest
    ulid = "01J0000000000000000000000A"
    assert (await docs.create("c", {}, id=ulid.lower())).id == ulid  # a ULID: its bytes
    with pytest.raises(DocumentConflictError):
        await docs.create("c", {}, id=ulid)


async def test_create_many_with_ids_is_all_or_nothing(page: Page) -> None:
    docs = await DocumentStore.open(page)
    await docs.create("c", {"v": 0}, id="b")
    head = page.head.id
    with pytest.raises(DocumentConflictError):
        await docs.create_many("c", [{"v": 1}, {"v": 2}], ids=["a", "b"])
    assert page.head.id == head
    made = await docs.create_many("c", [{"v": 1}, {"v": 2}], ids=["a", None])
    assert made[0].id == "a" and len(made[1].id) == 26


async def test_chosen_ids_survive_a_reopen(repo: Repository, page: Page) -> None:
    docs = await DocumentStore.open(page)
    await docs.declare_index("c", "by_v", "v")
    await docs.create("c", {"v": 1}, id="kept")
    await docs.close()
    await page.close()
    page2 = await repo.ledger("test").page("page")
    docs2 = await DocumentStore.open(page2)
    assert (await docs2.get("c", "kept")).data == {"v": 1}
    assert [d.id for d in (await docs2.query("c", "by_v", 1)).items] == ["kept"]


async def test_bulk_writes_in_one_commit_with_a_result_per_document(page: Page) -> None:
    docs = await DocumentStore.open(page)
    old = await docs.create("c", {"v": 0}, id="old")
    gone = await docs.create("c", {"v": 0}, id="gone")
    commits = len(await page.history(limit=1000))
    res = await docs.bulk(
        "c",
        [
            BulkWrite({"v": 1}, id="new"),
            BulkWrite({"v": 2}),  # a new ULID
            BulkWrite({"v": 3}, id="old", rev=old.rev),  # replace
            BulkWrite({"v": 4}, id="old"),  # no rev: a create, and the id is taken
            BulkWrite(None, id="gone", rev=gone.rev, deleted=True),
            BulkWrite({"v": 5}, id="_bad"),
            BulkWrite({"_x": 1}, id="bad-data"),
            BulkWrite({"v": 6}, id="new"),  # twice in one call
            BulkWrite({"v": 7}, id="missing", rev=old.rev),
        ],
    )
    assert len(await page.history(limit=1000)) == commits + 1
    codes = [(r.id, None if r.error is None else r.error.code) for r in res]  # type: ignore[attr-defined]
    assert codes[0] == ("new", None) and codes[1][1] is None and len(codes[1][0] or "") == 26
    assert codes[2:] == [
        ("old", None),
        ("old", "conflict"),
        ("gone", None),
        ("_bad", "invalid_id"),
        ("bad-data", "invalid_document"),
        ("new", "conflict"),
        ("missing", "document_not_found"),
    ]
    assert (await docs.get("c", "old")).data == {"v": 3}
    with pytest.raises(DocumentNotFoundError):
        await docs.get("c", "gone")
    assert res[4].document is not None and res[4].document.deleted


async def test_a_bulk_that_writes_nothing_makes_no_commit(page: Page) -> None:
    docs = await DocumentStore.open(page)
    await docs.create("c", {}, id="x")
    head = page.head.id
    res = await docs.bulk("c", [BulkWrite({}, id="x")])
    assert res[0].error is not None and res[0].error.code == "conflict"  # type: ignore[attr-defined]
    assert page.head.id == head


async def test_two_devices_creating_one_chosen_id_converge_on_the_higher_revision(
    tmp_path: Path,
) -> None:
    """Concurrent creates of one chosen id are concurrent revisions of one document:
    the higher revision wins, whole, on both devices (and in their indexes)."""
    async with _two_devices(tmp_path) as (engines, repos):
        pages = [await r.ledger("l").page("p") for r in repos]
        a, b = [await DocumentStore.open(p) for p in pages]
        await a.declare_index("c", "by_k", "k")
        await engines[0].sync()
        await engines[1].sync()
        on_a = await a.create("c", {"k": 1, "from": "a"}, id="shared")
        on_b = await b.create("c", {"k": 2, "from": "b"}, id="shared")
        win = max(on_a, on_b, key=lambda d: d.rev)
        for _ in range(2):
            for e in engines:
                await e.sync()
        assert pages[0].head.root == pages[1].head.root
        for docs in (a, b):
            got = await docs.get("c", "shared")
            assert (got.rev, got.data) == (win.rev, win.data)
            assert [d.id for d in (await docs.list_documents("c")).items] == ["shared"]
            hits = await docs.query("c", "by_k", win.data["k"])
            assert [d.id for d in hits.items] == ["shared"]
            assert not (await docs.query("c", "by_k", 3 - win.data["k"])).items
        for docs in (a, b):
            await docs.close()
