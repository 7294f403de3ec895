"""Property: devices editing documents concurrently converge to identical documents,
and on every device every index query equals a brute-force scan of them."""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledgerd.store import Document, DocumentError, DocumentStore, Repository
from ledgerd.store.documents import doclayout
from ledgerd.store.documents.docmodel import RevClock
from ledgerd.sync.engine import SyncEngine
from ledgerd.sync.folder import FolderStore

DEVICES = 3
doc_no = st.integers(0, 5)
op = st.one_of(
    st.tuples(st.just("create"), st.integers(0, 3), st.integers(-3, 3)),
    st.tuples(st.just("replace"), doc_no, st.integers(-3, 3)),
    st.tuples(st.just("delete"), doc_no, st.just(0)),
    st.tuples(st.just("purge"), doc_no, st.just(0)),
    st.tuples(st.just("attach"), doc_no, st.integers(0, 2)),
    st.tuples(st.just("detach"), doc_no, st.just(0)),
)
step = st.one_of(
    st.tuples(st.just("op"), st.integers(0, DEVICES - 1), op),
    st.tuples(st.just("sync"), st.integers(0, DEVICES - 1), st.none()),
)


async def _snapshot(docs: DocumentStore) -> list[dict[str, Any]]:
    out = []
    res = await docs.list_documents("c", limit=1000, include_deleted=True)
    assert res.token is None
    for d in res.items:
        j = d.to_json()
        for a in d.attachments:  # LAZY contents are fetched from the bucket on first read
            chunks = await docs.read_attachment("c", d.id, a.id, include_deleted=True)
            j[a.id] = b"".join([c async for c in chunks])
        out.append(j)
    return out


def _expected(docs: list[Document], k: int, deleted: bool) -> list[str]:
    hits = [
        (float(d.data["v"]), d.id)
        for d in docs
        if not d.purged and (deleted or not d.deleted) and d.data.get("k") == k
    ]
    return [i for _, i in sorted(hits)]


async def _check_indexes(docs: DocumentStore, *, declared: bool = True) -> None:
    if not declared and not [i for i in await docs.indexes("c") if i.name == "by_k"]:
        return  # the definition has not reached this device yet
    every = (await docs.list_documents("c", limit=1000, include_deleted=True)).items
    for k in range(4):
        for deleted in (False, True):
            res = await docs.query("c", "by_k", k, limit=1000, include_deleted=deleted)
            assert [d.id for d in res.items] == _expected(every, k, deleted)


def _behind(ms: int) -> Any:
    return lambda: time.time_ns() // 1_000_000 - ms


async def _check_whole(page: Any) -> None:
    """Attachment contents in the tree are exactly those the documents list."""
    listed = set()
    stored = set()
    async for e in page.iter_entries(prefix=doclayout.DOCS):
        k = doclayout.parse_doc_key(e.key)
        assert k is not None
        if k.part == doclayout.BODY:
            r = doclayout.decode_record(await page.get(e.key))
            listed |= {(k.doc_id, a.id) for a in r.attachments}
        elif k.part == doclayout.ATTACHMENT:
            stored.add((k.doc_id, k.attachment))
    assert listed == stored


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(step, min_size=1, max_size=30))
async def test_document_devices_converge_and_indexes_match_a_scan(steps) -> None:
    with tempfile.TemporaryDirectory() as d:
        base = Path(d)
        (base / "bucket").mkdir()
        bucket = FolderStore(base / "bucket")
        engines = [SyncEngine(bucket) for _ in range(DEVICES)]
        repos = [
            await Repository.open(base / f"dev{i}", hooks=e.hooks()) for i, e in enumerate(engines)
        ]
        for e, r in zip(engines, repos, strict=True):
            await e.start(r, background=False)
        pages = [await r.ledger("l").page("p") for r in repos]
        # Skewed revision clocks (device i is i hours behind), so that the order of
        # revisions differs from the order of commits: the higher _rev must win.
        stores = [
            await DocumentStore.open(p, clock=RevClock(_behind(i * 3_600_000)))
            for i, p in enumerate(pages)
        ]
        ids: list[str] = []  # every id created anywhere, in order
        latest: dict[str, str] = {}  # the highest revision written of each document
        try:
            await stores[0].declare_index("c", "by_k", "k", "v")  # travels with the page
            for kind, dev, arg in steps:
                docs = stores[dev]
                if kind == "sync":
                    await engines[dev].sync()
                    continue
                what, n, v = arg
                if what == "create":
                    made = await docs.create("c", {"k": n, "v": v})
                    ids.append(made.id)
                    latest[made.id] = made.rev
                    continue
                if not ids:
                    continue
                doc_id = ids[n % len(ids)]
                try:  # the document may not be on this device yet, or be gone
                    written = None
                    if what == "replace":
                        written = await docs.replace("c", doc_id, {"k": v % 4, "v": v * 0.5})
                    elif what == "delete":
                        written = await docs.delete("c", doc_id)
                    elif what == "purge":
                        written = await docs.purge("c", doc_id)
                    elif what == "attach":
                        content = bytes([v]) * 5000
                        written, _ = await docs.put_attachment("c", doc_id, content, filename="f")
                    else:
                        doc = await docs.get("c", doc_id)
                        if doc.attachments:
                            att = doc.attachments[0].id
                            written = await docs.delete_attachment("c", doc_id, att)
                    if written is not None:
                        latest[doc_id] = max(latest[doc_id], written.rev)
                except DocumentError:
                    pass
                await _check_indexes(docs, declared=False)
            for _ in range(3):
                for e in engines:
                    await e.sync()
            assert len({p.head.root for p in pages}) == 1, "devices did not converge"
            snaps = [await _snapshot(s) for s in stores]
            assert snaps[0] == snaps[1] == snaps[2]
            assert len(snaps[0]) == len(ids)
            # Per document the highest revision written won, whole.
            assert {j["_meta"]["_id"]: j["_meta"]["_rev"] for j in snaps[0]} == latest
            for p in pages:
                await _check_whole(p)
            for s in stores:
                await _check_indexes(s)
        finally:
            for s in stores:
                await s.close()
            for r in repos:
                await r.close()


