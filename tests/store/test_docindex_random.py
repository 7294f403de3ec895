"""Random sequences of document writes, page writes and index changes on one page whose
index rows are held a few at a time (store.documents.docindex): every query equals a scan of
the head's documents."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest

from ledgerd.store import (
    DocumentConflictError,
    DocumentNotFoundError,
    DocumentStore,
    Page,
    Repository,
    StoreError,
)
from ledgerd.store.documents import docindex
from ledgerd.store.page.gc import collect
from tests.exchanges import mark_all_uploaded

HELD = 6 * 1024  # room for about 25 held rows
STEPS = 150
VALUES: list[Any] = [0, 0.5, 1, 2.5, 3, "a", "b", None, True]
INDEXES: dict[str, list[tuple[str, str | None]]] = {
    "by_k": [("k", "v"), ("k", None)],  # re-declared with the other: a new definition
    "by_v": [("v", None), ("v", "k")],
}


def _value(rng: random.Random) -> Any:
    """An indexable value most of the time; else none, or one that is not indexed."""
    roll = rng.random()
    if roll < 0.1:
        return [1, 2]  # not a scalar: the document is not indexed
    return rng.choice(VALUES)


def _data(rng: random.Random) -> dict[str, Any]:
    data: dict[str, Any] = {"n": rng.random()}
    for field in ("k", "v"):
        if rng.random() < 0.9:
            data[field] = _value(rng)
    return data


def _order(v: Any) -> tuple[int, Any]:
    """The order of indexed scalars (FoundationDB tuples): null, strings, numbers, booleans."""
    if v is None:
        return (0, 0)
    if isinstance(v, str):
        return (1, v)
    if isinstance(v, bool):
        return (3, v)
    return (2, float(v))


def _scalar(v: Any) -> bool:
    return v is None or isinstance(v, str | bool | int | float)


class Run:
    def __init__(self, repo: Repository, seed: int) -> None:
        self.repo = repo
        self.rng = random.Random(seed)
        self.declared: dict[str, tuple[str, str | None]] = {}
        self.page: Page
        self.docs: DocumentStore
        self.plain = 0
        self.failures: list[StoreError] = []
        """A failure for the next store of index rows (as a disk error)."""
        self.raised: list[StoreError] = []

    async def open(self) -> None:
        self.page = await self.repo.ledger("app").page("docs")
        await self.open_store()

    async def open_store(self) -> None:
        while self.failures:  # each failure given fails one try
            try:
                self.docs = await DocumentStore.open(self.page, held_index_bytes=HELD)
                return
            except StoreError as e:
                self.given(e)
        self.docs = await DocumentStore.open(self.page, held_index_bytes=HELD)

    def given(self, e: StoreError) -> None:
        """Raise ``e`` again unless it is a failure this test gave."""
        if e not in self.raised:
            raise e

    async def ids(self, collection: str, *, deleted: bool = False) -> list[str]:
        listing = await self.docs.list_documents(collection, limit=1000, include_deleted=deleted)
        return [d.id for d in listing.items if not d.purged]

    def write_rows(self, conn: Any, rows: Any) -> None:
        if self.failures:
            self.raised.append(self.failures.pop())
            raise self.raised[-1]
        REAL_WRITE_ROWS(conn, rows)

    async def check(self) -> None:
        """Every declared index, every partition, with and without deleted documents,
        against a scan of the documents; no rows stored for an index that is gone."""
        self.failures.clear()
        for deleted in (False, True):
            listing = await self.docs.list_documents("c", limit=1000, include_deleted=deleted)
            live = [d for d in listing.items if not d.purged]
            for name, (part, sort) in sorted(self.declared.items()):
                indexed = [
                    d
                    for d in live
                    if part in d.data
                    and _scalar(d.data[part])
                    and (sort is None or (sort in d.data and _scalar(d.data[sort])))
                ]
                indexed.sort(key=lambda d: ((0, 0) if sort is None else _order(d.data[sort]), d.id))
                for p in VALUES:
                    want = [d.id for d in indexed if _order(d.data[part]) == _order(p)]
                    got = await self.docs.query("c", name, p, limit=1000, include_deleted=deleted)
                    assert [d.id for d in got.items] == want, (name, p, deleted)
        orphans = await self.page.db.read_all(
            "SELECT count(*) FROM doc_index_rows WHERE ix NOT IN (SELECT id FROM doc_indexes)"
        )
        assert orphans[0][0] == 0

    async def step(self) -> None:
        rng, docs = self.rng, self.docs
        op = rng.choices(
            [
                "create", "replace", "delete", "purge", "other", "plain", "declare",
                "drop", "rebuild", "reopen", "crash", "close", "together", "gc", "fail",
                "query",
            ],
            [10, 10, 4, 3, 3, 4, 2, 1, 1, 1, 1, 1, 2, 2, 2, 4],
        )[0]  # fmt: skip
        ids = await self.ids("c", deleted=True)
        try:
            if op == "create":
                await docs.create_many("c", [_data(rng) for _ in range(rng.randint(1, 6))])
            elif op == "replace" and ids:
                await docs.replace("c", rng.choice(ids), _data(rng))
            elif op == "delete" and ids:
                await docs.delete("c", rng.choice(ids))
            elif op == "purge" and ids:
                await docs.purge("c", rng.choice(ids))
            elif op == "other":  # a collection without indexes: writes with no rows
                await docs.create_many("o", [_data(rng) for _ in range(rng.randint(1, 3))])
            elif op == "plain":  # moves the head without the document layer
                self.plain += 1
                await self.page.put(b"plain/%d" % self.plain, b"x")
                await self.page.flush()
            elif op == "declare":
                name = rng.choice(sorted(INDEXES))
                part, sort = rng.choice(INDEXES[name])
                self.declared[name] = (part, sort)  # in the page even if catching up fails
                await docs.declare_index("c", name, part, sort)
            elif op == "drop" and self.declared:
                name = rng.choice(sorted(self.declared))
                del self.declared[name]
                await docs.drop_index("c", name)
            elif op == "rebuild" and self.declared:
                await docs.rebuild_index("c", rng.choice(sorted(self.declared)))
            elif op in ("reopen", "crash"):
                if op == "crash":  # the held rows are lost, as when the process dies
                    self.page.not_when_closing(docs._page_closing)
                await self.page.close()
                await self.open()
            elif op == "close":  # the document store closes, the page stays open
                try:
                    await docs.close()
                except StoreError as e:  # storing the held rows failed
                    self.given(e)
                await self.open_store()
            elif op == "fail":
                self.failures.append(StoreError("disk I/O error"))
            elif op == "together":  # a document write, a page write and a query at once
                self.plain += 1
                await asyncio.gather(
                    docs.create_many("c", [_data(rng) for _ in range(rng.randint(1, 4))]),
                    self.page.put(b"plain/%d" % self.plain, b"y"),
                    docs.query("c", name, 0) if (name := next(iter(self.declared), "")) else
                    asyncio.sleep(0),
                )  # fmt: skip
                await self.page.flush()
            elif op == "gc":  # all uploaded, no history kept: only what something reads
                await mark_all_uploaded(self.page)
                await collect(self.page, 0)
                self.page.nodes.clear_cache()
            elif op == "query":
                await self.check()
        except (DocumentNotFoundError, DocumentConflictError):  # a deleted one, say
            pass
        except StoreError as e:
            self.given(e)


REAL_WRITE_ROWS = docindex._write_rows


@pytest.mark.parametrize("seed", range(20))
async def test_queries_equal_a_scan_of_the_documents_whatever_the_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    async with await Repository.open(tmp_path, history_retention=0) as repo:
        run = Run(repo, seed)
        monkeypatch.setattr(docindex, "_write_rows", run.write_rows)
        await run.open()
        for _ in range(STEPS):
            await run.step()
        await run.check()
