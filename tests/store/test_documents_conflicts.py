"""Kept conflicts: of concurrent revisions of a document, the losers are kept (as
PouchDB's ``_conflicts``) on every device alike, until a write resolves them."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ledgerd.store import (
    BulkWrite,
    DocumentConflictError,
    DocumentNotFoundError,
    DocumentStore,
    Page,
    Repository,
)
from ledgerd.store.documents import doclayout
from ledgerd.store.page import check as ck
from tests.exchanges import Bucket


@contextlib.asynccontextmanager
async def _devices(tmp_path: Path, n: int) -> AsyncIterator[tuple[list[Page], list[DocumentStore]]]:
    repos = [await Repository.open(tmp_path / f"r{i}") for i in range(n)]
    try:
        pages = [await r.ledger("l").page("p") for r in repos]
        stores = [await DocumentStore.open(p) for p in pages]
        yield pages, stores
        for s in stores:
            await s.close()
    finally:
        for r in repos:
            await r.close()


async def _conflicting(
    bucket: Bucket, pages: list[Page], stores: list[DocumentStore]
) -> tuple[str, str, str]:
    """Device 0 creates a document, every device has it, then devices 0 and 1 replace
    it concurrently: (its id, the winner's revision, the loser's)."""
    doc = await stores[0].create("c", {"v": "base"})
    await bucket.sync(*pages)
    a = await stores[0].replace("c", doc.id, {"v": "from 0"})
    b = await stores[1].replace("c", doc.id, {"v": "from 1"})
    win, lose = (a, b) if a.rev > b.rev else (b, a)
    return doc.id, win.rev, lose.rev


async def _settled(bucket: Bucket, pages: list[Page], stores: list[DocumentStore]) -> None:
    await bucket.sync(*pages)
    for s in stores:
        await s.refresh()
    assert len({p.head.root for p in pages}) == 1


async def test_both_revisions_are_kept_alike_in_either_order_then_resolved(
    tmp_path: Path,
) -> None:
    """Devices 2 and 3 learn of the two concurrent revisions in opposite orders: all
    four keep the loser as a conflict (same root digest); deleting the conflict on one
    device removes it everywhere."""
    async with _devices(tmp_path, 4) as (pages, stores):
        bucket = Bucket()
        doc_id, win, lose = await _conflicting(bucket, pages, stores)
        await bucket.upload(pages[0])
        await bucket.upload(pages[1])
        await bucket.download(pages[2], only=pages[0].graph.tag)
        await bucket.download(pages[3], only=pages[1].graph.tag)
        await bucket.download(pages[2])
        await bucket.download(pages[3])
        await bucket.download(pages[0])
        await bucket.download(pages[1])
        assert len({p.head.root for p in pages}) == 1
        for s in stores:
            got = await s.get("c", doc_id, conflicts=True)
            assert (got.rev, got.conflicts, got.data) == (win, (lose,), got.data)
            assert got.to_json()["_meta"]["_conflicts"] == [lose]
            old = await s.get("c", doc_id, rev=lose)
            assert old.rev == lose and old.data in ({"v": "from 0"}, {"v": "from 1"})
            assert old.data != got.data
            assert [d.rev for d in await s.conflicts("c", doc_id)] == [lose]
        plain = await stores[0].get("c", doc_id)
        assert plain.conflicts is None and "_conflicts" not in plain.to_json()["_meta"]

        resolved = await stores[3].delete_revision("c", doc_id, lose)
        assert resolved.rev > win and resolved.data == (await stores[3].get("c", doc_id)).data
        await _settled(bucket, pages, stores)
        for s in stores:
            got = await s.get("c", doc_id, conflicts=True)
            assert got.rev == resolved.rev and got.conflicts == ()
            with pytest.raises(DocumentNotFoundError):
                await s.get("c", doc_id, rev=lose)


async def test_a_later_write_carries_conflicts_a_resolving_one_removes_them(
    tmp_path: Path,
) -> None:
    async with _devices(tmp_path, 2) as (pages, stores):
        bucket = Bucket()
        doc_id, win, lose = await _conflicting(bucket, pages, stores)
        await _settled(bucket, pages, stores)
        again = await stores[0].replace("c", doc_id, {"v": "again"})
        await stores[0].put_attachment("c", doc_id, b"x" * 10, filename="f")
        await _settled(bucket, pages, stores)
        for s in stores:
            got = await s.get("c", doc_id, conflicts=True)
            assert got.rev > again.rev and got.conflicts == (lose,)
        with pytest.raises(DocumentConflictError):  # not a kept conflict: nothing written
            await stores[1].replace("c", doc_id, {"v": "no"}, resolves=[win])
        done = await stores[1].replace("c", doc_id, {"v": "merged"}, resolves=[lose])
        await _settled(bucket, pages, stores)
        for s in stores:
            got = await s.get("c", doc_id, conflicts=True)
            assert (got.rev, got.data, got.conflicts) == (done.rev, {"v": "merged"}, ())
            assert len(got.attachments) == 1


async def test_a_resolution_concurrent_with_a_new_conflict_keeps_the_new_one(
    tmp_path: Path,
) -> None:
    """A conflict the resolver had not seen survives its resolution (observed-remove)."""
    async with _devices(tmp_path, 3) as (pages, stores):
        bucket = Bucket()
        doc_id, _, lose = await _conflicting(bucket, pages, stores)
        await bucket.sync(pages[0], pages[1])
        await stores[0].refresh()
        fresh = await stores[2].replace("c", doc_id, {"v": "from 2"})  # saw neither
        await stores[0].delete_conflict("c", doc_id, lose)
        await _settled(bucket, pages, stores)
        got = await stores[0].get("c", doc_id, conflicts=True)
        assert lose not in (got.conflicts or ())
        assert fresh.rev in (got.conflicts or ()) or got.rev == fresh.rev
        for s in stores[1:]:
            other = await s.get("c", doc_id, conflicts=True)
            assert (other.rev, other.conflicts) == (got.rev, got.conflicts)


async def test_a_write_keeps_at_most_the_bound_the_lowest_ranked_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(doclayout, "MAX_CONFLICTS", 2)
    async with _devices(tmp_path, 5) as (pages, stores):
        bucket = Bucket()
        doc = await stores[0].create("c", {"v": "base"})
        await bucket.sync(*pages)
        revs = [(await s.replace("c", doc.id, {"v": i})).rev for i, s in enumerate(stores)]
        await _settled(bucket, pages, stores)
        got = await stores[0].get("c", doc.id, conflicts=True)
        ranked = sorted(revs, reverse=True)
        assert got.rev == ranked[0] and got.conflicts == tuple(ranked[1:])  # the join: all
        await stores[0].replace("c", doc.id, {"v": "next"})
        await _settled(bucket, pages, stores)
        for s in stores:
            got = await s.get("c", doc.id, conflicts=True)
            assert got.conflicts == tuple(ranked[1:3])


async def test_indexes_hold_the_winner_and_a_purge_drops_the_conflicts(tmp_path: Path) -> None:
    async with _devices(tmp_path, 2) as (pages, stores):
        bucket = Bucket()
        await stores[0].declare_index("c", "by_v", "v")
        doc_id, win, lose = await _conflicting(bucket, pages, stores)
        await _settled(bucket, pages, stores)
        won = (await stores[0].get("c", doc_id)).data["v"]
        lost = (await stores[0].get("c", doc_id, rev=lose)).data["v"]
        for s in stores:
            assert [d.rev for d in (await s.query("c", "by_v", won)).items] == [win]
            assert (await s.query("c", "by_v", lost)).items == []
        batch = [b async for b in stores[1].changes(follow=False, conflicts=True)]
        assert [d.conflicts for b in batch for d in b.documents] == [(lose,)]
        await stores[0].purge("c", doc_id)
        await _settled(bucket, pages, stores)
        for s in stores:
            assert (await s.get("c", doc_id, include_deleted=True, conflicts=True)).conflicts == ()


async def test_the_check_reads_kept_conflicts_and_names_a_damaged_one(tmp_path: Path) -> None:
    async with _devices(tmp_path, 2) as (pages, stores):
        bucket = Bucket()
        doc_id, _, lose = await _conflicting(bucket, pages, stores)
        await _settled(bucket, pages, stores)
        report = await ck.check_page(pages[0])
        assert report.problems == [] and report.documents == 1  # a conflict is no document
        (key,) = [
            e.key
            async for e in pages[0].iter_entries(prefix=doclayout.DOCS)
            if (k := doclayout.parse_doc_key(e.key)) and k.conflict is not None
        ]
        await pages[0].put(key, b"not a record")  # through the key API
        await pages[0].flush()
        report = await ck.check_page(pages[0])
        assert [(p.code, p.key) for p in report.problems] == [(ck.DAMAGED_DOCUMENT, key)]
        assert f"kept conflict {lose} of document {doc_id}" in report.problems[0].message


async def test_bulk_resolves_as_couchdb_does_winner_written_losers_deleted(
    tmp_path: Path,
) -> None:
    """CouchDB's resolution in one ``_bulk_docs``: the winner written with the merged
    data, each losing revision ``_deleted`` (its id again in the call); a deletion naming
    a revision that is neither current nor kept is a ``conflict`` of its own."""
    async with _devices(tmp_path, 2) as (pages, stores):
        bucket = Bucket()
        doc_id, win, lose = await _conflicting(bucket, pages, stores)
        await _settled(bucket, pages, stores)
        unknown = (await stores[1].create("c", {"other": 1})).rev
        got = await stores[1].bulk(
            "c",
            [
                BulkWrite({"v": "merged"}, id=doc_id, rev=win),
                BulkWrite(None, id=doc_id, rev=lose, deleted=True),
                BulkWrite(None, id=doc_id, rev=unknown, deleted=True),
            ],
        )
        assert [r.error is None for r in got] == [True, True, False]
        assert isinstance(got[2].error, DocumentConflictError)
        assert got[1].document is not None and got[1].document.data == {"v": "merged"}
        await _settled(bucket, pages, stores)
        for s in stores:
            doc = await s.get("c", doc_id, conflicts=True)
            assert (doc.rev, doc.data, doc.conflicts) == (got[1].document.rev, {"v": "merged"}, ())
        alone = await stores[0].bulk("c", [BulkWrite(None, id=doc_id, rev=lose, deleted=True)])
        assert isinstance(alone[0].error, DocumentConflictError)  # (resolved already)


async def test_a_kept_conflict_read_by_revision_lists_the_others_not_itself(
    tmp_path: Path,
) -> None:
    async with _devices(tmp_path, 2) as (pages, stores):
        bucket = Bucket()
        doc_id, win, lose = await _conflicting(bucket, pages, stores)
        await _settled(bucket, pages, stores)
        old = await stores[0].get("c", doc_id, rev=lose, conflicts=True)
        assert (old.rev, old.conflicts) == (lose, ())
        await stores[0].delete_revision("c", doc_id, lose)
        with pytest.raises(DocumentConflictError, match="keeps no conflict of revision"):
            await stores[0].delete_revision("c", doc_id, lose)  # (resolved already)