@contextlib.asynccontextmanager
async def _two_devices(tmp_path: Path) -> AsyncIterator[tuple[list[SyncEngine], list[Repository]]]:
    """Two devices (engines started, not in the background) sharing a folder bucket."""
    (tmp_path / "bucket").mkdir()
    bucket = FolderStore(tmp_path / "bucket")
    engines = [SyncEngine(bucket) for _ in range(2)]
    repos = [
        await Repository.open(tmp_path / f"dev{i}", hooks=e.hooks()) for i, e in enumerate(engines)
    ]
    try:
        for e, r in zip(engines, repos, strict=True):
            await e.start(r, background=False)
        yield engines, repos
    finally:
        for r in repos:
            await r.close()


async def test_the_higher_revision_wins_whole_not_the_later_commit(tmp_path: Path) -> None:
    """Device b's clock is an hour behind: its later edit has the lower revision and
    loses, whole (its attachment too), on both devices."""
    async with _two_devices(tmp_path) as (engines, repos):
        pages = [await r.ledger("l").page("p") for r in repos]
        a = await DocumentStore.open(pages[0])
        b = await DocumentStore.open(pages[1], clock=RevClock(_behind(3_600_000)))
        await a.declare_index("c", "by_k", "k", "v")
        doc = await a.create("c", {"k": 1, "v": 1})
        await engines[0].sync()
        await engines[1].sync()
        on_a = await a.replace("c", doc.id, {"k": 2, "v": 2})
        on_b, _ = await b.put_attachment("c", doc.id, b"from b" * 1000, filename="b")
        on_b = await b.replace("c", doc.id, {"k": 3, "v": 3})  # committed last, older rev
        assert on_b.rev < on_a.rev
        for _ in range(2):
            for e in engines:
                await e.sync()
        for docs, page in ((a, pages[0]), (b, pages[1])):
            got = await docs.get("c", doc.id)
            assert got.rev == on_a.rev and got.data == {"k": 2, "v": 2} and got.attachments == ()
            await _check_whole(page)
            await _check_indexes(docs)
        # b has now seen a's revision: its next edit is newer, though its clock is slow.
        later = await b.replace("c", doc.id, {"k": 0, "v": 0})
        assert later.rev > on_a.rev


async def test_a_page_deleted_on_one_device_and_written_on_another_stays_a_document_page(
    tmp_path: Path,
) -> None:
    """Device a deletes the page while b creates a document in it. The merge takes b's
    new document and a's removal of the rest; it took a's removal of the page's
    marker too, so on both devices the page held a document but was no longer a
    document page (reads refused it; later merges went key by key). A document page
    now stays one while either side is."""
    async with _two_devices(tmp_path) as (engines, repos):
        a = await DocumentStore.open(await repos[0].ledger("l").page("p"))
        old = await a.create("c", {"k": 1, "v": 1})
        await engines[0].sync()
        await engines[1].sync()
        b = await DocumentStore.open(await repos[1].ledger("l").page("p"))
        await repos[0].delete_page("l", "p")
        new = await b.create("c", {"k": 2, "v": 2})
        for _ in range(2):
            for e in engines:
                await e.sync()
        for r in repos:
            page = await r.ledger("l").page("p")
            assert await DocumentStore.holds_documents(page)
            docs = await DocumentStore.open(page)
            listed = (await docs.list_documents("c", include_deleted=True)).items
            assert [d.id for d in listed] == [new.id], old.id
